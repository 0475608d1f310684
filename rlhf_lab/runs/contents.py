"""The content digest of a local file or folder, and which values of a config or spec name one: the one rule by
which a job's identity (:mod:`rlhf_lab.runs.identity`), the artifact cache's keys (:mod:`rlhf_lab.runs.cache`) and
the in-process memo of external rows (:mod:`rlhf_lab.data.preferences`) see a model, tokenizer or data folder: by
what it holds, never by its name. It imports nothing from ``rlhf_lab``.
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

# the files the artifact cache (rlhf_lab.runs.cache) writes into an artifact folder beside its content: the
# artifact's spec (written last, it marks the artifact complete), its build's run id and time, its manifest
SPEC_FILE = "rlhf_lab_spec.json"
META_FILE = "rlhf_lab_meta.json"
MANIFEST_FILE = "rlhf_lab_manifest.json"
BOOKKEEPING = (SPEC_FILE, META_FILE, MANIFEST_FILE)  # not what a job reads from an artifact folder
INPUT_NAME_KEYS = ("data.name",)  # keys whose value is a local file or folder, or a hub name (see local_path)
SETTLED_S = 2.0  # a file modified more recently than this may change again within its timestamp: not remembered
FILE_DIGESTS: dict[tuple, str] = {}  # (real path, size, mtime_ns, inode) -> digest: each file read once per process


def digest_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def file_digest(path: str | os.PathLike) -> str:
    """The first 16 hex digits of a file's SHA-256, read in 1 MiB blocks; remembered for this process by the
    file's (real path, size, modification time, inode) once its modification time is :data:`SETTLED_S` old."""
    st = os.stat(path)
    key = (os.path.realpath(path), st.st_size, st.st_mtime_ns, st.st_ino)
    if key in FILE_DIGESTS:
        return FILE_DIGESTS[key]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    out = h.hexdigest()[:16]
    if time.time() - st.st_mtime_ns / 1e9 > SETTLED_S:
        FILE_DIGESTS[key] = out
    return out


def folder_files(folder: str | os.PathLike) -> list[str]:
    """The files under `folder` (symbolic links followed, each real folder once), as sorted relative paths with
    ``/``, without the cache's bookkeeping files (:data:`BOOKKEEPING`)."""
    out, seen = [], set()
    for here, dirs, files in os.walk(folder, followlinks=True):
        real = os.path.realpath(here)
        if real in seen:
            dirs[:] = []
            continue
        seen.add(real)
        rel = os.path.relpath(here, folder)
        out += [os.path.normpath(os.path.join(rel, f)).replace(os.sep, "/") for f in files
                if f not in BOOKKEEPING and os.path.isfile(os.path.join(here, f))]
    return sorted(out)


def path_digest(path: str | os.PathLike) -> str:
    """The content digest of a local file (:func:`file_digest`) or folder (each file's relative path and digest):
    the same content gives the same digest wherever it lies, and a changed byte, name or file another one. A file
    that cannot be read counts as ``unreadable`` (the stage that reads it says why)."""
    path = os.fspath(path)
    if os.path.isfile(path):
        return readable_digest(path)
    lines = [f"{rel}\0{readable_digest(os.path.join(path, rel))}" for rel in folder_files(path)]
    return digest_text("folder\n" + "\n".join(lines))


def readable_digest(path: str) -> str:
    """:func:`file_digest`, or ``unreadable`` for a file this process cannot read."""
    try:
        return file_digest(path)
    except OSError:
        return "unreadable"


def local_path(key: str, value: Any) -> str | None:
    """The local file or folder that the value of dotted `key` names (``~`` expanded; relative to the working folder,
    as the stages read it), or None: a value counts when its key ends with ``path`` (``data.path``,
    ``policy.name_or_path``, ``algo.reference.path``, ...) or with one of :data:`INPUT_NAME_KEYS`, or when it holds a
    ``/`` or starts with ``~``, and it names an existing file or folder other than the filesystem's root. Other
    values (a hub name, a word such as ``ppo``) are text."""
    if not isinstance(value, str) or not value.strip():
        return None
    named = key.split(".")[-1].endswith("path") or any(key == k or key.endswith("." + k) for k in INPUT_NAME_KEYS)
    if not (named or "/" in value or value.startswith("~")):
        return None
    path = os.path.expanduser(value)
    if os.path.exists(path) and os.path.realpath(path) != os.path.realpath(os.sep):
        return path
    return None


def absolute_if_local(value: Any) -> Any:
    """A checkpoint value as a stage passes it on in a spec: one that names an existing local file or folder
    (``~`` expanded) as its absolute path, so that :func:`local_path` sees it whatever its key; anything else (a
    hub name, None) as it is."""
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        return value
    path = os.path.expanduser(os.fspath(value))
    return os.path.abspath(path) if os.path.exists(path) else value


def with_contents(node: Any, skip_under: str | os.PathLike | None = None, prefix: str = "") -> Any:
    """`node` (plain containers) with every value that names a local file or folder (:func:`local_path`) replaced by
    ``local content <digest>`` (:func:`path_digest`), but those under `skip_under` (the artifact cache's root, whose
    folders are content-addressed already); a node without one comes back equal to itself."""
    if isinstance(node, dict):
        return {k: with_contents(v, skip_under, f"{prefix}{k}.") for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [with_contents(v, skip_under, f"{prefix}{i}.") for i, v in enumerate(node)]
    path = local_path(prefix[:-1], node)
    if path is None:
        return node
    if skip_under is not None:
        root = os.path.realpath(skip_under)
        real = os.path.realpath(path)
        if real == root or real.startswith(root.rstrip(os.sep) + os.sep):
            return node
    return f"local content {path_digest(path)}"
