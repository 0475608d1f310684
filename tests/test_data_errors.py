"""A dataset the job cannot use: one line naming file and line, no traceback, exit 2; the stage that first reads
the data has a FAILED run with that line as its error when it reads inside its run (the pretraining stage's evaluation
prompts), no run when it reads before (the RM's pairs)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import mlflow
import pytest

from rlhf_lab.data.errors import DataError, data_errors
from rlhf_lab.config import data as DS
from rlhf_lab.data.preferences import read_jsonl
from tests import cli_process
from tests.conftest import TINY

ROOT = Path(__file__).resolve().parents[1]
GOOD = {"prompt": "Review: the lamp", "chosen": " It is great.", "rejected": " bad"}


def write_rows(path: Path, bad_line: int = 2, n: int = 4) -> Path:
    lines = [json.dumps(GOOD) for _ in range(n)]
    lines[bad_line - 1] = '{"prompt": "x", "chosen": '  # not JSON
    path.write_text("\n".join(lines) + "\n")
    return path


def test_data_errors_are_one_line_naming_file_and_line(tmp_path):
    f = write_rows(tmp_path / "pairs.jsonl", bad_line=2)
    with pytest.raises(DataError) as exc, data_errors():
        read_jsonl(f)
    text = str(exc.value)
    assert "\n" not in text and f"{f}:2" in text and "1 bad row(s) of 4; fix or remove them: " in text
    assert isinstance(exc.value.__cause__, ValueError)  # the data layer's own error, kept as the cause
    with pytest.raises(DataError, match="no such file"), data_errors():
        read_jsonl(tmp_path / "absent.jsonl")


@pytest.mark.slow
def test_cli_bad_rows_exit_2_with_one_line_and_no_run(tmp_path, session_cache):
    f = write_rows(tmp_path / "pairs.jsonl", bad_line=3)
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("HYDRA_FULL_ERROR", None)
    r = cli_process.run(["algo=rm", *[o for o in TINY if not o.startswith("data.")], "data=jsonl", f"data.path={f}",
                         f"cache_dir={session_cache}"], cwd=tmp_path, env=env, timeout=900)
    assert r.returncode == 2, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("rlhf-lab: data error:")]
    assert len(errors) == 1 and f"{f}:3" in errors[0], r.stderr[-3000:]
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["rlhf-lab"]) if (tmp_path / "mlflow.db").exists() else []
    for _, run in (runs.iterrows() if len(runs) else []):  # none FINISHED or RUNNING past the bad data
        assert run["tags.rlhf_lab.stage"] != "rm"
        assert run["status"] == "FINISHED" or (run["status"] == "FAILED" and f"{f}:3" in run["tags.rlhf_lab.error"])


# -- bounds on the input (rlhf_lab/data/files.py) and every data error naming its row ----------------------------


def load(tmp_path, overrides):
    """`load_examples` of a config composed with `overrides`, its errors as the CLI gets them (DataError)."""
    from rlhf_lab.data.preferences import EXAMPLES_MEMO, load_examples
    from tests.conftest import compose_cfg

    EXAMPLES_MEMO.clear()
    with data_errors():
        return load_examples(DS.external_data(compose_cfg(overrides)))


def many_rows(n: int = 40) -> list[str]:
    return [json.dumps({**GOOD, "prompt": f"Review {i}: the lamp"}) for i in range(n)]


def test_an_over_long_line_is_a_bad_row_named_with_its_size_and_the_key_to_raise(tmp_path):
    lines = many_rows()
    lines[4] = json.dumps({**GOOD, "chosen": "x" * 50_000})
    f = tmp_path / "pairs.jsonl"
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as exc:
        load(tmp_path, ["data=jsonl", f"data.path={f}", "data.max_line_bytes=1000"])
    text = str(exc.value)
    size = len(lines[4].encode())
    assert "\n" not in text and "1 bad row(s) of 40" in text
    assert f"{f}:5: a line of {size} bytes (48.9 KiB), over data.max_line_bytes=1000 (1000 B): not read" in text
    assert "raise data.max_line_bytes" in text
    assert len(load(tmp_path, ["data=jsonl", f"data.path={f}", "data.max_line_bytes=null"])["train"]) > 0


def test_an_over_long_line_is_never_held_whole(monkeypatch):
    import io

    from rlhf_lab.data import files as data_files

    class Reads(io.BytesIO):
        sizes: list[int] = []

        def readline(self, size=-1):
            out = super().readline(size)
            self.sizes.append(len(out))
            return out

    monkeypatch.setattr(data_files, "SKIP_CHUNK", 64)
    f = Reads(b"a" * 100 + b"\n" + b"b" * 101 + b"\n" + b"c" * 10_000 + b"\n" + b"d" * 101)
    got = [(i, raw, size) for i, raw, size in data_files.bounded_lines(f, 100)]
    assert got == [(1, b"a" * 100 + b"\n", 100), (2, None, 101), (3, None, 10_000), (4, None, 101)]
    assert max(Reads.sizes) <= 101  # the limit + 1 byte, then chunks of SKIP_CHUNK: never a whole long line


def test_a_file_over_the_total_bound_is_refused_before_its_first_line(tmp_path):
    f = tmp_path / "pairs.jsonl"
    f.write_text('{"prompt": "x", "chosen": \n' + "\n".join(many_rows()) + "\n")  # a bad first line: never read
    with pytest.raises(DataError) as exc:
        load(tmp_path, ["data=jsonl", f"data.path={f}", "data.max_total_bytes=1000"])
    size = f.stat().st_size
    assert str(exc.value).startswith(f"data.path='{f}': {size} bytes (")
    assert "over data.max_total_bytes=1000 (1000 B): nothing read; raise data.max_total_bytes" in str(exc.value)


def test_the_default_bounds_are_in_force(tmp_path):
    from rlhf_lab.data import files as data_files
    from tests.conftest import compose_cfg

    for source in ("jsonl", "hf"):
        dc = compose_cfg([f"data={source}"]).data
        assert dc.max_total_bytes == data_files.MAX_TOTAL_BYTES == 4 * 2**30
    assert compose_cfg(["data=jsonl"]).data.max_line_bytes == data_files.MAX_LINE_BYTES == 4 * 2**20
    lines = many_rows()
    lines[2] = json.dumps({**GOOD, "chosen": "x" * data_files.MAX_LINE_BYTES})  # 4 MiB and a few bytes
    f = tmp_path / "pairs.jsonl"
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=rf"{f}:3: a line of {len(lines[2])} bytes \(4.0 MiB\), over "
                                        r"data.max_line_bytes=4194304 \(4.0 MiB\)"):
        load(tmp_path, ["data=jsonl", f"data.path={f}"])


def test_a_lone_surrogate_names_its_file_and_line(tmp_path):
    lines = many_rows()
    lines[2] = '{"prompt": "x\\ud800y", "chosen": "a", "rejected": "b"}'
    lines[3] = '{"prompt": "a smile \\ud83d\\ude00", "chosen": "a", "rejected": "b"}'  # a whole pair: a good row
    f = tmp_path / "pairs.jsonl"
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as exc:
        load(tmp_path, ["data=jsonl", f"data.path={f}"])
    assert "1 bad row(s) of 40" in str(exc.value) and f"{f}:3: prompt holds a lone surrogate \\ud800" in str(exc.value)
    lines[2] = '{"prompt": "x", "chosen": [{"role": "assistant", "content": "\\udc00"}], "rejected": "b"}'
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=rf"{f}:3: chosen\[0\].content holds a lone surrogate \\udc00"):
        load(tmp_path, ["data=jsonl", f"data.path={f}", "data.format=standard"])


@pytest.mark.parametrize("bad, what", [
    ('{"prompt": "x", "chosen": ', "invalid JSON (Expecting value at column 28)"),
    ('{"prompt": "x\\ud800y", "chosen": "a", "rejected": "b"}', "prompt holds a lone surrogate \\ud800"),
])
def test_a_json_file_that_datasets_cannot_read_names_its_line(tmp_path, bad, what):
    lines = many_rows()
    lines[2] = bad
    f = tmp_path / "pairs.jsonl"
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as exc:
        load(tmp_path, ["data=hf", f"data.name={f}"])
    text = str(exc.value)
    assert "\n" not in text and text.startswith(f"data.name='{f}': datasets could not read it (")
    assert text.endswith(f"; the first bad line: {f}:3: {what}" + ("" if "JSON" in what else ": JSON text for half a "
                         "character (its pair is missing), which no UTF-8 text can hold; fix the text")), text


def test_a_local_hf_dataset_over_the_total_bound_is_refused_before_it_is_read(tmp_path, monkeypatch):
    import datasets

    ds = datasets.Dataset.from_list([json.loads(line) for line in many_rows()])
    datasets.DatasetDict({"train": ds, "test": ds.select(range(3))}).save_to_disk(str(tmp_path / "saved"))
    ds.to_parquet(str(tmp_path / "pairs.parquet"))
    split_size = sum(p.stat().st_size for p in (tmp_path / "saved" / "train").rglob("*") if p.is_file())
    for name, size in (("saved", split_size), ("pairs.parquet", (tmp_path / "pairs.parquet").stat().st_size)):
        assert len(load(tmp_path, ["data=hf", f"data.name={tmp_path / name}"])["train"]) > 0

    def never(*args, **kwargs):
        raise AssertionError("read")

    monkeypatch.setattr(datasets, "load_from_disk", never)
    monkeypatch.setattr(datasets, "load_dataset", never)
    for name, size in (("saved", split_size), ("pairs.parquet", (tmp_path / "pairs.parquet").stat().st_size)):
        with pytest.raises(DataError) as exc:
            load(tmp_path, ["data=hf", f"data.name={tmp_path / name}", "data.max_total_bytes=1000"])
        assert str(exc.value).startswith(f"data.name='{tmp_path / name}': {size} bytes (")
        assert "over data.max_total_bytes=1000 (1000 B): nothing read" in str(exc.value)


def test_an_over_long_row_through_data_hf_is_refused_before_it_is_converted(tmp_path, monkeypatch):
    """A 20 MB line through data=hf was accepted (3 GB of memory as it was rendered and tokenized): data.max_line_bytes
    bounds data=hf too. A .jsonl file's long line is refused before `datasets` reads the file (read in bounded
    pieces), a long row of a parquet file or save_to_disk folder is a bad row named ``name[split] row i``."""
    import datasets

    from rlhf_lab.data import external as X

    lines = many_rows()
    lines[4] = json.dumps({**GOOD, "chosen": "x" * 5000})
    f = tmp_path / "pairs.jsonl"
    f.write_text("\n".join(lines) + "\n")
    ds = datasets.Dataset.from_list([json.loads(line) for line in lines])
    ds.to_parquet(str(tmp_path / "pairs.parquet"))
    ds.save_to_disk(str(tmp_path / "saved"))
    assert len(load(tmp_path, ["data=hf", f"data.name={f}"])["train"]) > 0  # 5 kB: under the default 4 MiB
    convert = X.convert
    monkeypatch.setattr(X, "convert", lambda row, *a, **k: pytest.fail("a long row was converted")
                        if len(json.dumps(row)) > 1000 else convert(row, *a, **k))
    with pytest.raises(DataError) as exc:
        load(tmp_path, ["data=hf", f"data.name={f}", "data.max_line_bytes=1000"])
    assert str(exc.value).startswith(f"data.name='{f}': {f}:5: a line of {len(lines[4])} bytes (")
    assert "over data.max_line_bytes=1000 (1000 B): not read; raise data.max_line_bytes" in str(exc.value)
    for name in ("pairs.parquet", "saved"):
        with pytest.raises(DataError) as exc:
            load(tmp_path, ["data=hf", f"data.name={tmp_path / name}", "data.max_line_bytes=1000"])
        assert f"{tmp_path / name}[train] row 4: a row of 50" in str(exc.value), str(exc.value)
        assert "over data.max_line_bytes=1000 (1000 B)" in str(exc.value) and "\n" not in str(exc.value)


def test_the_size_bounds_change_no_key(monkeypatch):
    """They only refuse data: the keys of a job on external data (its config digest, a pre-empted job's checkpoint,
    the start evaluation, DPO's artifact) are those of the config without them, as before they existed."""
    from omegaconf import OmegaConf

    from rlhf_lab.config.keys import NOT_COMPUTED, drop_keys, to_plain
    from rlhf_lab.stages import dpo
    from tests.conftest import compose_cfg

    cfg = compose_cfg(["algo=dpo", "data=jsonl", f"data.path={__file__}", "data.max_line_bytes=1000"])
    assert {"max_line_bytes", "max_total_bytes"} <= set(cfg.data)
    old = OmegaConf.create(to_plain(cfg))
    del old.data["max_line_bytes"], old.data["max_total_bytes"]
    assert drop_keys(to_plain(cfg), NOT_COMPUTED) == drop_keys(to_plain(old), NOT_COMPUTED)
    monkeypatch.setattr(dpo, "ensure", lambda stage, cfg: "/the/sft")
    assert dpo.spec(cfg) == dpo.spec(old)


@pytest.mark.slow
@pytest.mark.parametrize("bad, extra, what", [
    (json.dumps({**GOOD, "chosen": "x" * 5000}), ["data.max_line_bytes=1000"], "over data.max_line_bytes=1000"),
    ('{"prompt": "x\\ud800y", "chosen": "a", "rejected": "b"}', [], "prompt holds a lone surrogate \\ud800"),
], ids=["long_line", "lone_surrogate"])
def test_cli_bounds_and_surrogates_exit_2_with_file_and_line(tmp_path, session_cache, bad, extra, what):
    lines = many_rows()
    lines[2] = bad
    f = tmp_path / "pairs.jsonl"
    f.write_text("\n".join(lines) + "\n")
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("HYDRA_FULL_ERROR", None)
    r = cli_process.run(["algo=rm", *[o for o in TINY if not o.startswith("data.")], "data=jsonl", f"data.path={f}",
                         *extra, f"cache_dir={session_cache}"], cwd=tmp_path, env=env, timeout=900)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("rlhf-lab: data error:")]
    assert len(errors) == 1 and f"{f}:3: " in errors[0] and what in errors[0], r.stderr[-3000:]
