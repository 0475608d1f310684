"""Links from the docs to the rest of the repository, kept working on the site.

The pages under docs/ link to repository files as a clone sees them (``../sweeps/README.md``,
``../rlhf_lab/world/splits.py``, ``../reports/gao_rm_scaling/gold_vs_sqrt_kl.png``). MkDocs only serves docs/, so
this hook adds every repository file that a page links to (and, for Markdown files, what they link to in turn) to
the site under ``repo/<its path>`` (Markdown as pages, anything else as it is), and rewrites each such link to that
copy. A link to a file that does not exist is left alone, so ``mkdocs build --strict`` fails on it.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

LINK = re.compile(r"(\]\()([^)\s#?]*)([#?][^)\s]*)?((?:\s+\"[^\"]*\")?\))")
PREFIX = "repo/"


def is_local(target: str) -> bool:
    return bool(target) and not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) and not target.startswith("/")


def resolve(page_repo_path: str, target: str, root: Path) -> str | None:
    """The repository path a link of the page at `page_repo_path` points to, or None outside the repository."""
    path = posixpath.normpath(posixpath.join(posixpath.dirname(page_repo_path), target))
    if path.startswith("../") or path == "..":
        return None
    if (root / path).is_dir() and (root / path / "README.md").is_file():
        path = posixpath.join(path, "README.md")
    return path


def repo_path(src_uri: str, docs: str) -> str:
    return src_uri[len(PREFIX):] if src_uri.startswith(PREFIX) else posixpath.join(docs, src_uri)


def site_uri(path: str, docs: str) -> str:
    return path[len(docs) + 1:] if path.startswith(docs + "/") else PREFIX + path


def linked_files(root: Path, docs: str) -> list[str]:
    """Every repository file outside docs/ that the docs' Markdown links to, directly or through another such file."""
    queue = [str(p.relative_to(root).as_posix()) for p in (root / docs).rglob("*.md")]
    seen, found = set(queue), []
    while queue:
        page = queue.pop()
        for m in LINK.finditer((root / page).read_text(encoding="utf-8")):
            target = m.group(2)
            if not is_local(target):
                continue
            path = resolve(page, target, root)
            if path is None or path in seen or path.startswith(docs + "/") or not (root / path).is_file():
                continue
            seen.add(path)
            found.append(path)
            if path.endswith(".md"):
                queue.append(path)
    return found


def on_files(files, config):  # MkDocs hook
    from mkdocs.structure.files import File

    docs_dir = Path(config["docs_dir"])
    root, docs = docs_dir.parent, docs_dir.name
    for path in linked_files(root, docs):
        files.append(File.generated(config, PREFIX + path, abs_src_path=str(root / path)))
    return files


def on_page_markdown(markdown, page, config, files):  # MkDocs hook
    docs_dir = Path(config["docs_dir"])
    root, docs = docs_dir.parent, docs_dir.name
    here = repo_path(page.file.src_uri, docs)
    own_dir = posixpath.dirname(page.file.src_uri)

    def rewrite(m: re.Match) -> str:
        target = m.group(2)
        if not is_local(target):
            return m.group(0)
        path = resolve(here, target, root)
        if path is None:
            return m.group(0)
        uri = site_uri(path, docs)
        if files.get_file_from_path(uri) is None:
            return m.group(0)  # not on the site: MkDocs reports it
        new = posixpath.relpath(uri, own_dir or ".")
        return f"{m.group(1)}{new}{m.group(3) or ''}{m.group(4)}"

    return LINK.sub(rewrite, markdown)

