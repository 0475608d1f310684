"""The job summary is true on any data (issue 68): every held-out figure with its n and a warning below 10, no
``± nan``, no line about the built-in world (gold, filler phrases) on a user's data, and on the default job one ship
line (issue 67) with the gold's own best beside it and no alarm that contradicts it. Pure functions and a synthetic
job's metadata: nothing trains."""

from __future__ import annotations

from rlhf_lab.entry import run as cli
import re

from rlhf_lab.evaluation.ship_choice import FIGURES, OnlineShip, ship_line
from rlhf_lab.stages.evaluate import gold_summary
from tests.conftest import compose_cfg


def user_data_meta(n_test: int, n_eval: int) -> dict:
    """What a PPO job on a user's JSONL logs at its end: proxy and text figures, a filler rate (computed everywhere),
    no gold metric; one test prompt has no SE (NaN)."""
    test = {"test/proxy_reward": 1.207, "test/proxy_reward_se": float("nan"), "test/kl": 0.006, "test/length": 6.0,
            "test/filler_rate": 0.0, "test/distinct_2": 0.0, "test/n_prompts": float(n_test)}
    ev = {"eval/proxy_reward": -0.772, "eval/proxy_reward_se": 0.573, "eval/kl": -0.012, "eval/length": 6.0,
          "eval/filler_rate": 0.0, "eval/distinct_2": 1.0, "eval/n_prompts": float(n_eval)}
    choice = OnlineShip()
    choice.evaluation(0, 0.0)
    choice.train_step(1, 0.5)
    choice.evaluation(2, -0.012)
    return {"run_id": "r1", "artifact": "/tmp/a", "test": test, "eval": ev, "test_start": dict(test),
            "summary": {**gold_summary(dict(test), test, "SFT", "PPO step 2"),
                        "ship": ship_line(choice, "/tmp/a/ship")}}


def summary_lines(meta: dict, *overrides: str) -> list[str]:
    cfg = compose_cfg(["tracking.uri=sqlite:////tmp/none.db", *overrides])
    return cli.summary(cfg, meta, 1.0).splitlines()


def test_a_user_data_summary_states_n_and_has_no_gold_or_filler_line():
    lines = summary_lines(user_data_meta(1, 2), "data=jsonl", "data.path=x.jsonl")
    text = "\n".join(lines).replace(FIGURES.text(), "")  # the ship rule's figures, quoted, were measured with a gold
    assert "gold" not in text.lower() and "filler" not in text  # neither the world's gold nor its filler phrases
    assert "n=2 evaluations" in text  # the ship line's n
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


# the default job (issue 67, point 5): the alarm was raised at step 80 while the gold still rose to its best at step 140
# (0.884) and ended at 0.82; the proxy of the training batches rises throughout and the KL with it
RISING = [(0, -0.1), (20, 0.3), (40, 0.5), (60, 0.62), (80, 0.7), (100, 0.8), (120, 0.86), (140, 0.884),
          (160, 0.85), (180, 0.83), (200, 0.82)]
PROXY = [0.0, 0.4, 0.7, 0.9, 1.05, 1.15, 1.22, 1.28, 1.32, 1.35, 1.37]
KL = [0.0, 0.3, 0.8, 1.4, 2.0, 2.5, 3.0, 3.4, 3.7, 3.9, 4.0]


def online_choice() -> OnlineShip:
    """The ship rule fed the default job's curve as the job feeds it: a proxy per training step, an evaluation every
    20 steps."""
    choice = OnlineShip()
    for i, (step, _) in enumerate(RISING):
        for t in range(RISING[i - 1][0] + 1 if i else 1, step + 1):
            choice.train_step(t, PROXY[i])
        choice.evaluation(step, KL[i])
    choice.train_step(201, PROXY[-1])
    return choice


def default_job_meta() -> dict:
    test = {"test/gold_reward": 0.82, "test/gold_reward_se": 0.012, "test/proxy_reward": 1.4, "test/kl": 4.0,
            "test/n_prompts": 512.0}
    start = {"test/gold_reward": -0.09, "test/gold_reward_se": 0.022, "test/proxy_reward": 0.03, "test/n_prompts": 512.}
    ev = {"eval/gold_reward": 0.82, "eval/gold_reward_se": 0.015, "eval/kl": 4.0, "eval/n_prompts": 384.0}
    line = ship_line(online_choice(), "/out/artifact/ship", RISING, 384)
    return {"run_id": "r1", "artifact": "/out/artifact", "test": test, "eval": ev, "test_start": start,
            "summary": {**gold_summary(start, test, "SFT", "PPO step 200"), "ship": line}}


def test_the_default_jobs_summary_has_one_ship_line_and_no_alarm_that_contradicts_it():
    lines = summary_lines(default_job_meta())
    assert not any("alarm" in ln.lower() or "monitor" in ln.lower() for ln in lines)
    ship = [ln for ln in lines if ln.startswith("  ship       : ")]
    assert len(ship) == 1
    step = int(re.match(r"  ship       : step (\d+) by proxy - 0\.2\*sqrt\(KL\)", ship[0]).group(1))
    assert step in dict(RISING) and step == online_choice().step
    assert FIGURES.text() in ship[0] and "prospective figures" in ship[0]  # quoted, and said to be so
    assert "saved at /out/artifact/ship" in ship[0] and "n=11 evaluations" in ship[0]
    # the gold's own best beside it, said to be the gold's (not a second recommendation), with its n
    assert ship[0].endswith("the gold's own best, which a user without gold cannot see: step 140 (eval gold 0.884, "
                            "n=384 eval prompts)")


def test_without_a_gold_the_ship_line_has_its_n_and_no_gold_of_the_run():
    choice = online_choice()
    line = ship_line(choice, "/a/ship", None, None)
    assert "n=11 evaluations" in line and "gold" not in line.replace(FIGURES.text(), "")
    empty = OnlineShip()
    empty.evaluation(0, 0.0)
    assert ship_line(empty, None).startswith("step 0 by ")  # the start alone: the only checkpoint
    assert "no checkpoint chosen" in ship_line(OnlineShip(), None)
