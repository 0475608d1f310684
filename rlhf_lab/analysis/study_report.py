"""``reports/<study>/README.md``: the study report of one canned study, from its runs in MLflow.

Figures (gold and proxy reward gain against √KL with the per-run Gao et al. fits, the gold reward–KL
frontier; with several algorithms on enough seeds also the seed-split selection, the comparison at matched KL and
the confounds not removed: :mod:`rlhf_lab.analysis.frontier_matched`), a table per setting (mean ± standard deviation over seeds), the RM size × policy size and the
same- vs different-source tables when the study varies them, the run and checkpoint to ship by the jobs' ship rule
(:mod:`rlhf_lab.analysis.ship_section`), the runs that did not finish, and the command
that reproduces the study. Only FINISHED runs enter figures and tables; a study without runs gets a
"Not run yet" page. The metrics are described in docs/metrics.md.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import numpy as np

from rlhf_lab.analysis.fits import MIN_FIT_POINTS, GaoFit, frontier
from rlhf_lab.analysis.frontier_matched import confound_note, matched_sections
from rlhf_lab.analysis.markdown import fmt, fmt_ci, fmt_ms, md_table
from rlhf_lab.analysis.plots import plot_frontier, plot_reward_vs_sqrt_kl
from rlhf_lab.analysis.quantities import HALF_A, HALF_B, final_gold, final_gold_source, gold_drop
from rlhf_lab.analysis.report_files import check_folder, inside, no_runs
from rlhf_lab.analysis.ship_section import ship_section
from rlhf_lab.analysis.study_runs import (
    HISTORY_KEYS,
    POLICY_STAGES,
    STUDY_TAG,
    RunData,
    groups,
    kl_gold_pairs,
    label,
    load_study,
    natural_key,
    policy_size,
    rm_size,
    store_uri,
)
from rlhf_lab.analysis.snapshot import portable_command


# the histories a study report reads: the plotted curves and the two halves of the eval prompts (split-half drop);
# and kept in its runs file for the ship rule (its section) and the research reports, the training batches' proxy
# reward (objective/scores)
STUDY_HISTORY_KEYS = (*HISTORY_KEYS, HALF_A, HALF_B, "objective/scores")


def run_summary(r: RunData) -> dict[str, Any]:
    fit = r.gao_fit()
    return {
        "gold_start": r.first("eval/gold_reward"), "gold_final": final_gold(r),
        "gold_peak": r.peak("eval/gold_reward"), "gold_drop": gold_drop(r),
        "proxy_start": r.first("eval/proxy_reward"), "proxy_final": r.last("eval/proxy_reward"),
        "kl_final": r.last("eval/kl"), "fit": fit, "rm_accuracy": r.rm_accuracy(),
    }


def _too_few(fits: Sequence[GaoFit]) -> str:
    return f"too few points ({', '.join(str(f.n) for f in fits)})"


def fit_cell(fits: Sequence[GaoFit], attr: str) -> str:
    """mean ± sd of a fit parameter over the runs with a fit, or why there is none."""
    ok = [f for f in fits if f.ok]
    if not ok:
        return _too_few(fits)
    cell = fmt_ms([getattr(f, attr) for f in ok])
    return cell + (f" ({len(ok)} of {len(fits)} runs)" if len(ok) < len(fits) else "")


_PEAK_NOTES = {"peak beyond the data": "beyond the data", "peak before the data": "before the data",
               "no peak": "no peak (still rising)"}


def peak_cell(fits: Sequence[GaoFit]) -> str:
    """d* where it lies inside the fitted runs' √KL range; otherwise where it lies, not a number posing as a peak."""
    ok = [f for f in fits if f.ok]
    if not ok:
        return _too_few(fits)
    inside = [f.d_star for f in ok if f.peak_in_data]
    parts = [fmt_ms(inside)] if inside else []
    for status, note in _PEAK_NOTES.items():
        members = [f for f in ok if f.status == status]
        if not members:
            continue
        if status == "peak beyond the data":
            note += f" (√KL ≤ {fmt(max(f.d_hi for f in members), 2)})"
        parts.append(note if len(members) == len(ok) else f"{len(members)} of {len(ok)}: {note}")
    if len(ok) < len(fits):
        parts.append(f"{len(fits) - len(ok)} runs: {_too_few([f for f in fits if not f.ok])}")
    return "; ".join(parts)


def training_samples(r: RunData) -> float:
    """Policy samples a run generated while training: steps × ``algo.batch_size`` (responses per step) for ppo,
    grpo and rloo; for online DPO two responses per prompt, ``algo.online_prompts`` every ``algo.online_every``
    steps; 0 for offline DPO (it trains on the preference pairs the RM also learned from); NaN for best-of-n, which
    trains nothing (its ``algo.n_max`` samples per prompt are drawn at evaluation)."""
    steps = r.fnum("steps")
    if r.stage in ("ppo", "grpo", "rloo"):
        return steps * r.fnum("algo.batch_size")
    if r.stage == "dpo":
        if str(r.value("algo.online", "False")).lower() != "true":
            return 0.0
        return 2 * r.fnum("algo.online_prompts") * math.ceil(steps / r.fnum("algo.online_every"))
    return float("nan")


def train_time(r: RunData) -> float:
    """The run's ``time/train_s`` (its whole fit, evaluations included), NaN when it logged none."""
    return float(r.metrics.get("time/train_s", float("nan")))


def setting_table(runs: Sequence[RunData], columns: Sequence[str] | None = None) -> str:
    """The study report's table of its settings (one row per setting: mean ± sd over seeds, final gold and the drop
    from the peak as mean [95% t interval], the fits' parameters), a markdown table; `columns` (headers) keeps only
    those, as the sweep parent run's description does (:mod:`rlhf_lab.analysis.parent_run`)."""
    rows = []
    for name, members in groups(runs).items():
        s = [run_summary(r) for r in members]
        col = lambda k: fmt_ms([x[k] for x in s])  # noqa: E731
        ci = lambda k: fmt_ci([x[k] for x in s])  # noqa: E731
        fs = [x["fit"] for x in s]
        rows.append([f"`{name}`", members[0].stage, len(members), col("gold_start"), ci("gold_final"),
                     col("gold_peak"), ci("gold_drop"), col("proxy_start"), col("proxy_final"), col("kl_final"),
                     fit_cell(fs, "alpha"), fit_cell(fs, "beta"), peak_cell(fs), col("rm_accuracy"),
                     fit_cell(fs, "r2"), fmt_ms([f.n for f in fs], 0)])
    head = ["setting", "algo", "seeds", "gold start", "gold final", "gold peak", "drop from peak", "proxy start",
            "proxy final", "KL final", "α", "β", "d* (√KL)", "RM accuracy", "fit R²", "fit points"]
    keep = [i for i, h in enumerate(head) if columns is None or h in columns]
    return md_table([head[i] for i in keep], [[row[i] for i in keep] for row in rows])


def frontier_tables(runs: Sequence[RunData]) -> list[str]:
    """The frontier table per algorithm: best gold on its gold–KL frontier over every evaluation of its runs; with
    several algorithms also each one's budget (policy samples generated in training, training wall time) and the
    same frontier at equal wall time: only the evaluations reached within the shortest median training time among
    the algorithms that train (an evaluation at step s of a run of S steps counts as reached at s/S of its
    ``time/train_s``)."""
    by_algo = {a: [r for r in runs if r.stage == a] for a in POLICY_STAGES}
    by_algo = {a: rs for a, rs in by_algo.items() if rs}
    several = len(by_algo) > 1
    train_s = {a: float(np.median([train_time(r) for r in rs])) for a, rs in by_algo.items()}
    budget = min((t for a, t in train_s.items() if a != "bon" and math.isfinite(t)), default=float("nan"))
    rows, timed = [], []
    for algo, rs in by_algo.items():
        pairs = [(r, s, kl, g) for r in rs for (s, kl), (_, g) in kl_gold_pairs(r)]
        f = frontier([(kl, g) for _, _, kl, g in pairs])
        if not f:
            continue
        best = max(f, key=lambda p: p[1])
        row = [algo, len(rs), fmt(best[1]), fmt(best[0], 2), len(f)]
        if several:
            samples = [training_samples(r) for r in rs]
            row[2:2] = [fmt(float(np.mean(samples)), 0) if all(map(math.isfinite, samples)) else "– (none)",
                        fmt(train_s[algo], 0)]
            if algo != "bon" and math.isfinite(budget):
                early = frontier([(kl, g) for r, s, kl, g in pairs
                                  if s / max(r.fnum("steps"), 1) * train_time(r) <= budget + 1e-9])
                if early:
                    b = max(early, key=lambda p: p[1])
                    timed.append([algo, len(rs), fmt(b[1]), fmt(b[0], 2), len(early)])
        rows.append(row)
    if not rows:
        return []
    head = ["algo", "runs", "best gold on frontier", "at KL", "frontier points"]
    if not several:
        return [md_table(head, rows), ""]
    out = ["**Best gold on frontier** is the highest eval-split gold among the frontier's points: chosen and measured on "
           "the same noisy evaluations, so it is optimistic (a maximum over many points); the table after it chooses "
           "on eval and measures on test.", ""]
    out += ["**Budget.** Policy samples generated in training per run (mean): steps × responses per step for PPO, GRPO "
           "and RLOO; offline DPO samples none (it trains on the preference pairs the RM learned from); best-of-n "
           "trains nothing. Training time: the median `time/train_s` (evaluations included).", "",
           md_table(head[:2] + ["samples in training", "training time (s)"] + head[2:], rows), ""]
    if timed:
        out += [f"**At equal wall time** ({fmt(budget, 0)} s, the shortest median training time; best-of-n left out): "
                "the frontier of the evaluations each algorithm had reached by then.", "",
                md_table(head, timed), ""]
    return out + best_setting_table(by_algo) + matched_sections(by_algo)


def best_setting_table(by_algo: dict[str, Sequence[RunData]]) -> list[str]:
    """Each algorithm's best setting chosen on the eval split (:func:`best_setting`: highest mean final
    ``eval/gold_reward`` over seeds) and reported on the held-out test split (``test/gold_reward``, mean [95% t
    interval] over its seeds): what a user rerunning that setting can expect, free of the selection on one sample."""
    rows = []
    for algo, rs in by_algo.items():
        best = best_setting(rs)
        if best is None:
            continue
        members = [r for r in groups(rs)[best.setting] if r.status == "FINISHED"]
        rows.append([algo, f"`{best.setting}`", best.n, fmt(best.eval_gold),
                     fmt_ci(final_gold(r) for r in members) + ("" if best.split == "test" else f" ({best.split})"),
                     fmt_ci(r.last("eval/kl") for r in members)])
    if not rows:
        return []
    return ["**Best setting per algorithm, chosen on eval and reported on test**: the setting whose runs end with the "
            "highest mean eval-split gold; its test-split gold (held-out prompts, once at the end of each run) as mean "
            "[95% t interval] over its seeds, and its final KL.", "",
            md_table(["algo", "best setting (on eval)", "runs", "eval gold (chose it)", "test gold", "KL final"], rows),
            ""]


def data_note(runs: Sequence[RunData]) -> str:
    """Where "gold final" and "drop from peak" come from, counted over the report's runs."""
    test = sum(final_gold_source(r) == "test" for r in runs)
    halves = sum(math.isfinite(gold_drop(r)) for r in runs)
    rest = f" and the last `eval/gold_reward` for the {len(runs) - test} that logged no test split" if test < len(runs) else ""
    return (f"**Gold final** is `test/gold_reward` (the held-out test split, once at the end) for {test} of {len(runs)} "
            f"runs{rest}. **Drop from "
            f"peak** is the split-half estimate (the peak chosen on one half of the eval prompts, `eval/gold_reward_a`, "
            f"measured on the other, `_b`, both ways averaged; max − last of one noisy curve is biased upward) for the "
            f"{halves} runs that logged both halves, – for the others. Gold start and peak are single evaluations on "
            f"the eval prompts.")


def reproduce_commands(study: str, parents: Sequence[Any]) -> list[str]:
    cmds = sorted({portable_command(p.data.tags["rlhf_lab.command"]) for p in parents
                   if p.data.tags.get("rlhf_lab.command")})
    return cmds or [f"rlhf-lab -m sweep={study}"]


class BestSetting(NamedTuple):
    """The sweep's best setting: chosen on the eval split, reported on the test split as the report's gold final."""

    setting: str
    eval_gold: float  # mean final `eval/gold_reward` of its finished runs: what chose it (selection never sees test)
    gold: float  # mean "gold final" of those runs (:func:`rlhf_lab.analysis.quantities.final_gold`), as the report
    split: str  # where `gold` comes from: "test", "last eval" (no run logged test), or "test or last eval"
    n: int  # its finished runs


def best_setting(runs: Sequence[RunData]) -> BestSetting | None:
    """The setting whose FINISHED runs end with the highest mean final ``eval/gold_reward`` (selection on eval
    prompts, never test), with its mean gold final (``test/gold_reward``, as the report gives it); None when no
    finished run logged eval gold."""
    best = None
    for name, members in groups([r for r in runs if r.status == "FINISHED"]).items():
        scored = [r for r in members if math.isfinite(r.last("eval/gold_reward"))]
        if not scored:
            continue
        eval_gold = sum(r.last("eval/gold_reward") for r in scored) / len(scored)
        if best is None or eval_gold > best.eval_gold:
            sources = sorted({final_gold_source(r) for r in scored}, reverse=True)
            best = BestSetting(name, eval_gold, sum(final_gold(r) for r in scored) / len(scored), " or ".join(sources),
                               len(scored))
    return best


def study_runs_from_files(study: str, runs_files: Sequence[Path | str]) -> tuple[list[RunData], list[str]]:
    """(the policy runs of `study`, its sweep commands) kept in runs files (:mod:`~rlhf_lab.analysis.snapshot`): the
    runs tagged ``rlhf_lab.study = study`` under any key, each once (a later file's copy wins), in the order kept."""
    from rlhf_lab.analysis.snapshot import commands_of, read_snapshot

    runs: dict[str, RunData] = {}
    cmds: set[str] = set()
    for f in runs_files:
        studies, commands = read_snapshot(f)
        for key, rs in studies.items():
            mine = [r for r in rs if r.tags.get(STUDY_TAG) == study and r.stage in POLICY_STAGES]
            runs.update({r.run_id: r for r in mine})
            if mine:  # the commands of this study's sweeps (a key's file entry holds every design's)
                cmds |= set(commands_of(commands.get(key, []), [study]))
    return list(runs.values()), sorted(cmds)


def gather_study_runs(study: str | None, uri: str | None, runs_files: Sequence[Path | str] = (),
                      use_store: bool = True, parent: str | None = None, stages: Sequence[str] = POLICY_STAGES,
                      history_keys: Sequence[str] = STUDY_HISTORY_KEYS) -> tuple[list[RunData], list, list[str]]:
    """(the study's runs of `stages`, its sweep parents, the commands that reproduce it) from the store
    (:func:`load_study`, unless not `use_store`) and `runs_files` (:func:`study_runs_from_files`; a run in both: the
    store's copy); of a job run twice, its newer FINISHED run (:func:`~rlhf_lab.analysis.snapshot.newest_per_job`)."""
    from rlhf_lab.analysis.snapshot import newest_per_job

    runs_all, parents = (load_study(study, uri, parent=parent, stages=stages, history_keys=history_keys)
                         if use_store else ([], []))
    commands = reproduce_commands(study or "<study>", parents) if parents else []
    if runs_files and study:
        kept, kept_cmds = study_runs_from_files(study, runs_files)
        ids = {r.run_id for r in runs_all}
        runs_all = [*(r for r in kept if r.run_id not in ids and r.stage in stages), *runs_all]
        commands = sorted(set(commands) | set(kept_cmds))
    return newest_per_job(runs_all, lambda r: r.status == "FINISHED"), parents, commands


def read_from(uri: str | None, runs_files: Sequence[Path | str], use_store: bool) -> list[str]:
    """Where a report read its runs: the store (unless not `use_store`), then the runs files."""
    return ([store_uri(uri)] if use_store else []) + [str(f) for f in runs_files]


def runs_table(runs: Sequence[RunData]) -> str:
    """A study report's ``## Runs`` table: every run read, in the given order (run id, algorithm, setting, seed,
    status)."""
    return md_table(["run", "algo", "setting", "seed", "status"],
                    [[f"`{r.run_id}`", r.stage, f"`{label(r)}`", r.seed, r.status] for r in runs])


def report_flags(runs_files: Sequence[Path | str], use_store: bool) -> str:
    """What ``rlhf-lab-report`` was given besides the study, for a report's last line."""
    return ("" if use_store else " --no-store") + "".join(f" --runs {f}" for f in runs_files)


def write_study_report(study: str | None, out_dir: Path | str = "reports", uri: str | None = None,
                       parent: str | None = None, runs_files: Sequence[Path | str] = (),
                       use_store: bool = True, require_runs: bool = False) -> Path:
    """``<out_dir>/<study>/README.md`` and its PNGs from the study's runs in the store (:func:`load_study`) and in
    `runs_files` (:func:`study_runs_from_files`; a run in both: the store's copy), or the files alone when not
    `use_store`; with `parent` from that sweep's runs only (``<out_dir>/<study or "sweep">/``). With
    `require_runs`, a study without runs raises :class:`~rlhf_lab.analysis.report_files.ReportError` naming where
    it looked (nothing is written)."""
    out = inside(out_dir, Path(out_dir) / (study or "sweep"))
    check_folder(out)
    runs_all, parents, commands = gather_study_runs(study, uri, runs_files, use_store, parent=parent)
    places = read_from(uri, runs_files, use_store)
    if require_runs and not runs_all:
        raise no_runs(study, " and ".join(places))
    path = write_report(study, runs_all, parents, out, uri, parent, commands=commands or None,
                        source=" and ".join(f"`{p}`" for p in places) if runs_files else None,
                        flags=report_flags(runs_files, use_store))
    if use_store and study and parent is None and runs_all:  # the evidence travels with the report
        write_runs_file(out / RUNS_FILE, study, runs_all, commands)
    return path


RUNS_FILE = "runs.json.gz"  # beside a study report written from a store: the runs it read (snapshot's format)


def write_runs_file(path: Path, study: str, runs: Sequence[RunData], commands: Sequence[str]) -> None:
    """The runs a study report read from a store, in a checksummed runs file beside it (:mod:`snapshot`), so that a
    clone regenerates the report with ``rlhf-lab-report STUDY --no-store --runs <out>/<study>/runs.json.gz``.
    Runs and commands already kept in such a file (an earlier report's, another study's written beside it, or the
    claims' file when passed with ``--runs``) stay."""
    from rlhf_lab.analysis.report_files import check_file
    from rlhf_lab.analysis.snapshot import merge, read_snapshot, write_snapshot

    check_file(path)
    old = read_snapshot(path) if path.is_file() else ({}, {})
    kept = merge(old[0], {study: list(runs)})
    write_snapshot(path, kept, {**old[1], study: sorted(set(old[1].get(study, [])) | set(commands))})


def write_report(study: str | None, runs_all: Sequence[RunData], parents: Sequence[Any], out: Path,
                 uri: str | None = None, parent: str | None = None, commands: Sequence[str] | None = None,
                 source: str | None = None, flags: str = "") -> Path:
    """The study report of `runs_all` (all statuses) in folder `out`: README.md and the PNGs it shows (a folder
    holding files rlhf-lab-report did not write is refused: :func:`~rlhf_lab.analysis.report_files.check_folder`).
    `commands` (else those of the sweep `parents`) reproduce it; `source` names where the runs were read (else the
    store), `flags` what the last line says ``rlhf-lab-report`` was given besides the study."""
    check_folder(out)
    out.mkdir(parents=True, exist_ok=True)
    runs = [r for r in runs_all if r.status == "FINISHED"]
    other = [r for r in runs_all if r.status != "FINISHED"]
    cmds = list(commands) if commands else reproduce_commands(study or "<study>", parents)
    source = source or f"`{store_uri(uri)}`"
    lines = [f"# Study `{study}`" if study else "# Sweep", ""]
    if parent:
        lines += [f"The jobs of the sweep whose parent MLflow run is `{parent}`"
                  + (f"; `rlhf-lab-report {study}` reports every run of the study." if study else "."), ""]
    lines += ["Reproduce" + (f" (then `rlhf-lab-report {study}`)" if study else "") + ":", "", "```bash",
              *cmds, "```", ""]
    if not runs_all:
        where = f"tag `rlhf_lab.study={study}`" if study else ""
        where += (" and " if where else "") + (f"parent run `{parent}`" if parent else "")
        lines += [f"**Not run yet**: no runs with {where} in {source}.", ""]
        (out / "README.md").write_text("\n".join(lines))
        return out / "README.md"
    seeds = sorted({r.seed for r in runs}, key=natural_key)
    lines += [f"{len(runs)} finished runs ({', '.join(sorted({r.stage for r in runs}))})"
              + (f", {len(other)} not finished ({', '.join(sorted({r.status for r in other}))})" if other else "")
              + f"; seeds {', '.join(seeds)}" + (" — figures are mean ± standard deviation over seeds; final gold "
                                                 "and the drop from the peak also as mean [95% t interval]."
                                                 if len(seeds) > 1 else "."), "", data_note(runs), ""]
    lines += confound_note({a: rs for a in POLICY_STAGES if (rs := [r for r in runs if r.stage == a])})
    for r in other:
        lines.append(f"- {r.status}: `{label(r)}` seed {r.seed} ({r.run_id})"
                     + (f": {r.tags['rlhf_lab.error'][:200]}" if r.tags.get("rlhf_lab.error") else ""))
    if other:
        lines.append("")

    if runs:
        plot_reward_vs_sqrt_kl(runs, out / "gold_vs_sqrt_kl.png")
        lines += ["## Gold and proxy reward against √KL", "",
                  "Gain over each run's first evaluation against d = √KL (`eval/kl`, nats per response). Fit per run "
                  "(Gao et al. 2022): RL R(d) = d(α − β log d), peak d* = exp(α/β − 1); best-of-n R(d) = d(α − β d), "
                  f"d* = α/(2β). A run is fitted only with at least {MIN_FIT_POINTS} evaluations at d > 0 (otherwise "
                  "\"too few points (n)\"). R² is 1 − SS_res/SS_tot of the fitted gold gain over the fitted points. "
                  "d* is printed only where it lies inside the run's range of √KL; a peak outside it is an "
                  "extrapolation and is named as such (β ≤ 0: no peak, still rising).", "",
                  "![gold and proxy vs sqrt KL](gold_vs_sqrt_kl.png)", ""]
        lines += [setting_table(runs), ""]

    if any(r.stage in POLICY_STAGES for r in runs):
        plot_frontier(runs, out / "frontier.png")
        lines += ["## Gold reward – KL frontier", "", "![frontier](frontier.png)", ""]
        lines += frontier_tables([r for r in runs if r.stage in POLICY_STAGES])

    ppo = [r for r in runs if r.stage == "ppo"]
    if ppo and (len({rm_size(r) for r in ppo}) > 1 or len({policy_size(r) for r in ppo}) > 1):
        rows = []
        cells: dict[tuple[str, str], list[RunData]] = {}
        for r in ppo:
            cells.setdefault((policy_size(r), rm_size(r)), []).append(r)
        for (ps, rs_), members in sorted(cells.items()):
            s = [run_summary(r) for r in members]
            pol_n = [r.n_params() for r in members]
            rm_n = [r.rm_params() for r in members]
            ratio = [b / a for a, b in zip(pol_n, rm_n) if math.isfinite(a) and math.isfinite(b) and a > 0]
            rows.append([ps, rs_, len(members), fmt_ms([x["gold_peak"] for x in s]), fmt_ci([x["gold_final"] for x in s]),
                         fmt_ci([x["gold_drop"] for x in s]), fmt_ms([x["rm_accuracy"] for x in s]),
                         fmt_ms(ratio, 2)])
        lines += ["## RM size × policy size", "",
                  "Peak and final gold reward of PPO, the drop from the peak (over-optimisation), and the accuracy of "
                  "the upstream RM (`rm/accuracy` of the run in tag `rlhf_lab.upstream.rm`).", "",
                  md_table(["policy", "RM", "seeds", "peak gold", "final gold", "drop from peak", "RM accuracy",
                            "RM/policy params"], rows), ""]

    sources = {(r.value("reward_model.source") or "?", r.value("data.on_policy_fraction") or "0.0") for r in ppo}
    if ppo and len(sources) > 1:
        rows = []
        for src, frac in sorted(sources):
            members = [r for r in ppo if (r.value("reward_model.source") or "?", r.value("data.on_policy_fraction")
                                          or "0.0") == (src, frac)]
            s = [run_summary(r) for r in members]
            rows.append([src, frac, len(members), fmt_ci([x["gold_final"] for x in s]),
                         fmt_ms([x["gold_peak"] for x in s]), fmt_ci([x["gold_drop"] for x in s]),
                         fmt_ms([x["proxy_final"] for x in s]), fmt_ms([x["rm_accuracy"] for x in s])])
        lines += ["## Same- vs different-source RM", "",
                  md_table(["RM source", "on-policy fraction", "runs", "final gold", "peak gold", "drop from peak",
                            "final proxy", "RM accuracy"], rows), ""]

    lines += ship_section(runs)
    read = "Tracking store: " if source == f"`{store_uri(uri)}`" else "Runs read from "
    by = "the sweep's end (rlhf_lab/entry/sweeps.py)." if parent else f"`rlhf-lab-report {study}{flags}`."
    lines += ["## Runs", "", runs_table(runs_all), "", f"{read}{source}; generated by {by}", ""]
    (out / "README.md").write_text("\n".join(lines))
    return out / "README.md"
