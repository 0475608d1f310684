"""Adding seeds to the claims suite's studies (``rlhf-lab-suite --more-seeds``, ``--decide``): the runs the
claims report reads, the check that today's code reproduces a study's stored seed-0 run before any seed is added to
it, and ``--decide``'s plan (:mod:`rlhf_lab_research.seed_plan`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, NamedTuple

from rlhf_lab_research.provenance import REPRODUCE_SUFFIX, reproduced_keys, same, stored_seed0
from rlhf_lab.analysis.snapshot import FILE_NAME
from rlhf_lab.config.keys import computes, override_key
from rlhf_lab.runs.code import CPU_ENV, CPU_TAG, cpu_capability


def uri_override(overrides: list[str]) -> str | None:
    """The last ``tracking.uri=`` among the suite's overrides (None: the usual store)."""
    uri = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0].lstrip("+") == "tracking.uri"]
    return uri[-1] if uri else None


def report_runs(overrides: list[str], out: str, runs_files: list[str]):
    """The runs and commands the claims report reads: the store (``tracking.uri`` among `overrides`, else the usual
    one), the --runs files and the runs file beside the report in `out`."""
    from rlhf_lab_research.claims import gather_runs

    kept = Path(out) / FILE_NAME
    files = [*runs_files, *([str(kept)] if kept.is_file() else [])]
    return gather_runs(uri_override(overrides), files, use_store=True)


def stored_seed0_run(study: str, overrides: list[str], out: str, runs_files: list[str]):
    """The study's stored seed-0 run in the store and the runs files the report reads
    (:func:`rlhf_lab_research.provenance.stored_seed0`), or None."""
    runs, _ = report_runs(overrides, out, runs_files)
    return stored_seed0([r for rs in runs.values() for r in rs if r.tags.get("rlhf_lab.study") == study])


class Reproduction(NamedTuple):
    """What :func:`reproduce` found: `problem` None when today's code gave the stored seed-0 run's figures again (or
    the study has none stored), else why not; `env`, the environment variables it reproduced under (the CPU
    kernels), in which the study's new seeds then run, so that all its runs computed alike."""

    problem: str | None
    env: dict[str, str]


# x86 kernels in torch's order: a run made with later ones cannot be rerun where the CPU offers only earlier ones
KERNEL_ORDER = ("default", "avx2", "avx512")


def kernel_choices(old) -> list[str]:
    """The CPU kernels to rerun the stored run `old` with: those it recorded (tag ``rlhf_lab.cpu_capability``), else
    ``avx2`` and then this machine's (a run from before runs recorded them: the lab's were made on AVX2 machines
    until 2026-12-04 21:00 UTC, on AVX-512 ones after)."""
    tagged = old.tags.get(CPU_TAG)
    if tagged:
        return [tagged]
    native = cpu_capability()
    return ["avx2"] + ([native] if native != "avx2" else [])


def reproduce(study: str, overrides: list[str], out: str, runs_files: list[str]) -> Reproduction:
    """Rerun the study's stored seed-0 run (one job, its own overrides, study ``<study>_reproduce``, output in
    ``suite_reproduce/<study>``) with the CPU kernels it was made with (:func:`kernel_choices`, environment variable
    ``ATEN_CPU_CAPABILITY``): reproduced when the figures of :data:`~rlhf_lab_research.provenance.REPRODUCED_KEYS`
    (an RM run's ``REPRODUCED_RM_KEYS``) come out equal to 1e-9 relative (``provenance.same``). A study without a
    stored seed-0 run has nothing to mix: reproduced."""
    old = stored_seed0_run(study, overrides, out, runs_files)
    if old is None:
        return Reproduction(None, {})
    job = [o for o in old.tags["rlhf_lab.overrides"].split()  # what it computed (not its store, its progress bar)
           if computes(override_key(o.split("=", 1)[0]))]
    folder = Path("suite_reproduce", study).resolve()
    cmd = [sys.executable, "-m", "rlhf_lab.entry.run", *job, *overrides, f"study={study}{REPRODUCE_SUFFIX}",
           f"hydra.run.dir={folder}"]
    native, problem = cpu_capability(), None
    for kernels in kernel_choices(old):
        if {kernels, native} <= set(KERNEL_ORDER) and KERNEL_ORDER.index(kernels) > KERNEL_ORDER.index(native):
            return Reproduction(f"its seed-0 run {old.run_id} was made with {kernels} CPU kernels; this CPU offers "
                                f"{native} at most: rerun the suite on a CPU with {kernels}", {})
        env = {CPU_ENV: kernels}
        shutil.rmtree(folder, ignore_errors=True)
        print(f"[rlhf-lab-suite] {study}: does today's code reproduce run {old.run_id}? {CPU_ENV}={kernels} rlhf-lab "
              f"{' '.join(cmd[3:])}", flush=True)
        if subprocess.call(cmd, env={**os.environ, **env}) != 0:
            return Reproduction(f"its seed-0 job could not be rerun (output: {folder})", {})
        try:
            new = json.loads((folder / "summary.json").read_text())
        except (OSError, ValueError):
            return Reproduction(f"its seed-0 rerun left no summary.json in {folder}", {})
        got = {**new.get("eval", {}), **new.get("test", {})}
        differ = [k for k in reproduced_keys(old) if not same(old.metrics.get(k), got.get(k))]
        if not differ:
            return Reproduction(None, env)
        k = differ[0]
        problem = (f"its seed-0 run {old.run_id} (commit {old.tags.get('rlhf_lab.git_commit', '?')[:7]}) has {k} "
                   f"{old.metrics.get(k)}, today's code gives {got.get(k)} ({kernels} CPU kernels)")
    return Reproduction(problem, {})


# Studies --decide does not extend, whatever their power asks: a design known to be flawed gets no more seeds of it.
NOT_EXTENDED = {
    "gao_rm_scaling": "C13's evaluations are log-spaced in steps, not in KL (few points near the peak): redesign first",
}


def decision_plan(overrides: list[str], out: str, runs_files: list[str], cap: int,
                  suite_study: Callable[[str], str | None], per_seed: Callable[[str], tuple[int, float]]):
    """(the studies to give more seeds, cheapest decision first; the effects left undecided) from the runs the
    report reads (:mod:`rlhf_lab_research.seed_plan`), without the :data:`NOT_EXTENDED` studies; `suite_study(key)`:
    the study file that runs a claim's study key, `per_seed(study)`: the jobs and minutes one more seed costs."""
    from rlhf_lab_research import seed_plan
    from rlhf_lab_research.claims import counted
    from rlhf_lab_research.claims_registry import CLAIMS
    from rlhf_lab_research.verdicts import judge_all

    runs, commands = report_runs(overrides, out, runs_files)
    counting, present = counted(runs)
    results = judge_all(CLAIMS, counting, present, commands)
    return seed_plan.plan(results, counting, cap, lambda key: next(
        (s for s in [suite_study(key)] if s and s not in NOT_EXTENDED), None), per_seed)
