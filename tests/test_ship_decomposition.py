"""The decomposition of the gold lost into the proxy's errors and the labeler's bias (issue 67, item 3;
rlhf_lab_research/ship_decomposition.py), on made-up runs whose parts can be computed by hand."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from rlhf_lab.analysis.study_runs import RunData
from rlhf_lab.analysis.snapshot import write_snapshot
from rlhf_lab.evaluation.ship import Curve
from rlhf_lab_research import ship_decomposition as X
from rlhf_lab_research.ship_design import cluster_weights
from rlhf_lab_research.ship_test import ProspectiveRun

ROOT = Path(__file__).resolve().parents[1]
RULES = json.loads((ROOT / "reports/ship/rules.json").read_text())["rules"]
SELECT, MEASURE = [0.0, 0.5, 0.4, 0.3], [0.0, 0.6, 0.5, 0.4]  # the gold peaks at index 1 (eval and test prompts)
TRACKS_GOLD, TRACKS_PROXY = [0.0, 0.5, 0.4, 0.3], [0.0, 0.1, 0.2, 0.3]  # a held-out RM following one or the other


def run(labeler: str, seed: str, heldout, regime: str = "β = 0", study: str = X.LABELER_STUDY) -> ProspectiveRun:
    """A run whose proxy rises all along (its optimum is the last checkpoint: T = 0.6 − 0.4 = 0.2)."""
    curve = Curve((0, 10, 20, 30), (0.0, 1.0, 2.0, 3.0), (0.0, 1.0, 4.0, 9.0), heldout_reward=tuple(heldout),
                  entropy=(2.0,) * 4, length=(5.0,) * 4)
    return ProspectiveRun(study, f"{labeler}-{regime}-{seed}", seed, "ppo", labeler, regime, curve, np.array(SELECT),
                          np.array(MEASURE))


def world(biased_heldout, seeds=("1000", "1001", "1002")) -> list[ProspectiveRun]:
    """The unbiased labeler's runs (the held-out RM follows the gold) and the length-biased one's (`biased_heldout`)."""
    return [run("unbiased", s, TRACKS_GOLD) for s in seeds] + [run("length_biased", s, biased_heldout) for s in seeds]


def split(runs, labeler):
    total = X.scored(runs, X.REFERENCE, {})[1]
    heldout = X.scored(runs, X.HELDOUT, {})[1]
    weights = cluster_weights([X.LABELER_STUDY] * len(runs), [d.seed for d in runs], n_boot=200, seed=0)
    return X.decompose(total, heldout, [d.labeler for d in runs], labeler, np.ones(len(runs), dtype=bool), weights)


def test_under_the_unbiased_labeler_the_held_out_rm_recovers_everything_and_the_bias_part_is_zero():
    s = split(world(TRACKS_PROXY), "unbiased")
    # T = 0.6 − 0.4 at the proxy's optimum (the last); H = 0: the held-out RM ships the gold's best (index 1)
    assert s.total.point == pytest.approx(0.2) and s.heldout.point == pytest.approx(0.0)
    assert s.error.point == pytest.approx(0.2) and s.floor.point == pytest.approx(0.0)
    assert s.bias.point == 0.0 and (s.bias.boot == 0).all()  # zero by construction, not by estimate
    assert s.error.text() == "0.200 [0.200, 0.200]" and s.error.sign() == "above 0"


def test_a_held_out_rm_that_tracks_the_proxy_under_a_biased_labeler_leaves_it_all_to_the_bias():
    s = split(world(TRACKS_PROXY), "length_biased")
    # the held-out RM rises with the proxy: it ships the last checkpoint too, H = T = 0.2; nothing recovered
    assert s.total.point == pytest.approx(0.2) and s.heldout.point == pytest.approx(0.2)
    assert s.error.point == pytest.approx(0.0) and s.error.sign() == "not distinguishable from 0"
    assert s.bias.point == pytest.approx(0.2) and s.bias.sign() == "above 0"
    assert s.total.point == pytest.approx(s.error.point + s.floor.point + s.bias.point)


def test_a_partly_blind_held_out_rm_splits_the_loss_in_two():
    # the held-out RM peaks at index 2: H = 0.6 − 0.5 = 0.1, so E = 0.1 and B = 0.1 − 0 = 0.1
    s = split(world([0.0, 0.1, 0.3, 0.2]), "length_biased")
    assert (s.error.point, s.bias.point) == pytest.approx((0.1, 0.1))
    assert s.total.point == pytest.approx(s.error.point + s.floor.point + s.bias.point)


def test_the_bias_part_is_measured_against_the_unbiased_floor_and_paired_by_seed():
    # the unbiased labeler's held-out RM is itself wrong in seed 1001 (it ships the last: H = 0.2): the floor is
    # 0.2/3, and the biased labeler's H = 0.2 in every seed gives B = 0.2 − 0.2/3
    runs = [run("unbiased", "1000", TRACKS_GOLD), run("unbiased", "1001", TRACKS_PROXY),
            run("unbiased", "1002", TRACKS_GOLD)] + [run("length_biased", s, TRACKS_PROXY)
                                                      for s in ("1000", "1001", "1002")]
    s = split(runs, "length_biased")
    assert s.floor.point == pytest.approx(0.2 / 3) and s.bias.point == pytest.approx(0.2 - 0.2 / 3)
    # a resample holding seed 1001 three times has B = 0 exactly (paired: both labelers' copies of it come together)
    assert np.nanmin(s.bias.boot) == pytest.approx(0.0) and np.nanmax(s.bias.boot) == pytest.approx(0.2)


def test_group_means_keep_the_resamples_that_drew_no_run_of_the_group_as_nan():
    weights = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    part = X.group_mean(np.array([1.0, 3.0]), np.array([True, True]), weights)
    assert part.point == 2.0 and part.boot.tolist() == [1.0, 3.0, 2.0]
    only_first = X.group_mean(np.array([1.0, 3.0]), np.array([True, False]), weights)
    assert only_first.boot[0] == 1.0 and np.isnan(only_first.boot[1])
    assert np.isnan(X.group_mean(np.array([np.nan, 3.0]), np.array([True, False]), weights).point)


def test_divergence_shows_which_signal_follows_the_gold():
    assert X.divergence(run("unbiased", "1", TRACKS_GOLD)) == pytest.approx((0.2, 1.0, 0.2))
    # ranks of the test gold 1, 4, 3, 2 against a rising series: ρ = 1 − 6·8/(4·15) = 0.2
    assert X.divergence(run("length_biased", "1", TRACKS_PROXY)) == pytest.approx((0.2, 0.2, 1.0))
    assert np.isnan(X.spearman([1, 1, 1], [0, 1, 2])) and np.isnan(X.spearman([0, 1], [0, 1]))


def runs_file(path: Path) -> Path:
    """A runs file of both test studies: the two labelers as in :func:`world` (β = 0 and β = 0.01), an ensemble run,
    and a run that does not enter."""
    steps = [0, 10, 20, 30]

    def rd(run_id, labeler, seed, heldout, beta="0", ensemble_std=None):
        hist = {"eval/kl": [0, 1, 4, 9], "eval/entropy": [2] * 4, "eval/length": [5] * 4,
                "eval/gold_reward": SELECT, "test/gold_reward": MEASURE, "eval/heldout_reward": heldout}
        if ensemble_std is not None:
            hist["eval/proxy_ensemble_std"] = ensemble_std
        history = {k: [(s, float(v)) for s, v in zip(steps, vals)] for k, vals in hist.items()}
        history["objective/scores"] = [(s, float(s) / 10) for s in range(1, 31)]
        return RunData(run_id, "ppo", "FINISHED", {"labeler.name": labeler, "kl.name": "fixed", "kl.beta": beta},
                       {}, {}, history, seed=seed)
    labeler = [rd(f"{lab}-{beta}-{s}", lab, s, held, beta) for lab, held in (("unbiased", TRACKS_GOLD),
               ("length_biased", TRACKS_PROXY)) for beta in ("0", "0.01") for s in ("1000", "1001")]
    failed = RunData("x", "ppo", "FAILED", {"labeler.name": "unbiased"}, {}, {}, {}, seed="1000")
    # the ensemble's spread grows after the gold's peak: mean − spread is best at index 1 (0.2 recovered)
    ensemble = [rd(f"e-{s}", "length_biased", s, TRACKS_PROXY, ensemble_std=[0, 0, 5, 10]) for s in ("1000", "1001")]
    return write_snapshot(path, {X.LABELER_STUDY: [*labeler, failed], X.ENSEMBLE_STUDY: ensemble})


def test_the_report_from_a_runs_file_says_what_each_rule_can_catch_and_regenerates(tmp_path, capsys):
    f = str(runs_file(tmp_path / "runs.json.gz"))
    out = tmp_path / "decomposition.md"
    argv = ["--runs", f, "--rules", str(ROOT / "reports/ship/rules.json"), "--out", str(out)]
    X.main(argv)
    text = out.read_text()
    assert f"python -m rlhf_lab_research.ship_decomposition --runs {f}" in text
    assert "| `heldout_max` | an RM of other pairs | yes, where an RM of other pairs disagrees | no: it learned" in text
    # pooled over both β: the unbiased labeler's error part 0.2, none left; the biased one's bias part 0.2
    assert "| `unbiased` | all | 4 | 0.200 [0.200, 0.200] | 0.000 [0.000, 0.000] | 0.200 [0.200, 0.200] |" in text
    assert ("| `length_biased` | β = 0 | 2 | 0.200 [0.200, 0.200] | 0.200 [0.200, 0.200] | 0.000 [0.000, 0.000] | "
            "0.000 [0.000, 0.000] | 0.200 [0.200, 0.200] |") in text
    assert "bias part 0.200 [0.200, 0.200] (above 0)" in text
    assert "recovered by the ensemble's disagreement 0.200 [0.200, 0.200] (above 0)" in text
    assert "Left out: status FAILED (ship_labeler: 1)." in text
    X.main(argv)
    assert out.read_text() == text  # the same runs file gives the same bytes


def test_a_missing_runs_file_is_one_line_and_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        X.main(["--runs", str(tmp_path / "none.json.gz"), "--out", str(tmp_path / "d.md")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "ship_test --store" in err


def test_a_study_without_runs_says_so():
    text = X.report([], Counter(), {"proxy_max": {}, "heldout_max": {}}, ["f"])
    assert "No run of `ship_labeler` entered" in text and "not measured" in text


def test_the_committed_test_and_decomposition_reports_regenerate_from_their_runs_file(tmp_path, monkeypatch):
    """reports/ship/test.md and decomposition.md are what their commands write from the committed runs file of the
    prospective runs (a fresh clone's `python -m rlhf_lab_research.ship_test --runs reports/ship/test_runs.json.gz`
    and `python -m rlhf_lab_research.ship_decomposition --runs ...`), byte for byte."""
    from rlhf_lab_research import ship_decomposition, ship_test

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)  # the reports name the runs file by its path in the repository
    runs = "reports/ship/test_runs.json.gz"
    ship_test.main(["--runs", runs, "--out", str(tmp_path / "test.md")])
    ship_decomposition.main(["--runs", runs, "--out", str(tmp_path / "decomposition.md")])
    for name in ("test.md", "decomposition.md"):
        assert (tmp_path / name).read_text() == (root / "reports" / "ship" / name).read_text(), name
