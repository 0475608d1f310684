"""A job's run.log holds what its terminal showed (issue 68): the Hydra callback copies stdout and stderr, each line
as the terminal shows it at its end (a progress bar redrawn with carriage returns: its last state)."""

from __future__ import annotations

import sys

from omegaconf import OmegaConf

from rlhf_lab.entry.terminal import TerminalLog, job_log_path


def test_the_job_log_gets_the_printed_lines_and_the_last_state_of_a_bar(tmp_path, capsys):
    config = OmegaConf.create({"hydra": {"runtime": {"output_dir": str(tmp_path)}, "job": {"name": "run"}}})
    assert job_log_path(config) == tmp_path / "run.log"
    before = sys.stdout, sys.stderr
    cb = TerminalLog()
    cb.on_job_start(config)
    print("[rlhf-lab] sft: building")
    sys.stdout.write("sft:  10%|#  | 1/10\rsft: 100%|###| 10/10\n")
    print("rlhf-lab: data error: data.path=x", file=sys.stderr)
    print("rlhf-lab sft: done in 3s")
    cb.on_job_end(config, None)
    assert (sys.stdout, sys.stderr) == before  # put back at the job's end
    print("after the job")
    assert (tmp_path / "run.log").read_text().splitlines() == [
        "[rlhf-lab] sft: building", "sft: 100%|###| 10/10", "rlhf-lab: data error: data.path=x",
        "rlhf-lab sft: done in 3s"]
    out, err = capsys.readouterr()  # the terminal still got everything
    assert "sft:  10%" in out and "after the job" in out and "data error" in err
