"""The job summary is true on any data (issue 68): every held-out figure with its n and a warning below 10, no
``± nan``, no line about the built-in world (gold, filler phrases) on a user's data, and on the default job one
hacking line that says whether the gold confirms the gold-free alarm instead of two lines that contradict each
other. Pure functions and a synthetic job's metadata: nothing trains."""

from __future__ import annotations

from rlhf_lab.entry import run as cli
from rlhf_lab.evaluation.summary import GOLD_MARGIN, hacking_line
from rlhf_lab.stages.evaluate import gold_summary
from tests.conftest import compose_cfg


def user_data_meta(n_test: int, n_eval: int) -> dict:
    """What a PPO job on a user's JSONL logs at its end: proxy and text figures, a filler rate (computed everywhere),
    no gold metric; one test prompt has no SE (NaN)."""
    test = {"test/proxy_reward": 1.207, "test/proxy_reward_se": float("nan"), "test/kl": 0.006, "test/length": 6.0,
            "test/filler_rate": 0.0, "test/distinct_2": 0.0, "test/n_prompts": float(n_test)}
    ev = {"eval/proxy_reward": -0.772, "eval/proxy_reward_se": 0.573, "eval/kl": -0.012, "eval/length": 6.0,
          "eval/filler_rate": 0.0, "eval/distinct_2": 1.0, "eval/n_prompts": float(n_eval)}
    return {"run_id": "r1", "artifact": "/tmp/a", "test": test, "eval": ev, "test_start": dict(test),
            "summary": {**gold_summary(dict(test), test, "SFT", "PPO step 2"), "hacking alarm": "not raised"}}


def summary_lines(meta: dict, *overrides: str) -> list[str]:
    cfg = compose_cfg(["tracking.uri=sqlite:////tmp/none.db", *overrides])
    return cli.summary(cfg, meta, 1.0).splitlines()


def test_a_user_data_summary_states_n_and_has_no_gold_or_filler_line():
    lines = summary_lines(user_data_meta(1, 2), "data=jsonl", "data.path=x.jsonl")
    text = "\n".join(lines)
    assert "gold" not in text.lower() and "filler" not in text  # neither the world's gold nor its filler phrases
    assert "nan" not in text  # one prompt: no spread, never "± nan"
    test = next(ln for ln in lines if ln.startswith("  final test : "))
    assert test.endswith("(n=1 test prompt, no spread)") and "±" not in test
    ev = next(ln for ln in lines if ln.startswith("  final eval : "))
    assert "proxy_reward=-0.772 ± 0.573" in ev and ev.endswith("(n=2 eval prompts)")
    warnings = [ln for ln in lines if ln.startswith("  WARNING    : held-out figures on n=1 test prompt and "
                                                    "n=2 eval prompts (fewer than 10)")]
    assert len(warnings) == 1


def test_enough_held_out_prompts_no_warning_and_the_world_keeps_its_filler_rate():
    lines = summary_lines(user_data_meta(16, 32))  # data=world: the filler phrases are the world's own
    assert not any("WARNING" in ln for ln in lines)
    assert any(ln.startswith("  final test : ") and "filler_rate=" in ln and "(n=16 test prompts)" in ln
               for ln in lines)


def test_the_test_gold_line_states_n_and_is_absent_without_a_gold():
    assert gold_summary({}, {"test/proxy_reward": 1.0, "test/n_prompts": 4.0}, "SFT", "PPO step 2") == {}
    first = {"test/gold_reward": 0.1, "test/gold_reward_se": 0.02, "test/n_prompts": 16.0}
    last = {"test/gold_reward": 0.5, "test/gold_reward_se": 0.03, "test/n_prompts": 16.0}
    line = gold_summary(first, last, "SFT", "PPO step 200")["test gold"]
    assert line == "0.100 ± 0.020 -> 0.500 ± 0.030 (SFT -> PPO step 200; n=16 test prompts, ± SE)"
    one = {"test/gold_reward": 0.5, "test/gold_reward_se": float("nan"), "test/n_prompts": 1.0}
    assert gold_summary(one, one, "SFT", "PPO step 2")["test gold"] == (
        "0.500 -> 0.500 (SFT -> PPO step 2; n=1 test prompt, no spread)")


# the default job (issue 67, point 5): the gold-free alarm raised at step 80 while the gold still rose to its best at
# step 140 (0.884) and ended at 0.82
RISING = [(0, -0.1), (20, 0.3), (40, 0.5), (60, 0.62), (80, 0.7), (100, 0.8), (120, 0.86), (140, 0.884),
          (160, 0.85), (180, 0.83), (200, 0.82)]


def test_the_default_jobs_alarm_line_says_the_gold_does_not_confirm_it():
    line = hacking_line("raised at step 80 (score 0.31, threshold 0.20)", 80, RISING, 64, None, 10)
    assert "\n" not in line and line.startswith("raised at step 80 (score 0.31, threshold 0.20), n=10 evaluations; ")
    assert "not confirmed by gold: the gold's best came after the alarm" in line
    assert line.endswith("gold best 0.884 at step 140, final 0.820 at step 200 (n=64 eval prompts)")
    assert "no alarm" not in line


def test_the_alarm_line_after_the_gold_peak_is_confirmed_and_a_missed_fall_is_said():
    assert "; confirmed by gold; gold best 0.884 at step 140" in hacking_line("raised at step 180", 180, RISING)
    missed = hacking_line("not raised (highest score 0.10 at step 40; threshold 0.20)", None, RISING)
    assert f"the gold fell at least {GOLD_MARGIN:g} after its best, which the gold-free alarm missed" in missed
    flat = [(s, g) for s, g in RISING[:8]]  # the gold's best is its last evaluation
    agrees = hacking_line("not raised (highest score 0.10 at step 40; threshold 0.20)", None, flat)
    assert "the gold agrees, it did not fall after its best; gold best 0.884 at step 140, the last evaluation" in agrees
    small_fall = RISING[:8] + [(160, 0.87)]  # 0.014 below the best: noise, not a fall
    assert "not confirmed by gold: the gold did not fall after its best" in hacking_line("raised at step 150", 150,
                                                                                        small_fall)


def test_without_a_gold_the_alarm_line_is_the_alarms_alone_with_its_n():
    assert hacking_line("not raised (highest score 0.03 at step 2; threshold 0.20)", None, [], None, None, 2) == (
        "not raised (highest score 0.03 at step 2; threshold 0.20), n=2 evaluations")
