"""LoRA adapters (peft), one way for every model that takes them, and the adapters-off reference.

Every config block that asks for LoRA has the same keys, ``lora: {r, alpha, dropout, target_modules}``
(``algo.lora`` for PPO and DPO, ``reward_model.lora``): ``r = 0`` means full fine-tuning; ``alpha``
null means ``2·r``. ``target_modules``: null is peft's default for the architecture (the attention
projections), ``all-linear`` every linear layer but the output head, ``attention`` or ``mlp`` those of the
architecture by name (:data:`MODULE_GROUPS`: Llama, Qwen2, Mistral, GPT-NeoX/Pythia, GPT-2, BERT), or a
list of module names (suffixes, as peft matches them) or one regular expression.
"""

from __future__ import annotations

import contextlib
import re

# the linear modules of each part of a block, by model_type; GPT-2's c_proj is in both parts (hence regexes)
PROJ = ["q_proj", "k_proj", "v_proj", "o_proj"]
GATED_MLP = ["gate_proj", "up_proj", "down_proj"]
MODULE_GROUPS = {
    "attention": {"llama": PROJ, "qwen2": PROJ, "mistral": PROJ, "gpt_neox": ["query_key_value", "dense"],
                  "gpt2": r".*\.attn\.(c_attn|c_proj)", "bert": r".*\.attention\.(self\.(query|key|value)|output\.dense)"},
    "mlp": {"llama": GATED_MLP, "qwen2": GATED_MLP, "mistral": GATED_MLP,
            "gpt_neox": ["dense_h_to_4h", "dense_4h_to_h"], "gpt2": r".*\.mlp\.(c_fc|c_proj)",
            "bert": r".*\.layer\.\d+\.(intermediate|output)\.dense"},
}


def linear_module_names(model) -> list[str]:
    """The distinct last names of the model's linear layers (``nn.Linear`` and GPT-2's ``Conv1D``)."""
    import torch

    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules()
             if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D"}
    return sorted(names)


def resolve_target_modules(model, targets, key: str = "lora.target_modules"):
    """``target_modules`` as peft takes it: ``attention``/``mlp`` become the architecture's module names
    (:data:`MODULE_GROUPS`); a list must name at least one module of the model (else a ValueError naming
    `key` and the model's linear modules)."""
    if targets is None or targets == "all-linear":
        return targets
    model_type = str(getattr(getattr(model, "config", None), "model_type", ""))
    if isinstance(targets, str) and targets in MODULE_GROUPS:
        by_type = MODULE_GROUPS[targets]
        if model_type not in by_type:
            raise ValueError(f"{key}={targets}: no module names for model_type {model_type!r} (known: "
                             f"{', '.join(sorted(by_type))}); list them, e.g. {linear_module_names(model)}")
        return by_type[model_type]
    names = [n for n, _ in model.named_modules()]
    if isinstance(targets, str):
        hit = any(re.fullmatch(targets, n) for n in names)
    else:
        targets = [str(t) for t in targets]
        hit = any(n == t or n.endswith("." + t) for n in names for t in targets)
    if not hit:
        raise ValueError(f"{key}={targets}: matches no module of this {model_type or type(model).__name__} model; "
                         f"its linear modules are {linear_module_names(model)} (or use all-linear, attention, mlp)")
    return targets


def with_lora(model, lora, task_type: str, key: str = "lora"):
    """`model` with LoRA adapters from a ``lora`` config block (named `key` in errors); unchanged when
    ``lora.r`` is 0."""
    r = int(lora.r)
    if r < 0:
        raise ValueError(f"{key}.r must be >= 0 (0 = full fine-tuning), got {r}")
    if r == 0:
        return model
    from peft import LoraConfig, get_peft_model

    targets = lora.get("target_modules")
    if targets is not None and not isinstance(targets, str):
        targets = list(targets)
    targets = resolve_target_modules(model, targets, f"{key}.target_modules")
    alpha = lora.get("alpha")
    return get_peft_model(model, LoraConfig(
        r=r, lora_alpha=float(alpha) if alpha is not None else 2.0 * r, lora_dropout=float(lora.get("dropout") or 0.0),
        target_modules=targets, task_type=task_type))


def unwrap(model):
    """The transformers model inside a peft model (its LoRA layers stay injected), or the model itself."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


class AdapterDisabled:
    """A reference that is the LoRA policy's base with its adapters disabled (``reference.kind=lora_disabled``):
    calling it runs the peft model inside ``disable_adapter()``; no second copy of the weights."""

    def __init__(self, peft_model):
        if not hasattr(peft_model, "disable_adapter"):
            raise ValueError("reference.kind=lora_disabled needs a LoRA policy: set algo.lora.r > 0 (e.g. 16)")
        self.model = peft_model

    @contextlib.contextmanager
    def adapters_off(self):
        """Inside: the peft model with its adapters disabled, for a pass that calls its parts (its trunk) itself."""
        with self.model.disable_adapter():
            yield self.model

    def __call__(self, *args, **kwargs):
        with self.adapters_off() as model:
            return model(*args, **kwargs)

    def parameters(self):
        return self.model.parameters()
