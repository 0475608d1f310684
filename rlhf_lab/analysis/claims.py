"""``reports/claims.md``: a verdict on each claim of docs/claims.md that the canned studies test.

Each claim is judged from the FINISHED runs of its study with at least :data:`MIN_EVALS` evaluations:
**holds**, **does not hold**, **inconclusive at this scale**, or **not run yet** when the study has no runs.
A difference counts when it exceeds the tolerance of :func:`_tol` (twice the seed spread or the evaluation
noise, at least 0.05 gold); peaks and final values are 3-evaluation running means (:meth:`RunData.slast`,
:meth:`RunData.speak`). The metrics are described in docs/metrics.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from rlhf_lab.analysis.fits import frontier
from rlhf_lab.analysis.markdown import fmt, md_table, mean_spread
from rlhf_lab.analysis.runs import RunData, groups, kl_gold_pairs, load_study, policy_size, store_uri


@dataclass
class Verdict:
    claim: str
    text: str
    command: str
    measured: str
    verdict: str  # holds | does not hold | inconclusive at this scale | not run yet


NOT_RUN = "not run yet"
MIN_EVALS = 5  # evaluations a run needs before it counts towards a verdict
MIN_KL = 1.0   # nats/response the least-constrained runs must reach before "does not hold" is said of over-optimisation
HOLDS, FAILS, INCONCL = "holds", "does not hold", "inconclusive at this scale"


def _moved(rs) -> tuple[bool, str]:
    kl = _mean(rs, lambda r: r.slast("eval/kl"))
    ok = math.isfinite(kl) and kl >= MIN_KL
    return ok, "" if ok else f" (the policy barely moved: final KL {fmt(kl, 2)} < {MIN_KL:g} nats; train longer)"


def _tol(runs: Sequence[RunData], key: str = "eval/gold_reward", floor: float = 0.05) -> float:
    """What counts as a real difference of smoothed values: twice the larger of the pooled seed spread and the
    evaluation noise of a 3-evaluation mean (√(2/3)·σ), at least `floor`."""
    spreads = []
    for members in groups(runs).values():
        _, s, n = mean_spread([r.slast(key) for r in members])
        if n > 1:
            spreads.append(s)
    noise = [x for x in (r.noise(key) for r in runs) if math.isfinite(x)]
    seed_sd = float(np.mean(spreads)) if spreads else 0.0
    eval_sd = float(np.median(noise)) * math.sqrt(2 / 3) if noise else 0.0
    return max(floor, 2 * seed_sd, 2 * eval_sd)


def _by_margin(measured: str, tol: float, supports: Sequence[float], contradicts: Sequence[float]) -> tuple[str, str]:
    """The three-way verdict of a comparison: HOLDS when a difference in the claim's favour exceeds `tol`, else
    FAILS when one against it does, else INCONCL (a NaN difference counts for neither side)."""
    if any(x > tol for x in supports):
        return HOLDS, measured
    if any(x > tol for x in contradicts):
        return FAILS, measured
    return INCONCL, measured


def _fixed(runs):
    return [r for r in runs if r.stage == "ppo" and r.value("kl.name") == "fixed" and math.isfinite(r.fnum("kl.beta"))]


def _mean(rs, f):
    return mean_spread([f(r) for r in rs])[0]


def _spearman(x, y) -> float:
    from scipy.stats import spearmanr

    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = np.isfinite(x) & np.isfinite(y)
    if ok.sum() < 3 or np.ptp(x[ok]) == 0 or np.ptp(y[ok]) == 0:
        return float("nan")
    return float(spearmanr(x[ok], y[ok]).correlation)


def claim_c1(s):
    runs = s["ppo_beta_grid"]
    zero = [r for r in _fixed(runs) if r.fnum("kl.beta") == 0]
    if not zero:
        return NOT_RUN if not runs else INCONCL, "no finished β=0 run" if runs else ""
    tol = _tol(runs)
    pg = _mean(zero, lambda r: r.slast("eval/proxy_reward") - r.sfirst("eval/proxy_reward"))
    drop = _mean(zero, lambda r: r.speak("eval/gold_reward") - r.slast("eval/gold_reward"))
    gg = _mean(zero, lambda r: r.slast("eval/gold_reward") - r.sfirst("eval/gold_reward"))
    m = (f"β=0 ({len(zero)} runs), change over training: proxy {fmt(pg)}, gold {fmt(gg)} (gold drop from its peak "
         f"{fmt(drop)}); tolerance {fmt(tol)}")
    if not math.isfinite(pg):
        return INCONCL, m + " (no eval/proxy_reward)"
    if pg > tol and drop > tol:
        return HOLDS, m
    moved, why = _moved(zero)
    if pg > tol and drop <= tol / 2 and moved:
        return FAILS, m
    return INCONCL, m + why


def claim_c2(s):
    runs = s["ppo_beta_grid"]
    fixed = _fixed(runs)
    zero = [r for r in fixed if r.fnum("kl.beta") == 0]
    if not zero:
        return NOT_RUN if not runs else INCONCL, "no finished β=0 run" if runs else ""
    bmax = max(r.fnum("kl.beta") for r in fixed)
    big = [r for r in fixed if r.fnum("kl.beta") == bmax] if bmax > 0 else []

    def rel(rs, key):
        return _mean(rs, lambda r: (r.slast(key) - r.sfirst(key)) / abs(r.sfirst(key)) if r.sfirst(key) else float("nan"))

    e0, d0 = rel(zero, "eval/entropy"), rel(zero, "eval/distinct_2")
    eb, db = (rel(big, "eval/entropy"), rel(big, "eval/distinct_2")) if big else (float("nan"), float("nan"))
    m = f"β=0: entropy {fmt(100 * e0, 0)}%, distinct-2 {fmt(100 * d0, 0)}% over training"
    if big:
        m += f"; β={bmax:g}: entropy {fmt(100 * eb, 0)}%, distinct-2 {fmt(100 * db, 0)}%"
    if not (math.isfinite(e0) and math.isfinite(d0)):
        return INCONCL, m + " (no eval/entropy or eval/distinct_2)"
    if e0 < -0.2 and d0 < -0.2 and not (e0 >= eb - 0.05 or d0 >= db - 0.05):
        return HOLDS, m
    moved, why = _moved(zero)
    if e0 > -0.05 and d0 > -0.05 and moved:
        return FAILS, m
    return INCONCL, m + why


def claim_c4(s):
    runs = s["ppo_beta_grid"]
    fixed = _fixed(runs)
    betas = sorted({r.fnum("kl.beta") for r in fixed})
    if len(betas) < 3:
        return NOT_RUN if not runs else INCONCL, f"{len(betas)} fixed-β settings finished" if runs else ""
    tol = _tol(runs)
    final = {b: _mean([r for r in fixed if r.fnum("kl.beta") == b], lambda r: r.slast("eval/gold_reward")) for b in betas}
    gain = {b: _mean([r for r in fixed if r.fnum("kl.beta") == b],
                     lambda r: r.slast("eval/gold_reward") - r.sfirst("eval/gold_reward")) for b in betas}
    kl = {b: _mean([r for r in fixed if r.fnum("kl.beta") == b], lambda r: r.slast("eval/kl")) for b in betas}
    best = max(betas, key=lambda b: final[b])
    small_hacks = final[best] - final[betas[0]] > tol
    large_stalls = gain[betas[-1]] < tol and final[best] - final[betas[-1]] > tol
    m = ("final gold by β: " + ", ".join(f"{b:g}: {fmt(final[b])} (KL {fmt(kl[b], 1)})" for b in betas)
         + f"; best β={best:g}; KL unit: nats/response, β per token")
    if small_hacks and large_stalls and 0.01 <= best <= 0.1:
        return HOLDS, m
    moved, why = _moved([r for r in fixed if r.fnum("kl.beta") == betas[0]])
    if not moved:
        return INCONCL, m + why
    if best in (betas[0], betas[-1]) and final[best] - sorted(final.values())[-2] > tol:
        return FAILS, m + " (no interior optimum)"
    if small_hacks and large_stalls and not (0.003 <= best <= 0.3):
        return FAILS, m + " (optimum outside 0.01–0.1)"
    return INCONCL, m


def claim_c5(s):
    runs = [r for r in s["ppo_beta_grid"] if r.stage == "ppo" and r.value("kl.name") == "adaptive"]
    if not runs:
        return NOT_RUN if not s["ppo_beta_grid"] else INCONCL, "no finished adaptive-KL run" if s["ppo_beta_grid"] else ""
    targets = sorted({r.fnum("kl.target") for r in runs})
    ratio = {t: _mean([r for r in runs if r.fnum("kl.target") == t], lambda r: r.slast("eval/kl")) / t for t in targets}
    units = {r.value("kl.unit") for r in runs}
    m = "final eval/kl ÷ target: " + ", ".join(f"target {t:g}: {fmt(ratio[t], 2)}" for t in targets)
    if units - {"sequence", None}:
        return INCONCL, m + f" (kl.unit={units}: eval/kl is per sequence)"
    short = [r for r in runs if r.fnum("steps") * r.fnum("algo.batch_size") < r.fnum("kl.horizon")]
    if short:
        return INCONCL, m + (f" ({len(short)} runs saw fewer responses than the controller's horizon "
                             f"{short[0].fnum('kl.horizon'):g}: β could not adapt yet)")
    if all(0.5 <= x <= 2 for x in ratio.values()):
        return HOLDS, m
    if any(not (0.25 <= x <= 4) for x in ratio.values()):
        return FAILS, m
    return INCONCL, m


def claim_c9(s):
    ppo = _fixed(s["ppo_beta_grid"])
    dpo = [r for r in s["dpo_beta_grid"] if r.stage == "dpo"]
    if not dpo or not ppo:
        missing = [n for n, rs in (("ppo_beta_grid", ppo), ("dpo_beta_grid", dpo)) if not rs]
        if any(s.get("_n_finished", {}).get(n) for n in missing):
            return INCONCL, f"no finished runs with ≥ {MIN_EVALS} evaluations in " + " and ".join(missing)
        return NOT_RUN, "no finished runs of " + " and ".join(missing)
    rp = _spearman([r.fnum("kl.beta") for r in ppo], [r.slast("eval/kl") for r in ppo])
    rd = _spearman([r.fnum("algo.beta") for r in dpo], [r.slast("eval/kl") for r in dpo])
    fp = frontier([(kl, g) for r in ppo for (_, kl), (_, g) in kl_gold_pairs(r)])
    fd = frontier([(kl, g) for r in dpo for (_, kl), (_, g) in kl_gold_pairs(r)])
    bp, bd = (max(g for _, g in fp) if fp else float("nan")), (max(g for _, g in fd) if fd else float("nan"))
    m = (f"Spearman ρ(β, final KL): PPO {fmt(rp, 2)}, DPO {fmt(rd, 2)}; best frontier gold PPO {fmt(bp)}, "
         f"DPO {fmt(bd)}; final KL range PPO {fmt(min(r.slast('eval/kl') for r in ppo), 1)}–"
         f"{fmt(max(r.slast('eval/kl') for r in ppo), 1)}, DPO {fmt(min(r.slast('eval/kl') for r in dpo), 1)}–"
         f"{fmt(max(r.slast('eval/kl') for r in dpo), 1)}")
    if not (math.isfinite(rp) and math.isfinite(rd)):
        return INCONCL, m
    if abs(rp) >= 0.8 and abs(rd) < 0.6:
        return HOLDS, m
    if abs(rd) >= 0.8:
        return FAILS, m + " (DPO's β sets its KL monotonically too)"
    return INCONCL, m


def claim_c10(s):
    runs = s["ppo_beta_grid"]
    fixed = _fixed(runs)
    if not fixed:
        return NOT_RUN if not runs else INCONCL, "no finished fixed-β run" if runs else ""
    low = [r for r in fixed if r.fnum("kl.beta") == min(x.fnum("kl.beta") for x in fixed)]
    dl = _mean(low, lambda r: r.slast("eval/length") - r.sfirst("eval/length"))
    df = _mean(low, lambda r: r.slast("eval/filler_rate") - r.sfirst("eval/filler_rate"))
    rl = _mean(low, lambda r: float(r.rm.get("metrics", {}).get("rm/length_preference", float("nan"))))
    rf = _mean(low, lambda r: float(r.rm.get("metrics", {}).get("rm/filler_preference", float("nan"))))
    lb, fb = low[0].fnum("labeler.length_bonus", 0.0), low[0].fnum("labeler.filler_bonus", 0.0)
    m = (f"labeler length_bonus={lb:g}, filler_bonus={fb:g}; RM length/filler preference {fmt(rl)}/{fmt(rf)}; "
         f"PPO (β={low[0].fnum('kl.beta'):g}) length {fmt(dl, 1)} tokens, filler rate {fmt(df)} over training")
    learned = (math.isfinite(rl) and rl > 0) or (math.isfinite(rf) and rf > 0)
    exploited = (math.isfinite(dl) and dl > 2) or (math.isfinite(df) and df > 0.05)
    if lb <= 0 and fb <= 0:
        return INCONCL, m + " (unbiased labeler)"
    if learned and exploited:
        return HOLDS, m
    moved, why = _moved(low)
    if math.isfinite(dl) and math.isfinite(df) and dl <= 0 and df <= 0 and moved:
        return FAILS, m
    return INCONCL, m + why


def _size_cells(runs):
    ppo = [r for r in runs if r.stage == "ppo"]
    out = []
    for r in ppo:
        out.append((policy_size(r), r.rm_params(), r.n_params(), r))
    return out


def claim_c13(s):
    runs = s["rm_size_vs_policy_size"]
    cells = _size_cells(runs)
    if not cells:
        return NOT_RUN, ""
    tol = _tol(runs)
    rhos, largest_drops = [], []
    for ps in sorted({c[0] for c in cells}):
        cs = [c for c in cells if c[0] == ps]
        rm_n = [c[1] for c in cs]
        drops = [c[3].speak("eval/gold_reward") - c[3].slast("eval/gold_reward") for c in cs]
        rhos.append(_spearman(rm_n, drops))
        if any(math.isfinite(x) for x in rm_n):
            big = max(x for x in rm_n if math.isfinite(x))
            largest_drops.append(float(np.mean([d for x, d in zip(rm_n, drops) if x == big])))
    rho = float(np.nanmean(rhos)) if any(math.isfinite(x) for x in rhos) else float("nan")
    ld = float(np.mean(largest_drops)) if largest_drops else float("nan")
    drops_all = [c[3].speak("eval/gold_reward") - c[3].slast("eval/gold_reward") for c in cells]
    n_hacked = sum(d > tol for d in drops_all if math.isfinite(d))
    m = (f"mean over policy sizes of Spearman ρ(RM params, gold drop from peak) = {fmt(rho, 2)}; drop with the "
         f"largest RM {fmt(ld)}; {n_hacked} of {len(cells)} runs drop more than the tolerance {fmt(tol)}")
    if not math.isfinite(rho) or n_hacked < 2:  # too little hacking in the grid to say what RM size does to it
        return INCONCL, m
    if rho < -0.3 and ld > tol:
        return HOLDS, m
    if rho > 0.3 or (rho < -0.3 and ld <= tol / 2):
        return FAILS, m
    return INCONCL, m


def claim_c18(s):
    runs = s["rm_size_vs_policy_size"]
    cells = [c for c in _size_cells(runs) if math.isfinite(c[1]) and math.isfinite(c[2]) and c[2] > 0]
    if not _size_cells(runs):
        return NOT_RUN, ""
    small = [c[3] for c in cells if c[1] / c[2] < 0.1]
    ok = [c[3] for c in cells if c[1] / c[2] >= 0.1]
    if not small or not ok:
        return INCONCL, f"{len(small)} runs with RM < 1/10 of the policy, {len(ok)} with ≥ 1/10 (need both); ensembles not covered"
    tol = _tol(runs)
    ds, do = (_mean(small, lambda r: r.speak("eval/gold_reward") - r.slast("eval/gold_reward")),
              _mean(ok, lambda r: r.speak("eval/gold_reward") - r.slast("eval/gold_reward")))
    ps, po = _mean(small, lambda r: r.speak("eval/gold_reward")), _mean(ok, lambda r: r.speak("eval/gold_reward"))
    m = (f"RM < 1/10 of policy: drop {fmt(ds)}, peak gold {fmt(ps)} ({len(small)} runs); ≥ 1/10: drop {fmt(do)}, "
         f"peak {fmt(po)} ({len(ok)} runs); ensemble part not covered")
    return _by_margin(m, tol, supports=[ds - do, po - ps], contradicts=[do - ds, ps - po])


def _source(runs, src, frac0: bool):
    return [r for r in runs if r.stage == "ppo" and (r.value("reward_model.source") == src)
            and ((r.fnum("data.on_policy_fraction", 0.0) == 0) == frac0)]


def _final_and_drop(runs) -> tuple[float, float]:
    """Mean final gold reward of the runs, and mean drop of gold from its peak to the end."""
    return (_mean(runs, lambda r: r.slast("eval/gold_reward")),
            _mean(runs, lambda r: r.speak("eval/gold_reward") - r.slast("eval/gold_reward")))


def claim_c16(s):
    runs = s["rm_source"]
    same, diff = _source(runs, "same", True), _source(runs, "different", True)
    if not runs:
        return NOT_RUN, ""
    if not same or not diff:
        return INCONCL, f"{len(same)} same-source and {len(diff)} different-source runs finished (need both)"
    tol = _tol(runs)
    (gs, ds), (gd, dd) = _final_and_drop(same), _final_and_drop(diff)
    ss, sd = mean_spread([r.slast("eval/gold_reward") for r in same])[1], mean_spread([r.slast("eval/gold_reward") for r in diff])[1]
    m = (f"final gold same {fmt(gs)} (drop {fmt(ds)}, seed sd {fmt(ss)}) vs different {fmt(gd)} (drop {fmt(dd)}, "
         f"seed sd {fmt(sd)}); tolerance {fmt(tol)}")
    return _by_margin(m, tol, supports=[gs - gd, dd - ds], contradicts=[gd - gs, ds - dd])


def claim_c17(s):
    runs = s["rm_source"]
    base, mixed = _source(runs, "different", True), _source(runs, "different", False)
    if not runs:
        return NOT_RUN, ""
    if not base or not mixed:
        return INCONCL, f"{len(base)} different-source runs without and {len(mixed)} with on-policy mixing finished (need both)"
    tol = _tol(runs)
    (gb, db), (gm, dm) = _final_and_drop(base), _final_and_drop(mixed)
    fr = sorted({r.value("data.on_policy_fraction") for r in mixed})
    m = (f"different-source RM: final gold {fmt(gb)} (drop {fmt(db)}) without vs {fmt(gm)} (drop {fmt(dm)}) with "
         f"on-policy fraction {', '.join(map(str, fr))}; tolerance {fmt(tol)}")
    return _by_margin(m, tol, supports=[gm - gb, db - dm], contradicts=[gb - gm])


CLAIMS: list[tuple[str, str, str, Callable]] = [
    ("C1", "β=0 PPO reward-hacks: proxy rises while gold falls", "ppo_beta_grid", claim_c1),
    ("C2", "with no KL penalty the policy collapses to few modes", "ppo_beta_grid", claim_c2),
    ("C4", "β too small hacks, too large stalls; good β is 0.01–0.1", "ppo_beta_grid", claim_c4),
    ("C5", "adaptive KL keeps KL near its target", "ppo_beta_grid", claim_c5),
    ("C9", "DPO gives less fine-grained KL control than PPO", "ppo_beta_grid + dpo_beta_grid", claim_c9),
    ("C10", "the RM learns annotator biases and PPO exploits them", "ppo_beta_grid", claim_c10),
    ("C13", "a larger RM reduces but does not remove hacking", "rm_size_vs_policy_size", claim_c13),
    ("C16", "the RM need not share the base, but same-source is more stable", "rm_source", claim_c16),
    ("C17", "~20% on-policy samples fix a different-source RM", "rm_source", claim_c17),
    ("C18", "the RM should be ≥ 1/10 of the policy's size", "rm_size_vs_policy_size", claim_c18),
]
NOT_COVERED = {
    "C3": "reference sync interval sweep (algo.reference.sync_every)", "C6": "separate vs shared-base reference memory",
    "C7": "k1/k2/k3 estimators (algo.kl_estimator)", "C8": "reference of another size (algo.reference.path)",
    "C11": "length penalty α grid (algo.length_penalty)", "C12": "clip ε grid (algo.clip_eps)",
    "C15": "critic vs no-critic baseline (algo.critic)", "C19": "RM LoRA rank grid (reward_model.lora_rank)",
    "C20": "normalised vs raw RM output (reward_model.normalize)",
}


def evaluate_claims(uri: str | None = None, studies: dict[str, list[RunData]] | None = None) -> list[Verdict]:
    if studies is None:
        studies = {}
        for st in ("ppo_beta_grid", "dpo_beta_grid", "rm_size_vs_policy_size", "rm_source"):
            runs, _ = load_study(st, uri)
            studies[st] = [r for r in runs if r.status == "FINISHED"]
    out = []
    for cid, text, study, fn in CLAIMS:
        names = [x.strip() for x in study.split("+")]
        cmd = " && ".join(f"rlhf-lab -m sweep={n}" for n in names) + " && " + " && ".join(
            f"rlhf-lab-report {n}" for n in names)
        if all(not studies.get(n) for n in names):
            out.append(Verdict(cid, text, cmd, "no runs", NOT_RUN))
            continue
        present = [r for n in names for r in studies.get(n, [])]
        long_enough = {n: [r for r in studies.get(n, []) if len(r.series("eval/gold_reward")) >= MIN_EVALS]
                       for n in names}
        if not any(long_enough.values()):
            n_evals = sorted({len(r.series("eval/gold_reward")) for r in present})
            out.append(Verdict(cid, text, cmd, f"{len(present)} runs, too short to judge: {n_evals} evaluations "
                               f"(need ≥ {MIN_EVALS})", INCONCL))
            continue
        try:
            verdict, measured = fn({**studies, **long_enough, "_n_finished": {n: len(v) for n, v in studies.items()}})
        except Exception as err:  # a verdict that cannot be computed is not a verdict
            verdict, measured = INCONCL, f"could not compute: {type(err).__name__}: {err}"
        out.append(Verdict(cid, text, cmd, measured or "no runs", verdict))
    return out


def write_claims_report(out_dir: Path | str = "reports", uri: str | None = None,
                        studies: dict[str, list[RunData]] | None = None) -> Path:
    verdicts = evaluate_claims(uri, studies)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lines = ["# Claims of docs/claims.md put to the canned studies", "",
             "Computed by `rlhf-lab-report --claims` from the finished runs in "
             f"`{store_uri(uri)}`; a difference counts when it exceeds twice the seed spread (at least 0.05 "
             "gold, and twice the evaluation noise); peaks and final values are 3-evaluation running means, and runs "
             f"with fewer than {MIN_EVALS} evaluations are not counted. Verdicts hold for this world and these model "
             "sizes only.", "",
             md_table(["claim", "statement (seed)", "command that tests it", "measured", "verdict"],
                      [[v.claim, v.text, f"`{v.command}`", v.measured, f"**{v.verdict}**"] for v in verdicts]), "",
             "Testable claims without a canned study yet (run the sweep inline, e.g. `rlhf-lab -m algo=ppo "
             "algo.clip_eps=0.1,0.2,0.4`): " + "; ".join(f"{k}: {v}" for k, v in NOT_COVERED.items()) + ".", ""]
    path = out / "claims.md"
    path.write_text("\n".join(lines))
    return path
