"""Value checks on the composed config (rlhf_lab/config/checks.py): the CLI exits 2 with one line, fast."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from rlhf_lab.config import checks as C
from rlhf_lab.config.errors import ConfigError, UnknownKey
from rlhf_lab.config.rules import check_added_keys
from tests import cli_process
from tests.conftest import TINY, compose_cfg

ROOT = Path(__file__).resolve().parents[1]


def cli(*args, cwd, env_extra=None, timeout=120):
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("HYDRA_FULL_ERROR", None)
    env.update(env_extra or {})
    return cli_process.run(args, cwd=cwd, env=env, timeout=timeout)


@pytest.mark.slow
@pytest.mark.parametrize("override, key", [
    ("algo.clip_eps=-1", "algo.clip_eps"),
    ("generation.max_new_tokens=0", "generation.max_new_tokens"),
    ("algo.kl_estimator=k4", "algo.kl_estimator"),
    ("trainer.devices=0", "trainer.devices"),
    ("trainer.devices=-1", "trainer.devices"),
])
def test_cli_bad_value_exits_2_with_one_line(tmp_path, override, key):
    t0 = time.time()
    r = cli(*TINY, override, cwd=tmp_path)
    took = time.time() - t0
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, r.stderr
    assert key in lines[0] and "must be" in lines[0] and "Traceback" not in r.stderr
    assert took < 30, took  # no model, data or store was touched (a few seconds on an idle machine)
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / ".rlhf_lab_cache").exists()


@pytest.mark.slow
@pytest.mark.parametrize("override, words", [
    ("+algo.nonsense=1", ["unknown key algo.nonsense", "did you mean"]),
    ("trainer.max_stepz=3", ["unknown key trainer.max_stepz", "did you mean trainer.max_steps?"]),
    ("algo.lr=abc", ["algo.lr", "'abc'"]),
    ("algo=foo", ["algo=foo", "available options: bon"]),
    ("seed=-1", ["seed must be an integer"]),
    ("algo.lr=inf", ["algo.lr must be a finite number"]),
])
def test_every_config_error_exits_2_with_one_line(tmp_path, override, words):
    """Hydra's own composition errors (unknown key, wrong type, no such option) as well as the value checks."""
    r = cli(*TINY, override, cwd=tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("rlhf-lab: config error: "), r.stderr
    assert all(w in lines[0] for w in words), lines[0]


@pytest.mark.slow
def test_a_config_group_option_may_still_be_added(tmp_path):
    """``+group=option`` (the studies' ``+rm_size=medium``) is no unknown key."""
    r = cli(*TINY, "+rm_size=medium", "trainer.max_steps=0", cwd=tmp_path)
    assert r.returncode == 2 and "trainer.max_steps must be" in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize("overrides, line", [
    (["algo=foo"], "algo=foo: no such option of algo; available options: bon, dpo, grpo, ppo, pretrain, rloo, rm, sft"),
    (["labeler=unbaised"], "labeler=unbaised: no such option of labeler (did you mean unbiased?); available options: "
                           "length_and_filler, length_biased, noisy, sycophantic, unbiased"),
    (["trainer.max_stepz=3"], "unknown key trainer.max_stepz; did you mean trainer.max_steps?"),
    (["algo.lr=abc"], "algo.lr: Value 'abc' of type 'str' could not be converted to Float (algo.lr=abc)"),
    (["algo.lr=[1"], "cannot parse the override 'algo.lr=[1': no viable alternative at input '[1' (Hydra's override "
                     "grammar)"),
    # a name outside a StrEnum-typed key's choices (config/choices.py), refused by Hydra, worded as the checks word
    (["kl.unit=word"], "kl.unit must be one of sequence, token, got 'word'"),
    (["algo.critic=nope"], "algo.critic must be one of rm, policy, shared, none, got 'nope'"),
    (["generation.sampler=vllm"], "generation.sampler must be one of lab, hf, got 'vllm'"),
    (["algo=dpo", "algo.loss_type=kto"], "algo.loss_type must be one of sigmoid, ipo, ipo_sum, hinge, got 'kto'"),
    (["algo=grpo", "algo.loss_agg=sum"], "algo.loss_agg must be one of token_mean, seq_mean_token_mean, "
                                         "seq_mean_token_sum, seq_mean_token_sum_norm, got 'sum'"),
    (["reward_model.dtype=half"], "reward_model.dtype must be one of auto, float32, bfloat16, float16, got 'half'"),
    (["gold.source=oracle"], "gold.source must be one of formula, rm, got 'oracle'"),
    (["data=jsonl", "data.format=chat"], "data.format must be one of auto, standard, conversational, got 'chat'"),
])
def test_composition_errors_as_one_line(overrides, line):
    with pytest.raises(Exception) as exc:
        compose_cfg(overrides)
    assert C.composition_error_line(exc.value) == line
    assert C.composition_error_line(RuntimeError("not Hydra's")) is None


def test_a_bad_choice_in_a_config_file_names_the_key_and_the_file():
    from hydra.errors import ConfigCompositionException

    err = ConfigCompositionException("In 'algo/myppo': ValidationError raised while composing config:\nInvalid value "
                                     "'nope', expected one of [rm, policy, shared, none]\n    full_key: algo.critic\n"
                                     "    object_type=PPOConfig")
    assert C.composition_error_line(err) == ("algo.critic must be one of rm, policy, shared, none, got 'nope' "
                                             "(in algo/myppo)")


def test_added_keys_must_be_config_groups():
    cfg = compose_cfg(["+algo.nonsense=1"])
    with pytest.raises(UnknownKey) as exc:
        check_added_keys(cfg, ["+algo.nonsense=1"], ["algo", "kl", "rm_size"])
    assert str(exc.value) == "unknown key algo.nonsense (in +algo.nonsense=1); did you mean algo.steps?"
    with pytest.raises(UnknownKey, match="unknown key algo.lrr .*did you mean algo.lr[?]"):
        check_added_keys(compose_cfg(["++algo.lrr=3"]), ["++algo.lrr=3"], ["algo"])
    check_added_keys(cfg, ["+rm_size=medium", "+hydra.launcher.n_jobs=2", "seed=1", "+hydra/launcher=parallel"],
                       ["algo", "rm_size"])


@pytest.mark.parametrize("overrides, key, value, allowed", [
    (["seed=-1"], "seed", -1, "an integer in [0, 4294967296)"),
    (["seed=abc"], "seed", "abc", "an integer in [0, 4294967296)"),
    (["seed=4294967296"], "seed", 2 ** 32, "an integer in [0, 4294967296)"),
    (["algo.lr=inf"], "algo.lr", float("inf"), "a finite number (null switches an option off)"),
    (["sft.lr=inf"], "sft.lr", float("inf"), "a finite number (null switches an option off)"),
    (["world.sentiment_noise=-0.5"], "world.sentiment_noise", -0.5, ">= 0"),
    (["generation.temperature=nan"], "generation.temperature", None, "> 0"),
])
def test_numbers_are_finite_and_not_negative(overrides, key, value, allowed):
    with pytest.raises(ConfigError) as exc:
        C.validate(compose_cfg(overrides))
    assert exc.value.key == key and exc.value.allowed == allowed
    if value is not None:
        assert exc.value.value == value


def test_negative_numbers_where_they_mean_something():
    C.validate(compose_cfg(["world.gold.filler=-0.5", "labeler.length_bonus=-0.25", "trainer=gpu", "trainer.devices=-1"]))


@pytest.mark.parametrize("overrides, key", [
    (["trainer=fsdp_cpu", "algo=dpo", "algo.lora.r=8"], "algo.lora.r"),
    (["trainer=fsdp_cpu", "algo=rm", "reward_model.lora.r=8"], "reward_model.lora.r"),
    (["trainer=fsdp", "algo=ppo", "algo.critic=shared"], "algo.critic"),
], ids=["dpo-lora", "rm-lora", "shared-critic"])
def test_sharded_training_refuses_what_it_does_not_shard(overrides, key):
    """A LoRA job or a value head on the policy's pass under trainer=fsdp would train parameters FSDP does not shard
    or synchronise: refused before anything loads, naming the key and the way out."""
    with pytest.raises(ConfigError, match="trainer=ddp") as exc:
        C.validate(compose_cfg(overrides))
    assert exc.value.key == key
    for good in (["trainer=fsdp_cpu", "algo=dpo"], ["trainer=fsdp_cpu", "algo=rm"], ["trainer=fsdp", "algo=ppo"],
                 ["trainer=ddp_cpu", "algo=dpo", "algo.lora.r=8"]):
        C.validate(compose_cfg(good))


@pytest.mark.parametrize("overrides, allowed", [
    (["trainer.devices=0"], ">= 1 (processes or GPUs), -1 (every GPU), 'auto' or a list of ids"),
    (["trainer.devices=-5"], ">= 1 (processes or GPUs), -1 (every GPU), 'auto' or a list of ids"),
    (["trainer=ddp", "trainer.devices=-2"], ">= 1 (processes or GPUs), -1 (every GPU), 'auto' or a list of ids"),
    (["trainer.devices=-1"], "a number of processes >= 1 with trainer.accelerator=cpu (-1, every device, means every "
                             "GPU: trainer=gpu or trainer=ddp)"),
    (["trainer=ddp_cpu", "trainer.devices=-1"], "a number of processes >= 1 with trainer.accelerator=cpu (-1, every "
                                                "device, means every GPU: trainer=gpu or trainer=ddp)"),
], ids=["0", "-5", "ddp,-2", "cpu,-1", "ddp_cpu,-1"])
def test_trainer_devices_is_a_count_or_every_gpu(overrides, allowed):
    """0 and negative counts ran one process and FINISHED; -1 on the CPU (which Lightning refuses there) asked for a
    process per core and failed naming that count."""
    with pytest.raises(ConfigError) as exc:
        C.validate(compose_cfg(overrides))
    assert exc.value.key == "trainer.devices" and exc.value.allowed == allowed
    assert str(exc.value) == f"trainer.devices must be {allowed}, got {exc.value.value!r}"
    for good in (["trainer.devices=1"], ["trainer=ddp_cpu", "trainer.devices=3"], ["trainer.devices=auto"],
                 ["trainer=ddp"], ["trainer=ddp", "trainer.devices=[0,1]"], ["trainer=gpu", "trainer.devices='-1'"],
                 ["trainer=ddp", "trainer.devices='0,1'"]):
        C.validate(compose_cfg(good))


DEVICES = ">= 1 (processes or GPUs), -1 (every GPU), 'auto' or a list of ids"
MULTI = ("1 with trainer.strategy=auto (more devices are more processes, which need a multi-process strategy: "
         "trainer=ddp_cpu, ddp, fsdp or deepspeed, or trainer.strategy=ddp)")


@pytest.mark.parametrize("overrides, key, value, allowed", [
    (["trainer.devices=abc"], "trainer.devices", "abc", DEVICES),
    (["trainer.devices=1.5"], "trainer.devices", 1.5, DEVICES),
    (["trainer.devices=[]"], "trainer.devices", [], DEVICES),
    (["trainer.devices=99"], "trainer.devices", 99, MULTI),
    (["trainer=gpu", "trainer.devices=[0,1]"], "trainer.devices", 2, MULTI),
    (["trainer=ddp", "trainer.devices=[0,0]"], "trainer.devices", [0, 0], "a list of distinct GPU ids >= 0 (each "
                                                                          "device once)"),
    (["trainer.devices=[0,0]"], "trainer.devices", [0, 0], "a number of processes >= 1 with trainer.accelerator=cpu (a "
                                                           "list of ids names GPUs: trainer=gpu or trainer=ddp)"),
    (["trainer.accelerator=xpu"], "trainer.accelerator", "xpu", "one of cpu, gpu, auto, cuda, mps, tpu"),
    (["labeler.temperature=0"], "labeler.temperature", 0, "> 0"),
], ids=["abc", "1.5", "empty", "99", "2-auto", "0,0", "0,0-cpu", "xpu", "temperature0"])
def test_devices_accelerator_and_labeler_values_that_tracebacked_or_ran(overrides, key, value, allowed):
    """abc, [0,0], 99 and labeler.temperature=0 were tracebacks (exit 1); 1.5 and [] ran the job."""
    with pytest.raises(ConfigError) as exc:
        C.validate(compose_cfg(overrides))
    assert (exc.value.key, exc.value.value, exc.value.allowed) == (key, value, allowed)
    assert str(exc.value) == f"{key} must be {allowed}, got {value!r}"


@pytest.mark.parametrize("gpus, overrides, key, allowed", [
    (0, ["trainer.accelerator=gpu"], "trainer.accelerator", "cpu or auto on this machine, which has no GPU torch can "
     "use (torch.cuda.device_count() is 0): trainer=cpu, or run the job where there is one"),
    (2, ["trainer=ddp", "trainer.devices=4"], "trainer.devices", "<= 2, the GPUs this machine has (or -1: every GPU)"),
    (2, ["trainer=ddp", "trainer.devices=[0,3]"], "trainer.devices", "GPU ids in [0, 2), the GPUs this machine has"),
    (2, ["trainer=gpu", "trainer.devices=-1"], "trainer.devices", MULTI),
], ids=["no-gpu", "4-of-2", "id-3-of-2", "every-of-2-auto"])
def test_what_the_machine_lacks_is_one_line_before_anything_runs(monkeypatch, gpus, overrides, key, allowed):
    """trainer.accelerator=gpu on a machine without one was a traceback (exit 1); the machine's GPUs are counted by
    check_machine where the job runs (here: as many as the test says), not by validate (a sweep's login node)."""
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    cfg = compose_cfg(overrides)
    C.validate(cfg)
    with pytest.raises(ConfigError) as exc:
        C.check_machine(cfg)
    assert (exc.value.key, exc.value.allowed) == (key, allowed)
    for good in (["trainer=ddp"], ["trainer=ddp", "trainer.devices=[0,1]"], ["trainer=gpu"], ["trainer=cpu"]):
        if gpus:
            C.check_machine(compose_cfg(good))


def test_ppo_rules_are_one_function_for_the_config_and_its_settings():
    """config.ppo_rules.check_ppo_rules: what validate, the stage and PPOModule call, on the config's node or the
    typed settings alike, and with the processes that split the batch (PPOModule's)."""
    from rlhf_lab.config.ppo_rules import check_ppo_rules
    from rlhf_lab.config.schema import PPOConfig, settings

    for overrides, key in ((["algo=grpo", "algo.critic=policy"], "algo.critic"),
                           (["algo=rloo", "algo.samples_per_prompt=1"], "algo.samples_per_prompt"),
                           (["algo.advantage_scale=group_std"], "algo.advantage_scale"),
                           (["algo.reference.kind=lora_disabled"], "algo.lora.r")):
        a = compose_cfg(overrides).algo
        for node in (a, settings(a, PPOConfig)):
            with pytest.raises(ConfigError) as exc:
                check_ppo_rules(node)
            assert exc.value.key == key, (overrides, str(exc.value))
    ok = settings(compose_cfg([]).algo, PPOConfig)  # batch 64, 4 minibatches
    check_ppo_rules(ok, processes=2)
    with pytest.raises(ConfigError, match=r"^algo.batch_size must be a multiple of algo.num_minibatches=4 times the "
                                          r"number of processes \(3\), got 64$"):
        check_ppo_rules(ok, processes=3)


def test_more_cpu_processes_than_cores_is_one_line(monkeypatch):
    """trainer=ddp_cpu trainer.devices=99 started 99 processes on a 2-core machine."""
    from rlhf_lab.config import devices

    monkeypatch.setattr(devices, "cpu_cores", lambda: 2)
    cfg = compose_cfg(["trainer=ddp_cpu", "trainer.devices=99"])
    C.validate(cfg)
    with pytest.raises(ConfigError) as exc:
        C.check_machine(cfg)
    assert str(exc.value) == ("trainer.devices must be <= 2, the CPU cores this machine gives the job (each device is "
                              "a process with trainer.accelerator=cpu), got 99")
    C.check_machine(compose_cfg(["trainer=ddp_cpu", "trainer.devices=2"]))


@pytest.mark.parametrize("overrides, key", [
    (["algo.resume_from=http://127.0.0.1:8000/evil.ckpt"], "algo.resume_from"),
    (["algo=grpo", "algo.resume_from=https://example.org/x.ckpt"], "algo.resume_from"),
    (["policy.name_or_path=https://example.org/model"], "policy.name_or_path"),
    (["reward_model.path=s3://bucket/rm"], "reward_model.path"),
    (["gold=rm", "gold.path=file:///tmp/gold"], "gold.path"),
    (["algo.reference.path=hf://org/model"], "algo.reference.path"),
    (["eval.probe_path=ftp://host/probe"], "eval.probe_path"),
    (["data.on_policy_fraction=0.2", "data.on_policy_path=[/a,'http://h/b']"], "data.on_policy_path"),
], ids=["resume-http", "grpo-https", "policy", "rm-s3", "gold-file", "reference-hf", "probe-ftp", "on-policy-list"])
def test_a_checkpoint_path_is_local_never_a_url(overrides, key):
    """algo.resume_from=http://... ran the file's pickled payload (Lightning loads an http(s) checkpoint with
    weights_only=False): every key that names a checkpoint refuses a URL, before anything is fetched."""
    with pytest.raises(ConfigError) as exc:
        C.validate(compose_cfg(overrides))
    assert exc.value.key == key and "://" in exc.value.value and "a URL or any scheme:// is refused" in str(exc.value)


def test_resume_from_is_an_existing_file_of_tensors_and_plain_values(tmp_path):
    """A missing file was Lightning's traceback; a pickled one (tests/test_checkpoints.py) is refused unread."""
    import torch

    missing = tmp_path / "absent.ckpt"
    with pytest.raises(ConfigError) as exc:
        C.validate(compose_cfg([f"algo.resume_from={missing}"]))
    assert (exc.value.key, exc.value.value) == ("algo.resume_from", str(missing))
    (tmp_path / "empty.ckpt").write_bytes(b"")
    with pytest.raises(ConfigError, match="^algo.resume_from=.*empty.ckpt': not a checkpoint torch.save wrote"):
        C.validate(compose_cfg([f"algo.resume_from={tmp_path / 'empty.ckpt'}"]))
    torch.save({"state_dict": {"w": torch.zeros(2)}, "global_step": 4, "loops": {}}, tmp_path / "ppo_last.ckpt")
    C.validate(compose_cfg([f"algo.resume_from={tmp_path / 'ppo_last.ckpt'}"]))


@pytest.mark.slow
@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a GPU")
def test_cli_a_gpu_job_without_a_gpu_exits_2_with_one_line(tmp_path):
    r = cli(*TINY, "trainer.accelerator=gpu", cwd=tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert lines == ["rlhf-lab: config error: trainer.accelerator must be cpu or auto on this machine, which has no "
                     "GPU torch can use (torch.cuda.device_count() is 0): trainer=cpu, or run the job where there is "
                     "one, got 'gpu'"], r.stderr
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.parametrize("source", ["jsonl", "hf"])
def test_the_data_size_bounds_are_at_least_1_or_null(source):
    where = f"data.path={__file__}" if source == "jsonl" else f"data.name={__file__}"
    for key in ("max_line_bytes", "max_total_bytes"):
        with pytest.raises(ConfigError) as exc:
            C.validate(compose_cfg([f"data={source}", where, f"data.{key}=0"]))
        assert str(exc.value) == f"data.{key} must be >= 1 or null (no limit), got 0"
        C.validate(compose_cfg([f"data={source}", where, f"data.{key}=null"]))


@pytest.mark.slow
def test_cli_full_error_shows_the_traceback(tmp_path):
    r = cli("kl.beta=-1", *TINY, cwd=tmp_path, env_extra={"HYDRA_FULL_ERROR": "1"})
    assert r.returncode != 0 and "Traceback" in r.stderr and "ConfigError" in r.stderr and "kl.beta" in r.stderr


@pytest.mark.parametrize("overrides, key, value", [
    (["algo.clip_eps=0"], "algo.clip_eps", 0.0),
    (["kl.beta=-0.5"], "kl.beta", -0.5),
    (["kl=adaptive", "kl.target=0"], "kl.target", 0.0),
    (["algo.reference.path=/x", "algo.reference.sync_every=5"], "algo.reference.sync_every", 5),
    (["algo.reference.kind=lora_disabled"], "algo.lora.r", 0),
    (["algo.reference.kind=lora_disabled", "algo.lora.r=8", "algo.critic=rm"], "algo.critic", "rm"),
    (["algo.lora.r=-1"], "algo.lora.r", -1),
    (["algo.lam=1.5"], "algo.lam", 1.5),
    (["algo.max_kl=0"], "algo.max_kl", 0.0),
    (["algo.min_entropy=-1"], "algo.min_entropy", -1.0),
    (["algo.gamma=-0.1"], "algo.gamma", -0.1),
    (["algo.batch_size=0"], "algo.batch_size", 0),
    (["algo.batch_size=10", "algo.num_minibatches=4"], "algo.batch_size", 10),
    (["algo.critic=none", "algo.baseline=loo"], "algo.samples_per_prompt", 1),
    (["generation.top_p=0"], "generation.top_p", 0.0),
    (["generation.temperature=0"], "generation.temperature", 0.0),
    (["trainer.max_steps=0"], "trainer.max_steps", 0),
    (["trainer.threads=0"], "trainer.threads", 0),
    (["eval.n_prompts=0"], "eval.n_prompts", 0),
    (["sft.lr=0"], "sft.lr", 0.0),
    (["pretrain.batch_size=-2"], "pretrain.batch_size", -2),
    (["data.on_policy_fraction=1.5"], "data.on_policy_fraction", 1.5),
    (["data.on_policy_fraction=0.2"], "data.on_policy_path", None),
    (["data=jsonl"], "data.path", "???"),
    (["data=jsonl", "data.path=/no/such/pairs.jsonl"], "data.path", "/no/such/pairs.jsonl"),
    (["reward_model.ensemble=0"], "reward_model.ensemble", 0),
    (["reward_model.lora.dropout=1.0"], "reward_model.lora.dropout", 1.0),
    (["algo=dpo", "algo.beta=0"], "algo.beta", 0.0),
    (["algo=dpo", "algo.label_smoothing=0.5"], "algo.label_smoothing", 0.5),
    (["algo=dpo", "algo.label_smoothing=0.1", "algo.loss_type=ipo"], "algo.label_smoothing", 0.1),
    (["algo=dpo", "algo.reference.sync_every=3"], "algo.reference.sync_every", 3),
    (["algo=dpo", "algo.online=true", "algo.reference.kind=precomputed"], "algo.reference.kind", "precomputed"),
    (["algo.kl_in=loss", "algo.kl_estimator=k1"], "algo.kl_estimator", "k1"),
    (["algo.reference.kind=precomputed"], "algo.reference.kind", "precomputed"),
    (["algo=rloo", "algo.clip_eps_high=-0.1"], "algo.clip_eps_high", -0.1),
])
def test_validate_names_key_value_and_what_is_allowed(overrides, key, value):
    with pytest.raises(ConfigError) as exc:
        C.validate(compose_cfg(overrides))
    err = exc.value
    assert (err.key, err.value) == (key, value)
    assert "\n" not in str(err) and str(err).startswith(f"{key} must be ") and err.allowed in str(err)


@pytest.mark.slow
def test_shipped_configs_pass():
    for algo in ("pretrain", "sft", "rm", "ppo", "grpo", "rloo", "bon", "dpo"):
        C.validate(compose_cfg([f"algo={algo}"]))
        C.validate(compose_cfg(TINY + [f"algo={algo}"]))
    for extra in (["kl=fixed", "kl.beta=0"], ["reward_model=different_source"], ["trainer=ddp_cpu"],
                  ["data=jsonl", f"data.path={__file__}"], ["algo.reference.kind=lora_disabled", "algo.lora.r=16"]):
        C.validate(compose_cfg(extra))


def test_a_choice_reaches_the_code_as_the_text_it_was():
    """A StrEnum-typed key is its plain text in what the config becomes (to_plain: cache keys, job digests, params)."""
    from rlhf_lab.config.keys import to_plain

    plain = to_plain(compose_cfg(["algo.critic=none", "policy.dtype=bfloat16"]))
    assert type(plain["algo"]["critic"]) is str and plain["algo"]["critic"] == "none"
    assert type(plain["reward_model"]["dtype"]) is str and plain["reward_model"]["dtype"] == "bfloat16"


def test_a_kl_estimator_is_one_enum_member_and_one_function(monkeypatch):
    """docs/architecture.md's worked example: the checks and the maths read the estimators from one Enum."""
    from rlhf_lab.algorithms import kl

    assert set(kl.ESTIMATORS) == set(kl.KLEstimator) and all(kl.ESTIMATORS[e].__name__ == e.value for e in kl.KLEstimator)
    with pytest.raises(Exception) as exc:
        compose_cfg(["algo.kl_estimator=k4"])
    assert C.composition_error_line(exc.value) == "algo.kl_estimator must be one of k1, k2, k3, got 'k4'"
