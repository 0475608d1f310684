"""Pure tensor math for RLHF with PPO / RLOO.

Every function is stateless and works on plain ``torch.Tensor`` objects so it can
be unit tested against hand computations. Shapes follow the usual RLHF layout:
``[B, T]`` per-token tensors over the *response* tokens, with a ``mask`` that is
1 on valid response tokens and 0 on right padding (a prefix of ones per row).

References
----------
- Schulman et al. 2015, "High-Dimensional Continuous Control Using Generalized
  Advantage Estimation" (GAE).
- Schulman et al. 2017, "Proximal Policy Optimization Algorithms" (PPO).
- Schulman 2020, "Approximating KL Divergence" (k1/k2/k3 estimators),
  http://joschu.net/blog/kl-approx.html
- Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences"
  (per-token KL penalty, adaptive KL controller).
- Stiennon et al. 2020, "Learning to summarize from human feedback".
- Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization
  for Learning from Human Feedback in LLMs" (RLOO leave-one-out baseline).
- Williams 1992, "Simple Statistical Gradient-Following Algorithms for Connectionist
  Reinforcement Learning" (REINFORCE with a baseline).
- Huang et al. 2023, "The N Implementation Details of RLHF with PPO" (reward shaping:
  missing-EOS penalty, clipping).
- Shao et al. 2024, "DeepSeekMath" (GRPO: group-normalised advantages, KL in the loss).
- Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective" (Dr. GRPO: no std
  division, a constant loss normaliser).
- Yu et al. 2025, "DAPO" (asymmetric clipping ε_low/ε_high, token-mean loss aggregation).
- Stiennon et al. 2020 / Gao et al. 2022 (best-of-n: the analytic KL bound, the unbiased estimator of the
  best-of-n expectation from N ≥ n samples).
"""

from __future__ import annotations

import math
from enum import StrEnum

import torch
from torch import Tensor

class LossAggregation(StrEnum):
    """``algo.loss_agg``: how per-token losses become one (:func:`aggregate_loss`)."""

    token_mean = "token_mean"
    seq_mean_token_mean = "seq_mean_token_mean"
    seq_mean_token_sum = "seq_mean_token_sum"
    seq_mean_token_sum_norm = "seq_mean_token_sum_norm"


# ---------------------------------------------------------------------------
# Masked reductions (as in TRL's core utils)
# ---------------------------------------------------------------------------
def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``x`` over positions where ``mask`` is non-zero (padding may hold inf/nan)."""
    x = torch.where(mask.bool(), x, torch.zeros_like(x))
    return x.sum() if dim is None else x.sum(dim=dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over positions where ``mask`` is non-zero."""
    count = mask.to(x.dtype)
    count = count.sum() if dim is None else count.sum(dim=dim)
    return masked_sum(x, mask, dim) / count


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of ``x`` over all valid positions (Bessel-corrected if ``unbiased``)."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    if unbiased:
        n = mask.to(x.dtype).sum()
        if n < 2:
            raise ValueError(f"masked_var(unbiased=True) needs at least 2 valid elements, got {int(n.item())}")
        var = var * n / (n - 1)
    return var


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
    """Normalise ``x`` to zero mean / unit variance over valid positions.

    With ``shift_mean=False`` the original mean is added back (only rescaling),
    as TRL does for rewards. Padded positions are transformed too; ignore them.
    """
    mean, var = masked_mean(x, mask), masked_var(x, mask)
    whitened = (x - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


# ---------------------------------------------------------------------------
# Rewards and advantages
# ---------------------------------------------------------------------------
def shape_scores(
    scores: Tensor,
    lengths: Tensor,
    ended: Tensor,
    length_penalty: float,
    missing_eos_penalty: float,
    reward_clip: float | None = None,
) -> Tensor:
    """Sequence-level shaping of the reward model's scores (Huang et al. 2023: the missing-EOS
    penalty; reward clipping).

    ``R(x, y) = r(x, y) - alpha * |y| - p * [y has no EOS]``, then, if ``reward_clip`` = c is
    set (non-zero), ``R = clip(R, -c, c)``.

    ``scores``: ``[B]`` rewards r(x, y); ``lengths``: ``[B]`` response lengths |y| in tokens;
    ``ended``: ``[B]`` bool, whether the response ended with EOS (else it was truncated).
    """
    not_ended = (~ended.bool()).to(scores.dtype)
    shaped = scores - length_penalty * lengths - missing_eos_penalty * not_ended
    if reward_clip:
        shaped = shaped.clamp(-float(reward_clip), float(reward_clip))
    return shaped


def per_token_rewards(score: Tensor, kl: Tensor, mask: Tensor, beta: float) -> Tensor:
    """KL-shaped per-token rewards, Ziegler et al. 2019 eq. (2) / Stiennon et al. 2020 eq. (1).

    ``R(x, y) = r(x, y) - beta * log(pi(y|x) / ref(y|x))``, spread over tokens:
    ``r_t = -beta * kl_t`` on every valid token, and the sequence-level ``score``
    (reward model output, shape ``[B]``) is added at the last valid token of each row.
    Padded positions get 0. Rows without any valid token get no score.
    """
    valid = mask.bool()
    rewards = torch.where(valid, -beta * kl, torch.zeros_like(kl))
    lengths = valid.sum(dim=1)
    last = (lengths - 1).clamp(min=0)
    score = torch.where(lengths > 0, score.to(rewards.dtype), torch.zeros_like(score, dtype=rewards.dtype))
    return rewards.scatter_add(1, last.unsqueeze(1), score.unsqueeze(1))


def rlhf_reward_terms(shaped: Tensor, kl_seq: Tensor, beta: float, kl_in: str) -> tuple[Tensor, Tensor]:
    """(non-score reward, RLHF reward), both ``[B]``: the KL part of the reward the advantage is computed
    from, and that whole reward. ``kl_in=reward``: ``−β·KL`` and ``R − β·KL`` (``kl_seq``: the per-response
    KL); ``kl_in=loss``: the KL is a loss term, not part of the reward, so ``0`` and ``R``."""
    if str(kl_in) == "reward":
        non_score = -beta * kl_seq
    elif str(kl_in) == "loss":
        non_score = torch.zeros_like(shaped)
    else:
        raise ValueError(f"algo.kl_in={kl_in!r}; choose reward or loss")
    return non_score, shaped + non_score


def group_advantages(returns: Tensor, group_size: int, scale: bool = True, eps: float = 1e-4) -> Tensor:
    """GRPO's outcome advantages (Shao et al. 2024 §4.1.2): ``Â_i = (R_i − mean_g) / (std_g + eps)`` over the
    ``group_size`` = G consecutive samples of each prompt (``std`` Bessel-corrected, as in TRL); with
    ``scale=False``, ``R_i − mean_g`` (Dr. GRPO, Liu et al. 2025). Returns ``[B]``."""
    if group_size < 2 or returns.dim() != 1 or returns.shape[0] % group_size:
        raise ValueError(f"group_advantages needs 1-D returns in groups of group_size >= 2, got group_size="
                         f"{group_size} and shape {tuple(returns.shape)}")
    g = returns.view(-1, group_size)
    adv = g - g.mean(1, keepdim=True)
    if scale:
        adv = adv / (g.std(1, keepdim=True) + eps)
    return adv.reshape(-1)


@torch.no_grad()
def group_stats(returns: Tensor, group_size: int) -> dict[str, float]:
    """Statistics of the groups of ``group_size`` samples per prompt: ``group/tie_frac`` (fraction of groups
    whose returns all tie: zero advantage, no learning signal), ``group/reward_std`` (mean within-group
    std, Bessel-corrected) and ``group/reward_range`` (mean max − min)."""
    g = returns.view(-1, group_size)
    return {"group/tie_frac": (g.max(1).values == g.min(1).values).float().mean().item(),
            "group/reward_std": g.std(1).mean().item(),
            "group/reward_range": (g.max(1).values - g.min(1).values).mean().item()}


def aggregate_loss(per_token: Tensor, mask: Tensor, mode: str = "token_mean", norm: float | None = None) -> Tensor:
    """A ``[B, T]`` per-token loss reduced to a scalar, with the names of the papers (and verl):

    - ``token_mean``: sum over all valid tokens of the batch ÷ their number (PPO here; DAPO, Yu et al. 2025);
    - ``seq_mean_token_mean``: mean over sequences of each sequence's token mean (GRPO, Shao et al. 2024 eq. 3);
    - ``seq_mean_token_sum``: mean over sequences of each sequence's token sum (REINFORCE on the sequence,
      RLOO, Ahmadian et al. 2024);
    - ``seq_mean_token_sum_norm``: sum over valid tokens ÷ (B · ``norm``), a constant normaliser (Dr. GRPO,
      Liu et al. 2025: ``norm`` = the maximum generation length).
    """
    if mode == "token_mean":
        return masked_mean(per_token, mask)
    if mode == "seq_mean_token_mean":
        return masked_mean(per_token, mask, dim=1).mean()
    if mode == "seq_mean_token_sum":
        return masked_sum(per_token, mask, dim=1).mean()
    if mode == "seq_mean_token_sum_norm":
        if not norm or norm <= 0:
            raise ValueError("seq_mean_token_sum_norm needs a constant normaliser norm > 0")
        return masked_sum(per_token, mask) / (per_token.shape[0] * float(norm))
    raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {', '.join(LossAggregation)}")


@torch.no_grad()
def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """Generalized Advantage Estimation, Schulman et al. 2015 eq. (16).

    ``delta_t = r_t + gamma * V(s_{t+1}) - V(s_t)``
    ``A_t = delta_t + gamma * lam * A_{t+1}``

    ``rewards``, ``values``, ``mask``: ``[B, T]``, mask a prefix of ones per row
    (right padding). The value after the last valid token is 0 (the episode ends).
    Advantages are 0 on padded positions; ``returns = advantages + values``
    (the value-function target). Computed without gradient (CleanRL / TRL style).
    """
    mask = mask.to(values.dtype)
    B, T = rewards.shape
    last_gae = torch.zeros(B, dtype=values.dtype, device=values.device)
    advantages_reversed = []
    for t in reversed(range(T)):
        # "next non-terminal": 1 if token t+1 is a valid response token, else the episode ended at t
        next_nonterminal = mask[:, t + 1] if t < T - 1 else torch.zeros_like(last_gae)
        next_values = values[:, t + 1] * next_nonterminal if t < T - 1 else torch.zeros_like(last_gae)
        delta = rewards[:, t] + gamma * next_values - values[:, t]
        last_gae = (delta + gamma * lam * next_nonterminal * last_gae) * mask[:, t]
        advantages_reversed.append(last_gae)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)
    returns = advantages + values
    return advantages, returns


def leave_one_out_baseline(scores: Tensor, group_size: int) -> Tensor:
    """RLOO baseline, Ahmadian et al. 2024 eq. (4) (Kool et al. 2019).

    ``scores`` (shape ``[B]``) holds consecutive groups of ``group_size`` samples per
    prompt. For sample i of a group: ``b_i = (sum_j s_j - s_i) / (k - 1)``, the mean of
    the other members. Advantage is then ``scores - baseline``.
    """
    if group_size < 2:
        raise ValueError(f"leave_one_out_baseline needs group_size >= 2, got {group_size}")
    if scores.dim() != 1 or scores.shape[0] % group_size != 0:
        raise ValueError(
            f"scores must be 1-D with length divisible by group_size={group_size}, got shape {tuple(scores.shape)}"
        )
    grouped = scores.view(-1, group_size)
    baseline = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)
    return baseline.reshape(-1)


def mean_baseline(returns: Tensor, group_size: int) -> Tensor:
    """Mean-reward baseline of REINFORCE (Williams 1992; Ahmadian et al. 2024).

    ``returns`` (shape ``[B]``) holds consecutive groups of ``group_size`` = k samples per prompt.
    With k > 1 each sample's baseline is its group's mean, ``b_i = (1/k) sum_j R_j``
    (the sample itself included; GRPO's group mean, Shao et al. 2024); with k = 1 it is the
    batch mean ``b = (1/B) sum_i R_i``. See :func:`leave_one_out_baseline` for RLOO.
    """
    if returns.dim() != 1 or group_size < 1 or returns.shape[0] % group_size != 0:
        raise ValueError(
            f"returns must be 1-D with length divisible by group_size={group_size}, got shape {tuple(returns.shape)}"
        )
    if group_size > 1:
        return returns.view(-1, group_size).mean(1).repeat_interleave(group_size)
    return returns.mean().expand_as(returns)


def reinforce_advantages(returns: Tensor, baseline: Tensor, mask: Tensor) -> Tensor:
    """Critic-free advantages of REINFORCE with a baseline (Williams 1992; Ahmadian et al. 2024).

    The whole response is one action: ``A_t = (R - b) * mask_t`` for every response token t,
    with ``R`` (``[B]``) the return of the episode and ``b`` (``[B]``) its baseline.
    Returns ``[B, T]``, 0 on padded positions.
    """
    return (returns - baseline).unsqueeze(1) * mask


# ---------------------------------------------------------------------------
# PPO losses
# ---------------------------------------------------------------------------
def ppo_policy_loss(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, clip_eps: float,
    clip_eps_high: float | None = None, agg: str = "token_mean", agg_norm: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate, Schulman et al. 2017 eq. (7), written as a loss.

    ``ratio = exp(logp - old_logp)``;
    ``loss = masked_mean(max(-A * ratio, -A * clip(ratio, 1 - eps, 1 + eps_high)))``, with
    ``eps_high = clip_eps_high`` if given, else ``eps`` (asymmetric "clip-higher", DAPO, Yu et al. 2025),
    and the per-token terms reduced by :func:`aggregate_loss` (``agg``, ``agg_norm``; default: masked_mean).

    Stats (detached 0-dim tensors):
    - ``policy/clipfrac``: fraction of valid tokens where the clipped term was chosen
      (unclipped loss < clipped loss, i.e. the gradient is cut off);
    - ``policy/approxkl``: ``0.5 * masked_mean((logp - old_logp)**2)`` (k2 estimator).
    """
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio)
    pg_losses = -advantages * ratio
    high = clip_eps if clip_eps_high is None else clip_eps_high
    pg_losses_clipped = -advantages * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + high)
    loss = aggregate_loss(torch.max(pg_losses, pg_losses_clipped), mask, agg, agg_norm)
    with torch.no_grad():
        stats = {
            "policy/clipfrac": masked_mean((pg_losses < pg_losses_clipped).to(logp.dtype), mask),
            "policy/approxkl": 0.5 * masked_mean(log_ratio**2, mask),
        }
    return loss, stats


def ppo_value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip_eps_value: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped value loss of PPO2 (OpenAI baselines; Ziegler et al. 2019 lm-human-preferences).

    ``v_clip = old + clip(v - old, -eps, eps)``;
    ``loss = 0.5 * masked_mean(max((v - R)**2, (v_clip - R)**2))``.

    Stats: ``val/clipfrac``, fraction of valid tokens where the clipped term was larger.
    """
    values_clipped = old_values + torch.clamp(values - old_values, -clip_eps_value, clip_eps_value)
    vf_losses = (values - returns) ** 2
    vf_losses_clipped = (values_clipped - returns) ** 2
    loss = 0.5 * masked_mean(torch.max(vf_losses, vf_losses_clipped), mask)
    with torch.no_grad():
        stats = {"val/clipfrac": masked_mean((vf_losses < vf_losses_clipped).to(values.dtype), mask)}
    return loss, stats


@torch.no_grad()
def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """``1 - Var(returns - values) / Var(returns)`` over valid tokens (CleanRL's diagnostic).

    1 is a perfect value function, 0 is as good as predicting a constant, <0 is worse.
    Returns ``nan`` if the returns have zero variance.
    """
    var_returns = masked_var(returns, mask, unbiased=False)
    if var_returns.item() == 0:
        return float("nan")
    return float(1.0 - masked_var(returns - values, mask, unbiased=False) / var_returns)


# ---------------------------------------------------------------------------
# Best-of-n
# ---------------------------------------------------------------------------
def best_of_n_kl(n: int) -> float:
    """KL(π_best-of-n ‖ π) ≤ log n − (n − 1)/n nats (Stiennon et al. 2020 app. G.3; exact without ties)."""
    if n < 1:
        raise ValueError(f"best-of-n needs n >= 1, got {n}")
    return math.log(n) - (n - 1) / n


def best_of_n_expectation(proxy: Tensor, values: Tensor, n: int) -> Tensor:
    """Per prompt, the expected ``values`` of the response a best-of-n picks by ``proxy``, n drawn at random
    without replacement from the N ≥ n samples of that prompt (rows of ``[P, N]``): the unbiased estimator of
    Gao et al. 2022 (app.). With the samples ranked by proxy ascending (rank i = 0 … N−1), the one of rank i
    is the subset's maximum with probability C(i, n−1) / C(N, n). n = 1: the row mean; n = N: the argmax's
    value. Returns ``[P]``."""
    N = proxy.shape[1]
    if not 1 <= n <= N:
        raise ValueError(f"best-of-n needs 1 <= n <= N = {N} samples per prompt, got n = {n}")
    order = proxy.argsort(dim=1)
    w = torch.tensor([math.comb(i, n - 1) / math.comb(N, n) for i in range(N)], dtype=torch.float64)
    return (values.gather(1, order).double() * w).sum(1)
