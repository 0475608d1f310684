"""Analyses of one study each: the Gao et al. scaling fits (:mod:`.gao`), the gold-RM validation (:mod:`.gold_validation`);
and the page their reports write for a study not run yet (:func:`not_run_page`)."""

from __future__ import annotations

from pathlib import Path


def not_run_page(out: Path, lines: list[str], missing: str, source: str) -> Path:
    """Write ``<out>/README.md``: the report's opening `lines` and that it is not run yet (`missing`: what no run in
    `source` had); the path written."""
    text = "\n".join([*lines, f"**Not run yet**: {missing} in {source}.", ""])
    (out / "README.md").write_text(text)
    return out / "README.md"
