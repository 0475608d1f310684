"""What no gold-free signal can see (issue 67, item 3): the gold lost to reward hacking in the prospective runs split
into the part from the proxy's *errors* and the part from the labeler's *bias*; ``reports/ship/decomposition.md``.

    python -m rlhf_lab_research.ship_decomposition    # reads reports/ship/test_runs.json.gz (ship_test --store)
    python -m rlhf_lab_research.ship_decomposition --runs FILE --out PATH

Written and committed while the prospective runs were being made, before any of them was read or scored (the
protocol's "Decomposition", ``reports/ship/PROTOCOL.md``); computing it on the test runs is part of their one look. The runs are those the test scores (:func:`rlhf_lab_research.ship_test.exclusion`),
each rule with its frozen parameters (``reports/ship/rules.json``) and its regret as the test measures it
(:func:`rlhf_lab_research.ship_test.scored`: the best checkpoint chosen by ``eval/gold_reward``, it and the shipped
one measured by ``test/gold_reward``, which no signal reads).

**The decomposition** (study :data:`LABELER_STUDY`: PPO under an unbiased labeler and biased ones, the same seeds, a
held-out RM in every run). Per run, two regrets:

- T = the regret of ``proxy_max``: the gold lost at the proxy's optimum (the checkpoint the proxy RM scores best).
- H = the regret of ``heldout_max``: the gold lost at the optimum of the held-out RM, an RM of the proxy's recipe
  trained on pairs the proxy never saw, by the same labeler. Its errors are not the ones the policy was trained to
  exploit; a bias of the labeler it shares.

For a labeler L, with means over L's runs (E[·|L]):

- *error part* E_L = E[T − H | L]: the gold the held-out RM recovers; it can only be the proxy's own errors (where
  two RMs of one labeler's data disagree), present under every labeler;
- *noise floor* N = E[H | unbiased]: what the held-out RM's own errors still lose where the labeler has no bias;
- *bias part* B_L = E[H | L] − E[H | unbiased]: the gold lost even by the held-out RM beyond that floor, which only a
  shared bias of L's labels explains (length, filler); 0 by construction for the unbiased labeler.

So E[T | L] = E_L + N + B_L: an identity of means. What it assumes (not tested here): the held-out RM's own error
costs the same under every labeler (one recipe, as many pairs), so that the difference of H between labelers is the
bias. And a caveat of the regret as the protocol measures it: the held-out RM scores the same evaluation samples whose
gold (``eval/gold_reward``) chooses the best checkpoint, so their sample noise is shared and H is a little low; E is
overstated by that, B (a difference of H) about not.

Each part is given per KL setting (``kl_regime``: β = 0, fixed β > 0) and pooled; B compares L with the unbiased
labeler's runs of the same setting. Divergence, without a rule: per run the Spearman correlation over its checkpoints
of the proxy (the training batches' ``objective/scores``, as the rules read it) and of the held-out RM with the test
gold, and of the proxy with the held-out RM; under a biased labeler the held-out RM should follow the proxy, away
from the gold.

The ensemble (study :data:`ENSEMBLE_STUDY`, one biased labeler, a 3-RM proxy): the gold ``ensemble_lcb`` recovers
against the proxy's optimum, E[T − regret(ensemble_lcb)], again only the proxy's errors (the members disagree where
their seeds do); no unbiased ensemble runs exist, so its bias part is not measured.

**Intervals**: 95 % percentile bootstrap over seeds (a seed's runs of every labeler and KL setting drawn together:
:func:`rlhf_lab_research.ship_design.cluster_weights` with one study; 2000 resamples, seed 0), so the differences
between labelers are paired by seed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from scipy.stats import spearmanr

from rlhf_lab.analysis.snapshot import SnapshotError
from rlhf_lab_research.stats import percentile_ci
from rlhf_lab_research.ship_design import LEVEL, N_BOOT, SEED, cluster_weights, fmt, read_runs, table
from rlhf_lab_research.ship_test import RULES, RUNS_OUT, ProspectiveRun, exclusion, prospective_run, scored

COMMAND = "python -m rlhf_lab_research.ship_decomposition"
OUT = Path("reports/ship/decomposition.md")
LABELER_STUDY, ENSEMBLE_STUDY = "ship_labeler", "ship_ensemble"
UNBIASED = "unbiased"
REFERENCE, HELDOUT, ENSEMBLE = "proxy_max", "heldout_max", "ensemble_lcb"
# what each rule reads, and which part of the gold lost it can see: (reads, the proxy's errors, the labeler's bias)
CAPS = "no, but caps it: stops every run before the policy moves far"
CAN_SEE = {
    "last_checkpoint": ("nothing", "no", "no"),
    "clock": ("the step", CAPS, CAPS),
    "kl_budget": ("KL", CAPS, CAPS),
    "proxy_max": ("the proxy", "no: the proxy is the signal being hacked", "no"),
    "proxy_plateau": ("the proxy", "no: the proxy is the signal being hacked", "no"),
    "proxy_minus_sqrt_kl": ("the proxy, KL", "no, but caps it: charges each √nat of KL", "no, but caps it likewise"),
    "ensemble_lcb": ("the ensemble's mean and spread", "yes, where RMs of other seeds disagree",
                     "no: every member learned the same labels"),
    "heldout_max": ("an RM of other pairs", "yes, where an RM of other pairs disagrees",
                    "no: it learned from the same labeler"),
    "heldout_patience": ("an RM of other pairs", "yes, where an RM of other pairs disagrees",
                         "no: it learned from the same labeler"),
    "alarm": ("the proxy, KL, entropy, length", "not as such: a pattern fitted on the design runs",
              "not as such; its length and entropy signals react to length-style hacking whatever its cause"),
}
UNKNOWN = ("?", "?", "?")


@dataclass
class Part:
    """A mean with its bootstrap resamples (nan where a resample drew no run of the group)."""

    point: float
    boot: np.ndarray

    def __sub__(self, other: "Part") -> "Part":
        return Part(self.point - other.point, self.boot - other.boot)

    def text(self) -> str:
        if not math.isfinite(self.point):
            return "no run"
        lo, hi = percentile_ci(self.boot.tolist(), LEVEL)
        return f"{fmt(self.point)} [{fmt(lo)}, {fmt(hi)}]"

    def sign(self) -> str:
        """The interval's verdict in words: above 0, below 0, or cannot tell from 0."""
        lo, hi = percentile_ci(self.boot.tolist(), LEVEL) if math.isfinite(self.point) else (math.nan, math.nan)
        if not (math.isfinite(lo) and math.isfinite(hi)):
            return "not measured (too few runs)"
        return "above 0" if lo > 0 else "below 0" if hi < 0 else "not distinguishable from 0"


def group_mean(values: np.ndarray, select: np.ndarray, weights: np.ndarray) -> Part:
    """The mean of the finite `values` of the runs `select`, and the same mean in each resample (`weights`: n_boot ×
    runs, :func:`cluster_weights`)."""
    ok = select & np.isfinite(values)
    if not ok.any():
        return Part(math.nan, np.full(len(weights), math.nan))
    w = weights[:, ok]
    total = w.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        boot = np.where(total > 0, w @ values[ok] / np.where(total > 0, total, 1), math.nan)
    return Part(float(values[ok].mean()), boot)


@dataclass
class Split:
    """The decomposition of one labeler's gold lost at the proxy's optimum (module docstring): E[T], E[H], the error
    part E, the noise floor N (the unbiased labeler's E[H]) and the bias part B."""

    total: Part
    heldout: Part
    error: Part
    floor: Part
    bias: Part


def decompose(total: np.ndarray, heldout: np.ndarray, labelers: Sequence[str], labeler: str, select: np.ndarray,
              weights: np.ndarray) -> Split:
    """The :class:`Split` of `labeler` among the runs `select` (one KL setting, or all): `total` and `heldout` are
    each run's T and H; B compares `labeler`'s runs with the unbiased labeler's runs of `select`. Runs lacking T or H
    count in neither mean (E is taken over the runs that have both)."""
    labelers = np.asarray(labelers)
    both = np.isfinite(total) & np.isfinite(heldout)
    mine, unbiased = select & (labelers == labeler) & both, select & (labelers == UNBIASED) & both
    t, h = group_mean(total, mine, weights), group_mean(heldout, mine, weights)
    floor = group_mean(heldout, unbiased, weights)
    bias = Part(0.0, np.zeros(len(weights))) if labeler == UNBIASED else h - floor
    return Split(t, h, group_mean(total - heldout, mine, weights), floor, bias)


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's ρ of two series over a run's checkpoints (nan: fewer than 3 finite pairs, or a constant one)."""
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ok = np.isfinite(a) & np.isfinite(b)
    if ok.sum() < 3 or np.ptp(a[ok]) == 0 or np.ptp(b[ok]) == 0:
        return math.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(spearmanr(a[ok], b[ok]).statistic)


def divergence(d: ProspectiveRun) -> tuple[float, float, float]:
    """(ρ(proxy, test gold), ρ(held-out RM, test gold), ρ(proxy, held-out RM)) over the run's checkpoints."""
    held = d.curve.heldout_reward
    if held is None:
        return spearman(d.curve.proxy, d.measure), math.nan, math.nan
    return spearman(d.curve.proxy, d.measure), spearman(held, d.measure), spearman(d.curve.proxy, held)


def labeler_order(labelers: Sequence[str]) -> list[str]:
    """The unbiased labeler first (the reference), then the others by name."""
    return sorted(set(labelers), key=lambda name: (name != UNBIASED, name))


def labeler_section(runs: Sequence[ProspectiveRun], rules: dict) -> list[str]:
    """The decomposition of :data:`LABELER_STUDY`'s runs: per-rule regret by labeler, the split, the divergence."""
    if not runs:
        return [f"No run of `{LABELER_STUDY}` entered: nothing to decompose.", ""]
    weights = cluster_weights([LABELER_STUDY] * len(runs), [d.seed for d in runs], N_BOOT, SEED)
    labelers = [d.labeler for d in runs]
    order = labeler_order(labelers)
    regrets = {rule: scored(runs, rule, params)[1] for rule, params in rules.items()}
    everything = np.ones(len(runs), dtype=bool)
    lines = [f"## Gold lost per rule and labeler (`{LABELER_STUDY}`)", "",
             "Mean regret (95 % interval over seeds); a rule reading a signal the runs lack has none.", ""]
    rows = [[f"`{rule}`", CAN_SEE.get(rule, UNKNOWN)[0],
             *(group_mean(regrets[rule], np.array([x == name for x in labelers]), weights).text() for name in order)]
            for rule in rules]
    lines += table(("rule", "reads", *(f"`{name}`" for name in order)), rows)
    if REFERENCE not in regrets or HELDOUT not in regrets:
        return lines + ["", f"The rules `{REFERENCE}` and `{HELDOUT}` are not both in the rules file: no split."]
    total, heldout = regrets[REFERENCE], regrets[HELDOUT]
    lines += ["", "## The split: the proxy's errors against the labeler's bias", "",
              f"T: gold lost at the proxy's optimum (`{REFERENCE}`); H: at the held-out RM's (`{HELDOUT}`); error part "
              "E = E[T − H]; noise floor N = E[H] of the unbiased labeler's runs (same KL setting); bias part "
              "B = E[H] − N (0 by construction for the unbiased labeler). E[T] = E + N + B.", ""]
    regimes = sorted({d.regime for d in runs})
    rows, pooled = [], {}
    for name in order:
        for regime in (*regimes, "all"):
            select = everything if regime == "all" else np.array([d.regime == regime for d in runs])
            s = decompose(total, heldout, labelers, name, select, weights)
            if regime == "all":
                pooled[name] = s
            n = int((select & np.array([x == name for x in labelers]) & np.isfinite(total)
                     & np.isfinite(heldout)).sum())
            rows.append([f"`{name}`", regime, str(n), s.total.text(), s.heldout.text(), s.error.text(),
                         s.floor.text(), "0 (reference)" if name == UNBIASED else s.bias.text()])
    lines += table(("labeler", "KL setting", "runs", "E[T]", "E[H]", "error part E", "noise floor N",
                    "bias part B"), rows)
    lines += ["", "In words (pooled over the KL settings):", ""]
    for name, s in pooled.items():
        if name == UNBIASED:
            lines.append(f"- `{name}`: the held-out RM recovers {s.error.text()} of the {s.total.text()} lost at the "
                         f"proxy's optimum (the proxy's errors: {s.error.sign()}); no bias part by construction.")
        elif s.bias.sign() == "below 0":  # the held-out RM lost less than under the unbiased labeler
            lines.append(f"- `{name}`: error part {s.error.text()} ({s.error.sign()}), bias part {s.bias.text()} "
                         f"({s.bias.sign()}): under this labeler the held-out RM's choice lost less gold than under "
                         "the unbiased one, which the split's assumption (the held-out RM's own error costs the same "
                         "under every labeler) does not allow: its bias part is not identified here, and a negative "
                         "value is not a gain from the bias.")
        else:
            lines.append(f"- `{name}`: error part {s.error.text()} ({s.error.sign()}), bias part {s.bias.text()} "
                         f"({s.bias.sign()}): {fmt(s.bias.point)} of gold a run loses even when an RM "
                         "the policy never trained against chooses its checkpoint, beyond what it loses under the "
                         "unbiased labeler. No gold-free rule built on this labeler's data can see that part.")
    rho = np.array([divergence(d) for d in runs])
    lines += ["", "## Divergence over a run's checkpoints", "",
              "Mean Spearman ρ per run over its checkpoints (95 % interval over seeds): the proxy (training batches) "
              "and the held-out RM (eval prompts) against the test gold, and against each other. Where the held-out "
              "RM follows the proxy and not the gold, the labeler's bias is in both.", ""]
    rows = [[f"`{name}`", *(group_mean(rho[:, j], np.array([x == name for x in labelers]), weights).text()
                            for j in range(3))] for name in order]
    lines += table(("labeler", "ρ(proxy, gold)", "ρ(held-out RM, gold)", "ρ(proxy, held-out RM)"), rows)
    return lines


def ensemble_section(runs: Sequence[ProspectiveRun], rules: dict) -> list[str]:
    """What the ensemble rule recovers on :data:`ENSEMBLE_STUDY`'s runs (the proxy's errors only)."""
    lines = [f"## The ensemble (`{ENSEMBLE_STUDY}`)", ""]
    if not runs or REFERENCE not in rules or ENSEMBLE not in rules:
        return lines + [f"No run of `{ENSEMBLE_STUDY}` entered, or no `{ENSEMBLE}` rule: not measured."]
    weights = cluster_weights([ENSEMBLE_STUDY] * len(runs), [d.seed for d in runs], N_BOOT, SEED)
    total, ens = scored(runs, REFERENCE, rules[REFERENCE])[1], scored(runs, ENSEMBLE, rules[ENSEMBLE])[1]
    both = np.isfinite(total) & np.isfinite(ens)
    names = ", ".join(f"`{n}`" for n in sorted({d.labeler for d in runs}))
    recovered = group_mean(total - ens, both, weights)
    lost = group_mean(total, both, weights).text()
    lines += [f"{int(both.sum())} runs with the ensemble's spread (labeler {names}; a proxy of several RMs of "
              f"different seeds). Gold lost at the proxy's optimum {lost}; with `{ENSEMBLE}` "
              f"{group_mean(ens, both, weights).text()}; recovered by the ensemble's disagreement "
              f"{recovered.text()} ({recovered.sign()}). It can only be the proxy's errors: the members learned "
              "the same labels, so they agree on its bias. No unbiased ensemble run exists: its bias part is not "
              "measured here."]
    return lines


def report(runs: Sequence[ProspectiveRun], left_out: Counter, rules: dict, files: Sequence[str]) -> str:
    rules = {r: rules[r] for r in sorted(rules, key=lambda r: (list(CAN_SEE).index(r) if r in CAN_SEE else 99, r))}
    labeler_runs = [d for d in runs if d.study == LABELER_STUDY]
    ensemble_runs = [d for d in runs if d.study == ENSEMBLE_STUDY]
    command = COMMAND + "".join(f" --runs {f}" for f in files)
    lines = ["# What no gold-free signal can see: the proxy's errors against the labeler's bias (issue 67)", "",
             "Regenerate:", "", "```bash", command, "```", "",
             f"Runs: {', '.join(f'`{f}`' for f in files)}; rules: `{RULES}` (frozen, `reports/ship/FROZEN.md`); "
             f"definitions: `rlhf_lab_research/ship_decomposition.py`. {len(labeler_runs)} runs of "
             f"`{LABELER_STUDY}`, {len(ensemble_runs)} of `{ENSEMBLE_STUDY}` (seeds "
             f"{', '.join(sorted({d.seed for d in runs}, key=lambda s: (len(s), s))) or 'none'}). Regret: the test "
             "gold of the checkpoint best by eval gold minus the test gold of the one shipped.", "",
             "## Which hacking each rule can catch", "",
             "A gold-free rule sees only what differs between the signals it reads and the proxy. The proxy's "
             "*errors* (where RMs of other seeds or pairs disagree) show in a held-out RM or an ensemble's spread. A "
             "*bias* of the labeler (length, filler) is in every RM trained on its labels: no gold-free signal built "
             "on them shows it; only the gold, human review, or a labeler without that bias does. Rules that read "
             "neither (a clock, a KL budget, a KL charge) see neither part but cap both, by stopping before the "
             "policy has moved far.", ""]
    lines += table(("rule", "reads", "catches the proxy's errors?", "catches the labeler's bias?"),
                   [[f"`{rule}`", *CAN_SEE.get(rule, UNKNOWN)] for rule in rules])
    lines += ["", *labeler_section(labeler_runs, rules), "", *ensemble_section(ensemble_runs, rules), ""]
    lines += ["Left out: " + (", ".join(f"{why} ({study}: {n})" for (why, study), n in sorted(left_out.items()))
                              or "none") + "."]
    return "\n".join(lines) + "\n"


def load(files: Sequence[str]) -> tuple[list[ProspectiveRun], Counter]:
    """(the runs of the two studies that enter, sorted by study and run id; Counter of (why left out, study))."""
    runs, left_out = [], Counter()
    for study, r in read_runs(files):
        if study not in (LABELER_STUDY, ENSEMBLE_STUDY):
            continue
        why = exclusion(r)
        if why is None:
            runs.append(prospective_run(study, r))
        else:
            left_out[(why, study)] += 1
    return sorted(runs, key=lambda d: (d.study, d.run_id)), left_out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", action="append", help=f"a runs file of the test studies (default: {RUNS_OUT})")
    parser.add_argument("--rules", default=str(RULES), help="the frozen rules (default: %(default)s)")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    files = args.runs or [str(RUNS_OUT)]
    try:
        runs, left_out = load(files)
    except SnapshotError as err:
        print(f"ship_decomposition: {err}: keep the test runs first with `python -m rlhf_lab_research.ship_test "
              "--store` (reports/ship/PROTOCOL.md) or pass --runs FILE", file=sys.stderr)
        raise SystemExit(2) from None
    rules = json.loads(Path(args.rules).read_text(encoding="utf-8"))["rules"]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(report(runs, left_out, rules, files), encoding="utf-8")
    print(args.out)


if __name__ == "__main__":
    main()
