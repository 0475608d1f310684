"""Gold-RM mode (config group ``gold``, rlhf_lab/stages/gold.py): a frozen reward model as the gold reward.

The fast tests use gold RMs made in a second (a random tiny Llama scorer saved as an RM artifact folder), whose
scores are known by calling the scorer: the labels follow the gold RM (a pair flips when it disagrees with the
formula) with the labeler's biases on top, the evaluation's gold metrics are its scores with the formula beside
them, the gold RM enters the cache keys (the formula adds nothing), and a bad ``gold.path`` fails with one line
naming it. The slow test runs a tiny PPO job in gold-RM mode end to end."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
import torch

from rlhf_lab.config import checks as CC
from rlhf_lab.config.errors import ConfigError
from rlhf_lab.config import world as W
from rlhf_lab.models import families as F
from rlhf_lab.models.reward import RewardScorer
from rlhf_lab.config import data as DS
from rlhf_lab.data.preferences import PreferencePair, label_pairs
from rlhf_lab.stages import gold as G
from rlhf_lab.world import Labeler, ReviewGenerator, gold_reward
from tests.conftest import compose_cfg

PROMPT = "i bought this kettle last month and"
GOOD, BAD = "the kettle is excellent . i love it .", "the kettle is terrible ."  # the formula prefers GOOD


@pytest.fixture(scope="module")
def rm_base(tmp_path_factory):
    """A tiny random Llama sequence scorer and its tokenizer (trained on world text), saved once."""
    texts = [p + " " + r for p, r in ReviewGenerator(0).reviews(300)]
    tok = F.train_tokenizer("a", texts, 160)
    torch.manual_seed(0)
    base = tmp_path_factory.mktemp("rm_base")
    F.build_model("a", {"hidden": 16, "layers": 1, "heads": 2}, tok).save_pretrained(base)
    tok.save_pretrained(base)
    torch.manual_seed(1)  # the scalar head's initialisation
    member = F.load_sequence_scorer(base, tok).eval()
    return member, tok


def make_rm(folder: Path, member, tok, gain: float, bias: float = 0.0) -> Path:
    """An RM artifact folder (the layout of stages.rm): tokenizer, member_0, rm_norm.json with this gain/bias."""
    folder.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(folder)
    member.save_pretrained(folder / "member_0")
    RewardScorer([member], tok, gain=gain, bias=bias).save_norm(folder, {"source": "test"})
    return folder


def raw_scores(member, tok, prompts, responses) -> list[float]:
    return RewardScorer([member], tok, normalize=False)(prompts, responses, [True] * len(prompts)).tolist()


@pytest.fixture(scope="module")
def gold_rms(rm_base, tmp_path_factory):
    """Two gold RMs with opposite gains: `against` orders (GOOD, BAD) against the formula, `along` with it."""
    member, tok = rm_base
    ra, rb = raw_scores(member, tok, [PROMPT, PROMPT], [GOOD, BAD])
    assert ra != rb
    sign = 1.0 if ra > rb else -1.0  # the gain that makes the RM prefer GOOD, as the formula does
    root = tmp_path_factory.mktemp("gold_rms")
    return {"along": make_rm(root / "along", member, tok, 100.0 * sign),
            "against": make_rm(root / "against", member, tok, -100.0 * sign)}


SHARP = ["labeler=unbiased", "labeler.temperature=0.0001"]  # the labeler follows the sign of the utility gap


def test_a_pair_flips_when_the_gold_rm_disagrees_with_the_formula(tiny_cfg, gold_rms):
    formula_cfg = tiny_cfg(*SHARP)
    assert G.label_scorer(formula_cfg) is None  # the formula: label_pairs computes it exactly
    pairs = label_pairs(DS.labelling(formula_cfg), [PROMPT], [GOOD], [BAD], [True], [True], random.Random(0), "t")
    assert pairs[0].chosen == GOOD
    for name, want in (("along", GOOD), ("against", BAD)):
        cfg = tiny_cfg(*SHARP, "gold=rm", f"gold.path={gold_rms[name]}")
        CC.validate(cfg)
        scorer = G.label_scorer(cfg)
        (p,) = label_pairs(DS.labelling(cfg), [PROMPT], [GOOD], [BAD], [True], [True], random.Random(0), "t", scorer)
        assert p.chosen == want, name
        # the pair records the gold RM's scores (rm/accuracy_gold, rm/spearman_gold read them), not the formula's
        s = scorer([PROMPT, PROMPT], [p.chosen, p.rejected], [True, True]).tolist()
        assert (p.gold_chosen, p.gold_rejected) == pytest.approx(s, abs=1e-5)
        assert p.gold_chosen > p.gold_rejected and p.gold_agrees


def test_opposite_gold_rms_flip_every_label_and_the_biases_apply_on_top(tiny_cfg, gold_rms):
    rng = random.Random(3)
    g = ReviewGenerator(5)
    prompts = [g.prompt("train") for _ in range(40)]
    a = [g.response(p) for p in prompts]
    b = [g.response(p) for p in prompts]
    ended = [True] * 40
    labels = {}
    for name in ("along", "against"):
        cfg = tiny_cfg(*SHARP, "gold=rm", f"gold.path={gold_rms[name]}")
        pairs = label_pairs(DS.labelling(cfg), prompts, a, b, ended, ended, rng, "t", G.label_scorer(cfg))
        labels[name] = [(q.prompt, q.chosen) for q in pairs]
    assert len(labels["along"]) == len(labels["against"]) > 30
    assert all(x != y for x, y in zip(labels["along"], labels["against"]))  # the gold decides every label
    # a strong length bias on top of the gold RM: the longer response wins whichever RM is gold
    for name in ("along", "against"):
        cfg = tiny_cfg(*SHARP, "labeler.length_bonus=1000", "gold=rm", f"gold.path={gold_rms[name]}")
        pairs = label_pairs(DS.labelling(cfg), prompts, a, b, ended, ended, rng, "t", G.label_scorer(cfg))
        assert all(len(q.chosen.split()) > len(q.rejected.split()) for q in pairs
                   if len(q.chosen.split()) != len(q.rejected.split()))


def test_labeler_from_known_gold_equals_the_formula_path():
    lab = Labeler(temperature=0.3, length_bonus=0.25, filler_bonus=0.5)
    g = ReviewGenerator(2)
    for _ in range(30):
        p = g.prompt("train")
        a, b = g.response(p), g.response(p)
        r1, r2 = random.Random(7), random.Random(7)
        assert lab.prefers_first(r1, p, a, b) == lab.prefers_first_given(r2, gold_reward(p, a), gold_reward(p, b), a, b)
        assert lab.utility(p, a) == lab.utility_from_gold(gold_reward(p, a), a)


def test_margins_use_the_recorded_gold(tiny_cfg):
    from rlhf_lab.algorithms import rm as RM

    cfg = tiny_cfg("labeler=length_biased")
    pairs = [PreferencePair(PROMPT, BAD, GOOD, gold_chosen=0.9, gold_rejected=0.5)]  # gold-RM scores, not the formula
    (m,) = RM.pair_margins(pairs, W.labeler(cfg), W.gold_weights(cfg), cfg.data.source == "world")
    assert m == pytest.approx(0.4 + 0.25 * (len(BAD.split()) - len(GOOD.split())) / 10)


# -- evaluation -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def random_policy(rm_base):
    _, tok = rm_base
    torch.manual_seed(2)
    return F.build_model("a", {"hidden": 16, "layers": 1, "heads": 2}, tok).eval(), tok


EVAL = ["eval.n_prompts=12", "eval.n_samples_logged=12", "eval.n_test_prompts=6", "eval.n_ood_prompts=4",
        "generation.max_new_tokens=10", "generation.max_prompt_len=null"]


def test_eval_gold_metrics_are_the_gold_rm_scores_with_the_formula_beside_them(tiny_cfg, gold_rms, random_policy):
    from rlhf_lab.stages.evaluate import evaluate

    policy, tok = random_policy
    cfg = tiny_cfg(*EVAL, "gold=rm", f"gold.path={gold_rms['along']}")
    gold = G.load_gold(cfg)
    assert gold.source == "rm" and gold.formula is not None
    m, rows = evaluate(cfg, policy, tok, gold=gold)
    assert len(rows) == 12  # one sample per prompt: the rows are every sample
    p, y, e = [r["prompt"] for r in rows], [r["response"] for r in rows], [r["ended"] for r in rows]
    rm = G.load_scorer(cfg)(p, y, e).tolist()
    formula = [gold_reward(a, b, c, W.gold_weights(cfg)) for a, b, c in zip(p, y, e)]
    assert m["eval/gold_reward"] == pytest.approx(sum(rm) / 12, abs=1e-4)
    assert m["eval/formula_gold_reward"] == pytest.approx(sum(formula) / 12, abs=1e-5)
    assert abs(m["eval/gold_reward"] - m["eval/formula_gold_reward"]) > 1e-3  # two measures, not one twice
    assert [r["gold"] for r in rows] == pytest.approx([round(x, 4) for x in rm], abs=1e-4)
    for name in ("gold_reward", "formula_gold_reward"):
        assert {f"eval/{name}_se", f"eval/{name}_a", f"eval/{name}_b", f"eval/{name}_a_se"} <= set(m)
    t, _ = evaluate(cfg, policy, tok, split="test", gold=gold)
    assert {"test/gold_reward", "test/formula_gold_reward", "test/formula_gold_reward_se", "eval/gold_reward_ood",
            "eval/formula_gold_reward_ood", "eval/formula_gold_reward_ood_se"} <= set(t)
    # the formula (default): the same samples, gold is the formula and nothing is logged twice
    f, _ = evaluate(tiny_cfg(*EVAL), policy, tok, gold=G.load_gold(tiny_cfg(*EVAL)))
    assert f["eval/gold_reward"] == pytest.approx(m["eval/formula_gold_reward"], abs=1e-6)
    assert not [k for k in f if "formula" in k]


# -- cache keys ------------------------------------------------------------------------------------------------


FORMULA_PREFS_KEYS = {"sft", "world", "gold", "labeler", "generation", "n_train", "n_eval", "seed", "on_policy_path",
                      "on_policy_fraction"}


def test_the_gold_rm_is_in_the_cache_keys_and_the_formula_keeps_the_old_ones(tiny_cfg, gold_rms, monkeypatch,
                                                                            tmp_path):
    from rlhf_lab.stages import dpo, prefs
    from rlhf_lab.stages import rm as rm_stage
    from rlhf_lab.stages.pipeline import cache_for

    monkeypatch.setattr(prefs, "ensure", lambda stage, cfg: "/fake/sft")  # no SFT to train for a spec
    monkeypatch.setattr(dpo, "ensure", lambda stage, cfg: "/fake/sft")
    formula = tiny_cfg()
    copy = tmp_path / "copy_of_along"
    shutil.copytree(gold_rms["along"], copy)
    cfgs = {"formula": formula, "along": tiny_cfg("gold=rm", f"gold.path={gold_rms['along']}"),
            "copy": tiny_cfg("gold=rm", f"gold.path={copy}"),
            "against": tiny_cfg("gold=rm", f"gold.path={gold_rms['against']}")}
    specs = {k: prefs.spec(c) for k, c in cfgs.items()}
    assert set(specs["formula"]) == FORMULA_PREFS_KEYS  # gold=formula adds nothing: every earlier key is valid
    keys = {k: cache_for(formula).path("prefs", s).name for k, s in specs.items()}
    assert keys["formula"] != keys["along"] != keys["against"] != keys["formula"]
    assert keys["along"] == keys["copy"]  # the content, not the folder, is the gold
    dpo_cfgs = {"formula": tiny_cfg("algo=dpo"), "along": tiny_cfg("algo=dpo", "gold=rm", f"gold.path={gold_rms['along']}"),
                "against": tiny_cfg("algo=dpo", "gold=rm", f"gold.path={gold_rms['against']}")}
    dpo_specs = {k: dpo.spec(c) for k, c in dpo_cfgs.items()}
    assert len({cache_for(formula).path("dpo", s).name for s in dpo_specs.values()}) == 3
    assert "gold_rm" not in dpo_specs["formula"]
    # external pairs are relabelled by the gold RM: it (and the labeler) enter the RM's data identity
    data = tmp_path / "pairs.jsonl"
    data.write_text('{"prompt": "p", "chosen": "a b", "rejected": "c"}\n' * 3)
    ext = ["data=jsonl", f"data.path={data}"]
    plain, with_gold = (rm_stage.data_identity(compose_cfg(ext)),
                        rm_stage.data_identity(compose_cfg([*ext, "gold=rm", f"gold.path={gold_rms['along']}"])))
    assert "gold_rm" not in plain and with_gold["gold_rm"] == specs["along"]["gold_rm"] and "labeler" in with_gold


# -- config and errors -----------------------------------------------------------------------------------------


def test_gold_rm_without_a_valid_path_fails_with_one_line_naming_gold_path(tiny_cfg, tmp_path):
    with pytest.raises(ConfigError, match=r"^gold\.path must be set with gold=rm: a reward-model artifact"):
        CC.validate(tiny_cfg("gold=rm"))
    with pytest.raises(ConfigError, match=r"^gold\.path must be a reward-model artifact folder") as err:
        CC.validate(tiny_cfg("gold=rm", f"gold.path={tmp_path}"))
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=r"gold\.path.*gold=rm_world builds its RM on the world"):
        CC.validate(compose_cfg(["gold=rm_world", "data=jsonl", f"data.path={__file__}"]))
    CC.validate(tiny_cfg("gold=rm_world"))  # builds its own: no folder needed
    # a direct call of the stage (no CLI check first) is checked by the same rule, in the same words
    with pytest.raises(ConfigError, match=r"^gold\.path must be a reward-model artifact folder"):
        G.rm_path(tiny_cfg("gold=rm", f"gold.path={tmp_path}"))
    with pytest.raises(ConfigError, match=r"^gold\.path must be set with gold=rm: a reward-model artifact"):
        G.rm_path(tiny_cfg("gold=rm"))


def test_rm_world_builds_a_large_same_source_rm_on_formula_labels_from_an_unbiased_labeler(tiny_cfg, monkeypatch):
    """The default gold: the adversarial recipe of reports/gold_recipes (broad pairs and nine cover policies'
    samples); gold=rm_world_sft is the recipe before it (its base: SFT pairs only, no covers)."""
    built = []
    monkeypatch.setattr(G, "cover_folders", lambda cfg: built.append(1) or [f"/covers/{c.seed}" for c in
                                                                             cfg.gold.build.covers])
    cfg = tiny_cfg("gold=rm_world", "reward_model=different_source", "labeler=length_and_filler", "algo=ppo")
    b = G.build_config(cfg)
    assert b.gold.source == "formula"  # its pairs are labelled by the formula: no recursion
    assert (b.labeler.length_bonus, b.labeler.filler_bonus) == (0.0, 0.0)
    rm = b.reward_model
    assert (rm.source, rm.family, rm.init) == ("same", cfg.policy.family, "sft")  # whatever the proxy's RM is
    assert (rm.arch.hidden, rm.arch.layers, rm.steps, rm.lora.r, rm.ensemble) == (128, 4, 1250, 0, 1)
    d = b.data
    assert (d.seed, d.n_train, d.on_policy_fraction, d.on_policy_pairing, d.degenerate_fraction) == (
        1, 40000, 0.4, "sft", 0.25)
    assert list(d.sft_temperatures) == [0.7, 1.0, 1.3]
    seeds = [(int(c.seed), int(c.get("round", 1))) for c in cfg.gold.build.covers]
    assert seeds == [(200, 1), (201, 1), (202, 1), (203, 1), (204, 1), (205, 1), (300, 2), (301, 2), (302, 2)]
    assert list(d.on_policy_path) == [f"/covers/{s}" for s, _ in seeds] and built  # the covers' samples, in order
    assert b.algo.name == G.BUILD_JOB and b.algo.name not in ("pretrain", "sft", "prefs", "rm")  # all upstream
    assert cfg.labeler.length_bonus == 0.25 and cfg.gold.source == "rm"  # the job's config is untouched
    old = G.build_config(tiny_cfg("gold=rm_world_sft"))
    assert (old.reward_model.steps, old.data.n_train, old.data.on_policy_fraction, old.data.degenerate_fraction,
            old.data.sft_temperatures, old.data.on_policy_path) == (400, 8000, 0.0, 0.0, None, None)
    assert len(built) == 1  # the SFT-pairs gold has no covers


# -- end to end ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_ppo_in_gold_rm_mode_logs_both_golds_and_trains_its_rm_on_gold_rm_labels(tiny_cfg, gold_rms, tmp_path):
    import mlflow

    from rlhf_lab import stages

    db = tmp_path / "mlflow.db"
    cfg = tiny_cfg("algo=ppo", "algo.steps=2", "algo.batch_size=8", "algo.num_minibatches=2", "reward_model.steps=20",
                   "eval.every_n_steps=1", "gold=rm", f"gold.path={gold_rms['along']}", mlflow_db=db)
    CC.validate(cfg)
    meta = stages.run_job(cfg, tmp_path / "out")
    ev, test = meta["eval"], meta["test"]
    assert {"eval/gold_reward", "eval/formula_gold_reward", "eval/gold_reward_a", "eval/formula_gold_reward_b"} <= set(ev)
    assert {"test/gold_reward", "test/formula_gold_reward"} <= set(test)
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    runs = mlflow.search_runs(experiment_names=["rlhf-lab"])
    ppo = runs[runs["tags.rlhf_lab.stage"] == "ppo"].iloc[0]
    for k in ("eval/gold_reward", "eval/formula_gold_reward", "test/formula_gold_reward", "objective/gold",
              "objective/formula_gold"):
        assert ppo[f"metrics.{k}"] == ppo[f"metrics.{k}"], k
    assert ppo["params.gold.source"] == "rm" and ppo["tags.rlhf_lab.upstream.gold_rm"]
    prefs_run = runs[runs["tags.rlhf_lab.stage"] == "prefs"].iloc[0]
    assert 0.0 <= prefs_run["metrics.prefs/gold_formula_agreement"] <= 1.0
    # the proxy RM's pairs carry the gold RM's scores
    from rlhf_lab.stages import prefs

    train, _ = prefs.load(cfg)
    scorer = G.load_scorer(cfg)
    q = train[:5]
    s = scorer([x.prompt for x in q], [x.chosen for x in q], [x.chosen_ended for x in q]).tolist()
    assert [x.gold_chosen for x in q] == pytest.approx(s, abs=1e-4)


def test_external_pairs_are_relabelled_by_the_gold_rm(gold_rms, tmp_path):
    import json

    from rlhf_lab.stages import prefs

    g = ReviewGenerator(8)
    rows = []
    for _ in range(30):
        p = g.prompt("train")
        a, b = g.response(p), g.response(p)
        if a != b:
            rows.append({"prompt": p, "chosen": a, "rejected": b})
    f = tmp_path / "pairs.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # world train-split prompts all hash below 0.8: held-out fractions of 0.3 leave eval and test some (10, 3)
    ext = ["data=jsonl", f"data.path={f}", "data.eval_fraction=0.3", "data.test_fraction=0.3", *SHARP]
    plain, _ = prefs.load(compose_cfg(ext))
    assert all(q.gold_chosen is None for q in plain)  # no formula, no gold RM: the dataset's labels as they are
    chosen = {}
    for name in ("along", "against"):
        train, held = prefs.load(compose_cfg([*ext, "gold=rm", f"gold.path={gold_rms[name]}"]))
        assert len(train) == len(plain) and all(q.gold_chosen > q.gold_rejected for q in train + held)
        chosen[name] = [q.chosen for q in train]
    assert all(x != y for x, y in zip(chosen["along"], chosen["against"]))  # the gold RM decides each label


def test_a_gold_ensemble_logs_its_members_disagreement_and_the_summary_warns_past_its_depth(tiny_cfg, rm_base,
                                                                                           random_policy, tmp_path):
    """eval/gold_rm_std: the mean over samples of the std of the members' standardised scores (by hand here);
    eval/gold_rm_std_ratio: that over the level rm_norm.json records for its held-out pairs; a one-member gold logs
    neither; the job summary warns past GOLD_DEPTH times the level, and only then."""
    from rlhf_lab.entry.run import GOLD_DEPTH, gold_depth_warning
    from rlhf_lab.models.reward import HELDOUT_SPREAD
    from rlhf_lab.stages.evaluate import evaluate

    member, tok = rm_base
    policy, ptok = random_policy
    base = tmp_path / "base"
    member.save_pretrained(base)
    tok.save_pretrained(base)
    torch.manual_seed(7)  # another scalar head: a second member that disagrees
    second = F.load_sequence_scorer(base, tok).eval()
    folder = tmp_path / "ensemble"
    folder.mkdir()
    tok.save_pretrained(folder)
    member.save_pretrained(folder / "member_0")
    second.save_pretrained(folder / "member_1")
    scorer = RewardScorer([member, second], tok, member_gain=[2.0, 0.5], member_bias=[0.1, -0.3])
    scorer.save_norm(folder, {HELDOUT_SPREAD: 0.01})
    cfg = tiny_cfg(*EVAL, "gold=rm", f"gold.path={folder}")
    m, rows = evaluate(cfg, policy, ptok, gold=G.load_gold(cfg))
    p, y, e = [r["prompt"] for r in rows], [r["response"] for r in rows], [r["ended"] for r in rows]
    raw = torch.stack([RewardScorer([m_], tok, normalize=False)(p, y, e) for m_ in (member, second)])
    z = torch.tensor([[2.0], [0.5]]) * raw + torch.tensor([[0.1], [-0.3]])
    by_hand = float(z.std(0, correction=0).mean())
    assert by_hand > 0 and m["eval/gold_rm_std"] == pytest.approx(by_hand, rel=1e-4)
    assert m["eval/gold_rm_std_ratio"] == pytest.approx(by_hand / 0.01, rel=1e-4)
    single = tiny_cfg(*EVAL, "gold=rm", f"gold.path={make_rm(tmp_path / 'one', member, tok, 1.0)}")
    one, _ = evaluate(single, policy, ptok, gold=G.load_gold(single))
    assert "eval/gold_rm_std" not in one and "eval/gold_rm_std_ratio" not in one
    assert "out of its depth" in gold_depth_warning({"eval/gold_rm_std_ratio": GOLD_DEPTH + 0.1})
    assert gold_depth_warning({"eval/gold_rm_std_ratio": GOLD_DEPTH}) is None and gold_depth_warning({}) is None


# cover policies at test size: their proxy's pairs, its RM, PPO's batch and the evaluations cut down
COVER_OVERRIDES = "[" + ",".join(f"'{o}'" for o in (
    "algo.batch_size=8", "algo.num_minibatches=2", "reward_model.steps=10", "data.n_train=40", "data.n_eval=10",
    "eval.n_prompts=8", "eval.n_test_prompts=8", "eval.n_ood_prompts=4", "eval.n_samples_logged=2")) + "]"
COVERED = ["gold=rm_world", "gold.build.reward_model.steps=10", "gold.build.reward_model.arch.hidden=32",
           "gold.build.reward_model.arch.layers=1", "gold.build.data.n_train=40", "gold.build.data.n_eval=10",
           "gold.build.data.on_policy_fraction=0.5", "gold.build.data.on_policy_pairing=sft",
           "gold.build.covers=[{seed:200,beta:0.0,steps:2},{seed:300,beta:0.0,steps:2,round:2}]",
           "gold.build.cover_gold_data={on_policy_fraction:0.25}", f"gold.build.cover_overrides={COVER_OVERRIDES}"]


def test_covers_are_the_default_ppo_job_on_the_jobs_world_whatever_the_job_and_its_arms(tiny_cfg):
    """A cover's config depends on the job only through its world and policy: two jobs that differ in the algorithm,
    β, the proxy and its labeler get the same covers (so every arm of a study shares one gold); round 2's proxy is
    labelled by the gold of round 1's covers with cover_gold_data over its data."""
    from rlhf_lab.config.keys import NOT_COMPUTED, drop_keys, to_plain

    a = tiny_cfg("algo=ppo", "kl=fixed", "kl.beta=0.3", *COVERED)
    b = tiny_cfg("algo=dpo", "labeler=unbiased", "reward_model.seed=7", "reward_model.steps=33", *COVERED)
    CC.validate(a)
    first, second = (G.cover_config(a, c) for c in a.gold.build.covers)
    assert drop_keys(to_plain(first), NOT_COMPUTED) == drop_keys(to_plain(G.cover_config(b, b.gold.build.covers[0])),
                                                                 NOT_COMPUTED)
    assert (first.algo.name, first.kl.name, first.kl.beta, first.algo.steps, first.seed, first.reward_model.seed,
            first.study, first.gold.source, first.labeler.name) == ("ppo", "fixed", 0.0, 2, 200, 200, G.COVER_STUDY,
                                                                    "formula", "length_biased")
    assert (first.algo.batch_size, first.data.n_train) == (8, 40) and first.policy == a.policy
    assert second.gold.source == "rm" and [int(c.seed) for c in second.gold.build.covers] == [200]
    assert second.gold.build.data.on_policy_fraction == 0.25 and second.seed == 300


@pytest.mark.parametrize("override,key", [
    ("gold.build.covers=[{seed:1,beta:0.0,steps:2,round:2}]", "gold.build.covers"),
    ("gold.build.covers=[{seed:1,beta:-1.0,steps:2}]", "gold.build.covers[0].beta"),
    ("gold.build.data.on_policy_path=somewhere", "gold.build.data.on_policy_path"),
])
def test_bad_covers_are_refused_naming_the_key(tiny_cfg, override, key):
    with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace(".", r"\.")):
        CC.validate(tiny_cfg("algo=ppo", *COVERED, override))


@pytest.mark.slow
def test_a_gold_with_covers_builds_them_first_round_by_round_and_reuses_them(tiny_cfg, tmp_path):
    """gold.build.covers end to end: the round-1 cover (against a formula-labelled proxy), round 1's gold, the round-2
    cover (against a proxy whose pairs that gold labelled), then the gold, whose on-policy pairs come from both covers
    against SFT samples; each cover a cached artifact (the policy, not PPO's training checkpoint) with its run in
    study gold_cover; asked again, nothing is rebuilt."""
    import mlflow

    from rlhf_lab.stages import prefs

    db = tmp_path / "mlflow.db"
    cfg = tiny_cfg("algo=ppo", *COVERED, mlflow_db=db)
    CC.validate(cfg)
    gold = G.rm_path(cfg)
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    runs = mlflow.search_runs(experiment_names=["rlhf-lab"])
    covers = runs[runs["tags.rlhf_lab.study"] == G.COVER_STUDY]
    covers = covers[covers["tags.rlhf_lab.stage"] == "ppo"].sort_values("params.seed")
    assert list(covers["params.seed"]) == ["200", "300"] and set(covers["status"]) == {"FINISHED"}
    assert list(covers["params.gold.source"]) == ["formula", "rm"]  # round 2 trained against a gold-labelled proxy
    assert (runs["tags.rlhf_lab.stage"] == "rm").sum() == 4  # two proxies, round 1's gold and the gold
    folders = [Path(p) for p in G.build_config(cfg).data.on_policy_path]
    assert all((f / "config.json").is_file() and not (f / "ppo_last.ckpt").exists() for f in folders)
    train, _ = prefs.load(G.build_config(cfg))
    assert 15 <= sum(p.source == "on_policy" for p in train) <= 20  # half the 40 pairs (a tie in text is dropped)
    assert G.rm_path(cfg) == gold and len(mlflow.search_runs(experiment_names=["rlhf-lab"])) == len(runs)
