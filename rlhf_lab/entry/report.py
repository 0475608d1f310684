"""``rlhf-lab-report``: the command line of the study reports.

    rlhf-lab-report ppo_beta_grid        # -> reports/ppo_beta_grid/README.md + PNG plots
    rlhf-lab-report clip_eps --no-store --runs reports/claims_runs.json.gz   # a study report from a runs file
    rlhf-lab-report my_study --out my_reports   # a study of your own (tag rlhf_lab.study) -> my_reports/my_study/

A study is one of the canned studies (sweeps/sweep/*.yaml), or any plain name with ``--out``; reports are written
inside ``--out`` only, never over a file rlhf-lab-report did not write, and a study with no runs in the store is an
error (exit 1, nothing written; :mod:`rlhf_lab.analysis.report_files`). Bad names and paths exit 2. Only the runs
whose MLflow author is this user (its login, else its OS user) are read from the store, unless ``--all-authors``
(:mod:`rlhf_lab.runs.authors`): on a team server another user's runs reach a report only when asked for.

Reports of another installed package (the lab's own research, ``rlhf_lab_research``: ``--claims``,
``gold_rm_validation``, ``gao_rm_scaling``, ``hacking_alarm`` ...) are found through the entry-point group
:data:`REPORTS_GROUP`: a study name, or a flag ``--<name>``, that names one hands the whole command line to it. This
package never imports them.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

from rlhf_lab.analysis.report_files import NoRuns, ReportError, check_study
from rlhf_lab.analysis.study_report import write_study_report
from rlhf_lab.runs.authors import ALL_AUTHORS_ENV
from rlhf_lab.runs.process import environment

REPORTS_GROUP = "rlhf_lab.reports"  # entry points: a report's name -> its command line, main(argv) -> exit status


def other_reports() -> dict[str, EntryPoint]:
    """{name: entry point} of the reports other installed packages write (group :data:`REPORTS_GROUP`)."""
    return {ep.name: ep for ep in entry_points(group=REPORTS_GROUP)}


def parser(prog: str = "rlhf-lab-report", epilog: str | None = None, add_help: bool = True) -> argparse.ArgumentParser:
    """The options every report takes (the study, where the runs are read, where the report goes)."""
    p = argparse.ArgumentParser(prog=prog, epilog=epilog, add_help=add_help, description="Write "
                                "reports/<study>/README.md (plots, tables, Gao et al. fits) from the MLflow runs of a "
                                "study.")
    p.add_argument("study", nargs="?", help="the study (tag rlhf_lab.study): a file name of sweeps/sweep/, e.g. "
                   "ppo_beta_grid")
    p.add_argument("--uri", default=None, help="MLflow tracking URI (MLFLOW_TRACKING_URI wins; default "
                   "sqlite:///mlflow.db)")
    p.add_argument("--out", default=None, help="output folder (default: reports); with it, a study may be any plain "
                   "name (tag rlhf_lab.study), not only a canned one")
    p.add_argument("--runs", action="append", default=[], metavar="FILE",
                   help="also read the runs kept in FILE (a runs.json.gz an earlier report wrote; repeatable); a run "
                        "in the store and the file counts once; for a study, its runs tagged with it")
    p.add_argument("--no-store", action="store_true", help="read no tracking store, only --runs")
    p.add_argument("--all-authors", action="store_true", help="read every user's runs in the store (default: only "
                   "the runs whose MLflow author, tag mlflow.user, is this login or OS user; the same as "
                   f"{ALL_AUTHORS_ENV}=1)")
    return p


def run(a: argparse.Namespace, write: Callable[[argparse.Namespace, bool], int]) -> int:
    """`write(a, own_out)` with MLflow's logging quiet, ``--out`` defaulted to reports/ and ``--all-authors`` set."""
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    own_out, a.out = a.out is not None, a.out or "reports"
    with environment({ALL_AUTHORS_ENV: "1"} if a.all_authors else {}):
        return write(a, own_out)


def report_error(err: ValueError) -> int:
    """Print a refused report's one line; the exit status (1: no runs, 2: a bad name, path or runs file)."""
    print(f"rlhf-lab-report: {err}", file=sys.stderr)
    return 1 if isinstance(err, NoRuns) else 2


def print_written(path: Path, study: str) -> None:
    """Say where the report went and the commands that reproduce it (its runs, then the report)."""
    text = path.read_text()
    print(f"wrote {path}")
    cmds = text.split("```bash\n", 1)[1].split("```", 1)[0].strip() if "```bash\n" in text else ""
    again = "" if "rlhf-lab-report" in cmds else f"\n  rlhf-lab-report {study}"
    print(f"reproduce with:\n  {cmds.replace(chr(10), chr(10) + '  ')}{again}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    others = other_reports()
    epilog = (f"reports of other installed packages, named as a study or a flag --<name> (then --help for theirs): "
              f"{', '.join(sorted(others))}" if others else None)
    a, rest = parser(add_help=False).parse_known_args(argv)
    named = [f[2:] for f in rest if f.startswith("--") and f[2:] in others] or [a.study]
    if named[0] in others:
        return others[named[0]].load()(argv)
    p = parser(epilog=epilog)
    a = p.parse_args(argv)
    if not a.study:
        p.error("name a study")
    if a.no_store and not a.runs:
        p.error("--no-store reads only the --runs files: name at least one (e.g. --runs reports/claims_runs.json.gz)")
    return run(a, write_report)


def write_report(a: argparse.Namespace, own_out: bool) -> int:
    """The study report the parsed command line `a` asks for; the exit status."""
    try:
        check_study(a.study, own_out)
        path = write_study_report(a.study, a.out, a.uri, runs_files=a.runs, use_store=not a.no_store,
                                  require_runs=True)
    except ValueError as err:  # ReportError; SnapshotError: an unreadable or edited runs file
        return report_error(err)
    print_written(path, a.study)
    return 0


if __name__ == "__main__":
    sys.exit(main())
