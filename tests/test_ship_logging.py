"""What a ship-rule study logs in every policy run (issue 67): each key off by default, and with it on,
``eval.test_each_eval`` (test/* at every evaluation), ``reward_model.heldout`` (eval/heldout_reward from an RM on pairs
the proxy never saw), ``reward_model.ensemble`` >= 2 (eval/proxy_ensemble_std) and ``eval.save_checkpoints`` (a Hugging
Face folder per evaluation)."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import mlflow
import pytest

from rlhf_lab import stages
from rlhf_lab.config.errors import ConfigError
from rlhf_lab.config.keys import ADDED_OFF, drop_keys, to_plain
from rlhf_lab.config.world import world_settings
from rlhf_lab.runs import identity as J
from rlhf_lab.runs.cache import artifact_key
from rlhf_lab.runs.contents import digest_text
from rlhf_lab.world import prompt_space
from rlhf_lab.world import streams as D
from tests.conftest import compose_cfg


def test_the_added_keys_at_their_default_leave_every_job_identity_as_it_was():
    """A job's config digest (skip_finished; the cover and pre-emption keys hold the same config) with the added keys at
    their default is the digest of its config without them, as a job made before they existed computed it; a key
    turned on makes it another job. A key of one algorithm's group (``algo.shared_prompt``: PPO's) is absent from
    another's config."""
    seen = set()
    for overrides in ([], ["algo=dpo"], ["algo=grpo", "reward_model.ensemble=3"]):
        plain = to_plain(compose_cfg(overrides))
        keys = [k for k in ADDED_OFF if k.split(".")[1] in plain[k.split(".")[0]]]
        seen.update(keys)
        assert all(plain[k.split(".")[0]][k.split(".")[1]] is False for k in keys)  # composed, at their default
        old = drop_keys(copy.deepcopy(plain), ADDED_OFF)  # the config as composed before the keys existed
        assert J.config_digest(plain) == digest_text(json.dumps(J.computed_config(old), sort_keys=True, default=str))
        for key in keys:
            assert J.config_digest(to_plain(compose_cfg([*overrides, f"{key}=true"]))) != J.config_digest(plain), key
    assert seen == set(ADDED_OFF)  # every added key composed somewhere


def test_the_proxy_rm_and_its_pairs_keep_their_keys_with_a_held_out_rm(tiny_cfg, monkeypatch, tmp_path):
    """reward_model.heldout trains another RM beside the proxy: the proxy, its pairs and the SFT policy are the same
    artifacts (the same cache keys) with it on; the held-out RM and its pairs are others."""
    from rlhf_lab.stages import dpo, pipeline, ppo  # noqa: F401 (imported first: those that import cache_for)
    from rlhf_lab.stages.heldout import heldout_config

    recorded: dict = {}

    class Recorder:
        def get_or_build(self, stage, spec, build):
            recorded[stage] = artifact_key(stage, spec)
            return tmp_path / recorded[stage], False

        def path(self, stage, spec):  # the RM's spec names its pairs by their folder
            recorded[stage] = artifact_key(stage, spec)
            return tmp_path / recorded[stage]

    def keys(cfg):
        recorded.clear()
        for module in [m for name, m in sys.modules.items() if name.startswith("rlhf_lab.stages.")]:
            if getattr(module, "cache_for", None) is not None:  # every module that took the name
                monkeypatch.setattr(module, "cache_for", lambda cfg: Recorder())
        pipeline.ensure("rm", cfg)
        return dict(recorded)

    off = keys(tiny_cfg())
    assert set(off) == {"pretrain", "sft", "prefs", "rm"}
    assert keys(tiny_cfg("reward_model.heldout=true")) == off
    other = keys(heldout_config(tiny_cfg("reward_model.heldout=true", "reward_model.ensemble=3")))
    assert other["sft"] == off["sft"] and other["prefs"] != off["prefs"] and other["rm"] != off["rm"]


def test_held_out_prompts_lie_outside_the_excluded_ones_and_are_fixed_by_their_stream():
    world = world_settings(compose_cfg([]))
    proxy = D.prompts(world, "prefs", 300)
    held = D.prompts_outside(world, "prefs_heldout", 300, set(proxy))
    assert len(held) == 300 and not set(held) & set(proxy)
    assert held == D.prompts_outside(world, "prefs_heldout", 300, set(proxy))  # the same in every job
    assert all(world.splits.split_of(p) == "train" for p in held)  # training prompts: never an eval or test one
    with pytest.raises(ValueError, match="too small"):
        D.prompts_outside(world, "prefs_heldout", 5, set(prompt_space()))  # every prompt excluded


def test_the_keys_refuse_what_they_cannot_do_in_one_line(tiny_cfg, tmp_path):
    from rlhf_lab.stages.evaluate import policy_evaluations
    from rlhf_lab.stages.heldout import heldout_config

    with pytest.raises(ConfigError, match="eval.save_checkpoints must be false with trainer=fsdp"):
        policy_evaluations(tiny_cfg("algo=ppo", "eval.save_checkpoints=true", "trainer=fsdp_cpu"), {}, None, None,
                           tmp_path, [])
    with pytest.raises(ConfigError, match="reward_model.heldout must be false with data=jsonl"):
        heldout_config(compose_cfg(["data=jsonl", "data.path=x.jsonl", "reward_model.heldout=true"]))
    with pytest.raises(ConfigError, match="reward_model.heldout must be false with reward_model.path"):
        heldout_config(tiny_cfg(f"reward_model.path={tmp_path}", "reward_model.heldout=true"))


def _periodic(monkeypatch, steps: int, **kw):
    """A PeriodicEval (evaluations at steps 2 and 4) run over `steps` training steps on a stand-in trainer; returns
    (the steps whose logged metrics held test/*, the (step, metric names) `after` saw, the callback)."""
    from types import SimpleNamespace

    from rlhf_lab.evaluation import callbacks as C

    logged, seen = [], []
    monkeypatch.setattr(C.active_run, "log_metrics", lambda m, step=None, **_: logged.append((step, dict(m))))
    monkeypatch.setattr(C, "log_samples_table", lambda rows, name: None)
    ev = C.PeriodicEval(lambda: ({"eval/gold_reward": 1.0}, []), at_steps=[2, 4],
                        test=lambda: ({"test/gold_reward": 2.0}, []), after=lambda s, m: seen.append((s, set(m))),
                        step_fn=lambda trainer, module: trainer.step, **kw)
    trainer = SimpleNamespace(global_rank=0, step=0)
    ev.on_train_start(trainer, None)
    for trainer.step in range(1, steps + 1):
        ev.on_train_batch_end(trainer, None, None, None, None)
    ev.on_train_end(trainer, None)
    return [s for s, m in logged if "test/gold_reward" in m], seen, ev


def test_the_test_evaluation_runs_at_every_evaluation_once_and_training_never_sees_it(monkeypatch):
    tests, seen, ev = _periodic(monkeypatch, 4, test_each_eval=True, save=lambda step: f"checkpoints/{step}")
    assert tests == [0, 2, 4]  # the end (step 4, an evaluation) is tested once
    assert seen == [(0, {"eval/gold_reward"}), (2, {"eval/gold_reward"}), (4, {"eval/gold_reward"})]  # eval/* only
    assert ev.saved == {0: "checkpoints/0", 2: "checkpoints/2", 4: "checkpoints/4"}
    tests, _, ev = _periodic(monkeypatch, 5)
    assert tests == [0, 5] and ev.saved == {}  # off: the start and the end, as before


def _history(db, run_id, key):
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    return {m.step: m.value for m in mlflow.tracking.MlflowClient().get_metric_history(run_id, key)}


@pytest.mark.slow
def test_a_ppo_job_with_every_key_on_logs_each_signal_at_every_evaluation(tiny_cfg, tmp_path):
    """One tiny PPO job with the keys of a ship study on: every evaluation (steps 0, 1, 2) logs the test gold, the
    held-out RM's reward and the proxy ensemble's disagreement, and saves a checkpoint that from_pretrained loads; the
    held-out RM's training pairs share no prompt with the proxy's; the summary names the checkpoints, and the ship
    rule's checkpoint, saved and loadable, with its gold regret."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlhf_lab.data.preferences import load_pairs
    from rlhf_lab.stages.heldout import heldout_config

    db = tmp_path / "mlflow.db"
    cfg = tiny_cfg("algo=ppo", "algo.steps=2", "algo.batch_size=8", "algo.num_minibatches=2", "algo.ppo_epochs=1",
                   "eval.every_n_steps=1", "generation.max_new_tokens=12", "eval.n_prompts=8", "eval.n_test_prompts=8",
                   "eval.n_ood_prompts=4", "reward_model.steps=10", "data.n_train=64", "data.n_eval=32",
                   "reward_model.norm_samples=64", "reward_model.ensemble=2", "reward_model.heldout=true",
                   "eval.test_each_eval=true", "eval.save_checkpoints=true", mlflow_db=db)
    meta = stages.run_job(cfg, tmp_path / "out")
    run, out = meta["run_id"], Path(meta["artifact"])  # <output dir>/artifact
    for key in ("test/gold_reward", "test/heldout_reward", "eval/heldout_reward", "eval/heldout_reward_se",
                "eval/proxy_ensemble_std", "eval/proxy_reward", "eval/gold_reward"):
        assert set(_history(db, run, key)) == {0, 1, 2}, key
    assert min(_history(db, run, "eval/proxy_ensemble_std").values()) > 0  # two members of other seeds disagree
    assert set(_history(db, run, "eval/gold_reward_ood")) == {0, 1, 2}  # the held-out evaluation, whole
    for step in (0, 1, 2):
        folder = out / "checkpoints" / f"step_{step:06d}"
        model = AutoModelForCausalLM.from_pretrained(folder)
        assert AutoTokenizer.from_pretrained(folder) is not None and model.num_parameters() > 0
    assert "3 policies" in meta["summary"]["checkpoints"] and str(out.resolve() / "checkpoints") in meta["summary"][
        "checkpoints"]
    # the ship rule's checkpoint (issue 67 point 5): one folder, the evaluation the rule ships, loadable; with the test
    # gold of every evaluation its gold regret is logged and quoted beside the gold's own best
    step, ship = meta["ship_step"], meta["summary"]["ship"]
    assert step in (0, 1, 2) and meta["ship_path"] == str(out.resolve() / "ship")
    assert AutoModelForCausalLM.from_pretrained(meta["ship_path"]).num_parameters() > 0
    assert ship.startswith(f"step {step} by proxy - 0.2*sqrt(KL)") and f"saved at {meta['ship_path']}" in ship
    assert "n=3 evaluations" in ship and "the gold's own best" in ship and "gold regret of this choice" in ship
    assert meta["summary"]["kl"].endswith(" nats/response (eval, n=8 eval prompts)")  # every line with its n
    assert set(_history(db, run, "ship/value")) == {0, 1, 2} and set(_history(db, run, "ship/gold_regret")) == {step}
    tags = mlflow.get_run(run).data.tags
    assert (tags["rlhf_lab.ship.step"], tags["rlhf_lab.ship.rule"], tags["rlhf_lab.ship.path"]) == (
        str(step), "proxy_minus_sqrt_kl", meta["ship_path"])
    assert tags["rlhf_lab.ship"] == ship  # the run carries the summary's line
    assert tags["rlhf_lab.checkpoints"] == str(out.resolve() / "checkpoints") and tags["rlhf_lab.upstream.heldout_rm"]
    proxy_pairs = stages.ensure("prefs", cfg)
    held_pairs = stages.ensure("prefs", heldout_config(cfg))
    proxy_prompts = {p.prompt for p in load_pairs(proxy_pairs / "train.jsonl")}
    held_prompts = {p.prompt for p in load_pairs(held_pairs / "train.jsonl")}
    assert held_prompts and not proxy_prompts & held_prompts
    assert load_pairs(proxy_pairs / "eval.jsonl") == load_pairs(held_pairs / "eval.jsonl")  # the same eval pairs
