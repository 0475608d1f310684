"""Pre-emption: a SIGTERM'd policy job (also one sent the signal twice, as schedulers do) saves a checkpoint at the
end of its training step and exits 143 (run KILLED); the same command started again resumes from it, in the same
MLflow run, and ends with the numbers of an uninterrupted run, and its summary's baseline is still the SFT policy's."""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from pathlib import Path

import mlflow
import pytest

from tests import cli_process
from tests.conftest import TINY

ROOT = Path(__file__).resolve().parents[1]
JOB = ["algo=ppo", *TINY, "algo.reward=gold", "algo.batch_size=8", "algo.num_minibatches=2", "algo.ppo_epochs=1",
       "generation.max_new_tokens=12", "eval.n_prompts=8", "eval.n_test_prompts=8", "trainer.max_steps=8"]
# 8 steps: the SIGTERM lands at step 3-5 (3 logged, polled each 0.05 s), so the resumed job still has 3-5 to go
FINAL = ("test/gold_reward", "test/kl", "test/length", "eval/gold_reward", "objective/scores", "objective/kl",
         "objective/beta", "policy/approxkl")


def test_a_deferred_sigterm_waits_for_the_step_boundary(monkeypatch):
    from rlhf_lab.runs import states as run_states

    monkeypatch.setattr(run_states, "RECEIVED", [])
    monkeypatch.setattr(run_states, "RAISED", [False])
    pending = []
    with pytest.raises(run_states.Interrupted) as e:
        with run_states.defer_sigterm():
            run_states.raise_interrupted(signal.SIGTERM, None)  # recorded only: the loop decides when
            pending.append(run_states.pending_stop())
            run_states.raise_interrupted(signal.SIGTERM, None)  # a scheduler's repeated TERM: the save still comes
            pending.append(run_states.pending_stop())
            run_states.raise_interrupted(signal.SIGINT, None)  # Ctrl-C: at once, naming the first
    assert pending == [signal.SIGTERM, signal.SIGTERM]  # neither TERM raised
    assert e.value.exit_code == 143 and run_states.pending_stop() is None


def cli(cwd: Path, cache: Path, *extra: str):
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    env.pop("MLFLOW_TRACKING_URI", None)
    cwd.mkdir(exist_ok=True)
    return cli_process.start([*JOB, f"cache_dir={cache}", *extra], cwd=cwd, env=env)


def ppo_steps_logged(db: Path) -> int:
    try:
        with sqlite3.connect(db) as con:
            return con.execute("select count(*) from metrics where key = 'objective/kl'").fetchone()[0]
    except sqlite3.Error:
        return 0


def final_numbers(db: Path, status: str = "FINISHED") -> tuple[dict, str]:
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    runs = mlflow.search_runs(experiment_names=["rlhf-lab"], output_format="list",
                              filter_string=f"tags.`rlhf_lab.stage` = 'ppo' and attributes.status = '{status}'")
    assert len(runs) == 1, [r.info.status for r in runs]
    return {k: runs[0].data.metrics.get(k) for k in FINAL}, runs[0].info.run_id


@pytest.mark.slow
@pytest.mark.parametrize("trainer", [[], ["trainer=fsdp_cpu"]], ids=["one_process", "sharded"])
def test_sigterm_checkpoints_and_the_same_command_resumes_to_the_same_numbers(tmp_path, session_cache, trainer):
    """Sharded (2 ranks, the signal to rank 0 only, as rlhf-lab started them): every rank stops at the same step,
    the checkpoint holds the full weights and each rank's sampling RNG, and the resumed job ends where one
    uninterrupted sharded job does."""
    cache = session_cache
    a = cli(tmp_path / "a", cache, *trainer)
    out_a, err_a = a.communicate(timeout=1200)
    assert a.returncode == 0, err_a[-3000:]
    want, _ = final_numbers(tmp_path / "a" / "mlflow.db")
    assert all(v is not None for v in want.values()), want

    b = cli(tmp_path / "b", cache, *trainer)
    t0 = time.time()
    while ppo_steps_logged(tmp_path / "b" / "mlflow.db") < 3:
        assert b.poll() is None and time.time() - t0 < 900, b.communicate()[1][-3000:]
        time.sleep(0.05)
    b.send_signal(signal.SIGTERM)
    # schedulers repeat it (issue 65: the second one cut the step short, no checkpoint): 0.1-0.3 s apart for the
    # default model's steps of seconds; this one's take ~0.1 s, so sooner, to land before the checkpoint is written
    # (HEAD~ lost it in 7 of 9 tries at 0.01-0.03 s)
    time.sleep(0.02)
    b.send_signal(signal.SIGTERM)
    out_b, err_b = b.communicate(timeout=300)
    assert b.returncode == 143, err_b[-3000:]
    assert "pre-empted (SIGTERM) after step" in out_b
    # the checkpoint it announced (the cache is the test run's, which other pre-empted jobs also use)
    left = [Path(out_b.split("checkpoint saved to ", 1)[1].split("; the same command", 1)[0])]
    assert left[0].parent == cache / "resume" / "ppo" and left[0].is_file()
    _, killed = final_numbers(tmp_path / "b" / "mlflow.db", "KILLED")

    c = cli(tmp_path / "b", cache, *trainer)  # the same command again
    out_c, err_c = c.communicate(timeout=1200)
    assert c.returncode == 0, err_c[-3000:]
    assert "resuming from" in out_c and not left[0].exists()  # used, then removed once finished
    got, resumed = final_numbers(tmp_path / "b" / "mlflow.db")
    assert got == want  # identical, not close
    # one run from step 0 to the end: the pre-empted run goes on (no KILLED run left), every step logged once
    assert resumed == killed and not mlflow.search_runs(experiment_names=["rlhf-lab"], output_format="list",
                                                        filter_string="attributes.status = 'KILLED'")
    history = mlflow.MlflowClient().get_metric_history(resumed, "objective/kl")
    assert sorted(m.step for m in history) == list(range(1, 9))
    run = mlflow.get_run(resumed)
    assert "rlhf_lab.error" not in run.data.tags and run.data.tags["rlhf_lab.resumed_from"] == str(left[0])
    assert not left[0].with_suffix(".run").exists()
    # the summary's baseline: the SFT policy's test evaluation of the first start, in both
    gold = [line for line in out_a.splitlines() if line.strip().startswith("test gold ")]
    assert gold and gold == [line for line in out_c.splitlines() if line.strip().startswith("test gold ")]
