"""The stage progress bar counts the stage's own steps and is labelled with the stage."""

from __future__ import annotations

from types import SimpleNamespace

from rlhf_lab.progress import StageBar
from rlhf_lab.stages.common import trainer_kwargs
from tests.conftest import compose_cfg


def test_bar_counts_units_not_optimizer_steps(capsys):
    bar = StageBar("ppo", total=200, steps_per_unit=16)
    trainer = SimpleNamespace(global_step=0)
    bar.on_train_start(trainer)
    assert bar.train_progress_bar.total == 200 and bar.train_progress_bar.desc.startswith("ppo")
    for gs in (15, 16, 17, 3200, 9999):
        trainer.global_step = gs
        assert bar.done(trainer) == min(200, gs // 16)
    bar.train_progress_bar.close()


def test_bar_starts_where_a_resumed_run_is(capsys):
    bar = StageBar("ppo", total=10, steps_per_unit=4)
    bar.on_train_start(SimpleNamespace(global_step=24))
    assert bar.train_progress_bar.n == 6
    bar.train_progress_bar.close()


def test_trainer_kwargs_bar_and_max_steps(tmp_path):
    cfg = compose_cfg(["algo=ppo", "trainer.progress_bar=true"])
    kw = trainer_kwargs(cfg, tmp_path, 200, "ppo", callbacks=["ev"], steps_per_unit=16)
    assert kw["max_steps"] == 3200 and kw["enable_progress_bar"] is True
    bar = kw["callbacks"][0]
    assert isinstance(bar, StageBar) and (bar.label, bar.total, bar.steps_per_unit) == ("ppo", 200, 16)
    assert kw["callbacks"][1:] == ["ev"]
    off = trainer_kwargs(compose_cfg(["trainer.progress_bar=false"]), tmp_path, 5, "sft", label="sft x")
    assert off["enable_progress_bar"] is False and off["callbacks"] == [] and off["max_steps"] == 5


def test_bar_hides_v_num():
    bar = StageBar("sft", total=3)
    pl_module = SimpleNamespace()
    trainer = SimpleNamespace(progress_bar_metrics={"loss/lm": 1.0}, loggers=[SimpleNamespace(version="ab12")])
    items = StageBar.__mro__[1].get_metrics.__get__(bar)  # Lightning's own: adds v_num
    assert "v_num" in items(trainer, pl_module)
    assert "v_num" not in bar.get_metrics(trainer, pl_module) and bar.get_metrics(trainer, pl_module)["loss/lm"] == 1.0


def test_the_hacking_alarm_prints_one_line_above_the_bar_and_no_warning(capsys, monkeypatch, recwarn):
    import warnings

    from rlhf_lab import callbacks
    from rlhf_lab.callbacks import RewardHackingMonitor

    for name in ("log_metrics", "set_tag", "log_dict"):  # no MLflow run here
        monkeypatch.setattr(callbacks.tracking, name, lambda *a, **k: None)
    proxy = [0.1 * s for s in range(30)]
    gold = [0.05 * s if s < 10 else 0.5 - 0.06 * (s - 10) for s in range(30)]  # up, then down: the alarm fires
    feed = iter(zip(range(30), proxy, gold))
    monitor = RewardHackingMonitor(lambda t, p: next(feed), gold_drop=0.2, window=3, warmup=3)
    bar = StageBar("ppo", total=30)
    trainer = SimpleNamespace(global_step=0, global_rank=0)
    bar.on_train_start(trainer)
    warnings.simplefilter("always")
    for step in range(30):
        trainer.global_step = step + 1
        monitor.on_train_batch_end(trainer, None, None, None, step)
        bar.train_progress_bar.n = step + 1
        bar.train_progress_bar.refresh()
    bar.train_progress_bar.close()
    out, err = capsys.readouterr()
    assert monitor.fired_at is not None and not recwarn.list and "hacking" not in err  # no RuntimeWarning
    lines = [ln for ln in out.split("\n") if "reward hacking suspected" in ln]
    assert len(lines) == 1 and out.count("reward hacking suspected") == 1
    # its own line: what the terminal shows after the bar is cleared (the text after the last carriage return)
    assert lines[0].split("\r")[-1].startswith(f"[rlhf-lab] reward hacking suspected at step {monitor.fired_at}:")
    assert "ppo" not in lines[0].split("\r")[-1]
