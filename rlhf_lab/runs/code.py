"""What code builds an artifact: the package's import graph read from the sources, and the digest of the code a
stage's artifact depends on (:func:`stage_code_digest`), part of its cache key (:mod:`rlhf_lab.runs.cache`), so
newer code never silently reuses an artifact older code built from the same config.

The digest covers the stage's module and every module of the package it imports, at module level or inside a
function (:func:`import_closure`), read as syntax trees without docstrings (a reworded docstring, a comment or a
reformatted line builds nothing new), the versions of the libraries that compute and the CPU kernels torch computes
with (:func:`cpu_capability`). A change to PPO's training step thus leaves the SFT policy and the RM in the cache.
"""

from __future__ import annotations

import ast
import functools
import hashlib
from importlib import metadata
from pathlib import Path

PKG = Path(__file__).resolve().parents[1]  # rlhf_lab/
ROOT = PKG.parent
LIBRARIES = ("torch", "transformers", "tokenizers", "peft", "lightning")
CPU_TAG = "rlhf_lab.cpu_capability"  # a run's tag: the CPU kernels it computed with (cpu_capability)
CPU_ENV = "ATEN_CPU_CAPABILITY"  # torch's variable that chooses them (avx2 on an AVX-512 CPU: the AVX2 kernels)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def package_modules(*packages: Path) -> dict[str, Path]:
    """{dotted module name: source file} for every module of the packages (folders beside rlhf_lab/; default: the
    package itself)."""
    return {module_name(p): p for pkg in packages or (PKG,) for p in pkg.rglob("*.py")}


def imports_of(path: Path, modules: dict[str, Path],
               tree: ast.Module | None = None) -> list[tuple[str, list[str], int]]:
    """(imported module of the packages `modules` holds, names taken from it, line) for every import statement in the
    file (`tree`: its syntax tree, when already parsed), inside functions too."""
    here = module_name(path)
    is_pkg = path.name == "__init__.py"
    tops = {m.split(".")[0] for m in modules}
    out = []
    for node in ast.walk(tree or ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names if a.name.split(".")[0] in tops]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                anchor = here.split(".") if is_pkg else here.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            if base.split(".")[0] not in tops:
                continue
            names = [a.name for a in node.names]
            subs = [f"{base}.{n}" for n in names if f"{base}.{n}" in modules]  # `from pkg import module`
            out += [(s, [], node.lineno) for s in subs]
            rest = [n for n in names if f"{base}.{n}" not in modules]
            if rest or not subs:
                out.append((base, rest, node.lineno))
    return out


def imported_modules(path: Path, modules: dict[str, Path], tree: ast.Module | None = None) -> set[str]:
    """The package's modules the file imports (itself left out)."""
    here = module_name(path)
    return {t for t, _, _ in imports_of(path, modules, tree) if t in modules and t != here}


def import_graph(*packages: Path) -> dict[str, set[str]]:
    """{module: the modules of the packages (default: rlhf_lab) it imports}."""
    modules = package_modules(*packages)
    return {m: imported_modules(p, modules) for m, p in modules.items()}


def import_closure(module: str, graph: dict[str, set[str]]) -> set[str]:
    """`module` and every module of the package it imports, directly or through others (a package's
    ``__init__`` counts where it is imported)."""
    seen, todo = {module}, [module]
    while todo:
        for dep in graph.get(todo.pop(), ()):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def code_text(path: Path, tree: ast.Module | None = None) -> str:
    """The module's syntax tree without its docstrings, as text: what the code does, not how it is written
    (`tree`: its syntax tree, when already parsed; changed here)."""
    tree = tree or ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def cpu_capability() -> str:
    """The CPU kernels torch computes with (``avx512``, ``avx2``, ``default``, ...; :data:`CPU_ENV` chooses others).
    Other kernels round differently, and PPO amplifies a last-digit difference into another run: every run records
    them (:data:`CPU_TAG`) and they are part of every cached artifact's key."""
    import torch

    return str(torch.backends.cpu.get_cpu_capability()).lower()


@functools.cache
def library_versions() -> str:
    out = []
    for name in LIBRARIES:
        try:
            out.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            out.append(f"{name} absent")
    return ",".join(out)


@functools.cache
def code_digests() -> tuple[dict[str, set[str]], dict[str, str]]:
    """(the import graph, {module: digest of its code text}), read once per process."""
    modules = package_modules()
    graph, texts = {}, {}
    for m, p in modules.items():
        tree = ast.parse(p.read_text(), str(p))
        graph[m] = imported_modules(p, modules, tree)
        texts[m] = hashlib.sha256(code_text(p, tree).encode()).hexdigest()
    return graph, texts


@functools.cache
def stage_code_digest(stage: str) -> str | None:
    """The digest of the code that builds `stage`'s artifacts (``rlhf_lab/stages/<stage>.py``, its import closure,
    the libraries' versions, the CPU kernels), once per process; None for a cache folder that is not a stage's
    (``start_eval``, whose key holds the package's digest and the kernels itself)."""
    graph, texts = code_digests()
    module = f"rlhf_lab.stages.{stage}"
    if module not in graph:
        return None
    h = hashlib.sha256(f"{library_versions()},cpu={cpu_capability()}".encode())
    for name in sorted(import_closure(module, graph)):
        h.update(f"\n{name}:{texts[name]}".encode())
    return h.hexdigest()[:16]
