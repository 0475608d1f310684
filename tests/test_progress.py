"""The stage progress bar counts the stage's own steps and is labelled with the stage."""

from __future__ import annotations

from types import SimpleNamespace

from rlhf_lab.runs.progress import StageBar
from rlhf_lab.stages.training import trainer_kwargs
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
    from rlhf_lab.evaluation.callbacks import TrainedStateBytes

    cfg = compose_cfg(["algo=ppo", "trainer.progress_bar=true"])
    kw = trainer_kwargs(cfg, tmp_path, 200, "ppo", callbacks=["ev"], steps_per_unit=16)
    assert kw["max_steps"] == 3200 and kw["enable_progress_bar"] is True
    bar = kw["callbacks"][0]
    assert isinstance(bar, StageBar) and (bar.label, bar.total, bar.steps_per_unit) == ("ppo", 200, 16)
    assert kw["callbacks"][1] == "ev" and isinstance(kw["callbacks"][2], TrainedStateBytes)  # memory/* of the run
    off = trainer_kwargs(compose_cfg(["trainer.progress_bar=false"]), tmp_path, 5, "sft", label="sft x")
    assert off["enable_progress_bar"] is False and off["max_steps"] == 5
    assert [type(c) for c in off["callbacks"]] == [TrainedStateBytes]


def test_bar_hides_v_num():
    bar = StageBar("sft", total=3)
    pl_module = SimpleNamespace()
    trainer = SimpleNamespace(progress_bar_metrics={"loss/lm": 1.0}, loggers=[SimpleNamespace(version="ab12")])
    items = StageBar.__mro__[1].get_metrics.__get__(bar)  # Lightning's own: adds v_num
    assert "v_num" in items(trainer, pl_module)
    assert "v_num" not in bar.get_metrics(trainer, pl_module) and bar.get_metrics(trainer, pl_module)["loss/lm"] == 1.0


def test_work_bar_counts_what_sample_pairs_did(arch_checkpoints, capsys):
    from rlhf_lab.world import streams as D
    from rlhf_lab.config import world as W
    from rlhf_lab.config import data as DS
    from rlhf_lab.config.schema import GenerationConfig, settings
    from rlhf_lab.data.preferences import sample_pairs
    from rlhf_lab.runs.progress import work_bar

    cfg = compose_cfg(["generation.max_new_tokens=4", "generation.max_prompt_len=null"])
    prompts = D.prompts(W.world_settings(cfg), "bar", 10)
    with work_bar("prefs", len(prompts), "pair") as bar:
        pairs = sample_pairs(DS.labelling(cfg), settings(cfg.generation, GenerationConfig), {}, arch_checkpoints["gpt2"], prompts, 0, "sft", batch_size=4, progress=bar)
        assert bar.n == 10 and len(pairs) <= 10  # three batches (4, 4, 2); a tie in text is dropped
    out = capsys.readouterr().out
    assert "prefs" in out and "10/10" in out and "pair/s" in out
    with work_bar("prefs", 3, "pair", enabled=False) as off:
        off.update(3)
    assert capsys.readouterr().out == ""  # trainer.progress_bar=false: nothing drawn


def test_the_prefs_stage_shows_a_bar_named_prefs_over_all_its_pairs(monkeypatch, capsys, tmp_path):
    import contextlib

    from rlhf_lab.data.preferences import PreferencePair
    from rlhf_lab.stages import prefs

    calls = []

    def fake_sample(labelling, gen, options, path, prompts, seed, source, gold=None, progress=None, **kw):
        calls.append((source, len(prompts)))
        progress.update(len(prompts))
        return [PreferencePair(p, "a", "b", gold_chosen=1.0, gold_rejected=0.0) for p in prompts]

    run = SimpleNamespace(info=SimpleNamespace(run_id="r"))
    monkeypatch.setattr(prefs, "sample_pairs", fake_sample)
    monkeypatch.setattr(prefs, "upstream_run", lambda cfg, path: "sft-run")
    monkeypatch.setattr(prefs.tracking, "start_run", lambda *a, **k: contextlib.nullcontext(run))
    monkeypatch.setattr(prefs.active_run, "log_metrics", lambda *a, **k: None)
    cfg = compose_cfg(["data.n_train=30", "data.n_eval=7", "data.on_policy_fraction=0.2",
                       f"data.on_policy_path={tmp_path}", "trainer.progress_bar=true"])
    spec = {"sft": str(tmp_path), "n_train": 30, "n_eval": 7, "seed": 0, "on_policy_fraction": 0.2,
            "on_policy_path": str(tmp_path)}
    meta = prefs.build(cfg, tmp_path, spec)
    assert calls == [("sft", 24), ("on_policy", 6), ("sft", 7)] and (meta["n_train"], meta["n_eval"]) == (30, 7)
    out = capsys.readouterr().out
    assert "prefs" in out and "37/37" in out
