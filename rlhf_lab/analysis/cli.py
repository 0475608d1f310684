"""``rlhf-lab-report``: the command line of the reports.

    rlhf-lab-report ppo_beta_grid        # -> reports/ppo_beta_grid/README.md + PNG plots
    rlhf-lab-report --claims             # -> reports/claims.md (a verdict on every claim of docs/claims.md)
    rlhf-lab-report gold_rm_validation   # -> the gold RM against the world's formula (ρ, curves, C1/C4 verdicts)
"""

from __future__ import annotations

import argparse
import logging
import sys

from rlhf_lab.analysis.claims import write_claims_report
from rlhf_lab.analysis.gold_validation import STUDY as GOLD_STUDY
from rlhf_lab.analysis.gold_validation import write_gold_validation_report
from rlhf_lab.analysis.runs import STUDIES
from rlhf_lab.analysis.study import write_study_report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rlhf-lab-report", description="Write reports/<study>/README.md (plots, tables, "
                                "Gao et al. fits) or reports/claims.md from the MLflow runs of the canned studies.")
    p.add_argument("study", nargs="?", help=f"the study (tag rlhf_lab.study), e.g. {', '.join(STUDIES[:-1])}")
    p.add_argument("--claims", action="store_true", help="write reports/claims.md")
    p.add_argument("--uri", default=None, help="MLflow tracking URI (MLFLOW_TRACKING_URI wins; default "
                   "sqlite:///mlflow.db)")
    p.add_argument("--out", default="reports", help="output folder (default: reports)")
    a = p.parse_args(argv)
    if not a.study and not a.claims:
        p.error("name a study or pass --claims")
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    if a.study:
        if a.study == GOLD_STUDY:  # its own report: the two golds compared (rlhf_lab/analysis/gold_validation.py)
            path = write_gold_validation_report(a.out, a.uri)
        else:
            path = write_study_report(a.study, a.out, a.uri)
        text = path.read_text()
        print(f"wrote {path}")
        cmds = text.split("```bash\n", 1)[1].split("```", 1)[0].strip() if "```bash\n" in text else ""
        print(f"reproduce with:\n  {cmds.replace(chr(10), chr(10) + '  ')}\n  rlhf-lab-report {a.study}")
    if a.claims:
        path = write_claims_report(a.out, a.uri)
        print(f"wrote {path}")
        for line in path.read_text().splitlines():
            if line.startswith("| C"):
                cells = [c.strip() for c in line.strip("|").split("|")]
                print(f"  {cells[0]:<4} {cells[-1].strip('*'):<15} {cells[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
