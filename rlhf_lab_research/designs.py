"""The studies the claims read, their arms, and the effects too particular to live in :mod:`effects`: the data that
:mod:`~rlhf_lab_research.claims_registry`'s claims are written with.

``SUITE_VERSIONS`` maps a study a claim names to its newer designs (the claims suite's reruns, newest first); a
claim reads one design (:func:`one_design`)."""

from __future__ import annotations

import math
from typing import Callable

from rlhf_lab_research.effects import Arm, Measured, Studies, config, config_num, same, spearman
from rlhf_lab.analysis.markdown import fmt
from rlhf_lab.analysis.study_runs import STUDY_TAG, RunData, policy_size
from rlhf_lab_research.stats import paired_ci, t_effect

# -- studies and arms -------------------------------------------------------------------------------------------

PPO_GRID, DPO_GRID, RM_SIZE, RM_SOURCE = "ppo_beta_grid", "dpo_beta_grid", "rm_size_vs_policy_size", "rm_source"
REF_SYNC, REF_SHARED, KL_EST, REF_SMALL = "ref_sync", "ref_shared", "kl_estimators", "ref_small"
LEN_PEN, CLIP, CRITIC, RM_LORA, RM_NORM = "length_penalty", "clip_eps", "critic_baseline", "rm_lora", "rm_normalize"
RM_ENS, GRPO_KL, RM_MATCHED, REF_SIZE = "rm_ensemble", "grpo_kl", "rm_source_matched", "ref_size"
RM_MIS, RM_MIS_PROBE, KL_CTL = "rm_mis_scoring", "rm_mis_scoring_probe", "kl_controller"
# The claims suite (rlhf-lab-suite) reruns older studies under new names when their design changes (5 paired seeds;
# then one RM per seed, `reward_model.seed: ${seed}`, and C4's wider β grid): {the study a claim names: its newer
# designs, newest first}. A claim reads the newest design that has runs that count, else the study it names, never
# a mix of designs.
SUITE_VERSIONS: dict[str, tuple[str, ...]] = {
    PPO_GRID: ("ppo_beta_grid_wide", "ppo_beta_grid_5seeds"), DPO_GRID: ("dpo_beta_grid_5seeds",),
    RM_SIZE: ("rm_size_vs_policy_size_5rms", "rm_size_vs_policy_size_5seeds"),
    RM_SOURCE: ("rm_source_5rms", "rm_source_5seeds"), RM_NORM: ("rm_normalize_5rms",),
    RM_ENS: ("rm_ensemble_5rms",),
    REF_SHARED: ("ref_shared_matched",),  # issue 69: the same critic in both arms, fresh processes (not run yet)
    LEN_PEN: ("length_penalty_grid",),  # issue 69: the documented α grid, judged on gold beside length (not run yet)
}


def one_design(studies: Studies, preferred: dict[str, str | tuple[str, ...]],
               counts: Callable[[RunData], bool] = lambda r: True) -> Studies:
    """Where `preferred` names a study's newer designs (their tags, newest first, e.g. ``SUITE_VERSIONS``' reruns),
    only the runs of the first tag with a run that `counts`; else the runs of none of those tags (the study the claim
    names): a claim reads one design, never a mix."""
    out: Studies = {}
    for name, runs in studies.items():
        tags = preferred.get(name) or ()
        tags = (tags,) if isinstance(tags, str) else tuple(tags)
        for tag in tags:
            if any(r.tags.get(STUDY_TAG) == tag and counts(r) for r in runs):
                runs = [r for r in runs if r.tags.get(STUDY_TAG) == tag]
                break
        else:
            runs = [r for r in runs if r.tags.get(STUDY_TAG) not in tags]
        out[name] = runs
    return out


RM_CLAIM_RMS = 5  # distinct RMs per arm a claim about the RM needs (Claim.min_rms)
# Designs redone after their results were seen (issue 42, point 7): {the design now judged: (the earlier designs it
# replaced, what was wrong with them)}; the provenance table's note is written from it (provenance.redone_text).
REDONE: dict[str, tuple[tuple[str, ...], str]] = {
    "ppo_beta_grid_wide": (("ppo_beta_grid", "ppo_beta_grid_5seeds"), "one RM for every seed, and only β = 0 below "
                           "0.01 and β = 1 above 0.1: the β grid widened"),
    REF_SIZE: ((REF_SMALL,), "its default arm's reference was the policy itself, and the smaller reference braked "
               "length hacking"),
    "gao_rm_scaling": (("rm_size_hacking", "rm_size_hacking_beta0", "rm_size_hacking_5rms"), "at β = 0.001 no "
                       "hacking; at β = 0 its runs peaked within three evaluations"),
    RM_MATCHED: ((RM_SOURCE, "rm_source_5seeds", "rm_source_5rms"), "source confounded with initialisation"),
    "gao_rm_scaling_kl": (("gao_rm_scaling",), "for C13's unbiased arm: evaluations log-spaced in steps left about 1 "
                          "√nat between points where gold peaks"),
    KL_CTL: (("ppo_beta_grid_wide", "ppo_beta_grid_5seeds", "ppo_beta_grid"), "for C5: with a horizon of 2000 "
             "responses β could move at most 1.67× in 80 steps, so the controller could not act"),
    RM_MIS_PROBE: ((RM_MIS,), "for C17: the same-source RM started from SFT and the others from pretraining, each "
                   "RM's accuracy was read on the text of the policy that exploited it, and every seed's on-policy "
                   "pairs came from one policy"),
}


def option_arm(group: str, option: str, label: str, stage: str = "ppo") -> Arm:
    """The arm of the runs that ran option `option` of study group `group` (``sweeps/<group>/<option>.yaml``, live or
    archived: :func:`rlhf_lab.runs.jobs.study_file`): they match every value the file sets (its ``@package _global_``
    leaves as dotted keys, ``algo.kl_estimator``), so an arm's settings are written once, in the file its study
    sweeps, not restated here. Only for option files that set values (no ``defaults``, which choose other groups)."""
    import yaml

    from rlhf_lab.runs.identity import leaves
    from rlhf_lab.runs.jobs import study_file

    f = study_file(group, option)
    if f is None:
        raise FileNotFoundError(f"no option {option!r} of study group {group!r} (sweeps/{group}/)")
    node = yaml.safe_load(f.read_text()) or {}
    if not isinstance(node, dict) or not node or set(node) & {"defaults", "hydra"}:
        raise ValueError(f"sweeps/{group}/{option}.yaml: an arm is read from an option file that sets values only")
    return Arm(label, leaves(node), stage=stage)


def fixed(beta: float) -> Arm:
    return Arm(f"fixed β = {beta:g}", {"kl.name": "fixed", "kl.beta": beta})


FIXED, BETA0 = Arm("fixed β", {"kl.name": "fixed"}), fixed(0)
# the arms at the top of a swept value (C11, C12): their labels name the value, and say so when only one ran (Arm)
LARGEST_ALPHA = Arm("largest α", extreme=("algo.length_penalty", "max"), above={"algo.length_penalty": 0}, symbol="α")
LARGEST_EPS = Arm("largest ε", extreme=("algo.clip_eps", "max"), above={"algo.clip_eps": 0.2}, symbol="ε")
# by the labeler's logged name: gao_rm_scaling sweeps the labeler, gao_rm_scaling_kl sets it (no swept value)
GAO_UNBIASED = Arm("unbiased labels", {"labeler.name": "unbiased"})
GAO_BIASED = Arm("biased labels", {"labeler.name": "length_biased"})
ANY_PPO = Arm("PPO runs")


def ref_arm(preset: str, labeler: str) -> Arm:
    """C8's ``ref_size``: the runs whose reference is `preset`'s own model (``sft@<preset>``, seeded) under `labeler`."""
    return Arm(f"{preset} reference, {labeler.replace('_', '-')} labels",
               {"algo.reference.path": f"sft@{preset}", "labeler": labeler})


def rm_arm(source: str, label: str, fraction: float = 0.0, ensemble: int = 1) -> Arm:
    return Arm(label, {"reward_model.source": source, "data.on_policy_fraction": fraction,
                       "reward_model.ensemble": ensemble})


SAME, DIFF = rm_arm("same", "same-source RM"), rm_arm("different", "different-source RM")


DIFF_MIX = rm_arm("different", "different-source RM, 20 % on-policy pairs", fraction=0.2)


def kl_beta(r) -> float:
    return config_num(r, "kl.beta")


def in_range(b: float, _: list[float]) -> bool:
    return 0.01 - 1e-12 <= b <= 0.1 + 1e-12


def below_range(b: float, _: list[float]) -> bool:
    return b < 0.01 - 1e-12


def above_range(b: float, _: list[float]) -> bool:
    return b > 0.1 + 1e-12


def policy_seed(r) -> tuple[str, str]:
    return policy_size(r), r.seed


policy_seed.n_of = "policy × seed cells"  # type: ignore[attr-defined]


def rm_ratio(r) -> float:
    n = r.n_params()
    return r.rm_params() / n if n > 0 else float("nan")


def rm_n(r) -> float:
    return r.rm_params()


def is_min(v: float, vs: list[float]) -> bool:
    return len(vs) > 1 and v == min(vs)


def is_max(v: float, vs: list[float]) -> bool:
    return len(vs) > 1 and v == max(vs)


# -- bespoke effects ------------------------------------------------------------------------------------------


def kl_near_target(target: float) -> Callable[[Studies], Measured]:
    """C5 at one KL target: per adaptive-KL run with that `kl.target`, ln 2 − |ln(final eval/kl ÷ target)|: > 0 when
    KL ends within a factor 2 of it. One run per seed: each target is its own effect (not pooled)."""
    def compute(studies: Studies) -> Measured:
        runs = [r for r in studies.get(KL_CTL, []) if r.stage == "ppo" and same(config(r, "kl.name"), "adaptive")
                and same(config(r, "kl.target"), target)]
        if not runs:
            return Measured(None, missing=f"no finished adaptive-KL run with kl.target = {target:g} in {KL_CTL}")
        units = {str(config(r, "kl.unit")) for r in runs} - {"sequence", "None"}
        if units:
            return Measured(None, missing=f"kl.unit={sorted(units)}: the target is not per response like eval/kl")
        short = [r for r in runs if r.fnum("steps") * r.fnum("algo.batch_size") < r.fnum("kl.horizon")]
        if short:
            return Measured(None, missing=f"{len(short)} runs saw fewer responses than the controller's horizon "
                                          f"({short[0].fnum('kl.horizon'):g}): β could not adapt yet")
        values, ratios = {}, []
        for r in runs:
            kl = r.last("eval/kl")
            if kl > 0:
                values.setdefault(r.seed, []).append(math.log(2) - abs(math.log(kl / target)))
                ratios.append(kl / target)
        detail = (f"final eval/kl ÷ target {target:g}: {fmt(sum(ratios) / len(ratios), 2)} ({len(ratios)} runs)"
                  if ratios else "")
        eff = t_effect([sum(v) / len(v) for v in values.values()], method="t")
        return Measured(eff if eff.n else None, detail, "" if eff.n else "no run with a positive final eval/kl",
                        tuple(runs))
    return compute


def kl_control(studies: Studies) -> Measured:
    """C9: per seed, |Spearman ρ(β, final eval/kl)| over PPO's fixed-β grid minus the same over DPO's β grid."""
    ppo = [r for r in studies.get(PPO_GRID, []) if r.stage == "ppo" and same(config(r, "kl.name"), "fixed")]
    dpo = [r for r in studies.get(DPO_GRID, []) if r.stage == "dpo"]
    if not ppo or not dpo:
        return Measured(None, missing="needs finished fixed-β PPO runs and DPO runs")
    rho = {}
    for name, rs, key in (("PPO", ppo, "kl.beta"), ("DPO", dpo, "algo.beta")):
        by_seed: dict[str, list[tuple[float, float]]] = {}
        for r in rs:
            by_seed.setdefault(r.seed, []).append((config_num(r, key), r.last("eval/kl")))
        rho[name] = {s: abs(spearman([p[0] for p in pts], [p[1] for p in pts])) for s, pts in by_seed.items()}
    detail = "; ".join(f"{n} |ρ| per seed: " + ", ".join(f"{s}: {fmt(v, 2)}" for s, v in sorted(d.items()))
                       for n, d in rho.items())
    eff = paired_ci(rho["PPO"], rho["DPO"])
    return Measured(eff if eff.n else None, detail, "" if eff.n else "no seed has ≥ 3 β values in both grids",
                    tuple(ppo + dpo))


# C7's kl_estimators: the arms its sweep runs (+kl_est=k1_reward,k3_reward,k3_loss), read from sweeps/kl_est/
K1_REWARD = option_arm("kl_est", "k1_reward", "k1 in the reward")
K3_REWARD = option_arm("kl_est", "k3_reward", "k3 in the reward")
K3_LOSS = option_arm("kl_est", "k3_loss", "k3 in the loss")

GRPO_BETA0 = Arm("GRPO β = 0", {"kl.beta": 0.0}, stage="grpo")
GRPO_BETA004 = Arm("GRPO β = 0.04", {"kl.beta": 0.04}, stage="grpo")
