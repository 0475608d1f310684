"""The claims report's rule of which run of a job counts and its list of the superseded runs
(rlhf_lab_research/superseded.py): the newest counted run of a job is kept, the others listed with what their
recorded identities say differs."""

from __future__ import annotations

import numpy as np

from rlhf_lab_research import superseded as S
from tests.test_claims import policy

OVERRIDES = "+ppo_kl=fixed_0 seed=0 sweep=kl_controller"


def _run(rng, start: int, commit: str, sft_key: str, gold: float, params: dict | None = None, status="FINISHED"):
    r = policy(0, {}, gold, rng)
    r.params = {"sft": f"/machine/.rlhf_lab_cache/sft/{sft_key}", **(params or {})}
    r.tags = {"rlhf_lab.study": "kl_controller", "rlhf_lab.overrides": OVERRIDES, "rlhf_lab.git_commit": commit,
              "rlhf_lab.upstream.rm": "rm1"}
    r.start_time, r.status = start, status
    return r


def test_the_newest_counted_run_of_a_job_is_kept_and_the_older_listed_with_what_differs():
    rng = np.random.default_rng(0)
    old = _run(rng, 1_000, "aaaaaaa111", "4d1e08b2aaaa", 0.6, {"n_train_pairs": "3997"})
    new = _run(rng, 2_000, "bbbbbbb222", "1c2db27baaaa", 0.9, {"n_train_pairs": "3998", "algo.compile": "False"})
    failed = _run(rng, 3_000, "ccccccc333", "1c2db27baaaa", 0.1, status="FAILED")  # does not count: replaces nothing
    rows = S.superseded_runs({"kl_controller": [old, new, failed]})
    assert [(s.old.run_id, s.kept.run_id) for s in rows] == [(old.run_id, new.run_id)]
    why = S.differences(old, new)
    assert why[0] == "commit aaaaaaa → bbbbbbb"
    assert "another `sft` artifact (cache key 4d1e08b2 → 1c2db27b" in why[1]  # the key, not the machine's folder
    assert "logged n_train_pairs 3997 → 3998" in why and "1 options the earlier code did not have (algo.compile)" in why
    same = _run(rng, 4_000, "aaaaaaa111", "4d1e08b2aaaa", 0.6, {"n_train_pairs": "3997"})
    assert S.differences(old, same) == ["nothing recorded differs (the same commit, artifacts and config: "
                                        "nondeterminism)"]


def test_the_section_lists_each_superseded_run_with_both_figures_and_the_rule_counts_them():
    rng = np.random.default_rng(1)
    old = _run(rng, 1_000, "aaaaaaa111", "k1", 0.6)
    new = _run(rng, 2_000, "bbbbbbb222", "k2", 0.9)
    rows = S.superseded_runs({"kl_controller": [new, old]})
    text = "\n".join(S.superseded_section(rows))
    line = next(x for x in text.splitlines() if x.startswith("| `kl_controller`"))
    assert f"`{old.run_id[:8]}` (aaaaaaa)" in line and f"`{new.run_id[:8]}` (bbbbbbb)" in line
    assert "`ppo_kl=fixed_0 seed=0`" in line and S.figure(old) in line and S.figure(new) in line
    assert "- `kl_controller`: 1 run at aaaaaaa, replaced by runs at bbbbbbb; 1 of 1 started from another" in text
    assert "(1 runs of 1 studies)" in S.rule_text(len(rows), 1)
    assert "No run of a counted job was replaced" in "\n".join(S.superseded_section([]))
