"""The frontier report's comparisons that a selection on one sample does not flatter and β does not confound.

A study report comparing several algorithms over settings (β) and seeds (:mod:`rlhf_lab.analysis.study_report`) gets
three more parts from here, when every algorithm's settings share at least :data:`MIN_SEEDS` seeds:

- :func:`confound_note`: what the design still varies besides the algorithm, read from the runs' params (a critic
  trained or not, where the KL penalty acts and its estimator, prompts per step, the learning rates): named as not
  removed, for the report's header.
- :func:`seed_split_selection`: each algorithm's best setting chosen on some seeds' final eval gold and measured on
  the OTHER seeds' final test gold (``final_gold``), averaged over every split of the seeds (the first
  ``n - n // 2`` chosen, the rest measured); :func:`bootstrap_selection` resamples the seeds (a seed's runs of every
  setting travel together) and redoes the whole choose-then-measure procedure, for a percentile interval.
- :func:`matched_kl`: each algorithm's final test gold interpolated, per seed, at common KL values across its
  settings (linear in √KL between the settings' end points, never beyond them), so algorithms are compared at the
  same distance from the reference rather than at the same β.

Pure functions of per-seed numbers (:func:`seed_table`) plus the markdown that shows them (:func:`matched_sections`).
"""

from __future__ import annotations

import itertools
import math
from typing import Mapping, Sequence

import numpy as np

from rlhf_lab.analysis.markdown import fmt, fmt_ci, md_table
from rlhf_lab.analysis.quantities import final_gold
from rlhf_lab.analysis.study_runs import RunData, groups, natural_key

MIN_SEEDS = 4  # the seed split needs at least 2 seeds to choose on and 2 to measure on
BOOTSTRAP = 2000  # resamples of the seeds (fixed generator seed 0: the report regenerates byte for byte)
KL_GRID = (1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 15.0, 20.0, 30.0)  # nats; rows of the matched table

# per setting, per seed: (final eval gold, final test gold, final eval KL)
SeedTable = Mapping[str, Mapping[str, tuple[float, float, float]]]


def seed_table(runs: Sequence[RunData]) -> tuple[dict[str, dict[str, tuple[float, float, float]]], list[str]]:
    """(setting -> seed -> (last ``eval/gold_reward``, ``final_gold``, last ``eval/kl``), the seeds every setting has
    with all three finite), from FINISHED runs; a job run twice keeps its last run in `runs`' order."""
    table: dict[str, dict[str, tuple[float, float, float]]] = {}
    for name, members in groups([r for r in runs if r.status == "FINISHED"]).items():
        for r in members:
            v = (r.last("eval/gold_reward"), final_gold(r), r.last("eval/kl"))
            if all(math.isfinite(x) for x in v):
                table.setdefault(name, {})[r.seed] = v
    common = set.intersection(*(set(s) for s in table.values())) if table else set()
    return table, sorted(common, key=natural_key)


def split_sizes(n: int) -> int:
    """How many of `n` seeds choose the setting (the rest measure it): n - n // 2 (5 -> 3 and 2)."""
    return n - n // 2


def choose(table: SeedTable, seeds: Sequence[str]) -> str:
    """The setting with the highest mean final eval gold over `seeds` (ties: the first in natural order)."""
    return max(sorted(table, key=natural_key), key=lambda s: np.mean([table[s][x][0] for x in seeds]))


def seed_split_selection(table: SeedTable, seeds: Sequence[str]) -> tuple[float, dict[str, int]]:
    """(mean over every split of `seeds` of the chosen setting's mean test gold on the held-out seeds, how often each
    setting was chosen). A split chooses on :func:`split_sizes` seeds' eval gold and measures on the others' test
    gold; NaN with fewer than 2 seeds."""
    seeds = list(seeds)
    if len(seeds) < 2:
        return float("nan"), {}
    k = split_sizes(len(seeds))
    values, chosen = [], {}
    for pick in itertools.combinations(range(len(seeds)), k):
        best = choose(table, [seeds[i] for i in pick])
        chosen[best] = chosen.get(best, 0) + 1
        values.append(np.mean([table[best][seeds[i]][1] for i in range(len(seeds)) if i not in pick]))
    return float(np.mean(values)), chosen


def bootstrap_selection(table: SeedTable, seeds: Sequence[str], resamples: int = BOOTSTRAP,
                        level: float = 0.95) -> tuple[float, float, int]:
    """Percentile interval of :func:`seed_split_selection` over resamples of the seeds with replacement (each drawn
    seed brings its runs of every setting); within a resample the splits that put one seed on both sides are
    skipped (that would measure on a seed it chose on), and a resample with no other split is dropped. Returns
    (low, high, resamples used)."""
    seeds = list(seeds)
    n, k = len(seeds), split_sizes(len(seeds))
    if n < 2:
        return float("nan"), float("nan"), 0
    rng = np.random.default_rng(0)
    stats = []
    for _ in range(resamples):
        draw = rng.integers(0, n, n)
        values = []
        for pick in itertools.combinations(range(n), k):
            rest = [i for i in range(n) if i not in pick]
            if {int(draw[i]) for i in pick} & {int(draw[i]) for i in rest}:
                continue
            sub = {s: {str(j): table[s][seeds[draw[j]]] for j in range(n)} for s in table}
            best = choose(sub, [str(i) for i in pick])
            values.append(np.mean([sub[best][str(i)][1] for i in rest]))
        if values:
            stats.append(np.mean(values))
    if not stats:
        return float("nan"), float("nan"), 0
    lo, hi = np.quantile(stats, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi), len(stats)


def interpolate_gold(points: Sequence[tuple[float, float]], kl: float) -> float:
    """Test gold at `kl` (nats) from one seed's (final KL, test gold) end points of an algorithm's settings, linear
    in √KL between the two nearest; NaN outside the points' range (never extrapolated)."""
    pts = sorted((math.sqrt(max(k, 0.0)), g) for k, g in points)
    d = math.sqrt(kl)
    if len(pts) < 2 or not pts[0][0] <= d <= pts[-1][0]:
        return float("nan")
    return float(np.interp(d, [p[0] for p in pts], [p[1] for p in pts]))


def covered_range(table: SeedTable, seeds: Sequence[str]) -> tuple[float, float]:
    """The KL range (nats) every seed's settings span: (largest per-seed minimum, smallest per-seed maximum)."""
    lows = [min(table[s][x][2] for s in table) for x in seeds]
    highs = [max(table[s][x][2] for s in table) for x in seeds]
    return max(lows), min(highs)


def matched_kl(table: SeedTable, seeds: Sequence[str], kl: float) -> list[float]:
    """Per seed, the test gold interpolated at `kl` across the settings (:func:`interpolate_gold`)."""
    return [interpolate_gold([(table[s][x][2], table[s][x][1]) for s in table], kl) for x in seeds]


def common_range(ranges: Mapping[str, tuple[float, float]]) -> tuple[list[str], tuple[float, float]] | None:
    """The largest set of algorithms whose KL `ranges` overlap (of equal sizes, the first in `ranges`' order) and
    their shared range; None when no two overlap."""
    names = list(ranges)
    for size in range(len(names), 1, -1):
        for subset in itertools.combinations(names, size):
            lo, hi = max(ranges[a][0] for a in subset), min(ranges[a][1] for a in subset)
            if lo <= hi:
                return list(subset), (lo, hi)
    return None


def compared(by_algo: Mapping[str, Sequence[RunData]]) -> dict[str, tuple[dict, list[str]]]:
    """Each algorithm's :func:`seed_table`, or {} when fewer than two algorithms have runs or one with several
    settings has fewer than :data:`MIN_SEEDS` seeds common to them (the report's parts from here are then left out)."""
    tables = {a: seed_table(rs) for a, rs in by_algo.items()}
    tables = {a: t for a, t in tables.items() if t[0]}
    if len(tables) < 2 or any(len(seeds) < MIN_SEEDS for t, seeds in tables.values() if len(t) > 1):
        return {}
    return tables


def confound_note(by_algo: Mapping[str, Sequence[RunData]]) -> list[str]:
    """The design's differences besides the algorithm and β, read from the RL runs' params, named as not removed
    (for the report's header; nothing where :func:`compared` leaves the matched parts out)."""
    rl = {a: rs for a, rs in by_algo.items() if a in ("ppo", "grpo", "rloo") and rs}
    if not rl or not compared(by_algo):
        return []
    val = lambda rs, key: ", ".join(sorted({str(r.value(key, "?")) for r in rs}))  # noqa: E731

    def prompts(rs: Sequence[RunData]) -> str:
        per = {int(r.fnum("algo.batch_size") // max(r.fnum("algo.samples_per_prompt"), 1)) for r in rs
               if math.isfinite(r.fnum("algo.batch_size")) and math.isfinite(r.fnum("algo.samples_per_prompt"))}
        return ", ".join(map(str, sorted(per))) or "?"

    parts = [f"{a}: critic {val(rs, 'algo.critic')}, KL in the {val(rs, 'algo.kl_in')} ({val(rs, 'algo.kl_estimator')}"
             f" estimator), {prompts(rs)} prompts per step, lr {val(rs, 'algo.lr')}" for a, rs in rl.items()]
    return ["**Not removed by this design** (the algorithms differ in more than the algorithm): " + "; ".join(parts)
            + ". A critic trained beside the policy is capacity the others lack; a KL penalty in the loss with another "
            "estimator makes the same β another constraint (compare the KL each reaches); prompts per step differ at "
            "equal samples; one learning rate, untuned per algorithm. The comparisons at matched KL and by seed-split "
            "selection below remove the β mismatch and the selection's optimism, not these.", ""]


def matched_sections(by_algo: Mapping[str, Sequence[RunData]]) -> list[str]:
    """The seed-split selection table and the matched-KL table, or nothing when an algorithm with several settings
    has fewer than :data:`MIN_SEEDS` seeds common to its settings."""
    tables = compared(by_algo)
    if not tables:
        return []
    rows = []
    for algo, (t, seeds) in tables.items():
        if len(seeds) < MIN_SEEDS:
            rows.append([algo, len(seeds), f"– (fewer than {MIN_SEEDS} seeds)", 0, "–", "–", 0])
            continue
        est, chosen = seed_split_selection(t, seeds)
        lo, hi, used = bootstrap_selection(t, seeds)
        k = split_sizes(len(seeds))
        how = ", ".join(f"`{s}` {c}" for s, c in sorted(chosen.items(), key=lambda sc: (-sc[1], natural_key(sc[0]))))
        rows.append([algo, len(seeds), f"{k} / {len(seeds) - k}", math.comb(len(seeds), k), how,
                     f"{fmt(est)} [{fmt(lo)}, {fmt(hi)}]", used])
    out = ["**Best setting chosen on some seeds, measured on the others** (the eval and test gold of one run correlate "
           "closely, so choosing on a run's eval and reporting its test, as above, is optimistic): every split of "
           "the seeds into a set that chooses (highest mean final eval gold) and a set that measures (mean final test "
           "gold of the chosen setting on those seeds only), the measured gold averaged over the splits; the interval "
           f"is the 2.5–97.5 % percentile over {BOOTSTRAP} resamples of the seeds (each seed with its runs of every "
           "setting) of the whole choose-then-measure procedure, splits that would put one drawn seed on both sides "
           "skipped. Best-of-n has one setting: its figure is its gold final over the held-out seeds.", "",
           md_table(["algo", "seeds", "choose / measure", "splits", "chosen (splits)",
                     "test gold on held-out seeds [bootstrap 95%]", "resamples used"], rows), ""]
    curves = {a: (t, seeds, covered_range(t, seeds)) for a, (t, seeds) in tables.items() if len(t) > 1}
    if len(curves) < 2:
        return out
    shared = common_range({a: r for a, (_, _, r) in curves.items()})
    lo, hi = shared[1] if shared else (math.inf, -math.inf)
    grid = [kl for kl in KL_GRID if sum(r[0] <= kl <= r[1] for _, _, r in curves.values()) >= 2]
    rows = []
    for kl in grid:
        row = [fmt(kl, 1) + (" (shared)" if lo <= kl <= hi else "")]
        for t, seeds, (a, b) in curves.values():
            row.append(fmt_ci(matched_kl(t, seeds, kl)) if a <= kl <= b else "outside")
        rows.append(row)
    common = (f"{', '.join(shared[0])} all cover {fmt(lo, 2)}–{fmt(hi, 2)} nats (rows marked \"shared\"; "
              + ("every algorithm" if len(shared[0]) == len(curves) else "no KL is covered by every algorithm, these "
                 "are the most that share one") + ")" if shared else "no two algorithms cover a common KL")
    ranges = "; ".join(f"{a} {fmt(r[0], 2)}–{fmt(r[1], 2)}" for a, (_, _, r) in curves.items())
    ends = "; ".join(f"{a} " + ", ".join(fmt(float(np.mean([t[s][x][2] for x in seeds])), 2)
                                         for s in sorted(t, key=lambda s: np.mean([t[s][x][2] for x in seeds])))
                     for a, (t, seeds, _) in curves.items())
    return out + ["**At matched KL** (the same distance from the reference rather than the same β): per seed, each "
                  "algorithm's final test gold interpolated across its settings' end points (final eval KL, test "
                  "gold), linear in √KL, never beyond the KL its settings reach on every seed; mean [95% t interval] "
                  f"over seeds. Ranges covered on every seed: {ranges}; {common}. Between two settings' end points the "
                  f"value is a line, not a measured run: the settings' mean final KL are {ends}. Best-of-n (one KL) is "
                  "not placed.", "",
                  md_table(["KL (nats)", *curves], rows), ""]
