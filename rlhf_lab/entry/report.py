"""``rlhf-lab-report``: the command line of the reports.

    rlhf-lab-report ppo_beta_grid        # -> reports/ppo_beta_grid/README.md + PNG plots
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
    rlhf-lab-report clip_eps --no-store --runs reports/claims_runs.json.gz   # a study report from a runs file
    rlhf-lab-report my_study --out my_reports   # a study of your own (tag rlhf_lab.study) -> my_reports/my_study/

A study is one of the canned studies (sweeps/sweep/*.yaml), or any plain name with ``--out``; reports are written
inside ``--out`` only, never over a file rlhf-lab-report did not write, and a study with no runs in the store is an
error (exit 1, nothing written; :mod:`rlhf_lab.analysis.report_files`). Bad names and paths exit 2. Only the runs
whose MLflow author is this user (its login, else its OS user) are read from the store, unless ``--all-authors``
(:mod:`rlhf_lab.runs.authors`): on a team server another user's runs reach a report only when asked for.
"""

from __future__ import annotations

import argparse
import logging
import sys

from rlhf_lab.analysis.claims import only_claims, write_claims_report
from rlhf_lab.analysis.studies.gao import RL_STUDY as GAO_STUDY
from rlhf_lab.analysis.studies.gao import write_gao_report
from rlhf_lab.analysis.studies.gao_gold import STUDY as GAO_GOLD_STUDY
from rlhf_lab.analysis.studies.gao_gold import write_gao_gold_report
from rlhf_lab.analysis.studies.gold_validation import STUDY as GOLD_STUDY
from rlhf_lab.analysis.studies.alarm_fit import RUNS_FILES as ALARM_RUNS_FILES
from rlhf_lab.analysis.studies.hacking_alarm import STUDY as ALARM_STUDY
from rlhf_lab.analysis.studies.hacking_alarm import write_hacking_alarm_report
from rlhf_lab.analysis.studies.gold_validation import write_gold_validation_report
from rlhf_lab.analysis.studies.gold_recipes import STUDY as RECIPES_STUDY
from rlhf_lab.analysis.studies.gold_recipes import write_gold_recipes_report
from rlhf_lab.analysis.report_files import NoRuns, ReportError, check_study
from rlhf_lab.analysis.runs import STUDIES
from rlhf_lab.analysis.snapshot import FILE_NAME
from rlhf_lab.analysis.study import write_study_report
from rlhf_lab.runs.authors import ALL_AUTHORS_ENV
from rlhf_lab.runs.process import environment

OWN_REPORTS = {  # study -> its own report writer: the two golds compared, the gold recipes, the Gao fits
    GOLD_STUDY: write_gold_validation_report, RECIPES_STUDY: write_gold_recipes_report, GAO_STUDY: write_gao_report,
    GAO_GOLD_STUDY: write_gao_gold_report}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rlhf-lab-report", description="Write reports/<study>/README.md (plots, tables, "
                                "Gao et al. fits) or reports/claims.md from the MLflow runs of the canned studies.")
    p.add_argument("study", nargs="?", help=f"the study (tag rlhf_lab.study), e.g. {', '.join(STUDIES[:-1])}")
    p.add_argument("--claims", action="store_true", help="write reports/claims.md")
    p.add_argument("--uri", default=None, help="MLflow tracking URI (MLFLOW_TRACKING_URI wins; default "
                   "sqlite:///mlflow.db)")
    p.add_argument("--out", default=None, help="output folder (default: reports); with it, a study may be any plain "
                   "name (tag rlhf_lab.study), not only a canned one")
    p.add_argument("--runs", action="append", default=[], metavar="FILE",
                   help="also read the runs kept in FILE (a claims_runs.json.gz an earlier --claims wrote; "
                        "repeatable); a run in the store and the file counts once; for a study, its runs tagged with it")
    p.add_argument("--no-store", action="store_true", help="read no tracking store, only --runs")
    p.add_argument("--all-authors", action="store_true", help="read every user's runs in the store (default: only "
                   "the runs whose MLflow author, tag mlflow.user, is this login or OS user; the same as "
                   f"{ALL_AUTHORS_ENV}=1)")
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
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    own_out, a.out = a.out is not None, a.out or "reports"
    with environment({ALL_AUTHORS_ENV: "1"} if a.all_authors else {}):
        return write_reports(a, own_out)


def write_reports(a: argparse.Namespace, own_out: bool) -> int:
    """The reports the parsed command line `a` asks for; the exit status."""
    if a.study:
        try:
            check_study(a.study, own_out)
            if a.study in OWN_REPORTS:  # studies with reports of their own (rlhf_lab/analysis/studies/)
                path = OWN_REPORTS[a.study](a.out, a.uri, runs_files=a.runs, use_store=not a.no_store,
                                            require_runs=True)
            elif a.study == ALARM_STUDY:  # the gold-free hacking alarm fitted and validated over many studies' runs
                path = write_hacking_alarm_report(a.out, a.uri, runs_files=a.runs or list(ALARM_RUNS_FILES),
                                                  use_store=not a.no_store, require_runs=True)
            else:
                path = write_study_report(a.study, a.out, a.uri, runs_files=a.runs, use_store=not a.no_store,
                                          require_runs=True)
        except ReportError as err:
            print(f"rlhf-lab-report: {err}", file=sys.stderr)
            return 1 if isinstance(err, NoRuns) else 2
        except ValueError as err:  # SnapshotError: an unreadable or edited runs file
            print(f"rlhf-lab-report: {err}", file=sys.stderr)
            return 2
        text = path.read_text()
        print(f"wrote {path}")
        cmds = text.split("```bash\n", 1)[1].split("```", 1)[0].strip() if "```bash\n" in text else ""
        again = "" if "rlhf-lab-report" in cmds else f"\n  rlhf-lab-report {a.study}"  # the runs, then the report
        print(f"reproduce with:\n  {cmds.replace(chr(10), chr(10) + '  ')}{again}")
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
