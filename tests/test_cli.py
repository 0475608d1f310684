"""The `rlhf-lab` Hydra app as a user runs it: help, config printing, overrides, errors, packaging."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import mlflow
import pytest

from tests import cli_process
from tests.conftest import TINY

ROOT = Path(__file__).resolve().parents[1]


def cli(*args, cwd, timeout=300, fresh=False):
    """`python -m rlhf_lab.entry.run *args` in `cwd`: forked from a warm interpreter (tests/cli_process.py), or with
    `fresh=True` a new interpreter, start-up included, as a user's shell starts it."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    env.pop("MLFLOW_TRACKING_URI", None)
    if not fresh:
        return cli_process.run(args, cwd=cwd, env=env, timeout=timeout)
    return subprocess.run([sys.executable, "-m", "rlhf_lab.entry.run", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.slow
def test_help_lists_config_groups(tmp_path):
    r = cli("--help", cwd=tmp_path)
    assert r.returncode == 0
    for group in ("algo:", "labeler:", "policy:", "world:"):
        assert group in r.stdout
    assert "length_biased" in r.stdout and "a_small" in r.stdout
    groups, sweeps = r.stdout.split("== Config groups")[1].split("== Config ==")[0].split("== Sweeps (rlhf-lab -m "
                                                                                     "sweep=NAME) ==")
    assert "schema/" not in groups and "frontier" not in groups  # internal groups hidden (issue 68)
    assert "ppo_beta_grid" in sweeps and "gao_rm_scaling" in sweeps and "seeds" in sweeps


@pytest.mark.slow
def test_cfg_job_prints_overridden_config(tmp_path):
    r = cli("--cfg", "job", "algo=sft", "trainer.max_steps=50", "seed=3", "labeler=sycophantic", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "max_steps: 50" in r.stdout and "seed: 3" in r.stdout and "filler_bonus: 0.5" in r.stdout


@pytest.mark.slow
def test_unknown_option_is_a_clear_error(tmp_path):
    r = cli("labeler=nope", cwd=tmp_path)
    assert r.returncode != 0
    assert r.returncode == 2 and "labeler=nope" in r.stderr and "available options" in r.stderr
    r = cli("trainer.max_stepz=3", cwd=tmp_path)
    assert r.returncode == 2 and "max_stepz" in r.stderr


@pytest.mark.slow
def test_cli_runs_a_tiny_sft_job_and_prints_a_summary(tmp_path):
    r = cli("algo=sft", *TINY, "trainer.max_steps=5", cwd=tmp_path, fresh=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "rlhf-lab sft: done" in r.stdout and "mlflow ui --backend-store-uri sqlite:///mlflow.db" in r.stdout
    gold_lines = [ln for ln in r.stdout.splitlines() if "gold" in ln and ln.startswith("  ")]
    assert gold_lines and all(ln.split(":")[0].strip() in ("final test", "final eval", "test gold", "eval gold")
                              for ln in gold_lines), gold_lines  # every gold figure names its split
    assert any(ln.startswith("  test gold  : ") and "test prompts" in ln for ln in gold_lines)
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["rlhf-lab"])
    sft = runs[runs["tags.rlhf_lab.stage"] == "sft"].iloc[0]
    assert sft["status"] == "FINISHED" and sft["params.steps"] == "5"
    assert sft["tags.mlflow.runName"].startswith("sft policy=a_tiny pretrain.steps=60 ")  # its overrides (issue 68)
    assert "trainer.max_steps=5" in sft["tags.rlhf_lab.overrides"]
    assert sft["tags.rlhf_lab.git_commit"]
    from rlhf_lab.runs.code import cpu_capability  # what else a rerun must match: the CPU kernels, the libraries

    assert sft["tags.rlhf_lab.cpu_capability"] == cpu_capability() and "torch==" in sft["tags.rlhf_lab.libraries"]
    assert (tmp_path / ".rlhf_lab_cache" / "pretrain").is_dir()
    (log,) = (tmp_path / "outputs").glob("*/*/run.log")  # what the terminal showed, also in the job's run.log
    shown = log.read_text()
    assert "rlhf-lab sft: done" in shown and "  test gold  : " in shown and "[rlhf-lab] pretrain: building" in shown


@pytest.mark.slow
def test_wheel_ships_the_configs(installed_wheel, tmp_path):
    wheel, target = installed_wheel
    names = zipfile.ZipFile(wheel).namelist()
    assert "rlhf_lab/conf/config.yaml" in names
    assert "rlhf_lab/conf/labeler/length_biased.yaml" in names
    assert "rlhf_lab/conf/hydra/help/rlhf_lab.yaml" in names
    # a non-editable install finds its configs: the wheel installed into a folder, run from elsewhere
    env = dict(os.environ, PYTHONPATH=str(target))
    r = subprocess.run([sys.executable, "-c", "import rlhf_lab, sys; print(rlhf_lab.__file__)"], cwd=tmp_path,
                       capture_output=True, text=True, env=env)
    assert r.stdout.strip().startswith(str(target))
    r = subprocess.run([sys.executable, "-m", "rlhf_lab.entry.run", "--cfg", "job", "labeler=unbiased"], cwd=tmp_path,
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "length_bonus: 0.0" in r.stdout
