"""Issue 69's redesigned studies, checked before any of them runs: every arm composes (Hydra's compose API) and two arms
of one seed differ only in the study's factor and in keys that compute nothing (rlhf_lab.config.keys.NOT_COMPUTED);
the jobs come seed-first so that the arms alternate; C6's two arms build the same trainable parameters. Nothing trains
but the slow C6 model check (a tiny SFT, cached for the session)."""

from __future__ import annotations

import itertools

import pytest
from omegaconf import OmegaConf

from rlhf_lab.config.keys import NOT_COMPUTED
from rlhf_lab.entry import sweeps as sweeping
from tests.conftest import compose_cfg


def flat(cfg) -> dict:
    """A composed config as {dotted key: value}, resolved."""
    def walk(node, prefix=""):
        for k, v in node.items():
            yield from walk(v, f"{prefix}{k}.") if isinstance(v, dict) else [(f"{prefix}{k}", v)]
    return dict(walk(OmegaConf.to_container(cfg, resolve=True)))


def computes(key: str) -> bool:
    return not any(key == k or key.startswith(k + ".") for k in NOT_COMPUTED)


def differing(a: dict, b: dict) -> set[str]:
    """The keys two flat configs hold different values of, less those that compute nothing."""
    return {k for k in set(a) | set(b) if a.get(k) != b.get(k) and computes(k)}


def composed_jobs(study: str) -> list[tuple[list[str], dict]]:
    """(overrides, flat config) of every job of the study, in the order a multirun launches them."""
    return [(job, flat(compose_cfg(job))) for job in sweeping.plan([f"sweep={study}"], validate=False)]


def arms_of_seed(jobs: list[tuple[list[str], dict]], seed: int) -> list[dict]:
    return [cfg for _, cfg in jobs if cfg["seed"] == seed]


def check_factor(jobs, factor: tuple[str, ...], also=()) -> None:
    """Two arms of one seed differ in a key of `factor` (a prefix) and in nothing else computed but `also`; two seeds
    of one arm differ only in the seed."""
    seeds = sorted({cfg["seed"] for _, cfg in jobs})
    arms = arms_of_seed(jobs, seeds[0])
    assert len(arms) >= 2
    for a, b in itertools.combinations(arms, 2):
        keys = differing(a, b)
        assert keys and all(k.startswith(factor) or k in also for k in keys), keys
    other = [cfg for _, cfg in jobs if cfg["seed"] == seeds[1]]
    assert differing(arms[0], other[0]) == {"seed"}


# -- C6: ref_shared_matched -------------------------------------------------------------------------------------------

def test_c6_arms_differ_only_in_how_the_reference_is_held_and_alternate_seed_by_seed():
    jobs = composed_jobs("ref_shared_matched")
    assert len(jobs) == 20 and {cfg["study"] for _, cfg in jobs} == {"ref_shared_matched"}
    check_factor(jobs, ("algo.reference.kind",))
    for _, cfg in jobs:  # the same critic and passes in both arms
        assert (cfg["algo.critic"], cfg["algo.packing"], cfg["algo.lora.r"]) == ("shared", False, 16)
        assert cfg["policy.arch.hidden"] == 128  # a_medium: a copy large enough to see in the peak RSS
    kinds = [cfg["algo.reference.kind"] for _, cfg in jobs]
    assert kinds == ["copy", "lora_disabled"] * 10  # seed-first: the arms alternate
    assert sorted({cfg["seed"] for _, cfg in jobs}) == list(range(10, 20))  # seeds ref_shared never ran


@pytest.mark.slow
def test_c6_arms_train_the_same_parameters(tiny_cfg):
    """build_models gives both arms the same trainable parameters (LoRA adapters and one value head on the policy's
    own hidden states); only the copy arm holds a second, frozen model."""
    from rlhf_lab import stages
    from rlhf_lab.models import families as F
    from rlhf_lab.stages import ppo as ppo_stage
    from tests.test_ppo import PPO_TINY

    built = {}
    for kind in ("copy", "lora_disabled"):
        cfg = tiny_cfg(*PPO_TINY, f"algo.reference.kind={kind}", "algo.lora.r=16", "algo.critic=shared",
                       "algo.packing=false")
        sft = stages.ensure("sft", cfg)
        policy, reference, critic = ppo_stage.build_models(cfg.algo, sft, F.load_tokenizer(sft))
        trainable = sorted((n, p.numel()) for n, p in [*policy.named_parameters(), *(
            (f"critic.{n}", p) for n, p in critic.named_parameters())] if p.requires_grad)
        built[kind] = (trainable, ppo_stage.model_bytes(policy, reference, critic), critic.backbone)
    assert built["copy"][0] == built["lora_disabled"][0] and built["copy"][2] is None is built["lora_disabled"][2]
    assert built["copy"][1] > built["lora_disabled"][1]  # the copy holds the base twice


# -- C11: length_penalty_grid -----------------------------------------------------------------------------------------

def test_c11_runs_the_documented_alpha_grid_and_its_arms_differ_only_in_alpha():
    jobs = composed_jobs("length_penalty_grid")
    assert len(jobs) == 40
    check_factor(jobs, ("algo.length_penalty",))
    alphas = [cfg["algo.length_penalty"] for _, cfg in jobs]
    assert alphas == [0.0, 0.01, 0.03, 0.1] * 10  # seed-first: a seed's arms run together
    for _, cfg in jobs:
        assert (cfg["labeler.name"], cfg["kl.name"], cfg["kl.beta"], cfg["algo.steps"]) == ("length_biased", "fixed",
                                                                                           0.0, 40)
    assert sorted({cfg["seed"] for _, cfg in jobs}) == list(range(10, 20))


def test_c11_is_judged_on_gold_beside_length_at_its_preregistered_alpha():
    from rlhf_lab_research.claims_registry import BY_ID, JUDGED, PRECONDITION, PRIMARY_ALPHA
    from rlhf_lab_research.designs import LEN_PEN, SUITE_VERSIONS

    c11 = BY_ID["C11"]
    judged = [p for p in c11.parts if p.role == JUDGED]
    assert PRIMARY_ALPHA == 0.03 and {p.unit for p in judged} == {"tokens", "gold reward"}
    assert any("gold" in p.says for p in c11.parts if p.role == PRECONDITION)
    assert SUITE_VERSIONS[LEN_PEN] == ("length_penalty_grid",)


# -- the gold replicated: gold_rm_replication -------------------------------------------------------------------------

def test_gold_replication_crosses_golds_proxies_and_held_out_algorithms():
    jobs = composed_jobs("gold_rm_replication")
    assert len(jobs) == 36
    check_factor(jobs, ("gold.build.reward_model.seed", "gold.build.data.seed", "reward_model.seed", "algo."))
    golds = {(c["gold.build.reward_model.seed"], c["gold.build.data.seed"]) for _, c in jobs}
    proxies = {(g, c["reward_model.seed"]) for _, c in jobs for g in [(c["gold.build.reward_model.seed"],)]}
    assert golds == {(0, 1), (1, 2)} and len(proxies) == 6  # 2 gold builds x 3 proxies each
    assert {c["algo.name"] for _, c in jobs} == {"ppo", "grpo", "rloo"}
    for _, c in jobs:
        assert (c["gold.source"], c["kl.beta"], c["algo.steps"]) == ("rm", 0.0, 80)
        assert c["seed"] in (30, 31)  # no cover's seed (200-205, 300-302), no validated seed of earlier studies
        assert {cv["seed"] for cv in c["gold.build.covers"]}.isdisjoint({30, 31})
        assert c["gold.build.data.seed"] != c["data.seed"]  # the gold's pairs are not the proxy's
