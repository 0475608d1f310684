"""rlhf_lab/models/onednn.py: float32 CPU linears through oneDNN with reordered weights, for gradient-free passes only
(issue 70). The results against ``F.linear`` (to float32 rounding), training passes untouched inside the
context, what is and is not reordered, and the layers restored on exit."""

from __future__ import annotations

import weakref

import pytest
import torch
import torch.nn as nn

from rlhf_lab.models import onednn


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64, bias=False), nn.Linear(64, 300))


def test_this_torch_has_the_operators():
    assert onednn.available()  # the CPU wheel the README installs: the fast path is the one the tests exercise


@pytest.mark.parametrize("rows", [1, 4, 37])
def test_gradient_free_outputs_agree_with_f_linear_to_float32_rounding(rows, monkeypatch):
    """Each layer's forward is oneDNN's inner product (its calls counted), within float32 rounding of ``F.linear``:
    another summation order in general, but on some CPUs both end in the same kernel and agree to the bit (a
    2-core Xeon machine on 2026-12-07, issue 70), so the bits do not tell which path ran."""
    pointwise, calls = torch.ops.mkldnn._linear_pointwise, []
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", lambda *a: calls.append(a[1]) or pointwise(*a))
    m, x = model(), torch.randn(rows, 3, 64)
    linears = [lin for lin in m if isinstance(lin, nn.Linear)]
    with torch.no_grad():
        ref = m(x)
        assert not calls  # outside the context: F.linear
        with onednn.onednn_linears(m, rows=4) as n:  # reordered for 4 rows: other row counts computed too
            assert n == 3
            assert all("forward" in lin.__dict__ for lin in linears)
            out = m(x)
    assert len(calls) == 3 and all(w is not lin.weight for w, lin in zip(calls, linears))  # their reordered copies
    assert out.shape == ref.shape and torch.allclose(out, ref, rtol=1e-5, atol=1e-6)
    assert all("forward" not in lin.__dict__ for lin in m)  # restored


def test_a_training_pass_inside_the_context_is_f_linear_bit_for_bit_with_its_gradients():
    m, x = model(), torch.randn(5, 64)
    ref = m(x).square().sum()
    ref.backward()
    grads = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    with onednn.onednn_linears(m, rows=5):
        out = m(x).square().sum()
        out.backward()
    assert torch.equal(out, ref)
    assert all(torch.equal(p.grad, g) for p, g in zip(m.parameters(), grads))


def test_inference_mode_takes_the_onednn_path_and_other_dtypes_are_left_alone():
    m, x = model(), torch.randn(8, 64)
    m[3].to(torch.bfloat16)
    ref = m[2](m[1](m[0](x)))
    with torch.inference_mode(), onednn.onednn_linears(m, rows=8) as n:
        assert n == 2 and "forward" not in m[3].__dict__
        out = m[2](m[1](m[0](x)))
    assert torch.allclose(out, ref, rtol=1e-5, atol=1e-6) and not torch.equal(out, ref)


def test_the_layers_are_restored_when_the_body_raises_and_nothing_changes_without_the_operators(monkeypatch):
    m = model()
    with pytest.raises(RuntimeError, match="boom"):
        with onednn.onednn_linears(m, rows=1):
            raise RuntimeError("boom")
    assert all("forward" not in lin.__dict__ for lin in m)
    monkeypatch.setattr(onednn, "available", lambda: False)
    with onednn.onednn_linears(m, rows=1) as n:
        assert n == 0 and all("forward" not in lin.__dict__ for lin in m)


def test_a_frozen_weights_copy_is_kept_until_the_weight_changes_and_a_trained_one_is_not():
    m, x = model(), torch.randn(4, 64)
    m[0].requires_grad_(False)
    with torch.no_grad():
        with onednn.onednn_linears(m, rows=4):
            first = onednn.KEPT[m[0]][2]
            m(x)
        assert m[3] not in onednn.KEPT  # trained: never reused (its weight changes between rollouts)
        with onednn.onednn_linears(m, rows=4):
            assert onednn.KEPT[m[0]][2] is first  # the same tensor at the same version: reused
        m[0].weight.mul_(2.0)  # an in-place change (a reference synced from the policy) bumps the version
        ref = m(x)
        with onednn.onednn_linears(m, rows=4):
            assert onednn.KEPT[m[0]][2] is not first
            out = m(x)
    assert torch.allclose(out, ref, rtol=1e-5, atol=1e-6)  # computed with the changed weight


def test_a_trained_weights_last_copy_is_freed_just_before_its_next_reorder(monkeypatch):
    """The copy is held after the context (not reused: computed with the weight as it is now) and dropped before the
    new one is allocated, so that the allocator hands the same memory back (issue 70: fresh pages cost 3-4 s)."""
    m, x = model(), torch.randn(4, 64)
    with torch.no_grad(), onednn.onednn_linears(m, rows=4):
        pass
    held = weakref.ref(onednn.LAST[m[3]])
    alive_at_reorder = []
    real = torch.ops.mkldnn._reorder_linear_weight

    def reorder(w, batch_size):
        if w.data_ptr() == m[3].weight.data_ptr():
            alive_at_reorder.append(held() is not None)
        return real(w, batch_size=batch_size)

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", reorder)
    with torch.no_grad():
        m[3].weight.add_(1.0)  # a training step's update
        ref = m(x)
        with onednn.onednn_linears(m, rows=4):
            out = m(x)
    assert alive_at_reorder == [False] and m[3] in onednn.LAST
    assert torch.allclose(out, ref, rtol=1e-5, atol=1e-6)  # computed with the updated weight


def test_kept_only_reorders_only_the_linears_with_a_kept_copy():
    m = model()
    m[0].requires_grad_(False)
    m[2].requires_grad_(False)
    with torch.no_grad(), onednn.onednn_linears(m, rows=2, kept_only=True) as n:
        assert n == 0  # nothing kept yet: no new copy (a frozen model's would cost its size in memory)
    with torch.no_grad(), onednn.onednn_linears(m[:1], rows=2):  # the sampler's context keeps m[0]'s
        pass
    with torch.no_grad(), onednn.onednn_linears(m, rows=2, kept_only=True) as n:
        assert n == 1 and "forward" in m[0].__dict__ and "forward" not in m[2].__dict__
