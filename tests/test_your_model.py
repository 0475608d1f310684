"""Bring your own model and data: scaled-down GPT-NeoX (Pythia), Qwen2, Llama and GPT-2 checkpoints with a chat
template (tests/tiny_archs.py) as policy, reference, RM and critic; LoRA targets by architecture; dtype and
attention keys; rm, dpo, ppo and grpo end to end on a conversational JSONL file and a save_to_disk folder."""

from __future__ import annotations

import mlflow
import pytest
import torch
from omegaconf import OmegaConf

from rlhf_lab import stages
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
           "ppo": ["objective/kl", "objective/scores", "policy/clipfrac", "val/explained_variance", "eval/proxy_reward"],
           "grpo": ["objective/kl", "objective/scores", "group/tie_frac", "eval/proxy_reward", "test/entropy"]}
# every algorithm on two architectures and both data sources, every architecture in two jobs
CASES = [("rm", "gpt_neox", "jsonl"), ("rm", "gpt2", "folder"), ("dpo", "qwen2", "jsonl"), ("dpo", "llama", "folder"),
         ("ppo", "llama", "jsonl"), ("ppo", "gpt_neox", "folder"), ("grpo", "gpt2", "jsonl"), ("grpo", "qwen2", "folder")]


@pytest.fixture(scope="session")
def chat_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat_data")
    pairs = world_pairs(40)
    return {"jsonl": ["data=jsonl", f"data.path={conversational_jsonl(root / 'conv.jsonl', pairs)}"],
            "folder": ["data=hf", f"data.name={ultrafeedback_folder(root / 'uf', pairs)}",
                       "data.columns.prompt=instruction"]}


@pytest.mark.slow
@pytest.mark.parametrize("job, arch, data", CASES)
def test_job_runs_end_to_end_on_a_real_architecture(job, arch, data, arch_checkpoints, chat_data, session_dir,
                                                     tmp_path):
    from tests.conftest import compose_cfg

    db = tmp_path / "mlflow.db"
    cfg = compose_cfg(SMALL + JOB[job] + chat_data[data] + [
        f"policy.name_or_path={arch_checkpoints[arch]}", f"cache_dir={session_dir / 'cache'}",
        f"tracking.uri=sqlite:///{db}"])
    from rlhf_lab.config_checks import validate

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
        assert meta["summary"]["gold"].startswith("no gold reward")
