"""External datasets (data=jsonl|hf): TRL's standard and conversational formats, column mapping, chat
rendering, prompt-only data, save_to_disk folders and parquet files, and the row checks on every format."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from rlhf_lab.data import external as X
from rlhf_lab.config import data as DS
from rlhf_lab.data import preferences as P
from tests.conftest import compose_cfg

MSG = lambda role, text: {"role": role, "content": text}  # noqa: E731


def rows(*rs):
    return [(f"r{i}", r) for i, r in enumerate(rs)]


def examples(rs, columns=None, fmt="auto", renderer=None, prompt_only=False):
    return X.read_examples(rows(*rs), {**X.DEFAULT_COLUMNS, **(columns or {})}, fmt, (lambda: renderer) if renderer else None,
                           prompt_only=prompt_only)


def test_standard_rows_with_mapped_columns():
    cols = {"prompt": "question", "chosen": "good", "rejected": "bad"}
    ex = examples([{"question": "q?", "good": "yes", "bad": "no", "other": 1}], columns=cols)
    assert ex == [X.Example("q?", "yes", "no")]


def test_conversational_explicit_prompt_is_rendered_and_the_response_cut_after_it():
    r = X.ChatRenderer("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{{ eos_token }}{% endfor %}"
                       "{% if add_generation_prompt %}<assistant>{% endif %}", eos_token="</e>")
    ex = examples([{"prompt": [MSG("system", "be nice"), MSG("user", "hi")], "chosen": [MSG("assistant", "hello")],
                    "rejected": [MSG("assistant", "go away")]}], renderer=r)
    assert ex == [X.Example("<system>be nice</e><user>hi</e><assistant>", "hello", "go away")]  # EOS text stripped


def test_implicit_prompt_and_ultrafeedback_style_rows():
    conv = lambda y: [MSG("user", "hi"), MSG("assistant", y)]  # noqa: E731
    implicit = examples([{"chosen": conv("hello"), "rejected": conv("bye")}],
                        columns={"prompt": None, "chosen": "chosen", "rejected": "rejected"})
    assert implicit == [X.Example("user: hi\nassistant:", "hello", "bye")]  # the default template
    uf = examples([{"instruction": "hi", "chosen": conv("hello"), "rejected": conv("bye")}],
                  columns={"prompt": "instruction"})
    assert uf == implicit  # a string prompt is one user message, stripped from the full conversations


def test_hh_rlhf_style_strings_without_a_prompt_column():
    c = "\n\nHuman: what is 2+2?\n\nAssistant: 4, of course."
    r = "\n\nHuman: what is 2+2?\n\nAssistant: 5."
    ex = examples([{"chosen": c, "rejected": r}], columns={"prompt": None})
    assert ex == [X.Example("Human: what is 2+2?\n\nAssistant:", "4, of course.", "5.")]
    with pytest.raises(ValueError, match=r"r0: no prompt column.*data.columns.prompt"):
        examples([{"chosen": "a b", "rejected": "c d"}], columns={"prompt": None})


def test_prompt_only_rows():
    ex = examples([{"prompt": [MSG("user", "hi")]}, {"prompt": [MSG("user", "yo")], "chosen": None}],
                  prompt_only=True)
    assert [e.prompt for e in ex] == ["user: hi\nassistant:", "user: yo\nassistant:"] and ex[0].chosen is None
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['chosen', 'rejected'\]"):
        examples([{"prompt": "p"}])  # pairs needed (rm, dpo)


@pytest.mark.parametrize("bad, match", [
    ({"prompt": [MSG("user", "p")], "chosen": "a", "rejected": [MSG("assistant", "b")]}, "chosen is str, not a list"),
    ({"prompt": [MSG("user", "p")], "chosen": [], "rejected": [MSG("assistant", "b")]}, "chosen is an empty list"),
    ({"prompt": [MSG("user", "p")], "chosen": [{"role": "assistant"}], "rejected": [MSG("assistant", "b")]},
     r"chosen\[0\].content is missing"),
    ({"prompt": [MSG("user", "p")], "chosen": [MSG("assistant", 3)], "rejected": [MSG("assistant", "b")]},
     r"chosen\[0\].content is int"),
    ({"prompt": [MSG("user", "p")], "chosen": [MSG("assistant", " ")], "rejected": [MSG("assistant", "b")]},
     "chosen is empty"),
    ({"prompt": [MSG("user", "p")], "chosen": [MSG("assistant", "x")], "rejected": [MSG("assistant", "x")]},
     "chosen == rejected"),
    ({"prompt": "", "chosen": [MSG("assistant", "x")], "rejected": [MSG("assistant", "y")]}, "prompt is empty"),
    ({"chosen": [MSG("user", "p"), MSG("assistant", "x")], "rejected": [MSG("user", "q"), MSG("assistant", "y")]},
     "lacks column"),
])
def test_bad_conversational_rows_fail_naming_the_row(bad, match):
    good = {"prompt": [MSG("user", "p")], "chosen": [MSG("assistant", "a")], "rejected": [MSG("assistant", "b")]}
    with pytest.raises(ValueError, match=match) as exc:
        examples([good, bad, good])
    assert "1 bad row(s) of 3" in str(exc.value) and "r1: " in str(exc.value)


def test_a_format_mismatch_and_an_unknown_format_are_errors():
    with pytest.raises(ValueError, match=r"r1: chosen is list, not a string \(data.format=standard\)"):
        examples([{"prompt": "p", "chosen": "a", "rejected": "b"}, {"prompt": "p", "chosen": [MSG("a", "x")],
                                                                   "rejected": "b"}])
    with pytest.raises(ValueError, match="data.format='chat'"):
        examples([{"prompt": "p", "chosen": "a", "rejected": "b"}], fmt="chat")


def test_a_template_that_does_not_extend_the_prompt_is_a_row_error():
    r = X.ChatRenderer("{% for m in messages %}{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}>>"
                       "{% endif %}")
    with pytest.raises(ValueError, match="data.chat_template"):
        examples([{"prompt": [MSG("user", "p")], "chosen": [MSG("assistant", "a")],
                   "rejected": [MSG("assistant", "b")]}], renderer=r)


@pytest.mark.parametrize("template, error", [
    ("{{ messages[1].content.upper() }}", "UndefinedError: list object has no element 1"),
    ("{{ messages | length + 'x' }}", "TypeError: unsupported operand type(s) for +: 'int' and 'str'"),
])
def test_a_template_that_fails_on_a_row_names_the_row(template, error):
    """The template engine's own error (a message the template expects and the row lacks, ...) was raised as it was,
    without the row (a traceback from the CLI)."""
    r = X.ChatRenderer("{% for m in messages %}{{ m['content'] }}{% endfor %}" + template)
    with pytest.raises(ValueError) as exc:
        examples([{"prompt": [MSG("user", "p")], "chosen": [MSG("assistant", "a")], "rejected": [MSG("assistant", "b")]}],
                 renderer=r)
    assert f"r0: the chat template fails on these messages ({error}); fix the row or data.chat_template" in str(exc.value)


def data_cfg(tmp_path, **data):
    return OmegaConf.create({"data": {"eval_fraction": 0.25, "test_fraction": 0.25, "seed": 0, **data},
                             "policy": {"name_or_path": None}})


def test_jsonl_conversational_file_rendered_with_the_checkpoint_chat_template(tmp_path, arch_checkpoints):
    from tests.tiny_archs import conversational_jsonl, world_pairs

    f = conversational_jsonl(tmp_path / "conv.jsonl", world_pairs(20))
    cfg = data_cfg(tmp_path, source="jsonl", path=str(f))
    cfg.policy.name_or_path = str(arch_checkpoints["qwen2"])
    train, held = P.load_external(DS.external_data(cfg))
    assert train and held and len(train) + len(held) < 20  # the test split's pairs are neither
    assert not {p.prompt for p in train} & {p.prompt for p in held}
    p = train[0]
    assert p.prompt.startswith("<|im_start|>user\n") and p.prompt.endswith("<|im_start|>assistant\n")
    assert "<|im_end|>" not in p.chosen and p.chosen in {c for _, c, _ in world_pairs(20)}
    cfg.data.chat_template = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"  # the config's wins
    assert P.load_external(DS.external_data(cfg))[0][0].prompt.startswith("[")


def test_saved_dataset_folder_parquet_and_hub_name(tmp_path):
    import datasets

    from tests.tiny_archs import ultrafeedback_folder, world_pairs

    pairs = world_pairs(20)
    folder = ultrafeedback_folder(tmp_path / "uf", pairs)
    cfg = data_cfg(tmp_path, source="hf", name=str(folder), split="train", columns={"prompt": "instruction"})
    train, held = P.load_external(DS.external_data(cfg))
    train_p, eval_p, test_p = P.external_prompts(DS.external_data(cfg))
    assert len(train) == len(train_p) and len(held) == len(eval_p) and train[0].prompt.startswith("user: ")
    assert set(train_p) | set(eval_p) | set(test_p) == {f"user: {p}\nassistant:" for p, _, _ in pairs}

    pq = tmp_path / "pairs.parquet"
    datasets.Dataset.from_list([{"prompt": p, "chosen": c, "rejected": r} for p, c, r in pairs] +
                               [{"prompt": "p", "chosen": "same", "rejected": "same"}]).to_parquet(str(pq))
    with pytest.raises(ValueError, match=r"pairs.parquet\[train\] row 20: chosen == rejected"):
        P.load_external(data_cfg(tmp_path, source="hf", name=str(pq), split="train"))
    with pytest.raises(OSError, match="could not load it from the Hugging Face hub"):
        P.load_external(DS.external_data(data_cfg(tmp_path, source="hf", name="no-such-org/no-such-dataset", split="train")))
    with pytest.raises(FileNotFoundError, match="not a folder written by save_to_disk"):
        P.load_external(data_cfg(tmp_path, source="hf", name=str(tmp_path), split="train"))


def test_prompt_only_jsonl_feeds_the_ppo_prompt_stream(tmp_path):
    from rlhf_lab.stages.ppo import prompt_stream

    f = tmp_path / "prompts.jsonl"
    f.write_text("".join(json.dumps({"prompt": f"prompt {i}"}) + "\n" for i in range(20)))
    cfg = data_cfg(tmp_path, source="jsonl", path=str(f))
    with pytest.raises(ValueError, match="lacks column"):
        P.load_external(DS.external_data(cfg))  # an RM or DPO needs pairs
    train, eval_p, test_p = P.external_prompts(DS.external_data(cfg))
    assert len(train) + len(eval_p) + len(test_p) == 20 and not set(train) & (set(eval_p) | set(test_p))
    fn = prompt_stream(cfg, seed=0, n_prompts=4)
    assert fn(3) == fn(3) and fn(3) != fn(4) and set(fn(3)) <= set(train) and len(set(fn(3))) == 4


@pytest.mark.parametrize("overrides, line", [
    (["data=hf", "data.name=/no/such/folder"], "data.name must be an existing save_to_disk folder"),
    (["data=jsonl", f"data.path={__file__}", "policy.name_or_path=/x"], "sft.steps must be 0 with policy.name_or_path"),
    (["data=jsonl", f"data.path={__file__}", "algo.reward=gold"], "algo.reward must be rm with data=jsonl"),
    (["policy.dtype=float8"], "policy.dtype must be one of auto, float32"),
])
def test_config_checks_of_the_new_keys(overrides, line):
    from rlhf_lab.config.errors import ConfigError
    from rlhf_lab.config.checks import composition_error_line, validate

    with pytest.raises(ConfigError) as exc:
        validate(compose_cfg(overrides))
    assert str(exc.value).startswith(line)
    for bad, words in ((["data=jsonl", f"data.path={__file__}", "data.format=chat"], "data.format must be one of auto"),
                       (["reward_model.attn_implementation=fast"], "reward_model.attn_implementation must be one of "
                                                                   "eager")):  # typed keys: refused at composition
        with pytest.raises(Exception) as exc:
            compose_cfg(bad)
        assert composition_error_line(exc.value).startswith(words)
    validate(compose_cfg(["data=jsonl", f"data.path={__file__}", "policy.name_or_path=/x", "sft.steps=0",
                          "policy.dtype=bfloat16", "policy.attn_implementation=eager", "reward_model=minilm"]))
