"""A content-addressed artifact cache for stage outputs (tokenizers, base models, SFT policies, RMs).

An artifact lives in ``<root>/<stage>/<key>/``, its key a hash of the spec that determines it (with its upstream
artifacts' paths, and any other local file or folder by its content: :meth:`ArtifactCache.keyed`) and of the code
that builds it (:func:`rlhf_lab.runs.code.stage_code_digest`), so an artifact built by other code is never reused.
Writers build into a temporary folder beside it and rename it into place, under a file lock per key (two processes
of a parallel sweep build it once); a reader never sees a half-written artifact.

Integrity: every artifact carries a manifest (size and SHA-256 of each file), written before the spec file that
marks it complete. The first look-up of an artifact in a process checks it; one that fails, or has no manifest
(nothing tells it from one whose manifest was deleted), is moved to ``<root>/<stage>/.quarantine/`` with a one-line
message and built again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from filelock import FileLock, Timeout

from rlhf_lab.runs.code import stage_code_digest
from rlhf_lab.runs.contents import MANIFEST_FILE, META_FILE, SPEC_FILE, with_contents
from rlhf_lab.runs.distributed import is_rank_zero, rank
from rlhf_lab.runs.process import write_atomic

# Bump when a change to the code changes what an artifact with the same config contains.
CACHE_VERSION = 2  # 2: the prompt space grew (40 products, 20 openers, focus sentences) and splits
QUARANTINE_DIR = ".quarantine"


def artifact_key(stage: str, spec: dict[str, Any]) -> str:
    """The key of `stage`'s artifact for `spec`: the spec, the cache version and, for a stage's artifact, the digest
    of the code that builds it (keys made before that digest are never looked up again: one rebuild)."""
    what = {"stage": stage, "spec": spec, "version": CACHE_VERSION}
    code = stage_code_digest(stage)
    if code is not None:
        what["code"] = code
    blob = json.dumps(what, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def write_json_atomic(path: Path, obj: Any) -> None:
    write_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str))


def manifest(folder: Path) -> dict[str, dict[str, Any]]:
    """``{relative path: {"bytes", "sha256"}}`` of every file under `folder` but the manifest and spec files."""
    out = {}
    for f in sorted(Path(folder).rglob("*")):
        rel = f.relative_to(folder).as_posix()
        if f.is_file() and rel not in (MANIFEST_FILE, SPEC_FILE):
            with open(f, "rb") as fh:
                out[rel] = {"bytes": f.stat().st_size, "sha256": hashlib.file_digest(fh, "sha256").hexdigest()}
    return out


def manifest_problem(folder: Path) -> str | None:
    """What is wrong with `folder` against its manifest (None: it matches); no manifest is a fault (see the
    module's doc)."""
    mf = Path(folder) / MANIFEST_FILE
    if not mf.exists():
        return f"{MANIFEST_FILE} is missing (nothing to check the files against)"
    try:
        expected = json.loads(mf.read_text())
    except (OSError, ValueError) as err:
        return f"unreadable {MANIFEST_FILE} ({err})"
    for rel, want in expected.items():
        f = Path(folder) / rel
        if not f.is_file():
            return f"{rel} is missing"
        if f.stat().st_size != want["bytes"]:
            return f"{rel} has {f.stat().st_size} bytes, {want['bytes']} expected (truncated or replaced)"
        with open(f, "rb") as fh:
            if hashlib.file_digest(fh, "sha256").hexdigest() != want["sha256"]:
                return f"{rel} does not match its SHA-256 (modified after it was written)"
    return None


_announced: set[str] = set()
_verified: set[str] = set()


def forget_checks() -> None:
    """Forget which artifacts this process has checked and announced: the next look-ups check again (a
    long-lived process such as a notebook, or a test playing a new process)."""
    _verified.clear()
    _announced.clear()


def announce_reuse(stage: str, what: str, path: Path) -> None:
    """Say once per process that a cached artifact is reused (stages look their upstream up repeatedly)."""
    if str(path) not in _announced:
        _announced.add(str(path))
        print(f"[rlhf-lab] {stage}: reusing cached {what} {path}")


class ArtifactCache:
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).expanduser().resolve()

    def path(self, stage: str, spec: dict[str, Any]) -> Path:
        """Where the artifact of (stage, spec) lives: its key sees the spec as :meth:`keyed` gives it."""
        return self.root / stage / artifact_key(stage, self.keyed(spec))

    def keyed(self, spec: Any) -> Any:
        """`spec` as its key sees it: paths under this root relative to it (:meth:`portable`: a moved cache keeps its
        keys), any other local file or folder as its content digest (:func:`rlhf_lab.runs.contents.with_contents`:
        weights copied over a folder build anew, a copy elsewhere is the same input)."""
        return with_contents(self.portable(spec), skip_under=self.root)

    def portable(self, spec: Any) -> Any:
        """`spec` with this cache's root in every string replaced by ``$CACHE``."""
        if isinstance(spec, dict):
            return {k: self.portable(v) for k, v in spec.items()}
        if isinstance(spec, (list, tuple)):
            return [self.portable(v) for v in spec]
        return spec.replace(str(self.root), "$CACHE") if isinstance(spec, str) else spec

    def get(self, stage: str, spec: dict[str, Any]) -> Path | None:
        """The complete, intact artifact for this key, else None (a corrupt one is quarantined)."""
        p = self.path(stage, spec)
        return p if self._usable(p, stage) else None

    def _usable(self, final: Path, stage: str) -> bool:
        """Complete (spec file present) and matching its manifest (checked once per process)."""
        if not (final / SPEC_FILE).exists():
            return False
        if str(final) in _verified:
            return True
        problem = manifest_problem(final)
        if problem is None:
            _verified.add(str(final))
            return True
        self.quarantine(final, stage, problem)
        return False

    def quarantine(self, final: Path, stage: str, problem: str) -> Path:
        """Move a corrupt artifact out of the way (kept for inspection) so that it is built again."""
        q = final.parent / QUARANTINE_DIR / f"{final.name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"
        q.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(final, q)
        except FileNotFoundError:  # another process moved it first
            return q
        print(f"[rlhf-lab] cache: the {stage} artifact {final} is corrupt: {problem}. Moved to {q} (delete it "
              "when done inspecting); building it again.", flush=True)
        return q

    def remove_stale_builds(self, stage: str) -> None:
        """Remove ``.tmp-<key>-*`` build folders whose key's lock is free: builds that were killed."""
        for tmp in (self.root / stage).glob(".tmp-*"):
            key = tmp.name[len(".tmp-"):].rsplit("-", 1)[0]
            lock = FileLock(str(self.root / stage / f"{key}.lock"))
            try:
                lock.acquire(timeout=0)
            except Timeout:
                continue  # its build is running
            try:
                shutil.rmtree(tmp, ignore_errors=True)
            finally:
                lock.release()

    def meta(self, path: Path) -> dict[str, Any]:
        f = Path(path) / META_FILE
        return json.loads(f.read_text()) if f.exists() else {}

    def _lock(self, final: Path) -> FileLock:
        final.parent.mkdir(parents=True, exist_ok=True)
        return FileLock(str(final.parent / f"{final.name}.lock"))

    def get_or_build(
        self, stage: str, spec: dict[str, Any], build: Callable[[Path], dict[str, Any] | None]
    ) -> tuple[Path, bool]:
        """Return (path, built). `build(tmp_dir)` writes the artifact into tmp_dir and may return metadata. Holds the
        key's lock while building (a second process waits, then finds it); in a multi-process job only rank 0 builds.
        Afterwards removes the stage's build folders of killed builds (:meth:`remove_stale_builds`)."""
        final = self.path(stage, spec)
        if self._usable(final, stage):
            return final, False
        if not is_rank_zero():
            return self._wait_for(final, stage), False
        lock = self._lock(final)
        try:
            lock.acquire(timeout=0)
        except Timeout:
            print(f"[rlhf-lab] {stage}: another process is building {final}; waiting for it", flush=True)
            lock.acquire()
        try:
            if self._usable(final, stage):
                return final, False
            tmp = final.parent / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
            tmp.mkdir(parents=True)
            try:
                meta = build(tmp) or {}
                write_json_atomic(tmp / META_FILE, meta)
                write_json_atomic(tmp / MANIFEST_FILE, manifest(tmp))
                write_json_atomic(tmp / SPEC_FILE, {"stage": stage, "spec": spec, "code": stage_code_digest(stage)})
                if final.exists():  # a leftover without a spec file: never completed
                    shutil.rmtree(final)
                os.replace(tmp, final)
                _announced.add(str(final))  # built here: later look-ups in this process are no news
                _verified.add(str(final))
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        finally:
            lock.release()
        self.remove_stale_builds(stage)
        return final, True

    def _wait_for(self, final: Path, stage: str, poll_s: float = 1.0) -> Path:
        print(f"[rlhf-lab] rank {rank()}: waiting for rank 0 to build the {stage} artifact {final}")
        while not (final / SPEC_FILE).exists():
            time.sleep(poll_s)
        return final

    def publish(self, stage: str, spec: dict[str, Any], src: Path, meta: dict[str, Any]) -> Path:
        """Copy a finished artifact folder into the cache unless the key is already there."""
        def build(tmp: Path):
            shutil.copytree(src, tmp, dirs_exist_ok=True)
            return meta
        return self.get_or_build(stage, spec, build)[0]
