"""The runs of a study, read from MLflow: :class:`RunData` and :func:`load_study`.

Runs are found by the tag ``rlhf_lab.study`` (set by every sweep file in sweeps/sweep/) in the store named
by :func:`store_uri`. Each policy run (PPO, DPO) comes with the histories of its ``eval/*`` metrics
(docs/metrics.md), the metrics and params of its upstream RM run (tag ``rlhf_lab.upstream.rm``; from the
artifact cache's metadata when that run lives in another store), and its *setting*: the swept keys that
vary across the study's runs, which name its group in tables and plots.
"""

from __future__ import annotations

import math
import os
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from rlhf_lab.analysis.fits import GaoFit, fit_bon, fit_rl
from rlhf_lab.config.keys import computes
from rlhf_lab.runs.authors import authored_by, wanted_author
from rlhf_lab.runs.store import sqlite_file
from rlhf_lab.runs.tracking_server import DEFAULT_TRACKING_URI

STUDY_TAG = "rlhf_lab.study"
POLICY_STAGES = ("ppo", "grpo", "rloo", "dpo", "bon")  # policy runs a study report reads
HISTORY_KEYS = ("eval/gold_reward", "eval/proxy_reward", "eval/kl", "eval/entropy", "eval/distinct_2",
                "eval/length", "eval/filler_rate", "bon/gold_reward", "bon/proxy_reward", "bon/kl", "bon/length")
# best-of-n logs one point per n (n as the step) under bon/*: read as the eval/* series of the same quantity
BON_SERIES = {"eval/gold_reward": "bon/gold_reward", "eval/proxy_reward": "bon/proxy_reward", "eval/kl": "bon/kl",
              "eval/length": "bon/length", "eval/formula_gold_reward": "bon/formula_gold_reward"}


@dataclass
class RunData:
    run_id: str
    stage: str
    status: str
    params: dict[str, str]
    tags: dict[str, str]
    metrics: dict[str, float]
    history: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    rm: dict[str, Any] = field(default_factory=dict)  # the upstream RM run: metrics and params
    setting: dict[str, str] = field(default_factory=dict)  # swept keys (seed excluded)
    seed: str = "0"
    start_time: int = 0  # MLflow's run start and end, ms since the epoch (0: unknown)
    end_time: int = 0

    # -- values
    def series(self, key: str) -> list[tuple[int, float]]:
        """(step, value) of a logged metric; for a best-of-n run the ``eval/*`` keys read its ``bon/*`` curve
        (n as the step; BON_SERIES)."""
        if self.stage == "bon":
            key = BON_SERIES.get(key, key)
        return sorted(self.history.get(key) or [])

    def first(self, key: str) -> float:
        s = self.series(key)
        return s[0][1] if s else float("nan")

    def last(self, key: str) -> float:
        s = self.series(key)
        return s[-1][1] if s else self.metrics.get(key, float("nan"))

    def peak(self, key: str) -> float:
        s = self.series(key)
        return max(v for _, v in s) if s else float("nan")

    def value(self, key: str, default: Any = None) -> Any:
        """A config value: the job's swept value, else the run's logged param; for the preference data's keys
        (``data.*``), which a policy run does not log, else the param of its upstream RM run, which was trained on
        that data (a study option such as ``+rm_src=different_mix`` sets them without a swept value). Other keys
        are not taken from the RM run: a cached RM's run logged the config of the job that built it."""
        if key in self.setting:
            return self.setting[key]
        if f"sweep.{key}" in self.params:
            return self.params[f"sweep.{key}"]
        if key in self.params:
            return self.params[key]
        if key.startswith("data."):
            return (self.rm.get("params") or {}).get(key, default)
        return default

    def fnum(self, key: str, default: float = float("nan")) -> float:
        try:
            return float(self.value(key, default))
        except (TypeError, ValueError):
            return default

    def points(self, key: str = "eval/gold_reward", gain: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """(√KL, reward) at the evaluations that logged both, as the gain over the first one if `gain`."""
        kl = dict(self.series("eval/kl"))
        pts = [(s, v) for s, v in self.series(key) if s in kl]
        if not pts:
            return np.zeros(0), np.zeros(0)
        d = np.sqrt(np.maximum([kl[s] for s, _ in pts], 0.0))
        r = np.asarray([v for _, v in pts], dtype=float)
        if gain:
            r = r - r[0]
        return d, r

    def gao_fit(self) -> GaoFit:
        """The Gao et al. form fitted to the gold gain against √KL: the RL form, or the best-of-n form for a
        best-of-n run (fits.fit_rl, fits.fit_bon: none from < 5 points)."""
        d, r = self.points()
        return fit_bon(d, r) if self.stage == "bon" else fit_rl(d, r)

    def rm_accuracy(self) -> float:
        return float(self.rm.get("metrics", {}).get("rm/accuracy", float("nan")))

    def n_params(self) -> float:
        """The policy's size: the metric ``model/params_total`` (param ``n_params`` in runs logged before it)."""
        if "model/params_total" in self.metrics:
            return float(self.metrics["model/params_total"])
        return self.fnum("n_params")

    def rm_params(self) -> float:
        """The upstream RM's size, likewise."""
        value = self.rm.get("metrics", {}).get("model/params_total", self.rm.get("params", {}).get("n_params", "nan"))
        try:
            return float(value)
        except (TypeError, ValueError):
            return float("nan")


def store_uri(uri: str | None = None) -> str:
    """The MLflow store the reports read: ``MLFLOW_TRACKING_URI``, else ``uri`` (``--uri``), else
    ``sqlite:///mlflow.db``; the order of :func:`rlhf_lab.runs.tracking_server.tracking_uri`, with ``uri`` for ``tracking.uri``."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return uri or DEFAULT_TRACKING_URI


def store_exists(uri: str) -> bool:
    """False for a ``sqlite:///`` store whose file does not exist (reading it would create it); True otherwise."""
    db = sqlite_file(uri)
    return db is None or db.is_file()


def job_key(r: RunData) -> tuple | None:
    """What identifies the job a run ran: its study, stage and the overrides it was launched with (tag
    ``rlhf_lab.overrides``, seed included) but those that do not change what it computes; None without that tag."""
    text = r.tags.get("rlhf_lab.overrides")
    if not text:
        return None
    overrides = {k: v for k, v in parse_overrides(text).items() if computes(k)}
    return r.tags.get(STUDY_TAG), r.stage, tuple(sorted(overrides.items()))


def parse_overrides(text: str) -> dict[str, str]:
    """``{key: value}`` of a launch's overrides (tag ``rlhf_lab.overrides``), ``+``/``~`` prefixes dropped."""
    out = {}
    try:
        parts = shlex.split(text or "")
    except ValueError:
        parts = (text or "").split()
    for p in parts:
        if "=" in p:
            k, v = p.split("=", 1)
            out[k.lstrip("+~")] = v
    return out


def rm_from_artifact_cache(rm_id: str, root: str | os.PathLike | None = None) -> dict | None:
    """{"metrics", "params"} of the RM whose run is ``rm_id``, from the metadata its artifact keeps in the
    cache (``RLHF_LAB_CACHE_DIR`` or ``.rlhf_lab_cache``), for an RM tracked in another MLflow store."""
    from rlhf_lab.runs.cache import ArtifactCache
    from rlhf_lab.runs.contents import META_FILE

    cache = ArtifactCache(root or os.environ.get("RLHF_LAB_CACHE_DIR") or ".rlhf_lab_cache")
    for meta_file in sorted((cache.root / "rm").glob(f"*/{META_FILE}")):
        try:
            meta = cache.meta(meta_file.parent)
        except (OSError, ValueError):
            continue
        if meta.get("run_id") == rm_id:
            metrics = dict(meta.get("eval") or {})
            if "model/params_total" in meta:
                metrics["model/params_total"] = meta["model/params_total"]
            return {"metrics": metrics, "params": {"n_params": str(meta.get("n_params", "nan"))},
                    "run_id": rm_id, "from": str(meta_file.parent)}
    return None


def study_filter(study: str | None, parent: str | None = None) -> str:
    """The MLflow search filter for a study's runs (tag ``rlhf_lab.study``), or only the children of one sweep
    parent run (tag ``mlflow.parentRunId``), or both."""
    parts = ([f"tags.`{STUDY_TAG}` = '{study}'"] if study else []) + (
        [f"tags.`mlflow.parentRunId` = '{parent}'"] if parent else [])
    if not parts:
        raise ValueError("load_study needs a study name or a parent run id")
    return " and ".join(parts)


def run_data(r) -> RunData:
    """An MLflow run as :class:`RunData`: its stage (tag ``rlhf_lab.stage``), params, tags, metrics and times; no
    histories, no upstream RM."""
    return RunData(r.info.run_id, r.data.tags.get("rlhf_lab.stage", ""), r.info.status, dict(r.data.params),
                   dict(r.data.tags), dict(r.data.metrics), start_time=int(r.info.start_time or 0),
                   end_time=int(r.info.end_time or 0))


def read_histories(client, rd: RunData, keys: Sequence[str]) -> RunData:
    """`rd` with the histories of those `keys` its run logged, read through `client` (an ``MlflowClient``)."""
    for key in keys:
        if key in rd.metrics:
            rd.history[key] = [(int(m.step), float(m.value)) for m in client.get_metric_history(rd.run_id, key)]
    return rd


def load_study(study: str | None, uri: str | None = None, client=None, stages: Sequence[str] = POLICY_STAGES,
               history_keys: Sequence[str] = HISTORY_KEYS, parent: str | None = None,
               all_authors: bool | None = None) -> tuple[list[RunData], list[Any]]:
    """(the study's runs of the given stages, its sweep parent runs) from MLflow; all statuses.

    Each run comes with the histories of those `history_keys` it logged. The claims also load ``rm`` runs (an RM
    trained as the job of a study); an RM built upstream inside a sweep carries the study tag too. With
    `parent` (a sweep's parent run id) only that sweep's runs are read, and the parent is the one parent run.
    Only the current user's runs are read (:mod:`rlhf_lab.runs.authors`) unless `all_authors` (None: unless the
    environment's ``RLHF_LAB_ALL_AUTHORS=1``, what ``rlhf-lab-report --all-authors`` sets).
    """
    import mlflow
    from mlflow.tracking import MlflowClient

    uri = store_uri(uri)
    if client is None and not store_exists(uri):
        return [], []  # an empty store, not created by reading it (no mlflow.db left in an empty folder)
    client = client or MlflowClient(tracking_uri=uri)
    mlflow.set_tracking_uri(uri)
    found = authored_by(mlflow.search_runs(search_all_experiments=True, filter_string=study_filter(study, parent),
                                           output_format="list", max_results=50000), wanted_author(all_authors))
    parents = ([client.get_run(parent)] if parent else
               [r for r in found if r.data.tags.get("rlhf_lab.stage") == "sweep"])
    rm_cache: dict[str, dict] = {}
    runs: list[RunData] = []
    for r in found:
        stage = r.data.tags.get("rlhf_lab.stage", "")
        if stage not in stages:
            continue
        rd = read_histories(client, run_data(r), history_keys)
        rm_id = rd.tags.get("rlhf_lab.upstream.rm")
        if rm_id:
            if rm_id not in rm_cache:
                try:
                    rr = client.get_run(rm_id)
                    rm_cache[rm_id] = {"metrics": dict(rr.data.metrics), "params": dict(rr.data.params),
                                       "run_id": rm_id}
                except Exception:  # the RM was trained against another store: its cached artifact's metadata
                    rm_cache[rm_id] = rm_from_artifact_cache(rm_id) or {"run_id": rm_id}
            rd.rm = rm_cache[rm_id]
        sweep = {k[len("sweep."):]: v for k, v in rd.params.items() if k.startswith("sweep.")}
        # the swept keys, plus the keys a follow-up sweep fixed on its command line (e.g. more seeds of one cell)
        setting = {**parse_overrides(rd.tags.get("rlhf_lab.overrides", "")), **sweep}
        rd.seed = str(setting.pop("seed", rd.params.get("seed", "0")))
        setting.pop("sweep", None)
        rd.setting = {k: v for k, v in setting.items() if computes(k)}  # not where it logged, how it showed progress
        runs.append(rd)
    # a setting is named by the keys that vary across the study's runs
    keys = sorted({k for r in runs for k in r.setting})
    varying = [k for k in keys if len({r.setting.get(k) for r in runs}) > 1]
    for r in runs:
        r.setting = {k: r.setting[k] for k in varying if k in r.setting} or {"algo": r.stage}
    runs.sort(key=lambda r: (r.stage, natural_key(label(r)), natural_key(r.seed)))
    return runs, parents


def natural_key(text: str) -> list:
    """Sort key with numbers compared as numbers: fixed_0.003 < fixed_0.01 < fixed_1, seed 2 < seed 10."""
    out: list = []
    for part in re.split(r"(-?\d+(?:\.\d+)?(?:[eE]-?\d+)?)", str(text)):
        try:
            out.append((0, float(part), ""))
        except ValueError:
            out.append((1, 0.0, part))
    return out


def label(r: RunData) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(r.setting.items())) or r.stage


def groups(runs: Iterable[RunData]) -> dict[str, list[RunData]]:
    out: dict[str, list[RunData]] = {}
    for r in runs:
        out.setdefault(label(r), []).append(r)
    return out


def kl_gold_pairs(r: RunData) -> list[tuple[tuple[int, float], tuple[int, float]]]:
    """((step, KL), (step, gold)) at the evaluations that logged both."""
    kl = dict(r.series("eval/kl"))
    return [((s, kl[s]), (s, g)) for s, g in r.series("eval/gold_reward") if s in kl]


def policy_size(r: RunData) -> str:
    v = r.value("policy")
    if v:
        return str(v)
    n = r.n_params()
    return f"{n / 1e6:.2f}M" if math.isfinite(n) else "?"


def rm_size(r: RunData) -> str:
    v = r.value("rm_size")
    if v:
        return str(v)
    h, layers = r.value("reward_model.arch.hidden"), r.value("reward_model.arch.layers")
    return f"{h}x{layers}" if h else "?"
