"""A job's identity (rlhf_lab/runs/identity.py): its composed config, the content of the local files it reads and the
code, recorded on its run as ``rlhf_lab.job.*_digest`` tags; ``skip_finished=true`` skips a job only when a FINISHED
run of the same study and overrides has the same three digests, and otherwise says what changed (issue 41, item 4:
chosen and rejected swapped inside ``data.path`` were taken for a finished job)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from rlhf_lab.config.keys import to_plain
from rlhf_lab.runs import contents
from rlhf_lab.runs import identity as J
from rlhf_lab.stages.pipeline import run_settings
from tests import cli_process
from tests.conftest import TINY, compose_cfg

ROOT = Path(__file__).resolve().parents[1]


def write_pairs(path: Path, n: int = 60, swapped: bool = False) -> Path:
    """`n` preference rows with distinct prompts (chosen and rejected exchanged when `swapped`: the same bytes)."""
    rows = [{"prompt": f"Review {i}: the lamp", "chosen": f" It is great {i}.", "rejected": f" bad {i}"}
            for i in range(n)]
    if swapped:
        rows = [{**r, "chosen": r["rejected"], "rejected": r["chosen"]} for r in rows]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def swap_chosen_and_rejected(path: Path) -> None:
    """Exchange the two columns' names inside the file: the same size, other labels."""
    text = path.read_text().replace('"chosen"', '"@@"').replace('"rejected"', '"chosen"').replace('"@@"', '"rejected"')
    path.write_text(text)


# -- the digests --------------------------------------------------------------------------------------------------


def test_path_digest_follows_the_content_wherever_it_lies(tmp_path):
    a = tmp_path / "a"
    (a / "sub").mkdir(parents=True)
    (a / "weights.bin").write_bytes(bytes(range(256)) * 64)
    (a / "sub" / "config.json").write_text('{"x": 1}')
    b = tmp_path / "elsewhere" / "b"
    shutil.copytree(a, b)
    assert J.path_digest(a) == J.path_digest(b)  # the same files in another folder
    assert J.path_digest(a / "weights.bin") == J.path_digest(b / "weights.bin")
    assert J.path_digest(a / "weights.bin") == hashlib.sha256((a / "weights.bin").read_bytes()).hexdigest()[:16]
    (b / "rlhf_lab_meta.json").write_text('{"run_id": "another build"}')  # the cache's bookkeeping does not count
    assert J.path_digest(a) == J.path_digest(b)
    data = bytearray((b / "weights.bin").read_bytes())
    data[1000] ^= 1  # one byte, the same size
    (b / "weights.bin").write_bytes(bytes(data))
    assert J.path_digest(a) != J.path_digest(b) and J.path_digest(a / "weights.bin") != J.path_digest(b / "weights.bin")
    shutil.copy(a / "weights.bin", b / "weights.bin")
    assert J.path_digest(a) == J.path_digest(b)
    (b / "sub" / "config.json").rename(b / "sub" / "other.json")  # a renamed file
    assert J.path_digest(a) != J.path_digest(b)


def test_a_file_digest_is_remembered_by_size_and_time_and_read_again_when_they_change(tmp_path, monkeypatch):
    f = tmp_path / "pairs.jsonl"
    write_pairs(f)
    old = time.time() - 100
    os.utime(f, (old, old))
    reads = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda p, *a, **k: reads.append(str(p)) or real_open(p, *a, **k))
    d0 = contents.file_digest(f)
    assert contents.file_digest(f) == d0 and reads == [str(f)]  # remembered: read once
    swap_chosen_and_rejected(f)  # the same size, a new modification time
    os.utime(f, (old + 1, old + 1))
    assert contents.file_digest(f) != d0 and len(reads) == 2
    write_pairs(f)  # just written: not remembered (its time could stay the same through another change)
    assert contents.file_digest(f) == d0 and contents.file_digest(f) == d0 and len(reads) == 4


def test_config_digest_ignores_the_keys_that_do_not_change_results():
    base = ["algo=dpo", "kl.beta=0.1"]
    d = J.config_digest(to_plain(compose_cfg(base)))
    same = ["tracking.uri=sqlite:///elsewhere.db", "tracking.experiment=x", "cache_dir=/other", "study=s",
            "skip_finished=true", "trainer.progress_bar=false", "eval.reuse_start=false", "+algo.resume_from=/x"]
    assert J.config_digest(to_plain(compose_cfg(base + same))) == d  # config.keys.NOT_COMPUTED
    assert J.config_digest(to_plain(compose_cfg(["algo=dpo", "kl.beta=0.2"]))) != d
    assert J.config_digest(to_plain(compose_cfg(base + ["seed=1"]))) != d


def test_the_logged_config_yaml_is_omegaconfs_byte_for_byte():
    """runs.tracking.config_yaml writes a plain config as ``OmegaConf.to_yaml(cfg, resolve=True)`` did before the
    runs package took plain containers: the same text, strings that OmegaConf reads as numbers or booleans quoted."""
    from omegaconf import OmegaConf

    from rlhf_lab.runs.tracking import config_yaml

    for overrides in ([], ["algo=dpo", "study=s", "tracking.experiment=1e-3"], ["algo=ppo", "trainer=ddp_cpu"]):
        cfg = compose_cfg(overrides)
        assert config_yaml(to_plain(cfg)) == OmegaConf.to_yaml(cfg, resolve=True)
    tricky = {"a": "1e-3", "b": "nan", "y": "n", "c": "yes", "d": "0x1F", "e": " 1 ", "f": "ü", "g": [1, "2", None],
              "h": {"i": 1.0e-5, "j": True, "k": "", "l": "a: b"}}
    assert config_yaml(tricky) == OmegaConf.to_yaml(OmegaConf.create(tricky))


def test_local_inputs_are_the_path_keys_and_path_like_values_that_exist(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_pairs(tmp_path / "pairs.jsonl")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    (tmp_path / "ppo").mkdir()  # a folder named like a value that is no path (algo.name): not an input
    cfg = compose_cfg(["algo=ppo", "data=jsonl", "data.path=pairs.jsonl", f"policy.name_or_path={tmp_path / 'ckpt'}"])
    assert J.local_inputs(to_plain(cfg)) == {"data.path": "pairs.jsonl", "policy.name_or_path": str(tmp_path / "ckpt"),
                                   "reward_model.name_or_path": str(tmp_path / "ckpt")}  # same_source: the policy's
    hub = compose_cfg(["algo=dpo", "data=hf", "data.name=org/no_such_local_dataset"])
    assert J.local_inputs(to_plain(hub)) == {}  # a hub name counts as its text (in the config digest)
    local = compose_cfg(["algo=dpo", "data=hf", "data.name=pairs.jsonl"])
    assert J.local_inputs(to_plain(local)) == {"data.name": "pairs.jsonl"}
    ident = J.job_identity(to_plain(cfg))
    assert json.loads(ident[J.INPUT_FILES_TAG])["data.path"] == J.path_digest(tmp_path / "pairs.jsonl")
    assert ident[J.CODE_TAG] == J.source_digest() and ident[J.CONFIG_TAG] == J.config_digest(to_plain(cfg))


def test_the_code_digest_is_source_digest_unchanged():
    """The start evaluation's cache key (stages.evaluate) uses this code digest: same function, same value."""
    from rlhf_lab.stages import evaluate

    root = ROOT / "rlhf_lab"
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(f"{f.relative_to(root)}:".encode() + f.read_bytes())
    assert evaluate.source_digest is J.source_digest and J.source_digest() == h.hexdigest()[:16]


def test_changed_parts_names_what_differs():
    now = {J.CONFIG_TAG: "c", J.INPUTS_TAG: "i", J.INPUT_FILES_TAG: '{"data.path": "1", "gold.path": "2"}',
           J.CODE_TAG: "s"}
    assert J.changed_parts(now, now) == []
    assert J.changed_parts({"rlhf_lab.overrides": "seed=0"}, now) is None  # a run from before the digests
    old = {**now, J.INPUTS_TAG: "j", J.INPUT_FILES_TAG: '{"data.path": "0", "gold.path": "2"}', J.CODE_TAG: "t"}
    assert J.changed_parts(old, now) == ["data.path's content", "the code"]
    assert J.changed_parts({**now, J.CONFIG_TAG: "d"}, now) == ["the composed config"]
    before = J.computed_config(to_plain(compose_cfg(["kl.beta=0.1", "tracking.uri=sqlite:///a.db"])))
    assert J.changed_keys(before, to_plain(compose_cfg(["kl.beta=0.2", "tracking.uri=sqlite:///b.db"]))) == "kl.beta: 0.1 -> 0.2"


# -- skip_finished through the CLI (in this process; the job opens its run as a stage does, nothing trains) ----------


@pytest.fixture
def launch(tmp_path, monkeypatch, capsys):
    """launch(*overrides) runs ``rlhf-lab <overrides> skip_finished=true`` in this process with a job that only opens
    and ends its run (``tracking.start_run``, which records the job's identity); returns (stdout, the new run ids)."""
    from rlhf_lab.entry import run as cli
    from rlhf_lab import stages
    from rlhf_lab.runs import tracking

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.chdir(tmp_path)

    def fake_job(cfg, out_dir):
        with tracking.start_run(run_settings(cfg), str(cfg.algo.name)) as run:
            pass
        ran.append(run.info.run_id)
        return {"run_id": run.info.run_id, "eval": {}}

    monkeypatch.setattr(stages, "run_job", fake_job)

    def run(*overrides: str, multirun: bool = False):
        ran.clear()
        where = f"hydra.sweep.dir={tmp_path / 'multirun'}" if multirun else f"hydra.run.dir={tmp_path / 'out'}"
        monkeypatch.setattr(sys, "argv", ["rlhf-lab", *(["-m"] if multirun else []), *overrides, f"tracking.uri={uri}",
                                          "skip_finished=true", where, "hydra/job_logging=none",
                                          "hydra/hydra_logging=none"])
        cli.main()
        return capsys.readouterr().out, list(ran)

    ran: list[str] = []
    run.uri = uri
    return run


@pytest.mark.slow
def test_a_relaunch_reruns_a_job_whose_data_file_changed_and_says_so(tmp_path, launch):
    f = write_pairs(tmp_path / "pairs.jsonl")
    job = ["algo=dpo", "data=jsonl", f"data.path={f}", "study=swap"]
    out, first = launch(*job)
    assert len(first) == 1 and ": skipped (" not in out and ": rerun: " not in out  # no finished run yet
    tags = MlflowClient(launch.uri).get_run(first[0]).data.tags
    assert tags[J.INPUT_FILES_TAG] == json.dumps({"data.path": J.path_digest(f)})
    assert tags[J.CODE_TAG] == J.source_digest() and tags[J.CONFIG_TAG] and tags[J.INPUTS_TAG]
    out, ran = launch(*job)
    assert ran == [] and f"skipped (finished run {first[0]})" in out  # nothing changed
    swap_chosen_and_rejected(f)
    out, ran = launch(*job)
    assert len(ran) == 1, out
    (line,) = [x for x in out.splitlines() if ": rerun: " in x]
    assert line.startswith(f"[rlhf-lab] dpo algo=dpo data=jsonl data.path={f} study=swap ")
    assert line.endswith(f"skip_finished=true: rerun: data.path's content changed since finished run {first[0]}")
    out, again = launch(*job)
    assert again == [] and f"skipped (finished run {ran[0]})" in out  # the rerun is the finished run now


@pytest.mark.slow
def test_a_relaunch_reruns_when_the_code_changed_or_the_run_has_no_digest(tmp_path, launch, monkeypatch):
    job = ["algo=dpo", "study=code"]
    out, first = launch(*job)
    monkeypatch.setattr(J, "source_digest", lambda: "0123456789abcdef")  # another version of the package
    out, ran = launch(*job)
    assert len(ran) == 1 and f"rerun: the code changed since finished run {first[0]}" in out
    client = MlflowClient(launch.uri)
    client.delete_tag(ran[0], J.CODE_TAG)  # as a run made before the digests were recorded
    for t in (J.CONFIG_TAG, J.INPUTS_TAG, J.INPUT_FILES_TAG):
        client.delete_tag(ran[0], t)
    client.delete_run(first[0])
    out, again = launch(*job)
    assert len(again) == 1 and f"rerun: finished run {ran[0]} has no job digest" in out


@pytest.mark.slow
def test_a_study_file_outside_the_package_that_changed_is_a_changed_config(tmp_path, launch):
    """A user's own study (``--config-dir``): the overrides are the same and rlhf_lab.study_digest knows only the
    package's studies; the composed config is what changed."""
    conf = tmp_path / "myconf" / "sweep"
    conf.mkdir(parents=True)
    study = conf / "mine.yaml"
    study.write_text("# @package _global_\nstudy: mine\nalgo:\n  beta: 0.1\n")
    job = ["--config-dir", str(tmp_path / "myconf"), "algo=dpo", "sweep=mine"]
    out, first = launch(*job)
    assert len(first) == 1
    assert launch(*job)[1] == []
    study.write_text("# @package _global_\nstudy: mine\nalgo:\n  beta: 0.2\n")
    out, ran = launch(*job)
    assert len(ran) == 1 and (f"rerun: the composed config (algo.beta: 0.1 -> 0.2) changed since finished run "
                              f"{first[0]}") in out


@pytest.mark.slow
def test_a_multirun_says_how_many_jobs_it_skipped_and_reran(tmp_path, launch):
    f = write_pairs(tmp_path / "pairs.jsonl")
    base = ["algo=dpo", "data=jsonl", f"data.path={f}", "study=counts"]
    out, first = launch(*base, "seed=0,1", multirun=True)
    assert len(first) == 2 and "skip_finished:" not in out  # no finished runs: nothing to count
    out, ran = launch(*base, "seed=0,1", multirun=True)
    assert ran == [] and "every job has a finished run; nothing ran (no new parent run): 2 jobs skipped" in out
    swap_chosen_and_rejected(f)
    out, ran = launch(*base, "seed=0", multirun=True)
    assert len(ran) == 1 and "skip_finished: 1 job rerun" in out
    out, ran = launch(*base, "seed=0,1,2", multirun=True)
    assert len(ran) == 2  # seed 1 reruns (its run read the old file), seed 2 is new; seed 0 ran on this file
    assert ("skip_finished: 1 job skipped (a finished run computed the same), 1 job rerun (its config, inputs or code "
            "changed since its finished run), 1 job run (no finished run)") in out


# -- the case with a real tiny job -------------------------------------------------------------------------


@pytest.mark.slow
def test_a_finished_tiny_rm_job_reruns_after_chosen_and_rejected_were_swapped(tmp_path, session_cache):
    f = write_pairs(tmp_path / "pairs.jsonl", n=120)
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    for k in ("MLFLOW_TRACKING_URI", "HYDRA_FULL_ERROR", "RLHF_LAB_PARENT_RUN_ID"):
        env.pop(k, None)
    job = ["algo=rm", *[o for o in TINY if not o.startswith("data.")], "reward_model.steps=10", "data=jsonl",
           f"data.path={f}", f"cache_dir={session_cache}", "skip_finished=true", "hydra/job_logging=none"]

    def launch(name):
        r = cli_process.run([*job, f"hydra.run.dir={tmp_path / name}"], cwd=tmp_path, env=env, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
        return r.stdout

    assert "rlhf-lab rm: done" in launch("first")
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (done,) = [r.info.run_id for r in client.search_runs(client.get_experiment_by_name("rlhf-lab").experiment_id,
                                                          "tags.`rlhf_lab.stage` = 'rm'")]
    out = launch("again")
    assert f"skipped (finished run {done})" in out and "rlhf-lab rm: done" not in out
    swap_chosen_and_rejected(f)
    out = launch("swapped")
    assert f"rerun: data.path's content changed since finished run {done}" in out and "rlhf-lab rm: done" in out
