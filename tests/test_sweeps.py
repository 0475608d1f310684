"""Canned studies (sweeps/), the MLflow parent/child grouping of a multirun, failure isolation, packaging."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import mlflow
import pytest

from rlhf_lab.entry import sweeps as sweeping
from rlhf_lab.runs.jobs import job_sweep_params
from rlhf_lab.runs.process import SWEPT_ENV
from tests.conftest import compose_cfg

ROOT = Path(__file__).resolve().parents[1]
# every study file, the claims suite's (rlhf_lab_research/suite.py, tests/test_suite.py) included
STUDIES = sorted(p.stem for p in (ROOT / "sweeps" / "sweep").glob("*.yaml"))

# smaller than conftest.TINY: a multirun pays process start-up, a base model and a fine-tuning per job; the upstream
# SFT of a policy job is one epoch (2 steps of 64 on 100 examples; sft.steps' default, 300, cost 15 s of CPU a build)
MICRO = ["policy=a_tiny", "pretrain.steps=3", "pretrain.n_texts=200", "sft.n_examples=100", "sft.steps=2",
         "eval.n_prompts=4",
         "eval.n_test_prompts=4", "eval.n_ood_prompts=0",
         "eval.every_n_steps=0", "eval.n_samples_logged=2", "generation.max_new_tokens=8",
         "trainer.progress_bar=false", "trainer.log_every_n_steps=1", "trainer.max_steps=2"]


def test_the_studies_include_the_original_ones_and_the_claims_suite():
    from rlhf_lab_research.suite import SUITE

    assert {"ppo_beta_grid", "rm_size_vs_policy_size", "seeds"} <= set(STUDIES)
    assert {"dpo_beta_grid", "rm_source"} <= set(ARCHIVED)  # superseded, still composable
    assert {s for s, _ in SUITE} <= set(STUDIES) and len(STUDIES) >= 18


def test_every_study_file_is_a_global_package_with_a_study_name_and_sweeper_params():
    for study in STUDIES:
        text = (ROOT / "sweeps" / "sweep" / f"{study}.yaml").read_text()
        assert text.startswith("# @package _global_"), study
        assert f"study: {study}" in text and "sweeper:" in text and "params:" in text, study


# the studies tuned by Optuna (hydra/sweeper=optuna): their jobs are proposed as they run, not planned (tests/test_tune.py)
TUNED = [s for s in STUDIES if "override /hydra/sweeper: optuna" in (ROOT / "sweeps" / "sweep" / f"{s}.yaml").read_text()]


@pytest.mark.slow
@pytest.mark.parametrize("study", [s for s in STUDIES if s not in TUNED])
def test_each_study_expands_into_jobs_that_compose(study):
    jobs = sweeping.plan([f"sweep={study}"])  # composes every job: a bad key or option raises
    assert len(jobs) >= 3
    cfg = compose_cfg(jobs[0])
    assert cfg.study == study


def test_plan_composes_one_job_per_setting_and_still_checks_every_seed(monkeypatch):
    import hydra

    calls = []
    real = hydra.compose
    monkeypatch.setattr(hydra, "compose", lambda *a, **k: calls.append(k.get("overrides")) or real(*a, **k))
    jobs = sweeping.plan(["algo=sft", "seed=0,1,2", "labeler=unbiased,length_biased"])
    assert len(jobs) == 6 and len(calls) == 1 + 2  # the sweep's own composition, then one per labeler
    with pytest.raises(ValueError, match="seed=x: seed must be an integer"):
        sweeping.plan(["algo=sft", "seed=0,x"])


@pytest.mark.slow
def test_ppo_beta_grid_has_fixed_betas_including_zero_and_adaptive_targets():
    jobs = sweeping.plan(["sweep=ppo_beta_grid"], validate=False)
    settings = []
    for job in jobs:
        cfg = compose_cfg(job)
        assert cfg.algo.name == "ppo" and cfg.study == "ppo_beta_grid"
        settings.append((cfg.kl.name, float(cfg.kl.beta) if cfg.kl.name == "fixed" else float(cfg.kl.target)))
    fixed = sorted(v for n, v in settings if n == "fixed")
    adaptive = sorted(v for n, v in settings if n == "adaptive")
    assert fixed[0] == 0.0 and len(fixed) >= 5 and fixed[-1] / fixed[1] >= 100  # a log grid with β=0
    assert len(adaptive) >= 3


@pytest.mark.slow
def test_other_studies_sweep_the_keys_they_name():
    dpo = [compose_cfg(j) for j in sweeping.plan(["sweep=dpo_beta_grid"], validate=False)]
    assert {c.algo.name for c in dpo} == {"dpo"} and len({float(c.algo.beta) for c in dpo}) >= 4
    grid = [compose_cfg(j) for j in sweeping.plan(["sweep=rm_size_vs_policy_size"], validate=False)]
    pairs = {(c.policy.arch.hidden, c.reward_model.arch.hidden) for c in grid}
    assert len(pairs) == len(grid) >= 9 and {c.reward_model.source for c in grid} == {"same"}
    src = [compose_cfg(j) for j in sweeping.plan(["sweep=rm_source"], validate=False)]
    assert {(c.reward_model.source, float(c.data.on_policy_fraction)) for c in src} == {
        ("same", 0.0), ("same", 0.2), ("different", 0.0), ("different", 0.2), ("pretrained", 0.0), ("pretrained", 0.2)}
    assert {c.reward_model.name_or_path for c in src if c.reward_model.source == "pretrained"} == {"minilm"}


@pytest.mark.slow
def test_algo_frontier_has_a_beta_grid_per_algorithm_and_three_seeds():
    cfgs = [compose_cfg(j) for j in sweeping.plan(["sweep=algo_frontier"], validate=False)]
    points: dict[str, set] = {}
    for c in cfgs:
        assert c.study == "algo_frontier"
        beta = {"dpo": lambda: c.algo.beta, "bon": lambda: c.algo.n_max}.get(c.algo.name, lambda: c.kl.beta)()
        if c.algo.name in ("ppo", "grpo", "rloo"):
            assert c.kl.name == "fixed" and c.algo.steps == 60 and c.eval.every_n_steps == 10
        points.setdefault(c.algo.name, set()).add((float(beta), int(c.seed)))
    assert set(points) == {"ppo", "grpo", "rloo", "dpo", "bon"}
    for algo, pts in points.items():
        assert {s for _, s in pts} == {0, 1, 2}, algo
        assert len({b for b, _ in pts}) >= (1 if algo == "bon" else 3), algo


def test_frontier_points_are_their_algorithm_file_with_beta_set():
    """conf/frontier/ holds a file per algorithm family (rl.yaml: PPO, GRPO, RLOO; dpo.yaml; bon.yaml); a point of
    the study, +frontier=<algo>_<β>, composes as that file with algo=<algo> and β typed inline (rlhf_lab/config/
    frontier.py registers the points, issue 47), and every point algo_frontier sweeps exists."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from rlhf_lab.config.frontier import BETAS, POINTS

    assert sorted(p.stem for p in (ROOT / "conf" / "frontier").glob("*.yaml")) == ["bon", "dpo", "rl"]
    registered = {n.removesuffix(".yaml") for n in ConfigStore.instance().list("frontier")}
    assert registered == {f"{a}_{b}" for a in POINTS for b in BETAS}
    study = (ROOT / "sweeps" / "sweep" / "algo_frontier.yaml").read_text()
    swept = study.split("+frontier:")[1].splitlines()[0].strip().split(",")
    assert set(swept) - {"bon"} <= registered and "bon" in swept and len(swept) == 13
    for point, spelled in (("grpo_0.3", ["+frontier=rl", "algo=grpo", "kl.beta=0.3"]),
                           ("ppo_1", ["+frontier=rl", "kl.beta=1"]),
                           ("dpo_0.01", ["+frontier=dpo", "algo.beta=0.01"])):
        a, b = compose_cfg([f"+frontier={point}", "seed=1"]), compose_cfg(spelled + ["seed=1"])
        assert OmegaConf.to_container(a) == OmegaConf.to_container(b), point
    c = compose_cfg(["+frontier=rloo_0.03"])
    assert (c.algo.name, c.kl.name, c.kl.beta, c.algo.steps, c.eval.every_n_steps) == ("rloo", "fixed", 0.03, 60, 10)


def _flat(cfg) -> dict:
    from omegaconf import OmegaConf

    def walk(node, prefix=""):
        for k, v in node.items():
            yield from walk(v, f"{prefix}{k}.") if isinstance(v, dict) else [(f"{prefix}{k}", v)]
    return dict(walk(OmegaConf.to_container(cfg, resolve=True)))


@pytest.mark.slow
def test_algo_frontier_equal_gives_every_algorithm_the_same_updates_and_arms_differ_only_in_algorithm_and_beta():
    """Issue 42, point 5: 960 policy AdamW steps for PPO, GRPO, RLOO (60 steps x 4 passes x 4 minibatches) and DPO
    (960 steps), 3840 samples for each RL point, one RM per seed; at one seed two points of one algorithm differ only
    in β, and two RL algorithms at one β only in the algorithm's own keys (algo.*, and GRPO's KL placement)."""
    cfgs = [compose_cfg(j) for j in sweeping.plan(["sweep=algo_frontier_equal"], validate=False)]
    assert len(cfgs) == 65 and {int(c.seed) for c in cfgs} == {0, 1, 2, 3, 4}
    flat = {}
    for c in cfgs:
        assert c.study == "algo_frontier_equal" and c.reward_model.seed == c.seed
        if c.algo.name in ("ppo", "grpo", "rloo"):
            assert c.algo.steps * c.algo.ppo_epochs * c.algo.num_minibatches == 960
            assert c.algo.steps * c.algo.batch_size == 3840 and c.kl.name == "fixed" and c.eval.every_n_steps == 10
            beta = c.kl.beta
        elif c.algo.name == "dpo":
            assert c.algo.steps == 960 and c.eval.every_n_steps == 160
            beta = c.algo.beta
        else:
            assert c.algo.name == "bon"
            beta = None
        flat[(c.algo.name, beta, int(c.seed))] = _flat(c)
    assert {a for a, _, _ in flat} == {"ppo", "grpo", "rloo", "dpo", "bon"}
    ignore = {"study"}  # no key computes differently but those named below

    def diff(a, b):
        return {k for k in set(flat[a]) | set(flat[b]) if flat[a].get(k) != flat[b].get(k)} - ignore
    for algo, key in (("ppo", "kl.beta"), ("grpo", "kl.beta"), ("rloo", "kl.beta"), ("dpo", "algo.beta")):
        assert diff((algo, 0.01, 0), (algo, 1, 0)) == {key}, algo
    for other in ("grpo", "rloo"):
        keys = diff(("ppo", 0.1, 0), (other, 0.1, 0))
        assert keys and all(k.startswith(("algo.", "kl.")) for k in keys), keys
        assert not {k for k in keys if k.startswith(("algo.steps", "algo.batch_size", "algo.ppo_epochs",
                                                      "algo.num_minibatches", "algo.lr", "reward_model.", "policy.",
                                                      "data.", "eval."))}, keys


@pytest.mark.slow
def test_inline_overrides_win_and_seeds_combine_with_a_study():
    jobs = sweeping.plan(["sweep=ppo_beta_grid", "+ppo_kl=fixed_0,fixed_0.1", "trainer.max_steps=7"], validate=False)
    assert len(jobs) == 2
    cfgs = [compose_cfg(j) for j in jobs]
    assert [float(c.kl.beta) for c in cfgs] == [0.0, 0.1] and {c.trainer.max_steps for c in cfgs} == {7}
    jobs = sweeping.plan(["sweep=[seeds,dpo_beta_grid]"], validate=False)
    cfgs = [compose_cfg(j) for j in jobs]
    assert len(jobs) == 15 and {c.study for c in cfgs} == {"dpo_beta_grid"} and {c.seed for c in cfgs} == {0, 1, 2}


def test_swept_keys_and_job_params():
    keys = sweeping.swept_keys({"algo": "ppo", "+ppo_kl": "fixed_0,fixed_1"}, ["seed=0,1", "sweep=x", "algo=dpo"])
    assert keys == ["ppo_kl", "seed"]
    os.environ[SWEPT_ENV] = "ppo_kl,seed"
    try:
        assert job_sweep_params(["+ppo_kl=fixed_0", "seed=1", "sweep=x"]) == {
            "sweep.ppo_kl": "fixed_0", "sweep.seed": "1"}
    finally:
        del os.environ[SWEPT_ENV]


def run_cli(*args, cwd, timeout=240):
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))  # this checkout's code
    for k in ("MLFLOW_TRACKING_URI", sweeping.PARENT_ENV, sweeping.SWEPT_ENV, sweeping.STATE_ENV):
        env.pop(k, None)
    # a new interpreter, not tests/cli_process.py: joblib's loky workers started from a forked child hang
    return subprocess.run([sys.executable, "-m", "rlhf_lab.entry.run", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.slow
def test_parallel_multirun_is_one_parent_run_and_a_failing_job_does_not_stop_the_other(tmp_path):
    # joblib launcher, 2 workers: the children (other processes) must see the parent run's id
    r = run_cli("-m", "hydra/launcher=parallel", "algo=sft", *MICRO, "study=smoke", "sft.lr=0.001,-1", cwd=tmp_path)
    assert r.returncode == 1, r.stderr[-3000:]  # the sweep ran to its end, and says that a job failed
    # sft.lr=-1 fails the config check (rlhf_lab/config/checks.py) before the job opens a run
    assert "job 1 FAILED: ConfigError: sft.lr must be > 0, got -1" in r.stderr and "rlhf-lab sft: done" in r.stdout
    table = r.stdout[r.stdout.index("job (run name)"):]  # the sweep's table of jobs
    assert "sft sft.lr=0.001" in table and "FINISHED" in table and "job 1 (" in table
    assert "(1 CPU threads)" in r.stdout  # 2 cores shared by 2 jobs
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["rlhf-lab"])
    parents = runs[runs["tags.rlhf_lab.stage"] == "sweep"]
    assert len(parents) == 1
    parent = parents.iloc[0]
    assert parent["status"] == "FAILED" and parent["tags.rlhf_lab.study"] == "smoke"
    assert parent["tags.rlhf_lab.command"].startswith("rlhf-lab -m ") and "sft.lr=0.001,-1" in parent["tags.rlhf_lab.command"]
    assert "job 1" in parent["tags.rlhf_lab.error"]
    jobs = runs[runs["tags.rlhf_lab.stage"] == "sft"]
    assert len(jobs) == 1
    assert set(jobs["tags.mlflow.parentRunId"]) == {parent["run_id"]}
    assert set(jobs["tags.rlhf_lab.study"]) == {"smoke"}
    job = jobs.iloc[0]
    assert job["params.sweep.sft.lr"] == "0.001" and job["status"] == "FINISHED"
    assert job["tags.mlflow.runName"] == "sft sft.lr=0.001"
    # the upstream base model was trained once, as a child too
    pre = runs[runs["tags.rlhf_lab.stage"] == "pretrain"]
    assert len(pre) == 1 and pre.iloc[0]["tags.mlflow.parentRunId"] == parent["run_id"]


@pytest.mark.slow
def test_a_single_run_that_fails_exits_nonzero(tmp_path, monkeypatch, capsys):
    # in-process (a subprocess would pay the imports again): Hydra reports the error and exits 1
    from rlhf_lab.entry import run as cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["rlhf-lab", "algo.name=nope", f"hydra.run.dir={tmp_path / 'out'}",
                                      "hydra/job_logging=none", "hydra/hydra_logging=none"])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    assert exc.value.code == 1 and "nope" in capsys.readouterr().err


@pytest.mark.slow
def test_wheel_ships_the_sweeps(installed_wheel, tmp_path):
    wheel, target = installed_wheel
    names = zipfile.ZipFile(wheel).namelist()
    for study in STUDIES:
        assert f"rlhf_lab/sweeps/sweep/{study}.yaml" in names
    assert "rlhf_lab/sweeps/ppo_kl/fixed_0.yaml" in names and "rlhf_lab/sweeps/__init__.py" in names
    assert "rlhf_lab/conf/hydra/launcher/parallel.yaml" in names and "rlhf_lab/entry/report.py" in names
    entry = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "rlhf-lab-report = rlhf_lab.entry.report:main" in entry and "rlhf-lab-suite = rlhf_lab_research.suite:main" in entry
    assert "rlhf_lab/sweeps/kl_est/k3_loss.yaml" in names and "rlhf_lab/sweeps/rm_ens/ens3_tiny_l1.yaml" in names
    assert "rlhf_lab/sweeps/rm_size/micro.yaml" in names and "rlhf_lab_research/suite.py" in names
    assert "claims = rlhf_lab_research.report:main" in entry and "rlhf_lab_research/studies/gao.py" in names
    assert {f"rlhf_lab/sweeps/archive/sweep/{s}.yaml" for s in ARCHIVED} <= set(names)
    assert {f"rlhf_lab/conf/frontier/{f}.yaml" for f in ("rl", "dpo", "bon")} <= set(names)
    env = dict(os.environ, PYTHONPATH=str(target))
    code = ("import rlhf_lab.entry.sweeps as s, rlhf_lab; assert rlhf_lab.__file__.startswith(%r); "
            "print(len(s.plan(['sweep=ppo_beta_grid', 'hydra/launcher=parallel'])))" % str(target))
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "11"
    r = subprocess.run([sys.executable, "-m", "rlhf_lab.entry.run", "--cfg", "job", "sweep=rm_source"], cwd=tmp_path,
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "study: rm_source" in r.stdout
    r = subprocess.run([sys.executable, "-m", "rlhf_lab.entry.run", "--cfg", "job", "+frontier=grpo_0.3"], cwd=tmp_path,
                       capture_output=True, text=True, env=env, timeout=120)  # a point registered from the wheel's files
    assert r.returncode == 0, r.stderr
    assert "name: grpo" in r.stdout and "beta: 0.3" in r.stdout and "steps: 60" in r.stdout


def test_a_sweeps_launching_process_does_not_import_lightning():
    """The sweep's parent process opens the parent run (``rlhf_lab.runs.tracking``) and launches the jobs; it never
    trains, so it does not pay Lightning's import (about 2.7 s on 2 cores) before the first job can start."""
    code = ("import sys, rlhf_lab.entry.run, rlhf_lab.entry.sweeps, rlhf_lab.runs.tracking; "
            "print(sorted(m for m in ('lightning', 'lightning.pytorch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


ARCHIVED = sorted(p.stem for p in (ROOT / "sweeps" / "archive" / "sweep").glob("*.yaml"))


def test_archived_studies_stay_composable_and_nothing_live_runs_them():
    """A superseded design (sweeps/archive/sweep/) composes with the same ``sweep=<study>`` as before (its jobs are
    valid configs), no live study file has its name, and the suite runs none of them (docs/architecture.md)."""
    from rlhf_lab_research.suite import SUITE
    from rlhf_lab_research.suite_prepare import PREPARE

    assert len(ARCHIVED) >= 7 and not set(ARCHIVED) & set(STUDIES)
    assert not {s for s, _ in SUITE} & set(ARCHIVED) and not set(PREPARE) & set(ARCHIVED)
    from rlhf_lab_research.designs import SUITE_VERSIONS
    from rlhf_lab_research.claims_registry import CLAIMS

    # a claim may name an archived study (the name its runs are kept under), but the design it reads first is live;
    # an archived design is at most a fallback for a store that has only its runs
    newest = {SUITE_VERSIONS.get(s, (s,))[0] for c in CLAIMS for s in c.studies + c.also}
    assert newest <= set(STUDIES), newest - set(STUDIES)
    for study in ARCHIVED:
        jobs = sweeping.plan([f"sweep={study}"])  # composes and checks every job
        assert jobs and all(f"sweep={study}" in j for j in jobs), study


@pytest.mark.slow
def test_rm_mis_scoring_probe_arms_differ_only_in_the_rm_source_and_its_on_policy_share():
    """Issue 42, point 1: the three arms (same source, different source, different source with 20 % on-policy pairs)
    compose alike but for the RM (its family, and so its SFT init of that family) and the on-policy fraction; every
    arm's RM starts from an SFT run (reward_model.init=sft) and is measured on its seed's probe policy."""
    jobs = sweeping.plan(["sweep=rm_mis_scoring_probe"], validate=False)
    assert len(jobs) == 15
    arms = {next(o for o in j if o.startswith("+rm_src=")): _flat(compose_cfg(j)) for j in jobs if "seed=0" in j}
    assert set(arms) == {"+rm_src=same", "+rm_src=different", "+rm_src=different_mix"}
    for a in arms.values():
        assert a["reward_model.init"] == "sft" and a["eval.probe_path"] == "suite_artifacts/rm_mis_probe/seed_0/artifact"
    base = arms["+rm_src=same"]
    for name, other in arms.items():
        diff = {k for k in set(base) | set(other) if base.get(k) != other.get(k)}
        assert all(k.startswith("reward_model.") or k == "data.on_policy_fraction" for k in diff), (name, diff)
    assert {k for k in arms["+rm_src=different"] if arms["+rm_src=different"][k] != arms["+rm_src=different_mix"].get(k)} \
        == {"data.on_policy_fraction"}


@pytest.mark.slow
def test_gold_recipes_arms_differ_only_in_the_gold_and_beta():
    """Issue 43: within a β and seed the eight recipes compose alike but for gold.build.* (the gold's coverage, pairs,
    steps, members); within a recipe and seed the β arms differ only in kl.*; one proxy RM per seed."""
    jobs = sweeping.plan(["sweep=gold_recipes"], validate=False)
    assert len(jobs) == 120
    seed0 = {(next(o for o in j if o.startswith("+gold_recipe=")), next(o for o in j if o.startswith("+ppo_kl="))):
             _flat(compose_cfg(j)) for j in jobs if "seed=5" in j}
    assert len(seed0) == 24 and not [j for j in jobs if "seed=0" in j]  # seeds 0-2 shaped the recipes (pilot)
    base = seed0[("+gold_recipe=base", "+ppo_kl=fixed_0")]
    assert base["gold.source"] == "rm" and base["reward_model.seed"] == 5
    assert base["gold.build.data.degenerate_fraction"] == 0.0 and base["data.degenerate_fraction"] == 0.0
    for (recipe, kl), arm in seed0.items():
        diff = {k for k in set(base) | set(arm) if base.get(k) != arm.get(k)}
        assert all(k.startswith(("gold.build.", "kl.")) for k in diff), (recipe, kl, diff)
        assert (kl == "+ppo_kl=fixed_0") == all(not k.startswith("kl.") for k in diff)
    broad = seed0[("+gold_recipe=broad_ensemble", "+ppo_kl=fixed_0")]
    assert broad["gold.build.reward_model.ensemble"] == 3 and broad["gold.build.data.n_train"] == 40000
    assert broad["gold.build.data.sft_temperatures"] == [0.7, 1.0, 1.3]
    cover = seed0[("+gold_recipe=onpolicy", "+ppo_kl=fixed_0")]
    assert cover["gold.build.data.on_policy_fraction"] == 0.25 and base["data.on_policy_fraction"] == 0.0
    assert cover["gold.build.covers"] == [{"seed": 200, "beta": 0.0, "steps": 80, "round": 1}]
    covers = seed0[("+gold_recipe=covers", "+ppo_kl=fixed_0")]
    assert covers["gold.build.data.on_policy_pairing"] == "sft" and base["data.on_policy_pairing"] == "self"
    assert [c["seed"] for c in covers["gold.build.covers"]] == list(range(200, 206)) and not base["gold.build.covers"]
    adversarial = seed0[("+gold_recipe=adversarial", "+ppo_kl=fixed_0")]
    assert [(c["seed"], c["round"]) for c in adversarial["gold.build.covers"]] == [
        *[(s, 1) for s in range(200, 206)], (300, 2), (301, 2), (302, 2)]
    assert adversarial["gold.build.cover_gold_data.on_policy_fraction"] == 0.25
