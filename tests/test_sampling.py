"""The lab sampler (``generation.sampler=lab``, ``sampling.kv_generate``) against Hugging Face ``generate``: the same
tokens under the same seed, and the same random numbers consumed, on the in-house families and on every tiny
real architecture (tests/tiny_archs.py), left-padded batches of different prompt lengths, for temperature 1 and
other temperatures, top-k, top-p, their combination and greedy decoding."""

from __future__ import annotations

import pytest
import torch

from rlhf_lab.config.choices import Sampler
from rlhf_lab.models import families as Fm
from rlhf_lab.models import sampling as S
from tests.tiny_archs import ARCHS, world_pairs

SETTINGS = [  # (temperature, top_k, top_p)
    (1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 5, 1.0), (1.0, 0, 0.8), (0.9, 20, 0.9), (0.0, 0, 1.0),
]
MAX_NEW = 20


def prompts(n: int = 8) -> list[str]:
    """World prompts cut to different lengths: a left-padded batch."""
    return [p[: 12 + 9 * i] for i, (p, _, _) in enumerate(world_pairs(n, seed=3))]


@pytest.fixture(scope="module")
def family_models():
    texts = [f"{p} {c} {r}" for p, c, r in world_pairs(300, seed=1)]
    out = {}
    for fam in Fm.FAMILIES:
        tok = Fm.train_tokenizer(fam, texts, 320)
        torch.manual_seed(0)
        out[f"family_{fam}"] = (Fm.build_model(fam, dict(hidden=32, layers=2, heads=4), tok).eval(), tok)
    return out


def same_draws(model, tok, batch: list[str], settings, seed: int, max_new: int = MAX_NEW):
    """(HF's tokens, ours, HF's next random number, ours) from the same seed."""
    ids, mask = S.encode_prompts(tok, batch)
    args = (model, ids, mask, max_new, tok.eos_token_id, tok.pad_token_id, *settings)
    torch.manual_seed(seed)
    theirs = S.hf_generate(*args)
    after_theirs = torch.rand(3)
    torch.manual_seed(seed)
    ours = S.kv_generate(*args)
    after_ours = torch.rand(3)
    return theirs, ours, after_theirs, after_ours


def assert_same_as_generate(model, tok):
    assert S.lab_unsupported(model, tok) is None
    for settings in SETTINGS:
        for seed, batch in ((0, prompts()), (1, prompts()[:1]), (2, prompts()[3:6])):
            theirs, ours, r_theirs, r_ours = same_draws(model, tok, batch, settings, seed)
            assert ours.shape == theirs.shape and torch.equal(ours, theirs), (settings, seed, ours, theirs)
            assert torch.equal(r_ours, r_theirs), "not the same random numbers consumed"


@pytest.mark.parametrize("family", Fm.FAMILIES)
def test_lab_sampler_draws_generates_tokens_in_house(family_models, family):
    assert_same_as_generate(*family_models[f"family_{family}"])


@pytest.mark.parametrize("arch", ARCHS)
def test_lab_sampler_draws_generates_tokens_real_architectures(arch_checkpoints, arch):
    tok = Fm.load_tokenizer(arch_checkpoints[arch])
    assert_same_as_generate(Fm.load_causal_lm(arch_checkpoints[arch], tok).eval(), tok)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_lab_sampler_with_eager_attention_and_lora(family_models, attn):
    """Eager attention (the decode steps then take the 2-D mask) and a LoRA policy (a peft model) sample as
    generate does."""
    import copy

    from omegaconf import OmegaConf

    from rlhf_lab.models.adapters import with_lora

    base, tok = family_models["family_a"]
    model = copy.deepcopy(base)
    model.set_attn_implementation(attn)
    assert model.config._attn_implementation == attn

    def check(m):
        for settings in (SETTINGS[0], SETTINGS[4]):
            theirs, ours, r_theirs, r_ours = same_draws(m, tok, prompts(), settings, seed=5)
            assert torch.equal(ours, theirs) and torch.equal(r_ours, r_theirs)

    check(model.eval())
    lora = with_lora(model, OmegaConf.create({"r": 4, "alpha": None, "dropout": 0.0, "target_modules": None}),
                     "CAUSAL_LM")
    with torch.no_grad():  # non-zero adapters, so that they matter
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    assert S.lab_unsupported(lora, tok) is None
    check(lora.eval())


@pytest.mark.parametrize("family", Fm.FAMILIES)
def test_a_shared_prompts_prefill_draws_generates_tokens(family_models, family):
    """algo.shared_prompt: each distinct prompt prefilled once, its cache and logits indexed out to its samples
    (GRPO's groups, in any order), draws the tokens and random numbers of generate."""
    model, tok = family_models[f"family_{family}"]
    batch = [prompts()[i] for i in (2, 5, 2, 2, 5, 0, 5, 2)]
    ids, mask = S.encode_prompts(tok, batch)
    for settings in SETTINGS[:3]:
        args = (model, ids, mask, MAX_NEW, tok.eos_token_id, tok.pad_token_id, *settings)
        torch.manual_seed(4)
        theirs, r_theirs = S.hf_generate(*args), torch.rand(3)
        torch.manual_seed(4)
        calls = []
        hook = model.register_forward_pre_hook(lambda m, a, kw: calls.append(kw["input_ids"].shape), with_kwargs=True)
        try:
            ours, r_ours = S.kv_generate(*args, shared_prompts=True), torch.rand(3)
        finally:
            hook.remove()
        assert calls[0][0] == 3 and all(c[0] == len(batch) for c in calls[1:])  # one prefill row per prompt
        assert torch.equal(ours, theirs) and torch.equal(r_ours, r_theirs), settings


def test_sample_with_either_sampler_returns_the_same_rollout(family_models):
    model, tok = family_models["family_a"]
    batch = prompts()
    out = {}
    for sampler in tuple(Sampler):
        torch.manual_seed(11)
        out[sampler] = S.sample(model, tok, batch, MAX_NEW, sampler=sampler)
    lab, hf = out["lab"], out["hf"]
    assert torch.equal(lab.response_ids, hf.response_ids) and torch.equal(lab.response_mask, hf.response_mask)
    assert lab.responses == hf.responses and lab.ended == hf.ended
    # the contract: right-padded responses, EOS inside the mask, pad after it
    for ids, m, ended in zip(lab.response_ids.tolist(), lab.response_mask.tolist(), lab.ended):
        n = sum(m)
        assert m == [1] * n + [0] * (len(m) - n)
        assert ids[n:] == [tok.pad_token_id] * (len(m) - n)
        assert ended == (tok.eos_token_id in ids[:n]) and (not ended or ids[n - 1] == tok.eos_token_id)
    # kv_generate's tokens (drawn in inference mode) can be indices of a forward pass autograd goes back through
    ids = S.kv_generate(model, lab.query_ids, lab.query_mask, 4, tok.eos_token_id, tok.pad_token_id)
    assert not ids.is_inference()
    with torch.enable_grad():
        S.response_logprobs(model, lab.query_ids, lab.query_mask, ids, torch.ones_like(ids)).sum().backward()
    model.zero_grad(set_to_none=True)
    with pytest.raises(ValueError, match="generation.sampler"):
        S.sample(model, tok, batch, MAX_NEW, sampler="vllm")


def test_sample_restores_training_mode(family_models):
    model, tok = family_models["family_a"]
    model.train()
    try:
        S.sample(model, tok, prompts()[:2], 4)
        assert model.training
    finally:
        model.eval()


@pytest.mark.parametrize("shape", [(1, 7), (5, 384), (16, 50257)])
def test_draw_tokens_is_torch_multinomial_on_cpu(shape):
    """The same token per row and the same random numbers consumed as ``torch.multinomial(probs, 1)``, also with
    probabilities 0 (filtered tokens)."""
    g = torch.Generator().manual_seed(shape[1])
    logits = torch.randn(shape, generator=g) * 3
    logits[:, ::3] = float("-inf")
    probs = torch.softmax(logits, -1)
    for seed in range(5):
        torch.manual_seed(seed)
        want, after_want = torch.multinomial(probs, 1).squeeze(1), torch.rand(2)
        torch.manual_seed(seed)
        got, after_got = S.draw_tokens(probs), torch.rand(2)
        assert torch.equal(got, want) and torch.equal(after_got, after_want)
    bad = probs.clone()
    bad[-1, 0] = float("nan")  # one NaN in the last row
    with pytest.raises(RuntimeError, match="probability tensor"):
        S.draw_tokens(bad)


def test_warp_scores_matches_transformers_warpers():
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    scores = torch.randn(6, 50, generator=torch.Generator().manual_seed(0)) * 2
    for temperature, top_k, top_p in [(1.0, 0, 1.0), (0.5, 0, 1.0), (1.0, 3, 1.0), (1.3, 0, 0.7), (0.8, 10, 0.5),
                                      (1.0, 100, 1.0), (1.0, 0, 0.01)]:
        procs = LogitsProcessorList()
        if temperature != 1.0:
            procs.append(TemperatureLogitsWarper(temperature))
        if top_k:
            procs.append(TopKLogitsWarper(top_k))
        if top_p < 1.0:
            procs.append(TopPLogitsWarper(top_p))
        want = procs(None, scores.clone())
        assert torch.equal(S.warp_scores(scores.clone(), temperature, top_k, top_p), want)
    kept = S.warp_scores(scores, 1.0, 3, 1.0).isfinite().sum(-1)
    assert (kept == 3).all()


def test_kv_generate_stops_when_every_row_has_ended(family_models):
    """Rows that emitted EOS get the pad token; the loop stops at the step where the last row ends (here EOS is
    forced at the 3rd token of every row, so 3 tokens come back)."""
    model, tok = family_models["family_a"]
    ids, mask = S.encode_prompts(tok, prompts()[:4])
    eos = tok.eos_token_id
    calls = []

    def force_eos(_module, _inputs, out):
        calls.append(1)
        if len(calls) >= 3:
            out[..., :] = float("-inf")
            out[..., eos] = 0.0
        return out

    h = model.get_output_embeddings().register_forward_hook(force_eos)
    try:
        torch.manual_seed(0)
        out = S.kv_generate(model, ids, mask, MAX_NEW, eos, tok.pad_token_id)
    finally:
        h.remove()
    assert out.shape == (4, 3) and (out[:, 2] == eos).all() and len(calls) == 3


def test_lab_unsupported_names_what_it_cannot_reproduce(family_models):
    model, tok = family_models["family_a"]
    assert S.lab_unsupported(model, tok) is None
    old = model.generation_config.repetition_penalty
    model.generation_config.repetition_penalty = 1.3
    try:
        assert "repetition_penalty" in S.lab_unsupported(model, tok)
    finally:
        model.generation_config.repetition_penalty = old
    assert S.lab_unsupported(model, tok) is None
    model.generation_config.use_cache = False
    try:
        assert "use_cache" in S.lab_unsupported(model, tok)
    finally:
        model.generation_config.use_cache = True
    assert "no transformers config" in S.lab_unsupported(torch.nn.Linear(2, 2), tok)


def test_sampler_is_a_generation_key_left_out_of_artifact_specs():
    """``generation.sampler`` is in the config (default lab) and checked, but not in the specs that key cached
    artifacts (preference pairs, DPO): both samplers draw the same tokens."""
    from rlhf_lab.config import checks as C
    from rlhf_lab.stages.pipeline import generation_spec
    from tests.conftest import compose_cfg

    lab, hf = compose_cfg([]), compose_cfg(["generation.sampler=hf"])
    assert lab.generation.sampler == S.DEFAULT_SAMPLER == "lab" and hf.generation.sampler == "hf"
    assert generation_spec(lab) == generation_spec(hf)
    assert set(generation_spec(lab)) == set(lab.generation) - {"sampler", "dtype"}  # dtype: tests/test_rollout_copy.py
    C.check_generation(hf.generation)
    with pytest.raises(Exception) as exc:  # refused at composition: the key is typed with its StrEnum
        compose_cfg(["generation.sampler=vllm"])
    assert C.composition_error_line(exc.value) == "generation.sampler must be one of lab, hf, got 'vllm'"


def test_preallocated_cache_layer_returns_what_concatenation_returns():
    """The decode loop's cache layer (sampling.PreallocatedLayer) holds the same keys and values as transformers'
    DynamicLayer after every update, writes in place while within its capacity, and grows past it."""
    from transformers.cache_utils import DynamicLayer

    g = torch.Generator().manual_seed(0)
    ours, theirs = S.PreallocatedLayer(capacity=7), DynamicLayer()
    buffer = None
    for n in (5, 1, 1, 3, 1):  # a prefill of 5, two tokens, then past the capacity of 7
        k, v = torch.randn(2, 3, n, 4, generator=g), torch.randn(2, 3, n, 4, generator=g)
        ko, vo = ours.update(k, v)
        kt, vt = theirs.update(k, v)
        assert torch.equal(ko, kt) and torch.equal(vo, vt)
        assert ours.get_seq_length() == theirs.get_seq_length()
        if ours.get_seq_length() <= 7:
            buffer = buffer or ko.untyped_storage().data_ptr()
            assert ko.untyped_storage().data_ptr() == buffer, "reallocated within its capacity"
    assert ours.get_seq_length() == 11


def test_decode_loop_uses_the_preallocated_cache(family_models):
    model, _ = family_models["family_a"]
    cache = S.preallocated_cache(model, 12)
    assert cache is not None and all(isinstance(layer, S.PreallocatedLayer) for layer in cache.layers)


def test_a_prompt_over_max_prompt_len_is_a_config_error_naming_the_key():
    """A user's prompts longer than generation.max_prompt_len: one line naming the key and the length needed (the
    CLI prints a ConfigError on one line and exits 2), not a traceback from the middle of a job."""
    from rlhf_lab.config.errors import ConfigError

    texts = [f"{p} {c} {r}" for p, c, r in world_pairs(100, seed=1)]
    tok = Fm.train_tokenizer(Fm.FAMILIES[0], texts, 320)
    batch = prompts(3)
    longest = S.encode_prompts(tok, batch)[0].shape[1]
    assert S.encode_prompts(tok, batch, max_prompt_len=longest)[0].shape[1] == longest
    with pytest.raises(ConfigError, match=rf"^generation\.max_prompt_len must be at least {longest} tokens.*or null "
                                          rf"\(no limit\), got {longest - 1}$"):
        S.encode_prompts(tok, batch, max_prompt_len=longest - 1)
