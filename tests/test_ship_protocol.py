"""The ship rules' freeze and prospective studies (issue 67, reports/ship/PROTOCOL.md): the frozen files match their
last record in reports/ship/FROZEN.md, and every arm of each prospective study composes alike but for its factor."""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from rlhf_lab.config.keys import computes
from rlhf_lab.evaluation import alarm, ship
from rlhf_lab_research.freeze import file_digest

ROOT = Path(__file__).resolve().parents[1]
FROZEN = ROOT / "reports" / "ship" / "FROZEN.md"
FROZEN_FILES = ("rlhf_lab/evaluation/ship.py", "reports/ship/rules.json")
# study: the config keys its factors set (a key below one of these prefixes may differ between two arms of one seed)
STUDIES = {"ship_labeler": ("labeler.", "kl."), "ship_critic_free": ("algo.", "kl."), "ship_ensemble": ("kl.",)}
SEED_KEYS = {"seed", "reward_model.seed"}  # what differs between two seeds of one arm
DESIGN_MAX_SEED = 302  # the largest seed of a design run (reports/ship/design.md's runs): the test's seeds are above


def records() -> list[dict]:
    """The rows of FROZEN.md's record table: {commit, ship.py, rules.json} (sha256 digests), in order."""
    rows = []
    for line in FROZEN.read_text(encoding="utf-8").splitlines():
        m = re.match(r"\|\s*\d+\s*\|[^|]*\|\s*`([0-9a-f]{40})`\s*\|\s*`([0-9a-f]{64})`\s*\|\s*`([0-9a-f]{64})`\s*\|", line)
        if m:
            rows.append({"commit": m[1], FROZEN_FILES[0]: m[2], FROZEN_FILES[1]: m[3]})
    return rows


sha256 = file_digest  # the freeze records' digest (rlhf_lab_research/freeze.py, shared with PREREGISTERED.md)


def test_the_frozen_files_match_their_last_record():
    """A change to ship.py or rules.json needs a new FROZEN.md record (and, by the protocol, a new test set)."""
    last = records()[-1]
    for f in FROZEN_FILES:
        assert sha256(ROOT / f) == last[f], f"{f} changed since its last freeze: add a record to {FROZEN} (PROTOCOL.md)"
    rules = json.loads((ROOT / FROZEN_FILES[1]).read_text())
    assert set(rules["rules"]) == set(ship.SHIP_RULES)
    # the alarm rule reads rlhf_lab.evaluation.alarm.RULE: frozen with its numbers
    assert rules["alarm_rule"] == {"mean": list(alarm.RULE.mean), "scale": list(alarm.RULE.scale),
                                   "weights": list(alarm.RULE.weights), "bias": alarm.RULE.bias,
                                   "threshold": alarm.RULE.threshold}
    assert rules["rules"]["alarm"] == {"threshold": alarm.RULE.threshold}


def test_each_record_names_the_commit_whose_files_it_digests():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    for rec in records():
        for f in FROZEN_FILES:
            text = subprocess.run(["git", "show", f"{rec['commit']}:{f}"], cwd=ROOT, capture_output=True, check=True)
            assert hashlib.sha256(text.stdout).hexdigest() == rec[f], (rec["commit"], f)


def sweep_params(study: str) -> dict[str, list[str]]:
    """The study file's swept keys and their values (``a,b,c`` or ``range(a,b)``)."""
    text = (ROOT / "sweeps" / "sweep" / f"{study}.yaml").read_text()
    out = {}
    for key, value in yaml.safe_load(text)["hydra"]["sweeper"]["params"].items():
        m = re.fullmatch(r"range\((\d+),\s*(\d+)\)", str(value))
        out[key] = [str(v) for v in range(int(m[1]), int(m[2]))] if m else str(value).split(",")
    return out


def flat(cfg) -> dict:
    from omegaconf import OmegaConf

    def walk(node, prefix=""):
        for k, v in node.items():
            yield from walk(v, f"{prefix}{k}.") if isinstance(v, dict) else [(f"{prefix}{k}", v)]
    return dict(walk(OmegaConf.to_container(cfg, resolve=True)))


def composer():
    """compose(overrides) in one Hydra context for the whole test (tests.conftest.compose_cfg starts one a call)."""
    from hydra import compose, initialize_config_module

    ctx = initialize_config_module("rlhf_lab.conf", version_base="1.3")
    ctx.__enter__()
    return (lambda overrides: compose("config", overrides=overrides)), ctx


def differing(a: dict, b: dict) -> set[str]:
    return {k for k in set(a) | set(b) if a.get(k) != b.get(k) and computes(k) and k != "study"}


@pytest.mark.parametrize("study", sorted(STUDIES))
def test_prospective_study_arms_differ_only_in_their_factor(study):
    params = sweep_params(study)
    seeds = params.pop("seed")
    assert min(int(s) for s in seeds) > DESIGN_MAX_SEED and len(seeds) >= 10
    arms = [dict(zip(params, values)) for values in itertools.product(*params.values())]
    compose_cfg, ctx = composer()
    try:
        check_arms(study, arms, seeds, compose_cfg)
    finally:
        ctx.__exit__(None, None, None)


def check_arms(study, arms, seeds, compose_cfg):
    cfgs = {tuple(arm.items()): compose_cfg([f"sweep={study}", *(f"{k}={v}" for k, v in arm.items()),
                                            f"seed={seeds[0]}"]) for arm in arms}
    flats = {arm: flat(c) for arm, c in cfgs.items()}
    for c in cfgs.values():
        assert c.study == study and c.algo.steps <= 150 and c.algo.name in ("ppo", "grpo", "rloo")
        # the ship signals and the test gold at every evaluation: what the frozen rules and the regret read
        assert c.eval.test_each_eval and c.eval.save_checkpoints and c.reward_model.heldout
        assert c.reward_model.seed == c.seed
    for a, b in itertools.combinations(flats, 2):
        keys = differing(flats[a], flats[b])
        assert keys and all(k.startswith(STUDIES[study]) for k in keys), (a, b, keys)
    arm = arms[0]
    other = flat(compose_cfg([f"sweep={study}", *(f"{k}={v}" for k, v in arm.items()), f"seed={seeds[1]}"]))
    assert differing(flats[tuple(arm.items())], other) == SEED_KEYS


def test_the_prospective_studies_hold_the_protocols_runs():
    n, algos, labelers = 0, set(), set()
    for study in STUDIES:
        params = sweep_params(study)
        n += len(list(itertools.product(*params.values())))
        algos |= set(params.get("algo", ["ppo"]))
        labelers |= set(params.get("labeler", []))
    assert n >= 100 and {"grpo", "rloo"} <= algos
    # the design runs' labelers were unbiased and length_biased only: sycophantic is a new world setting
    assert {"unbiased", "length_biased", "sycophantic"} <= labelers
    assert all(s in (ROOT / "reports" / "ship" / "PROTOCOL.md").read_text() for s in STUDIES)
