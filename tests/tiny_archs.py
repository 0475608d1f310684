"""Scaled-down models of real architectures (GPT-NeoX as in Pythia, Qwen2, Llama, GPT-2) with a ChatML chat
template, saved with save_pretrained; and chat-format preference data built from the world's reviews.

Each model has 2 layers, hidden size 32 and the same small byte-level BPE tokenizer (trained here with the
`tokenizers` library, ChatML special tokens, ``<|im_end|>`` as EOS), randomly initialised: the tests check
that every stage runs on the architecture, not what it learns.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

ARCHS = ("gpt_neox", "qwen2", "llama", "gpt2")
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ["<|endoftext|>", "<|pad|>", "<|im_start|>", "<|im_end|>"]


def chat_tokenizer(texts: list[str], vocab_size: int = 320):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                                       show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|im_end|>",
                                   pad_token="<|pad|>", model_max_length=256)
    fast.chat_template = CHATML
    return fast


def tiny_config(arch: str, tok):
    from transformers import GPT2Config, GPTNeoXConfig, LlamaConfig, Qwen2Config

    ids = dict(vocab_size=len(tok), pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
               eos_token_id=tok.eos_token_id)
    decoder = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                   max_position_embeddings=256, **ids)
    if arch == "gpt_neox":
        return GPTNeoXConfig(rotary_pct=0.25, **decoder)
    if arch == "qwen2":
        return Qwen2Config(num_key_value_heads=2, tie_word_embeddings=True, **decoder)
    if arch == "llama":
        return LlamaConfig(num_key_value_heads=4, **decoder)
    if arch == "gpt2":
        return GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=256, **ids)
    raise ValueError(arch)


def build_checkpoints(root: Path, texts: list[str]) -> dict[str, Path]:
    """One folder per architecture (model + tokenizer with its chat template), seeded."""
    from transformers import AutoModelForCausalLM

    tok = chat_tokenizer(texts)
    out = {}
    for i, arch in enumerate(ARCHS):
        torch.manual_seed(100 + i)
        model = AutoModelForCausalLM.from_config(tiny_config(arch, tok))
        folder = root / arch
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
        out[arch] = folder
    return out


def world_pairs(n: int, seed: int = 7) -> list[tuple[str, str, str]]:
    """(prompt, chosen, rejected) of world reviews, chosen by gold."""
    from rlhf_lab.world import ReviewGenerator, gold_reward

    g = ReviewGenerator(seed)
    out = []
    while len(out) < n:
        p = g.prompt()
        a, b = g.response(p), g.response(p)
        if a != b:
            out.append((p, a, b) if gold_reward(p, a) > gold_reward(p, b) else (p, b, a))
    return out


def conversational_jsonl(path: Path, pairs) -> Path:
    """TRL's conversational format with an explicit prompt."""
    msg = lambda role, text: [{"role": role, "content": text}]  # noqa: E731
    rows = [{"prompt": msg("user", p), "chosen": msg("assistant", c), "rejected": msg("assistant", r)}
            for p, c, r in pairs]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def ultrafeedback_folder(path: Path, pairs) -> Path:
    """UltraFeedback style, saved with save_to_disk: a string prompt under another column name (`instruction`)
    beside full conversations (user turn + assistant turn) in chosen and rejected."""
    import datasets

    conv = lambda p, y: [{"role": "user", "content": p}, {"role": "assistant", "content": y}]  # noqa: E731
    ds = datasets.Dataset.from_list([{"instruction": p, "chosen": conv(p, c), "rejected": conv(p, r), "score": 1.0}
                                     for p, c, r in pairs])
    ds.save_to_disk(str(path))
    return path
