"""rlhf-lab-report writes only inside its output folder, only over its own files, and only studies it knows."""

from __future__ import annotations

import pytest

from rlhf_lab.entry import report as cli
from rlhf_lab.analysis.report_files import ReportError, check_file, check_folder, check_study, is_generated, known_studies


def test_known_studies_are_the_sweep_files():
    known = known_studies()
    assert "ppo_beta_grid" in known and "gold_rm_validation" in known and "seeds" in known
    assert all(not s.endswith(".yaml") for s in known)


@pytest.mark.parametrize("name", ["../../../../victim", "/tmp/victim", "..", ".", "a/b", ""])
def test_a_path_is_never_a_study_name(name):
    with pytest.raises(ReportError, match="not a study name"):
        check_study(name, own_out=True, known=["ppo_beta_grid"])


def test_an_unknown_study_names_the_closest_unless_out_is_given():
    with pytest.raises(ReportError, match="did you mean ppo_beta_grid"):
        check_study("ppo_beta_gird", own_out=False, known=["ppo_beta_grid", "rm_source"])
    check_study("my_study", own_out=True, known=["ppo_beta_grid"])  # a study of one's own, with --out


def test_only_files_the_command_wrote_are_overwritten(tmp_path):
    ours = tmp_path / "ours.md"
    ours.write_text("# Study `x`\n\nReproduce (then `rlhf-lab-report x`):\n")
    theirs = tmp_path / "theirs.md"
    theirs.write_text("# My notes\n\nnothing to do with reports\n")
    assert is_generated(ours) and not is_generated(theirs)
    check_file(ours)
    check_file(tmp_path / "absent.md")
    with pytest.raises(ReportError, match="not written by rlhf-lab-report"):
        check_file(theirs)
    folder = tmp_path / "f"
    folder.mkdir()
    check_folder(folder)  # empty
    (folder / "plot.png").write_bytes(b"x")
    with pytest.raises(ReportError, match="no README.md"):
        check_folder(folder)


def test_the_committed_reports_count_as_generated():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "reports"
    for readme in root.glob("*/README.md"):
        assert is_generated(readme), readme
    assert is_generated(root / "claims.md") and is_generated(root / "claims_runs.json.gz")


def test_report_cli_refuses_paths_and_victims_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "README.md").write_text("precious\n")
    assert cli.main(["../victim"]) == 2
    assert cli.main([str(victim)]) == 2
    assert (victim / "README.md").read_text() == "precious\n"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all("not a study name" in line for line in err)
    assert cli.main(["ppo_beta_gird"]) == 2  # misspelt: no "not run yet" report
    assert "did you mean ppo_beta_grid" in capsys.readouterr().err
    # a known study over a folder someone else owns
    assert cli.main(["victim", "--out", "."]) == 2
    assert (victim / "README.md").read_text() == "precious\n"
    assert not (tmp_path / "reports").exists() and not (tmp_path / "mlflow.db").exists()


def test_a_study_without_runs_exits_1_naming_the_store_and_creates_no_store(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["ppo_beta_grid"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no runs of study 'ppo_beta_grid' in sqlite:///mlflow.db" in err[0]
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "reports").exists()
    assert cli.main(["gold_rm_validation"]) == 1
    assert not (tmp_path / "mlflow.db").exists()


def test_a_study_of_ones_own_is_written_inside_out(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'store.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("rlhf-lab")
    run_id = client.create_run(exp, tags={"rlhf_lab.stage": "ppo", "rlhf_lab.study": "mine"}).info.run_id
    for step, gold in ((0, 0.1), (10, 0.2)):
        client.log_metric(run_id, "eval/gold_reward", gold, step=step)
    client.set_terminated(run_id, "FINISHED")
    assert cli.main(["mine", "--uri", uri]) == 2  # not a canned study, and no --out
    assert cli.main(["mine", "--uri", uri, "--out", "mine_reports"]) == 0
    readme = tmp_path / "mine_reports" / "mine" / "README.md"
    assert is_generated(readme)
    assert cli.main(["mine", "--uri", uri, "--out", "mine_reports"]) == 0  # its own report: rewritten
