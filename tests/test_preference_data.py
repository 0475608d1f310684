"""Every row of a JSONL preference file is checked; a bad row fails the job naming the file and line."""

from __future__ import annotations

import json

import pytest

from rlhf_lab.config import data as DS
from rlhf_lab.data import preferences as P

GOOD = json.dumps({"prompt": "p", "chosen": "good answer", "rejected": "bad answer"})


def write(tmp_path, *lines, raw: bytes = b""):
    f = tmp_path / "pairs.jsonl"
    f.write_bytes(("\n".join(lines) + "\n").encode() + raw)
    return f


@pytest.mark.parametrize("bad, match", [
    (json.dumps({"prompt": "p", "chosen": "a"}), r"lacks column\(s\) \['rejected'\]"),
    (json.dumps({"prompt": "p", "chosen": None, "rejected": "b"}), "chosen is null"),
    (json.dumps({"prompt": "p", "chosen": "a", "rejected": 3}), "rejected is int, not a string"),
    (json.dumps({"prompt": "", "chosen": "a", "rejected": "b"}), "prompt is empty"),
    (json.dumps({"prompt": "p", "chosen": "a", "rejected": "   "}), "rejected is empty"),
    (json.dumps({"prompt": "p", "chosen": "same", "rejected": "same"}), "chosen == rejected"),
    ('{"prompt": "p", "chosen": "a", "rejected": ', "invalid JSON"),
    ("[1, 2]", "not a JSON object"),
])
def test_bad_row_fails_naming_file_and_line(tmp_path, bad, match):
    f = write(tmp_path, GOOD, "", bad, GOOD)
    with pytest.raises(ValueError, match=match) as exc:
        P.read_jsonl(f)
    assert f"{f}:3: " in str(exc.value) and "1 bad row(s) of 3" in str(exc.value)


def test_non_utf8_row(tmp_path):
    f = write(tmp_path, GOOD, raw=b'{"prompt": "caf\xe9", "chosen": "a", "rejected": "b"}\n')
    with pytest.raises(ValueError, match=r"pairs.jsonl:2: not UTF-8"):
        P.read_jsonl(f)


def test_many_bad_rows_are_listed_up_to_a_limit(tmp_path):
    f = write(tmp_path, *["{oops"] * 25, GOOD)
    with pytest.raises(ValueError) as exc:
        P.read_jsonl(f)
    msg = str(exc.value)
    assert "25 bad row(s) of 26" in msg and f"{f}:10: " in msg and f"{f}:11: " not in msg
    assert "... and 15 more" in msg


def test_good_file_and_blank_lines(tmp_path):
    f = write(tmp_path, GOOD, "", "  ", json.dumps({"prompt": "q", "chosen": "x", "rejected": "y", "extra": 1}))
    pairs = P.read_jsonl(f)
    assert [(p.prompt, p.chosen, p.rejected) for p in pairs] == [("p", "good answer", "bad answer"), ("q", "x", "y")]
    assert all(p.source == "external" for p in pairs)


def test_empty_and_missing_file(tmp_path):
    with pytest.raises(ValueError, match="empty"):
        P.read_jsonl(write(tmp_path, "", ""))
    with pytest.raises(FileNotFoundError, match="no such file"):
        P.read_jsonl(tmp_path / "nope.jsonl")


def test_load_external_uses_the_checks(tmp_path):
    from omegaconf import OmegaConf

    f = write(tmp_path, GOOD, json.dumps({"prompt": "p", "chosen": "a", "rejected": None}))
    cfg = OmegaConf.create({"data": {"source": "jsonl", "path": str(f), "eval_fraction": 0.1, "seed": 0}})
    with pytest.raises(ValueError, match=r"pairs.jsonl:2: rejected is null"):
        P.load_external(DS.external_data(cfg))
