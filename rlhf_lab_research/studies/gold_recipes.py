"""``reports/gold_recipes/README.md``: how large and how broad must a gold RM be to see the hacking the formula sees?

The study (sweeps/sweep/gold_recipes.yaml, issue 43) runs PPO with ``gold=rm_world`` under several gold recipes
(sweeps/gold_recipe/: the gold's pairs, their coverage, its members) at fixed β in {0, 0.1, 1}. Every evaluation scores
the same samples with the gold RM (``eval/gold_reward``) and the world's formula (``eval/formula_gold_reward``), so a
recipe is judged by what :mod:`~rlhf_lab_research.studies.gold_validation` measures, per recipe and β:

1. **rank agreement**, the primary effect stated before the runs: per run, Spearman ρ between the two over its
   evaluations; their mean on Fisher's z with the Student-t interval over seeds; the bar at β = 0: mean ≥ 0.8 with
   the lower end ≥ 0.5;
2. **claim C1** (β = 0 hacks: the proxy rises while gold falls from its peak) judged by the registry's effects with
   each measure as the gold, and whether the two verdicts agree;
3. **cost**: each gold's parameters, members and pairs, and the wall time of the runs that built it (its pairs, its
   RM, and the backbone every recipe shares), read from those runs (kept in the runs file beside the report).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

from rlhf_lab.analysis.markdown import fmt, md_table
from rlhf_lab.analysis.report_files import check_folder, no_runs
from rlhf_lab.analysis.study_runs import RunData, parse_overrides, run_data, store_exists, store_uri
from rlhf_lab.analysis.snapshot import read_snapshot
from rlhf_lab_research.studies.gold_validation import (
    BAR_LOW,
    BAR_MEAN,
    BAR_RUNS,
    FORMULA,
    HISTORY_KEYS,
    RM,
    as_measure,
    ci_cell,
    fisher_mean,
    meets_bar,
    paired_points,
    run_rho,
    verdicts,
)
from rlhf_lab.analysis.quantities import final_gold, gold_drop
from rlhf_lab.analysis.study_report import RUNS_FILE, gather_study_runs, read_from, report_flags, write_runs_file
from rlhf_lab_research.studies import not_run_page

STUDY = "gold_recipes"
COVER_STUDY = "gold_cover"  # the policies whose samples cover a gold's pairs (sweeps/gold_recipe/covers.yaml)
RECIPES = {  # the recipes in the order they add to base (sweeps/gold_recipe/<name>.yaml)
    "base": "8000 pairs of SFT samples (`gold=rm_world_sft`, the default before this study)",
    "degenerate": "base, a quarter of its pairs an SFT response against a degenerate variant of itself",
    "temperatures": "base, its SFT pairs sampled at 0.7, 1.0 and 1.3",
    "onpolicy": "degenerate, a quarter of its pairs two samples of a policy that hacked another proxy",
    "broad": "degenerate + temperatures on 40000 pairs (10x the proxy's)",
    "broad_ensemble": "broad with 3 members",
    "covers": "broad, a quarter of its pairs from six policies that hacked other proxies, each against an SFT sample",
    "adversarial": "covers, 40 % of its pairs from nine policies: its six and three that hacked proxies labelled by "
                   "covers' gold (today's `gold=rm_world`)",
}
UPSTREAM = ("rlhf_lab.upstream.prefs", "rlhf_lab.upstream.rm_backbone", "rlhf_lab.upstream.pretrain")
GOLD_TAG = "rlhf_lab.upstream.gold_rm"


def recipe(r: RunData) -> str:
    """The run's gold recipe: its swept value, else the ``+gold_recipe=`` of the overrides it was launched with (a
    sweep of one recipe does not sweep it)."""
    return str(r.value("gold_recipe") or parse_overrides(r.tags.get("rlhf_lab.overrides", "")).get("gold_recipe", "?"))


def beta(r: RunData) -> float:
    return r.fnum("kl.beta")


def cells(runs: Sequence[RunData]) -> dict[tuple[str, float], list[RunData]]:
    """{(recipe, β): its runs}, recipes in :data:`RECIPES`' order then any other, β ascending."""
    out: dict[tuple[str, float], list[RunData]] = {}
    order = {name: i for i, name in enumerate(RECIPES)}
    for r in sorted(runs, key=lambda r: (order.get(recipe(r), len(order)), recipe(r), beta(r), int(r.seed))):
        out.setdefault((recipe(r), beta(r)), []).append(r)
    return out


# -- the golds' runs (cost) ---------------------------------------------------------------------------------------


def gold_closure(ids: Sequence[str], fetch) -> list[RunData]:
    """The gold RM runs `ids` and the runs upstream of them that built only the gold (its pairs, its backbone's SFT
    and pretraining: tags :data:`UPSTREAM`), each once; `fetch(run_id)` -> RunData or None (a run not found)."""
    seen: dict[str, RunData] = {}
    todo = list(ids)
    while todo:
        rid = todo.pop()
        if rid in seen:
            continue
        r = fetch(rid)
        if r is None:
            continue
        seen[rid] = r
        todo += [r.tags[t] for t in UPSTREAM if r.tags.get(t)]
    return list(seen.values())


def store_golds(ppo: Sequence[RunData], uri: str | None) -> list[RunData]:
    """The gold RMs of the `ppo` runs and their upstream runs (:func:`gold_closure`) from the store."""
    from mlflow.tracking import MlflowClient

    uri = store_uri(uri)
    if not store_exists(uri):
        return []
    client = MlflowClient(tracking_uri=uri)

    def fetch(rid: str) -> RunData | None:
        try:
            return run_data(client.get_run(rid))
        except Exception:  # built against another store: not this store's cost
            return None

    return gold_closure(sorted({r.tags[GOLD_TAG] for r in ppo if r.tags.get(GOLD_TAG)}), fetch)


def file_golds(runs_files: Sequence[Path | str]) -> list[RunData]:
    """The study's runs other than its PPO runs kept in the runs files (the golds' runs, a later file's copy wins)."""
    out: dict[str, RunData] = {}
    for f in runs_files:
        out.update({r.run_id: r for r in read_snapshot(f)[0].get(STUDY, []) if r.stage != "ppo"})
    return list(out.values())


def wall_s(r: RunData | None) -> float:
    return (r.end_time - r.start_time) / 1000 if r is not None and r.end_time and r.start_time else float("nan")


def cost_rows(by_cell: dict, golds: Sequence[RunData]) -> tuple[list[list], float]:
    """([recipe, parameters, members, pairs, pairs build s, RM build s, gold RM held-out accuracy], the shared
    backbone's build s) for each recipe whose gold RM run is known."""
    by_id = {r.run_id: r for r in golds}
    rows, backbone = [], float("nan")
    for name in dict.fromkeys(rec for rec, _ in by_cell):
        ids = {r.tags.get(GOLD_TAG) for (rec, _), rs in by_cell.items() if rec == name for r in rs}
        g = next((by_id[i] for i in sorted(i for i in ids if i) if i in by_id), None)
        if g is None:
            rows.append([f"`{name}`", "–", "–", "–", "–", "–", "–"])
            continue
        sft = by_id.get(g.tags.get("rlhf_lab.upstream.rm_backbone", ""))
        pre = by_id.get(sft.tags.get("rlhf_lab.upstream.pretrain", "")) if sft is not None else None
        if not math.isfinite(backbone) and sft is not None and pre is not None:
            backbone = wall_s(sft) + wall_s(pre)
        members = int(float(g.params.get("reward_model.ensemble") or 1))
        params = g.metrics.get("model/params_total", float("nan"))
        rows.append([f"`{name}`", f"{params / 1e6:.2f}M" if math.isfinite(params) else "–", members,
                     g.params.get("data.n_train", "–"),
                     fmt(wall_s(by_id.get(g.tags.get("rlhf_lab.upstream.prefs", ""))), 0), fmt(wall_s(g), 0),
                     fmt(g.metrics.get("rm/accuracy", float("nan")), 3)])
    return rows, backbone


# -- the report -----------------------------------------------------------------------------------------------------


def rho_table(by_cell: dict) -> list[list]:
    betas = sorted({b for _, b in by_cell})
    rows = []
    for name in dict.fromkeys(rec for rec, _ in by_cell):
        seeds = sorted({int(r.seed) for (rec, _), rs in by_cell.items() if rec == name for r in rs})
        row = [f"`{name}`", RECIPES.get(name, ""), seed_range(seeds)]
        for b in betas:
            rs = by_cell.get((name, b), [])
            e = fisher_mean([run_rho(r) for r in rs])
            mark = " **meets the bar**" if b == 0 and meets_bar(e) else ""
            row.append(ci_cell(e) + mark if rs else "–")
        rows.append(row)
    return [["recipe", "the gold's pairs", "seeds", *(f"ρ at β = {b:g}" for b in betas)], rows]


def seed_range(seeds: Sequence[int]) -> str:
    """5, 6, 7, 8, 9 -> "5-9"; otherwise the seeds listed."""
    if seeds and list(seeds) == list(range(seeds[0], seeds[-1] + 1)) and len(seeds) > 2:
        return f"{seeds[0]}-{seeds[-1]}"
    return ", ".join(map(str, seeds))


def c1_rows(by_cell: dict) -> list[list]:
    rows = []
    for (name, b), rs in by_cell.items():
        if b != 0:
            continue
        res = verdicts(rs, ("C1",))["C1"]
        f, g = res[FORMULA], res[RM]
        drop = lambda p: (f"{fmt(p.measured.effect.estimate)} [{fmt(p.measured.effect.lo)}, "  # noqa: E731
                          f"{fmt(p.measured.effect.hi)}]" if p.measured.effect is not None else "–")
        rows.append([f"`{name}`", len(rs), f"**{f.verdict}**", drop(f.parts[1]), f"**{g.verdict}**",
                     drop(g.parts[1]), "yes" if f.verdict == g.verdict else "**no**"])
    return rows


def run_rows(by_cell: dict) -> list[list]:
    rows = []
    for (name, b), rs in by_cell.items():
        for r in rs:
            f, g = as_measure(r, FORMULA), as_measure(r, RM)
            rows.append([f"`{name}`", f"{b:g}", r.seed, len(paired_points(r)), fmt(run_rho(r), 2), fmt(final_gold(f)),
                         fmt(final_gold(g)), fmt(gold_drop(f)), fmt(gold_drop(g)),
                         fmt(r.last("eval/gold_rm_std_ratio"), 2), f"`{r.run_id}`"])
    return rows


def cover_gold(r: RunData) -> str:
    """What a cover policy was trained against: a proxy labelled by the formula or by a recipe's gold RM, or that gold
    RM itself (``algo.reward=gold``)."""
    if r.value("gold.source") != "rm":
        return ", a proxy labelled by the formula"
    if r.value("algo.reward") == "gold":
        return f", the `{recipe(r)}` gold RM itself"
    return f", a proxy labelled by the `{recipe(r)}` gold RM"


def write_gold_recipes_report(out_dir: Path | str = "reports", uri: str | None = None,
                              runs_files: Sequence[Path | str] = (), use_store: bool = True,
                              require_runs: bool = False) -> Path:
    """``<out_dir>/gold_recipes/README.md`` from the study's PPO runs and their golds' runs in the store and in
    `runs_files` (a run in both: the store's copy), or the files alone when not `use_store`. Read from a store, the
    runs it read (with the cover policies' runs, study ``gold_cover``) are kept beside the report in ``runs.json.gz``,
    so that a clone regenerates it with ``rlhf-lab-report gold_recipes --no-store --runs
    reports/gold_recipes/runs.json.gz``."""
    out = Path(out_dir) / STUDY
    check_folder(out)
    ppo, _, commands = gather_study_runs(STUDY, uri, runs_files, use_store, stages=("ppo",), history_keys=HISTORY_KEYS)
    covers, _, cover_cmds = gather_study_runs(COVER_STUDY, uri, runs_files, use_store, stages=("ppo",))
    golds = {r.run_id: r for r in file_golds(runs_files)}
    if use_store:
        golds.update({r.run_id: r for r in store_golds(ppo, uri)})
    places = read_from(uri, runs_files, use_store)
    if require_runs and not ppo:
        raise no_runs(STUDY, " and ".join(places))
    path = write_report(ppo, list(golds.values()), covers, commands, out,
                        source=" and ".join(f"`{p}`" for p in places), flags=report_flags(runs_files, use_store))
    if use_store and ppo:  # the evidence travels with the report
        write_runs_file(out / RUNS_FILE, STUDY, [*ppo, *golds.values()], commands)
        if covers:
            write_runs_file(out / RUNS_FILE, COVER_STUDY, covers, cover_cmds)
    return path


def write_report(ppo_all: Sequence[RunData], golds: Sequence[RunData], covers: Sequence[RunData],
                 commands: Sequence[str], out: Path, source: str, flags: str = "") -> Path:
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"# Study `{STUDY}`: how large and how broad must a gold RM be?", "",
             "PPO with `gold=rm_world` under each gold recipe (sweeps/gold_recipe/), at fixed β: every evaluation "
             "scores the same samples with the gold RM (`eval/gold_reward`, its normalised score) and with the "
             "world's formula (`eval/formula_gold_reward`, gold units). A gold RM is good for a Gao-style study when "
             "it ranks a run's evaluations as the formula does, above all at β = 0, where the policy hacks. Held "
             "fixed: the policy (a_small) and its SFT run, the gold's backbone (a_medium), its pairs' data seed (1), "
             "the proxy's length-biased labels, PPO's settings (80 steps, an evaluation every 10); one proxy RM per "
             "seed; the seeds (5-9) are not the pilot's (0-2), which shaped the recipes.", "",
             f"Reproduce (a recipe's cover policies are built with its gold, stage `cover`; then "
             f"`rlhf-lab-report {STUDY}`):", "", "```bash",
             *(commands or [f"rlhf-lab -m sweep={STUDY} hydra/launcher=parallel skip_finished=true"]), "```", ""]
    ppo = [r for r in ppo_all if r.status == "FINISHED"]
    if not ppo:
        return not_run_page(out, lines, f"no finished PPO runs with tag `rlhf_lab.study={STUDY}`", source)
    by_cell = cells(ppo)
    other = [r for r in ppo_all if r.status != "FINISHED"]
    lines += [f"{len(ppo)} finished PPO runs" + (f", {len(other)} not finished" if other else "")
              + f"; seeds {', '.join(sorted({r.seed for r in ppo}, key=int))}.", ""]
    head, rows = rho_table(by_cell)
    at0 = {name: fisher_mean([run_rho(r) for r in rs]) for (name, b), rs in by_cell.items() if b == 0}
    met = [name for name, e in at0.items() if meets_bar(e)]
    lines += ["## Rank agreement by recipe (the primary effect)", "",
              "Per run, Spearman ρ between the formula and the gold RM over its evaluations; the mean over seeds on "
              f"Fisher's z with its Student-t interval. The bar, stated before the runs: at β = 0 a mean ≥ "
              f"{BAR_MEAN} "
              f"with the lower end ≥ {BAR_LOW}, over ≥ {BAR_RUNS} finished runs. A run that diverged (PPO's guard "
              "stopped it; it has no ρ) was replaced by the recipe's next unused seed. A run whose ρ is exactly ±1 "
              "enters at the cap |ρ| ≤ 0.999999 (z ≈ 7.25), which widens an interval near 1.", "",
              md_table(head, rows), "",
              ("Recipes that meet the bar: " + ", ".join(f"`{m}`" for m in met) + "." if met else
               "**No recipe meets the bar**: with these golds, gold-RM mode does not yet detect hacking at β = 0 "
               "on this world."), ""]
    c1 = c1_rows(by_cell)
    if c1:
        lines += ["## C1 judged with each gold", "",
                  "Claim C1 (with no KL penalty PPO hacks: the proxy rises while gold falls from its peak) on each "
                  "recipe's β = 0 runs, by the claims registry's effects and verdict rule, once with the formula and "
                  "once with the gold RM as the gold; the drop is the split-half drop from the peak (formula: gold "
                  "units; gold RM: its normalised score, about twice the formula's spread on SFT samples).", "",
                  md_table(["recipe", "runs", "C1 with the formula", "drop, formula [95% CI]", "C1 with the gold RM",
                            "drop, gold RM [95% CI]", "agree"], c1), ""]
    rows, backbone = cost_rows(by_cell, golds)
    lines += ["## Cost of each gold", "",
              "Read from the runs that built each gold: its parameters (per member), members, pairs, and the wall "
              "time of its pairs and of its RM training on this machine's 2 cores, which it shared with other jobs "
              "of the study (upper bounds)." + (f" The backbone every recipe shares (a_medium: pretraining and SFT) "
                                                 f"took {fmt(backbone, 0)} s." if math.isfinite(backbone) else ""), "",
              md_table(["recipe", "parameters", "members", "pairs", "pairs, s", "RM, s",
                        "held-out pair accuracy"], rows), ""]
    if covers:
        cov = [r for r in covers if r.status == "FINISHED"]
        lines += [f"The cover policies (study `{COVER_STUDY}`; seed, β, steps, what they were trained against): "
                  + "; ".join(f"{r.seed}, β = {r.fnum('kl.beta'):g}, {int(r.fnum('algo.steps'))} steps"
                              + cover_gold(r) + f", {fmt(wall_s(r), 0)} s"
                              for r in sorted(cov, key=lambda r: int(r.seed))) + ".", ""]
    lines += ["## Per run", "",
              "Final: `test/*gold_reward` of each measure where logged, else its last evaluation; drop: the "
              "split-half drop from the peak, as C1 measures it; std ratio: the gold members' disagreement at the "
              "last evaluation over its held-out level (ensembles only).", "",
              md_table(["recipe", "β", "seed", "points", "ρ", "final formula", "final gold RM", "drop formula",
                        "drop gold RM", "std ratio", "run"], run_rows(by_cell)), ""]
    lines += ["## Runs", "", md_table(["run", "recipe", "β", "seed", "status"],
                                      [[f"`{r.run_id}`", f"`{recipe(r)}`", f"{beta(r):g}", r.seed, r.status]
                                       for r in ppo_all]), "",
              f"Runs read from {source}; generated by `rlhf-lab-report {STUDY}{flags}`.", ""]
    (out / "README.md").write_text("\n".join(lines))
    return out / "README.md"
