"""External datasets (data=jsonl|hf) are held out by prompt, as the world is: every distinct prompt goes to
train, eval or test by a hash of its text, with all its rows; eval and test never share a prompt with each
other or with training, and no evaluation falls back to training prompts. Files shaped like HH-RLHF (no
prompt column, several pairs per conversation) and UltraFeedback (a prompt string beside full
conversations). And the world's prompts, pairs' cache key and evaluation sets are what they were before."""

from __future__ import annotations

import hashlib
import json

import pytest
from omegaconf import OmegaConf

from rlhf_lab.data import external as X
from rlhf_lab.config import data as DS
from rlhf_lab.data import preferences as P
from rlhf_lab.config.errors import ConfigError
from rlhf_lab.config.checks import validate
from rlhf_lab.stages.evaluate import evaluation_prompts
from rlhf_lab.world.splits import hash_bucket, prompt_hash
from tests.conftest import TINY, compose_cfg

PAIRS_PER_PROMPT = 4


def data_cfg(path, **data):
    return OmegaConf.create({"data": {"source": "jsonl", "path": str(path), "eval_fraction": 0.1,
                                      "test_fraction": 0.1, "seed": 0, **data},
                             "policy": {"name_or_path": None},
                             "eval": {"n_prompts": 1000, "n_test_prompts": 1000}})


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def hh_rows(n_prompts: int) -> list[dict]:
    """HH-RLHF's shape: no prompt column; chosen and rejected are whole "\\n\\nHuman: ... \\n\\nAssistant: ..."
    conversations (some of two turns), PAIRS_PER_PROMPT pairs per conversation."""
    out = []
    for i in range(n_prompts):
        head = f"\n\nHuman: question {i}?\n\nAssistant:"
        if i % 3 == 0:
            head = f"\n\nHuman: hello {i}\n\nAssistant: hi\n\nHuman: and question {i}?\n\nAssistant:"
        out += [{"chosen": f"{head} good answer {j}", "rejected": f"{head} bad answer {j}"}
                for j in range(PAIRS_PER_PROMPT)]
    return out


def ultrafeedback_rows(n_prompts: int) -> list[dict]:
    """UltraFeedback's shape: a prompt string beside conversational chosen and rejected that repeat it as the
    user turn; PAIRS_PER_PROMPT pairs (completions of different models) per prompt."""
    conv = lambda p, y: [{"role": "user", "content": p}, {"role": "assistant", "content": y}]  # noqa: E731
    return [{"prompt": f"instruction {i}", "chosen": conv(f"instruction {i}", f"best {j}"),
             "rejected": conv(f"instruction {i}", f"worse {j}"), "score_chosen": 8.0}
            for i in range(n_prompts) for j in range(PAIRS_PER_PROMPT)]


def assert_held_out(cfg, n_prompts: int):
    train, held = P.load_external(DS.external_data(cfg))
    train_p, eval_p, test_p = P.external_prompts(DS.external_data(cfg))
    assert len(set(train_p)) + len(set(eval_p)) + len(set(test_p)) == n_prompts
    assert eval_p and test_p and train_p
    assert not set(eval_p) & set(train_p) and not set(test_p) & set(train_p) and not set(eval_p) & set(test_p)
    assert {p.prompt for p in train} == set(train_p) and {p.prompt for p in held} == set(eval_p)
    assert len(train) == PAIRS_PER_PROMPT * len(train_p) and len(held) == PAIRS_PER_PROMPT * len(eval_p)
    ev, te = evaluation_prompts(cfg, "eval"), evaluation_prompts(cfg, "test")
    assert set(ev) == set(eval_p) and set(te) == set(test_p) and evaluation_prompts(cfg, "ood") == []
    cfg.eval.n_prompts, cfg.eval.n_test_prompts = 2, 3
    assert evaluation_prompts(cfg, "eval") == eval_p[:2] and evaluation_prompts(cfg, "test") == test_p[:3]
    return train_p, eval_p, test_p


def test_hash_bucket_thresholds():
    u = prompt_hash("some prompt")
    assert 0 <= u < 1
    assert hash_bucket("some prompt", u + 1e-9, 0.0) == "train"
    assert hash_bucket("some prompt", u - 1e-9, 2e-9) == "eval"
    assert hash_bucket("some prompt", u - 2e-9, 1e-9) == "test"
    assert u == int.from_bytes(hashlib.sha1(b"some prompt").digest()[:8], "big") / 2.0**64


def test_split_by_prompt_keeps_every_row_of_a_prompt_together_in_row_order():
    ex = [X.Example(f"p{i % 30}", f"c{i}", f"r{i}") for i in range(120)]  # 30 prompts, 4 rows each
    out = P.split_by_prompt(ex, 0.2, 0.2)
    for split, rows in out.items():
        assert rows == [e for e in ex if hash_bucket(e.prompt, 0.6, 0.2) == split]  # order kept
        assert all(sum(e.prompt == p for e in rows) == 4 for p in {e.prompt for e in rows})
    assert sorted(e.chosen for rows in out.values() for e in rows) == sorted(e.chosen for e in ex)


def test_too_few_prompts_fails_with_one_line_saying_how_many(tmp_path):
    f = write_jsonl(tmp_path / "one.jsonl", [{"prompt": "p", "chosen": "a", "rejected": "b"}])
    with pytest.raises(P.TooFewPrompts) as exc:
        P.load_external(DS.external_data(data_cfg(f)))
    msg = str(exc.value)
    assert isinstance(exc.value, ConfigError) and "\n" not in msg
    assert msg.startswith(f"data.path={str(f)!r}: 1 distinct prompt(s)") and "each split needs at least 1" in msg
    assert exc.value.counts == {hash_bucket("p", 0.8, 0.1): 1, **{s: 0 for s in P.HELD_OUT
                                                                   if s != hash_bucket("p", 0.8, 0.1)}}
    with pytest.raises(P.TooFewPrompts, match="1 distinct prompt"):  # a prompt-only dataset too
        P.external_prompts(DS.external_data(data_cfg(f)))


def test_hh_rlhf_shaped_file_is_held_out_by_prompt(tmp_path):
    f = write_jsonl(tmp_path / "hh.jsonl", hh_rows(60))
    cfg = data_cfg(f, columns={"prompt": None, "chosen": "chosen", "rejected": "rejected"})
    train_p, eval_p, test_p = assert_held_out(cfg, 60)
    assert all(p.startswith("Human: ") and p.endswith("Assistant:") for p in train_p + eval_p + test_p)
    assert any("and question" in p for p in eval_p + test_p + train_p)  # the two-turn ones keep their history


def test_ultrafeedback_shaped_file_is_held_out_by_prompt(tmp_path):
    f = write_jsonl(tmp_path / "uf.jsonl", ultrafeedback_rows(60))
    train_p, eval_p, test_p = assert_held_out(data_cfg(f), 60)
    assert all(p.startswith("user: instruction ") for p in train_p + eval_p + test_p)
    train, held = P.load_external(DS.external_data(data_cfg(f)))
    assert train[0].chosen.startswith("best ") and train[0].rejected.startswith("worse ")  # the prompt turn cut


def test_one_pair_per_prompt_eval_and_test_are_disjoint_and_the_split_is_stable(tmp_path):
    rows = [{"prompt": f"prompt {i}", "chosen": "a", "rejected": "b"} for i in range(200)]
    f = write_jsonl(tmp_path / "a.jsonl", rows)
    _, eval_p, test_p = P.external_prompts(DS.external_data(data_cfg(f)))
    assert not set(eval_p) & set(test_p) and 5 < len(eval_p) < 40 and 5 < len(test_p) < 40
    assert eval_p == sorted(eval_p, key=prompt_hash)  # a hash order, not the file's
    g = write_jsonl(tmp_path / "b.jsonl", rows[::-1] + [{"prompt": "new", "chosen": "a", "rejected": "b"}])
    _, eval_g, test_g = P.external_prompts(DS.external_data(data_cfg(g, seed=3)))
    assert set(eval_p) <= set(eval_g) and set(test_p) <= set(test_g)  # by the text: order, seed, more rows


@pytest.mark.parametrize("overrides, line", [
    (["data.eval_fraction=0"], "data.eval_fraction must be in (0, 1), got 0"),
    (["data.test_fraction=1.5"], "data.test_fraction must be in (0, 1), got 1.5"),
    (["data.eval_fraction=0.5", "data.test_fraction=0.5"], "data.test_fraction must be < 1 - data.eval_fraction"),
])
def test_split_fractions_are_checked(overrides, line):
    with pytest.raises(ConfigError) as exc:
        validate(compose_cfg(["data=jsonl", f"data.path={__file__}", *overrides]))
    assert str(exc.value).startswith(line)


# Computed on main at 0370c90 (before external data was split by prompt) with the same code as below: the
# world's prompts, its evaluation sets and the cache keys of its preference pairs and RM must not move.
WORLD_BEFORE = {"prefs_key": "aecd283b69de34e7", "rm_key": "4495f3c51e640e49", "prefs_train": "d41477ff1f5b4f71",
                "prefs_eval": "7bd3d20d22a069b9", "eval": "600810c03c1f06ac", "test": "55e407267e1580ce",
                "ood": "0e891a47ce7b7c82"}


def test_the_world_is_unchanged(monkeypatch, tmp_path):
    from rlhf_lab.world import streams as D
    from rlhf_lab.config import world as W
    from rlhf_lab.stages import gold, pipeline, prefs, presets, rm, sft
    from rlhf_lab.runs import cache as cache_mod
    from rlhf_lab.stages.pipeline import cache_for, stage_module

    def key_only(stage, cfg):  # the artifact's cache path, nothing built
        return cache_for(cfg).path(stage, stage_module(stage).spec(cfg))

    for m in (prefs, rm, sft, pipeline, presets, gold):
        monkeypatch.setattr(m, "ensure", key_only, raising=False)
    # the keys without the code digest (which cache keys hold since issue 46): the specs, which must not move
    monkeypatch.setattr(cache_mod, "stage_code_digest", lambda stage: None)
    cfg = compose_cfg(TINY + [f"cache_dir={tmp_path}", "algo=rm"])
    digest = lambda x: hashlib.sha256(json.dumps(x).encode()).hexdigest()[:16]  # noqa: E731
    now = {"prefs_key": key_only("prefs", cfg).name, "rm_key": key_only("rm", cfg).name,
           "prefs_train": digest(D.prompts(W.world_settings(cfg), "prefs", int(cfg.data.n_train), split="train")),
           "prefs_eval": digest(D.prompts(W.world_settings(cfg), "prefs_eval", int(cfg.data.n_eval), split="eval")),
           **{s: digest(evaluation_prompts(cfg, s)) for s in ("eval", "test", "ood")}}
    assert now == WORLD_BEFORE


def test_a_job_on_too_few_prompts_fails_before_training_anything(tmp_path):
    from rlhf_lab import stages

    f = write_jsonl(tmp_path / "few.jsonl", [{"prompt": f"p{i}", "chosen": "a", "rejected": "b"} for i in range(3)])
    cfg = compose_cfg([o for o in TINY if not o.startswith("data.")] + [
        f"cache_dir={tmp_path / 'cache'}", f"tracking.uri=sqlite:///{tmp_path / 'm.db'}",
        "algo=rm", "data=jsonl", f"data.path={f}"])
    from rlhf_lab.data.errors import DataError

    with pytest.raises(DataError, match="3 distinct prompt") as err:  # the CLI's one line, exit 2
        stages.run_job(cfg, tmp_path / "out")
    assert isinstance(err.value.__cause__, P.TooFewPrompts)
    assert not (tmp_path / "cache" / "pretrain").exists() and not (tmp_path / "m.db").exists()  # nothing ran
