"""Pure tensor math for preference learning: DPO-family losses and reward-model loss.

References
----------
- Rafailov et al. 2023, "Direct Preference Optimization: Your Language Model is
  Secretly a Reward Model" (DPO, eq. 7; implicit reward, section 5).
- Mitchell 2023, "A note on DPO with noisy preferences & relationship to IPO"
  (conservative DPO / label smoothing).
- Azar et al. 2023, "A General Theoretical Paradigm to Understand Learning from
  Human Preferences" (IPO, eq. 17).
- Zhao et al. 2023, "SLiC-HF: Sequence Likelihood Calibration with Human Feedback"
  (hinge loss).
- Bradley & Terry 1952; Ouyang et al. 2022 eq. (1) (reward-model loss);
  Eisenstein et al. 2023 / TRL ``center_rewards_coefficient`` (reward centering).
"""

from __future__ import annotations

from enum import StrEnum

import torch
import torch.nn.functional as F
from torch import Tensor

class PreferenceLoss(StrEnum):
    """``algo.loss_type`` of DPO (:func:`preference_loss`)."""

    sigmoid = "sigmoid"
    ipo = "ipo"
    ipo_sum = "ipo_sum"
    hinge = "hinge"


def preference_loss(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
    chosen_lengths: Tensor | None = None,
    rejected_lengths: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-example DPO-family losses from sequence log-probabilities (all shape ``[B]``).

    ``logits = (log pi(y_w) - log pi(y_l)) - (log ref(y_w) - log ref(y_l))``

    - ``sigmoid`` (DPO, Rafailov et al. 2023 eq. 7; conservative DPO with label
      smoothing ``eps``, Mitchell 2023):
      ``-(1 - eps) * logsigmoid(beta * logits) - eps * logsigmoid(-beta * logits)``
    - ``ipo`` (Azar et al. 2023 eq. 17): ``(logits - 1 / (2 * beta))**2`` on **length-averaged**
      log-probabilities: each of the four log-probs is divided by its response's token count
      (``chosen_lengths``, ``rejected_lengths``, required). This is what the IPO authors' results use and what
      TRL's ``DPOTrainer(loss_type="ipo")`` does (it averages the log-probs over the completion tokens), so the
      target 1/(2β) is a per-token log-ratio margin and the loss does not depend on the response length.
    - ``ipo_sum``: the same loss on summed sequence log-probs (the 1/(2β) target is per *sequence*: with β = 0.1
      and a 0.1 nat/token margin, 20.25 at 5 tokens and 1.0 at 40).
    - ``hinge`` (SLiC-HF, Zhao et al. 2023): ``relu(1 - beta * logits)``

    Returns ``(losses, chosen_rewards, rejected_rewards)`` where the implicit rewards
    are ``beta * (log pi - log ref)`` (DPO section 5), detached.
    """
    if not beta > 0:
        raise ValueError(f"algo.beta must be > 0, got {beta}")
    if loss_type not in tuple(PreferenceLoss):
        raise ValueError(f"Unknown loss_type {loss_type!r}; allowed values: {', '.join(PreferenceLoss)}")
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"algo.label_smoothing must be in [0, 0.5), got {label_smoothing}")
    if label_smoothing > 0 and loss_type != "sigmoid":
        raise ValueError(f"algo.label_smoothing is only supported with loss_type='sigmoid', got {loss_type!r}")

    if loss_type == "ipo":
        if chosen_lengths is None or rejected_lengths is None:
            raise ValueError("loss_type='ipo' averages the log-probs over the response tokens: pass chosen_lengths "
                             "and rejected_lengths (or use loss_type='ipo_sum' for summed log-probs)")
        nc, nr = chosen_lengths.to(policy_chosen_logps).clamp(min=1), rejected_lengths.to(policy_chosen_logps).clamp(min=1)
        policy_chosen_logps, ref_chosen_logps = policy_chosen_logps / nc, ref_chosen_logps / nc
        policy_rejected_logps, ref_rejected_logps = policy_rejected_logps / nr, ref_rejected_logps / nr
    logits = (policy_chosen_logps - policy_rejected_logps) - (ref_chosen_logps - ref_rejected_logps)
    if loss_type == "sigmoid":
        losses = -F.logsigmoid(beta * logits) * (1 - label_smoothing) - F.logsigmoid(-beta * logits) * label_smoothing
    elif loss_type in ("ipo", "ipo_sum"):
        losses = (logits - 1 / (2 * beta)) ** 2
    else:  # hinge
        losses = torch.relu(1 - beta * logits)

    chosen_rewards = beta * (policy_chosen_logps - ref_chosen_logps).detach()
    rejected_rewards = beta * (policy_rejected_logps - ref_rejected_logps).detach()
    return losses, chosen_rewards, rejected_rewards


def bradley_terry_loss(
    r_chosen: Tensor, r_rejected: Tensor, margin: Tensor | float | None = None, center_coef: float = 0.0
) -> Tensor:
    """Reward-model loss under the Bradley-Terry model (Ouyang et al. 2022 eq. 1).

    ``loss = mean(-logsigmoid(r_chosen - r_rejected - margin))
             + center_coef * mean((r_chosen + r_rejected)**2)``

    The optional ``margin`` (Llama 2, Touvron et al. 2023 eq. 2) demands a larger gap
    for clearer preferences; the centering term (TRL's ``center_rewards_coefficient``,
    Eisenstein et al. 2023) keeps rewards near zero mean.
    """
    diff = r_chosen - r_rejected
    if margin is not None:
        diff = diff - margin
    loss = -F.logsigmoid(diff).mean()
    if center_coef:
        loss = loss + center_coef * torch.mean((r_chosen + r_rejected) ** 2)
    return loss
