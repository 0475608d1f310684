"""The KL between the policy and its reference: the per-token estimators (Schulman 2020) and the KL coefficient
controllers (Ziegler et al. 2019). Pure functions on tensors, as :mod:`rlhf_lab.algorithms.rl_math`.

Every choice lives here once, as an Enum beside the code that implements it; the config checks
(:func:`rlhf_lab.config.checks.check_ppo`) and the sweeps read the same Enums. **Adding an estimator** ``k4`` is
one member of :class:`KLEstimator` and one function ``k4(logr)`` below it (``ESTIMATORS`` finds it by name, and
refuses at import a member without its function); ``algo.kl_estimator=k4`` then works everywhere, and
``KL_GRADIENT_ESTIMATORS`` says whether it may go in the loss (``algo.kl_in=loss``).

References: Schulman 2020, "Approximating KL Divergence", http://joschu.net/blog/kl-approx.html; Ziegler et al. 2019,
"Fine-Tuning Language Models from Human Preferences" (per-token KL penalty, adaptive controller, section 2.2).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Callable

import torch
from torch import Tensor


class KLEstimator(StrEnum):
    """``algo.kl_estimator``: with ``logr = log ref(x) − log π(x)`` on tokens x ~ π (so ``r = ref/π``, ``E_π[r] = 1``)."""

    k1 = "k1"  # −logr: unbiased, high variance, can be negative
    k2 = "k2"  # logr² / 2: biased (low bias when π ≈ ref), ≥ 0
    k3 = "k3"  # (r − 1) − logr: unbiased, ≥ 0, low variance


K3_LOG_RATIO_CLAMP = 20.0  # k3 exponentiates the log-ratio: beyond this it only overflows


def k1(logr: Tensor) -> Tensor:
    return -logr


def k2(logr: Tensor) -> Tensor:
    return 0.5 * logr**2


def k3(logr: Tensor) -> Tensor:
    """Computed on ``logr`` clamped to ±``K3_LOG_RATIO_CLAMP`` (20): a token whose log-ratio is beyond that (a ratio
    above 5·10⁸, e.g. a padding position, or a bf16 rounding of a near-impossible token) would give ``inf``, and
    ``inf`` times the zero of a mask is NaN in the backward pass even where the forward pass masks it. OpenRLHF clamps
    at ±10 and verl clamps the k3 value to ±10; TRL's GRPO does not clamp. ±20 leaves every value a PPO or GRPO run
    here produces unchanged and only removes the overflow."""
    logr = logr.clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
    return torch.expm1(logr) - logr


ESTIMATORS: dict[KLEstimator, Callable[[Tensor], Tensor]] = {e: globals()[e.value] for e in KLEstimator}

# estimators whose gradient, as a loss term on the policy's own samples, is a KL gradient: k1's is ∇log π, zero in
# expectation (the rule: rlhf_lab.config.ppo_rules.check_ppo_rules)
KL_GRADIENT_ESTIMATORS = (KLEstimator.k2, KLEstimator.k3)


def kl_estimators(logp: Tensor, ref_logp: Tensor, kind: str) -> Tensor:
    """Per-token Monte Carlo estimates of KL(π ‖ ref) of the estimator `kind` (:class:`KLEstimator`), tokens sampled
    from π; the shape of ``logp``."""
    if kind not in KLEstimator.__members__:
        raise ValueError(f"Unknown KL estimator kind {kind!r}; allowed values: {', '.join(KLEstimator)}")
    return ESTIMATORS[KLEstimator(kind)](ref_logp - logp)


class KLIn(StrEnum):
    """``algo.kl_in``: where the KL penalty goes."""

    reward = "reward"  # subtracted from the per-token reward (Ziegler et al. 2019; PPO's default)
    loss = "loss"  # added to the loss (GRPO)


# ---------------------------------------------------------------------------
# KL coefficient controllers
# ---------------------------------------------------------------------------
class KLController(StrEnum):
    """``kl.name``: how β moves."""

    adaptive = "adaptive"  # AdaptiveKLController
    fixed = "fixed"  # FixedKLController


def check_beta(beta: float) -> None:
    if not beta >= 0:
        raise ValueError(f"kl.beta must be >= 0, got {beta}")


class AdaptiveKLController:
    """Adaptive KL coefficient, Ziegler et al. 2019 section 2.2.

    ``e_t = clip(KL_t / KL_target - 1, -0.2, 0.2)``;
    ``beta_{t+1} = beta_t * (1 + K_beta * e_t)`` with ``K_beta = n_steps / horizon``.
    """

    def __init__(self, init_beta: float, target: float, horizon: float) -> None:
        self._set(init_beta, target, horizon)

    def _set(self, beta: float, target: float, horizon: float) -> None:
        check_beta(beta)
        if not target > 0:
            raise ValueError(f"kl.target must be > 0 for the adaptive KL controller, got {target}")
        if not horizon > 0:
            raise ValueError(f"kl.horizon must be > 0 for the adaptive KL controller, got {horizon}")
        self.beta = float(beta)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> float:
        """Update beta from the measured KL after ``n_steps`` samples; returns the new beta."""
        error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.beta *= 1.0 + error * n_steps / self.horizon
        return self.beta

    def state_dict(self) -> dict[str, float]:
        return {"beta": self.beta, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._set(state["beta"], state["target"], state["horizon"])


class FixedKLController:
    """Constant KL coefficient (Ziegler et al. 2019 without adaptation).

    Same interface as :class:`AdaptiveKLController`; ``target`` / ``horizon`` are
    accepted only so both can be built from the same config, and are ignored.
    """

    def __init__(self, init_beta: float, target: float | None = None, horizon: float | None = None) -> None:
        check_beta(init_beta)
        self.beta = float(init_beta)

    def update(self, current_kl: float, n_steps: int) -> float:
        """No-op; returns the (unchanged) beta."""
        return self.beta

    def state_dict(self) -> dict[str, float]:
        return {"beta": self.beta}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_beta(state["beta"])
        self.beta = float(state["beta"])


def kl_controller(name: str, beta: float, target: float | None, horizon: float | None):
    """The controller ``kl.name`` names, at β = `beta`."""
    if name == KLController.adaptive:
        return AdaptiveKLController(beta, target, horizon)
    if name == KLController.fixed:
        return FixedKLController(beta)
    raise ValueError(f"kl={name!r}; choose one of {', '.join(KLController)}")
