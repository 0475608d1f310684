"""The artifacts some claims studies need made before they run, each by an ``rlhf-lab`` job into a fixed folder under
the suite's working folder: ``PREPARE`` (one artifact handed to the study by an override) and ``PREPARE_PER_SEED``
(one per seed the study runs, which its study file reads itself). A later launch reuses a folder whose job finished
(its ``summary.json`` and artifact are there) and redoes it otherwise."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

SEEDS = 5  # seeds of every suite study file (0–4); rlhf-lab-suite --more-seeds adds 5, 6, …

# Studies that need one artifact made first, by one rlhf-lab job run into a folder of its own (relative to the
# working folder): {study: (folder, that job's overrides, the study key that receives the job's artifact folder)}.
_ON_POLICY = ("suite_artifacts/rm_source_on_policy",
              ["study=rm_source_on_policy", "algo=ppo", "reward_model=different_source", "kl=fixed", "kl.beta=0.01",
               "algo.steps=70", "eval.every_n_steps=10", "seed=100"],
              "data.on_policy_path")
PREPARE: dict[str, tuple[str, list[str], str]] = {"rm_source_5rms": _ON_POLICY}
# Studies that need one artifact per seed s, made by one job each into <folder>/seed_<s> with the job's seed (and its
# RM's) 100 + s, which the study file reads itself: C17's redesign, a probe policy per seed trained against a
# held-out same-source RM (sweeps/sweep/rm_mis_scoring_probe.yaml)
PROBE_OFFSET = 100
PREPARE_PER_SEED: dict[str, tuple[str, list[str]]] = {
    "rm_mis_scoring_probe": ("suite_artifacts/rm_mis_probe",
                             ["study=rm_mis_probe", "algo=ppo", "reward_model=same_source", "kl=fixed", "kl.beta=0.01",
                              "algo.steps=70", "eval.every_n_steps=10"])}


def prepared(folder: Path) -> bool:
    """Whether `folder` holds a finished job: its ``summary.json`` (written last) and its artifact's config."""
    try:
        json.loads((folder / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    return (folder / "artifact" / "config.json").is_file()


def run_prepared(study: str, what: str, job: list[str], out: Path) -> None:
    """Run `job` into `out` unless `out` holds a finished one; a folder left by an interrupted job is emptied and the
    job redone. Raises RuntimeError when the job fails."""
    if prepared(out):
        print(f"[rlhf-lab-suite] {study}: reusing the prepared {what} in {out}", flush=True)
        return
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "rlhf_lab.entry.run", *job, f"hydra.run.dir={out}"]
    print(f"[rlhf-lab-suite] {study}: preparing {what}: rlhf-lab {' '.join(cmd[3:])}", flush=True)
    if subprocess.call(cmd) != 0 or not prepared(out):
        raise RuntimeError(f"{study}: the job that prepares {what} failed (its output: {out})")


def seeds_of(args: list[str]) -> list[int]:
    """The seeds a study runs with the extra `args`: those of a ``seed=a,b,…`` among them, else 0 … SEEDS − 1."""
    given = [a.split("=", 1)[1] for a in args if a.startswith("seed=")]
    return [int(x) for x in given[-1].split(",")] if given else list(range(SEEDS))


def prepare(study: str, overrides: list[str], seed_args: list[str] = ()) -> list[str]:
    """The overrides that hand `study` its prepared artifact (none for a study without one in ``PREPARE``); the job
    runs first (with the suite's `overrides` too, :func:`run_prepared`). A study of ``PREPARE_PER_SEED`` gets one
    artifact per seed it runs (those of `seed_args`, else 0 … 4), which its study file reads itself."""
    if study in PREPARE_PER_SEED:
        folder, job = PREPARE_PER_SEED[study]
        for s in seeds_of(list(seed_args)):
            seed = PROBE_OFFSET + s
            run_prepared(study, f"the artifact of seed {s}", [*job, f"reward_model.seed={seed}", f"seed={seed}",
                                                                 *overrides], Path(folder).resolve() / f"seed_{s}")
        return []
    if study not in PREPARE:
        return []
    folder, job, key = PREPARE[study]
    out = Path(folder).resolve()
    run_prepared(study, key, [*job, *overrides], out)
    return [f"{key}={out / 'artifact'}"]
