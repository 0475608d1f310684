"""Checkpoints that do not match their config fail, on one line naming the key and the folder: weights of another
architecture (transformers would initialise every missing weight anew and run), a missing or empty folder, config.json
without weights, an invalid config.json, weights of the wrong shapes, no tokenizer; through the CLI these exit 2. The
loads that legitimately leave weights aside (the scalar head of an RM built on a causal LM or an encoder, the
causal LM's unembedding it drops, tied weights) raise nothing."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
from pathlib import Path

import mlflow
import pytest
import torch

from rlhf_lab.config.errors import ConfigError
from rlhf_lab.models import families as F
from rlhf_lab.models.checkpoints import CheckpointError, CheckpointNotFound, check_weights_only, load_problems
from rlhf_lab.models.reward import NORM_FILE, RewardScorer
from tests import cli_process
from tests.tiny_archs import ARCHS, chat_tokenizer, tiny_config, world_pairs

ROOT = Path(__file__).resolve().parents[1]
BROKEN = ("mismatched", "missing", "empty", "no_weights", "invalid_config", "wrong_shapes", "no_tokenizer")
# what each broken folder's message says, besides the key and the folder
SAYS = {
    # tiny GPT-2: 29 weights, 27 of them absent from the Llama file (lm_head.weight is in both, and
    # transformer.wte.weight is tied to it); the Llama file's other 20 tensors fit no GPT-2 weight
    "mismatched": r"model\.safetensors does not match its config\.json \(GPT2LMHeadModel\): 27 of 29 weights missing "
                  r"from it .*; 20 weights in it that the model has no place for \(model\.embed_tokens\.weight",
    "missing": "no such checkpoint directory",
    "empty": "a directory without a Hugging Face checkpoint",
    "no_weights": "could not be loaded .*no file named model.safetensors",
    "invalid_config": r"could not be loaded .*config\.json' is not a valid JSON file",
    "wrong_shapes": r"28 of 29 weights of another shape in it \(e\.g\. transformer\.h\.0\.attn\.c_attn\.bias: \[96\] "
                    r"saved, \[192\] in the model\)",
    "no_tokenizer": "no tokenizer files",
}


def save_tiny(folder: Path, arch: str, tok, seed: int = 0) -> Path:
    """A randomly initialised tiny causal LM of `arch` (tests/tiny_archs.py) with `tok`, saved with save_pretrained."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(tiny_config(arch, tok)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def copy_files(src: Path, dst: Path, keep) -> Path:
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if keep(f.name):
            shutil.copy(f, dst / f.name)
    return dst


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """{"tok": tokenizer, arch: folder} for the four tiny architectures, and the broken folders of :data:`BROKEN`
    made from them ({case: folder})."""
    root = tmp_path_factory.mktemp("checkpoints")
    tok = chat_tokenizer([f"{p} {c} {r}" for p, c, r in world_pairs(60, seed=1)])
    out = {"tok": tok, **{arch: save_tiny(root / arch, arch, tok, i) for i, arch in enumerate(ARCHS)}}
    gpt2, llama = out["gpt2"], out["llama"]
    is_weights = lambda name: name.endswith(".safetensors")  # noqa: E731
    broken = {"missing": root / "absent"}
    broken["mismatched"] = copy_files(gpt2, root / "mismatched", lambda n: not is_weights(n))
    shutil.copy(llama / "model.safetensors", broken["mismatched"] / "model.safetensors")
    broken["empty"] = copy_files(gpt2, root / "empty", lambda n: False)
    broken["no_weights"] = copy_files(gpt2, root / "no_weights", lambda n: not is_weights(n))
    broken["invalid_config"] = copy_files(gpt2, root / "invalid_config", lambda n: True)
    (broken["invalid_config"] / "config.json").write_text('{"model_type": "gpt2", ')
    broken["wrong_shapes"] = copy_files(gpt2, root / "wrong_shapes", lambda n: True)
    config = json.loads((gpt2 / "config.json").read_text())
    (broken["wrong_shapes"] / "config.json").write_text(json.dumps({**config, "n_embd": 64}))
    broken["no_tokenizer"] = copy_files(gpt2, root / "no_tokenizer", lambda n: n == "config.json" or is_weights(n))
    out["broken"] = broken
    return out


# ------------------------------------------------------------------------------------------------
# the loading check


@pytest.mark.parametrize("case", BROKEN)
def test_a_broken_policy_folder_is_one_line_naming_key_and_folder(case, tiny):
    folder = tiny["broken"][case]
    with pytest.raises(CheckpointError) as err:  # the stages load the tokenizer first, then the model
        F.load_causal_lm(folder, F.load_tokenizer(folder, "policy.name_or_path"), "policy.name_or_path")
    text = str(err.value)
    assert "\n" not in text and text.startswith(f"policy.name_or_path={str(folder)!r}: "), text
    assert re.search(SAYS[case], text), text
    assert isinstance(err.value, ConfigError)  # the CLI prints it on one line and exits 2
    if case in ("missing", "empty"):
        assert isinstance(err.value, FileNotFoundError)  # as before


@pytest.mark.parametrize("case", ("mismatched", "no_weights", "invalid_config", "wrong_shapes"))
def test_a_broken_rm_backbone_folder_is_one_line_too(case, tiny):
    folder = tiny["broken"][case]
    with pytest.raises(CheckpointError, match=r"^reward_model\.name_or_path=.*: "):
        F.load_sequence_scorer(folder, None, "reward_model.name_or_path")


def test_the_mismatched_folder_as_an_rm_backbone_is_refused_though_its_head_may_be_new(tiny):
    """An RM built on a backbone may miss its scalar head, but not the backbone: 28 of 29 (all but the tied
    embedding) are missing from the Llama file."""
    with pytest.raises(CheckpointError, match=r"28 of 29 weights missing from it \(newly initialised: transformer\."):
        F.load_sequence_scorer(tiny["broken"]["mismatched"], None, "reward_model.name_or_path")


@pytest.mark.parametrize("arch", ARCHS)
def test_an_rm_on_a_causal_lm_backbone_loads_and_a_saved_rm_reloads_whole(arch, tiny, tmp_path):
    """The scalar head is new and the LM head (Llama's lm_head, GPT-NeoX's embed_out; tied in Qwen2 and GPT-2) is
    dropped: no error. A saved RM reloads with nothing missing, and a backbone is no trained RM."""
    tok = tiny["tok"]
    F.load_causal_lm(tiny[arch], tok)
    rm = F.load_sequence_scorer(tiny[arch], tok, "reward_model backbone")
    rm.save_pretrained(tmp_path / "rm")
    back = F.load_sequence_scorer(tmp_path / "rm", tok, "reward_model.path", new_head=False)
    assert torch.equal(back.score.weight, rm.score.weight)
    with pytest.raises(CheckpointError, match=r"1 of \d+ weights missing from it \(newly initialised: score\.weight\)"):
        F.load_sequence_scorer(tiny[arch], tok, "reward_model.path", new_head=False)


@pytest.mark.parametrize("family", ("a", "b"))
def test_the_worlds_own_models_load_as_policy_and_as_rm_backbone(family, tmp_path):
    """The pretrain stage's models (Llama with tied embeddings, GPT-2), saved as the stages save them."""
    tok = F.train_tokenizer(family, [" ".join(t) for t in world_pairs(60)], 300)
    F.build_model(family, {"hidden": 16, "layers": 1, "heads": 2}, tok).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    F.load_causal_lm(tmp_path, F.load_tokenizer(tmp_path))
    F.load_sequence_scorer(tmp_path, tok, "reward_model backbone").save_pretrained(tmp_path / "rm")
    F.load_sequence_scorer(tmp_path / "rm", tok, "reward_model.path", new_head=False)


def test_an_encoder_backbone_gets_its_classifier_head(tmp_path):
    """A BERT encoder (as MiniLM) saved as a bare BertModel: the RM's `classifier` is new, nothing else."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32)).save_pretrained(tmp_path)
    rm = F.load_sequence_scorer(tmp_path, None, "reward_model.name_or_path")
    assert type(rm).__name__ == "BertForSequenceClassification"
    with pytest.raises(CheckpointError, match=r"2 of \d+ weights missing from it \(newly initialised: classifier\.bias, "
                                              r"classifier\.weight\)"):
        F.load_sequence_scorer(tmp_path, None, "reward_model.path", new_head=False)


def test_minilm_loads_as_an_rm_backbone_without_a_false_alarm():
    """reward_model=minilm: sentence-transformers' BertModel checkpoint, whose only gap is the RM's new head."""
    pytest.importorskip(F.MINILM_PACKAGE)
    minilm = F.pretrained_path("minilm")
    rm = F.load_sequence_scorer(minilm, None, "reward_model.name_or_path")
    assert type(rm).__name__ == "BertForSequenceClassification"
    with pytest.raises(CheckpointError, match=r"2 of \d+ weights missing from it \(newly initialised: classifier\."):
        F.load_sequence_scorer(minilm, None, "reward_model.path", new_head=False)


def test_load_problems_reads_transformers_loading_report(tiny):
    """Only weights outside the backbone (base_model_prefix) pass as a new head; the counts are of the model's."""
    model = F.load_sequence_scorer(tiny["llama"], tiny["tok"])
    n = len(model.state_dict())
    info = {"missing_keys": {"score.weight"}, "unexpected_keys": {"lm_head.weight"}, "mismatched_keys": set(),
            "error_msgs": []}
    assert load_problems(info, model, new_head=True) == []
    assert load_problems(info, model) == [f"1 of {n} weights missing from it (newly initialised: score.weight)",
                                          "1 weight in it that the model has no place for (lm_head.weight)"]
    info["missing_keys"] = {"score.weight", "model.norm.weight"}
    assert load_problems(info, model, new_head=True) == [
        f"1 of {n} weights missing from it (newly initialised: model.norm.weight)"]


def test_a_tokenizer_of_another_model_is_a_checkpoint_error(tiny):
    large = F.train_tokenizer("b", [" ".join(t) for t in world_pairs(300)], 600)
    assert len(large) > len(tiny["tok"])
    with pytest.raises(CheckpointError, match=r"policy\.name_or_path=.*gpt2': the tokenizer has \d+ tokens .*not a pair"):
        F.load_causal_lm(tiny["gpt2"], large)


# ------------------------------------------------------------------------------------------------
# what is refused before it is read: a model larger than the memory, a pickle that would run code


def test_a_model_the_memory_cannot_hold_is_refused_before_it_is_allocated(tiny, tmp_path, monkeypatch):
    """A config.json with vocab_size=4e8 tried to allocate 51 GB (a traceback): its parameters are counted on the meta
    device first and compared with the memory available, and the key, the count and the bytes are one line."""
    from transformers import AutoConfig, AutoModelForCausalLM

    big = copy_files(tiny["gpt2"], tmp_path / "big", lambda n: True)
    config = json.loads((big / "config.json").read_text())
    (big / "config.json").write_text(json.dumps({**config, "vocab_size": 400_000_000}))
    params, n_bytes, dtype = F.model_footprint(AutoModelForCausalLM, AutoConfig.from_pretrained(big))
    h = config["n_embd"]
    assert params > 400_000_000 * h and (n_bytes, dtype) == (4 * params, "float32")  # nothing allocated
    monkeypatch.setattr(F, "available_memory", lambda: 4 * params - 1, raising=False)
    with pytest.raises(CheckpointError) as exc:
        F.load_causal_lm(big, tiny["tok"], "policy.name_or_path")
    text = str(exc.value)
    assert text.startswith(f"policy.name_or_path={str(big)!r}: its config.json describes a model of {params:,} "
                           f"parameters ({4 * params / 1e9:.1f} GB in float32), more than the ") and "\n" not in text
    # the tiny model itself, with less memory than it needs: refused too (bfloat16: half the bytes)
    monkeypatch.setattr(F, "available_memory", lambda: 1000, raising=False)
    with pytest.raises(CheckpointError, match=r"^reward_model\.name_or_path=.* more than the 1\.0 kB of memory"):
        F.load_sequence_scorer(tiny["gpt2"], None, "reward_model.name_or_path")
    small = F.model_footprint(AutoModelForCausalLM, AutoConfig.from_pretrained(tiny["gpt2"]), torch.bfloat16)
    assert small[1:] == (2 * small[0], "bfloat16")
    (big / "config.json").write_text(json.dumps({**config, "vocab_size": 4e8}))  # a float: transformers' type error
    with pytest.raises(CheckpointError, match=r"^policy\.name_or_path=.*: could not be loaded \(StrictDataclass"):
        F.load_causal_lm(big, tiny["tok"], "policy.name_or_path")


class Payload:
    """Unpickled, it creates the file `marker` (what a planted checkpoint would do with any code of its choosing)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def planted_checkpoint(path: Path, marker: Path) -> Path:
    """A Lightning-looking checkpoint whose pickle creates `marker` when it is loaded with weights_only=False."""
    torch.save({"state_dict": {"w": torch.zeros(2)}, "global_step": 3, "payload": Payload(marker)}, path)
    return path


def test_a_training_checkpoint_is_read_as_tensors_and_plain_values_only(tmp_path):
    marker = tmp_path / "ran"
    planted = planted_checkpoint(tmp_path / "evil.ckpt", marker)
    torch.load(planted, weights_only=False)
    assert marker.exists()  # the payload is live: loaded as Lightning loaded a URL, it runs
    marker.unlink()
    with pytest.raises(CheckpointError) as exc:
        check_weights_only(planted, "algo.resume_from")
    assert str(exc.value).startswith(f"algo.resume_from={str(planted)!r}: not loadable with torch.load(weights_only="
                                     "True) (Unsupported global: GLOBAL io.open was not an allowed global by default)")
    assert "\n" not in str(exc.value) and "\x1b" not in str(exc.value) and not marker.exists()
    raw = tmp_path / "raw.ckpt"
    raw.write_bytes(pickle.dumps({"payload": Payload(marker)}))
    with pytest.raises(CheckpointError, match="raw.ckpt': not a checkpoint torch.save wrote in its zip format"):
        check_weights_only(raw, "cache_dir")
    assert not marker.exists()
    torch.save({"state_dict": {"w": torch.zeros(2)}, "loops": {"fit_loop": {"epoch": 1}}, "rng": torch.get_rng_state(),
                "python_rng": __import__("random").getstate(), "hparams": {"lr": 1e-3, "name": "x"}}, tmp_path / "ok.ckpt")
    check_weights_only(tmp_path / "ok.ckpt", "algo.resume_from")


@pytest.mark.slow
def test_cli_a_checkpoint_url_or_a_pickle_for_resume_from_is_one_line_and_nothing_runs(tmp_path):
    """algo.resume_from=http://127.0.0.1:<port>/evil.ckpt ran the file's payload as the job's user (Lightning loads an
    http(s) checkpoint with weights_only=False) before failing; a pickled local .ckpt was a traceback. Both: exit 2,
    one line naming algo.resume_from, the server never asked, the payload never run."""
    import http.server
    import threading

    from tests.conftest import TINY

    marker = tmp_path / "ran"
    planted = planted_checkpoint(tmp_path / "evil.ckpt", marker)
    asked: list[str] = []

    class Files(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(tmp_path), **kwargs)

        def log_message(self, *args):  # every request is logged: counted
            asked.append(self.path)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Files)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("HYDRA_FULL_ERROR", None)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/evil.ckpt"
        for given in (url, str(planted)):
            job = tmp_path / f"job{len(given)}"
            job.mkdir()
            r = cli_process.run([*TINY, "algo=ppo", f"algo.resume_from={given}", f"cache_dir={tmp_path / 'cache'}"],
                                cwd=job, env=env, timeout=900)
            assert r.returncode == 2, r.stderr[-3000:]
            lines = r.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("rlhf-lab: config error: algo.resume_from"), r.stderr[-3000:]
            assert not marker.exists() and not asked and not (job / "mlflow.db").exists()
    finally:
        server.shutdown()


def test_checkpoint_errors_survive_pickling():
    err = pickle.loads(pickle.dumps(CheckpointNotFound("policy.name_or_path", "/x", "no such checkpoint directory")))
    assert isinstance(err, FileNotFoundError) and str(err) == "policy.name_or_path='/x': no such checkpoint directory"


# ------------------------------------------------------------------------------------------------
# trained reward-model folders: nothing may be missing


def rm_folder(root: Path, tok, member: Path, norm: str | None = None) -> Path:
    """An RM artifact folder whose member_0 is a copy of `member`, with `norm` as rm_norm.json (default: valid)."""
    tok.save_pretrained(root)
    shutil.copytree(member, root / "member_0")
    (root / NORM_FILE).write_text(norm if norm is not None else json.dumps({"n_members": 1, "gain": 1.0, "bias": 0.0}))
    return root


def test_a_reward_model_folder_must_hold_trained_rms(tiny, tmp_path):
    tok = tiny["tok"]
    rm = F.load_sequence_scorer(tiny["gpt2"], tok)
    rm.save_pretrained(tmp_path / "trained")
    good = rm_folder(tmp_path / "good", tok, tmp_path / "trained")
    RewardScorer.from_path(good, key="reward_model.path")  # a trained RM: nothing missing, nothing raised
    lm = rm_folder(tmp_path / "lm", tok, tiny["gpt2"])  # a causal LM is no trained RM: its head would be random
    with pytest.raises(CheckpointError, match=r"^reward_model\.path=.*member_0': .*score\.weight"):
        RewardScorer.from_path(lm, key="reward_model.path")
    arch = rm_folder(tmp_path / "arch", tok, tiny["broken"]["mismatched"])
    with pytest.raises(CheckpointError, match=r"^gold\.path=.*member_0': model\.safetensors does not match"):
        RewardScorer.from_path(arch, key="gold.path")
    shutil.rmtree(good / "member_0")
    with pytest.raises(CheckpointNotFound, match=r"^reward_model\.path=.*member_0': no such checkpoint directory"):
        RewardScorer.from_path(good, key="reward_model.path")
    bad = rm_folder(tmp_path / "bad_norm", tok, tmp_path / "trained", norm="{")
    with pytest.raises(CheckpointError, match=r"^reward_model\.path=.*: rm_norm\.json is not valid JSON"):
        RewardScorer.from_path(bad, key="reward_model.path")
    with pytest.raises(CheckpointNotFound, match="not a reward-model folder"):
        RewardScorer.from_path(tmp_path, key="reward_model.path")


# ------------------------------------------------------------------------------------------------
# through the CLI: exit 2, one line on stderr


def cli(tmp_path: Path, overrides: list[str]):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": p, "chosen": c, "rejected": r}) + "\n"
                             for p, c, r in world_pairs(30)))
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("HYDRA_FULL_ERROR", None)
    return cli_process.run(["algo=dpo", "sft.steps=0", "data=jsonl", f"data.path={pairs}", "data.eval_fraction=0.2",
                            "data.test_fraction=0.2", "algo.batch_size=4", "trainer.max_steps=1", "eval.n_prompts=2",
                            "eval.n_test_prompts=2", "eval.n_ood_prompts=0", "eval.every_n_steps=0",
                            "generation.max_new_tokens=4", "trainer.progress_bar=false", "trainer.threads=1",
                            f"cache_dir={tmp_path / 'cache'}", *overrides], cwd=tmp_path, env=env, timeout=600)


def assert_one_line_exit_2(r, tmp_path: Path, *needles: str) -> None:
    """Exit 2, stderr one config-error line holding every needle, and no DPO run started."""
    assert r.returncode == 2, r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlhf-lab: config error: "), r.stderr[-3000:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    if (tmp_path / "mlflow.db").exists():
        mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
        runs = mlflow.search_runs(search_all_experiments=True)
        assert not len(runs) or "dpo" not in set(runs.get("tags.rlhf_lab.stage", [])), runs


@pytest.mark.slow
@pytest.mark.parametrize("case", BROKEN)
def test_cli_a_broken_policy_folder_exits_2_with_one_line(case, tiny, tmp_path):
    folder = tiny["broken"][case]
    r = cli(tmp_path, [f"policy.name_or_path={folder}"])
    assert_one_line_exit_2(r, tmp_path, f"policy.name_or_path={str(folder)!r}: ")


@pytest.mark.slow
def test_cli_a_reward_model_folder_of_a_causal_lm_exits_2_with_one_line(tiny, tmp_path):
    """reward_model.path whose member is a Llama file under a GPT-2 config.json (DPO's proxy RM loads it)."""
    rm = rm_folder(tmp_path / "rm", tiny["tok"], tiny["broken"]["mismatched"])
    r = cli(tmp_path, [f"policy.name_or_path={tiny['gpt2']}", "algo.proxy_rm=true", f"reward_model.path={rm}"])
    assert_one_line_exit_2(r, tmp_path, f"reward_model.path={str(rm / 'member_0')!r}: ",
                           "model.safetensors does not match its config.json (GPT2LMHeadModel)")
