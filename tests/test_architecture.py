"""The layout rules of docs/architecture.md, checked on the source (AST scans with rlhf_lab.runs.code's import
reader, which the cache uses for its code digests; nothing of the package is run):
no import cycle inside rlhf_lab/ or rlhf_lab_research/ (imports inside functions count too), rlhf_lab never importing
rlhf_lab_research, no `_private` name imported from another module, a module with one job (a docstring that
names it, at most MAX_LINES lines), at most 3 modules at the package root, no link to ../shared (which a clone does not
have), and docs/architecture.md's import arrows drawn as the code imports."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from rlhf_lab.runs.code import PKG, ROOT, import_graph, imports_of, package_modules

RESEARCH = ROOT / "rlhf_lab_research"  # the lab's own research: imports rlhf_lab, never imported by it


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_planted_cycle():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_inside_the_package():
    cycles = find_cycles(import_graph(PKG, RESEARCH))
    assert not cycles, f"import cycles inside rlhf_lab/ and rlhf_lab_research/: {cycles}"


def research_imports(path: Path, modules: dict[str, Path], tree: ast.Module | None = None) -> list[str]:
    """`file:line imports module` for every import of rlhf_lab_research in the file (inside functions too);
    `modules`: both packages' (package_modules(PKG, RESEARCH))."""
    return [f"{path.relative_to(ROOT)}:{line} imports {target}" for target, _, line in imports_of(path, modules, tree)
            if target.split(".")[0] == "rlhf_lab_research"]


def test_rlhf_lab_never_imports_the_research_package():
    """One direction (docs/architecture.md): the lab's research imports rlhf_lab, never the reverse; rlhf-lab-report
    finds the research reports through an entry-point group, not by the package's name."""
    modules = package_modules(PKG, RESEARCH)
    offenders = [line for path in sorted(PKG.rglob("*.py")) for line in research_imports(path, modules)]
    assert not offenders, "rlhf_lab imports rlhf_lab_research:\n" + "\n".join(offenders)
    assert research_imports(RESEARCH / "report.py", modules)  # the scan sees the research package's own imports


def test_the_direction_check_finds_a_planted_import():
    planted = ast.parse("import rlhf_lab_research\n\ndef f():\n    from rlhf_lab_research.claims import only_claims\n"
                        "    from rlhf_lab.analysis.study_runs import RunData\n")
    found = research_imports(PKG / "analysis" / "planted.py", package_modules(PKG, RESEARCH), planted)
    assert found == ["rlhf_lab/analysis/planted.py:1 imports rlhf_lab_research",
                     "rlhf_lab/analysis/planted.py:4 imports rlhf_lab_research.claims"]


def test_the_import_scan_sees_function_level_imports():
    graph = import_graph()
    assert "rlhf_lab.stages.training" in graph["rlhf_lab.stages.sft"]
    assert "rlhf_lab.analysis.parent_run" in graph["rlhf_lab.entry.sweeps"]  # imported inside a method


def test_runtime_is_a_leaf():
    assert import_graph()["rlhf_lab.runs.process"] == set()


def test_no_private_name_is_imported_from_another_module():
    modules = package_modules(PKG, RESEARCH)
    offenders = []
    files = [*PKG.rglob("*.py"), *RESEARCH.rglob("*.py"), *(ROOT / "tests").rglob("*.py"),
             *(ROOT / "benchmarks").rglob("*.py")]
    for path in files:
        tree = ast.parse(path.read_text(), str(path))
        aliases = {}  # local name -> rlhf_lab module, for `module._name` accesses
        for target, names, line in imports_of(path, modules):
            offenders += [f"{path.relative_to(ROOT)}:{line} imports {target}.{n}" for n in names
                          if n.startswith("_") and not n.startswith("__")]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rlhf_lab"):
                for a in node.names:
                    if f"{node.module}.{a.name}" in modules:
                        aliases[a.asname or a.name] = f"{node.module}.{a.name}"
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("rlhf_lab") and a.asname:
                        aliases[a.asname] = a.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} uses {aliases[node.value.id]}.{node.attr}")
    assert not offenders, "private names used across modules:\n" + "\n".join(offenders)


MAX_LINES = 600  # generous: the longest modules with one job here are about 450 lines (runs/tracking, entry/sweeps)


def one_job_problems(text: str) -> list[str]:
    """Why a module's source does not look like one job: code without a docstring that names it first (an empty
    ``__init__`` needs none), or more than :data:`MAX_LINES` lines."""
    out = []
    tree = ast.parse(text)
    if tree.body and not ast.get_docstring(tree):
        out.append("no docstring saying what it holds")
    if (n := len(text.splitlines())) > MAX_LINES:
        out.append(f"{n} lines (> {MAX_LINES}: a second job? split it by job)")
    return out


def test_a_file_has_one_job():
    """What the old 450-line cap stood for (docs/architecture.md, Rules): a module has one job, which its docstring
    names. Every module of rlhf_lab/ and rlhf_lab_research/ with code opens with a docstring, and none is past
    MAX_LINES, a bound well above the modules that do one thing: a file that long has grown a second job, which is
    the reason to split it, never a count to fit (the 450 cap forced splits by size, such as the alarm verdict and the
    claims' sentences out of their studies)."""
    assert one_job_problems('"""The KL estimators."""\nx = 1\n') == [] and one_job_problems("") == []
    assert one_job_problems("x = 1\n") == ["no docstring saying what it holds"]
    assert one_job_problems('"""A."""\n' + "x = 1\n" * MAX_LINES)[0].startswith(f"{MAX_LINES + 1} lines")
    bad = {str(p.relative_to(ROOT)): why for pkg in (PKG, RESEARCH) for p in sorted(pkg.rglob("*.py"))
           if (why := one_job_problems(p.read_text()))}
    assert not bad, f"modules that do not show one job: {bad}"


def test_the_package_root_holds_folders_not_modules():
    """A module's folder says what it is (docs/architecture.md, Layout): at most 3 modules at the root of rlhf_lab/,
    and no grab-bag module named common, utils, helpers, misc or runtime anywhere."""
    root = sorted(p.name for p in PKG.glob("*.py"))
    assert len(root) <= 3, f"modules at the root of rlhf_lab/: {root}"
    grab = [str(p.relative_to(ROOT)) for p in PKG.rglob("*.py") if p.stem in ("common", "utils", "helpers", "misc",
                                                                               "runtime")]
    assert not grab, f"grab-bag modules: {grab}"


def test_nothing_links_outside_the_repository():
    files = [ROOT / "README.md", *PKG.rglob("*.py"), *(ROOT / "docs").rglob("*.md"), *(ROOT / "conf").rglob("*.yaml")]
    bad = [str(p.relative_to(ROOT)) for p in files if p.exists() and "../shared" in p.read_text()]
    assert not bad, f"links to ../shared (not in a clone of the repository): {bad}"


BELOW_STAGES = ("world", "data", "models", "algorithms", "evaluation", "runs", "server", "analysis")


def test_below_stages_no_function_takes_the_config_and_nothing_imports_omegaconf():
    """Rule 1 of docs/architecture.md: a stage resolves the Hydra config once, at its boundary, into the settings its
    code takes (``config/``: typed dataclasses, plain values); below ``stages/`` no function has a first parameter
    (after ``self``) named ``cfg`` and no module imports omegaconf. ``entry/``, ``stages/`` and ``config/`` may."""
    offenders = []
    for pkg in BELOW_STAGES:
        for path in sorted((PKG / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "omegaconf" or (
                        isinstance(node, ast.Import) and any(a.name.split(".")[0] == "omegaconf" for a in node.names)):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} imports omegaconf")
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    args = [a.arg for a in node.args.posonlyargs + node.args.args]
                    args = args[1:] if args[:1] in (["self"], ["cls"]) else args
                    if args[:1] == ["cfg"]:
                        offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}(cfg, ...)")
    assert not offenders, "the config travels below stages/:\n" + "\n".join(offenders)


def top_level_names(path: Path) -> tuple[set[str], set[str]]:
    """(names a module defines: functions, classes, assignments; names it only imports) at its top level, including
    inside top-level `if`/`try` blocks."""
    defined, imported = set(), set()

    def scan(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    defined.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                imported.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, (ast.If, ast.Try)):
                scan(node.body)
                scan(node.orelse)
                for h in getattr(node, "handlers", []):
                    scan(h.body)
    scan(ast.parse(path.read_text(), str(path)).body)
    return defined, imported - defined


def package_all(path: Path) -> set[str]:
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return {e.value for e in node.value.elts}
    return set()


def test_no_name_is_imported_through_a_module_that_only_imports_it():
    """No re-exports (docs/architecture.md): every `from rlhf_lab.x import name` takes the name from the module that
    defines it, so a reader finds the code where the import says and a move cannot leave a shim behind. A package's
    `__all__` (rlhf_lab.world's public names) is its interface, not a shim."""
    modules = package_modules(PKG, RESEARCH)
    scans = {m: top_level_names(p) for m, p in modules.items()}
    offenders = []
    files = [*PKG.rglob("*.py"), *RESEARCH.rglob("*.py"), *(ROOT / "tests").rglob("*.py"),
             *(ROOT / "benchmarks").rglob("*.py")]
    for path in files:
        for target, names, line in imports_of(path, modules):
            if target not in scans:
                continue
            defined, only_imported = scans[target]
            if modules[target].name == "__init__.py":  # a package's public names (its __all__) are its interface
                defined = defined | package_all(modules[target])
            offenders += [f"{path.relative_to(ROOT)}:{line} takes {n} from {target}, which imports it" for n in names
                          if n in only_imported and n not in defined]
    assert not offenders, "re-exported names:\n" + "\n".join(offenders)


LEAVES = ("world", "data", "models", "algorithms", "evaluation")


def test_leaves_never_reach_up_to_stages_tracking_or_the_entry_points():
    """Rule 3 of docs/architecture.md: the leaf packages (the world, data, models, algorithms, evaluation) never
    import `stages`, `runs.tracking` or `entry`, at module level or inside a function."""
    graph = import_graph()
    up = ("rlhf_lab.stages", "rlhf_lab.runs.tracking", "rlhf_lab.entry")
    offenders = [f"{m} imports {t}" for m, targets in sorted(graph.items()) if m.split(".")[1:2] and m.split(".")[1] in LEAVES
                 for t in sorted(targets) if t == up[1] or t.startswith(up[0]) or t.startswith(up[2])]
    assert not offenders, "leaves reaching up:\n" + "\n".join(offenders)


ARROWS_MARK = "<!-- the import arrows: checked by tests/test_architecture.py -->"


def drawn_arrows(text: str) -> list[tuple[str, list[str]]]:
    """The boxes of docs/architecture.md's import block, top to bottom, each with the boxes it draws arrows to
    (lines ``a -> b, c``; a box alone on its line imports no other box)."""
    block = text.split(ARROWS_MARK, 1)[1].split("```", 2)[1]
    rows = []
    for line in block.splitlines()[1:]:  # after the fence's info string
        if line.strip():
            src, _, dst = line.partition("->")
            rows.append((src.strip(), [d.strip() for d in re.split(r",\s*(?![^{]*\})", dst) if d.strip()]))
    return rows


def box_members(box: str) -> list[str]:
    """``config/{a,b}.py`` -> ``["config/a.py", "config/b.py"]``; a folder or a package name stays as it is."""
    m = re.fullmatch(r"(.*)\{(.*)\}(\.py)", box)
    return [m.group(1) + x + m.group(3) for x in m.group(2).split(",")] if m else [box]


def box_of(module: str, boxes: list[str]) -> str | None:
    """The most specific drawn box holding `module` (``rlhf_lab.config.checks``): a module box (``config/checks.py``)
    before its folder's (``config``); every module of rlhf_lab_research is that one box."""
    if module.split(".")[0] == "rlhf_lab_research":
        return "rlhf_lab_research" if "rlhf_lab_research" in boxes else None
    path, best = "/".join(module.split(".")[1:]), None
    for box in boxes:
        for member in box_members(box):
            hit = path + ".py" == member if member.endswith(".py") else path == member or path.startswith(member + "/")
            if hit and (best is None or len(member) > len(best[1])):
                best = (box, member)
    return best[0] if best else None


def arrow_problems(rows: list[tuple[str, list[str]]], graph: dict[str, set[str]]) -> list[str]:
    """What the drawn arrows get wrong about `graph` (module -> modules it imports): an arrow no import makes, an import
    between boxes with no arrow, an arrow up (to a box drawn above), a module in no box. ``X -> rlhf_lab`` stands for
    imports of any module of the package."""
    boxes = [src for src, _ in rows]
    layer = {b: i for i, b in enumerate(boxes)}
    real: dict[str, set[str]] = {}
    out = []
    for m, targets in sorted(graph.items()):
        a = box_of(m, boxes)
        if a is None:
            if targets:
                out.append(f"{m} is in no box")
            continue
        for t in targets:
            b = box_of(t, boxes)
            b = "rlhf_lab" if b != "rlhf_lab_research" and a == "rlhf_lab_research" else b
            if b is None:
                out.append(f"{t} (imported by {m}) is in no box")
            elif b != a:
                real.setdefault(a, set()).add(b)
    for src, dsts in rows:
        out += [f"{src} -> {d}: no such import" for d in dsts if d not in real.get(src, set())]
        out += [f"{src} -> {d}: the import is not drawn" for d in sorted(real.get(src, set()) - set(dsts))]
        out += [f"{src} -> {d}: an arrow up" for d in dsts if d in layer and layer[d] <= layer[src]]
    return out


def test_the_architecture_docs_draw_the_real_imports():
    """docs/architecture.md's import arrows are the code's (import_graph over both packages, imports inside functions
    included): each drawn arrow is an import, no import between boxes is missing, every arrow points down."""
    rows = drawn_arrows((ROOT / "docs" / "architecture.md").read_text())
    assert arrow_problems(rows, import_graph(PKG, RESEARCH)) == []
    planted = {"rlhf_lab.runs.jobs": {"rlhf_lab.config.keys", "rlhf_lab.stages.ppo"}, "rlhf_lab.stages.ppo": set()}
    assert arrow_problems([("stages", []), ("runs", ["config", "world"]), ("config", [])], planted) == [
        "runs -> world: no such import", "runs -> stages: the import is not drawn"]
    assert arrow_problems([("config", ["runs"]), ("runs", [])], {"rlhf_lab.config.keys": {"rlhf_lab.runs.jobs"}}) == []
    assert arrow_problems([("runs", ["config"]), ("config", [])], {"rlhf_lab.config.keys": {"rlhf_lab.runs.jobs"}}) \
        == ["runs -> config: no such import", "config -> runs: the import is not drawn"]
    assert arrow_problems([("runs", []), ("config", ["runs"])], {"rlhf_lab.config.keys": {"rlhf_lab.runs.jobs"}}) \
        == ["config -> runs: an arrow up"]
    assert box_of("rlhf_lab.config.checks", ["config", "config/{checks,paths}.py"]) == "config/{checks,paths}.py"
    assert box_of("rlhf_lab.config.keys", ["config", "config/{checks,paths}.py"]) == "config"
