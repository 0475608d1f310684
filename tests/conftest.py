"""Shared fixtures: tiny configs composed with Hydra's compose API, one artifact cache per test run.

Every test that trains something uses `tiny_cfg(...)`: sizes small enough for 2 CPU cores, with the
run's cache shared, so the tiny base model, SFT policy and preference pairs are trained once. The tests run
in parallel worker processes (pytest-xdist, `-n` in pyproject's addopts; `-p no:xdist` or `-n 0` runs them in
one process): each worker has its own MLflow store, and all workers share one artifact cache
(`session_cache`), whose file locks make the first worker that needs an artifact build it while the others wait
for it, as two jobs of a parallel sweep do.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported: no hub look-ups in tests

import pytest  # noqa: E402

from tests import compose_memo, mlflow_template  # noqa: E402

compose_memo.install()  # before `from hydra import compose`: each composition once per process (tests/compose_memo.py)
mlflow_template.install()  # a fresh sqlite store is a copy of one MLflow migrated (tests/mlflow_template.py)

from hydra import compose, initialize_config_module  # noqa: E402

TINY = [
    "policy=a_tiny",
    "pretrain.steps=60",
    "pretrain.n_texts=2000",
    "sft.steps=40",
    "sft.n_examples=1500",
    "eval.n_prompts=16",
    "eval.n_test_prompts=16",
    "eval.n_ood_prompts=8",
    "eval.every_n_steps=0",
    "eval.n_samples_logged=4",
    "generation.max_new_tokens=24",
    "data.n_train=300",
    "data.n_eval=60",
    "trainer.progress_bar=false",
    "trainer.log_every_n_steps=1",
    "trainer.threads=1",  # tiny models gain nothing from a second thread, and lose a lot if a core is busy
]

_T0 = pytest.StashKey[float]()


@pytest.fixture(scope="session")
def session_dir(tmp_path_factory):
    """This worker's folder for the session (its MLflow store)."""
    return tmp_path_factory.mktemp("rlhf_lab_session")


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory):
    """The artifact cache of the whole test run, shared by the xdist workers (their common base folder)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # <basetemp>/popen-gw0 for each worker: share their parent
        base = base.parent
    return base / "rlhf_lab_cache"


@pytest.fixture(autouse=True)
def _no_env_tracking_uri(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("RLHF_LAB_PARENT_RUN_ID", raising=False)


def compose_cfg(overrides: list[str]):
    with initialize_config_module("rlhf_lab.conf", version_base="1.3"):
        return compose("config", overrides=overrides)


@pytest.fixture(scope="session")
def installed_wheel(session_cache):
    """(wheel, folder): this checkout built as a wheel and installed (no dependencies) into a folder to put on
    PYTHONPATH, as a user's non-editable install; built once for the whole test run, whichever worker asks first."""
    import subprocess
    import sys

    from filelock import FileLock

    root = Path(__file__).resolve().parents[1]
    where = session_cache.parent / "wheel"
    where.mkdir(parents=True, exist_ok=True)
    def pip(*args: str) -> None:
        r = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr

    with FileLock(str(where) + ".lock"):
        if not (where / "done").exists():
            pip("wheel", "--no-deps", "-q", "-w", str(where), str(root))
            pip("install", "-q", "--no-deps", "--target", str(where / "site"), str(next(where.glob("rlhf_lab-*.whl"))))
            (where / "done").write_text("")
    return next(where.glob("rlhf_lab-*.whl")), where / "site"


@pytest.fixture
def tiny_cfg(session_dir, session_cache):
    """tiny_cfg(*overrides) -> a composed config on tiny sizes, with the run's cache and the worker's MLflow store."""

    def make(*overrides: str, mlflow_db=None):
        db = mlflow_db or (session_dir / "mlflow.db")
        return compose_cfg(TINY + [f"cache_dir={session_cache}", f"tracking.uri=sqlite:///{db}", *overrides])

    return make


@pytest.fixture(scope="session")
def arch_checkpoints(tmp_path_factory):
    """Tiny GPT-NeoX, Qwen2, Llama and GPT-2 checkpoints with a ChatML tokenizer, built once per session
    (tests/tiny_archs.py): {arch: folder}."""
    from tests.tiny_archs import build_checkpoints, world_pairs

    texts = [f"{p} {c} {r}" for p, c, r in world_pairs(300, seed=1)]
    return build_checkpoints(tmp_path_factory.mktemp("archs"), texts)


@pytest.fixture(scope="session", autouse=True)
def _quiet():
    import torch

    from rlhf_lab.runs.process import quiet_libraries

    quiet_libraries()
    torch.set_num_threads(1)


def pytest_addoption(parser):
    parser.addoption("--timing-out", default=None, metavar="FILE",
                     help="write this run's test counts, wall time and machine to FILE (tests/timing.json is the "
                          "run docs/development.md quotes)")


def pytest_sessionstart(session):
    session.config.stash[_T0] = time.time()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    path = config.getoption("--timing-out")
    if not path or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    from tests import timing

    workers = int(getattr(config.option, "numprocesses", 0) or 0) if config.pluginmanager.has_plugin("xdist") else 0
    data = timing.record(terminalreporter.stats, time.time() - config.stash[_T0], max(workers, 1),
                         timing.without_option(list(config.invocation_params.args)))
    timing.write(path, data)
    terminalreporter.write_line(f"test timing written to {path}: {timing.sentence(data)}")


# The longest test files first (summed --durations of a full run on 2 cores, longest first): xdist hands out whole
# files in collection order (`--no-loadscope-reorder` in pyproject's addopts, instead of its default: the files with
# the most tests first), so these start at once and the many short files fill in around them at the end.
LONGEST_FIRST = ["test_ray_cluster.py", "test_readme_commands.py", "test_sweeps.py", "test_team_scale.py", "test_server_faults.py", "test_fsdp.py",
                 "test_ddp.py", "test_ppo.py", "test_preemption.py", "test_tune.py", "test_ship_logging.py", "test_mlflow_ui.py", "test_claims_runs.py", "test_your_model.py",
                 "test_run_states.py", "test_suite.py", "test_rm_pipeline.py", "test_gold.py", "test_config_checks.py",
                 "test_cli.py", "test_eval_schedule.py", "test_job_identity.py", "test_server_security.py",
                 "test_benchmarks.py", "test_hacking_alarm_report.py", "test_install.py", "test_sweep_interrupt.py"]


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file keeps its own order


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker more than cores, since many tests wait on the processes, servers and downloads they
    start, and the spare worker uses that time."""
    return (os.cpu_count() or 1) + 1


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """An untrained causal LM of each family (a: Llama-style, b: GPT-2-style), saved once per test process:
    {family: (tokenizer, folder)} (test_ppo_units, test_ppo_memory_options)."""
    from rlhf_lab.models import families as F
    from rlhf_lab.world import ReviewGenerator

    import torch

    root = tmp_path_factory.mktemp("tiny_families")
    texts = [p + " " + r for p, r in ReviewGenerator(1).reviews(300)]
    out = {}
    for fam, vocab in (("a", 200), ("b", 300)):
        torch.manual_seed(0)
        tok = F.train_tokenizer(fam, texts, vocab)
        F.build_model(fam, {"hidden": 16, "layers": 2, "heads": 2}, tok).save_pretrained(root / fam)
        tok.save_pretrained(root / fam)
        out[fam] = (tok, root / fam)
    return out
