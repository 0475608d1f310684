"""Unit tests for rlhf_lab.algorithms.dpo_math against numbers computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf_lab.algorithms.dpo_math import bradley_terry_loss, preference_loss

# Two pairs (log-probs of whole responses):
#   pair 0: pi_w = -1, pi_l = -2, ref_w = -1.5, ref_l = -1.5 -> logits = (-1 + 2) - 0 = +1
#   pair 1: pi_w = -3, pi_l = -1, ref_w = -2,   ref_l = -2   -> logits = (-3 + 1) - 0 = -2
PC = torch.tensor([-1.0, -3.0], dtype=torch.float64)
PR = torch.tensor([-2.0, -1.0], dtype=torch.float64)
RC = torch.tensor([-1.5, -2.0], dtype=torch.float64)
RR = torch.tensor([-1.5, -2.0], dtype=torch.float64)
BETA = 0.1


def test_dpo_sigmoid_by_hand():
    losses, chosen_r, rejected_r = preference_loss(PC, PR, RC, RR, beta=BETA)
    # DPO eq. 7: -log sigma(beta * logits) = log(1 + exp(-beta * logits))
    #   pair 0: log(1 + e^-0.1) = 0.644397 ; pair 1: log(1 + e^0.2) = 0.798139
    expected = [math.log(1 + math.exp(-0.1)), math.log(1 + math.exp(0.2))]
    assert losses.tolist() == pytest.approx(expected, abs=1e-12)
    assert expected == pytest.approx([0.644397, 0.798139], abs=1e-6)
    # implicit rewards beta * (pi - ref): chosen 0.1*0.5, 0.1*(-1); rejected 0.1*(-0.5), 0.1*1
    assert chosen_r.tolist() == pytest.approx([0.05, -0.1])
    assert rejected_r.tolist() == pytest.approx([-0.05, 0.1])


def test_dpo_sigmoid_gradient_and_detached_rewards():
    pc = PC.clone().requires_grad_()
    losses, chosen_r, rejected_r = preference_loss(pc, PR, RC, RR, beta=BETA)
    assert not chosen_r.requires_grad and not rejected_r.requires_grad
    losses.sum().backward()
    # d/d pi_w [-log sigma(beta * logits)] = -beta * sigma(-beta * logits)
    #   pair 0: -0.1 / (1 + e^0.1) = -0.047502 ; pair 1: -0.1 / (1 + e^-0.2) = -0.054983
    expected = [-0.1 / (1 + math.exp(0.1)), -0.1 / (1 + math.exp(-0.2))]
    assert pc.grad.tolist() == pytest.approx(expected, abs=1e-12)


def test_dpo_label_smoothing_by_hand():
    losses, _, _ = preference_loss(PC, PR, RC, RR, beta=BETA, label_smoothing=0.1)
    # conservative DPO: 0.9 * log(1 + e^{-beta*logits}) + 0.1 * log(1 + e^{+beta*logits})
    expected = [
        0.9 * math.log(1 + math.exp(-0.1)) + 0.1 * math.log(1 + math.exp(0.1)),
        0.9 * math.log(1 + math.exp(0.2)) + 0.1 * math.log(1 + math.exp(-0.2)),
    ]
    assert losses.tolist() == pytest.approx(expected, abs=1e-12)


def test_ipo_sum_by_hand():
    losses, _, _ = preference_loss(PC, PR, RC, RR, beta=BETA, loss_type="ipo_sum")
    # 1 / (2 * 0.1) = 5 -> (1 - 5)^2 = 16, (-2 - 5)^2 = 49
    assert losses.tolist() == pytest.approx([16.0, 49.0])


def test_ipo_averages_log_probs_over_tokens_by_hand():
    # pair 0 with chosen 2 tokens, rejected 4 tokens: (-1/2 + 2/4) - (-1.5/2 + 1.5/4) = 0 + 0.375 = 0.375
    #   -> (0.375 - 5)^2 = 21.390625
    # pair 1 with 1 and 2 tokens: (-3 + 1/2) - (-2 + 2/2) = -2.5 + 1 = -1.5 -> (-1.5 - 5)^2 = 42.25
    losses, cr, rr = preference_loss(PC, PR, RC, RR, beta=BETA, loss_type="ipo",
                                     chosen_lengths=torch.tensor([2, 1]), rejected_lengths=torch.tensor([4, 2]))
    assert losses.tolist() == pytest.approx([21.390625, 42.25])
    assert cr.tolist() == pytest.approx([0.1 * (-0.5 + 0.75), 0.1 * (-3 + 2)])  # per-token implicit rewards
    with pytest.raises(ValueError, match="chosen_lengths"):
        preference_loss(PC, PR, RC, RR, beta=BETA, loss_type="ipo")


@pytest.mark.parametrize("n", [5, 40])
def test_ipo_is_length_invariant_ipo_sum_is_not(n):
    # the same 0.1 nat/token advantage of the chosen response over the reference, on n-token responses
    zero = torch.zeros(1, dtype=torch.float64)
    pc = torch.full((1,), 0.1 * n, dtype=torch.float64)
    lengths = torch.tensor([n])
    ipo, _, _ = preference_loss(pc, zero, zero, zero, beta=0.1, loss_type="ipo",
                                chosen_lengths=lengths, rejected_lengths=lengths)
    assert ipo.item() == pytest.approx((0.1 - 5) ** 2)  # 24.01 at every length
    summed, _, _ = preference_loss(pc, zero, zero, zero, beta=0.1, loss_type="ipo_sum")
    assert summed.item() == pytest.approx({5: 20.25, 40: 1.0}[n])  # (0.5 - 5)^2, (4 - 5)^2


def test_hinge_by_hand():
    losses, _, _ = preference_loss(PC, PR, RC, RR, beta=BETA, loss_type="hinge")
    # relu(1 - 0.1 * 1) = 0.9, relu(1 + 0.1 * 2) = 1.2
    assert losses.tolist() == pytest.approx([0.9, 1.2])
    # with beta = 1: relu(1 - 1) = 0, relu(1 + 2) = 3
    losses, _, _ = preference_loss(PC, PR, RC, RR, beta=1.0, loss_type="hinge")
    assert losses.tolist() == pytest.approx([0.0, 3.0])


def test_preference_loss_errors():
    with pytest.raises(ValueError, match=r"algo\.beta"):
        preference_loss(PC, PR, RC, RR, beta=0.0)
    with pytest.raises(ValueError, match=r"algo\.beta"):
        preference_loss(PC, PR, RC, RR, beta=-1.0)
    with pytest.raises(ValueError, match=r"kto.*sigmoid, ipo, ipo_sum, hinge"):
        preference_loss(PC, PR, RC, RR, beta=BETA, loss_type="kto")
    with pytest.raises(ValueError, match=r"label_smoothing.*\[0, 0\.5\)"):
        preference_loss(PC, PR, RC, RR, beta=BETA, label_smoothing=0.5)
    with pytest.raises(ValueError, match=r"label_smoothing"):
        preference_loss(PC, PR, RC, RR, beta=BETA, label_smoothing=-0.1)
    with pytest.raises(ValueError, match=r"label_smoothing.*sigmoid"):
        preference_loss(PC, PR, RC, RR, beta=BETA, loss_type="ipo", label_smoothing=0.1)


def test_bradley_terry_loss_by_hand():
    rc = torch.tensor([2.0, 0.0], dtype=torch.float64)
    rr = torch.tensor([1.0, 1.0], dtype=torch.float64)
    # mean(-log sigma(1), -log sigma(-1)) = mean(log(1 + e^-1), log(1 + e)) = mean(0.313262, 1.313262)
    plain = 0.5 * (math.log(1 + math.exp(-1)) + math.log(1 + math.exp(1)))
    assert plain == pytest.approx(0.813262, abs=1e-6)
    assert bradley_terry_loss(rc, rr).item() == pytest.approx(plain, abs=1e-12)
    # margin [0.5, 0]: mean(log(1 + e^-0.5), log(1 + e))
    margin = torch.tensor([0.5, 0.0], dtype=torch.float64)
    with_margin = 0.5 * (math.log(1 + math.exp(-0.5)) + math.log(1 + math.exp(1)))
    assert bradley_terry_loss(rc, rr, margin=margin).item() == pytest.approx(with_margin, abs=1e-12)
    # centering: 0.01 * mean((2+1)^2, (0+1)^2) = 0.01 * 5 = 0.05
    assert bradley_terry_loss(rc, rr, center_coef=0.01).item() == pytest.approx(plain + 0.05, abs=1e-12)
