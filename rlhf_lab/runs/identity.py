"""What a job computes, as three digests recorded on its run and compared by ``skip_finished=true``.

A job's overrides and study do not say what it computes: the files its config names can change in place, a study
file or a config default can change the composed config, and the code can change. :func:`job_identity` digests each
(the composed config without :data:`rlhf_lab.config.keys.NOT_COMPUTED`, the content of every local input, the
package's sources); the CLI computes it once per job before any work (:func:`running`) and
:mod:`rlhf_lab.runs.tracking` records it as tags on the job's run. :func:`rerun_reason` says which part differs from
a finished run's.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import json
from pathlib import Path
from typing import Any, Iterator

from rlhf_lab.config.keys import computed_plain
from rlhf_lab.runs.contents import digest_text, local_path, path_digest

CONFIG_TAG = "rlhf_lab.job.config_digest"
INPUTS_TAG = "rlhf_lab.job.inputs_digest"
CODE_TAG = "rlhf_lab.job.code_digest"
INPUT_FILES_TAG = "rlhf_lab.job.inputs"  # {config key: digest} of the local inputs, as JSON
DIGEST_TAGS = (CONFIG_TAG, INPUTS_TAG, CODE_TAG)


@functools.cache
def source_digest() -> str:
    """A digest of this package's Python sources (once per process): evaluations cached under it are never
    reused by other code, and a finished run of other code is no finished run for ``skip_finished``."""
    root = Path(__file__).resolve().parents[1]  # rlhf_lab/
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(f"{f.relative_to(root)}:".encode() + f.read_bytes())
    return h.hexdigest()[:16]


def computed_config(config: dict) -> dict:
    """`config` (the composed config as plain, resolved containers: ``config.keys.to_plain(cfg)``) without
    :data:`rlhf_lab.config.keys.NOT_COMPUTED` (and the keys added since at their old value,
    :func:`rlhf_lab.config.keys.computed_plain`); `config` itself is left as it is."""
    return computed_plain(copy.deepcopy(config))


def config_digest(config: dict) -> str:
    """A digest of :func:`computed_config`: where a job logs, how it shows progress and the like do not count."""
    return digest_text(json.dumps(computed_config(config), sort_keys=True, default=str))


def leaves(node: Any, prefix: str = "", lists: bool = True) -> dict[str, Any]:
    """``{dotted key: value}`` of every leaf of plain containers (a list's items by index; a list one leaf when not
    `lists`)."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if lists and isinstance(node, list) else None
    if items is None:
        return {prefix[:-1]: node}
    out: dict[str, Any] = {}
    for k, v in items:
        out.update(leaves(v, f"{prefix}{k}.", lists))
    return out


def local_inputs(config: dict) -> dict[str, str]:
    """``{config key: path}`` of the local files and folders the config's computed keys name
    (:func:`rlhf_lab.runs.contents.local_path`'s rule; a hub name is text, in the config digest)."""
    out = {}
    for key, value in leaves(computed_config(config)).items():
        path = local_path(key, value)
        if path is not None:
            out[key] = path
    return out


def input_digests(config: dict) -> dict[str, str]:
    """``{config key: content digest}`` of :func:`local_inputs` (a path named twice is read once)."""
    inputs = local_inputs(config)
    done = {p: path_digest(p) for p in sorted(set(inputs.values()))}
    return {k: done[p] for k, p in sorted(inputs.items())}


def job_identity(config: dict) -> dict[str, str]:
    """The tags that say what the job computes: :data:`CONFIG_TAG`, :data:`INPUTS_TAG` (with :data:`INPUT_FILES_TAG`)
    and :data:`CODE_TAG`, of `config` (plain, resolved containers)."""
    inputs = input_digests(config)
    files = json.dumps(inputs, sort_keys=True)
    return {CONFIG_TAG: config_digest(config), INPUTS_TAG: digest_text(files), INPUT_FILES_TAG: files,
            CODE_TAG: source_digest()}


CURRENT: dict[str, str] = {}  # the identity of the job the CLI is running (running), empty between jobs


@contextlib.contextmanager
def running(config: dict) -> Iterator[dict[str, str]]:
    """Around a job the CLI runs: its identity, computed once before any work and kept for the job's run
    (:func:`run_tags`); forgotten when the job is over, so that the next job of a sweep's process computes its own."""
    CURRENT.clear()
    CURRENT.update(job_identity(config))
    try:
        yield dict(CURRENT)
    finally:
        CURRENT.clear()


def run_tags(config: dict) -> dict[str, str]:
    """The identity tags for the job's run: the CLI's (:func:`running`), else computed from `config` (a stage called
    directly), else none (inputs that cannot be digested: such a run is never taken for a finished job)."""
    if CURRENT:
        return dict(CURRENT)
    try:
        return job_identity(config)
    except Exception:
        return {}


def changed_parts(tags: dict[str, str], identity: dict[str, str]) -> list[str] | None:
    """What differs between a run's `tags` and `identity`, as words (``data.path's content``, ``the composed
    config``, ``the code``): empty when the run computed the same; None when the run has no job digest."""
    if not all(tags.get(t) for t in DIGEST_TAGS):
        return None
    parts = []
    if tags[INPUTS_TAG] != identity[INPUTS_TAG]:
        try:
            old = json.loads(tags.get(INPUT_FILES_TAG) or "{}")
        except ValueError:
            old = {}
        new = json.loads(identity[INPUT_FILES_TAG])
        keys = sorted(k for k in {*old, *new} if old.get(k) != new.get(k))
        parts += [f"{k}'s content" for k in keys] or ["the inputs' content"]
    if tags[CONFIG_TAG] != identity[CONFIG_TAG]:
        parts.append("the composed config")
    if tags[CODE_TAG] != identity[CODE_TAG]:
        parts.append("the code")
    return parts


def rerun_reason(run, identity: dict[str, str], config: dict, uri: str) -> str:
    """Why a job whose latest FINISHED run (same study, same overrides) is `run` runs again, in one line: the parts
    of its identity that changed (:func:`changed_parts`, a changed config with its keys: :func:`changed_keys`)."""
    run_id = run.info.run_id
    parts = changed_parts(run.data.tags, identity)
    if parts is None:
        return f"finished run {run_id} has no job digest (made before rlhf-lab recorded what a job computes)"
    if "the composed config" in parts:
        old = logged_config(uri, run_id)
        keys = changed_keys(old, config) if old is not None else ""
        parts = [p + (f" ({keys})" if keys and p == "the composed config" else "") for p in parts]
    what = ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]
    return f"{what} changed since finished run {run_id}"


def logged_config(uri: str, run_id: str) -> dict | None:
    """The ``config.yaml`` a run logged (its resolved config) as plain containers, or None when it cannot be read."""
    import tempfile

    import yaml
    from mlflow.tracking import MlflowClient

    try:
        with tempfile.TemporaryDirectory() as tmp:
            local = MlflowClient(tracking_uri=uri).download_artifacts(run_id, "config.yaml", tmp)
            node = yaml.safe_load(Path(local).read_text())
    except Exception:
        return None
    return node if isinstance(node, dict) else None


def changed_keys(old: dict, config: dict, limit: int = 3) -> str:
    """The computed keys whose values differ between an old run's logged config and `config` (both plain), as
    ``kl.beta: 0.1 -> 0.2`` (at most `limit`, then how many more); empty when none differ."""
    before = leaves(computed_plain(old))
    after = leaves(computed_config(config))
    keys = sorted(k for k in {*before, *after} if before.get(k, "(none)") != after.get(k, "(none)"))
    text = [f"{k}: {before.get(k, '(none)')} -> {after.get(k, '(none)')}" for k in keys[:limit]]
    return "; ".join(text) + (f"; {len(keys) - limit} more" if len(keys) > limit else "")
