"""Where an external dataset's rows come from (``data=jsonl``, ``data=hf``), read within bounds, every row named.

``data=jsonl`` (:func:`jsonl_rows`): a JSON-lines file read line by line, each row named ``file:line``; a line that is
not UTF-8, not JSON, holds a lone surrogate, or is longer than ``data.max_line_bytes`` (read in pieces, never held
whole) is a bad row. ``data=hf`` (:func:`load_hf_dataset`): a ``save_to_disk`` folder, a ``.parquet``, ``.jsonl`` or
``.json`` file, or a hub dataset, rows named ``name[split] row i``; a row larger than ``data.max_line_bytes``
(:func:`row_bytes`) is a bad row, never converted or tokenized (a 20 MB row once took 3 GB). A local file or folder
larger than ``data.max_total_bytes`` is refused before it is read (a hub dataset's size is not known before it is
downloaded).

The default bounds (``conf/data/*.yaml``, mirrored by :data:`MAX_LINE_BYTES` and :data:`MAX_TOTAL_BYTES`) are far
above real preference data (a long chat row is a few hundred KB, HH-RLHF and UltraFeedback a few hundred MB as JSON
lines), while a job holds every row several times over, as text and token ids (a 50 MB line once took 12 GB);
``null`` switches a bound off. Imports only :class:`~rlhf_lab.data.external.BadRow` from rlhf_lab; no torch.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from rlhf_lab.data.external import BadRow

MAX_LINE_BYTES = 4 * 2**20  # data.max_line_bytes: 4 MiB
MAX_TOTAL_BYTES = 4 * 2**30  # data.max_total_bytes: 4 GiB
SKIP_CHUNK = 2**20  # an over-long line is skipped this many bytes at a time
SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")  # JSON's \uD800-\uDFFF: half of a pair
SURROGATE = re.compile("[\ud800-\udfff]")  # such a half left alone in a decoded string


def human_bytes(n: int) -> str:
    """``n`` bytes for a reader: ``512 B``, ``3.0 KiB``, ``50.0 MiB``, ``4.0 GiB``."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def check_total_size(size: int, limit: int | None, what: str) -> None:
    """Raise ValueError naming `what` (``data.path='…'``), its `size` and ``data.max_total_bytes`` when it is over
    `limit` (None: no limit)."""
    if limit is not None and size > limit:
        raise ValueError(f"{what}: {size} bytes ({human_bytes(size)}), over data.max_total_bytes={limit} "
                         f"({human_bytes(limit)}): nothing read; raise data.max_total_bytes (null: no limit) if this "
                         "machine's memory holds several times that, or use a smaller file")


def bounded_lines(f: BinaryIO, limit: int | None) -> Iterator[tuple[int, bytes | None, int]]:
    """(line number from 1, the line's bytes or None when over `limit`, its size without the line end) for each line
    of the binary file `f`. A line over `limit` bytes is read at most ``limit + 1`` bytes, then skipped in chunks of
    :data:`SKIP_CHUNK`, counted but never held whole."""
    i = 0
    while True:
        raw = f.readline() if limit is None else f.readline(limit + 1)
        if not raw:
            return
        i += 1
        if limit is None or raw.endswith(b"\n") or len(raw) <= limit:
            yield i, raw, len(raw) - raw.endswith(b"\n")
            continue
        size = len(raw)
        while chunk := f.readline(SKIP_CHUNK):
            size += len(chunk) - chunk.endswith(b"\n")
            if chunk.endswith(b"\n"):
                break
        yield i, None, size


def lone_surrogate(value: Any, field: str = "") -> str | None:
    """Where a string of a decoded row (or a key) holds a lone surrogate, and which one (None: no string does).
    `field` is the path to `value`: ``prompt``, ``chosen[1].content``."""
    if isinstance(value, str):
        bad = SURROGATE.search(value)
        return None if bad is None else f"{field or 'the row'} holds a lone surrogate \\u{ord(bad.group()):04x}"
    if isinstance(value, dict):
        children = [(f"{field}.{k}" if field else str(k), k, v) for k, v in value.items()]
    elif isinstance(value, list):
        children = [(f"{field}[{j}]", None, v) for j, v in enumerate(value)]
    else:
        return None
    for sub, key, v in children:
        found = (lone_surrogate(key, f"a key of {field or 'the row'}") if isinstance(key, str) else None
                 ) or lone_surrogate(v, sub)
        if found:
            return found
    return None


def decode_row(raw: bytes) -> Any:
    """One line's row, or :class:`BadRow` (not UTF-8, not JSON, a lone surrogate); None for a blank line."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        return BadRow(f"not UTF-8 ({err.reason} at byte {err.start})")
    if not line.strip():
        return None
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        return BadRow(f"invalid JSON ({err.msg} at column {err.pos + 1})")  # colno counts from the line end
    problem = lone_surrogate(row) if SURROGATE_ESCAPE.search(line) else None
    if problem:
        return BadRow(f"{problem}: JSON text for half a character (its pair is missing), which no UTF-8 text can hold; "
                      "fix the text")
    return row


def jsonl_rows(path: Path, max_line_bytes: int | None = MAX_LINE_BYTES, max_total_bytes: int | None = MAX_TOTAL_BYTES
               ) -> Iterator[tuple[str, Any]]:
    """(``file:line``, decoded row or :class:`BadRow`) for each non-blank line of a JSON-lines file; a line over
    `max_line_bytes` is a bad row (read in bounded pieces, never whole); a file over `max_total_bytes` raises
    ValueError before its first line is read (:func:`check_total_size`)."""
    path = Path(path)
    check_total_size(path.stat().st_size, max_total_bytes, f"data.path={str(path)!r}")
    with open(path, "rb") as f:
        for i, raw, size in bounded_lines(f, max_line_bytes):
            where = f"{path}:{i}"
            if raw is None:
                yield where, BadRow(over_line_bound(size, max_line_bytes))
                continue
            row = decode_row(raw)
            if row is not None:
                yield where, row


def over_line_bound(size: int, limit: int, what: str = "a line") -> str:
    """A bad row's text: `what` of `size` bytes is over ``data.max_line_bytes`` (`limit`)."""
    return (f"{what} of {size} bytes ({human_bytes(size)}), over data.max_line_bytes={limit} ({human_bytes(limit)}): "
            "not read; raise data.max_line_bytes (null: no limit) if the row is real")


def first_long_line(path: Path, limit: int | None) -> tuple[int, int] | None:
    """(line number from 1, size) of the first line of the file at `path` longer than `limit` bytes, read in bounded
    pieces (:func:`bounded_lines`); None when there is none or no limit."""
    if limit is None:
        return None
    with open(path, "rb") as f:
        return next(((i, size) for i, raw, size in bounded_lines(f, limit) if raw is None), None)


def row_bytes(row: Any) -> int:
    """How large a row of a dataset is, as text: the UTF-8 bytes of its strings (keys too), 8 for any other value,
    its lists and dicts walked without recursion."""
    total, todo = 0, [row]
    while todo:
        v = todo.pop()
        if isinstance(v, str):
            total += len(v) if v.isascii() else len(v.encode("utf-8", "surrogatepass"))
        elif isinstance(v, dict):
            todo += [*v.keys(), *v.values()]
        elif isinstance(v, (list, tuple)):
            todo += v
        else:
            total += 8
    return total


def is_local(name: str) -> bool:
    """Whether ``data.name`` names a local file or folder (it exists, or is written as a path)."""
    return Path(name).expanduser().exists() or name.startswith((".", "/", "~"))


def local_size(p: Path, split: str) -> int:
    """Bytes of a local dataset: a file's size, or the files of a save_to_disk folder (a DatasetDict's `split`)."""
    if p.is_file():
        return p.stat().st_size
    if (p / "dataset_dict.json").is_file() and (p / split).is_dir():
        p = p / split
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def first_bad_line(p: Path) -> str | None:
    """``file:line: what`` of the first bad line of a JSON(-lines) file, scanned as JSON lines; a file whose first
    line is no JSON value is read as one JSON document instead (:func:`document_error`). None: no bad line found."""
    for n, (where, row) in enumerate(jsonl_rows(p, max_total_bytes=None)):
        if isinstance(row, BadRow):
            return document_error(p) if n == 0 and str(row).startswith("invalid JSON") else f"{where}: {row}"
    return None


def document_error(p: Path) -> str | None:
    """``file:line: what`` of a JSON document that does not parse, ``file: what`` for a lone surrogate in it; None
    when it is good JSON."""
    try:
        doc = json.loads(p.read_bytes())
    except json.JSONDecodeError as err:
        return f"{p}:{err.lineno}: invalid JSON ({err.msg} at column {err.colno})"
    except UnicodeDecodeError as err:
        return f"{p}: not UTF-8 ({err.reason} at byte {err.start})"
    problem = lone_surrogate(doc)
    return f"{p}: {problem}" if problem else None


def load_local_file(p: Path, name: str):
    """A parquet or JSON(L) file read by ``datasets``; what it cannot read raises ValueError naming the file and, for
    JSON, the first bad line (:func:`first_bad_line`)."""
    import datasets

    try:
        return datasets.load_dataset("parquet" if p.suffix == ".parquet" else "json", data_files=str(p), split="train")
    except Exception as err:  # DatasetGenerationError, ArrowInvalid, ValueError, ... (their types vary)
        cause = err
        while cause.__cause__ is not None:
            cause = cause.__cause__
        first = (str(cause).splitlines() or [type(cause).__name__])[0][:200]
        where = first_bad_line(p) if p.suffix != ".parquet" else None
        raise ValueError(f"data.name={name!r}: datasets could not read it ({type(cause).__name__}: {first})"
                         + (f"; the first bad line: {where}" if where else "")) from err


def load_hf_dataset(name: str, split: str, max_total_bytes: int | None = MAX_TOTAL_BYTES,
                    max_line_bytes: int | None = MAX_LINE_BYTES):
    """A ``datasets.Dataset``: a save_to_disk folder, a parquet/JSON(L) file, or a hub dataset, by ``data.name``; a
    local one over `max_total_bytes`, or a ``.jsonl`` file with a line over `max_line_bytes`, raises ValueError before
    it is read."""
    import datasets

    p = Path(name).expanduser()
    saved = p.is_dir() and any((p / f).exists() for f in ("dataset_dict.json", "state.json", "dataset_info.json"))
    if saved or (p.is_file() and p.suffix in (".parquet", ".jsonl", ".json")):
        check_total_size(local_size(p, split), max_total_bytes, f"data.name={name!r}")
    long = first_long_line(p, max_line_bytes) if p.is_file() and p.suffix == ".jsonl" else None
    if long is not None:
        raise ValueError(f"data.name={name!r}: {p}:{long[0]}: {over_line_bound(long[1], max_line_bytes)}")
    if saved:
        ds = datasets.load_from_disk(str(p))
    elif p.is_file() and p.suffix in (".parquet", ".jsonl", ".json"):
        ds = load_local_file(p, name)
    elif is_local(name):
        raise FileNotFoundError(f"data.name={name!r}: not a folder written by save_to_disk, a .parquet, .jsonl "
                                "or .json file")
    else:
        try:
            ds = datasets.load_dataset(name, split=split)
        except Exception as err:  # offline: ConnectionError, DatasetNotFoundError, ... (their types vary)
            first = str(err).splitlines()[0] if str(err) else ""
            raise OSError(f"data.name={name!r}: could not load it from the Hugging Face hub ({type(err).__name__}: "
                          f"{first[:200]}). This machine may not reach the hub: use a local save_to_disk folder, "
                          "a .parquet or a .jsonl file") from err
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise ValueError(f"data.split={split!r}: {name} has the splits {sorted(ds)}")
        ds = ds[split]
    return ds


def dataset_rows(ds, label: str, max_row_bytes: int | None = MAX_LINE_BYTES) -> Iterator[tuple[str, Any]]:
    """(``name[split] row i``, row) for each row of a ``datasets.Dataset``, 0-based; a row larger than
    `max_row_bytes` (``data.max_line_bytes``, :func:`row_bytes`) is a :class:`BadRow` instead."""
    for i, row in enumerate(ds):
        size = row_bytes(row) if max_row_bytes is not None else 0
        yield f"{label} row {i}", (BadRow(over_line_bound(size, max_row_bytes, "a row")) if size > (max_row_bytes or 0)
                                   else row)
