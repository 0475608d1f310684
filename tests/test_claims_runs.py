"""The claims' runs kept in a file (rlhf_lab/analysis/snapshot.py) and the update of some claims of a written
report (``rlhf-lab-report --claims --only``): round trip, corruption refused, union by run id, one design per
study, an update that leaves every other claim's text as it was, and the refusal to keep a section whose runs are
in no file read."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from rlhf_lab_research import claims as C
from rlhf_lab_research import designs
from rlhf_lab_research.claims_registry import CLAIMS
from rlhf_lab_research.verdicts import judge_all
from rlhf_lab.entry import report as cli
from rlhf_lab.analysis import snapshot
from rlhf_lab.analysis.study_runs import RunData
from tests.test_claims import policy, world


def tagged(studies: dict[str, list[RunData]]) -> dict[str, list[RunData]]:
    """Runs as a store gives them: each with its study tag, a commit and times (provenance rows need them)."""
    for name, runs in studies.items():
        for k, r in enumerate(runs):
            r.tags.update({"rlhf_lab.study": name, "rlhf_lab.git_commit": "abc1234def"})
            r.start_time, r.end_time = 1_000 * k, 1_000 * k + 500
    return studies


def sections(text: str) -> dict[str, str]:
    body = text.split("## Effects", 1)[1].split(C.PROVENANCE, 1)[0]
    return {"C" + s.split(":", 1)[0]: "### C" + s for s in body.split("### C")[1:]}


def test_runs_file_round_trip_is_exact_and_deterministic(tmp_path):
    studies = tagged(world())
    a = snapshot.write_snapshot(tmp_path / "a.json.gz", studies, {"ppo_beta_grid": ["rlhf-lab -m sweep=x"]})
    b = snapshot.write_snapshot(tmp_path / "b.json.gz", studies, {"ppo_beta_grid": ["rlhf-lab -m sweep=x"]})
    assert a.read_bytes() == b.read_bytes()  # the same runs give the same bytes
    back, commands = snapshot.read_snapshot(a)
    assert back == studies and commands["ppo_beta_grid"] == ["rlhf-lab -m sweep=x"]
    assert isinstance(back["ppo_beta_grid"][0].history["eval/gold_reward"][0], tuple)
    assert not list(tmp_path.glob(".*tmp"))  # written then renamed


def test_a_corrupted_or_foreign_runs_file_is_refused(tmp_path):
    path = snapshot.write_snapshot(tmp_path / "r.json.gz", tagged(world()))
    doc = json.loads(gzip.decompress(path.read_bytes()))
    doc["payload"]["studies"]["ppo_beta_grid"]["runs"][0]["metrics"]["eval/gold_reward"] = 9.0  # an edited figure
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    with pytest.raises(snapshot.SnapshotError, match="sha256"):
        snapshot.read_snapshot(path)
    path.write_bytes(path.read_bytes()[:200])  # cut short
    with pytest.raises(snapshot.SnapshotError, match="not a readable runs file"):
        snapshot.read_snapshot(path)
    doc["format"] = 99
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    with pytest.raises(snapshot.SnapshotError, match="format 99"):
        snapshot.read_snapshot(path)


def test_merge_unites_by_run_id_and_keeps_every_design_and_a_claim_reads_one():
    rng = np.random.default_rng(3)
    old = [policy(k, {"sweep.kl.beta": 0.1}, 0.5, rng) for k in range(3)]
    for r in old:
        r.tags["rlhf_lab.study"] = "ppo_beta_grid"
    newer_copy = RunData(old[0].run_id, "ppo", "FINISHED", {}, {"rlhf_lab.study": "ppo_beta_grid"}, {"x": 1.0})
    merged = snapshot.merge({"ppo_beta_grid": old}, {"ppo_beta_grid": [newer_copy]})
    assert len(merged["ppo_beta_grid"]) == 3 and merged["ppo_beta_grid"][0].metrics == {"x": 1.0}
    rerun = [policy(k, {"sweep.kl.beta": 0.1}, 0.7, rng) for k in range(5)]
    for r in rerun:
        r.tags["rlhf_lab.study"] = "ppo_beta_grid_5seeds"
    pref = {"ppo_beta_grid": "ppo_beta_grid_5seeds"}
    merged = snapshot.merge({"ppo_beta_grid": old}, {"ppo_beta_grid": rerun})
    assert len(merged["ppo_beta_grid"]) == 8  # the file keeps both designs (the older one's report stays regenerable)
    read = designs.one_design(merged, pref, C.counts)
    assert [r.run_id for r in read["ppo_beta_grid"]] == [r.run_id for r in rerun]  # the rerun, not a mix
    assert [r.run_id for r in C.counted(merged)[0]["ppo_beta_grid"]] == [r.run_id for r in rerun]
    for r in rerun:
        r.status = "FAILED"
    read = designs.one_design(merged, pref, C.counts)
    assert [r.run_id for r in read["ppo_beta_grid"]] == [r.run_id for r in old]  # no rerun run counts: the older design


def test_the_verdicts_from_the_runs_file_alone_are_those_of_the_runs(tmp_path):
    studies = tagged(world())
    expected = {r.claim.id: (r.verdict, [p.measured.effect for p in r.parts])
                for r in judge_all(CLAIMS, *C.counted(studies), {})}
    f = snapshot.write_snapshot(tmp_path / "in" / snapshot.FILE_NAME, studies)
    text = C.write_claims_report(tmp_path / "out", runs_files=[f], use_store=False).read_text()
    assert f"from {C.KEPT_SOURCE}." in text and str(f) not in text and "C18" in text  # the file beside it, not f
    again, _ = snapshot.read_snapshot(tmp_path / "out" / snapshot.FILE_NAME)  # rewritten beside the report
    assert {k: v for k, v in again.items() if v} == studies
    got = {r.claim.id: (r.verdict, [p.measured.effect for p in r.parts])
           for r in judge_all(CLAIMS, *C.counted(snapshot.read_snapshot(f)[0]), {})}
    assert got == expected
    rows = {line.split("|")[1].strip(): line.split("|")[-2].strip() for line in text.splitlines()
            if line.startswith("| C")}
    assert rows["C1"].split(" (earlier: ")[0] == f"**{expected['C1'][0]}**" and rows["C21"] == "**not testable**"


def test_only_recomputes_its_claims_and_leaves_every_other_section_as_it_was(tmp_path):
    studies = tagged(world())
    first = snapshot.write_snapshot(tmp_path / "first.json.gz", studies)
    full = C.write_claims_report(tmp_path, runs_files=[first], use_store=False).read_text()
    assert "**not run yet**" not in sections(full)["C18"] and "| judged |" in sections(full)["C18"]
    rng = np.random.default_rng(18)
    # new rm_ensemble runs: the ensembles now end far below the single small RM
    ens = tagged({"rm_ensemble": [
        policy(k, {"sweep.reward_model.ensemble": e, "sweep.reward_model.conservative_lambda": lam}, g, rng)
        for k in range(5) for e, lam, g in ((3, 1.0, 0.2), (3, 0.0, 0.25), (1, 0.0, 0.8))]})
    for k, r in enumerate(ens["rm_ensemble"]):
        r.start_time, r.end_time = 100_000 + 1_000 * k, 100_500 + 1_000 * k
    f = snapshot.write_snapshot(tmp_path / "new.json.gz", ens)
    text = C.write_claims_report(tmp_path, runs_files=[f], use_store=False, only=["c18"]).read_text()
    old_s, new_s = sections(full), sections(text)
    assert list(new_s) == list(old_s)
    assert {k for k in old_s if old_s[k] != new_s[k]} == {"C18"}  # the others: the same runs, the same family
    # C18 reads the union of the runs file beside the report and the new file
    updated = dict(studies, rm_ensemble=studies["rm_ensemble"] + ens["rm_ensemble"])
    ref = {r.claim.id: r for r in judge_all(CLAIMS, *C.counted(updated), {})}["C18"]
    assert new_s["C18"] == "\n".join(C.claim_section(ref)) + "\n"
    assert text.split("## Verdicts")[1].split("## Effects")[0] == full.split("## Verdicts")[1].split("## Effects")[0]
    assert "**Updates.**" in text and "- C18: recomputed on " in text and C.KEPT_SOURCE in text
    assert str(f) not in text  # the file it was given holds a folder of this machine; the kept file has its runs
    prov = text.split(C.PROVENANCE)[1]
    assert "| `rm_ensemble` | 30 |" in prov and "| `ppo_beta_grid` |" in prov
    # once more: the note on C18 is replaced, not added
    again = C.write_claims_report(tmp_path, runs_files=[f], use_store=False, only=["C18"]).read_text()
    assert again.count("- C18: recomputed on ") == 1 and sections(again) == new_s


def test_only_refuses_to_keep_a_section_whose_runs_are_in_no_file_read(tmp_path):
    studies = tagged(world())
    before = C.write_claims_report(tmp_path, studies=studies).read_text()  # from memory: no runs file beside it
    f = snapshot.write_snapshot(tmp_path / "new.json.gz", {"rm_size_vs_policy_size": studies["rm_size_vs_policy_size"],
                                                           "rm_ensemble": studies["rm_ensemble"]})
    with pytest.raises(ValueError, match=r"--only C18: the runs of C1, C2, C3, .*C20 are in none of the files read"):
        C.write_claims_report(tmp_path, runs_files=[f], use_store=False, only=["C18"])
    assert (tmp_path / "claims.md").read_text() == before  # nothing written


def test_only_refuses_unknown_claims_shared_studies_and_a_missing_report(tmp_path):
    with pytest.raises(ValueError, match="unknown claim C99"):
        C.only_claims(["C99"])
    with pytest.raises(ValueError, match="also read by C2, C4, C9; add them to --only"):
        C.only_claims(["C1"])
    assert [c.id for c in C.only_claims(["C16", "C17"])] == ["C16", "C17"]
    f = snapshot.write_snapshot(tmp_path / "r.json.gz", {})
    with pytest.raises(FileNotFoundError, match="write it first with rlhf-lab-report --claims"):
        C.write_claims_report(tmp_path / "none", runs_files=[f], use_store=False, only=["C18"])


def test_cli_says_what_is_wrong_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["--claims", "--no-store"])
    assert "--no-store reads only the --runs files" in capsys.readouterr().err
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(b"not gzip")
    assert cli.main(["--claims", "--no-store", "--runs", str(bad), "--out", str(tmp_path)]) == 2
    assert "not a readable runs file" in capsys.readouterr().err
    f = snapshot.write_snapshot(tmp_path / "r.json.gz", tagged(world()))
    assert cli.main(["--claims", "--no-store", "--runs", str(f), "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "claims_runs.json.gz" in out and "C18" in out
    assert cli.main(["--claims", "--no-store", "--runs", str(f), "--out", str(tmp_path / "o"), "--only", "C18"]) == 0
    out = capsys.readouterr().out
    assert "C18" in out and "C1 " not in out


def test_the_committed_claims_report_is_recomputed_from_its_runs_file_to_the_letter(tmp_path):
    """On a fresh clone, reports/claims.md comes out of reports/claims_runs.json.gz alone, as committed, but for the
    Updates paragraph (dates); its source line names that file, whatever store the report was written from."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "reports"
    report, runs_file = root / "claims.md", root / snapshot.FILE_NAME
    assert runs_file.is_file(), f"{runs_file} is missing: rlhf-lab-report --claims writes it beside claims.md"
    text = report.read_text()
    assert "Holm" in text.split("## Verdicts", 1)[0]  # the report of the current rules, not an older one

    def body(t: str) -> str:
        lines = t.splitlines()
        if C.UPDATES in lines:
            i = lines.index(C.UPDATES)
            j = i
            while j + 1 < len(lines) and lines[j + 1].startswith("- "):
                j += 1
            lines = lines[:i] + lines[j + 2:]  # and the blank line after the block (the writer's paragraph break)
        return "\n".join(lines)

    again = C.write_claims_report(tmp_path, runs_files=[runs_file], use_store=False).read_text()
    assert body(again) == body(text)


def test_only_keeps_the_runs_of_the_sections_it_leaves_in_the_runs_file(tmp_path):
    studies = tagged(world())
    first = snapshot.write_snapshot(tmp_path / "first.json.gz", studies)
    C.write_claims_report(tmp_path / "r", runs_files=[first], use_store=False)
    rng = np.random.default_rng(5)
    ens = tagged({"rm_ensemble": [
        policy(k, {"sweep.reward_model.ensemble": e, "sweep.reward_model.conservative_lambda": lam}, 0.5, rng)
        for k in range(5) for e, lam in ((3, 1.0), (3, 0.0), (1, 0.0))]})
    new = snapshot.write_snapshot(tmp_path / "new.json.gz", ens)
    text = C.write_claims_report(tmp_path / "r", runs_files=[new], use_store=False, only=["C18"]).read_text()
    kept, _ = snapshot.read_snapshot(tmp_path / "r" / snapshot.FILE_NAME)
    assert len(kept["ppo_beta_grid"]) == len(studies["ppo_beta_grid"])  # C1's runs are still there
    assert {r.run_id for r in kept["rm_ensemble"]} == {r.run_id for r in studies["rm_ensemble"] + ens["rm_ensemble"]}
    assert f"from {C.KEPT_SOURCE}." in text  # the file that keeps every run read, not the files it was given


def test_every_committed_study_report_whose_runs_are_kept_comes_out_of_the_runs_file_to_the_letter(tmp_path):
    """A committed reports/<study>/README.md whose runs (its "## Runs" table) are all in reports/claims_runs.json.gz
    is regenerated from that file alone, byte for byte but for its last line (where the runs were read)."""
    import re
    from pathlib import Path

    from functools import partial

    from rlhf_lab_research.report import STUDY_REPORTS
    from rlhf_lab.analysis.study_report import write_study_report

    root = Path(__file__).resolve().parents[1] / "reports"
    kept, _ = snapshot.read_snapshot(root / snapshot.FILE_NAME)
    ids = {r.run_id for rs in kept.values() for r in rs}
    covered = []
    for readme in sorted(root.glob("*/README.md")):
        text = readme.read_text()
        runs = re.findall(r"^\| `([0-9a-f]{32})` \|", text.split("## Runs", 1)[-1], re.M)
        own = readme.parent / "runs.json.gz"  # a study report's own runs file (study.write_runs_file)
        files = [root / snapshot.FILE_NAME, *([own] if own.is_file() else [])]
        have = ids | ({r.run_id for rs in snapshot.read_snapshot(own)[0].values() for r in rs} if own.is_file() else set())
        if "## Runs" not in text or not runs or not set(runs) <= have:
            continue
        study = readme.parent.name
        write = STUDY_REPORTS.get(study, partial(write_study_report, study))  # some have their own reports
        again = write(tmp_path, runs_files=files, use_store=False)
        old, new = text.rstrip("\n").split("\n"), again.read_text().rstrip("\n").split("\n")
        assert old[:-1] == new[:-1], study
        assert new[-1].startswith("Runs read from `") and f"generated by `rlhf-lab-report {study} --no-store --runs" \
            in new[-1], new[-1]
        covered.append(study)
    # the studies whose runs the committed file keeps (issue 25): their reports must stay recomputable
    assert {"gao_rm_scaling", "dpo_beta_grid_5seeds", "rm_normalize_5rms", "clip_eps", "critic_baseline",
            "length_penalty", "ref_small", "rm_size_hacking_beta0", "rm_ensemble",
            "rm_size_vs_policy_size_5seeds", "ref_size", "rm_source_matched", "rm_source_5rms",
            "rm_size_vs_policy_size_5rms", "rm_ensemble_5rms", "rm_mis_scoring", "algo_frontier",
            "gold_rm_validation", "gold_recipes", "gao_rm_scaling_gold"} <= set(covered), covered
    # and every committed study report is one of them: none rests on runs that only lived in a lost store (but the
    # hacking alarm's, over many studies' runs files, which tests/test_hacking_alarm_report.py regenerates)
    assert sorted(covered) == sorted(r.parent.name for r in root.glob("*/README.md")
                                     if r.parent.name != "hacking_alarm"), covered


def test_rlhf_lab_report_reaches_every_research_reports_own_writer(tmp_path):
    """`rlhf-lab-report <study>` hands a research study to its own writer only through an entry point of the group
    ``rlhf_lab.reports`` (pyproject.toml; rlhf_lab never imports the research package): every study of STUDY_REPORTS
    has one. Three lacked it, and the documented command wrote the generic study report over theirs."""
    import tomllib
    from pathlib import Path

    from rlhf_lab.entry import report
    from rlhf_lab_research.report import STUDY_REPORTS

    root = Path(__file__).resolve().parents[1]
    group = tomllib.loads((root / "pyproject.toml").read_text())["project"]["entry-points"]["rlhf_lab.reports"]
    assert set(STUDY_REPORTS) | {"claims"} <= set(group), set(STUDY_REPORTS) - set(group)
    assert set(group.values()) == {"rlhf_lab_research.report:main"}
    runs = root / "reports" / "gold_rm_replication" / "runs.json.gz"
    assert report.main(["gold_rm_replication", "--no-store", "--runs", str(runs), "--out", str(tmp_path)]) == 0
    text = (tmp_path / "gold_rm_replication" / "README.md").read_text()
    assert text.startswith("# Study `gold_rm_replication`: the gold RM validated with the gold replicated")


def test_a_study_report_from_a_runs_file_on_the_command_line(tmp_path, capsys):
    studies = tagged(world())
    f = snapshot.write_snapshot(tmp_path / "r.json.gz", studies)
    assert cli.main(["clip_eps", "--no-store", "--runs", str(f), "--out", str(tmp_path / "o")]) == 0
    text = (tmp_path / "o" / "clip_eps" / "README.md").read_text()
    assert "15 finished runs (ppo); seeds 0, 1, 2, 3, 4" in text and f"Runs read from `{f}`" in text
    assert cli.main(["ref_sync", "--no-store", "--runs", str(f), "--out", str(tmp_path / "o")]) == 0
    assert "15 finished runs" in (tmp_path / "o" / "ref_sync" / "README.md").read_text()
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(b"not gzip")
    assert cli.main(["clip_eps", "--no-store", "--runs", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "not a readable runs file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["clip_eps", "--only", "C12"])


def test_a_job_run_again_replaces_its_earlier_run_instead_of_joining_it():
    """A study rerun on a fresh machine (or by other code) beside the runs kept in a file: of each job (study, stage,
    setting, seed) only the newest FINISHED run counts, so a unit is never the mean of two code versions' runs."""
    def run(seed, gold, start, beta="0.1", status="FINISHED", shown="False"):
        overrides = f"kl.beta={beta} seed={seed} sweep=grid skip_finished=True trainer.progress_bar={shown}"
        return RunData(f"r{seed}_{start}", "ppo", status, {}, {"rlhf_lab.study": "grid", "rlhf_lab.overrides": overrides},
                       {"eval/gold_reward": gold}, {"eval/gold_reward": [(k, gold) for k in range(0, 70, 10)]},
                       setting={"kl.beta": beta}, seed=str(seed), start_time=start)

    old = [run(s, 0.1, 1000 + s) for s in range(3)]
    new = [run(s, 0.9, 2000 + s, shown="True") for s in range(2)]  # the progress bar makes no other job
    failed = run(2, 5.0, 3000, status="FAILED")
    kept = snapshot.newest_per_job([*old, *new, failed], lambda r: r.status == "FINISHED")
    assert {(r.seed, r.metrics["eval/gold_reward"]) for r in kept if r.status == "FINISHED"} == {
        ("0", 0.9), ("1", 0.9), ("2", 0.1)}  # seed 2 was not rerun: its only run stays
    assert failed in kept  # a run that does not count is left as it is
    other = run(0, 0.3, 500, beta="1")
    assert other in snapshot.newest_per_job([*old, other])  # another setting is another job
    unknown = RunData("u", "ppo", "FINISHED", {}, {}, {}, seed="0")
    assert unknown in snapshot.newest_per_job([*new, unknown])  # no overrides tag: never taken for another run
    counting, present = C.counted({"ppo_beta_grid": [*old, *new]})
    assert len(counting["ppo_beta_grid"]) == 3 and present["ppo_beta_grid"] == 5


def rewritten(path, change) -> None:
    """The runs file at `path` with its payload changed by `change(payload)` and its digest made to match again: a file
    of the right format and digest, but not of the layout the reports read."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    change(doc["payload"])
    doc["sha256"] = snapshot.digest(doc["payload"])
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))


def first_run(payload) -> dict:
    return payload["studies"]["ppo_beta_grid"]["runs"][0]


@pytest.mark.parametrize("change, problem", [
    (lambda p: p.update(studies=[]), "studies is list, not a dict of studies"),
    (lambda p: p["studies"].update(ppo_beta_grid=[1]), "studies.ppo_beta_grid is list, not a dict with runs and commands"),
    (lambda p: p["studies"]["ppo_beta_grid"].update(runs={}), "studies.ppo_beta_grid.runs is dict, not a list"),
    (lambda p: p["studies"]["ppo_beta_grid"].update(commands=[3]), "studies.ppo_beta_grid.commands is not a list of strings"),
    (lambda p: p["studies"]["ppo_beta_grid"]["runs"].insert(0, "r1"), "studies.ppo_beta_grid.runs[0] is str, not a run"),
    (lambda p: first_run(p).pop("run_id"), "studies.ppo_beta_grid.runs[0] lacks run_id"),
    (lambda p: first_run(p).update(metrics=[1.0]), "studies.ppo_beta_grid.runs[0].metrics is not a dict of numbers (list)"),
    (lambda p: first_run(p)["metrics"].update(x="1"), "studies.ppo_beta_grid.runs[0].metrics is not a dict of numbers"),
    (lambda p: first_run(p)["history"].update(x=[[1]]), "studies.ppo_beta_grid.runs[0].history is not a dict of [[step, "
                                                        "value], ...] lists (dict)"),
    (lambda p: first_run(p).update(setting=None), "studies.ppo_beta_grid.runs[0].setting is not a dict (null)"),
    (lambda p: first_run(p).update(rm={"metrics": []}), "studies.ppo_beta_grid.runs[0].rm is not a dict (metrics: numbers"),
    (lambda p: first_run(p).update(start_time="9"), "studies.ppo_beta_grid.runs[0].start_time is not an integer (str)"),
])
def test_a_runs_file_of_the_wrong_layout_is_one_line_naming_the_file_and_the_place(tmp_path, capsys, change, problem):
    """A valid digest over runs of another layout crashed the reports (TypeError, AttributeError) or gave wrong
    figures later: refused like a corrupted file, one line, exit 2 (rlhf-lab-report) before any report is written."""
    path = snapshot.write_snapshot(tmp_path / "r.json.gz", tagged(world()))
    rewritten(path, change)
    with pytest.raises(snapshot.SnapshotError) as exc:
        snapshot.read_snapshot(path)
    assert str(exc.value).startswith(f"{path}: {problem}") and "\n" not in str(exc.value)
    assert "regenerate it" in str(exc.value)
    for args in (["--claims"], ["clip_eps"]):
        assert cli.main([*args, "--no-store", "--runs", str(path), "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"rlhf-lab-report: {path}: {problem}"), err
    assert not [f for f in (tmp_path / "o").rglob("*") if f.is_file()]  # nothing written


def test_the_suite_refuses_a_bad_runs_file_before_it_runs_a_study(tmp_path, capsys, monkeypatch):
    from rlhf_lab_research import suite

    path = snapshot.write_snapshot(tmp_path / "r.json.gz", tagged(world()))
    rewritten(path, lambda p: first_run(p).pop("stage"))

    def never(*args, **kwargs):
        raise AssertionError("a study ran")

    monkeypatch.setattr(suite, "run", never)
    assert suite.main(["--studies", "clip_eps", "--runs", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"rlhf-lab-suite: {path}: studies.ppo_beta_grid.runs[0] lacks stage: not a runs file this version " \
                  "reads (its digest matches: it was written so); regenerate it (rlhf-lab-report --claims on a store) " \
                  "or restore it from git\n"


def test_a_runs_file_too_large_or_too_deep_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    """A 3 MB gzip that decompressed to 3 GB ended in a MemoryError, a deeply nested one in a RecursionError (exit 1,
    tracebacks): each is refused on one line, exit 2, by rlhf-lab-report (--claims and a study) and rlhf-lab-suite,
    the large one read no further than the limit. The limit is patched small here: a real runs file over it."""
    from rlhf_lab_research import suite

    studies = tagged(world())
    large = snapshot.write_snapshot(tmp_path / "large.json.gz", studies)
    size = len(gzip.decompress(large.read_bytes()))
    nested = tmp_path / "nested.json.gz"
    nested.write_bytes(gzip.compress(b"[" * 100_000 + b"]" * 100_000))
    monkeypatch.setattr(snapshot, "MAX_JSON_BYTES", size - 1, raising=False)
    monkeypatch.setattr(suite, "run", lambda *a, **k: pytest.fail("a study ran"))
    for path, says in ((large, f"decompresses to more than {(size - 1) // 2**20} MiB of JSON"),
                       (nested, "JSON nested deeper than")):
        snapshot.checked_payload.cache_clear()
        with pytest.raises(snapshot.SnapshotError, match=says):
            snapshot.read_snapshot(path)
        for main, args in ((cli.main, ["--claims"]), (cli.main, ["clip_eps"]), (suite.main, ["--studies", "clip_eps"])):
            extra = ["--no-store", "--out", str(tmp_path / "o")] if main is cli.main else []
            assert main([*args, *extra, "--runs", str(path)]) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and f": {path}: " in err and says in err, err
    monkeypatch.setattr(snapshot, "MAX_JSON_BYTES", size, raising=False)
    snapshot.checked_payload.cache_clear()
    assert snapshot.read_snapshot(large)[0] == studies  # at the limit: read


MACHINE_PATH = r"(?<![\w.~-])/(?:work|tmp|home|root|Users|private|var|mnt|srv|scratch)/"


def test_no_committed_report_names_a_folder_of_the_machine_it_was_made_on():
    """Every committed report (reports/**/*.md) names only the repository's files: no store, artifact or output folder
    of the machine that wrote it (claims.md once named `sqlite:////tmp/store.db`, two study reports' reproduce
    commands a suite folder under /work)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "reports"
    found = [f"{f.relative_to(root)}:{i}: {line[:160]}" for f in sorted(root.rglob("*.md"))
             for i, line in enumerate(f.read_text().splitlines(), 1) if re.search(MACHINE_PATH, line)]
    assert not found, "\n".join(found)


def test_a_command_names_the_suites_prepared_artifact_relative_to_the_suite_folder():
    cmd = ("rlhf-lab -m sweep=rm_mis_scoring skip_finished=true "
           "data.on_policy_path=/work/suite/repo/suite_artifacts/rm_mis_scoring_on_policy/artifact seed=5")
    assert snapshot.portable_command(cmd) == ("rlhf-lab -m sweep=rm_mis_scoring skip_finished=true "
                                              "data.on_policy_path=suite_artifacts/rm_mis_scoring_on_policy/artifact seed=5")
    assert snapshot.portable_command("rlhf-lab -m sweep=x data.path=/data/pairs.jsonl") == (
        "rlhf-lab -m sweep=x data.path=/data/pairs.jsonl")  # a user's own data path is theirs to keep
    assert snapshot.portable_command("rlhf-lab -m sweep=x cache_dir=/work/x/.cache tracking.uri=sqlite:////w/s.db "
                                     "seed=1") == "rlhf-lab -m sweep=x seed=1"  # where that machine kept things
