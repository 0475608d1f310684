"""Bring your own model and data: scaled-down GPT-NeoX (Pythia), Qwen2, Llama and GPT-2 checkpoints with a chat
template (tests/tiny_archs.py) as policy, reference, RM and critic; LoRA targets by architecture; dtype and
attention keys; rm, dpo, ppo and grpo end to end on a conversational JSONL file and a save_to_disk folder."""

from __future__ import annotations

import mlflow
import pytest
import torch
from omegaconf import OmegaConf

from rlhf_lab import stages
from rlhf_lab.evaluation.ship_choice import FIGURES, RULE
from rlhf_lab.models import families as F
from rlhf_lab.models.adapters import with_lora
from tests.tiny_archs import ARCHS, conversational_jsonl, ultrafeedback_folder, world_pairs


def lora(targets, r=2):
    return OmegaConf.create({"r": r, "alpha": None, "dropout": 0.0, "target_modules": targets})


@pytest.mark.parametrize("arch", ARCHS)
def test_lora_targets_by_name_work_on_every_architecture(arch, arch_checkpoints):
    tok = F.load_tokenizer(arch_checkpoints[arch])
    ids = tok(["the lid is poor ."], return_tensors="pt").input_ids
    for targets in (None, "all-linear", "attention", "mlp"):
        model = with_lora(F.load_causal_lm(arch_checkpoints[arch], tok), lora(targets), "CAUSAL_LM")
        trainable = [n for n, p in model.named_parameters() if p.requires_grad]
        assert trainable and all("lora_" in n for n in trainable), (arch, targets)
        assert model(input_ids=ids).logits.shape[-1] >= len(tok)
    attn = {n for n, p in with_lora(F.load_causal_lm(arch_checkpoints[arch], tok), lora("attention"),
                                    "CAUSAL_LM").named_parameters() if p.requires_grad}
    mlp = {n for n, p in with_lora(F.load_causal_lm(arch_checkpoints[arch], tok), lora("mlp"),
                                   "CAUSAL_LM").named_parameters() if p.requires_grad}
    assert not attn & mlp  # the two groups are disjoint on every architecture (GPT-2's c_proj is in both)
    rm = with_lora(F.load_sequence_scorer(arch_checkpoints[arch], tok), lora("attention"), "SEQ_CLS")
    assert any(p.requires_grad for n, p in rm.named_parameters() if "score" in n)  # the head is trained too
    with pytest.raises(ValueError, match=r"algo.lora.target_modules=\['wq'\]: matches no module.*linear modules are"):
        with_lora(F.load_causal_lm(arch_checkpoints[arch], tok), lora(["wq"]), "CAUSAL_LM", key="algo.lora")


@pytest.mark.parametrize("arch", ARCHS)
def test_packed_rm_batches_on_every_architecture(arch, arch_checkpoints):
    """reward_model.packing: every decoder keeps sequences packed into a row apart (transformers' masks from the
    position ids), with LoRA too, and scores them as in a right-padded batch."""
    from rlhf_lab.models.batching import pack_rows, pad_right
    from rlhf_lab.models.packing import check_packing
    from rlhf_lab.models.reward import packable, rm_forward, rm_forward_packed

    tok = F.load_tokenizer(arch_checkpoints[arch])
    rm = F.load_sequence_scorer(arch_checkpoints[arch], tok).eval()
    seqs = tok(["the lid is poor .", "great", "i love the kettle , it is great .", "bad ."]).input_ids
    for model in (rm, with_lora(rm, lora("attention"), "SEQ_CLS").eval()):  # eval: GPT-2's dropout off
        assert packable(model)
        check_packing(model, "reward_model.packing")
        with torch.no_grad():
            padded = rm_forward(model, *pad_right(seqs, tok.pad_token_id))
            packed = rm_forward_packed(model, *pack_rows(seqs, tok.pad_token_id))
        assert torch.allclose(packed, padded, atol=1e-5), arch


def test_dtype_and_attention_implementation_keys(arch_checkpoints):
    node = OmegaConf.create({"dtype": "bfloat16", "attn_implementation": "eager"})
    model = F.load_causal_lm(arch_checkpoints["qwen2"], None, **F.load_options(node))
    assert next(model.parameters()).dtype == torch.bfloat16 and model.config._attn_implementation == "eager"
    assert F.load_options(OmegaConf.create({"dtype": None, "attn_implementation": None})) == {}


SMALL = ["eval.n_prompts=2", "eval.n_test_prompts=2", "eval.n_ood_prompts=0", "eval.every_n_steps=0",
                "eval.n_samples_logged=2", "generation.max_new_tokens=6", "generation.max_prompt_len=64",
                "trainer.progress_bar=false", "trainer.log_every_n_steps=1", "trainer.threads=1", "sft.steps=0",
                "trainer.max_steps=2", "reward_model.steps=2", "reward_model.batch_size=4",
                "reward_model.norm_samples=16"]
JOB = {"rm": ["algo=rm"], "dpo": ["algo=dpo", "algo.batch_size=4"],
       "ppo": ["algo=ppo", "algo.batch_size=4", "algo.num_minibatches=1", "algo.ppo_epochs=1"],
       "grpo": ["algo=grpo", "algo.batch_size=4", "algo.samples_per_prompt=2", "algo.num_minibatches=1"]}
METRICS = {"rm": ["loss/rm", "rewards/accuracies", "rm/accuracy", "rm/reward_std", "model/params_total"],
           "dpo": ["loss/dpo", "rewards/margins", "eval/kl", "eval/rewards/accuracies", "test/length"],
           "ppo": ["objective/kl", "objective/scores", "policy/clipfrac", "val/explained_variance", "eval/proxy_reward",
                   "ship/value", "ship/step"],
           "grpo": ["objective/kl", "objective/scores", "group/tie_frac", "eval/proxy_reward", "test/entropy",
                    "ship/value"]}
# every algorithm on two architectures and both data sources, every architecture in two jobs
CASES = [("rm", "gpt_neox", "jsonl"), ("rm", "gpt2", "folder"), ("dpo", "qwen2", "jsonl"), ("dpo", "llama", "folder"),
         ("ppo", "llama", "jsonl"), ("ppo", "gpt_neox", "folder"), ("grpo", "gpt2", "jsonl"), ("grpo", "qwen2", "folder")]


@pytest.fixture(scope="session")
def chat_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat_data")
    pairs = world_pairs(40)
    held_out = ["data.eval_fraction=0.2", "data.test_fraction=0.2"]  # 40 prompts: train 25, eval 11, test 4
    return {"jsonl": ["data=jsonl", f"data.path={conversational_jsonl(root / 'conv.jsonl', pairs)}", *held_out],
            "folder": ["data=hf", f"data.name={ultrafeedback_folder(root / 'uf', pairs)}",
                       "data.columns.prompt=instruction", *held_out]}


@pytest.mark.slow
@pytest.mark.parametrize("job, arch, data", CASES)
def test_job_runs_end_to_end_on_a_real_architecture(job, arch, data, arch_checkpoints, chat_data, session_cache,
                                                     tmp_path):
    from tests.conftest import compose_cfg

    db = tmp_path / "mlflow.db"
    cfg = compose_cfg(SMALL + JOB[job] + chat_data[data] + [
        f"policy.name_or_path={arch_checkpoints[arch]}", f"cache_dir={session_cache}",
        f"tracking.uri=sqlite:///{db}"])
    from rlhf_lab.config.checks import validate

    validate(cfg)
    meta = stages.run_job(cfg, tmp_path / "out")
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    runs = mlflow.search_runs(experiment_names=["rlhf-lab"])
    run = runs[runs["run_id"] == meta["run_id"]].iloc[0]
    assert run["status"] == "FINISHED" and run["tags.rlhf_lab.stage"] == job
    for m in METRICS[job]:
        assert run[f"metrics.{m}"] == run[f"metrics.{m}"], m  # logged, not NaN
    assert not any(c.startswith("metrics.") and "gold" in c and run[c] == run[c] for c in runs.columns)  # no gold
    if job != "rm":  # a saved policy of the same architecture, loadable as any checkpoint
        saved = F.load_causal_lm(tmp_path / "out" / "artifact")
        assert saved.config.model_type == arch
    quoted = {k: v.replace(FIGURES.text(), "") for k, v in meta["summary"].items()}  # the rule's figures: the world's
    assert not any("gold" in k or "gold" in v or "filler" in v for k, v in quoted.items())  # no gold of this run
    if job in ("ppo", "grpo"):  # the ship rule needs no gold: its value (above), tags, checkpoint and summary line
        assert run["tags.rlhf_lab.ship.step"] == str(meta["ship_step"]) and run["tags.rlhf_lab.ship.rule"] == RULE
        assert meta["summary"]["ship"].startswith(f"step {meta['ship_step']} by ") and "evaluations)" in quoted["ship"]
        assert F.load_causal_lm(meta["ship_path"]).config.model_type == arch
        assert "eval prompt" in meta["summary"]["kl"]  # every gold-free line with its n
        assert "(n=2 test prompts)" in meta["summary"]["proxy"]
    if job == "rm":  # the n of the held-out pairs beside the accuracy
        assert meta["summary"]["rm eval"].endswith(f"(n={int(meta['eval']['rm/n_eval_pairs'])} eval pairs)")


# ------------------------------------------------------------------------------------------------
# reward_model=minilm: a pretrained encoder (BERT) as a different-source RM


def tiny_bert(tmp_path):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                     num_labels=1, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return BertForSequenceClassification(cfg).eval()


def test_an_encoder_rm_reads_the_mean_embedding_and_ignores_padding(tmp_path):
    from rlhf_lab.models.batching import pad_right
    from rlhf_lab.models.reward import is_encoder, rm_forward

    from rlhf_lab.models.reward import packable

    model = tiny_bert(tmp_path)
    assert is_encoder(model) and not packable(model)  # reward_model.packing leaves an encoder's batches padded
    ids, mask = pad_right([[2, 7, 9, 3], [2, 5, 3]], 0)
    with torch.no_grad():
        r = rm_forward(model, ids, mask)
        h = model.bert(input_ids=ids[1:, :3]).last_hidden_state.mean(1)
        assert torch.allclose(r[1], model.classifier(h)[0, 0], atol=1e-5)  # mean over the attended tokens only
        assert torch.allclose(rm_forward(model, *pad_right([[2, 5, 3]], 0))[0], r[1], atol=1e-5)
    peft = with_lora(model, lora("attention"), "SEQ_CLS", key="reward_model.lora")
    assert is_encoder(peft.get_base_model()) and rm_forward(peft, ids, mask).shape == (2,)
    assert {n.split(".lora_A")[0].split(".")[-1] for n, p in peft.named_parameters() if "lora_A" in n} == {
        "query", "key", "value", "dense"}


def test_minilm_without_its_extra_is_one_clear_line(monkeypatch):
    import importlib.util

    from rlhf_lab.config.errors import ConfigError
    from rlhf_lab.config.checks import check_reward_model
    from tests.conftest import compose_cfg

    rc = compose_cfg(["reward_model=minilm"]).reward_model
    assert str(rc.source) == "pretrained" and F.pretrained_path("minilm").endswith("model")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == F.MINILM_PACKAGE else real(n, *a))
    with pytest.raises(ConfigError, match=r"pip install 'rlhf-lab\[minilm\]'"):
        check_reward_model(rc)
    with pytest.raises(ModuleNotFoundError, match=r"reward_model.name_or_path=minilm needs .*rlhf-lab\[minilm\]"):
        F.pretrained_path("minilm")


@pytest.mark.slow
def test_minilm_rm_trains_offline_and_beats_chance(session_cache, tmp_path):
    """The pretrained encoder learns world preferences (gold-labelled pairs) in 30 steps of 8 pairs."""
    import json

    from tests.conftest import TINY, compose_cfg

    f = tmp_path / "pairs.jsonl"
    f.write_text("".join(json.dumps({"prompt": p, "chosen": c, "rejected": r}) + "\n" for p, c, r in world_pairs(300, 3)))
    cfg = compose_cfg([o for o in TINY if not o.startswith("data.")] + [
        "algo=rm", "reward_model=minilm", "data=jsonl", f"data.path={f}", "data.eval_fraction=0.2",
        "trainer.max_steps=30", "reward_model.batch_size=8", "reward_model.norm_samples=32",
        f"cache_dir={session_cache}", f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"])
    meta = stages.run_job(cfg, tmp_path / "out")
    ev = meta["eval"]
    from rlhf_lab.config import data as DS
    from rlhf_lab.data.preferences import load_external

    n_eval = len(load_external(DS.external_data(cfg))[1])  # the pairs of the eval split's prompts (by a hash of the text), ~60
    assert ev["rm/n_eval_pairs"] == n_eval and n_eval > 40 and ev["rm/accuracy"] > 0.65  # chance 0.5 (SE ≈ 0.07)
    from rlhf_lab.models.reward import RewardScorer

    scorer = RewardScorer.from_path(tmp_path / "out" / "artifact")
    assert type(scorer.members[0]).__name__ == "BertForSequenceClassification"
    assert scorer.tokenizer.vocab_size == 30522  # MiniLM's own WordPiece vocabulary: policy text is re-encoded


@pytest.mark.slow
def test_ppo_on_a_prompt_only_dataset_with_a_trained_rm_folder(arch_checkpoints, chat_data, session_cache, tmp_path):
    """An RM trained on pairs (algo=rm), then RLOO on a prompt-only conversational file with reward_model.path."""
    import json

    from rlhf_lab.config.checks import validate
    from tests.conftest import compose_cfg

    common = SMALL + [f"policy.name_or_path={arch_checkpoints['gpt2']}", f"cache_dir={session_cache}",
                      f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"]
    rm = stages.run_job(compose_cfg(common + JOB["rm"] + chat_data["jsonl"]), tmp_path / "rm")
    f = tmp_path / "prompts.jsonl"
    f.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": p}]}) + "\n" for p, _, _ in world_pairs(12)))
    cfg = compose_cfg(common + ["algo=rloo", "algo.batch_size=4", "algo.samples_per_prompt=2", "data=jsonl",
                                f"data.path={f}", "data.eval_fraction=0.2", "data.test_fraction=0.2",
                                f"reward_model.path={tmp_path / 'rm' / 'artifact'}"])
    validate(cfg)
    meta = stages.run_job(cfg, tmp_path / "ppo")
    assert "eval/proxy_reward" in meta["eval"] and "test gold" not in meta["summary"]
    assert meta["summary"]["ship"].startswith(f"step {meta['ship_step']} by ")  # RLOO ships by the rule too
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["rlhf-lab"])
    rloo = runs[runs["run_id"] == meta["run_id"]].iloc[0]
    assert rloo["tags.rlhf_lab.upstream.rm"] in (rm["run_id"], str(tmp_path / "rm" / "artifact"))
    assert rloo["metrics.objective/scores"] == rloo["metrics.objective/scores"]  # logged, not NaN
    assert len(runs[runs["tags.rlhf_lab.stage"] == "rm"]) == 1  # the RM was not trained again
    # no gold: the run's figure draws the proxy reward against step and √KL only (tests/test_run_figure.py); the CLI
    # draws it after the job (rlhf_lab.entry.run), as here
    from rlhf_lab.analysis.run_figure import log_job_figure

    log_job_figure("rloo", f"sqlite:///{tmp_path / 'mlflow.db'}", meta["run_id"])
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert "proxy_vs_gold.png" in {a.path for a in client.list_artifacts(meta["run_id"])}
    assert "metrics.eval/gold_reward" not in runs.columns or rloo["metrics.eval/gold_reward"] != rloo[
        "metrics.eval/gold_reward"]
    with pytest.raises(Exception, match="reward_model.path must be a reward-model artifact folder"):
        validate(compose_cfg(common + ["algo=rloo", "data=jsonl", f"data.path={f}", f"reward_model.path={tmp_path}"]))


@pytest.mark.slow
def test_weights_copied_over_the_policy_folder_are_not_taken_for_the_cached_rm_of_the_old_ones(
        arch_checkpoints, chat_data, session_cache, tmp_path):
    """Issue 65 item 4, end to end: other weights saved over ``policy.name_or_path``'s ``model.safetensors`` give the
    RM (whose backbone that folder is) another cache key, so the RM of the old weights is never reused for them; the
    old weights back in the folder find the old RM again."""
    import shutil
    from pathlib import Path

    from rlhf_lab.stages import rm as rm_stage
    from rlhf_lab.stages.pipeline import cache_for
    from tests.conftest import compose_cfg

    policy = Path(shutil.copytree(arch_checkpoints["gpt2"], tmp_path / "policy"))
    cfg = compose_cfg(SMALL + JOB["rm"] + chat_data["jsonl"] + [
        f"policy.name_or_path={policy}", f"cache_dir={session_cache}", f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"])
    first = stages.run_job(cfg, tmp_path / "first")
    original = (policy / "model.safetensors").read_bytes()
    model = F.load_causal_lm(policy)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05)
    model.save_pretrained(policy)  # other weights in the same folder, under the same name
    second = stages.run_job(cfg, tmp_path / "second")
    assert second["cache_path"] != first["cache_path"]  # the same path as text; another content, another RM
    (policy / "model.safetensors").write_bytes(original)
    assert cache_for(cfg).path("rm", rm_stage.spec(cfg)) == Path(first["cache_path"])
