"""A content-addressed artifact cache for stage outputs (tokenizers, base models, SFT policies, RMs).

An artifact lives in ``<root>/<stage>/<key>/`` where ``key`` hashes the config that determines it
(and the keys of its upstream artifacts, which are part of that config). Writers build into a
temporary folder beside it and rename it into place, so a reader never sees a half-written artifact;
a file lock per key makes two processes of a parallel sweep that need the same artifact build it once.
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

from filelock import FileLock

from rlhf_lab.distributed import is_rank_zero, rank

# Bump when a change to the code changes what an artifact with the same config contains.
CACHE_VERSION = 2  # 2: the prompt space grew (40 products, 20 openers, focus sentences) and splits
SPEC_FILE = "rlhf_lab_spec.json"
META_FILE = "rlhf_lab_meta.json"


def artifact_key(stage: str, spec: dict[str, Any]) -> str:
    blob = json.dumps({"stage": stage, "spec": spec, "version": CACHE_VERSION}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)


_announced: set[str] = set()


def announce_reuse(stage: str, what: str, path: Path) -> None:
    """Say once per process that a cached artifact is reused (stages look their upstream up repeatedly)."""
    if str(path) not in _announced:
        _announced.add(str(path))
        print(f"[rlhf-lab] {stage}: reusing cached {what} {path}")


class ArtifactCache:
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).expanduser().resolve()

    def path(self, stage: str, spec: dict[str, Any]) -> Path:
        return self.root / stage / artifact_key(stage, spec)

    def get(self, stage: str, spec: dict[str, Any]) -> Path | None:
        p = self.path(stage, spec)
        return p if (p / SPEC_FILE).exists() else None

    def meta(self, path: Path) -> dict[str, Any]:
        f = Path(path) / META_FILE
        return json.loads(f.read_text()) if f.exists() else {}

    def _lock(self, final: Path) -> FileLock:
        final.parent.mkdir(parents=True, exist_ok=True)
        return FileLock(str(final.parent / f"{final.name}.lock"))

    def get_or_build(
        self, stage: str, spec: dict[str, Any], build: Callable[[Path], dict[str, Any] | None]
    ) -> tuple[Path, bool]:
        """Return (path, built). `build(tmp_dir)` writes the artifact into tmp_dir and may return metadata.

        Holds the key's lock while building; a second process waits, then finds the artifact. In a
        multi-process job only rank 0 builds; the other ranks wait until the artifact is there.
        """
        final = self.path(stage, spec)
        if (final / SPEC_FILE).exists():
            return final, False
        if not is_rank_zero():
            return self._wait_for(final, stage), False
        with self._lock(final):
            if (final / SPEC_FILE).exists():
                return final, False
            tmp = final.parent / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
            tmp.mkdir(parents=True)
            try:
                meta = build(tmp) or {}
                write_json_atomic(tmp / META_FILE, meta)
                write_json_atomic(tmp / SPEC_FILE, {"stage": stage, "spec": spec})
                if final.exists():  # a leftover without a spec file: never completed
                    shutil.rmtree(final)
                os.replace(tmp, final)
                _announced.add(str(final))  # built here: later look-ups in this process are no news
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
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
