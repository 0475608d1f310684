"""The study report's "Which checkpoint to ship" section: the run and checkpoint the product's ship rule
(:mod:`rlhf_lab.evaluation.ship_choice`) recommends among a study's runs, with the figures the rule is quoted with.

Each PPO, GRPO or RLOO run that kept its training proxy (``objective/scores``) and ``eval/kl`` is read as the rule
reads it (:func:`rlhf_lab.evaluation.objective.run_curve`), so the step is the one its job saved as its ship
checkpoint. Across runs the section ships the run whose chosen checkpoint has the highest value of the same criterion
(proxy − c·√KL): the design measured the rule within a run only, and the section says so. Where the runs have a gold,
the gold's own choice (by eval gold) stands beside it, named as what a user without a gold cannot see, and each
setting's mean gold regret is the design's split-half one (the best checkpoint chosen on one half of the eval prompts,
``eval/gold_reward_a``, measured with the shipped one on the other, both ways averaged), never a peak chosen and
measured on the same prompts.
"""

from __future__ import annotations

import math
import statistics
from typing import NamedTuple, Sequence

from rlhf_lab.analysis.markdown import fmt, fmt_ms, md_table
from rlhf_lab.analysis.quantities import HALF_A, HALF_B
from rlhf_lab.analysis.study_runs import RunData, groups, label
from rlhf_lab.evaluation import objective as O
from rlhf_lab.evaluation import ship as S
from rlhf_lab.evaluation.ship_choice import FIGURES, PARAMS, RULE, rule_text

RL_STAGES = ("ppo", "grpo", "rloo")  # the algorithms the rule was measured on


class Shipped(NamedTuple):
    run: RunData
    step: int
    steps: int  # evaluations read
    value: float  # proxy − c·√KL at the shipped checkpoint
    regret: float  # split-half gold regret (nan without both halves at every evaluation)


def split_half_regret(r: RunData, steps: Sequence[int], shipped: int) -> float:
    """The design's regret of shipping index `shipped`: best chosen on half A and measured on half B, and the swap,
    averaged; nan unless both halves were logged at every evaluation."""
    a, b = dict(r.series(HALF_A)), dict(r.series(HALF_B))
    if not all(t in a and t in b for t in steps):
        return math.nan
    ga, gb = [a[t] for t in steps], [b[t] for t in steps]
    return (S.selection_regret(ga, gb, shipped) + S.selection_regret(gb, ga, shipped)) / 2


def shipped(r: RunData) -> Shipped | None:
    """The checkpoint the rule ships in run `r`, None where the run kept no training proxy or is not RL."""
    if r.status != "FINISHED" or r.stage not in RL_STAGES or not r.series(O.TRAIN_PROXY):
        return None
    try:
        curve = O.run_curve({k: r.series(k) for k in O.KEYS})
    except ValueError:
        return None
    i = S.ship(curve, RULE, PARAMS)
    if i is None:
        return None
    value = curve.proxy[i] - PARAMS["cost"] * math.sqrt(max(curve.kl[i], 0.0))
    return Shipped(r, curve.steps[i], len(curve.steps), value, split_half_regret(r, curve.steps, i))


def gold_choice(runs: Sequence[RunData]) -> tuple[RunData, int, float] | None:
    """(run, step, eval gold) of the checkpoint of highest ``eval/gold_reward`` among `runs`."""
    points = [(g, r, t) for r in runs for t, g in r.series("eval/gold_reward") if math.isfinite(g)]
    if not points:
        return None
    g, r, t = max(points, key=lambda p: p[0])
    return r, t, g


def ship_section(runs: Sequence[RunData]) -> list[str]:
    """The section's markdown lines; none when no run is of an algorithm the rule was measured on."""
    rl = [r for r in runs if r.stage in RL_STAGES and r.status == "FINISHED"]
    if not rl:
        return []
    chosen = [s for s in map(shipped, rl) if s is not None]
    lines = ["## Which checkpoint to ship", "",
             f"By the ship rule the jobs use, {rule_text()} (`{RULE}`: the checkpoint of a run maximising the training "
             "batches' proxy reward since the previous evaluation minus that much per √nat of KL), the rule of least "
             "gold regret in the design and in the prospective test (`reports/ship/test.md`, where it beat a clock "
             f"but not, with its interval, the last checkpoint); {FIGURES.text()}.", ""]
    if not chosen:
        return lines + [f"None of the {len(rl)} PPO/GRPO/RLOO runs kept its training proxy (`objective/scores`): "
                        "the rule cannot be applied to them here.", ""]
    best = max(chosen, key=lambda s: s.value)
    lines += [f"**Ship** `{label(best.run)}` seed {best.run.seed} (run `{best.run.run_id}`), step {best.step} "
              f"(value {fmt(best.value)}; a job of this version keeps the checkpoint its rule ships as "
              "`<output dir>/artifact/ship`). Within a run the "
              "step is the rule's; among runs this report ships the one of highest value by the same criterion, a "
              "choice across runs the design did not measure (the runs' proxies must be the same RM's to compare)."]
    gold = gold_choice([s.run for s in chosen])
    if gold is not None:
        r, t, g = gold
        lines[-1] += (f" The gold's own choice, which a user without a gold cannot see: `{label(r)}` seed {r.seed} "
                      f"(run `{r.run_id}`), step {t} (eval gold {fmt(g)}: the highest of every evaluation, so biased upward "
                      "by their noise).")
    lines.append("")
    rows = []
    for name, members in groups([s.run for s in chosen]).items():
        ids = {r.run_id for r in members}
        mine = [s for s in chosen if s.run.run_id in ids]
        regrets = [s.regret for s in mine if math.isfinite(s.regret)]
        rows.append([f"`{name}`", len(mine), fmt(statistics.median(s.step for s in mine), 0),
                     fmt(statistics.median(s.steps for s in mine), 0), fmt_ms([s.value for s in mine]),
                     fmt_ms(regrets) if regrets else "–"])
    lines += [md_table(["setting", "runs", "shipped step (median)", "evaluations (median)", "value at it",
                        "gold regret (split-half)"], rows), ""]
    if len(chosen) < len(rl):
        lines += [f"{len(rl) - len(chosen)} of the {len(rl)} PPO/GRPO/RLOO runs kept no training proxy "
                  "(`objective/scores`) and are not scored.", ""]
    return lines
