"""minidl.nn.utils (gradient clipping, against torch.nn.utils) and the minidl.nn.functional alias."""
import numpy as np
import pytest

import minidl as mdl
import minidl.functional
from minidl import nn, optim


def test_nn_functional_is_an_alias_of_minidl_functional():
    import minidl.nn.functional as F1
    from minidl.nn import functional as F2
    assert F1 is F2 is nn.functional
    assert F1.__all__ == minidl.functional.__all__
    for name in minidl.functional.__all__:
        assert getattr(F1, name) is getattr(minidl.functional, name), name
    x = mdl.tensor([-1.0, 2.0])
    np.testing.assert_array_equal(F1.relu(x).numpy(), [0.0, 2.0])


def test_clipping_has_one_implementation_under_both_paths():
    assert nn.utils.clip_grad_norm_ is optim.clip_grad_norm_
    assert nn.utils.clip_grad_value_ is optim.clip_grad_value_


def make_grads(torch, grads, dtype):
    ours = [mdl.tensor(np.zeros(g.shape, dtype), requires_grad=True) for g in grads]
    theirs = [torch.zeros(g.shape, dtype=getattr(torch, np.dtype(dtype).name), requires_grad=True) for g in grads]
    for o, t, g in zip(ours, theirs, grads):
        o.grad, t.grad = mdl.tensor(g.astype(dtype)), torch.tensor(g.astype(dtype))
    return ours, theirs


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, float("inf"), "inf"])
@pytest.mark.parametrize("max_norm", [0.5, 100.0])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_clip_grad_norm_matches_torch(norm_type, max_norm, dtype):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal((3, 4)), rng.standard_normal(5), rng.standard_normal((2, 2, 2))]
    ours, theirs = make_grads(torch, grads, dtype)
    total_o = nn.utils.clip_grad_norm_(ours, max_norm, norm_type)
    total_t = torch.nn.utils.clip_grad_norm_(theirs, max_norm, norm_type)
    rtol = 1e-12 if dtype == np.float64 else 1e-6
    assert total_o.dtype == dtype and total_o.shape == ()
    assert float(total_o) == pytest.approx(float(total_t), rel=rtol)
    flat = np.concatenate([g.ravel() for g in grads])
    p = float(norm_type)
    want = np.abs(flat).max() if p == np.inf else (np.abs(flat) ** p).sum() ** (1 / p)
    assert float(total_o) == pytest.approx(want, rel=rtol)
    for o, t, g in zip(ours, theirs, grads):
        np.testing.assert_allclose(o.grad.numpy(), t.grad.numpy(), rtol=10 * rtol)
        np.testing.assert_allclose(o.grad.numpy(), g * min(1.0, max_norm / (want + 1e-6)), rtol=10 * rtol)


@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply")
def test_clip_grad_norm_nonfinite_like_torch():
    torch = pytest.importorskip("torch")
    grads = [np.array([1.0, np.inf]), np.array([2.0])]
    ours, theirs = make_grads(torch, grads, np.float64)
    with pytest.raises(RuntimeError, match="non-finite"):
        torch.nn.utils.clip_grad_norm_(theirs, 1.0, error_if_nonfinite=True)
    with pytest.raises(RuntimeError, match="clip_grad_norm_: the total gradient norm of order 2.0 is inf"):
        nn.utils.clip_grad_norm_(ours, 1.0, error_if_nonfinite=True)
    np.testing.assert_array_equal(ours[0].grad.numpy(), grads[0])  # nothing changed before the error
    total_o = nn.utils.clip_grad_norm_(ours, 1.0)
    total_t = torch.nn.utils.clip_grad_norm_(theirs, 1.0)
    assert float(total_o) == float(total_t) == np.inf
    for o, t in zip(ours, theirs):  # scaled by 1/inf as torch does: finite entries become 0, inf becomes nan
        np.testing.assert_array_equal(o.grad.numpy(), t.grad.numpy())


def test_clip_grad_norm_single_tensor_generator_and_no_grads():
    torch = pytest.importorskip("torch")
    g = np.array([3.0, 4.0])
    ours, theirs = make_grads(torch, [g], np.float64)
    assert float(nn.utils.clip_grad_norm_(ours[0], 1.0, foreach=None)) == float(
        torch.nn.utils.clip_grad_norm_(theirs[0], 1.0)) == 5.0
    np.testing.assert_allclose(ours[0].grad.numpy(), theirs[0].grad.numpy(), rtol=1e-12)
    model = nn.Linear(2, 2)
    assert float(nn.utils.clip_grad_norm_(model.parameters(), 1.0)) == 0.0  # no gradients yet: norm 0


def test_clip_grad_value_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    grads = [rng.standard_normal((4, 3)) * 2, rng.standard_normal(6) * 2]
    ours, theirs = make_grads(torch, grads, np.float32)
    assert nn.utils.clip_grad_value_(ours, 0.7) is None
    torch.nn.utils.clip_grad_value_(theirs, 0.7)
    for o, t, g in zip(ours, theirs, grads):
        np.testing.assert_array_equal(o.grad.numpy(), t.grad.numpy())
        np.testing.assert_array_equal(o.grad.numpy(), np.clip(g.astype(np.float32), -0.7, 0.7))
    with pytest.raises(ValueError, match="clip_value must be > 0"):
        nn.utils.clip_grad_value_(ours, 0)


def test_clip_grad_norm_of_float16_gradients_sums_their_squares_in_float32(torch):
    """300² = 90,000 overflows float16 (65,504): each ‖g‖² is summed in float32, so the norm of
    four such entries is 600, as PyTorch (and exact arithmetic) give; the scaled gradients stay float16."""
    grads = [np.full(3, 300.0), np.array([-300.0])]
    ours, theirs = make_grads(torch, grads, np.float16)
    total = nn.utils.clip_grad_norm_(ours, 1.0)
    assert total.dtype == np.float16 and float(total) == 600.0
    assert float(torch.nn.utils.clip_grad_norm_(theirs, 1.0)) == 600.0
    for o, t in zip(ours, theirs):
        assert o.grad.dtype == np.float16
        np.testing.assert_allclose(o.grad.numpy().astype(np.float64), t.grad.numpy().astype(np.float64), rtol=1e-3)
