"""PPO (rlhf_lab/algorithms/ppo.py): checkpointed controller state, shared-base reference, resume, NaN guard.

The maths is tested in test_rl_math.py; these tests run the module on tiny sizes with the oracle reward
(`algo.reward=gold`), so no reward model has to be trained.
"""

from __future__ import annotations

import copy
from pathlib import Path

import mlflow
import pytest
import torch

from rlhf_lab import stages
from rlhf_lab.stages.pipeline import cache_for
from rlhf_lab.algorithms import ppo
from rlhf_lab.models.batching import pad_right
from rlhf_lab.config.world import gold_weights
from rlhf_lab.models.adapters import AdapterDisabled
from rlhf_lab.models.reward import encode_texts
from rlhf_lab.stages import ppo as ppo_stage
from rlhf_lab.stages import rm as rm_stage
from rlhf_lab.evaluation.policy import GoldScorer
from rlhf_lab.algorithms.guards import Diverged
from rlhf_lab.models import families as F
from rlhf_lab.models.sampling import response_logprobs, sample

pytestmark = pytest.mark.slow  # trains models: deselect with -m 'not slow'

PPO_TINY = [
    "algo=ppo", "algo.reward=gold", "algo.steps=2", "algo.batch_size=8", "algo.num_minibatches=2",
    "algo.ppo_epochs=1", "eval.every_n_steps=0", "generation.max_new_tokens=12", "eval.n_prompts=8",
    "eval.n_test_prompts=8",
    "trainer.threads=1",
]


def _runs(db):
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    return mlflow.search_runs(experiment_names=["rlhf-lab"])


def _history(db, run_id, key):
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    return {m.step: m.value for m in mlflow.tracking.MlflowClient().get_metric_history(run_id, key)}


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # 2 shared cores: oversubscription costs 10x
    yield
    torch.set_num_threads(n)


def _module(cfg, **kw):
    sft = stages.ensure("sft", cfg)
    tok = F.load_tokenizer(sft)
    scorer = GoldScorer(gold_weights(cfg))
    policy, reference, critic = ppo_stage.build_models(cfg.algo, sft, tok, scorer)
    return ppo.PPOModule(policy, reference, critic, tok, scorer, lambda s: ["how was the lamp ?"] * 8, cfg.algo,
                         cfg.kl, cfg.generation, gold_weights(cfg), **kw), sft, tok


def test_kl_controller_state_survives_checkpoint_round_trip(tiny_cfg):
    cfg = tiny_cfg(*PPO_TINY, "kl=adaptive", "kl.beta=0.05", "kl.target=3.0", "kl.horizon=500")
    m1, _, _ = _module(cfg)
    m1.kl_ctl.update(9.0, n_steps=64)  # KL above target: β rises by (1 + 0.2·64/500)
    assert m1.kl_ctl.beta == pytest.approx(0.05 * (1 + 0.2 * 64 / 500))
    m1.ppo_step = 7
    ckpt: dict = {}
    m1.on_save_checkpoint(ckpt)
    m2, _, _ = _module(cfg)
    assert m2.kl_ctl.beta == 0.05 and m2.ppo_step == 0
    m2.on_load_checkpoint(ckpt)
    assert m2.kl_ctl.state_dict() == m1.kl_ctl.state_dict()
    assert m2.ppo_step == 7
    # a checkpoint of another controller kind is refused, not silently mixed
    m3, _, _ = _module(tiny_cfg(*PPO_TINY, "kl=fixed"))
    with pytest.raises(ValueError, match="adaptive KL controller but kl=fixed"):
        m3.on_load_checkpoint(ckpt)


def test_shared_base_reference_equals_frozen_copy(tiny_cfg):
    cfg = tiny_cfg(*PPO_TINY, "algo.reference.kind=lora_disabled", "algo.lora.r=16")
    sft = stages.ensure("sft", cfg)
    tok = F.load_tokenizer(sft)
    policy, reference, critic = ppo_stage.build_models(cfg.algo, sft, tok)
    assert isinstance(reference, AdapterDisabled) and critic.backbone is None
    torch.manual_seed(0)
    with torch.no_grad():  # move the adapters away from the identity, as training would
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    frozen = F.load_causal_lm(sft, tok).eval()
    ro = sample(frozen, tok, ["how was the lamp ?", "tell me about the chair ."] * 4, 12)
    args = (ro.query_ids, ro.query_mask, ro.response_ids, ro.response_mask)
    with torch.no_grad():
        ref_shared = response_logprobs(reference, *args)
        ref_copy = response_logprobs(frozen, *args)
        pol = response_logprobs(policy, *args)
    assert torch.allclose(ref_shared, ref_copy, atol=1e-5)
    assert (pol - ref_copy).abs().max() > 1e-2  # the adapters do change the policy
    # no second copy: the shared mode holds the base once (plus adapters and a head)
    separate = ppo_stage.model_bytes(frozen, copy.deepcopy(frozen), copy.deepcopy(frozen))
    shared = ppo_stage.model_bytes(policy, critic)
    assert shared < 0.6 * separate


def test_ppo_resumes_mid_training_with_identical_beta_and_steps(tiny_cfg, tmp_path):
    db = tmp_path / "mlflow.db"
    common = [*PPO_TINY, "algo.steps=4", "kl=adaptive", "kl.beta=0.1", "kl.target=0.05", "kl.horizon=40"]
    meta_a = stages.run_job(tiny_cfg(*common, "algo.checkpoint_every=2", mlflow_db=db), tmp_path / "a")
    ckpt = tmp_path / "a" / "artifact" / "ppo_step00002.ckpt"
    assert ckpt.exists()
    meta_b = stages.run_job(tiny_cfg(*common, f"algo.resume_from={ckpt}", mlflow_db=db), tmp_path / "b")
    assert meta_a["ppo_steps"] == meta_b["ppo_steps"] == 4
    assert meta_a["global_step"] == meta_b["global_step"] == 4 * 2
    beta_a = _history(db, meta_a["run_id"], "objective/beta")
    beta_b = _history(db, meta_b["run_id"], "objective/beta")
    assert sorted(beta_b) == [3, 4]  # the resumed run continues at step 3
    assert len(set(beta_a.values())) > 1  # β did move, so equality below means something
    for s in (3, 4):
        assert beta_b[s] == pytest.approx(beta_a[s], rel=1e-9)
    assert meta_b["beta"] == pytest.approx(meta_a["beta"], rel=1e-9)
    # same sampling stream after the resume (RNG state restored): same batch, same scores
    sc_a = _history(db, meta_a["run_id"], "objective/scores")
    sc_b = _history(db, meta_b["run_id"], "objective/scores")
    assert sc_b[3] == pytest.approx(sc_a[3], abs=1e-6)
    runs = _runs(db)
    ppo_runs = runs[runs["tags.rlhf_lab.stage"] == "ppo"]
    assert set(ppo_runs["status"]) == {"FINISHED"} and len(ppo_runs) == 2
    row = ppo_runs[ppo_runs["run_id"] == meta_a["run_id"]].iloc[0]
    cfg = tiny_cfg(*common)
    sft_run_id = cache_for(cfg).meta(stages.ensure("sft", cfg))["run_id"]
    assert row["tags.rlhf_lab.upstream.sft"] == sft_run_id
    for k in ("objective/kl", "objective/kl_k3", "objective/gold", "policy/clipfrac", "loss/value",
              "val/explained_variance", "eval/gold_reward", "eval/kl", "time/tokens_per_s"):
        assert f"metrics.{k}" in runs.columns and row[f"metrics.{k}"] == row[f"metrics.{k}"], k
    assert set(meta_a["eval"]) >= {"eval/gold_reward", "eval/kl"} and "test gold" in meta_a["summary"]
    assert (tmp_path / "a" / "artifact" / "config.json").exists()  # the trained policy, save_pretrained


def test_policy_as_own_reference_gives_zero_kl_rloo_shared_base(tiny_cfg, tmp_path):
    db = tmp_path / "mlflow.db"
    # claim C3: reference re-synced every step = the policy itself -> KL ≡ 0 (k1, k2 and k3)
    meta = stages.run_job(tiny_cfg(*PPO_TINY, "algo.reference.sync_every=1", "algo.critic=none",
                                     "algo.baseline=loo", "algo.samples_per_prompt=2", "algo.kl_in=loss",
                                     "algo.kl_estimator=k3", mlflow_db=db), tmp_path / "a")
    for k in ("objective/kl_k1", "objective/kl_k2", "objective/kl_k3"):
        assert set(_history(db, meta["run_id"], k).values()) == {0.0}
    assert _history(db, meta["run_id"], "val/explained_variance") == {}  # no critic
    (eval_s,), (train_s,) = (_history(db, meta["run_id"], k).values() for k in ("time/eval_s", "time/train_s"))
    assert 0 < eval_s < train_s  # the evaluations' share of the fit (the job summary's time line)
    assert "evaluations" in meta["summary"]["time"] and "setup" not in meta["summary"]["time"]  # no CLI: no clock
    # the steps' time split into its phases: each the sum of that phase's per-step time/* metric
    for key, name in (("time/rollout_s", "generation"), ("time/update_s", "update")):
        total = sum(_history(db, meta["run_id"], key).values())
        assert f"{name} {total:.1f} s" in meta["summary"]["time"], (key, meta["summary"]["time"])
    assert ", the rest " in meta["summary"]["time"]
    # shared base (LoRA) runs end to end and reports a KL that grows from 0
    meta = stages.run_job(tiny_cfg(*PPO_TINY, "algo.reference.kind=lora_disabled", "algo.lora.r=16", "algo.lr=3e-3", mlflow_db=db), tmp_path / "b")
    kl = _history(db, meta["run_id"], "objective/kl_k3")
    assert kl[1] == pytest.approx(0.0, abs=1e-6) and kl[2] > 0
    assert meta["memory/model_bytes"] < 0.6 * 3 * F.n_params(F.load_causal_lm(stages.ensure("sft", tiny_cfg(*PPO_TINY)))) * 4


@pytest.mark.parametrize("what", ["nan_score", "inf_logprob"])
def test_non_finite_values_stop_the_run_and_mark_it_failed(tiny_cfg, tmp_path, monkeypatch, what):
    db = tmp_path / "mlflow.db"
    if what == "nan_score":
        monkeypatch.setattr(ppo_stage, "load_reward",
                            lambda cfg, gold=None: (lambda p, r, e: torch.full((len(p),), float("nan")), None))
        match = "non-finite reward-model score at PPO step 0"
    else:
        real = ppo.token_logprobs

        def bad(*args, **kw):  # with or without the entropy beside the log-probs
            out = real(*args, **kw)
            logp = (out[0] if isinstance(out, tuple) else out).clone()
            logp[0, 0] = float("-inf")
            return (logp, *out[1:]) if isinstance(out, tuple) else logp

        monkeypatch.setattr(ppo, "token_logprobs", bad)
        match = "non-finite policy log-prob at PPO step 0"
    with pytest.raises(FloatingPointError, match=match):
        stages.run_job(tiny_cfg(*PPO_TINY, mlflow_db=db), tmp_path / "out")
    runs = _runs(db)
    row = runs[runs["tags.rlhf_lab.stage"] == "ppo"].iloc[0]
    assert row["status"] == "FAILED"
    assert "FloatingPointError: non-finite" in row["tags.rlhf_lab.error"]


def test_config_errors_are_clear(tiny_cfg):
    with pytest.raises(ValueError, match="algo.samples_per_prompt must be >= 2 .*RLOO"):
        _module(tiny_cfg(*PPO_TINY, "algo.critic=none", "algo.baseline=loo"))
    with pytest.raises(ValueError, match="algo.critic=rm needs a reward model"):
        _module(tiny_cfg(*PPO_TINY, "algo.critic=rm"))
    with pytest.raises(ValueError, match="algo.reference.sync_every must be 0 with algo.reference.kind=lora_disabled"):
        _module(tiny_cfg(*PPO_TINY, "algo.reference.kind=lora_disabled", "algo.lora.r=16", "algo.reference.sync_every=5"))

    class OtherTokRM:  # an RM of another family: its tokenizer differs from the policy's
        members = [object()]
        tokenizer = type("T", (), {"get_vocab": lambda self: {"x": 0}, "eos_token_id": 0, "pad_token_id": 0})()

    cfg = tiny_cfg(*PPO_TINY, "algo.critic=rm")
    sft = stages.ensure("sft", cfg)
    with pytest.raises(ValueError, match="share the policy's tokenizer"):
        ppo_stage.build_models(cfg.algo, sft, F.load_tokenizer(sft), OtherTokRM())


def test_reference_path_needs_the_policy_tokenizer(tiny_cfg, tmp_path):
    cfg = tiny_cfg(*PPO_TINY)
    sft = stages.ensure("sft", cfg)
    tok = F.load_tokenizer(sft)
    # claim C8: any checkpoint with the policy's tokenizer can be the reference (here: the SFT model itself)
    _, ref, _ = ppo_stage.build_models(tiny_cfg(*PPO_TINY, f"algo.reference.path={sft}").algo, sft, tok)
    assert not any(p.requires_grad for p in ref.parameters())
    other = F.train_tokenizer("a", ["the lamp is great .", "it works perfectly ."] * 50, 64)
    other.save_pretrained(tmp_path / "other")
    with pytest.raises(ValueError, match="different tokenizer than the policy"):
        ppo_stage.build_models(tiny_cfg(*PPO_TINY, f"algo.reference.path={tmp_path / 'other'}").algo, sft, tok)


def test_ppo_with_trained_reward_model_and_rm_critic(tiny_cfg, tmp_path):
    db = tmp_path / "mlflow.db"
    cfg = tiny_cfg(*PPO_TINY, "algo.reward=rm", "algo.critic=rm", "reward_model.steps=10",
                   "data.n_train=64", "data.n_eval=32", "reward_model.norm_samples=64", mlflow_db=db)
    meta = stages.run_job(cfg, tmp_path / "out")
    runs = _runs(db)
    row = runs[runs["tags.rlhf_lab.stage"] == "ppo"].iloc[0]
    rm_run_id = cache_for(cfg).meta(stages.ensure("rm", cfg))["run_id"]  # the run that built the RM (maybe another test's)
    assert row["status"] == "FINISHED" and row["tags.rlhf_lab.upstream.rm"] == rm_run_id
    assert "eval/proxy_reward" in meta["eval"] and "proxy" in meta["summary"]
    # the critic starts as the RM (InstructGPT): its head is the RM's, folded with the normalisation

    scorer = rm_stage.load_scorer(cfg)
    _, _, critic = ppo_stage.build_models(cfg.algo, stages.ensure("sft", cfg), scorer.tokenizer, scorer)
    w = scorer.members[0].score.weight[0] * scorer.gain * float(scorer.member_gain[0])
    assert torch.allclose(critic.head.weight[0], w)
    ids, mask = pad_right(encode_texts(scorer.tokenizer, ["how was the lamp ?"], ["it is great ."], [True], 64), 0)
    h = critic.backbone(input_ids=ids, attention_mask=mask).last_hidden_state
    v_last = critic.head(h[:, -1])[0, 0]  # the value read where the RM reads: the last token
    assert v_last.item() == pytest.approx(scorer(["how was the lamp ?"], ["it is great ."], [True]).item(), abs=1e-4)


@pytest.mark.parametrize("overrides, match", [
    (["algo.lr=1e6", "algo.steps=4"], "algo.lr"),
    (["algo.min_entropy=100"], r"policy entropy .* < algo.min_entropy=100.0 at PPO step 0"),
    (["algo.max_kl=1e-9", "algo.lr=1e-2", "algo.steps=3"], r"> algo.max_kl=1e-09 at PPO step [12]"),
])
def test_divergence_stops_the_run_failed(tiny_cfg, tmp_path, overrides, match):
    db = tmp_path / "mlflow.db"
    with pytest.raises((Diverged, FloatingPointError), match=match):
        stages.run_job(tiny_cfg(*PPO_TINY, *overrides, mlflow_db=db), tmp_path / "out")
    row = _runs(db).iloc[0]
    assert row["tags.rlhf_lab.stage"] == "ppo" and row["status"] == "FAILED" and "algo." in row["tags.rlhf_lab.error"]


def test_the_start_of_run_evaluation_is_computed_once_and_reused_to_the_digit(tiny_cfg, tmp_path):
    """eval.reuse_start: a job of another seed, β and learning rate reuses the SFT policy's start evaluations of an
    earlier job (eval/*, test/* and the OOD slice, from the artifact cache), the same numbers as computing them; the
    job's training is the same as with them computed; another evaluation setting computes its own."""
    db = tmp_path / "mlflow.db"
    base = [*PPO_TINY, "algo.reward=rm", "eval.n_ood_prompts=4"]
    off = stages.run_job(tiny_cfg(*base, "seed=3", "eval.reuse_start=false", mlflow_db=db), tmp_path / "off")
    a = stages.run_job(tiny_cfg(*base, "seed=3", mlflow_db=db), tmp_path / "a")
    b = stages.run_job(tiny_cfg(*base, "seed=4", "kl.beta=0.5", "algo.lr=1e-3", mlflow_db=db), tmp_path / "b")
    c = stages.run_job(tiny_cfg(*base, "seed=3", "eval.n_prompts=6", mlflow_db=db), tmp_path / "c")
    for key in ("eval/gold_reward", "eval/proxy_reward", "eval/kl", "eval/entropy", "eval/length", "test/gold_reward",
                "test/proxy_reward", "eval/gold_reward_ood"):
        assert len({_history(db, m["run_id"], key)[0] for m in (off, a, b)}) == 1, key
    assert a["test"] == off["test"] and a["eval"] == off["eval"]  # reused or computed: the same training
    tags = _runs(db).set_index("run_id")
    start = [tags.loc[m["run_id"]].get("tags.rlhf_lab.start_eval.eval") for m in (off, a, b, c)]
    assert start[0] is None or start[0] != start[0]  # computed by the job itself: no artifact named
    assert start[1] == start[2] and Path(start[1], "start_evaluation.json").is_file()  # one artifact, both jobs
    assert start[3] != start[1]  # eval.n_prompts changes the evaluation: its own
    test_start = "tags.rlhf_lab.start_eval.test"
    assert tags.loc[a["run_id"], test_start] == tags.loc[b["run_id"], test_start]


def test_a_probe_policy_measures_every_rm_on_the_same_text(tiny_cfg, tmp_path):
    """eval.probe_path (issue 42, point 1): the start and the end of a PPO job log the RM's accuracy against gold on a
    fixed probe policy's samples; the RM is frozen, so both are equal, and the figure does not depend on what the job
    optimised (another seed, another β: the same figure for the same RM); a missing folder is refused in one line."""
    from rlhf_lab.config.checks import validate
    from rlhf_lab.config.errors import ConfigError

    db = tmp_path / "mlflow.db"
    rm_ppo = [*(o for o in PPO_TINY if o != "algo.reward=gold"), "eval.n_prompts=48"]  # the proxy RM scores
    sft = stages.ensure("sft", tiny_cfg(*rm_ppo, mlflow_db=db))
    metas = [stages.run_job(tiny_cfg(*rm_ppo, f"eval.probe_path={sft}", *extra, mlflow_db=db), tmp_path / name)
             for name, extra in (("a", []), ("b", ["seed=1", "kl=fixed", "kl.beta=0.5"]))]
    for meta in metas:
        probe = _history(db, meta["run_id"], "probe/proxy_gold_agreement")
        assert len(probe) == 2 and len(set(probe.values())) == 1, probe  # start and end, equal
        (value,) = set(probe.values())
        assert 0.3 < value < 1.0, value  # an RM better than chance, not the gold itself
        assert 0 < min(_history(db, meta["run_id"], "probe/proxy_gold_agreement_se").values())
    firsts = [_history(db, m["run_id"], "probe/proxy_gold_agreement") for m in metas]
    assert set(firsts[0].values()) == set(firsts[1].values())  # one RM, one probe: one figure, whatever the job did
    with pytest.raises(ConfigError, match="eval.probe_path"):
        validate(tiny_cfg(*rm_ppo, f"eval.probe_path={tmp_path / 'nowhere'}"))
