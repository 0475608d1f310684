"""LoRA adapters (peft), one way for every model that takes them, and the adapters-off reference.

Every config block that asks for LoRA has the same keys, ``lora: {r, alpha, dropout, target_modules}``
(``algo.lora`` for PPO and DPO, ``reward_model.lora``): ``r = 0`` means full fine-tuning; ``alpha``
null means ``2·r``; ``target_modules`` null means peft's default for the architecture, ``all-linear``
every linear layer but the output head.
"""

from __future__ import annotations


def with_lora(model, lora, task_type: str):
    """`model` with LoRA adapters from a ``lora`` config block; unchanged when ``lora.r`` is 0."""
    r = int(lora.r)
    if r < 0:
        raise ValueError(f"lora.r must be >= 0 (0 = full fine-tuning), got {r}")
    if r == 0:
        return model
    from peft import LoraConfig, get_peft_model

    targets = lora.get("target_modules")
    if targets is not None and not isinstance(targets, str):
        targets = list(targets)
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

    def __call__(self, *args, **kwargs):
        with self.model.disable_adapter():
            return self.model(*args, **kwargs)

    def parameters(self):
        return self.model.parameters()
