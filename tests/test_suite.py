"""The claims suite: its studies' designs (5 paired seeds, enough evaluations, stated job counts and times),
``skip_finished`` (a resumed sweep skips the jobs with a FINISHED run), and ``python -m rlhf_lab_research.suite --dry-run``.
Nothing here trains: the runs in the tracking store are fake ones made with MlflowClient."""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from mlflow.tracking import MlflowClient

from rlhf_lab.entry import sweeps as sweeping
from rlhf_lab_research import suite, suite_prepare, suite_seeds
from rlhf_lab.config.keys import to_plain
from rlhf_lab.runs.identity import job_identity
from rlhf_lab.stages.presets import parse_preset_ref
from rlhf_lab.runs.jobs import find_finished_run, job_overrides, study_digest, study_names
from rlhf_lab.stages.pipeline import run_settings
from tests.conftest import compose_cfg

SUITE = [s for s, _ in suite.SUITE]
SEEDS = {0, 1, 2, 3, 4}


@pytest.fixture(scope="module")
def plans():
    """{study: [job overrides]} for every study of the suite."""
    return {s: sweeping.plan([f"sweep={s}"], validate=False) for s in SUITE}


@pytest.fixture(scope="module")
def jobs(plans):
    """{study: [(overrides, composed config)]} for the seed-0 job of every setting (a compose takes ~0.3 s;
    test_sweeps.py composes every job)."""
    with initialize_config_module("rlhf_lab.conf", version_base="1.3"):
        return {s: [(j, compose("config", overrides=j)) for j in js if "seed=0" in j] for s, js in plans.items()}


def n_evaluations(cfg) -> int:
    """Evaluations of a PPO job: at step 0, at the steps of eval.schedule (stages.training.eval_steps), and at
    the end."""
    from rlhf_lab.stages.training import eval_steps

    steps = int(cfg.trainer.max_steps if cfg.trainer.max_steps is not None else cfg.algo.steps)
    if cfg.eval.schedule == "kl":  # decided as training goes: the start, the end and each new sqrt(KL) level reached
        # (gao_rm_scaling_kl's arms ended at sqrt KL 2.3-11.6 in gao_rm_scaling: at least 4 levels of 0.5)
        return 2 + min(int(cfg.eval.n_points), int(2.3 // float(cfg.eval.sqrt_kl_spacing)))
    return len({0, steps} | set(eval_steps(cfg, steps)))


def test_every_suite_study_exists_and_every_new_claim_has_one():
    assert set(SUITE) <= set(study_names())  # live study files, none archived
    claims = {c for _, cs in suite.SUITE for c in cs.split()}
    assert {"C1", "C3", "C5", "C6", "C7", "C8", "C11", "C12", "C13", "C14", "C15", "C16", "C18", "C19", "C20"} <= claims


@pytest.mark.slow
def test_each_setting_runs_the_same_five_seeds(plans, jobs):
    for study, js in plans.items():
        seeds = defaultdict(set)
        for job in js:
            (seed,) = [int(o.split("=", 1)[1]) for o in job if o.startswith("seed=")]
            seeds[" ".join(o for o in job if not o.startswith("seed="))].add(seed)
        assert len(seeds) >= 2 and len(seeds) == len(jobs[study]), study
        assert all(s == SEEDS for s in seeds.values()), (study, dict(seeds))
        assert {c.study for _, c in jobs[study]} == {study} and {c.seed for _, c in jobs[study]} == {0}


@pytest.mark.slow  # composes every job of every suite study (module fixture)
def test_ppo_studies_log_enough_evaluations_for_a_drop_from_peak(jobs):
    for study, js in jobs.items():
        for _, cfg in js:
            if cfg.algo.name == "ppo":
                assert n_evaluations(cfg) >= 6, (study, n_evaluations(cfg))


@pytest.mark.slow  # composes every job of every suite study (module fixture)
def test_headers_state_the_job_counts_and_each_study_fits_a_session(plans):
    """Each study is one resumable command: it must fit a 3-hour working session with room to spare."""
    for study, js in plans.items():
        n, minutes = suite.expected(study)
        assert n == len(js), (study, n, len(js))
        assert minutes is not None and 0 < minutes <= 120, (study, minutes)


@pytest.mark.slow  # composes the 13 jobs of seed 0
def test_every_algorithm_of_the_frontier_study_is_evaluated_at_least_6_times_on_one_sample_budget():
    """algo_frontier (issue 29): ≥ 6 evaluations per run, DPO included; the RL algorithms generate the same number
    of policy samples in training (steps × responses per step)."""
    js = sweeping.plan(["sweep=algo_frontier"], validate=False)
    with initialize_config_module("rlhf_lab.conf", version_base="1.3"):
        cfgs = [compose("config", overrides=j) for j in js if "seed=0" in j]
    samples = set()
    for cfg in cfgs:
        if cfg.algo.name == "bon":
            continue
        assert n_evaluations(cfg) >= 6, (cfg.algo.name, n_evaluations(cfg))
        if cfg.algo.name != "dpo":
            samples.add(int(cfg.algo.steps) * int(cfg.algo.batch_size))
    assert len(cfgs) == 13 and samples == {3840}


def _settings(js, *getters):
    return {tuple(g(c) for g in getters) for _, c in js}


@pytest.mark.slow  # composes every job of every suite study (module fixture)
def test_the_studies_sweep_what_their_claims_need(jobs):
    assert _settings(jobs["ref_sync"], lambda c: c.algo.reference.sync_every) == {(1,), (10,), (0,)}
    shared = jobs["ref_shared"]
    assert _settings(shared, lambda c: c.algo.reference.kind) == {("copy",), ("lora_disabled",)}
    assert _settings(shared, lambda c: c.algo.lora.r, lambda c: c.algo.critic) == {(16, "policy")}
    kl = _settings(jobs["kl_estimators"], lambda c: c.algo.kl_estimator, lambda c: c.algo.kl_in)
    assert kl == {("k1", "reward"), ("k3", "reward"), ("k3", "loss")}
    refs = _settings(jobs["ref_size"], lambda c: c.algo.reference.path, lambda c: c.algo.reference.seed,
                     lambda c: c.labeler.name)
    assert {r[0] for r in refs} == {"sft@a_tiny", "sft@a_small", "sft@a_medium"} and {r[1] for r in refs} == {0}
    assert {r[2] for r in refs} == {"unbiased", "length_biased"} and parse_preset_ref("sft@a_tiny") == ("sft", "a_tiny")
    lp = jobs["length_penalty"]
    assert {c.labeler.length_bonus > 0 for _, c in lp} == {True}
    assert {float(c.algo.length_penalty) for _, c in lp} == {0.0, 0.1}
    assert {float(c.algo.clip_eps) for _, c in jobs["clip_eps"]} == {0.2, 0.4}
    assert _settings(jobs["critic_baseline"], lambda c: c.algo.critic, lambda c: c.algo.baseline) == {
        ("policy", "mean"), ("none", "mean")}
    rm = jobs["rm_lora"]
    assert {c.algo.name for _, c in rm} == {"rm"} and {int(c.reward_model.lora.r) for _, c in rm} == {8, 64, 0}
    assert {bool(c.reward_model.normalize) for _, c in jobs["rm_normalize_5rms"]} == {True, False}
    grid = _settings(jobs["ppo_beta_grid_wide"], lambda c: c.kl.name,
                     lambda c: float(c.kl.beta) if c.kl.name == "fixed" else float(c.kl.target))
    # C4: two β below 0.01–0.1, two inside, two above
    assert grid == {("fixed", 0.0), ("fixed", 0.003), ("fixed", 0.01), ("fixed", 0.1), ("fixed", 0.3),
                    ("fixed", 1.0), ("adaptive", 1.0), ("adaptive", 4.0)}
    dpo = jobs["dpo_beta_grid_5seeds"]  # C9 ranks the βs of each seed: ≥ 3 per seed on both sides
    assert {c.algo.name for _, c in dpo} == {"dpo"} and {float(c.algo.beta) for _, c in dpo} == {0.01, 0.1, 1.0}
    sizes = jobs["rm_size_vs_policy_size_5rms"]
    assert {c.reward_model.arch.hidden for _, c in sizes} == {16, 32, 64}
    assert {(c.policy.arch.hidden, c.reward_model.source, float(c.kl.beta)) for _, c in sizes} == {
        (64, "same", 0.01)}
    # C13: Gao's setup, PPO at β = 0 with the log-spaced evaluations, best-of-n with the same RMs (RM key and seed)
    gao, bon = jobs["gao_rm_scaling"], jobs["gao_rm_scaling_bon"]
    assert _settings(gao, lambda c: c.labeler.name, lambda c: c.reward_model.arch.hidden) == {
        (lab, h) for lab in ("unbiased", "length_biased") for h in (16, 32, 64, 128)}
    assert {(c.algo.name, float(c.kl.beta), c.eval.schedule, c.policy.arch.hidden) for _, c in gao} == {
        ("ppo", 0.0, "log", 64)}
    assert {c.algo.name for _, c in bon} == {"bon"} and len(bon) == len(gao) == 8  # the seed-0 jobs
    ens = _settings(jobs["rm_ensemble_5rms"], lambda c: c.reward_model.arch.hidden, lambda c: c.reward_model.ensemble,
                    lambda c: float(c.reward_model.conservative_lambda))
    assert ens == {(32, 3, 0.0), (32, 3, 1.0), (64, 1, 0.0)}
    grpo = jobs["grpo_kl"]
    assert _settings(grpo, lambda c: c.algo.name, lambda c: c.kl.name, lambda c: float(c.kl.beta),
                     lambda c: c.algo.kl_in, lambda c: c.algo.kl_estimator) == {
        ("grpo", "fixed", 0.04, "loss", "k3"), ("grpo", "fixed", 0.0, "loss", "k3")}
    matched = jobs["rm_source_matched"]  # C16: both RMs from an SFT of their own family, the same shape
    assert _settings(matched, lambda c: c.reward_model.source, lambda c: c.reward_model.init,
                     lambda c: (c.reward_model.arch.hidden, c.reward_model.arch.layers, c.reward_model.arch.heads)) == {
        ("same", "sft", (64, 2, 4)), ("different", "sft", (64, 2, 4))}
    src = jobs["rm_mis_scoring_probe"]  # C17: every RM from an SFT of its own family, all read on the seed's probe
    assert _settings(src, lambda c: c.reward_model.source, lambda c: c.reward_model.init,
                     lambda c: float(c.data.on_policy_fraction), lambda c: c.labeler.name,
                     lambda c: c.eval.samples_per_prompt) == {
        (s, "sft", f, "unbiased", 2) for s, f in (("same", 0.0), ("different", 0.0), ("different", 0.2))}
    assert {str(c.eval.probe_path) for _, c in src} == {str(c.data.on_policy_path) for _, c in src}
    assert all(str(c.eval.probe_path).endswith(f"seed_{c.seed}/artifact") for _, c in src)
    assert "rm_mis_scoring" not in suite_prepare.PREPARE  # archived: the suite makes no artifact for it


@pytest.mark.slow  # composes every job of every suite study (module fixture)
def test_c5s_arms_differ_only_in_the_kl_target_and_the_controller_can_reach_what_each_target_needs(jobs):
    """kl_controller (issue 42, point 2): composed, the jobs of one seed differ in kl.target and nothing else that
    computes; the controller's largest move over the run, (1 + 0.2·n/horizon)^steps, covers the 10× each way the
    targets need (the study file's arithmetic), where ppo_beta_grid_wide's horizon allowed 1.67×."""
    from omegaconf import OmegaConf

    from rlhf_lab.config.keys import computes
    from rlhf_lab.runs.identity import leaves

    ctl = jobs["kl_controller"]
    seed0 = [leaves(OmegaConf.to_container(c, resolve=True)) for _, c in ctl]  # the fixture's seed-0 jobs
    assert sorted(f["kl.target"] for f in seed0) == [1.0, 4.0, 8.0]
    differ = {k for f in seed0 for k in f if computes(k) and len({repr(g.get(k)) for g in seed0}) > 1}
    assert differ == {"kl.target"}, differ
    assert all(f["reward_model.seed"] == f["seed"] for f in seed0)  # one RM per seed, shared by its targets
    for _, c in ctl:
        reach = (1 + 0.2 * c.algo.batch_size / c.kl.horizon) ** c.algo.steps
        assert c.kl.name == "adaptive" and float(c.kl.beta) == 0.1 and reach > 100
    wide = [c for _, c in jobs["ppo_beta_grid_wide"] if c.kl.name == "adaptive"]
    assert (1 + 0.2 * wide[0].algo.batch_size / wide[0].kl.horizon) ** wide[0].algo.steps < 1.7


RM_STUDIES = ("rm_normalize_5rms", "gao_rm_scaling_kl", "rm_source_matched", "rm_mis_scoring_probe",
              "rm_size_vs_policy_size_5rms",
              "gao_rm_scaling", "gao_rm_scaling_bon", "rm_ensemble_5rms")


def test_the_rm_claims_studies_train_one_rm_per_seed_and_its_cache_key_changes_with_it(monkeypatch, tmp_path):
    """Every study of a claim about the RM (C10, C13, C16–C20; rm_lora's jobs are RMs, one per seed already) sets
    reward_model.seed: ${seed}: the RM an upstream stage trains takes the job's seed, and so does its cache key."""
    from rlhf_lab_research.designs import SUITE_VERSIONS
    from rlhf_lab_research.claims_registry import CLAIMS
    from rlhf_lab.stages import rm as rm_stage
    from rlhf_lab.stages.pipeline import cache_for, stage_seed

    rm_claims = {c.id for c in CLAIMS if c.min_rms}
    assert rm_claims == {"C10", "C13", "C16", "C17", "C18", "C19", "C20"}
    newest = {SUITE_VERSIONS.get(s, (s,))[0] for c in CLAIMS if c.min_rms for s in c.studies + c.also}
    assert newest == {*RM_STUDIES, "rm_lora"} and set(RM_STUDIES) <= set(SUITE)
    monkeypatch.setattr(rm_stage, "backbone_path", lambda cfg: tmp_path / "backbone")  # no upstream build
    monkeypatch.setattr(rm_stage, "data_identity", lambda cfg: {"source": "world", "prefs": "pairs"})
    for study in RM_STUDIES:
        jobs = [j for j in sweeping.plan([f"sweep={study}"], validate=False)][:2] + \
            [j for j in sweeping.plan([f"sweep={study}"], validate=False) if "seed=1" in j][:1]
        keys = {}
        for job in jobs:
            cfg = compose_cfg(job + [f"cache_dir={tmp_path}"])
            assert cfg.reward_model.seed == cfg.seed == stage_seed(cfg, "rm", "reward_model"), (study, job)
            spec = rm_stage.spec(cfg)
            assert spec["seed"] == cfg.seed
            keys.setdefault(cfg.seed, set()).add(cache_for(cfg).path("rm", spec))
        assert set(keys) == {0, 1} and not keys[0] & keys[1], study  # seed 0 and seed 1: different RMs
    # best-of-n reuses gao_rm_scaling's RMs: the same RM cache key for the same labeler, RM size and seed
    ppo_jobs, bon_jobs = (sweeping.plan([f"sweep={s}"], validate=False) for s in ("gao_rm_scaling", "gao_rm_scaling_bon"))
    for ppo_job, bon_job in list(zip(ppo_jobs, bon_jobs))[::13]:
        setting = [[o for o in j if not o.startswith(("sweep=", "study="))] for j in (ppo_job, bon_job)]
        assert setting[0] == setting[1]
        ppo_cfg, bon_cfg = (compose_cfg(j + [f"cache_dir={tmp_path}"]) for j in (ppo_job, bon_job))
        assert cache_for(ppo_cfg).path("rm", rm_stage.spec(ppo_cfg)) == cache_for(bon_cfg).path("rm", rm_stage.spec(bon_cfg))
    # the older designs keep one RM for every seed
    cfg = compose_cfg(["sweep=rm_normalize", "seed=3"])
    assert cfg.reward_model.seed == 0


@pytest.mark.slow
def test_dry_run_lists_every_study_with_its_job_count(capsys):
    assert suite.main(["--dry-run", "--no-validate"]) == 0
    out = capsys.readouterr().out
    for study in SUITE:
        n, _ = suite.expected(study)
        line = next(line for line in out.splitlines() if f" {study} " in line)
        assert f" {n} " in line, line
    assert f"{len(SUITE)} studies, {sum(suite.expected(s)[0] for s in SUITE)} jobs" in out
    assert "skip_finished=true" in out and "hydra/launcher=parallel" in out and "rlhf-lab-report --claims" in out


def test_suite_commands_resume_and_report_to_the_same_store():
    cmd = suite.study_command("ref_sync", ["cache_dir=/c"], 2)
    assert cmd[:3] == [sys.executable, "-m", "rlhf_lab.entry.run"]
    assert cmd[3:] == ["-m", "sweep=ref_sync", "hydra/launcher=parallel", "hydra.launcher.n_jobs=2",
                       "skip_finished=true", "cache_dir=/c"]
    rep = suite.report_command(["tracking.uri=sqlite:///x.db"], "reports")
    assert rep[1:] == ["-m", "rlhf_lab.entry.report", "--claims", "--out", "reports", "--uri", "sqlite:///x.db"]
    rep = suite.report_command([], "reports", ["a.json.gz", "b.json.gz"])
    assert rep[3:] == ["--claims", "--out", "reports", "--runs", "a.json.gz", "--runs", "b.json.gz"]
    with pytest.raises(SystemExit):
        suite.main(["--dry-run", "--studies", "no_such_study"])


# -- skip_finished --------------------------------------------------------------------------------------------


def fake_run(client, exp_id, stage, study, overrides, status="FINISHED", gold=None, digest=None, identity=None):
    """A run as a job of `stage` leaves it; `identity`: the tags of what it computed (rlhf_lab.runs.identity)."""
    tags = {"rlhf_lab.stage": stage, "rlhf_lab.overrides": " ".join(overrides), **(identity or {})}
    if digest:
        tags["rlhf_lab.study_digest"] = digest
    if study:
        tags["rlhf_lab.study"] = study
    run = client.create_run(exp_id, tags=tags)
    if gold is not None:
        client.log_metric(run.info.run_id, "eval/gold_reward", gold, step=10)
    client.set_terminated(run.info.run_id, status=status)
    return run.info.run_id


@pytest.fixture
def store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    return uri, client, client.create_experiment("rlhf-lab")


@pytest.mark.slow
def test_finished_run_of_the_same_study_and_overrides_is_found(store):
    uri, client, exp = store
    job = ["algo.reference.sync_every=1", "seed=0", "sweep=ref_sync"]
    done = fake_run(client, exp, "ppo", "ref_sync", job + ["skip_finished=true"], gold=0.5)
    fake_run(client, exp, "ppo", "ref_sync", ["algo.reference.sync_every=1", "seed=1", "sweep=ref_sync"], "FAILED")
    fake_run(client, exp, "sft", "ref_sync", ["algo.reference.sync_every=1", "seed=2", "sweep=ref_sync"])
    fake_run(client, exp, "ppo", "clip_eps", ["algo.reference.sync_every=1", "seed=3", "sweep=ref_sync"])
    cfg = compose_cfg(["study=ref_sync", f"tracking.uri={uri}"])
    assert find_finished_run(run_settings(cfg), "ppo", job).info.run_id == done
    assert find_finished_run(run_settings(cfg), "ppo", job + ["skip_finished=true"]).info.run_id == done  # not part of a job
    for seed in (1, 2, 3, 4):  # FAILED; only an upstream stage's run; another study; never run
        assert find_finished_run(run_settings(cfg), "ppo", ["algo.reference.sync_every=1", f"seed={seed}", "sweep=ref_sync"]) is None
    assert find_finished_run(run_settings(cfg), "ppo", ["algo.reference.sync_every=10", "seed=0", "sweep=ref_sync"]) is None
    other = compose_cfg(["study=clip_eps", f"tracking.uri={uri}"])
    assert find_finished_run(run_settings(other), "ppo", job) is None
    assert job_overrides("a=1 skip_finished=true b=2") == ["a=1", "b=2"]
    # as a multirun renders them (the tags of its jobs) and as typed: one job
    assert job_overrides(["tracking.uri=sqlite\\:///x.db", "skip_finished=True", "+k=v"]) == job_overrides(
        "tracking.uri=sqlite:///x.db +k=v")


@pytest.mark.slow
def test_cli_skips_a_finished_job_before_any_work_and_runs_an_unfinished_one(store, tmp_path, monkeypatch, capsys):
    from rlhf_lab.entry import run as cli
    from rlhf_lab import stages

    uri, client, exp = store
    calls = []

    def fake_job(cfg, out_dir):
        calls.append(int(cfg.seed))
        return {"run_id": "new", "eval": {"eval/gold_reward": 0.25}}

    monkeypatch.setattr(stages, "run_job", fake_job)
    monkeypatch.chdir(tmp_path)

    def launch(seed):
        monkeypatch.setattr(sys, "argv", ["rlhf-lab", "study=unit", f"seed={seed}", f"tracking.uri={uri}",
                                          "skip_finished=true", f"hydra.run.dir={tmp_path / 'out'}",
                                          "hydra/job_logging=none", "hydra/hydra_logging=none"])
        cli.main()
        return capsys.readouterr().out

    job = lambda seed: ["study=unit", f"seed={seed}", f"tracking.uri={uri}"]  # noqa: E731
    done = fake_run(client, exp, "ppo", "unit", job(7), gold=0.5, identity=job_identity(to_plain(compose_cfg(job(7)))))
    fake_run(client, exp, "ppo", "unit", job(8), status="FAILED", identity=job_identity(to_plain(compose_cfg(job(8)))))
    out = launch(7)
    assert f"skipped (finished run {done})" in out and calls == []
    out = launch(8)  # its run FAILED: run again
    assert "skipped" not in out and calls == [8]


@pytest.mark.slow
def test_a_resumed_multirun_runs_only_the_jobs_without_a_finished_run(store, tmp_path, monkeypatch, capsys):
    from rlhf_lab.entry import run as cli
    from rlhf_lab import stages

    import rlhf_lab
    from rlhf_lab.runs import process as runtime

    uri, client, exp = store
    calls, clocks = [], []
    monkeypatch.setattr(stages, "run_job", lambda cfg, out: calls.append(int(cfg.seed)) or clocks.append(
        dict(runtime.JOB_CLOCK)) or {"eval": {}})
    monkeypatch.setattr(runtime, "JOBS_STARTED", [0])  # as in a fresh process
    monkeypatch.chdir(tmp_path)
    job = ["study=unit", "seed=1", f"tracking.uri={uri}"]
    done = fake_run(client, exp, "ppo", "unit", job, gold=0.5, identity=job_identity(to_plain(compose_cfg(job))))
    monkeypatch.setattr(sys, "argv", ["rlhf-lab", "-m", "study=unit", "seed=0,1,2", f"tracking.uri={uri}",
                                      "skip_finished=true", f"hydra.sweep.dir={tmp_path / 'multirun'}",
                                      "hydra/job_logging=none", "hydra/hydra_logging=none"])
    cli.main()  # the basic launcher: jobs one after the other, in this process
    out = capsys.readouterr().out
    assert calls == [0, 2] and out.count("skipped (finished run") == 1 and f"finished run {done}" in out
    # time/startup_s: the first job from the process's start, the next one (a warm process) from its own entry
    assert clocks[0]["process"] == rlhf_lab.STARTED and clocks[1]["process"] > clocks[0]["job"]
    assert runtime.JOB_CLOCK == {}  # no clock left for a stage called later in this process
    sweeps = lambda: client.search_runs([exp], "tags.`rlhf_lab.stage` = 'sweep'")  # noqa: E731
    n_parents = len(sweeps())
    calls.clear()
    monkeypatch.setattr(sys, "argv", [a if not a.startswith("seed=") else "seed=1" for a in sys.argv])  # finished
    cli.main()  # relaunched with nothing left to run: no new (empty) parent run
    assert calls == [] and "nothing ran (no new parent run)" in capsys.readouterr().out
    assert len(sweeps()) == n_parents


def test_prepare_runs_the_job_once_reuses_it_and_redoes_an_interrupted_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    calls = []

    def fake_call(cmd, finish=True):
        calls.append(cmd)
        out = Path(next(a for a in cmd if a.startswith("hydra.run.dir=")).split("=", 1)[1])
        (out / "artifact").mkdir(parents=True)
        (out / "artifact" / "config.json").write_text("{}")
        if finish:
            (out / "summary.json").write_text('{"stage": "ppo"}')
        return 0

    monkeypatch.setattr(suite_prepare.subprocess, "call", fake_call)
    assert suite_prepare.prepare("ref_sync", []) == [] and not calls  # a study without a prepared artifact
    folder = tmp_path / "suite_artifacts" / "rm_source_on_policy"
    got = suite_prepare.prepare("rm_source_5rms", ["cache_dir=/c"])
    assert got == [f"data.on_policy_path={folder / 'artifact'}"] and len(calls) == 1
    assert "reward_model=different_source" in calls[0] and "seed=100" in calls[0] and "cache_dir=/c" in calls[0]
    assert suite_prepare.prepare("rm_source_5rms", ["cache_dir=/c"]) == got and len(calls) == 1  # reused
    (folder / "summary.json").unlink()  # an interrupted job: no summary
    (folder / "stale.txt").write_text("half-written")
    assert suite_prepare.prepare("rm_source_5rms", []) == got and len(calls) == 2 and not (folder / "stale.txt").exists()
    monkeypatch.setattr(suite_prepare.subprocess, "call", lambda cmd: fake_call(cmd, finish=False))
    (folder / "summary.json").unlink()
    with pytest.raises(RuntimeError, match="prepares data.on_policy_path failed"):
        suite_prepare.prepare("rm_source_5rms", [])


def studies_on_a_fake_clock(monkeypatch) -> list[list[str]]:
    """The suite's subprocess calls recorded instead of run (the returned list), each study taking as long as its
    header says on a fake clock."""
    launched, clock = [], [0.0]

    def fake_call(cmd):
        launched.append(cmd)
        study = next((a.split("=", 1)[1] for a in cmd if a.startswith("sweep=")), None)
        clock[0] += 60 * (suite.expected(study)[1] or 0) if study else 0
        return 0

    monkeypatch.setattr(suite_prepare.subprocess, "call", fake_call)
    monkeypatch.setattr(suite.time, "time", lambda: clock[0])
    return launched


def test_max_minutes_starts_no_study_expected_to_end_past_the_budget(monkeypatch, capsys):
    """clip_eps (14 min in its header) fits 20 minutes, ref_sync after it (18 more) does not: the suite stops
    before it and says what is left; the claims report is still written (it covers what ran)."""
    launched = studies_on_a_fake_clock(monkeypatch)
    assert suite.expected("clip_eps")[1] <= 20 < suite.expected("clip_eps")[1] + suite.expected("ref_sync")[1]
    rc = suite.run(["clip_eps", "ref_sync", "rm_lora"], [], 2, report=True, out="reports", max_minutes=20)
    out = capsys.readouterr().out
    assert rc == 0 and [c for c in launched if "sweep=clip_eps" in c] and not [c for c in launched if "sweep=ref_sync" in c]
    assert any("--claims" in c for c in launched)
    assert "stopping before ref_sync" in out and "not started (--max-minutes): ref_sync, rm_lora" in out


def test_study_digest_follows_what_a_study_fixes_not_its_comments_or_sweep(tmp_path):
    (tmp_path / "sweep").mkdir()
    (tmp_path / "opt").mkdir()
    study = tmp_path / "sweep" / "s.yaml"
    study.write_text("# a study\nstudy: s\nkl:\n  beta: 0.01\nhydra:\n  sweeper:\n    params:\n      seed: 0,1\n")
    (tmp_path / "opt" / "a.yaml").write_text("x: 1\n")
    job = ["+opt=a", "seed=0", "sweep=s"]
    d0 = study_digest(job, tmp_path)
    assert d0 and study_digest(["algo=ppo"], tmp_path) is None  # no study file: no digest
    study.write_text("# another comment\nstudy: s\nkl:\n  beta: 0.01\nhydra:\n  sweeper:\n    params:\n      seed: 0,1,2\n")
    assert study_digest(job, tmp_path) == d0  # comments and the swept values (in the overrides) do not count
    study.write_text("study: s\nkl:\n  beta: 0.001\n")
    d1 = study_digest(job, tmp_path)
    assert d1 != d0  # the design changed
    (tmp_path / "opt" / "a.yaml").write_text("x: 2\n")
    assert study_digest(job, tmp_path) not in (d0, d1)  # so did the selected option


@pytest.mark.slow
def test_a_run_of_another_study_design_is_not_finished_for_this_one(store):
    uri, client, exp = store
    job = ["algo.reference.sync_every=1", "seed=0", "sweep=ref_sync"]
    now = study_digest(job)
    old = fake_run(client, exp, "ppo", "ref_sync", job)  # before the tag existed: counts
    cfg = compose_cfg(["study=ref_sync", f"tracking.uri={uri}"])
    assert find_finished_run(run_settings(cfg), "ppo", job).info.run_id == old
    time.sleep(0.01)  # distinct start times: the newest run is looked at first
    fake_run(client, exp, "ppo", "ref_sync", job, digest="0" * 16)  # newer, another design: does not count
    assert find_finished_run(run_settings(cfg), "ppo", job).info.run_id == old
    time.sleep(0.01)
    same = fake_run(client, exp, "ppo", "ref_sync", job, digest=now)
    assert find_finished_run(run_settings(cfg), "ppo", job).info.run_id == same


def test_some_studies_update_only_their_claims_in_an_existing_report(monkeypatch, tmp_path, capsys):
    """rlhf-lab-suite --studies ref_size on a machine whose store has nothing else must not rewrite every other
    claim as "not run yet": with a claims.md in --out, its report names the claims those studies test (--only:
    every section is recomputed from the runs read, the runs file beside the report included, and a section whose
    runs are in none of them is refused, not dropped)."""
    launched = []
    monkeypatch.setattr(suite.subprocess, "call", lambda cmd: launched.append(cmd) or 0)
    monkeypatch.setattr(suite, "prepare", lambda study, overrides: [])  # no on-policy job to prepare here
    out = tmp_path / "reports"
    assert suite.run(["ref_size"], [], 2, report=True, out=str(out)) == 0
    assert "--only" not in launched[-1]  # no claims.md yet: the whole report
    out.mkdir()
    (out / "claims.md").write_text("# Claims\n")
    assert suite.run(["ref_size", "rm_lora"], [], 2, report=True, out=str(out), runs_files=["r.json.gz"]) == 0
    assert launched[-1][-4:-1] == ["--runs", "r.json.gz", "--only"]
    only = launched[-1][launched[-1].index("--only") + 1].split(",")
    # ref_size tests C8 and rm_lora C19 (C10 reads gao_rm_scaling's two labeler arms since issue 42, point 4)
    assert only == ["C8", "C19"]
    assert "every section of" in capsys.readouterr().out
    assert suite.run([s for s, _ in suite.SUITE], [], 2, report=True, out=str(out)) == 0
    assert "--only" not in launched[-1]  # the whole suite: the whole report


def test_a_suite_stopped_by_max_minutes_updates_only_what_ran(monkeypatch, tmp_path, capsys):
    launched = studies_on_a_fake_clock(monkeypatch)
    (tmp_path / "claims.md").write_text("# Claims\n")
    assert suite.run(["ref_size", "ref_sync"], [], 2, report=True, out=str(tmp_path), max_minutes=60) == 0
    assert launched[-1][-2:] == ["--only", "C8"]  # ref_sync (C3) did not start: C3 keeps its section
    launched.clear()
    assert suite.run(["ref_sync"], [], 2, report=True, out=str(tmp_path), max_minutes=1) == 0
    assert launched == [] and "no study ran" in capsys.readouterr().out


def test_more_seeds_runs_the_seeds_an_inconclusive_claim_needs_when_they_fit_the_budget(monkeypatch, capsys):
    """clip_eps' claim (C12) needs 11 seeds: 6 more are expected to take 14 · 6/5 ≈ 17 min; ref_sync's (C3) needs 20:
    15 more, 54 min. With 14 (clip_eps) + 18 (ref_sync) spent, 60 minutes leave room for clip_eps' seeds only."""
    launched = studies_on_a_fake_clock(monkeypatch)
    asked = []

    def needs(overrides, out, runs_files, cap):
        asked.append(cap)
        return {"clip_eps": 11, "ref_sync": 20, "ppo_beta_grid": 4}  # ppo_beta_grid: ≤ 5 seeds, nothing to add

    rc = suite.run(["clip_eps", "ref_sync"], [], 2, report=True, out="reports", max_minutes=60, seeds_cap=20,
                   needs=needs, reproduces=lambda *a: suite_seeds.Reproduction(None, {}))
    out = capsys.readouterr().out
    assert rc == 0 and asked == [20]
    sweeps = [next(a for a in c if a.startswith("sweep=")) + " " + " ".join(a for a in c if a.startswith("seed="))
              for c in launched if any(a.startswith("sweep=") for a in c)]
    assert sweeps == ["sweep=clip_eps ", "sweep=ref_sync ", "sweep=clip_eps seed=5,6,7,8,9,10"]
    assert sum("--claims" in c for c in launched) == 2  # the report, then again with the new seeds
    assert "ref_sync: its claims need about 20 seeds; 15 more are expected to take about 54 min" in out
    assert "the report says \"needs about 20 seeds\"" in out
    # without --more-seeds nothing is added; and a claim study key maps to the suite's newest design of it
    launched.clear()
    assert suite.run(["clip_eps"], [], 2, report=True, out="reports", needs=needs) == 0
    assert not [c for c in launched if any(a.startswith("seed=") for a in c)]
    assert suite.suite_study("ppo_beta_grid", [s for s, _ in suite.SUITE]) == "ppo_beta_grid_wide"
    assert suite.suite_study("rm_normalize", ["rm_normalize_5rms"]) == "rm_normalize_5rms"
    assert suite.seed_override(8) == "seed=5,6,7"
    with pytest.raises(SystemExit):
        suite.main(["--more-seeds", "5"])


def test_more_seeds_are_never_pooled_with_runs_that_todays_code_does_not_reproduce(monkeypatch, capsys, tmp_path):
    """Measured on 2026-12-02: seed 0 of ppo_beta_grid_wide's β = 0 arm, rerun with the code of the day, ended at test
    gold −0.050 where its stored run (made by an earlier commit, another SFT baseline at step 0) has −0.345; seeds
    5 and 6 added to it would have mixed two versions. The suite reruns the stored seed-0 run first and adds seeds
    only when it comes out the same."""
    import json
    import subprocess

    from rlhf_lab.analysis.study_runs import RunData

    monkeypatch.chdir(tmp_path)
    stored = RunData("abc", "ppo", "FINISHED", {}, {"rlhf_lab.overrides": "+ppo_kl=fixed_0 seed=0 sweep=clip_eps "
                                                    "skip_finished=True", "rlhf_lab.git_commit": "1bb3091aaaa"},
                     {"test/gold_reward": -0.345, "eval/gold_reward": -0.352, "eval/kl": 102.0}, seed="0")
    monkeypatch.setattr(suite_seeds, "stored_seed0_run", lambda *a: stored)
    calls, gives, kernels = [], {}, []
    monkeypatch.setattr(suite_seeds, "cpu_capability", lambda: "avx512")

    def call(cmd, env=None):  # the rerun: writes its summary.json where hydra.run.dir says
        calls.append(cmd)
        kernels.append(env["ATEN_CPU_CAPABILITY"])
        folder = Path(next(a for a in cmd if a.startswith("hydra.run.dir=")).split("=", 1)[1])
        folder.mkdir(parents=True)
        (folder / "summary.json").write_text(json.dumps({"test": {"test/gold_reward": gives["test"]},
                                                         "eval": {"eval/gold_reward": -0.352, "eval/kl": 102.0}}))
        return 0

    monkeypatch.setattr(subprocess, "call", call)
    gives["test"] = -0.345
    assert suite_seeds.reproduce("clip_eps", ["cache_dir=/c"], "reports", []) == (None, {"ATEN_CPU_CAPABILITY": "avx2"})
    assert kernels == ["avx2"]  # a run that recorded no kernels: avx2 first (the lab's machines until 2026-12-04)
    assert calls[0][3:] == ["+ppo_kl=fixed_0", "seed=0", "sweep=clip_eps", "cache_dir=/c", "study=clip_eps_reproduce",
                            f"hydra.run.dir={tmp_path / 'suite_reproduce' / 'clip_eps'}"]
    gives["test"] = -0.050
    assert suite_seeds.reproduce("clip_eps", [], "reports", []) == (
        "its seed-0 run abc (commit 1bb3091) has test/gold_reward -0.345, today's code gives -0.05 (avx512 CPU "
        "kernels)", {})
    assert kernels[1:] == ["avx2", "avx512"]  # then this machine's
    monkeypatch.setattr(suite_seeds, "stored_seed0_run", lambda *a: None)
    assert suite_seeds.reproduce("clip_eps", [], "reports", []) == (None, {})  # nothing stored: nothing to mix

    launched = studies_on_a_fake_clock(monkeypatch)
    rc = suite.run(["clip_eps"], [], 2, report=True, out="reports", seeds_cap=20,
                   needs=lambda *a: {"clip_eps": 11},
                   reproduces=lambda study, *a: suite_seeds.Reproduction("its seed-0 run abc differs", {}))
    out = capsys.readouterr().out
    assert rc == 0 and not [c for c in launched if any(a.startswith("seed=") for a in c)]
    assert "clip_eps: its claims need about 11 seeds, but today's code does not reproduce it: its seed-0 run abc " \
           "differs. More seeds would be pooled with runs other code made: not run" in out


def test_more_seeds_launched_with_other_display_keys_join_their_arms(store):
    """Measured on 2026-12-02: rm_normalize_5rms' seeds 5–8, launched with trainer.progress_bar=false, became arms of
    their own beside seeds 0–4 (the key varied across the study's runs), and C20 read 4–5 RMs per arm instead of
    9. A key that does not change what a job computes (config.keys.NOT_COMPUTED) names no arm; one that does, does."""
    from rlhf_lab.analysis.study_runs import load_study
    from rlhf_lab.analysis.snapshot import run_from_dict, run_to_dict
    from rlhf_lab.config.keys import computes

    uri, client, exp = store
    for seed in range(4):
        extra = ["trainer.progress_bar=False", "cache_dir=/elsewhere"] if seed >= 2 else []
        for norm in ("true", "false"):
            fake_run(client, exp, "ppo", "norm", [f"reward_model.normalize={norm}", f"seed={seed}",
                                                  "sweep=rm_normalize_5rms", "skip_finished=True", *extra], gold=0.5)
    runs, _ = load_study("norm", uri)
    assert sorted({tuple(r.setting.items()) for r in runs}) == [(("reward_model.normalize", "false"),),
                                                                (("reward_model.normalize", "true"),)]
    assert not computes("trainer.progress_bar") and not computes("tracking.uri") and computes("trainer.max_steps")
    old = run_to_dict(runs[0])
    old["setting"] = {**old["setting"], "trainer.progress_bar": "False"}  # as a file written before the fix keeps it
    assert run_from_dict(old).setting == runs[0].setting


def test_a_study_with_an_artifact_per_seed_gets_one_for_each_seed_it_runs(tmp_path, monkeypatch):
    """C17's redesign (rm_mis_scoring_probe): a probe policy per seed s, made by a job with seed and RM seed 100 + s
    into suite_artifacts/rm_mis_probe/seed_<s>, the folder the study file reads; seeds 0-4 by default, the seeds of
    a seed override otherwise; a finished one is reused."""
    monkeypatch.chdir(tmp_path)
    calls = []

    def fake_call(cmd):
        calls.append(cmd)
        out = Path(next(a for a in cmd if a.startswith("hydra.run.dir=")).split("=", 1)[1])
        (out / "artifact").mkdir(parents=True)
        (out / "artifact" / "config.json").write_text("{}")
        (out / "summary.json").write_text('{"stage": "ppo"}')
        return 0

    monkeypatch.setattr(suite_prepare.subprocess, "call", fake_call)
    assert suite_prepare.prepare("rm_mis_scoring_probe", ["cache_dir=/c"]) == [] and len(calls) == 5
    for s, cmd in enumerate(calls):
        assert f"seed={100 + s}" in cmd and f"reward_model.seed={100 + s}" in cmd and "reward_model=same_source" in cmd
        assert f"hydra.run.dir={tmp_path / 'suite_artifacts' / 'rm_mis_probe' / f'seed_{s}'}" in cmd
    assert suite_prepare.prepare("rm_mis_scoring_probe", [], ["seed=3,5,6"]) == [] and len(calls) == 7  # 3 reused
    assert [c[-1] for c in calls[5:]] == [f"hydra.run.dir={tmp_path / 'suite_artifacts' / 'rm_mis_probe' / f'seed_{s}'}"
                                          for s in (5, 6)]
    # the study file reads those folders: its jobs' probe and on-policy pairs come from the seed's own probe policy
    from hydra import compose, initialize_config_module

    with initialize_config_module("rlhf_lab.conf", version_base="1.3"):
        c = compose("config", overrides=["sweep=rm_mis_scoring_probe", "+rm_src=different_mix", "seed=3"])
    assert c.eval.probe_path == c.data.on_policy_path == "suite_artifacts/rm_mis_probe/seed_3/artifact"
    assert c.reward_model.init == "sft" and c.reward_model.seed == 3 and c.labeler.name == "unbiased"
