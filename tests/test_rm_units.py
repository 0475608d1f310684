"""Unit tests of the reward-model stage without training: loss, ensemble aggregation, normalisation,
the cross-tokenizer scoring path, LoRA merging, held-out metrics. Every number is computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf_lab.algorithms import rm as RM
from rlhf_lab.models import families as F
from rlhf_lab.data.preferences import PreferencePair
from rlhf_lab.models.batching import pad_right
from rlhf_lab.models.adapters import with_lora
from rlhf_lab.models import reward as R
from rlhf_lab.models.reward import RewardScorer, aggregate, encode_texts, rm_forward, rm_forward_shared
from rlhf_lab.models.shared_prefix import common_prefixes
from rlhf_lab.stages.training import model_size
from rlhf_lab.world import ReviewGenerator

PROMPTS = ["write a review of the blender .", "what do you think of the kettle ?", "review the lamp .",
           "write a review of the toaster ."]
RESPONSES = ["the price is great . i love it .", "it broke after a week .", "the lamp is fine .",
             "i hope this helps . the toaster is bad ."]


def _texts(n=300, seed=1):
    return [p + " " + r for p, r in ReviewGenerator(seed).reviews(n)]


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    """Untrained RMs of both families (same world text, different tokenizers), saved and reloaded."""
    root = tmp_path_factory.mktemp("rm_units")
    out = {}
    texts = _texts()
    for fam, vocab in (("a", 200), ("b", 300)):
        torch.manual_seed(0)
        tok = F.train_tokenizer(fam, texts, vocab)
        lm = F.build_model(fam, {"hidden": 16, "layers": 1, "heads": 2}, tok)
        d = root / fam
        tok.save_pretrained(d)
        lm.save_pretrained(d)
        torch.manual_seed(1)
        rm = F.load_sequence_scorer(d, tok)
        with torch.no_grad():  # a head large enough that scores differ visibly between texts
            rm.score.weight.normal_(0, 1.0)
        out[fam] = (tok, rm.eval(), d)
    return out


# ------------------------------------------------------------------------------------------------
# loss


def test_bradley_terry_loss_in_the_training_step_by_hand(tiny_models):
    """The module pairs the first half of the batch (chosen) with the second (rejected), with margin and centering."""
    tok, rm, _ = tiny_models["a"]
    seqs = encode_texts(tok, PROMPTS[:2] * 2, RESPONSES[:2] + RESPONSES[2:], [True] * 4, 64)
    ids, mask = pad_right(seqs, tok.pad_token_id)
    with torch.no_grad():
        r = rm_forward(rm, ids, mask).double().tolist()
    margin = [0.5, 0.0]
    mod = RM.RewardModelModule(rm, lr=1e-3, use_margin=True, center_coef=0.1)
    mod.log = lambda *a, **k: None
    loss = mod.training_step({"input_ids": ids, "attention_mask": mask, "margin": torch.tensor(margin)}, 0)
    rc, rr = r[:2], r[2:]
    expected = (sum(math.log(1 + math.exp(-(c - j - m))) for c, j, m in zip(rc, rr, margin)) / 2
                + 0.1 * sum((c + j) ** 2 for c, j in zip(rc, rr)) / 2)
    assert float(loss) == pytest.approx(expected, rel=1e-5)
    rm.eval()


def test_pack_rows_by_hand():
    from rlhf_lab.models.batching import pack_rows

    seqs = [[1, 2, 3], [4], [5, 6], [7, 8, 9]]
    # rows as long as the longest sequence; first-fit decreasing: 0 | 3 | 2 then 1 (ties in input order)
    ids, pos, last = pack_rows(seqs, 0)
    assert ids.tolist() == [[1, 2, 3], [7, 8, 9], [5, 6, 4]]
    assert pos.tolist() == [[0, 1, 2], [0, 1, 2], [0, 1, 0]]
    assert last.tolist() == [2, 8, 7, 5]
    # wider rows: 0 + 2 fill the first (5 tokens), 3 + 1 the second, padded at its end (its own positions)
    ids, pos, last = pack_rows(seqs, 0, width=5)
    assert ids.tolist() == [[1, 2, 3, 5, 6], [7, 8, 9, 4, 0]]
    assert pos.tolist() == [[0, 1, 2, 0, 1], [0, 1, 2, 0, 0]]
    assert last.tolist() == [2, 8, 4, 7]
    assert [ids.reshape(-1)[i].item() for i in last] == [s[-1] for s in seqs]
    with pytest.raises(ValueError, match="zero tokens"):
        pack_rows([[1], []], 0)
    with pytest.raises(ValueError, match="does not fit"):
        pack_rows(seqs, 0, width=2)


@pytest.mark.parametrize("fam", ["a", "b"])
def test_packed_batches_give_the_padded_loss_and_gradients(tiny_models, fam):
    """reward_model.packing: the same pairs packed into rows (no padding) give the loss and gradients of the
    right-padded batch, to float noise, through the module's own training step."""
    tok, rm, _ = tiny_models[fam]
    short = ["bad .", "ok .", "it is fine .", "no ."]  # short sequences share rows with long ones
    ex = RM.encode_rm_pairs(tok, [PreferencePair("", r, q) for r, q in zip(RESPONSES, short)], 64)
    mod = RM.RewardModelModule(rm, lr=1e-3)
    mod.log = lambda *a, **k: None
    mod.eval()  # family b (GPT-2) has dropout: compare the deterministic computation
    out = {}
    for packed in (False, True):
        batch = RM.collate_rm_pairs(tok.pad_token_id, packed)(ex)
        assert batch["lengths"].tolist() == [len(e["chosen"]) for e in ex] + [len(e["rejected"]) for e in ex]
        rm.zero_grad()
        loss = mod.training_step(batch, 0)
        loss.backward()
        out[packed] = (float(loss), mod.rewards(batch).detach(), [p.grad.clone() for p in rm.parameters()], batch)
    assert "attention_mask" not in out[True][3] and out[True][3]["input_ids"].numel() < out[False][3]["input_ids"].numel()
    assert out[True][0] == pytest.approx(out[False][0], abs=1e-6)
    assert torch.allclose(out[True][1], out[False][1], atol=1e-5)
    for g_packed, g_padded in zip(out[True][2], out[False][2]):
        assert torch.allclose(g_packed, g_padded, atol=1e-5, rtol=1e-4)
    assert mod._packing_checked
    rm.zero_grad()


def test_common_prefixes_by_hand():
    seqs = [[1, 2, 3, 4], [1, 2, 5], [1, 2, 3, 6, 7], [9, 8], [1, 2]]
    prefixes, group, rest = common_prefixes(seqs, ["p", "p", "p", "q", "r"])
    assert prefixes == [[1, 2], [9], [1]] and group == [0, 0, 0, 1, 2]  # a prefix leaves each list a token
    assert rest == [[3, 4], [5], [3, 6, 7], [8], [2]]
    assert common_prefixes([[1, 2], [3, 4]], ["p", "p"]) is None  # nothing shared: no shared pass


@pytest.mark.parametrize("fam", ["a", "b"])
def test_shared_prefix_scores_are_the_padded_scores(tiny_models, fam):
    """algo.shared_prompt: the responses to one prompt scored in one pass over their common tokens give each
    response's own score, to float noise, also across passes of batch_size rows."""
    tok, rm, _ = tiny_models[fam]
    prompts = [PROMPTS[0]] * 3 + [PROMPTS[1]] * 2 + [PROMPTS[2]]
    responses = [RESPONSES[0], RESPONSES[1], "", RESPONSES[3], RESPONSES[2], RESPONSES[0]]
    ended = [True, False, True, False, True, True]
    scorer = RewardScorer([rm], tok, normalize=False, batch_size=4)
    alone = scorer.member_scores(prompts, responses, ended)
    calls = []
    with pytest.MonkeyPatch.context() as mp, scorer.sharing_prefixes():
        mp.setattr(R, "rm_forward_shared", lambda *a: calls.append(a[1].shape[0]) or rm_forward_shared(*a))
        shared = scorer.member_scores(prompts, responses, ended)
    assert calls == [2, 1] and not scorer.shared_prefix  # the prompts' rows whole, about batch_size a pass: 3 + 2, then 1
    assert torch.allclose(shared, alone, atol=1e-5)


def test_packing_check_catches_a_model_that_mixes_packed_sequences(tiny_models, monkeypatch):
    import transformers.masking_utils as MU

    from rlhf_lab.models.packing import check_packing
    from rlhf_lab.models.reward import packable

    _, rm, _ = tiny_models["a"]
    check_packing(rm, "reward_model.packing")
    assert packable(rm)
    monkeypatch.setattr(MU, "find_packed_sequence_indices", lambda position_ids: None)  # one causal mask per row
    with pytest.raises(ValueError, match="mixes sequences packed into one row.*set reward_model.packing=false"):
        check_packing(rm, "reward_model.packing")
    assert not rm.training


def test_bradley_terry_numbers_by_hand():
    from rlhf_lab.algorithms.dpo_math import bradley_terry_loss

    # r_c = [2, 0], r_r = [1, 1]: -log σ(1) = log(1 + e^-1) = 0.313262, -log σ(-1) = log(1 + e) = 1.313262
    loss = bradley_terry_loss(torch.tensor([2.0, 0.0]), torch.tensor([1.0, 1.0]))
    assert float(loss) == pytest.approx((0.313262 + 1.313262) / 2, abs=1e-6)
    # margin 0.5 on the first pair: log(1 + e^-0.5) = 0.474077; centering 0.1 * mean(3², 1²) = 0.5
    loss = bradley_terry_loss(torch.tensor([2.0, 0.0]), torch.tensor([1.0, 1.0]), torch.tensor([0.5, 0.0]), 0.1)
    assert float(loss) == pytest.approx((0.474077 + 1.313262) / 2 + 0.5, abs=1e-6)


def test_margin_is_the_labelers_utility_gap_clipped(tiny_cfg):
    cfg = tiny_cfg("labeler=length_biased")
    p = "write a review of the blender ."
    ten = "the price is great . " * 2 + "the blender is great ."  # 15 words, fluent, positive
    pairs = [PreferencePair(p, ten, "the blender is great .", True, True),  # +1 sentence: length bonus 0.25 * 1.0
             PreferencePair(p, "the blender is great .", "the blender is bad .", True, True),
             PreferencePair(p, "the blender is bad .", "the blender is great .", True, True)]
    from rlhf_lab.config import world as W
    from rlhf_lab.world import gold_reward

    m = RM.pair_margins(pairs, W.labeler(cfg), W.gold_weights(cfg), cfg.data.source == "world")

    w = W.gold_weights(cfg)
    g0 = gold_reward(p, ten, True, w) - gold_reward(p, "the blender is great .", True, w)
    assert m[0] == pytest.approx(min(1.0, max(0.0, g0 + 0.25 * (15 - 5) / 10)))
    assert m[1] == 1.0  # gold gap 2 (valence +1 vs -1, approx.), clipped at 1
    assert m[2] == 0.0  # the label contradicts the utility: no margin
    with pytest.raises(ValueError, match="only data=world"):
        cfg.data.source = "jsonl"
        RM.pair_margins(pairs, W.labeler(cfg), W.gold_weights(cfg), cfg.data.source == "world")


# ------------------------------------------------------------------------------------------------
# ensemble aggregation and normalisation


def test_ensemble_aggregation_by_hand():
    z = torch.tensor([[1.0, 2.0], [3.0, 2.0], [2.0, 5.0]])  # 3 members, 2 samples
    # means 2, 3; population stds sqrt(2/3) = 0.816497, sqrt(2) = 1.414214
    assert aggregate(z).tolist() == pytest.approx([2.0, 3.0])
    assert aggregate(z, 0.5).tolist() == pytest.approx([2 - 0.5 * 0.816497, 3 - 0.5 * 1.414214], abs=1e-6)
    assert aggregate(z[:1], 1.0).tolist() == pytest.approx([1.0, 2.0])  # one member: std 0
    with pytest.raises(ValueError, match="shape"):
        aggregate(torch.zeros(0, 3))


def _sft_like(n=64, seed=3):
    g = ReviewGenerator(seed)
    pairs = g.reviews(n)
    return [p for p, _ in pairs], [r for _, r in pairs], [i % 5 != 0 for i in range(n)]


def test_normalisation_round_trip_single_and_ensemble(tiny_models, tmp_path):
    tok, rm, d = tiny_models["a"]
    torch.manual_seed(5)
    rm2 = F.load_sequence_scorer(d, tok).eval()
    with torch.no_grad():
        rm2.score.weight.normal_(0, 3.0)
    P, R, E = _sft_like()
    for members in ([rm], [rm, rm2]):
        sc = RewardScorer(members, tok, max_len=64)
        raw = sc.member_scores(P, R, E)
        sc.fit_normalization(P, R, E)
        out = sc(P, R, E)
        assert out.dtype == torch.float32 and out.shape == (len(P),)
        assert float(out.mean()) == pytest.approx(0.0, abs=1e-5)
        assert float(out.std(correction=0)) == pytest.approx(1.0, abs=1e-4)
        if len(members) == 1:  # a single RM: output = gain * raw + bias
            assert out.tolist() == pytest.approx((sc.gain * raw[0] + sc.bias).tolist(), abs=1e-5)
            assert sc.gain == pytest.approx(1 / float(raw[0].std(correction=0)), rel=1e-4)
        # saved and loaded: the same scores; normalize=False gives the raw (mean) score back
        folder = tmp_path / f"rm{len(members)}"
        tok.save_pretrained(folder)
        for i, m in enumerate(members):
            m.save_pretrained(folder / f"member_{i}")
        sc.save_norm(folder)
        back = RewardScorer.from_path(folder)
        assert back(P, R, E).tolist() == pytest.approx(out.tolist(), abs=1e-5)
        assert (back.gain, back.bias) == pytest.approx((sc.gain, sc.bias))
        assert len(back.members) == len(members)
        assert RewardScorer.from_path(folder, normalize=False)(P, R, E).tolist() == pytest.approx(raw.mean(0).tolist(), abs=1e-5)
        if len(members) == 2:  # conservative score: lower by lambda * gain * member std
            z = back.standardized(raw)
            cons = RewardScorer.from_path(folder, conservative_lambda=0.5)(P, R, E)
            expect = out - 0.5 * back.gain * z.std(0, correction=0)
            assert cons.tolist() == pytest.approx(expect.tolist(), abs=1e-5)
            assert float(cons.mean()) < -0.01
    with pytest.raises(FileNotFoundError, match="not a reward-model folder"):
        RewardScorer.from_path(tmp_path)
    with pytest.raises(ValueError, match="same length"):
        sc(P, R[:-1], E)


# ------------------------------------------------------------------------------------------------
# cross-tokenizer scoring


def test_cross_tokenizer_scoring_and_eos(tiny_models):
    """A family-a policy's token ids scored by a family-b RM: decoded with a's tokenizer, re-encoded with b's."""
    tok_a, _, _ = tiny_models["a"]
    tok_b, rm_b, _ = tiny_models["b"]
    sc = RewardScorer([rm_b], tok_b, max_len=64, batch_size=3)
    ended = [True, False, True, True]
    # the policy's (family a) response ids, right-padded, EOS inside the mask when ended
    seqs = [tok_a(" " + r, add_special_tokens=False).input_ids + ([tok_a.eos_token_id] if e else [])
            for r, e in zip(RESPONSES, ended)]
    ids, mask = pad_right(seqs, tok_a.pad_token_id)
    via_ids = sc.score_tokens(tok_a, PROMPTS, ids, mask, ended)
    direct = sc(PROMPTS, RESPONSES, ended)
    assert via_ids.tolist() == pytest.approx(direct.tolist(), abs=1e-5)
    # the two tokenizers really differ on this text, and the RM reads b's encoding with b's EOS appended
    enc_b = encode_texts(tok_b, PROMPTS, RESPONSES, ended, 64)
    enc_a = encode_texts(tok_a, PROMPTS, RESPONSES, ended, 64)
    assert enc_b[0] != enc_a[0]
    assert enc_b[0][-1] == tok_b.eos_token_id and enc_b[1][-1] != tok_b.eos_token_id
    assert enc_a[0][-1] == tok_a.eos_token_id
    # batching (sorted by length, padded, batch_size 3) does not change a score: one at a time agrees
    one = [float(sc([p], [r], [e])[0]) for p, r, e in zip(PROMPTS, RESPONSES, ended)]
    assert direct.tolist() == pytest.approx(one, abs=1e-5)
    # the missing EOS is visible to the RM
    assert float(sc(PROMPTS[:1], RESPONSES[:1], [True])[0]) != pytest.approx(float(sc(PROMPTS[:1], RESPONSES[:1], [False])[0]), abs=1e-4)
    # pad == EOS (common for hub decoders) does not hide the EOS: the last attended token is read
    rm_b.config.pad_token_id = tok_b.eos_token_id
    ids_b, mask_b = pad_right(enc_b[:2], tok_b.eos_token_id)
    with torch.no_grad():
        r = rm_forward(rm_b, ids_b, mask_b)
    assert r.tolist() == pytest.approx(direct[:2].tolist(), abs=1e-5)
    rm_b.config.pad_token_id = tok_b.pad_token_id


def test_lora_merge_keeps_scores(tiny_models):
    from omegaconf import OmegaConf

    tok, _, d = tiny_models["b"]
    torch.manual_seed(0)
    model = with_lora(F.load_sequence_scorer(d, tok), OmegaConf.create({"r": 4}), "SEQ_CLS")
    size = model_size(model)
    n_train, n_all = size["model/params_trainable"], size["model/params_total"]
    assert 0 < n_train < n_all / 5
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name or "score" in name:
                p.normal_(0, 0.5)
    ids, mask = pad_right(encode_texts(tok, PROMPTS, RESPONSES, [True] * 4, 64), tok.pad_token_id)
    model.eval()
    with torch.no_grad():
        before = rm_forward(model, ids, mask)
        merged = model.merge_and_unload()
        after = rm_forward(merged, ids, mask)
    assert before.std() > 1e-3
    assert after.tolist() == pytest.approx(before.tolist(), abs=1e-4)
    assert not any("lora" in n for n, _ in merged.named_parameters())


# ------------------------------------------------------------------------------------------------
# held-out metrics


def test_preference_metrics_by_hand():
    p = "review the lamp ."
    long_, short = "the lamp is great . the price is great .", "the lamp is bad ."
    fill = "i understand how you feel . the lamp is fine ."
    pairs = [
        PreferencePair(p, long_, short, gold_chosen=1.0, gold_rejected=-1.0),   # RM: long wins; gold: long wins
        PreferencePair(p, long_, short, gold_chosen=-1.0, gold_rejected=0.5),   # label long; gold short; RM long
        PreferencePair(p, short, long_, gold_chosen=0.2, gold_rejected=0.1),    # label short; gold short; RM long
        PreferencePair(p, fill, short, gold_chosen=0.0, gold_rejected=0.0),     # gold tie; RM prefers filler
    ]
    s_c = [2.0, 1.0, 0.0, 1.0]
    s_r = [0.0, 0.0, 1.0, 0.0]
    m = RM.preference_metrics(pairs, s_c, s_r)
    assert m["rm/accuracy"] == pytest.approx(3 / 4)
    assert m["rm/accuracy_gold"] == pytest.approx(1 / 3)  # pairs 0..2 (pair 3 is a gold tie): RM right on pair 0
    # longer response: RM wins 4/4 (pair 3: 10 vs 4 words, RM picks the longer); gold 1, 0, 0, 0.5 -> 1.5/4
    assert m["rm/longer_win_rate"] == pytest.approx(1.0)
    assert m["rm/gold_longer_win_rate"] == pytest.approx(1.5 / 4)
    assert m["rm/length_preference"] == pytest.approx(1.0 - 1.5 / 4)
    # filler: only pair 3 differs; RM prefers the filler response (1), gold ties (0.5)
    assert m["rm/filler_preference"] == pytest.approx(0.5)
    assert m["rm/accuracy_filler"] == pytest.approx(1.0) and m["rm/accuracy_no_filler"] == pytest.approx(2 / 3)
    # without gold: no gold metrics
    ext = [PreferencePair(q.prompt, q.chosen, q.rejected) for q in pairs]
    m2 = RM.preference_metrics(ext, s_c, s_r)
    assert m2["rm/accuracy"] == pytest.approx(3 / 4)
    assert not any("gold" in k or k.endswith("_preference") for k in m2)
    assert RM.spearman([1, 2, 3, 4], [10, 20, 40, 30]) == pytest.approx(0.8)
