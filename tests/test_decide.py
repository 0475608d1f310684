"""``rlhf-lab-suite --decide``: the seeds power asks for, cheapest decision first, never for a flawed design."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

from rlhf_lab_research import suite, suite_seeds
from rlhf_lab_research import seed_plan
from rlhf_lab_research.claims_registry import JUDGED, SHOWN
from rlhf_lab.analysis.study_runs import RunData
from rlhf_lab_research.stats import HOLDS, INCONCLUSIVE


def part(needs, verdict=INCONCLUSIVE, unit="seeds", role=JUDGED, says="x"):
    return SimpleNamespace(part=SimpleNamespace(role=role, says=says), verdict=verdict, needs=needs,
                           measured=SimpleNamespace(n_of=unit))


def result(cid, studies, *parts, verdict=INCONCLUSIVE):
    return SimpleNamespace(claim=SimpleNamespace(id=cid, studies=list(studies)), verdict=verdict, parts=list(parts))


def runs(*seeds):
    return [RunData(f"r{s}", "ppo", "FINISHED", {}, {}, {}, seed=str(s)) for s in seeds]


RESULTS = [
    result("C1", ["cheap"], part(12), part(40, says="too many")),  # 12 ≤ cap; 40 left
    result("C2", ["dear"], part(9)),
    result("C3", ["cheap"], part(18)),                               # the larger target of a study wins
    result("C4", ["done"], part(8), verdict=HOLDS),                  # decided: nothing to add
    result("C5", ["cells"], part(10, unit="policy × seed cells")),  # not counted in seeds
    result("C6", ["shown"], part(10, role=SHOWN)),                   # only judged effects set targets
    result("C7", ["flawed"], part(7)),
]


def test_plan_targets_the_largest_need_under_the_cap_cheapest_first():
    counting = {"cheap": runs(0, 1, 2, 3, 4), "dear": runs(0, 1, 2, 3, 4, 5, 6), "flawed": runs(0, 1, 2, 3, 4)}
    cost = {"cheap": (2, 1.0), "dear": (10, 20.0)}  # (jobs, minutes) per seed
    items, beyond = seed_plan.plan(RESULTS, counting, 30, lambda k: None if k == "flawed" else k, cost.get)
    assert [(i.study, i.seeds_now, i.target, i.new_seeds, i.jobs, i.minutes) for i in items] == [
        ("cheap", 5, 18, tuple(range(5, 18)), 26, 13.0),   # 13 seeds × 1 min, before the dearer study
        ("dear", 7, 9, (7, 8), 20, 40.0),                   # starts after its highest seed
    ]
    assert items[0].claims == ("C1", "C3") and items[0].seed_override == "seed=" + ",".join(map(str, range(5, 18)))
    assert [(b.claim, b.needs, b.unit) for b in beyond] == [("C1", 40, "seeds"), ("C5", 10, "policy × seed cells")]
    text = seed_plan.plan_table(items, beyond, 30)
    assert "cheap" in text.splitlines()[1] and "5 -> 18" in text
    assert 'left: C1 "too many": needs about 40 seeds, above the cap 30' in text
    assert "counted in policy × seed cells, not seeds" in text


def test_a_study_that_has_its_seeds_is_not_planned():
    counting = {"cheap": runs(*range(18)), "dear": runs(*range(9))}
    items, _ = seed_plan.plan(RESULTS, counting, 30, lambda k: k, lambda s: (1, 1.0))
    assert items == []


def test_the_flawed_designs_are_never_extended(monkeypatch):
    """--decide's plan skips NOT_EXTENDED studies (C13's gao_rm_scaling) whatever they need."""
    seen = []
    monkeypatch.setattr(suite_seeds, "report_runs", lambda *a: ({}, {}))
    monkeypatch.setattr("rlhf_lab_research.claims.counted", lambda r: ({}, {}))
    monkeypatch.setattr("rlhf_lab_research.verdicts.judge_all", lambda *a: [
        result("C13", ["gao_rm_scaling"], part(13)), result("C3", ["ref_sync"], part(13))])
    monkeypatch.setattr(seed_plan, "plan", lambda results, counting, cap, study_of, per_seed: seen.append(
        [study_of(r.claim.studies[0]) for r in results]) or ([], []))
    suite_seeds.decision_plan([], "reports", [], 30, lambda k: k, lambda s: (1, 1.0))
    assert seen == [[None, "ref_sync"]]


def test_per_seed_counts_the_jobs_of_one_seed_and_the_headers_minutes():
    jobs, minutes = suite.per_seed("ppo_beta_grid_wide")  # 8 settings; its header: 56 jobs (7 seeds)
    stated_jobs, stated_min = suite.expected("ppo_beta_grid_wide")
    assert jobs == 8 and abs(minutes - stated_min / stated_jobs * 8) < 1e-9


def test_an_rm_study_is_reproduced_on_its_rm_metrics(monkeypatch, tmp_path):
    """rm_lora has no policy run: its seed-0 RM run is rerun and rm/accuracy, rm/accuracy_gold, rm/spearman_gold
    must come out the same (before, a study of RMs alone passed unchecked: nothing was compared)."""
    monkeypatch.chdir(tmp_path)
    rm = RunData("rm0", "rm", "FINISHED", {}, {"rlhf_lab.study": "rm_lora", "rlhf_lab.overrides":
                                               "reward_model.lora.r=8 seed=0 sweep=rm_lora"},
                 {"rm/accuracy": 0.8, "rm/accuracy_gold": 0.7, "rm/spearman_gold": 0.6}, seed="0")
    monkeypatch.setattr(suite_seeds, "report_runs", lambda *a: ({"rm_lora": [rm]}, {}))
    assert suite_seeds.stored_seed0_run("rm_lora", [], "reports", []) is rm
    gives = {"rm/accuracy": 0.8, "rm/accuracy_gold": 0.7, "rm/spearman_gold": 0.6}

    def call(cmd, env=None):
        folder = Path(next(a for a in cmd if a.startswith("hydra.run.dir=")).split("=", 1)[1])
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "summary.json").write_text(json.dumps({"stage": "rm", "eval": gives}))
        return 0

    monkeypatch.setattr(subprocess, "call", call)
    assert suite_seeds.reproduce("rm_lora", [], "reports", []).problem is None
    gives["rm/spearman_gold"] = 0.61
    assert "rm/spearman_gold 0.6, today's code gives 0.61" in suite_seeds.reproduce("rm_lora", [], "reports", []).problem


def test_decide_runs_each_planned_study_after_its_reproduction(monkeypatch, capsys):
    plan = [seed_plan.PlanItem("clip_eps", ("C12",), 5, 7, (5, 6), 4, 6.0),
            seed_plan.PlanItem("ref_sync", ("C3",), 5, 6, (5,), 3, 4.0)]
    monkeypatch.setattr(suite, "decision_plan", lambda *a: (plan, []))
    monkeypatch.setattr(suite, "reproduce", lambda study, *a: suite_seeds.Reproduction(
        "differs" if study == "ref_sync" else None, {} if study == "ref_sync" else {"ATEN_CPU_CAPABILITY": "avx2"}))
    monkeypatch.setattr(suite, "prepare", lambda study, overrides, seed_args=(): [])
    launched, kernels = [], []
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)

    def call(cmd):
        launched.append(cmd)
        kernels.append(os.environ.get("ATEN_CPU_CAPABILITY"))
        return 0

    monkeypatch.setattr(suite.subprocess, "call", call)
    assert suite.main(["--decide", "--dry-run"]) == 0 and launched == []
    assert suite.main(["--decide", "20", "cache_dir=/c"]) == 1  # ref_sync not reproduced: named, status 1
    studies = [c for c in launched if "rlhf_lab.entry.run" in c]
    assert len(studies) == 1 and "sweep=clip_eps" in studies[0] and "seed=5,6" in studies[0]
    # its seeds run with the kernels its seed-0 run reproduced with; the report after, and the suite, as before
    assert kernels[launched.index(studies[0])] == "avx2" and kernels[-1] is None
    assert "ATEN_CPU_CAPABILITY" not in os.environ
    assert "cache_dir=/c" in studies[0] and "skip_finished=true" in studies[0]
    assert any("rlhf_lab.entry.report" in c for c in launched)  # then the report
    out = capsys.readouterr().out
    assert "ref_sync: not extended: today's code does not reproduce it: differs" in out


def test_the_provenance_table_marks_added_seeds_and_the_seed0_rerun():
    """clip_eps' file sweeps seeds 0–4: seeds 5–13 show as added, and the rerun of its seed-0 run (study tag
    clip_eps_reproduce) as equal or, naming the figure, as differing."""
    from rlhf_lab_research import provenance

    def run(seed, gold, study="clip_eps", start=0):
        return RunData(f"r{seed}{study}", "ppo", "FINISHED", {}, {
            "rlhf_lab.study": study, "rlhf_lab.git_commit": "abcdef123", "rlhf_lab.overrides": f"seed={seed}"},
            {"test/gold_reward": gold, "eval/gold_reward": 0.5, "eval/kl": 3.0}, seed=str(seed), start_time=start)

    runs = [run(s, 0.1 * s) for s in range(14)]
    rows = provenance.provenance_rows(runs, {"clip_eps": [run(0, 0.0, "clip_eps_reproduce", start=10)]})
    assert rows[0][2] == "0–4 (+ 5–13 added)" and rows[0][5].startswith("equal (rerun at abcdef1")
    rows = provenance.provenance_rows(runs, {"clip_eps": [run(0, 0.0, "clip_eps_reproduce", start=10),
                                                          run(0, 0.3, "clip_eps_reproduce", start=20)]})
    assert rows[0][5].startswith("**differs**") and "test/gold_reward 0.0 stored, 0.3 rerun" in rows[0][5]
    rerun = run(0, 0.0, "clip_eps_reproduce", start=30)
    rerun.tags["rlhf_lab.cpu_capability"] = "avx2"
    assert provenance.provenance_rows(runs, {"clip_eps": [rerun]})[0][5].endswith(", avx2 kernels)")
    assert provenance.spans([0, 1, 2, 4, 6, 7]) == "0–2, 4, 6–7"
    assert provenance.file_seeds("ppo_beta_grid_wide") == (0, 1, 2, 3, 4)


def test_the_seed_0_run_to_reproduce_is_the_newest_of_its_job_and_its_rerun_drops_what_computes_nothing(
        monkeypatch, tmp_path):
    """A study rerun in full beside its first runs (the runs file keeps both): the suite reproduces the rerun, as the
    report counts it, not the first run whose overrides happen to sort first (ref_sync, 2026-12-04: the first run's
    test gold 0.89 against today's 0.64, while the rerun it should have read gives 0.64); and the job it reruns
    keeps the stored run's computing overrides only (its store, its progress bar are the suite's)."""
    monkeypatch.chdir(tmp_path)
    tags = {"rlhf_lab.study": "ref_sync"}
    old = RunData("old", "ppo", "FINISHED", {}, {**tags, "rlhf_lab.overrides":
                  "algo.reference.sync_every=0 seed=0 sweep=ref_sync skip_finished=True"},
                  {"test/gold_reward": 0.89}, seed="0", start_time=1)
    new = RunData("new", "ppo", "FINISHED", {}, {**tags, "rlhf_lab.overrides":
                  "algo.reference.sync_every=0 seed=0 sweep=ref_sync skip_finished=True "
                  "tracking.uri=sqlite\\:////x/store.db trainer.progress_bar=False"},
                  {"test/gold_reward": 0.64}, seed="0", start_time=2)
    monkeypatch.setattr(suite_seeds, "report_runs", lambda *a: ({"ref_sync": [old, new]}, {}))
    assert suite_seeds.stored_seed0_run("ref_sync", [], "reports", []) is new
    seen = []

    def call(cmd, env=None):
        seen.append(cmd)
        folder = Path(next(a for a in cmd if a.startswith("hydra.run.dir=")).split("=", 1)[1])
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "summary.json").write_text(json.dumps({"stage": "ppo", "test": {"test/gold_reward": 0.64}}))
        return 0

    monkeypatch.setattr(subprocess, "call", call)
    monkeypatch.setattr(suite_seeds, "reproduced_keys", lambda run: ("test/gold_reward",))
    assert suite_seeds.reproduce("ref_sync", ["tracking.uri=sqlite:///mine.db"], "reports", []).problem is None
    job = seen[0][3:]
    assert job[:3] == ["algo.reference.sync_every=0", "seed=0", "sweep=ref_sync"]
    assert "tracking.uri=sqlite:///mine.db" in job and not any("/x/store.db" in a or "progress_bar" in a for a in job)


def test_a_stored_run_is_rerun_with_the_cpu_kernels_it_recorded(monkeypatch, tmp_path):
    """Measured on 2026-12-05: ref_size's and ppo_beta_grid_wide's seed-0 runs, made on an AVX2 machine, rerun by their
    own commits on this AVX-512 one, gave test gold 0.738 and 0.825 against the stored 0.864 and 0.808 (their SFT
    policies already differed in the last digits); with ATEN_CPU_CAPABILITY=avx2 the same commit gave the stored run
    to the last digit (0.8079359445546288). A run records its kernels (tag rlhf_lab.cpu_capability) and is rerun with
    them; kernels this CPU lacks are named, with nothing rerun."""
    monkeypatch.chdir(tmp_path)
    run = RunData("r0", "rm", "FINISHED", {}, {"rlhf_lab.study": "rm_lora", "rlhf_lab.cpu_capability": "avx2",
                                               "rlhf_lab.overrides": "seed=0 sweep=rm_lora"},
                  {"rm/accuracy": 0.8}, seed="0")
    monkeypatch.setattr(suite_seeds, "report_runs", lambda *a: ({"rm_lora": [run]}, {}))
    monkeypatch.setattr(suite_seeds, "reproduced_keys", lambda r: ("rm/accuracy",))
    monkeypatch.setattr(suite_seeds, "cpu_capability", lambda: "avx512")
    kernels = []

    def call(cmd, env=None):
        kernels.append(env["ATEN_CPU_CAPABILITY"])
        folder = Path(next(a for a in cmd if a.startswith("hydra.run.dir=")).split("=", 1)[1])
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "summary.json").write_text(json.dumps({"stage": "rm", "eval": {"rm/accuracy": 0.79}}))
        return 0

    monkeypatch.setattr(subprocess, "call", call)
    got = suite_seeds.reproduce("rm_lora", [], "reports", [])
    assert kernels == ["avx2"] and got.env == {} and got.problem.endswith("gives 0.79 (avx2 CPU kernels)")
    run.tags["rlhf_lab.cpu_capability"] = "avx512"
    monkeypatch.setattr(suite_seeds, "cpu_capability", lambda: "avx2")
    got = suite_seeds.reproduce("rm_lora", [], "reports", [])
    assert kernels == ["avx2"] and "made with avx512 CPU kernels; this CPU offers avx2 at most" in got.problem


def test_the_cpu_kernels_are_chosen_by_torchs_variable_and_key_the_cache():
    """ATEN_CPU_CAPABILITY (read when torch starts) sets what cpu_capability says, and a stage's code digest (its
    artifacts' keys) changes with it: an artifact computed with other kernels is never reused."""
    import sys

    from rlhf_lab.runs.code import cpu_capability, stage_code_digest

    probe = "from rlhf_lab.runs.code import cpu_capability as c, stage_code_digest as d; print(c(), d('sft'))"
    out = subprocess.run([sys.executable, "-c", probe], env={**os.environ, "ATEN_CPU_CAPABILITY": "default"},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "default"
    assert (out[1] == stage_code_digest("sft")) == (cpu_capability() == "default")


def test_an_upstream_model_built_again_elsewhere_counts_once_a_different_one_twice():
    """Measured on 2026-12-05: three claims said "RM: 3 per arm (replicated); SFT policy: 3 per arm" of studies whose
    seeds were run in three stores on one RM and one SFT policy built again in each (other run ids, the same weights).
    An RM is now told by its held-out figures and an SFT policy by the gold at step 0, to the last digit."""
    from rlhf_lab_research import verdicts

    def ppo(i, rm_acc, start_gold):
        figures = {"rm/raw_mean": 0.1, "rm/raw_std": 1.2, "rm/accuracy": rm_acc}
        return RunData(f"p{i}", "ppo", "FINISHED", {}, {"rlhf_lab.upstream.rm": f"rm{i}",
                                                        "rlhf_lab.upstream.sft": f"s{i}"},
                       {}, history={"eval/gold_reward": [(0, start_gold), (10, 0.5)]},
                       rm={"run_id": f"rm{i}", "metrics": figures}, seed=str(i))

    same = [ppo(i, 0.8, -0.12) for i in range(3)]
    assert verdicts.per_arm(same, verdicts.rm_of) == {("ppo", ()): 1}
    assert verdicts.per_arm(same, verdicts.sft_of) == {("ppo", ()): 1}
    other = [ppo(0, 0.8, -0.12), ppo(1, 0.81, -0.11)]
    assert verdicts.per_arm(other, verdicts.rm_of) == {("ppo", ()): 2}
    assert verdicts.per_arm(other, verdicts.sft_of) == {("ppo", ()): 2}
    bare = RunData("b", "ppo", "FINISHED", {}, {"rlhf_lab.upstream.rm": "rmX", "rlhf_lab.upstream.sft": "sX"}, {})
    assert (verdicts.rm_of(bare), verdicts.sft_of(bare)) == ("rmX", "sX")  # no figures kept: the run ids
