"""Every shell block of README.md that a newcomer runs, run as the README writes it, on tiny sizes (issue 68).

The commands are read from README.md itself, so an edited command is the command tested. They run in one scratch
folder, in the README's order (the sweep before its report, the report before the MLflow UI, the `algo=rm` job
before the job that reads its `artifact` folder), each as a process of its own (tests/cli_process.py: forked from a
warm interpreter), with the sizes of tests/conftest.TINY, two training steps and a 2-step reward model (RM_SIZES)
appended: Hydra keeps the last value of a key, so only sizes change, never what a command selects. The files "Your
own model and data" names (`./my-model`, `pairs.jsonl`, `./prefs_saved`, `prefs.parquet`, `prompts.jsonl`) are made
here: a tiny GPT-2 with a chat template (tests/tiny_archs.py) and rows of the world's reviews in TRL's standard format.

The install half of the Quickstart is what CI runs: the test checks that command 2 is .ci/run's command and that
command 1 installs the same way (tests/test_install.py resolves the install with the newest pip). `mlflow ui` is
started on a free port, with one server worker and without MLflow's job runner, and must answer.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from tests import cli_process
from tests.conftest import TINY

pytestmark = pytest.mark.slow  # trains tiny models: deselect with -m 'not slow'

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()

# appended to every job: the reward model a job trains (algo=rm) or builds upstream (PPO, GRPO, the sweep's jobs)
# takes 2 steps of 8 pairs and is normalised on 64 SFT samples, not 200 steps and 1024 samples (26 s of the default
# job's 54 s, 34 s of the PPO job's 40 s on the user's files, 2 cores under load)
RM_SIZES = ["reward_model.batch_size=8", "reward_model.steps=2", "reward_model.norm_samples=64"]
# appended to every world job (the sweep's 50 steps become 2; a PPO/GRPO/RLOO step samples 8 responses)
WORLD_SIZES = [*TINY, "trainer.max_steps=2", "algo.batch_size=8", *RM_SIZES]
# appended to every job on the user's files (from tests/test_checkpoints.py's CLI: 2 prompts per split)
USER_SIZES = ["data.eval_fraction=0.2", "data.test_fraction=0.2", "algo.batch_size=8", "trainer.max_steps=2",
              "eval.n_prompts=2", "eval.n_test_prompts=2", "eval.n_ood_prompts=0", "eval.every_n_steps=0",
              "generation.max_new_tokens=4", "trainer.progress_bar=false", "trainer.threads=1", *RM_SIZES]
USER_FILES = ("./my-model", "pairs.jsonl", "./prefs_saved", "prefs.parquet", "prompts.jsonl")


def shell_blocks(text: str) -> list[list[str]]:
    """The ```bash blocks of `text`, each as its commands: continuation lines joined, comments dropped."""
    blocks = re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M)
    out = []
    for block in blocks:
        joined = block.replace("\\\n", " ")
        out.append([" ".join(shlex.split(line, comments=True)) for line in joined.splitlines()
                    if shlex.split(line, comments=True)])
    return out


def console_module(script: str) -> str:
    """The module a console script of this package runs (pyproject's [project.scripts])."""
    (ep,) = [ep for ep in entry_points(group="console_scripts") if ep.name == script]
    return ep.value.split(":")[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_readme_install_is_what_ci_runs():
    quickstart = shell_blocks(README)[0]
    assert len(quickstart) == 2, quickstart
    install_and_run, install_and_test = quickstart
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    steps = install_and_test.split(" && ")

    def words(step: str) -> list[str]:  # as the shell reads it, pip's -q aside
        return [w for w in shlex.split(step) if w != "-q"]

    assert [words(s) for s in ci.split(" && ")] == [words(s) for s in steps], (ci, steps)
    assert install_and_run.split(" && ") == [*steps[:-2], "pip install -e .", "rlhf-lab"]


@pytest.fixture(scope="module")
def newcomer_folder(tmp_path_factory):
    """A scratch folder holding the files "Your own model and data" names."""
    import datasets

    from tests.tiny_archs import chat_tokenizer, tiny_config, world_pairs
    from transformers import AutoModelForCausalLM
    import torch

    folder = tmp_path_factory.mktemp("newcomer")
    pairs = world_pairs(60, seed=3)
    tok = chat_tokenizer([f"{p} {c} {r}" for p, c, r in pairs])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("gpt2", tok))
    model.save_pretrained(folder / "my-model")
    tok.save_pretrained(folder / "my-model")
    rows = [{"prompt": p, "chosen": c, "rejected": r} for p, c, r in pairs]
    (folder / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "prompts.jsonl").write_text("".join(json.dumps({"prompt": r["prompt"]}) + "\n" for r in rows))
    datasets.Dataset.from_list(rows).save_to_disk(str(folder / "prefs_saved"))
    datasets.Dataset.from_list(rows).to_parquet(str(folder / "prefs.parquet"))
    return folder


def newest_artifact(folder: Path) -> Path:
    """The `artifact` folder of the newest job under outputs/<date>/<time>/."""
    found = sorted(folder.glob("outputs/*/*/artifact"), key=lambda p: p.stat().st_mtime)
    assert found, "no outputs/<date>/<time>/artifact: the algo=rm job wrote none"
    return found[-1]


def run_mlflow_ui(command: str, cwd: Path) -> None:
    """`mlflow ui ...` as written, on a free port: it must serve its page, then it is stopped. One server worker, not
    uvicorn's 4, and no job runner (MLflow's 7 huey consumers, which serve no page; tests/test_mlflow_ui.py turns it off
    too): 12 s to the first page instead of 38-57 s, each of those 11 processes importing MLflow on the loaded cores."""
    port = free_port()
    p = subprocess.Popen([*shlex.split(command), "--port", str(port), "--workers", "1"], cwd=cwd,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         env=dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
                                  MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"))
    try:
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
                    assert r.status == 200
                    return
            except OSError:
                assert p.poll() is None, p.stderr.read()[-2000:]
                assert time.time() < deadline, "mlflow ui did not answer in 120 s"
                time.sleep(0.5)
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(30)


def readme_commands() -> list[str]:
    """The commands of every shell block after the Quickstart's, in the README's order."""
    return [c for block in shell_blocks(README)[1:] for c in block]


def on_user_files(command: str) -> bool:
    return any(f in command for f in USER_FILES)


def sizes(command: str) -> list[str]:
    """The tiny sizes appended to a README job (an algo=rm job's batch is the reward model's: RM_SIZES)."""
    base = USER_SIZES if on_user_files(command) else WORLD_SIZES
    if "algo=rm" in command.split():
        return [s for s in base if not s.startswith("algo.batch_size=")]
    return base


def run_readme_commands(commands: list[str], folder: Path, cache: Path) -> None:
    """Each command in `folder`, as the README writes it, with the tiny sizes appended; each must exit 0."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    env.pop("MLFLOW_TRACKING_URI", None)
    rm_artifact = None
    for command in commands:
        if command.startswith("mlflow ui"):
            run_mlflow_ui(command, folder)
            continue
        script, *args = shlex.split(command)
        assert script in {"rlhf-lab", "rlhf-lab-report"}, f"README command this test does not know: {command!r}"
        if script == "rlhf-lab":
            if "outputs/<date>/<time>/artifact" in command:  # the artifact of the README's algo=rm job before it
                args = [a.replace("outputs/<date>/<time>/artifact", str(rm_artifact)) for a in args]
            args += [*sizes(command), f"cache_dir={cache}"]
        r = cli_process.run(args, cwd=folder, env=env, timeout=600, module=console_module(script))
        assert r.returncode == 0, f"{command}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
        if "algo=rm" in args:
            rm_artifact = newest_artifact(folder)


def test_the_first_15_minutes_run(newcomer_folder, session_cache):
    """The default job, the β sweep, its report and the MLflow UI (and the README's world RM job)."""
    commands = [c for c in readme_commands() if not on_user_files(c)]
    assert "rlhf-lab" in commands and any(c.startswith("rlhf-lab -m sweep=") for c in commands)
    assert any(c.startswith("rlhf-lab-report ") for c in commands) and any(c.startswith("mlflow ui") for c in commands)
    run_readme_commands(commands, newcomer_folder, session_cache)
    report = newcomer_folder / "reports" / "ppo_beta_grid" / "README.md"
    assert report.exists() and "gold" in report.read_text()


def test_your_own_model_and_data_run(newcomer_folder, session_cache):
    """"Your own model and data": the RM, DPO, PPO and GRPO jobs on the files the README names."""
    commands = [c for c in readme_commands() if on_user_files(c)]
    assert len(commands) >= 4, commands
    run_readme_commands(commands, newcomer_folder, session_cache)
