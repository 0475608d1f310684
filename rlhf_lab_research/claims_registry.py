"""The claims of docs/claims.md as data: one :class:`Claim` per claim, each with the studies that test it and the
effects (:class:`Part`) it is judged on.

A part is one effect with its unit, the sign the claim predicts (`direction`), an equivalence margin (an effect
inside ±margin is negligible) and the function that computes it from the studies' runs
(:mod:`~rlhf_lab_research.effects`). Its role:

* ``judged``: the claim holds only if every judged part holds, and does not hold if one does not;
* ``precondition``: something the claim presupposes (hacking to reduce, a gap to close); if it does not hold,
  the claim cannot be tested on these runs and is inconclusive;
* ``shown``: reported with its interval, not judged; its `says` names what is compared, never a conclusion, and
  the report words it from its interval and margin (:class:`Words`, :func:`~rlhf_lab_research.wording.word_effect`),
  so that no hand-written label can contradict its numbers.

Paired designs are preferred: the compared settings run with the same seeds and the effect is the mean
per-seed difference. A claim with `untestable` set is not an effect (a definition, a quotation) and says why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from rlhf_lab_research.designs import (
    above_range,
    below_range,
    fixed,
    in_range,
    is_max,
    is_min,
    kl_beta,
    kl_control,
    kl_near_target,
    policy_seed,
    ref_arm,
    rm_n,
    rm_ratio,
    ANY_PPO,
    BETA0,
    CLIP,
    CRITIC,
    DIFF,
    DIFF_MIX,
    DPO_GRID,
    FIXED,
    GAO_BIASED,
    GAO_UNBIASED,
    GRPO_BETA0,
    GRPO_BETA004,
    GRPO_KL,
    KL_EST,
    K1_REWARD,
    K3_LOSS,
    K3_REWARD,
    LARGEST_ALPHA,
    LARGEST_EPS,
    LEN_PEN,
    PPO_GRID,
    REF_SHARED,
    REF_SIZE,
    REF_SYNC,
    RM_CLAIM_RMS,
    RM_ENS,
    RM_LORA,
    RM_MATCHED,
    KL_CTL, RM_MIS_PROBE,
    RM_NORM,
    RM_SIZE,
    SAME,
)
from rlhf_lab_research.effects import (Arm, Measured, Studies, config_value, grouped, grouped_at_matched_kl,
                                       log_ratio, paired, within)
from rlhf_lab_research.studies.gao import BON_STUDY as GAO_BON, KL_STUDY as GAO_KL, RL_STUDY as GAO
from rlhf_lab.analysis.quantities import final_gold, gold_drop
from rlhf_lab_research.claim_quantities import (above_reference, change, final, gold_drop_upto, gold_peak, max_jump,
                                                rm_metric, rm_seed, step_mean, step_median, step_noise)
from rlhf_lab_research.wording import Words, gold_words

JUDGED, PRECONDITION, SHOWN = "judged", "precondition", "shown"
AGREEMENT = final("eval/proxy_gold_agreement")  # the RM's accuracy against gold on the policy's own samples
PROBE_AGREEMENT = final("probe/proxy_gold_agreement")  # the same on one probe policy's samples, common to the arms
GOLD, TOKENS, PROXY, FRACTION, LN_RATIO, PERCENT = ("gold reward", "tokens", "RM score (normalised)", "fraction",
                                                    "ln ratio", "%")
GOLD_MARGIN = 0.05          # gold reward: the old report's floor; the eval noise of one evaluation is ≈ 0.03
LN_10PCT = math.log(1.1)    # ratios: within ±10 % is negligible


@dataclass(frozen=True)
class Part:
    says: str                     # the part of the claim this effect tests; {a}, {b}: the arms as the runs named them
    effect: str                   # how it is computed, in words
    unit: str
    direction: int | None         # +1: the claim predicts effect > 0; −1: < 0; None for a shown part
    margin: float | None
    compute: Callable[[Studies], Measured]
    role: str = JUDGED
    noninferiority: bool = False  # tested against −margin on the claimed side ("at least as well, within margin")
    words: Words | None = None    # a shown part's reading on each side of 0 (None: a level, not a comparison)
    bounds: tuple[float, float] | None = None  # hard bounds of its per-unit values; None: UNIT_BOUNDS of its unit

    @property
    def value_bounds(self) -> tuple[float, float] | None:
        """The hard bounds of one per-unit value, which let a betting sequence judge it (anytime.py): `bounds`, else
        :data:`UNIT_BOUNDS` of its unit; None: unbounded, or bounded too loosely to help (gold, tokens)."""
        return self.bounds if self.bounds is not None else UNIT_BOUNDS.get(self.unit)

    def label(self, m: Measured | None = None, ran: bool = True) -> str:
        """`says`, its {a} and {b} filled with the labels of the arms the measurement compared as the runs gave
        them (:meth:`Arm.select` names the value that ran, and says when it is the only one), so that the label
        says what ran; with `ran` False, with the arms' names in the registry ("largest α")."""
        if "{" not in self.says:
            return self.says
        arms = (*((m.arms if ran else m.arm_names) if m is not None else ()), "?", "?")
        return self.says.format(a=arms[0], b=arms[1])


@dataclass(frozen=True)
class Claim:
    id: str
    statement: str                # what the seed notes say (docs/claims.md)
    studies: tuple[str, ...] = ()  # the studies its judged parts need
    parts: tuple[Part, ...] = ()
    untestable: str = ""          # why it cannot be put to an experiment here
    note: str = ""                # what of the statement the parts do not test
    also: tuple[str, ...] = ()    # studies only its shown parts read
    min_rms: int = 0              # a claim about the RM: distinct RMs each arm needs (else "not replicated")
    earlier: tuple[str, str] = ()  # a claim redesigned before its new runs: (its earlier verdict, its earlier result
    #                                as the report of the commit named in the text gave it), shown beside the new one


def shown(says: str, effect: str, unit: str, compute: Callable[[Studies], Measured], words: Words | None = None,
          margin: float | None = None) -> Part:
    """A shown part: `says` names what is compared; the report words the effect from its interval with `words` and
    `margin` (default: :data:`SHOWN_MARGINS` of its unit; None: never called negligible)."""
    return Part(says, effect, unit, None, SHOWN_MARGINS.get(unit) if margin is None else margin, compute, SHOWN,
                words=words)


# The hard bounds of one per-unit value, by unit, from the code that computes it. Every judged effect in these units is
# a difference of two values in [0, 1] (a fraction of samples or of pairs: eval/distinct_2, rm/accuracy,
# probe/proxy_gold_agreement; an absolute Spearman |ρ|), so in [−1, 1]; a part whose values differ otherwise says
# its own (C10's rm/length_preference is itself a difference of two probabilities: [−2, 2]). Not here, with why:
# gold (rlhf_lab/world/reviews.py: g ≤ 1, and g ≥ −3.5 − 0.25·fillers − 0.5·(words − 40)/40, −15.6 at the default 48
# new tokens: bounds ten times the effects' spread, which a betting sequence would pay for in width), tokens (0 to
# generation.max_new_tokens, 48: likewise), RM scores, KL (nats), ln ratios and % (unbounded).
UNIT_BOUNDS: dict[str, tuple[float, float]] = {"fraction": (-1.0, 1.0), "|ρ| (absolute Spearman)": (-1.0, 1.0)}
KL_ZERO = 0.01              # nats: a KL read as ≡ 0 (mean objective/kl with the policy as its own reference)
SHOWN_MARGINS = {GOLD: GOLD_MARGIN, LN_RATIO: LN_10PCT, TOKENS: 1.0}  # a shown part's margin by unit, unless given
ALPHA_0 = Arm("α = 0", {"algo.length_penalty": 0})
PRIMARY_ALPHA = 0.03  # C11's pre-registered α (reports/PREREGISTERED.md): the grid's middle, set before its runs
ALPHA_PRIMARY = Arm(f"α = {PRIMARY_ALPHA:g}", {"algo.length_penalty": PRIMARY_ALPHA})
PENALTY_GOLD = Words("more gold with the penalty", "costs gold", "no gold cost detected")
ENSEMBLE_GOLD = Words("more gold with the ensemble", "less gold with the ensemble", "no gold difference detected")


# -- the claims -------------------------------------------------------------------------------------------------

CLAIMS: tuple[Claim, ...] = (
    Claim("C1", "With no KL penalty (β = 0), PPO reward-hacks: the proxy reward rises while gold falls.", (PPO_GRID,), (
        Part("the proxy reward rises", "last − first eval/proxy_reward of each β = 0 run", PROXY, +1, 0.1,
             within(PPO_GRID, BETA0, change("eval/proxy_reward"))),
        Part("gold falls from its peak", "drop of gold from its peak to the last evaluation of each β = 0 run, "
             "split-half (peak picked on one half of the eval prompts, measured on the other)", GOLD, +1, GOLD_MARGIN,
             within(PPO_GRID, BETA0, gold_drop)),
    )),
    Claim("C2", "With no KL penalty the policy collapses to a few modes.", (PPO_GRID,), (
        Part("entropy collapses", "final eval/entropy: β = 0 − β = 0.1, per seed", "nats/token", -1, 0.05,
             paired(PPO_GRID, BETA0, fixed(0.1), final("eval/entropy"))),
        Part("outputs lose variety", "final eval/distinct_2: β = 0 − β = 0.1, per seed", FRACTION, -1, 0.02,
             paired(PPO_GRID, BETA0, fixed(0.1), final("eval/distinct_2"))),
    )),
    Claim("C3", "Using the policy as its own reference gives KL ≡ 0 and no protection; a reference re-synced every "
          "N steps protects less.", (REF_SYNC,), (
        Part("the policy as its own reference protects less", "final gold: never re-synced − re-synced every step, "
             "per seed", GOLD, +1, GOLD_MARGIN,
             paired(REF_SYNC, Arm("sync_every = 0", {"algo.reference.sync_every": 0}),
                    Arm("sync_every = 1", {"algo.reference.sync_every": 1}), final_gold)),
        Part("a reference re-synced every 10 steps protects less", "final gold: never re-synced − re-synced every 10 "
             "steps, per seed", GOLD, +1, GOLD_MARGIN,
             paired(REF_SYNC, Arm("sync_every = 0", {"algo.reference.sync_every": 0}),
                    Arm("sync_every = 10", {"algo.reference.sync_every": 10}), final_gold)),
        shown("KL with the policy as its own reference", "mean objective/kl over PPO steps, sync_every = 1",
              "nats", within(REF_SYNC, Arm("sync_every = 1", {"algo.reference.sync_every": 1}),
                             step_mean("objective/kl")), Words("KL above 0", "KL below 0", "KL ≡ 0"), KL_ZERO),
    )),
    Claim("C4", "β too small hacks, β too large stalls learning; a good β is 0.01–0.1.", (PPO_GRID,), (
        Part("β too small hacks", "final gold: mean over the fixed β in 0.01–0.1 − β = 0, per seed", GOLD, +1,
             GOLD_MARGIN, grouped(PPO_GRID, FIXED, kl_beta, in_range, lambda b, _: b == 0, final_gold,
                                  ("β in 0.01–0.1", "β = 0"))),
        Part("β too large stalls", "final gold: mean over β in 0.01–0.1 − the largest β (> 0.1) the seed ran", GOLD,
             +1, GOLD_MARGIN, grouped(PPO_GRID, FIXED, kl_beta, in_range, lambda b, bs: b > 0.1 and b == max(bs),
                                      final_gold, ("β in 0.01–0.1", "largest β"))),
        Part("the good β is not below 0.01", "final gold: best β in 0.01–0.1 − best β below 0.01 (β = 0 included), "
             "per seed (each maximum picks up seed noise, more so on the side with more arms)", GOLD, +1, GOLD_MARGIN,
             grouped(PPO_GRID, FIXED, kl_beta, in_range, below_range, final_gold,
                     ("best β in 0.01–0.1", "best β < 0.01"), reduce_a="max", reduce_b="max")),
        Part("the good β is not above 0.1", "final gold: best β in 0.01–0.1 − best β above 0.1, per seed", GOLD, +1,
             GOLD_MARGIN, grouped(PPO_GRID, FIXED, kl_beta, in_range, above_range, final_gold,
                                  ("best β in 0.01–0.1", "best β > 0.1"), reduce_a="max", reduce_b="max")),
    ), note="β is per token and KL is summed per response (nats); the range means nothing without that unit. The "
            "optimum is placed inside 0.01–0.1 only with β on both sides of it (ppo_beta_grid_wide: 0.003 below, 0.3 "
            "above, two arms a side); on a grid without a β below 0.01 other than 0, the first comparison is with "
            "β = 0 alone."),
    Claim("C5", "Adaptive KL (raise β when KL is above the target, lower it when below) keeps KL near the target.",
          (KL_CTL,), tuple(
        Part(f"KL ends near a target of {t:g} nat{'s' if t != 1 else ''}", f"ln 2 − |ln(final eval/kl ÷ {t:g})| per "
             f"seed, adaptive KL with kl.target = {t:g} (> 0: within a factor 2 of the target)", LN_RATIO, +1, None,
             kl_near_target(t)) for t in (1.0, 4.0, 8.0)
    ), note="Each KL target is its own effect over 5 seeds (two runs of one seed at two targets are not independent "
            "replicates). The controller's horizon (128 responses) lets β move up to 1.1× a step, about 2000× in 80 "
            "steps, where the targets need 0.1× to 10× (kl_controller's header). The notes credit DeepSeek-R1; the "
            "controller is Ziegler et al. 2019 (not tested: a citation)."),
    Claim("C6", "The frozen reference doubles memory and compute; a LoRA policy whose reference is the base with its "
          "adapters disabled avoids the copy.", (REF_SHARED,), (
        Part("a separate reference costs memory", "memory/peak_rss_mb (the job's measured peak RSS): copy − "
             "adapters-off, per seed", "MB", +1, 1.0,
             paired(REF_SHARED, Arm("separate copy", {"algo.reference.kind": "copy"}),
                    Arm("adapters-off base", {"algo.reference.kind": "lora_disabled"}), final("memory/peak_rss_mb"))),
        Part("a separate reference costs compute", "median time/step_s over PPO steps: copy ÷ adapters-off − 1, per "
             "seed", PERCENT, +1, 5.0,
             paired(REF_SHARED, Arm("separate copy", {"algo.reference.kind": "copy"}),
                    Arm("adapters-off base", {"algo.reference.kind": "lora_disabled"}), step_median("time/step_s"),
                    scale="percent")),
        shown("the models' bytes with the copy", "memory/model_bytes (distinct parameter and buffer bytes, exact): "
              "copy ÷ adapters-off − 1, per seed", PERCENT,
              paired(REF_SHARED, Arm("separate copy", {"algo.reference.kind": "copy"}),
                     Arm("adapters-off base", {"algo.reference.kind": "lora_disabled"}), final("memory/model_bytes"),
                     scale="percent"),
              Words("more bytes with the copy", "fewer bytes with the copy", "no byte difference"), 5.0),
        shown("gold with the shared base instead of the copy", "final gold: adapters-off − copy, per seed", GOLD,
              paired(REF_SHARED, Arm("adapters-off base", {"algo.reference.kind": "lora_disabled"}),
                     Arm("separate copy", {"algo.reference.kind": "copy"}), final_gold),
              Words("more gold with the shared base", "costs gold", "no gold cost detected")),
    ), note="Judged: the copy costs measured memory (peak RSS, beyond ±1 MB) and compute (beyond ±5 %); the model "
            "bytes are an exact function of the config, shown. Redesigned for issue 69 (ref_shared_matched, read once "
            "it has runs; until then ref_shared): in ref_shared the copy arm also trained a critic backbone (164,737 "
            "vs 39,489 trainable parameters), and its peak RSS carried over between the jobs a joblib worker ran; "
            "ref_shared_matched gives both arms the same critic (a value head on the policy's own pass) and runs each "
            "job in a fresh process.",
        earlier=("holds", "reports/claims.md at a7520b2 (ref_shared, before issue 69): holds; judged on "
                 "memory/model_bytes, copy ÷ adapters-off − 1 = 86.365 [86.365, 86.365] % (exact, sd 0), and median "
                 "time/step_s, 39.645 [32.907, 46.384] %, fixed-n t, 5 seeds")),
    Claim("C7", "The naive per-token KL estimate can be negative or unstable, and better estimators exist.",
          (KL_EST,), (
        Part("the naive (k1) estimate is noisier than k3", "ln(step-to-step noise of objective/kl_k1 ÷ that of "
             "objective/kl_k3), both on the same rollouts, per k1-in-reward run", LN_RATIO, +1, LN_10PCT,
             within(KL_EST, K1_REWARD,
                    log_ratio(step_noise("objective/kl_k1"), step_noise("objective/kl_k3"),
                              "ln noise ratio of objective/kl_k1 to objective/kl_k3"))),
        shown("gold with k3 in the reward instead of k1", "final gold: k3 − k1, both in the reward, per seed", GOLD,
              paired(KL_EST, K3_REWARD, K1_REWARD, final_gold),
              gold_words("more gold with k3", "less gold with k3")),
        shown("gold with k3 in the loss (GRPO style) instead of k1 in the reward",
              "final gold: k3 in the loss − k1 in the reward, per seed", GOLD,
              paired(KL_EST, K3_LOSS, K1_REWARD, final_gold),
              gold_words("more gold with k3 in the loss", "less gold with k3 in the loss")),
    ), note="Per-token k1 values are not logged, so 'can be negative' is not measured; the standard fix is Schulman's "
            "k3, not the notes' kl_div / JS."),
    Claim("C8", "A reference smaller than the policy caps the policy.", (REF_SIZE,), (
        Part("the smaller reference is the worse model", "reference/gold_reward (each reference's own gold, test "
             "prompts): a_small − a_tiny reference, per seed", GOLD, +1, GOLD_MARGIN,
             paired(REF_SIZE, ref_arm("a_small", "unbiased"), ref_arm("a_tiny", "unbiased"),
                    final("reference/gold_reward")), PRECONDITION),
        Part("a smaller reference caps the policy", "final gold: a reference of the policy's size (a_small) − a "
             "smaller one (a_tiny), both other models than the policy, unbiased labels, per seed", GOLD, +1,
             GOLD_MARGIN, paired(REF_SIZE, ref_arm("a_small", "unbiased"), ref_arm("a_tiny", "unbiased"), final_gold)),
        shown("the same comparison under length-biased labels", "final gold: a_small − a_tiny reference, "
              "length-biased labels, per seed", GOLD, paired(REF_SIZE, ref_arm("a_small", "length_biased"),
                                                             ref_arm("a_tiny", "length_biased"), final_gold),
              gold_words("more gold with the a_small reference", "less gold with the a_small reference")),
        shown("gold with a larger reference (a_medium) than the policy's size", "final gold: a_medium − a_small "
              "reference, unbiased labels, per seed", GOLD,
              paired(REF_SIZE, ref_arm("a_medium", "unbiased"), ref_arm("a_small", "unbiased"), final_gold),
              gold_words("more gold with the a_medium reference", "less gold with the a_medium reference")),
        shown("how far above its reference the policy gets (a_tiny)", "final gold − the reference's own gold, a_tiny "
              "reference, unbiased labels", GOLD, within(REF_SIZE, ref_arm("a_tiny", "unbiased"), above_reference),
              Words("the policy ends above its reference", "the policy ends below its reference",
                    "the policy ends level with its reference")),
        shown("final length, the brake ref_small confounded: a_small vs a_tiny reference", "final eval/length: "
              "a_small − a_tiny reference, length-biased labels, per seed", TOKENS,
              paired(REF_SIZE, ref_arm("a_small", "length_biased"), ref_arm("a_tiny", "length_biased"),
                     final("eval/length")),
              Words("longer with the a_small reference", "shorter with the a_small reference",
                    "no length difference detected")),
    ), note="Every reference is another model than the policy, pretrained and fine-tuned the same way with its own "
            "seed (ref_size); the superseded ref_small compared the policy as its own reference with a smaller "
            "other model, a difference in more than size."),
    Claim("C9", "DPO's reference is implicit (the SFT model), and DPO gives less fine-grained KL control than PPO.",
          (PPO_GRID, DPO_GRID), (
        Part("β sets PPO's KL more reliably than DPO's", "|Spearman ρ(β, final eval/kl)| over PPO's fixed-β grid − "
             "the same over DPO's β grid, per seed", "|ρ| (absolute Spearman)", +1, 0.1, kl_control),
    ), note="'The reference is implicit' is a definition, not tested."),
    Claim("C10", "A reward model learns annotator biases (length, empathy phrases), and PPO exploits them.",
          (GAO,), (
        Part("the labeler is length-biased", "labeler.length_bonus of the biased arm's runs (exact)",
             "utility per 10 words", +1, None, config_value(GAO, GAO_BIASED, "labeler.length_bonus"), PRECONDITION),
        Part("the RM learns the length bias", "rm/length_preference (P(RM prefers the longer response) − P(gold "
             "does), held-out pairs) of the RMs PPO used: length-biased − unbiased labels, per seed (mean over the "
             "four RM sizes)", FRACTION, +1, 0.02,
             paired(GAO, GAO_BIASED, GAO_UNBIASED, rm_metric("rm/length_preference")), bounds=(-2.0, 2.0)),
        Part("PPO exploits it", "last − first eval/length at β = 0: length-biased − unbiased labels (the control), "
             "per seed (mean over the four RM sizes)", TOKENS, +1, 1.0, paired(GAO, GAO_BIASED, GAO_UNBIASED, change("eval/length"))),
    ), note="Tested on length only (empathy phrases need a phrase-biased labeler, not built), in gao_rm_scaling's two "
            "labeler arms at β = 0, one RM per size and seed. Redesigned on 2026-12-04 after its results were seen "
            "(issue 42): it read ppo_beta_grid_wide's β = 0 runs, no unbiased control, and rm_lora's RMs.",
        min_rms=RM_CLAIM_RMS),
    Claim("C11", "A length penalty R = R_RM − α·len mitigates length hacking.", (LEN_PEN,), (
        Part("without a penalty responses grow", "last − first eval/length of each α = 0 run", TOKENS, +1, 1.0,
             within(LEN_PEN, ALPHA_0, change("eval/length")), PRECONDITION),
        Part("without a penalty gold falls from its peak (the hacking to mitigate)", "split-half drop of gold from its "
             "peak to the last evaluation of each α = 0 run", GOLD, +1, GOLD_MARGIN,
             within(LEN_PEN, ALPHA_0, gold_drop), PRECONDITION),
        Part("the penalty shortens responses", f"final eval/length: α = 0 − α = {PRIMARY_ALPHA:g} (the pre-registered "
             "α), per seed", TOKENS, +1, 1.0, paired(LEN_PEN, ALPHA_0, ALPHA_PRIMARY, final("eval/length"))),
        Part("and mitigates the hacking: more gold, not only shorter text", f"final gold: α = {PRIMARY_ALPHA:g} − α = 0, "
             "per seed", GOLD, +1, GOLD_MARGIN, paired(LEN_PEN, ALPHA_PRIMARY, ALPHA_0, final_gold)),
        shown("gold with the penalty at {a}", "final gold: largest α − α = 0, per seed", GOLD,
              paired(LEN_PEN, LARGEST_ALPHA, ALPHA_0, final_gold), PENALTY_GOLD),
        shown("gold with the penalty at {a}", "final gold: smallest α > 0 − α = 0, per seed", GOLD,
              paired(LEN_PEN, Arm("smallest α", extreme=("algo.length_penalty", "min"),
                                  above={"algo.length_penalty": 0}, symbol="α"), ALPHA_0, final_gold), PENALTY_GOLD),
        shown("final length with the penalty at {a}", "final eval/length: largest α − α = 0, per seed", TOKENS,
              paired(LEN_PEN, LARGEST_ALPHA, ALPHA_0, final("eval/length")),
              Words("longer with the penalty", "shorter with the penalty", "no length difference detected")),
    ), note=f"Redesigned for issue 69 (length_penalty_grid, read once it has runs; until then length_penalty, which ran "
            f"α ∈ {{0, 0.1}} only and so has no α = {PRIMARY_ALPHA:g} arm): the documented grid α ∈ {{0, 0.01, 0.03, "
            f"0.1}}, judged at the pre-registered α = {PRIMARY_ALPHA:g} (reports/PREREGISTERED.md) on length AND gold: "
            "the claim holds when the penalty both shortens the responses and ends with more gold than α = 0 (there "
            "being length growth and a gold drop to mitigate); a penalty that shortens the text without more gold "
            "does not mitigate hacking (\"only shortens text\": the gold part fails or stays open). The other α are "
            "shown.",
        earlier=("holds", "reports/claims.md at a7520b2 (length_penalty, before issue 69): holds; judged on length "
                 "alone, final eval/length α = 0 − α = 0.1, 28.182 [27.069, 29.296] tokens, fixed-n t, 5 seeds; its "
                 "gold, shown, −0.402 [−1.685, 0.882]")),
    Claim("C12", "PPO's clip (ε = 0.2) limits each update and prevents reward spikes.", (CLIP,), (
        Part("the clip limits each update", "ln(mean policy/approxkl over steps: largest ε ÷ ε = 0.2), per seed",
             LN_RATIO, +1, LN_10PCT,
             paired(CLIP, LARGEST_EPS, Arm("ε = 0.2", {"algo.clip_eps": 0.2}), step_mean("policy/approxkl"),
                    scale="log ratio")),
        Part("and prevents reward spikes", "largest step-to-step change of objective/scores: largest ε − ε = 0.2, "
             "per seed", PROXY, +1, 0.05,
             paired(CLIP, LARGEST_EPS, Arm("ε = 0.2", {"algo.clip_eps": 0.2}), max_jump("objective/scores"))),
        shown("how often the clip is active at ε = 0.2", "mean policy/clipfrac over steps, ε = 0.2", FRACTION,
              within(CLIP, Arm("ε = 0.2", {"algo.clip_eps": 0.2}), step_mean("policy/clipfrac"))),
    ), note="Compared: ε = 0.2 and the largest ε above 0.2 in the grid (a looser clip)."),
    Claim("C13", "A larger RM reduces but does not remove hacking.", (GAO_KL,), (
        Part("there is hacking to reduce", "split-half gold drop from the peak up to the matched KL (per seed, the "
             "lower final KL of its smallest- and largest-RM runs), smallest RM, unbiased labels (one RM per seed)",
             GOLD, +1, GOLD_MARGIN, grouped_at_matched_kl(GAO_KL, GAO_UNBIASED, rm_n, is_min, is_max, gold_drop_upto,
                                                          ("smallest RM", "largest RM"), side="a"), PRECONDITION),
        Part("a larger RM reduces it", "split-half gold drop up to the matched KL: smallest − largest RM, unbiased "
             "labels, per seed", GOLD, +1, GOLD_MARGIN, grouped_at_matched_kl(
                 GAO_KL, GAO_UNBIASED, rm_n, is_min, is_max, gold_drop_upto, ("smallest RM", "largest RM"))),
        Part("but does not remove it", "split-half gold drop from the peak to the end of the run (120 steps at "
             "β = 0), largest RM, unbiased labels, per seed", GOLD, +1, GOLD_MARGIN,
             grouped(GAO_KL, GAO_UNBIASED, rm_n, is_max, None, gold_drop, ("largest RM", ""))),
        shown("gold peak, largest vs smallest RM", "split-half peak gold: largest − smallest RM, unbiased "
              "labels, per seed", GOLD, grouped(GAO_KL, GAO_UNBIASED, rm_n, is_max, is_min, gold_peak,
                                                 ("largest RM", "smallest RM")),
              Words("the largest RM peaks higher", "the largest RM peaks lower", "no peak difference detected")),
        shown("hacking with the length-biased labeler, smallest vs largest RM", "split-half gold drop up to the "
              "matched KL: smallest − largest RM, length-biased labels, per seed", GOLD,
              grouped_at_matched_kl(GAO, GAO_BIASED, rm_n, is_min, is_max, gold_drop_upto,
                                    ("smallest RM", "largest RM")),
              Words("the largest RM's gold drops less", "the largest RM's gold drops more",
                    "no drop difference detected")),
        shown("best-of-n gold, largest vs smallest RM", "gold at n = 256 (best-of-n, same RMs): largest − "
              "smallest RM, unbiased labels, per seed", GOLD, grouped(GAO_BON, Arm("best-of-n", {"labeler": "unbiased"},
              stage="bon"), rm_n, is_max, is_min, final_gold, ("largest RM", "smallest RM")),
              gold_words("more gold with the largest RM", "less gold with the largest RM")),
    ), note="Gao et al.'s setup: PPO at β = 0, RM micro to medium (about 95×), one RM per seed; unbiased labels from "
            "gao_rm_scaling_kl (evaluated at each 0.5 of √KL), the rest from gao_rm_scaling (log-spaced steps). The runs "
            "end at very different KLs, so the drop is compared per seed at the KL both runs reached. Fits by RM size: "
            "reports/gao_rm_scaling/. Superseded: rm_size_hacking_beta0, _5rms; gao_rm_scaling's unbiased arm.",
        also=(GAO, GAO_BON), min_rms=RM_CLAIM_RMS),
    Claim("C14", "GRPO replaces the KL penalty with group normalisation.", (GRPO_KL,), (
        Part("group normalisation alone does at least as well as the KL term", "final gold: GRPO at β = 0 − GRPO at "
             "β = 0.04 (k3 in the loss), per seed; non-inferiority: holds when the lower bound is above −0.05",
             GOLD, +1, GOLD_MARGIN, paired(GRPO_KL, GRPO_BETA0, GRPO_BETA004, final_gold), noninferiority=True),
        shown("GRPO's distance from the reference without the KL term", "ln(final eval/kl: β = 0 ÷ β = 0.04), "
              "per seed", LN_RATIO, paired(GRPO_KL, GRPO_BETA0, GRPO_BETA004, final("eval/kl"), scale="log ratio"),
              Words("drifts further without the KL term", "stays closer without the KL term",
                    "no KL difference detected")),
        shown("hacking by GRPO at β = 0: gold's drop from its peak", "split-half drop of gold from its peak, each "
              "β = 0 run", GOLD, within(GRPO_KL, GRPO_BETA0, gold_drop),
              Words("gold falls from its peak (hacking)", "gold ends above its peak", "no drop detected")),
    ), note="What GRPO is (Shao et al. 2024) is not in question: it keeps a KL term, in the loss (k3, β = 0.04), "
            "and its group-normalised advantages replace the critic. Tested here: whether the KL term still "
            "matters once advantages are group-normalised; the claim holds if β = 0 ends no more than 0.05 below β = 0.04 "
            "in gold (the CI's lower bound above −0.05, Holm-adjusted), and does not hold if the KL term is shown "
            "to give more than 0.05 more gold."),
    Claim("C15", "PPO needs four models (actor and critic trained, reference and RM frozen), and the critic's "
          "baseline lowers variance.", (CRITIC,), (
        Part("the critic lowers the advantage variance", "ln(mean objective/advantage_var over steps: no critic ÷ "
             "critic), per seed", LN_RATIO, +1, LN_10PCT,
             paired(CRITIC, Arm("no critic", {"algo.critic": "none"}), Arm("critic", {"algo.critic": "policy"}),
                    step_mean("objective/advantage_var"), scale="log ratio")),
        shown("gold with the critic", "final gold: critic − no critic, per seed", GOLD,
              paired(CRITIC, Arm("critic", {"algo.critic": "policy"}), Arm("no critic", {"algo.critic": "none"}),
                     final_gold), gold_words("more gold with the critic", "less gold with the critic")),
    ), note="'Four models' describes the setup and is not tested; without a critic the baseline is the batch mean."),
    Claim("C16", "The RM need not share the policy's base, but a same-source RM is more stable.", (RM_MATCHED,), (
        Part("a different-source RM still works", "last − first eval/gold_reward with the different-source RM, per "
             "seed", GOLD, +1, GOLD_MARGIN, within(RM_MATCHED, DIFF, change("eval/gold_reward"))),
        Part("a same-source RM is more stable: less step-to-step noise of gold", "ln(step-to-step noise of "
             "eval/gold_reward: different ÷ same source), per seed", LN_RATIO, +1, LN_10PCT,
             paired(RM_MATCHED, DIFF, SAME, step_noise("eval/gold_reward"), scale="log ratio")),
        Part("and a smaller drop from its gold peak", "split-half gold drop from the peak: different − same source, "
             "per seed", GOLD, +1, GOLD_MARGIN, paired(RM_MATCHED, DIFF, SAME, gold_drop)),
        shown("final gold", "final gold: same − different source, per seed", GOLD,
              paired(RM_MATCHED, SAME, DIFF, final_gold),
              gold_words("more gold with the same-source RM", "less gold with the same-source RM")),
        shown("at what KL", "ln(final eval/kl: same ÷ different source), per seed", LN_RATIO,
              paired(RM_MATCHED, SAME, DIFF, final("eval/kl"), scale="log ratio"),
              Words("further from the reference with the same-source RM",
                    "closer to the reference with the same-source RM", "no KL difference detected")),
    ), note="Both RMs start from an SFT run of their own family, same shape and training (rm_source_matched); the "
            "superseded rm_source_5rms confounded source with initialisation (SFT vs pretrained base).",
        min_rms=RM_CLAIM_RMS),
    Claim("C17", "A different-source RM mis-scores the policy's out-of-distribution text; mixing ~20 % on-policy "
          "samples into its training data fixes it.", (RM_MIS_PROBE,), (
        Part("a different-source RM mis-scores the policy's text", "final probe/proxy_gold_agreement (the RM's "
             "accuracy against gold on pairs of one optimised probe policy's samples, the same text for every arm): "
             "same − different source, per seed", FRACTION, +1, 0.02,
             paired(RM_MIS_PROBE, SAME, DIFF, PROBE_AGREEMENT)),
        Part("20 % on-policy pairs fix the mis-scoring", "final probe/proxy_gold_agreement: different source with − "
             "without on-policy pairs, per seed", FRACTION, +1, 0.02,
             paired(RM_MIS_PROBE, DIFF_MIX, DIFF, PROBE_AGREEMENT)),
        Part("and the policy's gold", "final gold: different source with − without on-policy pairs, per seed", GOLD,
             +1, GOLD_MARGIN, paired(RM_MIS_PROBE, DIFF_MIX, DIFF, final_gold)),
        shown("on the text of the policy each RM trained", "final eval/proxy_gold_agreement (on pairs of the "
              "arm's own policy's samples, which partly measures how far that policy exploited its RM): same − "
              "different source, per seed", FRACTION, paired(RM_MIS_PROBE, SAME, DIFF, AGREEMENT),
              Words("the same-source RM more accurate on its policy's text",
                    "the same-source RM less accurate on its policy's text", "no agreement difference detected"),
              0.02),
    ), note="Every RM starts from an SFT run of its own family (reward_model.init: sft) and is read on one common "
            "text per seed: the samples of a probe policy trained against a held-out same-source RM (seed 100 + s), "
            "which also gives seed s's mixed RM its on-policy pairs (training prompts; agreement read on eval "
            "prompts); unbiased labels (rm_mis_scoring_probe). The superseded rm_mis_scoring confounded source with "
            "initialisation and read each RM on its own policy's text.", min_rms=RM_CLAIM_RMS),
    Claim("C18", "The RM should be ≥ 1/10 of the policy's size, and an ensemble of 3–5 small RMs ≈ one larger RM.",
          (RM_SIZE,), (
        Part("an RM below 1/10 of the policy does worse", "final gold: mean over RMs ≥ 1/10 of the policy's params − "
             "mean over RMs < 1/10, per policy size and seed", GOLD, +1, GOLD_MARGIN,
             grouped(RM_SIZE, ANY_PPO, rm_ratio, lambda v, _: v >= 0.1, lambda v, _: v < 0.1, final_gold,
                     ("RM ≥ 1/10", "RM < 1/10"), unit=policy_seed)),
        shown("an ensemble of 3 tiny RMs (λ = 1) vs one small RM of about their total size",
              "final gold: ensemble (mean − 1·std) − single small RM, per seed", GOLD,
              paired(RM_ENS, Arm("ensemble of 3 tiny, λ = 1", {"reward_model.ensemble": 3,
                                                              "reward_model.conservative_lambda": 1}),
                     Arm("one small RM", {"reward_model.ensemble": 1}), final_gold), ENSEMBLE_GOLD),
        shown("the same ensemble scored by its mean (λ = 0)", "final gold: ensemble (mean) − single small RM, per seed",
              GOLD, paired(RM_ENS, Arm("ensemble of 3 tiny, λ = 0", {"reward_model.ensemble": 3,
                                                                    "reward_model.conservative_lambda": 0}),
                           Arm("one small RM", {"reward_model.ensemble": 1}), final_gold), ENSEMBLE_GOLD),
    ), note="'≈ one larger RM' is an equivalence: the ensemble parts are shown with their intervals, not judged.",
        also=(RM_ENS,), min_rms=RM_CLAIM_RMS),
    Claim("C19", "A LoRA-tuned RM with a small rank (r = 8) adapts worse than r = 64.", (RM_LORA,), (
        Part("r = 8 fits the preferences worse", "rm/accuracy (held-out pairs, vs the labeler): r = 64 − r = 8, per "
             "RM seed", FRACTION, +1, 0.01,
             paired(RM_LORA, Arm("r = 64", {"reward_model.lora.r": 64}, stage=""),
                    Arm("r = 8", {"reward_model.lora.r": 8}, stage=""), rm_metric("rm/accuracy"), unit=rm_seed)),
        shown("accuracy against gold, r = 64 vs r = 8", "rm/accuracy_gold: r = 64 − r = 8, per RM seed", FRACTION,
              paired(RM_LORA, Arm("r = 64", {"reward_model.lora.r": 64}, stage=""),
                     Arm("r = 8", {"reward_model.lora.r": 8}, stage=""), rm_metric("rm/accuracy_gold"),
                     unit=rm_seed),
              Words("r = 8 is less accurate against gold", "r = 8 is more accurate against gold",
                    "no accuracy difference detected"), 0.01),
        shown("full fine-tuning vs r = 64", "rm/accuracy: full (r = 0) − r = 64, per RM seed", FRACTION,
              paired(RM_LORA, Arm("full fine-tuning", {"reward_model.lora.r": 0}, stage=""),
                     Arm("r = 64", {"reward_model.lora.r": 64}, stage=""), rm_metric("rm/accuracy"), unit=rm_seed),
              Words("full fine-tuning fits better", "full fine-tuning fits worse", "no accuracy difference detected"),
              0.01),
    ), note="One value per distinct RM: RMs shared by several PPO runs count once (an RM seed is the unit).",
        min_rms=RM_CLAIM_RMS),
    Claim("C20", "Reward normalisation fixes reward-scale drift.", (RM_NORM,), (
        Part("normalising the RM improves PPO", "final gold: normalize = true − false, per seed", GOLD, +1,
             GOLD_MARGIN, paired(RM_NORM, Arm("normalised", {"reward_model.normalize": True}),
                                 Arm("raw", {"reward_model.normalize": False}), final_gold)),
        shown("how far the policy moves, normalised vs raw", "final eval/kl: normalize = true − false, per seed",
              "nats", paired(RM_NORM, Arm("normalised", {"reward_model.normalize": True}),
                             Arm("raw", {"reward_model.normalize": False}), final("eval/kl")),
              Words("further with normalisation", "less far with normalisation", "no KL difference detected")),
    ), note="A fixed affine map cannot follow a drift during PPO; what is judged is the outcome with vs without it.",
        min_rms=RM_CLAIM_RMS),
    Claim("C21", "Numbers quoted in the notes: 'Anthropic +30 % stability', 'DeepSeek-R1 used 5×1.3B RMs', "
          "'InstructGPT defaults to a 1.3B RM'.",
          untestable="quotations about other labs' systems, unverifiable or wrong (InstructGPT used one 6B RM for "
                     "every policy size); nothing to run."),
)

BY_ID = {c.id: c for c in CLAIMS}
