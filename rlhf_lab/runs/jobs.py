"""What identifies a job's runs in the tracking store: its command-line overrides (:func:`hydra_overrides`, the
swept keys a sweep logs as params, :func:`job_overrides` as ``skip_finished`` compares them), the design of its study
file (:func:`study_digest`), where its runs go (:class:`RunSettings`), and its FINISHED runs (:func:`finished_runs`).
Whether such a run computed what the job would is :mod:`rlhf_lab.runs.identity`'s."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Iterator

from rlhf_lab.config.keys import override_key
from rlhf_lab.runs.authors import authored_by, wanted_author
from rlhf_lab.runs.process import SWEPT_ENV


def hydra_overrides() -> list[str]:
    try:
        from hydra.core.hydra_config import HydraConfig

        return list(HydraConfig.get().overrides.task)
    except Exception:
        return []


def job_sweep_params(overrides: list[str]) -> dict[str, str]:
    """The job's values of the swept keys (all its overrides when the swept keys are not known)."""
    keys = os.environ.get(SWEPT_ENV)
    wanted = set(filter(None, keys.split(","))) if keys is not None else None
    out = {}
    for o in overrides:
        if "=" not in o:
            continue
        k, v = o.split("=", 1)
        k = override_key(k)
        if wanted is None or k in wanted:
            out[f"sweep.{k}"] = v
    return out


# Overrides that do not change what a job computes; a finished run counts for a job whatever their values.
NOT_JOB_KEYS = ("skip_finished",)


def job_overrides(overrides: list[str] | str) -> list[str]:
    """A job's overrides as the tag ``rlhf_lab.overrides`` holds them (space-joined), each in Hydra's canonical
    form (a multirun writes ``skip_finished=True``, ``tracking.uri=sqlite\\:///x.db`` for what was typed
    ``skip_finished=true``, ``tracking.uri=sqlite:///x.db``), without :data:`NOT_JOB_KEYS`: the identity of a job
    within its study, in order."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    text = overrides if isinstance(overrides, str) else " ".join(overrides)
    out = []
    for token in filter(None, text.split(" ")):
        try:
            o = parser.parse_override(token)
            key, token = override_key(o.get_key_element()), f"{o.get_key_element()}={o.get_value_element_as_str()}"
        except Exception:  # a piece of a value with spaces: compared as it is
            key = override_key(token.split("=", 1)[0])
        if key not in NOT_JOB_KEYS:
            out.append(token)
    return out


STUDY_DIGEST_TAG = "rlhf_lab.study_digest"
# where study groups live, in Hydra's search order (conf/config.yaml): the live studies and option groups, then the
# superseded designs, still composable with the same `sweep=<study>`
STUDY_ROOTS = ("rlhf_lab.sweeps", "rlhf_lab.sweeps.archive")


def study_file(group: str, name: str, roots=None):
    """The file of option `name` of study group `group` (``sweep``: a study) as Hydra finds it, live before archived
    (:data:`STUDY_ROOTS`; `roots`: other folders, tests), or None."""
    from importlib.resources import files

    for root in roots if roots is not None else [files(r) for r in STUDY_ROOTS]:
        f = root.joinpath(group, f"{name}.yaml")
        if f.is_file():
            return f
    return None


def study_names(archived: bool = False) -> list[str]:
    """The live studies (``sweeps/sweep/*.yaml``), with `archived` also the superseded ones (``sweeps/archive/sweep``)."""
    from importlib.resources import files

    out = set()
    for r in STUDY_ROOTS[: 2 if archived else 1]:
        folder = files(r).joinpath("sweep")
        out.update(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))
    return sorted(out)


def study_digest(overrides: list[str], root=None) -> str | None:
    """A digest of what a job's study files fix (parsed, so comments do not count): its ``sweep=<study>`` file
    without its ``hydra`` node (the overrides carry the swept values) and the option files of ``sweeps/<group>/`` its
    overrides select; None without ``sweep=``. ``skip_finished`` thus never takes the runs of an old design for a new
    one. `root`: the folder of study groups (default: the package's, :func:`study_file`)."""
    import hashlib

    import yaml

    parts = []
    for o in overrides:
        if "=" not in o:
            continue
        key, value = o.split("=", 1)
        group = key.lstrip("+~")
        if "/" in group or "," in value:
            continue
        f = study_file(group, value, None if root is None else [root])
        if f is None:
            continue
        node = yaml.safe_load(f.read_text()) or {}
        if group == "sweep" and isinstance(node, dict):
            node.pop("hydra", None)
        parts.append([group, value, node])
    if not any(g == "sweep" for g, _, _ in parts):
        return None
    text = json.dumps(sorted(parts, key=lambda p: (p[0], p[1])), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RunSettings:
    """Where a stage's MLflow run goes and what it records of the job, resolved once from the config by the stage
    (:func:`rlhf_lab.stages.pipeline.run_settings`): the store (:func:`rlhf_lab.runs.tracking_server.tracking_uri`),
    the experiment (``tracking.experiment``), the study (``study``), the job's stage (``algo.name``: its run is the
    job's, tagged with the job's identity), the resolved config as plain containers (``config.yaml``), and whether
    ``skip_finished`` takes other users' runs (``tracking.all_authors``; :mod:`rlhf_lab.runs.authors`)."""

    uri: str
    experiment: str = "rlhf-lab"
    study: str | None = None
    job: str | None = None
    config: dict = field(default_factory=dict, compare=False)
    all_authors: bool = False


def finished_runs(settings: RunSettings, stage: str, overrides: list[str]) -> Iterator:
    """The FINISHED runs of `stage` (upstream stages carry the job's tags too) in the settings' store and experiment,
    newest first, with the same study, the same overrides (:func:`job_overrides`) and, where both have one, the same
    study design (:func:`study_digest`), made by this user unless ``settings.all_authors``."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=settings.uri)
    exp = client.get_experiment_by_name(settings.experiment)
    if exp is None:
        return
    study = settings.study
    query = f"attributes.status = 'FINISHED' and tags.`rlhf_lab.stage` = '{stage}'"
    if study and "'" not in study:
        query += f" and tags.`rlhf_lab.study` = '{study}'"
    want, digest = job_overrides(overrides), study_digest(overrides)
    found = client.search_runs([exp.experiment_id], query, max_results=50000, order_by=["attributes.start_time DESC"])
    for run in authored_by(found, wanted_author(settings.all_authors)):
        tags = run.data.tags
        if tags.get("rlhf_lab.study") == study and job_overrides(tags.get("rlhf_lab.overrides", "")) == want:
            if digest and tags.get(STUDY_DIGEST_TAG, digest) != digest:  # a run before the tag existed: as before
                continue  # the study file's design changed since this run
            yield run


def find_finished_run(settings: RunSettings, stage: str, overrides: list[str]):
    """The latest of :func:`finished_runs`, or None."""
    return next(finished_runs(settings, stage, overrides), None)
