"""``rlhf-lab-suite``: every claims study, resumably, then ``reports/claims.md``.

    rlhf-lab-suite --dry-run             # the studies, their job counts, the expected wall time
    rlhf-lab-suite                       # run them all, 2 jobs at a time, then rlhf-lab-report --claims
    rlhf-lab-suite --studies ref_sync,clip_eps cache_dir=/shared/cache   # some studies; overrides
    rlhf-lab-suite --max-minutes 150     # start no study that would end past 150 min; launch again later
    rlhf-lab-suite --runs reports/claims_runs.json.gz   # the report also counts the runs kept in that file
    rlhf-lab-suite --max-minutes 600 --more-seeds 20    # then more seeds where 80 % power needs ≤ 20

After some studies (``--studies``), when ``--out`` already holds a claims.md, the report recomputes only the claims
those studies test (``rlhf-lab-report --claims --only``, which also reads the runs file beside it), so the other
claims keep their sections.

Each study is launched as ``rlhf-lab -m sweep=<study> hydra/launcher=parallel skip_finished=true [overrides]``.
With ``skip_finished=true`` a job whose FINISHED run (same study, same overrides) is already in the tracking
store is skipped before any work (``rlhf_lab.entry.run``), so a suite that was interrupted is completed by launching
the same command again: only the missing, failed and interrupted jobs run. A study with a failed job does not
stop the suite; the suite names it at the end and exits with status 1. The tracking store is the usual one
(``MLFLOW_TRACKING_URI``, else ``tracking.uri``); pass the same overrides on every launch, since they are part
of each job's identity.

A study that needs an artifact made first (an on-policy or probe policy) gets it from ``rlhf-lab`` jobs run into
fixed folders under the working folder before the study (:mod:`rlhf_lab_research.suite_prepare`).

With ``--more-seeds CAP``, after the report the suite gives more seeds to each study whose claims are still
inconclusive: an inconclusive judged effect states the seeds 80 % power would need (``needs about N seeds`` in the
report, :func:`rlhf_lab_research.verdicts.seeds_to_decide`); where N ≤ CAP, the study runs again with
``seed=5,…,N−1`` (resumable like the rest), provided its projected time (the header's minutes × (N − 5)/5) fits
what is left of ``--max-minutes``; then the report is written again. An effect that needs more than CAP seeds, or
whose seeds do not fit the budget, keeps its "needs about N seeds" in the report. Before a study gets more seeds,
the suite checks that today's code reproduces it (:func:`~rlhf_lab_research.suite_seeds.reproduce`): one job reruns the
study's first seed-0 run (its own overrides, under the study name ``<study>_reproduce``, with the CPU kernels it was
made with) and its final test and eval gold and KL must equal the stored run's; otherwise the new seeds would be pooled
with runs that other code produced (seen: a study whose runs came from an earlier version with another SFT baseline),
so they are not run and the suite says why. The new seeds run with the kernels it reproduced with (seen: runs made on
an AVX2 machine, rerun on an AVX-512 one, differ from the first digits on: ``ATEN_CPU_CAPABILITY=avx2`` gives them
again to the last digit).

The expected wall times are the ``about N min`` of each study file's header (``sweeps/sweep/<study>.yaml``),
for 2 jobs at a time on 2 cores with the upstream stages (base models, SFT, preference pairs, RMs) cached.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from rlhf_lab_research.claims import claims_of_studies
from rlhf_lab_research.designs import SUITE_VERSIONS
from rlhf_lab_research.verdicts import DECIDE_CAP
from rlhf_lab.runs.jobs import study_file, study_names
from rlhf_lab.runs.process import environment
from rlhf_lab_research.suite_prepare import PREPARE, PREPARE_PER_SEED, SEEDS, prepare
from rlhf_lab_research.suite_seeds import NOT_EXTENDED, Reproduction, decision_plan, report_runs, reproduce, uri_override

# The claims studies, in the order they run: the default chain's upstream stages are built by the first, then
# the cheapest studies first, so that an interrupted suite has given as many verdicts as it could.
SUITE: list[tuple[str, str]] = [
    ("ppo_beta_grid_wide", "C1 C2 C4 C9"),
    ("kl_controller", "C5"),
    ("kl_estimators", "C7"),
    ("rm_lora", "C19"),
    ("clip_eps", "C12"),
    ("ref_shared", "C6"),
    ("critic_baseline", "C15"),
    ("grpo_kl", "C14"),
    ("dpo_beta_grid_5seeds", "C9"),
    ("rm_normalize_5rms", "C20"),
    ("ref_size", "C8"),
    ("length_penalty", "C11"),
    ("ref_sync", "C3"),
    ("rm_source_matched", "C16"),
    ("rm_mis_scoring_probe", "C17"),
    ("rm_size_vs_policy_size_5rms", "C18"),
    ("gao_rm_scaling", "C10 C13"),
    ("gao_rm_scaling_kl", "C13"),
    ("gao_rm_scaling_bon", "C13"),
    ("rm_ensemble_5rms", "C18"),
]
# The studies of the claims about the RM (C10, C13, C16–C20) train one RM per seed (``reward_model.seed: ${seed}``
# in the study file; the RM's cache key holds its seed), so each arm has 5 distinct RMs; the price is one RM
# training per seed and RM config, about a minute each on 2 cores, in the study's stated time.
UPSTREAM_MIN = 30  # minutes of upstream stages on an empty cache (base models, SFT, pairs, RMs incl. MiniLM), 2 cores


def study_header(study: str) -> str:
    """The leading comment block of a study file."""
    text = study_file("sweep", study).read_text()
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("# ").rstrip())
    return " ".join(lines)


def expected(study: str) -> tuple[int | None, float | None]:
    """(jobs, minutes of wall time) stated in the study file's header: ``Expected: N jobs ... about M min``."""
    head = study_header(study)
    jobs = re.search(r"Expected:\s*(\d+)\s+jobs", head)
    mins = re.search(r"about\s+(\d+(?:\.\d+)?)\s+min", head)
    return (int(jobs.group(1)) if jobs else None), (float(mins.group(1)) if mins else None)


def claims_of(study: str) -> str:
    return dict(SUITE).get(study, "")


def study_command(study: str, overrides: list[str], n_jobs: int) -> list[str]:
    """The command that runs one study resumably (``python -m rlhf_lab.entry.run`` is ``rlhf-lab``)."""
    return [sys.executable, "-m", "rlhf_lab.entry.run", "-m", f"sweep={study}", "hydra/launcher=parallel",
            f"hydra.launcher.n_jobs={n_jobs}", "skip_finished=true", *overrides]


def report_command(overrides: list[str], out: str, runs_files: list[str] | None = None,
                   only: list[str] | None = None) -> list[str]:
    """``rlhf-lab-report --claims`` on the suite's store, and on the runs files (``--runs``) of earlier launches;
    with `only`, just those claims, into the existing claims.md."""
    cmd = [sys.executable, "-m", "rlhf_lab.entry.report", "--claims", "--out", out]
    uri = uri_override(overrides)
    return (cmd + (["--uri", uri] if uri else []) + [a for f in runs_files or [] for a in ("--runs", f)]
            + (["--only", ",".join(only)] if only else []))


def report_claims(studies: list[str], out: str) -> list[str] | None:
    """The claims the final report recomputes: after some of the suite's studies (``--studies``), with a claims.md
    already in `out`, only the claims those studies test (the others keep their sections); else all (None)."""
    if set(studies) >= {s for s, _ in SUITE} or not (Path(out) / "claims.md").is_file():
        return None
    return claims_of_studies(studies)


def suite_study(key: str, studies: list[str]) -> str | None:
    """The study among `studies` that runs the design a claim's study key reads (its newest rerun, else itself)."""
    return next((s for s in (*SUITE_VERSIONS.get(key, ()), key) if s in studies), None)


def seed_override(n: int) -> str:
    """The override that runs seeds SEEDS … n − 1 (the ones a study file's 5 seeds do not have)."""
    return "seed=" + ",".join(str(k) for k in range(SEEDS, n))


def measured_needs(overrides: list[str], out: str, runs_files: list[str], cap: int) -> dict[str, int]:
    """{claim study key: seeds its inconclusive claims need, ≤ cap}, from the runs the report read (the store, the
    --runs files and the runs file beside the report)."""
    from rlhf_lab_research.claims import counted
    from rlhf_lab_research.claims_registry import CLAIMS
    from rlhf_lab_research.verdicts import judge_all, seeds_to_decide

    runs, commands = report_runs(overrides, out, runs_files)
    counting, present = counted(runs)
    return seeds_to_decide(judge_all(CLAIMS, counting, present, commands), cap)


def fmt_minutes(seconds: float) -> str:
    m = int(round(seconds / 60))
    return f"{m // 60}h {m % 60:02d}min" if m >= 60 else f"{seconds / 60:.1f} min"


def dry_run(studies: list[str], overrides: list[str], validate: bool) -> int:
    """List the studies with their job counts (``rlhf_lab.entry.sweeps.plan``) and expected wall times."""
    from rlhf_lab.entry.sweeps import plan

    total_jobs, total_min = 0, 0.0
    print(f"{'#':>2}  {'study':<32} {'claims':<8} {'jobs':>5} {'~min':>5}")
    for i, study in enumerate(studies, 1):
        jobs = plan([f"sweep={study}", *overrides], validate=validate)
        _, mins = expected(study)
        total_jobs += len(jobs)
        total_min += mins or 0.0
        print(f"{i:>2}  {study:<32} {claims_of(study):<8} {len(jobs):>5} {format(mins, 'g') if mins is not None else '?':>5}"
              + (f"  (first one job for {PREPARE[study][2]}, into {PREPARE[study][0]})" if study in PREPARE else "")
              + (f"  (first one job per seed, into {PREPARE_PER_SEED[study][0]}/seed_<s>)"
                 if study in PREPARE_PER_SEED else ""))
    print(f"{len(studies)} studies, {total_jobs} jobs; expected wall time about {total_min:.0f} min with 2 jobs at "
          f"a time on 2 cores and the upstream stages cached (about {UPSTREAM_MIN} min more on an empty cache)")
    print("each study runs as: rlhf-lab " + " ".join(study_command("<study>", overrides, 2)[3:]))
    print("then: rlhf-lab-report --claims")
    return 0


def more_seeds(studies: list[str], needed: dict[str, int], overrides: list[str], n_jobs: int, t0: float,
               max_minutes: float | None, failed: list[str],
               check: Callable[[str], Reproduction] = lambda study: Reproduction(None, {})) -> list[str]:
    """Run each study of `studies` whose claims need N > 5 seeds (`needed`: {claim study key: N}) with seeds 5 … N−1
    when its projected time fits what is left of `max_minutes` and `check(study)` (:func:`reproduce`) finds
    nothing wrong (the seeds then run in the environment it reproduced in); the studies extended."""
    plan: dict[str, int] = {}
    for key, n in needed.items():
        study = suite_study(key, studies)
        if study and study not in failed and n > SEEDS:
            plan[study] = max(plan.get(study, 0), n)
    done = []
    for study, n in plan.items():
        _, mins = expected(study)
        projected = (mins or 0.0) * (n - SEEDS) / SEEDS
        spent = (time.time() - t0) / 60
        if max_minutes is not None and spent + projected > max_minutes:
            print(f"\n[rlhf-lab-suite] {study}: its claims need about {n} seeds; {n - SEEDS} more are expected to take "
                  f"about {projected:.0f} min, past --max-minutes {format(max_minutes, 'g')} ({spent:.0f} spent): not "
                  f"run, the report says \"needs about {n} seeds\"", flush=True)
            continue
        problem, env = check(study)
        if problem:
            print(f"\n[rlhf-lab-suite] {study}: its claims need about {n} seeds, but today's code does not reproduce "
                  f"it: {problem}. More seeds would be pooled with runs other code made: not run; rerun the study "
                  "in full (under a new name, or after removing its old runs) to extend it", flush=True)
            continue
        print(f"\n[rlhf-lab-suite] {study}: its claims need about {n} seeds for 80 % power; running seeds "
              f"{SEEDS}–{n - 1} (expected about {projected:.0f} min)", flush=True)
        try:
            with environment(env):  # the kernels it reproduced with: its prepared artifacts and jobs compute alike
                rc = subprocess.call(study_command(study, overrides + prepare(study, overrides, [seed_override(n)])
                                                   + [seed_override(n)], n_jobs))
        except RuntimeError as err:
            print(f"[rlhf-lab-suite] {err}", flush=True)
            rc = 1
        if rc != 0:
            failed.append(f"{study} (seeds {SEEDS}–{n - 1})")
        done.append(study)
    return done


def per_seed(study: str) -> tuple[int, float]:
    """(jobs, wall minutes) one more seed of `study` adds: its jobs per seed (composed) and its header's minutes
    per job (2 jobs at a time on 2 cores)."""
    from rlhf_lab.entry.sweeps import plan

    jobs = plan([f"sweep={study}"], validate=False)
    n_seeds = len({o for j in jobs for o in j if o.startswith("seed=")}) or 1
    stated_jobs, mins = expected(study)
    return len(jobs) // n_seeds, (mins or 0.0) / (stated_jobs or len(jobs)) * (len(jobs) // n_seeds)


def decide(overrides: list[str], out: str, runs_files: list[str], cap: int, n_jobs: int, dry: bool,
           max_minutes: float | None, studies: list[str]) -> int:
    """``--decide``: the seeds power asks for, cheapest decision first; each study's stored seed-0 run reproduced
    before any seed is added; then the report. With `dry`, the plan only."""
    from rlhf_lab_research.seed_plan import plan_table

    items, beyond = decision_plan(overrides, out, runs_files, cap, lambda key: suite_study(key, studies), per_seed)
    print(plan_table(items, beyond, cap), flush=True)
    for study, why in NOT_EXTENDED.items():
        print(f"    not extended: {study}: {why}")
    if dry:
        return 0
    t0, failed, done = time.time(), [], []
    for it in items:
        spent = (time.time() - t0) / 60
        if max_minutes is not None and spent + it.minutes > max_minutes:
            print(f"[rlhf-lab-suite] {it.study}: {it.minutes:.0f} min do not fit what is left of --max-minutes; "
                  "launch again to go on (finished jobs are skipped)", flush=True)
            continue
        problem, env = reproduce(it.study, overrides, out, runs_files)
        if problem:
            print(f"[rlhf-lab-suite] {it.study}: not extended: today's code does not reproduce it: {problem}",
                  flush=True)
            failed.append(f"{it.study} (reproduction)")
            continue
        print(f"\n[rlhf-lab-suite] {it.study} ({' '.join(it.claims)}): seeds {it.seeds_now} -> {it.target} "
              f"({it.seed_override}, about {it.minutes:.0f} min)", flush=True)
        with environment(env):  # the kernels it reproduced with: its prepared artifacts and jobs compute alike
            cmd = study_command(it.study, overrides + prepare(it.study, overrides, [it.seed_override])
                                + [it.seed_override], n_jobs)
            rc = subprocess.call(cmd)
        if rc != 0:
            failed.append(it.study)
        done.append(it.study)
    if done:
        write_report(overrides, out, runs_files, None, failed)
    print(f"[rlhf-lab-suite] --decide: {len(done)} studies extended in {fmt_minutes(time.time() - t0)}"
          + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)
    return 1 if failed else 0


def write_report(overrides: list[str], out: str, runs_files: list[str] | None, only: list[str] | None,
                 failed: list[str]) -> None:
    print("\n[rlhf-lab-suite] rlhf-lab-report --claims" + (f" --only {','.join(only)} (the claims these studies "
          f"test; every section of {Path(out) / 'claims.md'} is recomputed from the runs read)" if only else ""),
          flush=True)
    if subprocess.call(report_command(overrides, out, runs_files, only)) != 0:
        failed.append("rlhf-lab-report --claims")


def run(studies: list[str], overrides: list[str], n_jobs: int, report: bool, out: str,
        max_minutes: float | None = None, runs_files: list[str] | None = None, seeds_cap: int | None = None,
        needs: Callable[..., dict[str, int]] = measured_needs,
        reproduces: Callable[..., Reproduction] = reproduce) -> int:
    """Run the studies in order; with `max_minutes`, stop before the first study whose expected time (its header's,
    a study's full time even when some of its jobs are done) would end past that budget. With `seeds_cap`, after the
    report, run more seeds where the claims need them (:func:`more_seeds`; `needs`: {claim study key: seeds}) and
    write the report again."""
    t0 = time.time()
    failed: list[str] = []
    left: list[str] = []
    for i, study in enumerate(studies, 1):
        _, mins = expected(study)
        spent = (time.time() - t0) / 60
        if max_minutes is not None and spent + (mins or 0.0) > max_minutes:
            left = studies[i - 1:]
            print(f"\n[rlhf-lab-suite] stopping before {study}: expected about {format(mins or 0, 'g')} min, "
                  f"{max(max_minutes - spent, 0):.0f} of --max-minutes {format(max_minutes, 'g')} left", flush=True)
            break
        print(f"\n[rlhf-lab-suite] {i}/{len(studies)} {study} ({claims_of(study) or 'study'}; expected about "
              f"{format(mins, 'g') if mins is not None else '?'} min)", flush=True)
        t1 = time.time()
        try:
            rc = subprocess.call(study_command(study, overrides + prepare(study, overrides), n_jobs))
        except RuntimeError as err:
            print(f"[rlhf-lab-suite] {err}", flush=True)
            rc = 1
        status = "done" if rc == 0 else f"exit status {rc}"
        print(f"[rlhf-lab-suite] {study}: {status} in {fmt_minutes(time.time() - t1)} "
              f"(suite so far {fmt_minutes(time.time() - t0)})", flush=True)
        if rc != 0:
            failed.append(study)
    ran = [s for s in studies if s not in left]
    only = report_claims(ran, out) if report else None
    if report and only == []:
        print(f"\n[rlhf-lab-suite] no study ran: {Path(out) / 'claims.md'} is left as it is", flush=True)
    elif report:
        write_report(overrides, out, runs_files, only, failed)
        if seeds_cap and "rlhf-lab-report --claims" not in failed:
            if more_seeds(ran, needs(overrides, out, runs_files or [], seeds_cap), overrides, n_jobs, t0, max_minutes,
                          failed, check=lambda study: reproduces(study, overrides, out, runs_files or [])):
                write_report(overrides, out, runs_files, report_claims(ran, out), failed)
    print(f"\n[rlhf-lab-suite] total wall time {fmt_minutes(time.time() - t0)} for {len(studies) - len(left)} studies"
          + (f"; failed: {', '.join(failed)} (launch the same command again to re-run what is missing)"
             if failed else "")
          + (f"; not started (--max-minutes): {', '.join(left)} (launch the same command again to go on; finished "
             "jobs are skipped)" if left else ""), flush=True)
    return 1 if failed else 0


def runs_file_problem(runs_files: list[str]) -> str | None:
    """One line saying why one of the ``--runs`` files cannot be read (unreadable, another format, an edited digest,
    runs of the wrong layout: :func:`rlhf_lab.analysis.snapshot.read_snapshot`), or None when all can."""
    from rlhf_lab.analysis.snapshot import SnapshotError, read_snapshot

    for f in runs_files:
        try:
            read_snapshot(f)
        except SnapshotError as err:
            return str(err)
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="rlhf-lab-suite", description="Run every claims study (resumably: jobs with a FINISHED run are "
        "skipped), then rlhf-lab-report --claims. Extra arguments are Hydra overrides for every job.")
    p.add_argument("--dry-run", action="store_true", help="list the studies, their job counts and expected times")
    p.add_argument("--studies", default=None,
                   help=f"comma-separated studies to run instead of the suite (any of: {', '.join(study_names())})")
    p.add_argument("--n-jobs", type=int, default=2, help="jobs at a time (hydra.launcher.n_jobs; default 2)")
    p.add_argument("--no-report", action="store_true", help="do not write reports/claims.md at the end")
    p.add_argument("--out", default="reports", help="folder of claims.md (default: reports)")
    p.add_argument("--runs", action="append", default=[], metavar="FILE",
                   help="the final report also reads the runs kept in FILE (the claims_runs.json.gz of an earlier "
                        "report, e.g. one made on another machine; repeatable)")
    p.add_argument("--no-validate", action="store_true", help="with --dry-run: do not compose every job")
    p.add_argument("--max-minutes", type=float, default=None,
                   help="stop before a study that is expected to end past this many minutes from the start (e.g. "
                        "what is left of a working session); launch again to go on")
    p.add_argument("--more-seeds", type=int, default=None, metavar="CAP",
                   help="after the report, run more seeds (5, 6, …) of each study whose inconclusive claims need at most "
                        "CAP seeds for 80 %% power, where the projected time fits --max-minutes; then the report again")
    p.add_argument("--decide", type=int, nargs="?", const=DECIDE_CAP, default=None, metavar="CAP",
                   help=f"instead of the studies: the seeds 80 %% power asks for where at most CAP (default "
                        f"{DECIDE_CAP}), cheapest decision first, each study's seed-0 run reproduced first; with "
                        "--dry-run the plan")
    p.add_argument("overrides", nargs="*", help="Hydra overrides for every job, e.g. cache_dir=/shared/cache")
    a = p.parse_args(argv)
    studies = [s for s in a.studies.split(",") if s] if a.studies else [s for s, _ in SUITE]
    unknown = sorted(set(studies) - set(study_names()))
    if unknown:
        p.error(f"unknown studies {', '.join(unknown)}; the studies are {', '.join(study_names())}")
    if a.dry_run and a.decide is None:
        return dry_run(studies, a.overrides, validate=not a.no_validate)
    missing = [f for f in a.runs if not Path(f).is_file()]
    if missing:
        p.error(f"--runs: no file {', '.join(missing)}")
    problem = runs_file_problem(a.runs)
    if problem:  # before any study runs, not hours later in the report
        print(f"rlhf-lab-suite: {problem}", file=sys.stderr)
        return 2
    if a.decide is not None:  # its plan reads the --runs files: checked above
        return decide(a.overrides, a.out, a.runs, a.decide, a.n_jobs, a.dry_run, a.max_minutes, studies)
    if a.more_seeds is not None and (a.more_seeds <= SEEDS or a.no_report):
        p.error(f"--more-seeds CAP needs CAP > {SEEDS} (the seeds every study has) and the report")
    return run(studies, a.overrides, a.n_jobs, report=not a.no_report, out=a.out, max_minutes=a.max_minutes,
               runs_files=a.runs, seeds_cap=a.more_seeds)


if __name__ == "__main__":
    raise SystemExit(main())
