"""Unit tests for rlhf_lab.algorithms.rl_math against numbers computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf_lab.algorithms.kl import AdaptiveKLController, FixedKLController, kl_estimators
from rlhf_lab.algorithms.rl_math import (
    aggregate_loss,
    best_of_n_expectation,
    best_of_n_kl,
    explained_variance,
    gae,
    group_advantages,
    group_stats,
    leave_one_out_baseline,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    mean_baseline,
    per_token_rewards,
    ppo_policy_loss,
    ppo_value_loss,
    reinforce_advantages,
    rlhf_reward_terms,
    shape_scores,
)


def t(*rows):
    return torch.tensor(rows, dtype=torch.float64)


# ---------------------------------------------------------------------------
# KL estimators
# ---------------------------------------------------------------------------
def test_kl_estimators_pointwise_by_hand():
    # pi(x) = 0.5, ref(x) = 0.25  ->  logr = log(0.25 / 0.5) = log 0.5 = -0.693147
    logp = torch.tensor([math.log(0.5)], dtype=torch.float64)
    ref_logp = torch.tensor([math.log(0.25)], dtype=torch.float64)
    # k1 = -logr = 0.693147
    assert kl_estimators(logp, ref_logp, "k1").item() == pytest.approx(0.693147, abs=1e-6)
    # k2 = 0.5 * 0.693147^2 = 0.5 * 0.480453 = 0.240227
    assert kl_estimators(logp, ref_logp, "k2").item() == pytest.approx(0.240227, abs=1e-6)
    # k3 = (r - 1) - logr = (0.5 - 1) + 0.693147 = 0.193147
    assert kl_estimators(logp, ref_logp, "k3").item() == pytest.approx(0.193147, abs=1e-6)


def test_kl_estimators_zero_when_equal():
    x = torch.tensor([-0.1, -2.0, -5.0])
    for kind in ("k1", "k2", "k3"):
        assert torch.equal(kl_estimators(x, x, kind), torch.zeros(3))


def test_kl_estimators_monte_carlo_matches_exact_categorical_kl():
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)  # policy pi (we sample from it)
    q = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)  # reference
    # exact KL(p||q) = 0.5 ln(2.5) + 0.3 ln(0.6) + 0.2 ln(2/3)
    #              = 0.458145 - 0.153248 - 0.081093 = 0.223805
    exact = 0.5 * math.log(0.5 / 0.2) + 0.3 * math.log(0.3 / 0.5) + 0.2 * math.log(0.2 / 0.3)
    assert exact == pytest.approx(0.223805, abs=1e-6)

    # std of a single k1 sample is ~0.69, so 1M tokens give a standard error of ~0.3% of
    # the KL (200k would give ~0.7%, too close to the 1% tolerance); k3's std is only ~0.095.
    gen = torch.Generator().manual_seed(0)
    idx = torch.multinomial(p, 1_000_000, replacement=True, generator=gen)
    logp, ref_logp = p.log()[idx], q.log()[idx]

    k1 = kl_estimators(logp, ref_logp, "k1")
    k2 = kl_estimators(logp, ref_logp, "k2")
    k3 = kl_estimators(logp, ref_logp, "k3")
    assert k1.mean().item() == pytest.approx(exact, rel=0.01)
    assert k3.mean().item() == pytest.approx(exact, rel=0.01)
    assert (k3 >= 0).all()
    assert (k1 < 0).any()  # k1 is unbiased but individual samples can be negative
    assert (k2 >= 0).all()
    # k2 is biased: E[0.5 logr^2] = 0.5 * (0.5*0.916291^2 + 0.3*0.510826^2 + 0.2*0.405465^2)
    #                             = 0.5 * (0.419794 + 0.078283 + 0.032880) = 0.265478
    assert k2.mean().item() == pytest.approx(0.265478, rel=0.01)
    # and k3 has a much lower variance than k1
    assert k3.var().item() < 0.1 * k1.var().item()


def test_kl_estimators_unknown_kind():
    x = torch.zeros(2)
    with pytest.raises(ValueError, match=r"k4.*k1, k2, k3"):
        kl_estimators(x, x, "k4")


# ---------------------------------------------------------------------------
# Masked reductions
# ---------------------------------------------------------------------------
def test_masked_reductions_by_hand():
    x = t([1.0, 2.0, 3.0, 100.0], [4.0, 5.0, float("inf"), float("nan")])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    # 1 + 2 + 3 + 4 + 5 = 15; padding (100, inf, nan) must not leak in
    assert masked_sum(x, mask).item() == 15.0
    assert masked_mean(x, mask).item() == 3.0
    assert masked_sum(x, mask, dim=1).tolist() == [6.0, 9.0]
    assert masked_mean(x, mask, dim=1).tolist() == [2.0, 4.5]
    # values 1..5, mean 3, squared deviations 4+1+0+1+4 = 10 -> unbiased 10/4, biased 10/5
    assert masked_var(x, mask).item() == pytest.approx(2.5)
    assert masked_var(x, mask, unbiased=False).item() == pytest.approx(2.0)


def test_masked_var_unbiased_needs_two_elements():
    with pytest.raises(ValueError, match="at least 2"):
        masked_var(t([1.0, 2.0]), torch.tensor([[1, 0]]))


def test_masked_whiten_by_hand():
    x = t([1.0, 2.0, 3.0, 100.0])
    mask = torch.tensor([[1, 1, 1, 0]])
    # mean 2, unbiased var (1 + 0 + 1) / 2 = 1 -> (x - 2) / 1
    w = masked_whiten(x, mask)
    assert w[0, :3].tolist() == pytest.approx([-1.0, 0.0, 1.0], abs=1e-6)
    # shift_mean=False only rescales: mean 2 is added back
    w2 = masked_whiten(x, mask, shift_mean=False)
    assert w2[0, :3].tolist() == pytest.approx([1.0, 2.0, 3.0], abs=1e-6)


# ---------------------------------------------------------------------------
# Rewards, GAE, RLOO baseline
# ---------------------------------------------------------------------------
def test_shape_scores_by_hand():
    scores = torch.tensor([1.0, 2.0, -1.0])
    lengths = torch.tensor([10.0, 4.0, 20.0])
    ended = torch.tensor([True, False, False])
    shaped = shape_scores(scores, lengths, ended, length_penalty=0.05, missing_eos_penalty=0.5)
    # row 0: 1.0 - 0.05*10 - 0       =  0.5
    # row 1: 2.0 - 0.05*4  - 0.5     =  1.3
    # row 2: -1.0 - 0.05*20 - 0.5    = -2.5
    torch.testing.assert_close(shaped, torch.tensor([0.5, 1.3, -2.5]))
    # clipped to [-1, 1]: [0.5, 1.0, -1.0]
    clipped = shape_scores(scores, lengths, ended, 0.05, 0.5, reward_clip=1.0)
    torch.testing.assert_close(clipped, torch.tensor([0.5, 1.0, -1.0]))
    # no penalties and no clip (None or 0 = off): the scores themselves
    for off in (None, 0.0):
        assert torch.equal(shape_scores(scores, lengths, ended, 0.0, 0.0, reward_clip=off), scores)


def test_shape_scores_missing_eos_penalty_only_hits_truncated_responses():
    scores = torch.zeros(4)
    ended = torch.tensor([1, 0, 1, 0])  # any 0/1 indicator works, not only bool
    shaped = shape_scores(scores, torch.ones(4), ended, length_penalty=0.0, missing_eos_penalty=2.0)
    assert shaped.tolist() == [0.0, -2.0, 0.0, -2.0]


def test_mean_baseline_by_hand():
    # k = 2: group means (1+3)/2 = 2 and (10+20)/2 = 15, one per sample
    returns = torch.tensor([1.0, 3.0, 10.0, 20.0])
    torch.testing.assert_close(mean_baseline(returns, 2), torch.tensor([2.0, 2.0, 15.0, 15.0]))
    # k = 4: one group = the batch mean (1+3+10+20)/4 = 8.5
    torch.testing.assert_close(mean_baseline(returns, 4), torch.full((4,), 8.5))
    # k = 1: the batch mean
    torch.testing.assert_close(mean_baseline(torch.tensor([1.0, 2.0, 3.0, 6.0]), 1), torch.full((4,), 3.0))


def test_mean_baseline_errors():
    with pytest.raises(ValueError, match="divisible by group_size=4"):
        mean_baseline(torch.zeros(6), 4)
    with pytest.raises(ValueError, match="divisible by group_size=0"):
        mean_baseline(torch.zeros(6), 0)


def test_reinforce_advantages_by_hand():
    returns = torch.tensor([2.0, 0.5])
    baseline = torch.tensor([1.0, 1.0])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # row 0: A = 2 - 1 = 1 on its 2 tokens; row 1: A = 0.5 - 1 = -0.5 on its 1 token; padding 0
    adv = reinforce_advantages(returns, baseline, mask)
    torch.testing.assert_close(adv, torch.tensor([[1.0, 1.0, 0.0], [-0.5, 0.0, 0.0]]))


def test_reinforce_advantages_with_group_baselines():
    # k = 2, returns [1, 3 | 10, 20], one token each
    returns, mask = torch.tensor([1.0, 3.0, 10.0, 20.0]), torch.ones(4, 1)
    # mean baseline [2, 2, 15, 15] -> A = [-1, 1, -5, 5]: zero-sum within each group
    adv = reinforce_advantages(returns, mean_baseline(returns, 2), mask)
    assert adv[:, 0].tolist() == [-1.0, 1.0, -5.0, 5.0]
    # RLOO baseline = the other sample [3, 1, 20, 10] -> A = [-2, 2, -10, 10] = k/(k-1) × the mean's
    adv = reinforce_advantages(returns, leave_one_out_baseline(returns, 2), mask)
    assert adv[:, 0].tolist() == [-2.0, 2.0, -10.0, 10.0]


def test_per_token_rewards_by_hand():
    score = torch.tensor([1.0, 2.0])
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    r = per_token_rewards(score, kl, mask, beta=0.5)
    # row 0: [-0.05, -0.10, -0.15 + 1.0]; row 1: [-0.20, -0.25 + 2.0, 0 (padding)]
    expected = torch.tensor([[-0.05, -0.10, 0.85], [-0.20, 1.75, 0.0]])
    torch.testing.assert_close(r, expected)


def test_per_token_rewards_empty_row_gets_no_score():
    r = per_token_rewards(torch.tensor([3.0]), torch.ones(1, 2), torch.zeros(1, 2), beta=0.1)
    assert r.tolist() == [[0.0, 0.0]]


def test_gae_1x3_by_hand():
    rewards = t([0.0, 0.0, 1.0])
    values = t([0.5, 0.4, 0.3])
    mask = torch.ones(1, 3)
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    # gamma * lam = 0.72; the value after the last token is 0.
    # t=2: delta = 1.0 + 0.9*0   - 0.3 =  0.70;  A2 = 0.70
    # t=1: delta = 0.0 + 0.9*0.3 - 0.4 = -0.13;  A1 = -0.13 + 0.72*0.70  = 0.374
    # t=0: delta = 0.0 + 0.9*0.4 - 0.5 = -0.14;  A0 = -0.14 + 0.72*0.374 = 0.12928
    # returns = A + V = [0.62928, 0.774, 1.0]
    torch.testing.assert_close(adv, t([0.12928, 0.374, 0.70]))
    torch.testing.assert_close(ret, t([0.62928, 0.774, 1.0]))


def test_gae_right_padding_is_ignored_and_zeroed():
    # Same episode as above plus a padded 4th token with garbage reward/value, and a
    # second row of length 1: delta = 2.0 - 0.5 = 1.5 (episode ends right away).
    rewards = t([0.0, 0.0, 1.0, 5.0], [2.0, 7.0, 7.0, 7.0])
    values = t([0.5, 0.4, 0.3, 9.0], [0.5, 9.0, 9.0, 9.0])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    torch.testing.assert_close(adv, t([0.12928, 0.374, 0.70, 0.0], [1.5, 0.0, 0.0, 0.0]))
    torch.testing.assert_close(ret[0, :3], t([0.62928, 0.774, 1.0])[0])
    assert ret[1, 0].item() == pytest.approx(2.0)


def test_gae_lambda_one_gives_monte_carlo_returns():
    # gamma = lam = 1: returns are reward-to-go, whatever the values: [1+2+3, 2+3, 3]
    adv, ret = gae(t([1.0, 2.0, 3.0]), t([0.7, -3.0, 10.0]), torch.ones(1, 3), gamma=1.0, lam=1.0)
    torch.testing.assert_close(ret, t([6.0, 5.0, 3.0]))
    torch.testing.assert_close(adv, t([5.3, 8.0, -7.0]))


def test_gae_has_no_grad():
    values = t([0.5, 0.4]).requires_grad_()
    adv, ret = gae(t([0.0, 1.0]), values, torch.ones(1, 2), gamma=1.0, lam=1.0)
    assert not adv.requires_grad and not ret.requires_grad


def test_leave_one_out_baseline_by_hand():
    scores = torch.tensor([1.0, 2.0, 3.0, 4.0, 10.0, 20.0, 30.0, 40.0])
    # group 1: (2+3+4)/3 = 3, (1+3+4)/3 = 8/3, (1+2+4)/3 = 7/3, (1+2+3)/3 = 2; group 2 is x10
    expected = torch.tensor([3.0, 8 / 3, 7 / 3, 2.0, 30.0, 80 / 3, 70 / 3, 20.0])
    torch.testing.assert_close(leave_one_out_baseline(scores, 4), expected)
    # group of 2: the baseline is simply the other sample
    torch.testing.assert_close(leave_one_out_baseline(torch.tensor([1.0, 5.0]), 2), torch.tensor([5.0, 1.0]))


def test_leave_one_out_baseline_errors():
    with pytest.raises(ValueError, match="divisible by group_size=4"):
        leave_one_out_baseline(torch.zeros(6), 4)
    with pytest.raises(ValueError, match="group_size >= 2"):
        leave_one_out_baseline(torch.zeros(6), 1)


# ---------------------------------------------------------------------------
# PPO losses
# ---------------------------------------------------------------------------
def test_ppo_policy_loss_by_hand():
    # ratios [1.5, 0.5, 0.5, 1.0, 10 (masked)], advantages [1, 1, -2, 3, 100], eps = 0.2
    old_logp = torch.zeros(1, 5)
    logp = torch.tensor([[math.log(1.5), math.log(0.5), math.log(0.5), 0.0, math.log(10.0)]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, -2.0, 3.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    loss, stats = ppo_policy_loss(logp, old_logp, adv, mask, clip_eps=0.2)
    # tok0: unclipped -1.5, clipped -1.2*1 = -1.2 -> max -1.2 (clipped chosen)
    # tok1: unclipped -0.5, clipped -0.8         -> max -0.5 (unclipped)
    # tok2: unclipped  1.0, clipped  2*0.8 = 1.6 -> max  1.6 (clipped chosen)
    # tok3: unclipped -3.0, clipped -3.0         -> max -3.0 (tie: not clipped)
    # loss = (-1.2 - 0.5 + 1.6 - 3.0) / 4 = -0.775 ; clipfrac = 2/4
    assert loss.item() == pytest.approx(-0.775, abs=1e-6)
    assert stats["policy/clipfrac"].item() == pytest.approx(0.5)
    # approxkl = 0.5 * (ln1.5^2 + 2 ln0.5^2 + 0) / 4 = 0.5 * (0.164402 + 0.960906) / 4 = 0.140664
    assert stats["policy/approxkl"].item() == pytest.approx(0.140664, abs=1e-6)
    assert not stats["policy/clipfrac"].requires_grad and not stats["policy/approxkl"].requires_grad
    # d loss / d logp = -A * ratio / 4 on unclipped tokens, 0 on clipped and masked ones
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -0.125, 0.0, -0.75, 0.0]]))


def test_ppo_value_loss_by_hand():
    old = torch.zeros(1, 4)
    values = torch.tensor([[1.0, 0.1, -0.5, 50.0]])
    returns = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, stats = ppo_value_loss(values, old, returns, mask, clip_eps_value=0.2)
    # tok0: (1-1)^2 = 0,        v_clip = 0.2  -> (0.2-1)^2 = 0.64 -> 0.64 (clipped chosen)
    # tok1: (0.1-1)^2 = 0.81,   v_clip = 0.1  -> 0.81             -> 0.81 (tie)
    # tok2: (-0.5-0)^2 = 0.25,  v_clip = -0.2 -> 0.04             -> 0.25
    # loss = 0.5 * (0.64 + 0.81 + 0.25) / 3 = 0.283333 ; clipfrac = 1/3
    assert loss.item() == pytest.approx(0.283333, abs=1e-6)
    assert stats["val/clipfrac"].item() == pytest.approx(1 / 3)


def test_explained_variance_by_hand():
    returns = t([1.0, 2.0, 3.0, 99.0])
    mask = torch.tensor([[1, 1, 1, 0]])
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.zeros_like(returns), returns, mask) == pytest.approx(0.0)
    # residuals [-0.5, 0, 0.5]: var 1/6 ; var(returns) = 2/3 -> 1 - 0.25 = 0.75
    assert explained_variance(t([1.5, 2.0, 2.5, 0.0]), returns, mask) == pytest.approx(0.75)
    assert isinstance(explained_variance(returns, returns, mask), float)


# ---------------------------------------------------------------------------
# KL controllers
# ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kl, expected_beta",
    [
        # e = 6.6/6 - 1 = 0.1   -> 0.1 * (1 + 0.1 * 256/10000) = 0.1 * 1.00256
        (6.6, 0.100256),
        # e = 5.4/6 - 1 = -0.1  -> 0.1 * (1 - 0.00256)
        (5.4, 0.099744),
        # e = 60/6 - 1 = 9 -> clipped to 0.2 -> 0.1 * (1 + 0.2 * 0.0256) = 0.1 * 1.00512
        (60.0, 0.100512),
        # e = 0/6 - 1 = -1 -> clipped to -0.2 -> 0.1 * (1 - 0.00512) = 0.1 * 0.99488
        (0.0, 0.099488),
        # on target: unchanged
        (6.0, 0.1),
    ],
)
def test_adaptive_kl_controller_update(kl, expected_beta):
    ctl = AdaptiveKLController(init_beta=0.1, target=6.0, horizon=10000)
    assert ctl.update(kl, n_steps=256) == pytest.approx(expected_beta, rel=1e-12)
    assert ctl.beta == pytest.approx(expected_beta, rel=1e-12)


def test_adaptive_kl_controller_accepts_tensor_kl():
    ctl = AdaptiveKLController(init_beta=0.1, target=6.0, horizon=10000)
    ctl.update(torch.tensor(6.6), n_steps=256)
    assert ctl.beta == pytest.approx(0.100256)


def test_kl_controller_state_dict_round_trip():
    ctl = AdaptiveKLController(init_beta=0.1, target=6.0, horizon=10000)
    ctl.update(60.0, n_steps=256)
    state = ctl.state_dict()
    assert state == {"beta": pytest.approx(0.100512), "target": 6.0, "horizon": 10000.0}
    other = AdaptiveKLController(init_beta=1.0, target=1.0, horizon=1.0)
    other.load_state_dict(state)
    assert other.state_dict() == state
    assert other.update(60.0, 256) == ctl.update(60.0, 256)

    fixed = FixedKLController(0.05)
    assert fixed.update(100.0, n_steps=256) == 0.05
    assert fixed.beta == 0.05
    fixed2 = FixedKLController(0.5)
    fixed2.load_state_dict(fixed.state_dict())
    assert fixed2.beta == 0.05


def test_kl_controller_validation():
    with pytest.raises(ValueError, match=r"kl\.target"):
        AdaptiveKLController(0.1, target=0.0, horizon=10000)
    with pytest.raises(ValueError, match=r"kl\.horizon"):
        AdaptiveKLController(0.1, target=6.0, horizon=-1)
    with pytest.raises(ValueError, match=r"kl\.beta"):
        AdaptiveKLController(-0.1, target=6.0, horizon=10000)
    with pytest.raises(ValueError, match=r"kl\.beta"):
        FixedKLController(-1.0)
    FixedKLController(0.0)  # beta = 0 (no KL penalty) is allowed


# ---------------------------------------------------------------------------
# KL in the loss: which estimators carry a KL gradient
# ---------------------------------------------------------------------------
def _expected_kl_loss_gradient(kind: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exact E_{x~π}[∇_θ k(x)] on a 3-way categorical π = softmax(θ) (the samples' distribution held fixed,
    as for a loss term on the policy's own samples), with ∇KL(π‖ref) and ∇KL(ref‖π) for comparison."""
    theta = torch.tensor([0.2, -0.4, 0.9], dtype=torch.float64, requires_grad=True)
    ref = torch.log(torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64))
    logp = torch.log_softmax(theta, 0)
    p = logp.exp().detach()
    (g,) = torch.autograd.grad((p * kl_estimators(logp, ref, kind)).sum(), theta, retain_graph=True)
    (g_fwd,) = torch.autograd.grad((logp.exp() * (logp - ref)).sum(), theta, retain_graph=True)
    (g_rev,) = torch.autograd.grad((ref.exp() * (ref - logp)).sum(), theta)
    return g, g_fwd, g_rev


def test_k1_in_the_loss_has_zero_expected_gradient_k2_has_the_kl_gradient():
    g1, g_fwd, g_rev = _expected_kl_loss_gradient("k1")
    # E[∇k1] = Σ_x π(x) ∇log π(x) = ∇Σ_x π(x) = ∇1 = 0: the penalty does nothing
    assert g1.tolist() == pytest.approx([0.0, 0.0, 0.0], abs=1e-12)
    assert g_fwd.abs().max() > 0.1  # while the KL itself has a gradient
    g2, _, _ = _expected_kl_loss_gradient("k2")
    # E[∇k2] = Σ π (log π − log ref) ∇log π = ∇KL(π‖ref) exactly
    assert g2.tolist() == pytest.approx(g_fwd.tolist(), abs=1e-12)
    g3, _, _ = _expected_kl_loss_gradient("k3")
    # E[∇k3] = Σ (π − ref) ∇log π = −Σ ref ∇log π = ∇KL(ref‖π): the reverse KL (GRPO's term)
    assert g3.tolist() == pytest.approx(g_rev.tolist(), abs=1e-12)


def test_rlhf_reward_terms_in_both_placements():
    shaped, kl_seq = t(1.0, -0.5), t(2.0, 4.0)
    # kl_in=reward: non-score = −β·KL = −0.2, −0.4; rlhf = R − β·KL = 0.8, −0.9
    ns, rr = rlhf_reward_terms(shaped, kl_seq, 0.1, "reward")
    assert ns.tolist() == pytest.approx([-0.2, -0.4]) and rr.tolist() == pytest.approx([0.8, -0.9])
    # kl_in=loss: the KL is not in the reward: non-score 0, rlhf = R
    ns, rr = rlhf_reward_terms(shaped, kl_seq, 0.1, "loss")
    assert ns.tolist() == [0.0, 0.0] and rr.tolist() == [1.0, -0.5]


# ---------------------------------------------------------------------------
# GRPO / Dr. GRPO
# ---------------------------------------------------------------------------
def test_group_advantages_by_hand():
    R = t(1.0, 3.0, 0.0, 0.0, 2.0, 4.0)  # groups of 3: (1, 3, 0) and (0, 2, 4)
    # group 1: mean 4/3, std = sqrt(((−1/3)² + (5/3)² + (4/3)²) / 2) = sqrt(42/9 / 2) = sqrt(7/3) = 1.527525
    # group 2: mean 2, std = sqrt((4 + 0 + 4) / 2) = 2
    s1 = math.sqrt(7 / 3)
    expected = [-1 / 3 / (s1 + 1e-4), 5 / 3 / (s1 + 1e-4), -4 / 3 / (s1 + 1e-4),
                -2 / (2 + 1e-4), 0.0, 2 / (2 + 1e-4)]
    assert group_advantages(R, 3).tolist() == pytest.approx(expected, abs=1e-12)
    # Dr. GRPO: no std division
    assert group_advantages(R, 3, scale=False).tolist() == pytest.approx([-1 / 3, 5 / 3, -4 / 3, -2, 0, 2])
    # a group whose rewards all tie gets zero advantage (not 0/0)
    assert group_advantages(t(0.5, 0.5), 2).tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="group_size"):
        group_advantages(t(1.0, 2.0, 3.0), 2)


def test_group_stats_by_hand():
    st = group_stats(t(1.0, 1.0, 0.0, 2.0, 3.0, 3.0), 2)  # groups (1, 1), (0, 2), (3, 3)
    assert st["group/tie_frac"] == pytest.approx(2 / 3)
    # stds 0, sqrt(2), 0 -> mean sqrt(2)/3; ranges 0, 2, 0 -> 2/3
    assert st["group/reward_std"] == pytest.approx(math.sqrt(2) / 3)
    assert st["group/reward_range"] == pytest.approx(2 / 3)


def test_loss_aggregations_by_hand():
    x = t([1.0, 2.0, 3.0, 9.0], [4.0, 0.0, 0.0, 0.0])
    m = t([1, 1, 1, 0], [1, 0, 0, 0])
    assert aggregate_loss(x, m, "token_mean").item() == pytest.approx(10 / 4)  # (1+2+3+4)/4
    assert aggregate_loss(x, m, "seq_mean_token_mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate_loss(x, m, "seq_mean_token_sum").item() == pytest.approx((6 + 4) / 2)
    assert aggregate_loss(x, m, "seq_mean_token_sum_norm", norm=5).item() == pytest.approx(10 / (2 * 5))
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        aggregate_loss(x, m, "sum")


def test_asymmetric_clipping_by_hand():
    m = t([1, 1])
    old = t([0.0, 0.0])
    logp = torch.log(t([1.25, 1.25]))  # ratio 1.25 on both tokens
    adv = t([1.0, 1.0])
    # symmetric ε = 0.2: min(1.25, 1.2) -> loss −1.2, both tokens clipped
    loss, st = ppo_policy_loss(logp, old, adv, m, 0.2)
    assert loss.item() == pytest.approx(-1.2) and st["policy/clipfrac"].item() == 1.0
    # clip-higher ε_high = 0.28: ratio 1.25 is inside -> loss −1.25, nothing clipped
    loss, st = ppo_policy_loss(logp, old, adv, m, 0.2, clip_eps_high=0.28)
    assert loss.item() == pytest.approx(-1.25) and st["policy/clipfrac"].item() == 0.0
    # the lower bound is still ε_low: ratio 0.7 with A < 0 is clipped at 0.8
    loss, _ = ppo_policy_loss(torch.log(t([0.7, 0.7])), old, -adv, m, 0.2, clip_eps_high=0.28)
    assert loss.item() == pytest.approx(0.8)
    # aggregation: seq_mean_token_sum of −1.2 on two tokens of one sequence = −2.4
    loss, _ = ppo_policy_loss(logp, old, adv, m, 0.2, agg="seq_mean_token_sum")
    assert loss.item() == pytest.approx(-2.4)


# ---------------------------------------------------------------------------
# Best-of-n
# ---------------------------------------------------------------------------
def test_best_of_n_kl_by_hand():
    assert best_of_n_kl(1) == 0.0
    assert best_of_n_kl(2) == pytest.approx(math.log(2) - 0.5)  # 0.193147
    assert best_of_n_kl(4) == pytest.approx(1.386294 - 0.75, abs=1e-6)
    with pytest.raises(ValueError):
        best_of_n_kl(0)


def test_best_of_n_expectation_by_hand():
    # one prompt, N = 3 samples: proxy 0.2, 0.9, 0.5 with gold 1, 3, 2
    proxy, gold = t([0.2, 0.9, 0.5]), t([1.0, 3.0, 2.0])
    # n = 1: the mean, 2
    assert best_of_n_expectation(proxy, gold, 1).tolist() == pytest.approx([2.0])
    # n = 2: subsets {a,b}->b (3), {a,c}->c (2), {b,c}->b (3): mean 8/3
    assert best_of_n_expectation(proxy, gold, 2).tolist() == pytest.approx([8 / 3])
    # n = 3: the proxy's argmax, gold 3
    assert best_of_n_expectation(proxy, gold, 3).tolist() == pytest.approx([3.0])
    # a brute-force check over all 4-subsets of 7 samples
    import itertools
    g = torch.Generator().manual_seed(0)
    px, gd = torch.rand(1, 7, generator=g, dtype=torch.float64), torch.rand(1, 7, generator=g, dtype=torch.float64)
    subsets = list(itertools.combinations(range(7), 4))
    brute = sum(gd[0, max(s, key=lambda i: px[0, i])].item() for s in subsets) / len(subsets)
    assert best_of_n_expectation(px, gd, 4).item() == pytest.approx(brute, abs=1e-12)


def test_k3_is_finite_with_a_finite_gradient_at_an_extreme_masked_position():
    """A padding position whose log-ratio is huge must not turn the masked loss or its gradient into NaN
    (exp overflows to inf, and inf × the mask's 0 is NaN in the backward pass)."""
    for dtype in (torch.float32, torch.bfloat16):
        logp = torch.tensor([[-1.0, -0.5, -200.0]], dtype=dtype, requires_grad=True)
        ref_logp = torch.tensor([[-1.2, -0.4, 0.0]], dtype=dtype)
        mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=dtype)
        k3 = kl_estimators(logp, ref_logp, "k3")
        assert torch.isfinite(k3).all()
        loss = masked_mean(k3, mask)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(logp.grad).all() and logp.grad[0, 2] == 0
        # the unmasked positions are the formula itself: (r − 1) − log r with log r = ref − logp
        lr = (ref_logp - logp.detach())[0, :2].double()
        want = (torch.exp(lr) - 1 - lr).mean()
        assert float(loss) == pytest.approx(float(want), rel=2e-2 if dtype == torch.bfloat16 else 1e-5)
    # inside ±20 the clamp changes nothing
    x = torch.tensor([-19.5, 19.5], dtype=torch.float64)
    assert torch.equal(kl_estimators(torch.zeros(2, dtype=torch.float64), x, "k3"), torch.expm1(x) - x)
