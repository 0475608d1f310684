"""The configuration reference page, generated from conf/ and the typed schema so that it cannot go stale.

Every key of every option of every config group (conf/<group>/<option>.yaml), with the value that file sets, its type
from the dataclass of rlhf_lab/config/schema.py that types the group, and the comment the YAML gives it (the YAML
files are where the project documents its keys). Schema keys that an option leaves to another file it builds on
(its defaults list) are listed under that file. Run by MkDocs as a hook (mkdocs.yml ``hooks:``): the page
``reference/configuration.md`` is added to the site at every build; ``python docs/hooks/config_reference.py``
prints it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import sys
import typing
from pathlib import Path
from typing import Any, Iterator

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
PAGE = "reference/configuration.md"
# The primary config's groups in the order of its defaults list; `sweep` is the sweeps page's.
SKIP_GROUPS = {"sweep", "hydra", "schema"}
TOP_LEVEL_SKIP = {"defaults", "hydra"}


@functools.lru_cache(maxsize=None)
def yaml_file(path: Path) -> CommentedMap:
    """A YAML file with its comments (read once per build; not to be changed)."""
    return YAML().load(path.read_text()) or CommentedMap()


def groups() -> list[str]:
    """The primary config's groups, in the order conf/config.yaml lists them."""
    out = []
    for entry in yaml_file(CONF / "config.yaml")["defaults"]:
        if isinstance(entry, dict):
            name = str(next(iter(entry))).removeprefix("override ").strip()
            if name not in SKIP_GROUPS and "/" not in name and (CONF / name).is_dir():
                out.append(name)
    return out


def default_options() -> dict[str, str]:
    return {str(next(iter(e))): str(next(iter(e.values()))) for e in yaml_file(CONF / "config.yaml")["defaults"]
            if isinstance(e, dict)}


def comment(node: CommentedMap, key: Any) -> str:
    """The comment after `key`'s value on its line, with the indented comment lines that continue it."""
    items = node.ca.items.get(key)
    token = next((t for t in (items or [])[2:3] if t is not None), None)
    if token is None and isinstance(node.get(key), CommentedMap) and node[key].ca.comment:
        token = next((t for t in node[key].ca.comment if t is not None and not isinstance(t, list)), None)
    if token is None:
        return ""
    lines = token.value.split("\n")
    kept = [lines[0]]
    for line in lines[1:]:
        if not line.strip() or not line[:1].isspace():  # a blank line or a comment of its own: another key's
            break
        kept.append(line)
    return " ".join(line.strip().removeprefix("#").strip() for line in kept if line.strip())


def inline(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, CommentedSeq | list):
        return json.dumps(plain(value), ensure_ascii=False)
    return str(value)


def plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value if isinstance(value, int | float | str | bool) or value is None else str(value)


def rows(node: CommentedMap, prefix: str) -> Iterator[tuple[str, Any, str, bool]]:
    """(dotted key, value, comment, is a mapping) for every key under `node`, depth first, in file order."""
    for key, value in node.items():
        if prefix == "" and key in TOP_LEVEL_SKIP or key == "defaults":
            continue
        path = f"{prefix}{key}"
        if isinstance(value, CommentedMap) and value:
            yield path, None, comment(node, key), True
            yield from rows(value, path + ".")
        else:
            yield path, value, comment(node, key), False


def schema_of(group: str, option_file: Path, seen: frozenset = frozenset()) -> type | None:
    """The dataclass typing an option: named in its defaults list (``/schema/<group>@_here_: <name>``) or in the
    option it builds on (``- base``)."""
    from rlhf_lab.config.schema import SCHEMAS

    for entry in yaml_file(option_file).get("defaults", []) or []:
        if isinstance(entry, dict):
            k, v = str(next(iter(entry))), str(next(iter(entry.values())))
            if k.startswith("/schema/"):
                return SCHEMAS.get((k.removeprefix("/schema/").split("@")[0], f"{v}_schema"))
        elif isinstance(entry, str) and entry != "_self_" and entry not in seen:
            base = option_file.parent / f"{entry}.yaml"
            if base.exists():
                return schema_of(group, base, seen | {entry})
    return None


def bases(option_file: Path) -> list[str]:
    return [str(e) for e in yaml_file(option_file).get("defaults", []) or []
            if isinstance(e, str) and e != "_self_" and (option_file.parent / f"{e}.yaml").exists()]


def type_name(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return "any"
    if origin is typing.Union:
        names = [type_name(a) for a in args if a is not type(None)]
        return " \\| ".join(names + (["null"] if type(None) in args else []))
    if origin in (list, typing.List):
        return f"list[{type_name(args[0])}]" if args else "list"
    return getattr(hint, "__name__", str(hint))


def schema_keys(schema: type, prefix: str = "") -> dict[str, str]:
    """Every key of a schema dataclass (nested ones dotted) and its type."""
    out = {}
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            out[prefix + f.name] = "mapping"
            out.update(schema_keys(hint, f"{prefix}{f.name}."))
        else:
            out[prefix + f.name] = type_name(hint)
    return out


CODE = re.compile(r"(`[^`]*`)")


def text(doc: str) -> str:
    """A comment as Markdown table text: code spans kept, characters Markdown would read escaped."""
    parts = CODE.split(doc)
    for i in range(0, len(parts), 2):
        parts[i] = re.sub(r"([\\*_<>\[\]|])", r"\\\1", parts[i])
    return "".join(parts).replace("`|`", "`\\|`")


def code(value: str) -> str:
    return f"`{value.replace('|', '¦')}`" if value else ""


def option_table(group: str, option_file: Path) -> list[str]:
    schema = schema_of(group, option_file)
    types = schema_keys(schema) if schema else {}
    data = yaml_file(option_file)
    lines = ["| key | value | type | what it sets |", "|---|---|---|---|"]
    seen = set()
    for key, value, doc, mapping in rows(data, ""):
        seen.add(key)
        shown = "" if mapping else inline(value)
        lines.append(f"| `{group}.{key}` | {code(shown)} | {types.get(key, '')} | {text(doc)} |")
    inherited = [k for k in types if k not in seen]
    if inherited and not bases(option_file):  # typed by the schema, not set here
        builders = [f"`{group}={f.stem}`" for f in sorted(option_file.parent.glob("*.yaml"))
                    if option_file.stem in bases(f)]
        where = f"set by {', '.join(builders)}, which build on this file" if builders else "set by no file: required"
        for key in inherited:
            lines.append(f"| `{group}.{key}` |  | {types[key]} | {where} |")
    return lines


def header(option_file: Path) -> str:
    """The file's leading comment (its description)."""
    out = []
    for line in option_file.read_text().splitlines():
        if not line.startswith("#"):
            break
        if not line.startswith("# @package"):
            out.append(line.removeprefix("#").strip())
    return " ".join(out)


def render() -> str:
    defaults = default_options()
    out = ["# Configuration reference", "",
           "Generated at every docs build from `conf/` and the typed schema (`rlhf_lab/config/schema.py`) by "
           "`docs/hooks/config_reference.py`: every key of every option of every config group, the value the "
           "option's file sets, its type, and the comment its file gives it. Choose an option with "
           "`rlhf-lab <group>=<option>`, set a key with `rlhf-lab <group>.<key>=<value>`; "
           "`rlhf-lab --cfg job` prints the composed config. An option that builds on another (its defaults "
           "list) lists only the keys it changes. The canned studies (`sweep=<study>`) are on the "
           "[sweeps page](../../sweeps/README.md).", ""]
    top = yaml_file(CONF / "config.yaml")
    out += ["## Top-level keys", "", header(CONF / "config.yaml"), "",
            "| key | value | what it sets |", "|---|---|---|"]
    for key, value, doc, mapping in rows(top, ""):
        out.append(f"| `{key}` | {code('' if mapping else inline(value))} | {text(doc)} |")
    out.append("")
    for group in groups():
        default = defaults.get(group)
        out += [f"## {group}", "", f"Default: `{group}={default}`." if default else "", ""]
        files = sorted((CONF / group).glob("*.yaml"), key=lambda p: (p.stem != default, p.stem))
        for f in files:
            label = f"`{group}={f.stem}`" + (" (default)" if f.stem == default else "")
            out += [f"### {label}", "", f"`conf/{group}/{f.name}`" + (
                f", builds on {', '.join(f'`{group}={b}`' for b in bases(f))}" if bases(f) else "") + ". "
                + text(header(f)), ""]
            out += option_table(group, f) + [""]
    return "\n".join(out) + "\n"


def all_schema_keys() -> set[str]:
    """Every `<group>.<key>` of every schema (the test's list of what the page must name)."""
    from rlhf_lab.config.schema import SCHEMAS

    return {f"{group}.{k}" for (group, _), schema in SCHEMAS.items() for k in schema_keys(schema)}


def on_files(files, config):  # MkDocs hook
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=render()))
    return files


if __name__ == "__main__":
    sys.stdout.write(render())
