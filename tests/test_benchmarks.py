"""The benchmarks' results (one JSON per benchmark, results.md generated from them), the GRPO and PPO-vs-TRL settings
mappings; slow smoke runs of ``python -m benchmarks.vs_trl --only grpo|ppo --quick`` (need TRL: ``pip install -e
".[bench]"``; ``ppo`` also installs TRL 1.9.2 into ``~/.cache/rlhf_lab_bench`` on first use)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import common as C
from tests.conftest import compose_cfg

ROOT = Path(__file__).resolve().parents[1]


def test_saving_a_result_rewrites_its_json_and_regenerates_the_document(tmp_path):
    folder = tmp_path / "results"
    C.save("suite", "## Suite\n\nkept\n", folder=folder)
    C.save("dpo", "## DPO\n\nfirst\n", ["DPO throughput", "1.5×", "loss agrees"], {"ratio": 1.5}, folder=folder)
    C.save("grpo", "## GRPO\n\nx\n", ["GRPO throughput", "1.2×", "ok"], folder=folder)
    out = C.save("dpo", "## DPO\n\nsecond\n", ["DPO throughput", "1.7×", "loss agrees"], folder=folder)
    text = out.read_text()
    assert out == tmp_path / "results.md" and text == C.render(folder)
    assert "first" not in text and "second" in text and "kept" in text and "1.7×" in text and "1.5×" not in text
    assert text.index("## DPO") < text.index("## GRPO") < text.index("## Suite")  # ORDER, whatever the writing order
    assert json.loads((folder / "dpo.json").read_text())["summary"][1] == "1.7×"


def test_results_document_is_generated_from_the_committed_json():
    """The committed results.md is what the JSON files give (a run rewrites both; nobody edits it by hand)."""
    assert (ROOT / "benchmarks" / "results.md").read_text() == C.render()
    names = {p.stem for p in C.RESULTS_DIR.glob("*.json")}
    assert all(C.order_of(n) < len(C.ORDER) for n in names)  # each in ORDER, or a tagged variant of one
    assert {"dpo", "rm", "grpo", "sampling", "ppo", "team", "suite"} <= names
    assert C.order_of("bounds_0.5b_bf16") == C.ORDER.index("bounds_0.5b") and C.order_of("new") == len(C.ORDER)


def test_grpo_settings_map_ours_to_trl():
    from benchmarks.vs_trl.grpo import trl_settings

    cfg = compose_cfg(["algo=grpo"])
    s = trl_settings(cfg)
    assert s["loss_type"] == "grpo" and s["scale_rewards"] == "group" and s["beta"] == pytest.approx(0.04)
    assert s["num_generations"] == 8 and s["max_completion_length"] == int(cfg.generation.max_new_tokens)
    assert s["steps_per_generation"] * s["per_device_train_batch_size"] == int(cfg.algo.batch_size)
    assert s["use_bias_correction_kl"] is False and s["mask_truncated_completions"] is False
    dr = trl_settings(compose_cfg(["algo=grpo", "algo.advantage_scale=none", "algo.loss_agg=seq_mean_token_sum_norm"]))
    assert dr["loss_type"] == "dr_grpo" and dr["scale_rewards"] == "none"
    with pytest.raises(ValueError, match="kl_estimator"):
        trl_settings(compose_cfg(["algo=grpo", "algo.kl_estimator=k2"]))


@pytest.mark.slow
def test_grpo_benchmark_quick_run(tmp_path):
    pytest.importorskip("trl")
    p = subprocess.run([sys.executable, "-m", "benchmarks.vs_trl", "--only", "grpo", "--quick", "--results",
                        str(tmp_path / "results")], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = json.loads((tmp_path / "results" / "grpo.json").read_text())
    assert "loss agrees" in res["summary"][2] and "DIFFERS" not in res["markdown"]
    assert "## GRPO training throughput" in (tmp_path / "results.md").read_text()


def test_ppo_trl_settings_map_ours_to_trl_1_9_2():
    from benchmarks.vs_trl.ppo import config, trl_settings

    cfg = config()
    s = trl_settings(cfg)
    c, o = s["config"], s["optim"]
    assert cfg.policy.arch.hidden == 128 and cfg.policy.arch.layers == 2 and c["response_length"] == 32
    assert c["per_device_train_batch_size"] == int(cfg.algo.batch_size) == 64 and c["gradient_accumulation_steps"] == 1
    assert c["num_mini_batches"] == 4 and c["num_ppo_epochs"] == 4 and c["local_rollout_forward_batch_size"] == 64
    assert c["kl_coef"] == pytest.approx(float(cfg.kl.beta)) and c["kl_estimator"] == "k1"
    assert (c["cliprange"], c["cliprange_value"], c["vf_coef"], c["gamma"], c["lam"]) == (0.2, 0.2, 0.1, 1.0, 0.95)
    assert c["whiten_rewards"] is False and c["missing_eos_penalty"] is None and c["stop_token_id"] is None
    assert c["bf16"] is False and c["gradient_checkpointing"] is False and c["num_sample_generations"] == 0
    assert (o["policy_lr"], o["value_lr"], o["eps"], o["max_grad_norm"]) == (3e-4, 1e-3, 1e-5, 1.0)
    with pytest.raises(ValueError, match="critic"):
        trl_settings(compose_cfg(["algo.critic=shared", "kl=fixed"]))
    with pytest.raises(ValueError, match="'kl'"):
        trl_settings(compose_cfg([]))  # the adaptive controller: TRL's kl_coef is fixed


@pytest.mark.slow
def test_ppo_trl_benchmark_quick_run(tmp_path):
    """Ours vs TRL 1.9.2's PPOTrainer (installed on first use into ~/.cache/rlhf_lab_bench, run in its own process):
    the section, its summary row and the first-batch agreement."""
    pytest.importorskip("trl", reason="needs the bench extra: pip install -e \".[bench]\"")
    p = subprocess.run([sys.executable, "-m", "benchmarks.vs_trl", "--only", "ppo", "--quick", "--results",
                        str(tmp_path / "results")], cwd=ROOT, capture_output=True, text=True, timeout=900)
    if p.returncode == 2 and "pip install" in p.stderr:
        pytest.skip(p.stderr.strip().splitlines()[-1])  # TRL 1.9.2 could not be installed (no package index)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = json.loads((tmp_path / "results" / "ppo.json").read_text())
    assert "loss agrees" in res["summary"][2] and "target ≤ 0.67×" in res["summary"][2]
    md = res["markdown"]
    assert "TRL 1.9.2 PPOTrainer" in md and "TRL side imported rlhf_lab: no" in md and "DIFFERS" not in md


def test_suite_benchmark_gold_comparison_is_paired_by_seed():
    """today − before per seed (5 − 1 and 2 − 4: mean 1, t interval over the two differences) and the largest
    gap between the seed-mean eval curves (step 10: (3+1)/2 − (1+1)/2 = 1)."""
    from benchmarks.ops.suite import gold_comparison
    from scipy import stats

    before = [{"seed": 0, "test_gold": 1.0, "curve": {0: 0.0, 10: 1.0}},
              {"seed": 1, "test_gold": 4.0, "curve": {0: 0.0, 10: 1.0}}]
    today = [{"seed": 1, "test_gold": 2.0, "curve": {0: 0.0, 10: 1.0}},
             {"seed": 0, "test_gold": 5.0, "curve": {0: 0.0, 10: 3.0}}]
    g = gold_comparison(before, today)
    half = stats.t.ppf(0.975, 1) * 3  # d = (4, −2): sd 3√2, se 3√2/√2 = 3
    assert g["effect"].estimate == pytest.approx(1.0) and g["effect"].n == 2
    assert g["effect"].hi - 1.0 == pytest.approx(half) and 1.0 - g["effect"].lo == pytest.approx(half)
    assert g["steps"] == [0, 10] and g["max_curve_diff"] == pytest.approx(1.0)


def test_suite_projection_scales_the_sampled_algorithms_only():
    from benchmarks.ops.suite import suite_projection

    rows, stated, projected = suite_projection(2.0)
    by = {r[0]: r for r in rows}
    assert by["dpo_beta_grid_5seeds"][1] == "dpo" and by["dpo_beta_grid_5seeds"][4] == by["dpo_beta_grid_5seeds"][3]
    assert by["clip_eps"][1] == "ppo" and by["clip_eps"][4] == pytest.approx(by["clip_eps"][3] / 2)
    assert by["grpo_kl"][1] == "grpo" and stated == pytest.approx(sum(r[3] for r in rows))
    assert stated > projected > stated / 2


@pytest.mark.slow
def test_the_gpu_script_runs_its_four_jobs_at_tiny_shapes_on_the_cpu(tmp_path, monkeypatch, capsys):
    """`python -m benchmarks.ops.gpu --shape tiny --device cpu`: the script a GPU machine runs, checked here without one
    (its jobs forked from the warm interpreter of tests/cli_process.py, as `rlhf-lab` processes)."""
    import os

    import torch

    from benchmarks.ops import gpu
    from tests import cli_process

    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    monkeypatch.setattr(gpu, "run_job", lambda overrides, work: cli_process.run(overrides, cwd=work, env=env))
    assert gpu.main(["--shape", "tiny", "--device", "cpu", "--work", str(tmp_path), "--out", str(tmp_path / "t.md")]) == 0
    rows = [line for line in (tmp_path / "t.md").read_text().splitlines() if line.startswith("| ") and "FINISHED" in line]
    assert [r.split("|")[1].strip() for r in rows] == ["rm", "dpo", "grpo", "ppo"]
    assert all("| True |" in r for r in rows)  # every loss finite
    # without a GPU the default (cuda) refuses in one line, naming the CPU check
    if not torch.cuda.is_available():
        assert gpu.main(["--work", str(tmp_path / "x")]) == 2
        assert "--device cpu --shape tiny" in capsys.readouterr().err


def test_suite_benchmark_splits_a_job_slot_into_its_phases():
    """Two jobs per side, two at a time: the slot is wall × 2 ÷ jobs; each phase is its mean over the jobs; what the
    phases do not account for is the sweep's own time (slot − their sum), and the share is of today's slot."""
    from benchmarks.ops.suite import phase_rows

    def side(wall, update, evals):
        runs = [{"phases": {"update": u, "evaluations": e}} for u, e in zip(update, evals)]
        return [{"wall": wall, "runs": runs}]

    rows = phase_rows({"before": side(100.0, [60.0, 80.0], [10.0, 10.0]),
                       "today": side(50.0, [30.0, 20.0], [5.0, 5.0])})
    by = {r[0]: r[1:] for r in rows}
    assert by["update"] == [70.0, 25.0, "50%"] and by["evaluations"] == [10.0, 5.0, "10%"]
    outside = next(r for r in rows if r[0].startswith("outside"))
    assert outside[1:] == [100.0 - 80.0, 50.0 - 30.0, "40%"] and rows[-1][1:] == [100.0, 50.0, "100%"]


def test_suite_benchmark_baseline_names_and_revisions(tmp_path):
    """--baseline takes v1, v2 or code:REV; a revision git does not know ends the run with one line, before any
    job runs."""
    import argparse

    from benchmarks.ops.suite import baseline_arg, install_revision

    assert baseline_arg("v2") == "v2" and baseline_arg("code:8d3a177") == "code:8d3a177"
    for bad in ("v3", "code:"):
        with pytest.raises(argparse.ArgumentTypeError):
            baseline_arg(bad)
    with pytest.raises(SystemExit) as e:
        install_revision("no-such-revision-0", tmp_path)
    assert "code:no-such-revision-0" in str(e.value) and "\n" not in str(e.value)


def test_core_use_flags_only_other_processes_cpu_time(monkeypatch):
    """The machine line's flag counts the CPU time of processes outside the benchmark's own tree (its jobs are
    waited for, so theirs is the benchmark's), over wall time × cores: a benchmark's own warm-up job raising the
    load average is not a busy machine. A benchmark with detached processes of its own (a daemon) names them, and
    its flag falls back on the load average at the start."""
    from types import SimpleNamespace

    monkeypatch.setattr(C.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(C.os, "getloadavg", lambda: (0.2, 0.2, 0.2))

    def line(machine_busy: float, ours: float, detached: str | None = None) -> str:
        readings = iter([(100.0, 10.0), (100.0 + machine_busy, 10.0 + ours)])
        clock = iter([0.0, 10.0])
        monkeypatch.setattr(C, "cpu_seconds", lambda: next(readings))
        monkeypatch.setattr(C, "time", SimpleNamespace(time=lambda: next(clock)))
        return C.CoreUse(detached).machine_line()

    quiet = line(machine_busy=19.5, ours=19.4)  # our jobs kept both cores busy: 0.1 s of others in 20 core-s
    assert "other processes used 0.5% of the cores' time" in quiet and "shared the cores" not in quiet
    busy = line(machine_busy=8.0, ours=6.0)  # 2 s of others in 20 core-s
    assert "other processes used 10.0% of the cores' time" in busy and "**other jobs shared the cores**" in busy
    daemon = line(machine_busy=8.0, ours=6.0, detached="the team server's PostgreSQL")  # its time is others'
    assert "other processes, the team server's PostgreSQL among them, used 10.0%" in daemon
    assert "shared the cores" not in daemon  # load average 0.2 at the start


def test_cpu_seconds_counts_this_processes_work():
    before = C.cpu_seconds()
    if before is None:
        pytest.skip("no /proc/stat here")
    t0 = time.process_time()
    while time.process_time() - t0 < 0.3:
        pass
    after = C.cpu_seconds()
    assert after[1] - before[1] >= 0.25  # ours
    assert after[0] - before[0] >= after[1] - before[1] - 0.05  # the machine's includes ours (clock ticks)


def test_decode_bound_counts_the_weights_once_and_the_whole_kv_cache():
    """ops.gpu's tiny Qwen2 (hidden 32, 4 heads of 8, 2 KV heads, 2 layers), fp32: a key and a value of 2 KV heads × 8
    in 2 layers = 2 · 2 · 2 · 8 · 4 = 256 bytes a token; Qwen2-0.5B's shape (896 = 14 heads of 64, 2 KV heads, 24
    layers) 2 · 24 · 2 · 64 · 4 = 24,576 (12 KiB in bf16). A step of 3 sequences at 10 tokens with 19,648 bytes of
    weights reads 19,648 + 256 · 10 · 3 = 27,328 bytes."""
    from transformers import Qwen2Config

    from benchmarks.ops.bounds import config_kv_bytes, decode_step_bytes, kv_token_bytes
    from benchmarks.ops.gpu import SHAPES

    tiny = Qwen2Config(**{k: v for k, v in SHAPES["tiny"].items() if v is not None})
    half = Qwen2Config(**{k: v for k, v in SHAPES["0.5b"].items() if v is not None})
    assert kv_token_bytes(2, 2, 8, 4) == config_kv_bytes(tiny, 4) == 256
    assert config_kv_bytes(half, 4) == 24576 and config_kv_bytes(half, 2) == 12288
    assert decode_step_bytes(19648, 256, 10, 3) == 27328


def test_decode_linears_by_hand():
    """ops.gpu's tiny Qwen2 (hidden 32, intermediate 64, 4 heads of 8, 2 KV heads, 2 layers) with 100 tokens: per layer
    q 32×32, k and v 16×32, o 32×32, gate and up 64×32, down 32×64; then the LM head 100×32. Qwen2-0.5B's shape with
    its 151,936 tokens: per layer 2·896² + 2·128·896 + 3·4864·896 = 14,909,440, × 24 = 357,826,560, + the head
    151,936·896 = 136,134,656: 493,961,216, which with the q/k/v biases (24 · 1,152) and norms (24 · 2 · 896 + 896)
    is the 494,032,768 parameters of the published model. The measurement over 4×3 and 5×4 weights moves 4·(12 + 20)
    = 128 bytes in fp32, 64 in bf16, at each batch."""
    from transformers import Qwen2Config

    from benchmarks.ops.bounds import decode_linears, linears_seconds
    from benchmarks.ops.gpu import SHAPES

    tiny = Qwen2Config(**{**{k: v for k, v in SHAPES["tiny"].items() if v is not None}, "vocab_size": 100})
    layer = [(32, 32), (16, 32), (16, 32), (32, 32), (64, 32), (64, 32), (32, 64)]
    assert decode_linears(tiny) == layer * 2 + [(100, 32)]
    half = Qwen2Config(**{**{k: v for k, v in SHAPES["0.5b"].items() if v is not None}, "vocab_size": 151936})
    assert sum(o * i for o, i in decode_linears(half)) == 493_961_216
    assert 493_961_216 + 24 * 1152 + 24 * 2 * 896 + 896 == 494_032_768
    m = linears_seconds([(4, 3), (5, 4)], [1, 2], passes=1)
    assert {k: v["bytes"] for k, v in m.items()} == {"fp32": 128, "bf16": 64}
    assert all(set(v["seconds"]) == {1, 2} and min(v["seconds"].values()) > 0 for v in m.values())


def test_step_work_by_hand():
    """A trunk of 100 parameters (400 bytes), a KV cache of 16 bytes a token, batch 2, prompts of 3 tokens padded to
    4, 3 response tokens, 2 epochs of 1 minibatch. Generation: steps at context 4, 5, 6: (400 + 16·4·2) + (400 +
    16·5·2) + (400 + 16·6·2) = 1,680 bytes; 2·100·2·(4 + 3 − 1) = 2,400 FLOPs. The passes see 2·(3 + 3) = 12 tokens:
    a forward 2·100·12 = 2,400 FLOPs. Full fine-tuning with a critic trunk (200 trained): update 2·12·(4·2·100 +
    2·200) = 28,800 FLOPs = 6 · 200 · 24, and 2 AdamW steps × 28 bytes × 200 = 11,200 bytes; LoRA on one trunk (10
    trained): 2·12·(4·100 + 2·10) = 10,080 FLOPs, 2 × 28 × 10 = 560 bytes."""
    from benchmarks.ops.bounds import StepShape, bound, phase_work, step_rows

    full = phase_work(StepShape(100, 400, 16, 2, 3, 4, 3, 2, 1, 200, 2))
    assert full["generation"] == (1680, 2400)
    assert full["score/rm"] == full["score/reference"] == (400, 2400) and full["score/policy_critic"] == (800, 4800)
    assert full["update"] == (11200, 28800)
    assert phase_work(StepShape(100, 400, 16, 2, 3, 4, 3, 2, 0, 10, 2))["update"] == (560, 10080)
    assert bound(full["generation"], bandwidth=1680.0, matmul=1200.0) == (1.0, 2.0)
    # at 1,000 bytes/s and 1,200 FLOP/s: generation max(1.68, 2) = 2 s of its 4; the update 11.2 + 24 s of its 70.4
    times = {"generation": 4.0, "update": 70.4, "step": 100.0}
    _, frac = step_rows("ppo", times, StepShape(100, 400, 16, 2, 3, 4, 3, 2, 1, 200, 2), 1000.0, 1200.0)
    assert frac["generation"] == pytest.approx(0.5) and frac["update"] == pytest.approx(0.5)
    assert frac["update_matmul"] == pytest.approx(24 / 70.4)
    assert math.isnan(frac["other"]) and frac["step"] == pytest.approx((2 + 2 + 2 + 4 + 35.2) / 100)


@pytest.mark.slow
def test_bounds_benchmark_runs_grpo_at_the_tiny_shape(tmp_path):
    """``python -m benchmarks.ops.bounds --shape tiny --only grpo``'s measurements and section: decoding and each phase
    at a fraction of its bound in (0, 1] (a bound above the measured time would mean a unit is wrong)."""
    from benchmarks.ops import bounds

    sec = C.Section("bounds")
    bounds.fill(sec, bounds.measure("tiny", ["grpo"], 1, tmp_path, seconds=0.5))
    d = sec.data
    assert set(d["decode"]) == {"lab_1", "hf_1", "lab_8", "hf_8"} and set(d["fractions"]) == {"grpo"}
    assert all(0 < f <= 1 for f in d["decode"].values())
    phases = ("generation", "score/rm", "update", "update_matmul", "step")
    assert all(0 < d["fractions"]["grpo"][k] <= 1 for k in phases)
    assert "STREAM triad, GB/s" in sec.tables[0] and "| GRPO, full fine-tuning | generation |" in sec.tables[3]
    assert "linear layers alone" in sec.tables[2] and sec.findings[1].startswith("what holds decoding below")
    lin = d["linears"]  # {dtype: {batch: [ms, GB/s]}}: ms and bytes ÷ seconds agree; ours ÷ its linears' share
    assert set(lin["fp32"]) == set(lin["bf16"]) == set(lin["share"]) == {1, 8}
    assert all(ms > 0 and gbs > 0 for n in ("fp32", "bf16") for ms, gbs in lin[n].values())
    assert lin["fp32"][1][0] * lin["fp32"][1][1] == pytest.approx(2 * lin["bf16"][1][0] * lin["bf16"][1][1])


def test_bounds_set_overrides_reach_the_step_runs_and_save_beside_the_plain_section(tmp_path, monkeypatch):
    """``--set KEY=VALUE`` (repeatable) goes to the step runs' configs, the section's title and note name the
    overrides, and ``--save`` writes ``bounds_SHAPE_TAG`` (``--tag``, which --set needs), never ``bounds_SHAPE``."""
    from types import SimpleNamespace

    from benchmarks.ops import bounds

    over = ("generation.dtype=bfloat16", "algo.reference.dtype=bfloat16")
    cfg = bounds.job_config("ppo_lora", "tiny", SimpleNamespace(lm_dir=tmp_path), tmp_path, over)
    assert cfg.generation.dtype == "bfloat16" and cfg.algo.reference.dtype == "bfloat16"
    assert bounds.job_config("ppo_lora", "tiny", SimpleNamespace(lm_dir=tmp_path), tmp_path).generation.dtype is None
    seen, saved = {}, {}
    monkeypatch.setattr(bounds, "measure", lambda *a, **k: seen.update(k) or {})
    monkeypatch.setattr(bounds, "fill", lambda sec, raw: setattr(sec, "summary", ["x"]))
    monkeypatch.setattr(C, "save", lambda name, md, *a, **k: saved.update(name=name, md=md))
    args = ["--only", "grpo", *(x for o in over for x in ("--set", o)), "--tag", "bf16", "--save"]
    assert bounds.main(args) == 0
    assert seen["overrides"] == over and saved["name"] == "bounds_tiny_bf16"
    assert saved["md"].startswith("## A PPO step against the machine's bandwidth and matmul rate at the tiny shape, "
                                  "with `generation.dtype=bfloat16`, `algo.reference.dtype=bfloat16`")
    assert "--set generation.dtype=bfloat16 --set algo.reference.dtype=bfloat16 --tag bf16 --save" in saved["md"]
    shape = bounds.StepShape(1e6, 4e6, 64, 4, 10.0, 12, 8, 1, 0, 1e6, 1)
    half = bounds.StepShape(*list(vars(shape).values())[:11], 0.5, 0.5)  # bf16 rollouts and reference
    plain, half = bounds.phase_work(shape), bounds.phase_work(half)
    assert half["generation"][0] == pytest.approx(plain["generation"][0] / 2) and bounds.dtype_scale("bfloat16") == 0.5
    assert half["score/reference"][0] == plain["score/reference"][0] / 2 and half["update"] == plain["update"]
    for bad in (["--set", "generation.dtype=bfloat16"], ["--set", "nokey", "--tag", "x"], ["--tag", "a/b"],
                ["--set", "algo.reference.dtype=bfloat16", "--tag", "x"],  # refused for ppo_lora's shared base
                ["--only", "grpo", "--set", "generation.dtype=bf16", "--tag", "x"]):
        with pytest.raises(SystemExit) as exc:
            bounds.main(bad)
        assert exc.value.code == 2, bad
