"""The research reports, run as ``rlhf-lab-report <name>`` (``rlhf-lab-report`` finds them through the entry-point
group ``rlhf_lab.reports`` in pyproject.toml; :mod:`rlhf_lab.entry.report`):

    rlhf-lab-report --claims             # -> reports/claims.md (a verdict on every claim of docs/claims.md)
                                         #    and reports/claims_runs.json.gz (every run it read)
    rlhf-lab-report --claims --runs reports/claims_runs.json.gz            # the store's runs and the file's
    rlhf-lab-report --claims --runs reports/claims_runs.json.gz --no-store # the file's alone
    rlhf-lab-report --claims --only C18  # recompute C18 only, into the existing reports/claims.md
    rlhf-lab-report gold_rm_validation   # -> the gold RM against the world's formula (ρ, curves, C1/C4 verdicts)
                                         #    and its runs file reports/gold_rm_validation/runs.json.gz
    rlhf-lab-report gold_recipes         # -> the gold recipes against the formula (ρ by recipe and β, C1 with each
                                         #    gold, each gold's cost) and its runs file reports/gold_recipes/runs.json.gz
    rlhf-lab-report gao_rm_scaling       # -> pooled Gao et al. fits by RM size, PPO and best-of-n, with the trend
    rlhf-lab-report gao_rm_scaling_gold  # -> the Gao fit with the gold RM and with the formula on the same runs
    rlhf-lab-report hacking_alarm        # -> the gold-free hacking alarm fitted on some studies, judged on the
                                         #    others (default --runs: the committed runs files it was fitted on)
    rlhf-lab-report gold_rm_replication  # -> the gold RM validated with the gold replicated (pre-registered)
    rlhf-lab-report algo_frontier_matched_tune  # -> each algorithm's setting for the matched frontier
    rlhf-lab-report algo_frontier_matched       # -> the frontier at matched constraints (its phase 2)

The options, the exit statuses and the files a report may overwrite are those of every report
(:mod:`rlhf_lab.entry.report`, :mod:`rlhf_lab.analysis.report_files`).
"""

from __future__ import annotations

import argparse
import sys

from rlhf_lab.analysis.report_files import check_study, known_studies
from rlhf_lab.analysis.snapshot import FILE_NAME
from rlhf_lab.entry.report import parser, print_written, report_error, run, write_report
from rlhf_lab_research.claims import only_claims, write_claims_report
from rlhf_lab_research.studies.alarm_fit import RUNS_FILES as ALARM_RUNS_FILES
from rlhf_lab_research.studies.frontier_matched import STUDY as FRONTIER_STUDY
from rlhf_lab_research.studies.frontier_matched import TUNE as FRONTIER_TUNE
from rlhf_lab_research.studies.frontier_matched import write_measure_report, write_tune_report
from rlhf_lab_research.studies.gao import RL_STUDY as GAO_STUDY
from rlhf_lab_research.studies.gao import write_gao_report
from rlhf_lab_research.studies.gao_gold import STUDY as GAO_GOLD_STUDY
from rlhf_lab_research.studies.gao_gold import write_gao_gold_report
from rlhf_lab_research.studies.gold_recipes import STUDY as RECIPES_STUDY
from rlhf_lab_research.studies.gold_recipes import write_gold_recipes_report
from rlhf_lab_research.studies.gold_replication import STUDY as REPLICATION_STUDY
from rlhf_lab_research.studies.gold_replication import write_gold_replication_report
from rlhf_lab_research.studies.gold_validation import STUDY as GOLD_STUDY
from rlhf_lab_research.studies.gold_validation import write_gold_validation_report
from rlhf_lab_research.studies.hacking_alarm import STUDY as ALARM_STUDY
from rlhf_lab_research.studies.hacking_alarm import write_hacking_alarm_report

STUDY_REPORTS = {  # study -> its own report writer: the two golds compared, the gold recipes, the Gao fits, the
    # pre-registered studies scored by their own rules (reports/PREREGISTERED.md)
    GOLD_STUDY: write_gold_validation_report, RECIPES_STUDY: write_gold_recipes_report, GAO_STUDY: write_gao_report,
    GAO_GOLD_STUDY: write_gao_gold_report, ALARM_STUDY: write_hacking_alarm_report,
    REPLICATION_STUDY: write_gold_replication_report, FRONTIER_TUNE: write_tune_report,
    FRONTIER_STUDY: write_measure_report}
CROSS_STUDY_REPORTS = (ALARM_STUDY,)  # reports over the runs of many studies, with no sweep file of their own


def main(argv: list[str] | None = None) -> int:
    p = parser(epilog="reports of the lab's research: --claims, " + ", ".join(STUDY_REPORTS))
    p.add_argument("--claims", action="store_true", help="write reports/claims.md")
    p.add_argument("--only", default=None, metavar="IDS",
                   help="with --claims: recompute only these claims (comma-separated, e.g. C18) and splice them "
                        "into the existing claims.md; the other claims' sections are left as they are")
    a = p.parse_args(argv)
    if not a.study and not a.claims:
        p.error("name a study or pass --claims")
    if not a.claims and a.only:
        p.error("--only goes with --claims")
    if a.no_store and not a.runs:
        p.error("--no-store reads only the --runs files: name at least one (e.g. --runs reports/claims_runs.json.gz)")
    return run(a, write_reports)


def write_reports(a: argparse.Namespace, own_out: bool) -> int:
    """The reports the parsed command line `a` asks for; the exit status."""
    if a.study and a.study not in STUDY_REPORTS:  # a study report beside the claims
        status = write_report(a, own_out)
        if status:
            return status
    elif a.study:
        try:
            check_study(a.study, own_out, known=known_studies() + list(CROSS_STUDY_REPORTS))
            writer = STUDY_REPORTS[a.study]
            runs = a.runs or (list(ALARM_RUNS_FILES) if a.study == ALARM_STUDY else [])  # the alarm: its fit's files
            path = writer(a.out, a.uri, runs_files=runs, use_store=not a.no_store, require_runs=True)
        except ValueError as err:  # ReportError; SnapshotError: an unreadable or edited runs file
            return report_error(err)
        print_written(path, a.study)
    if a.claims:
        try:
            path = write_claims_report(a.out, a.uri, runs_files=a.runs, use_store=not a.no_store,
                                       only=a.only.split(",") if a.only else None)
        except (ValueError, FileNotFoundError) as err:  # SnapshotError and ReportError are ValueErrors
            print(f"rlhf-lab-report: {err}", file=sys.stderr)
            return 2
        print(f"wrote {path} and {path.parent / FILE_NAME}")
        only = {c.id for c in only_claims(a.only.split(","))} if a.only else None
        for line in path.read_text().splitlines():
            if line.startswith("| C") and (only is None or line.split("|")[1].strip() in only):
                cells = [c.strip() for c in line.strip("|").split("|")]
                print(f"  {cells[0]:<4} {cells[-1].strip('*'):<15} {cells[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
