"""The docs site: `mkdocs build --strict` passes (every nav entry exists, no link to a missing page or file, the API
pages' modules resolve), and the generated configuration reference names every key of the typed schema."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def hook(name: str):
    """A MkDocs hook of docs/hooks/ (not a package: MkDocs loads them by path)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "docs" / "hooks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_links_to_repository_files_point_at_their_copies_on_the_site():
    links = hook("repo_links")
    assert {"sweeps/README.md", "reports/claims.md"} <= set(links.linked_files(ROOT, "docs"))

    class Page:
        class file:
            src_uri = "tutorials/first-sweep.md"

    class Files:
        def get_file_from_path(self, uri):
            return object() if uri in {"repo/sweeps/README.md", "results.md"} else None

    md = "[a](../../sweeps/README.md#reports) [b](../results.md) [c](../../nowhere.md) [d](https://x.org/a.md)"
    out = links.on_page_markdown(md, Page, {"docs_dir": str(ROOT / "docs")}, Files())
    # a repository file -> its copy; a docs page as it was; a missing file left for MkDocs to report; a URL untouched
    assert out == "[a](../repo/sweeps/README.md#reports) [b](../results.md) [c](../../nowhere.md) [d](https://x.org/a.md)"


def test_the_configuration_reference_names_every_schema_key_with_its_default():
    gen = hook("config_reference")
    page = gen.render()
    keys = gen.all_schema_keys()
    assert len(keys) > 150, len(keys)  # every group's schema, nested keys dotted
    missing = sorted(k for k in keys if f"`{k}`" not in page)
    assert not missing, f"schema keys missing from the configuration reference: {missing}"
    # a default and its comment come from conf/: algo=ppo's clip_eps row
    row = next(line for line in page.splitlines() if line.startswith("| `algo.clip_eps` |"))
    assert "`0.2`" in row and "float" in row and "clipped surrogate" in row, row


@pytest.mark.slow  # a process of its own: about 4 s of CPU, more on busy cores
def test_mkdocs_build_strict(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    for page in ("index.html", "reference/configuration/index.html", "tutorials/your-model/index.html",
                 "repo/sweeps/index.html", "api/index.html"):
        assert (tmp_path / page).is_file(), page
    # README's format table reaches the your-model page (one copy, included), and the API pages have docstrings
    assert "conversational" in (tmp_path / "tutorials/your-model/index.html").read_text()
    assert "gae" in (tmp_path / "api/index.html").read_text().lower()
