"""F.pad speaks PyTorch: a flat tuple that pads the last dim first, modes constant, reflect, replicate, circular.

Values are checked against NumPy's np.pad (reflect, edge, wrap are PyTorch's reflect, replicate,
circular) on the dims the flat tuple names, and values and gradients against torch.nn.functional.pad.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minidl as mdl
import minidl.functional as F
from tests.conftest import leaf

FEW = settings(max_examples=25, deadline=None)
NUMPY_MODE = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}


def numpy_pad(x, pad, mode="constant", value=0.0):
    """The reference: the flat tuple read as pairs from the last dim back; negative widths crop first."""
    pairs = [(pad[i], pad[i + 1]) for i in range(0, len(pad), 2)][::-1]
    pairs = [(0, 0)] * (x.ndim - len(pairs)) + pairs
    crop = tuple(slice(max(-b, 0), n - max(-a, 0)) for n, (b, a) in zip(x.shape, pairs))
    widths = [(max(b, 0), max(a, 0)) for b, a in pairs]
    if mode == "constant":
        return np.pad(x[crop], widths, mode="constant", constant_values=value)
    return np.pad(x[crop], widths, mode=NUMPY_MODE[mode])


@st.composite
def pad_problems(draw, mode):
    """(shape, pad) that PyTorch accepts in ``mode``."""
    if mode == "constant":
        ndim = draw(st.integers(1, 4))
        k = draw(st.integers(1, ndim))
    else:
        k = draw(st.integers(1, 3))
        ndim = k + draw(st.integers(1, 2))
    shape = tuple(draw(st.integers(1, 4)) for _ in range(ndim))
    pad = []
    for n in reversed(shape[ndim - k:]):  # the last dim first
        before = draw(st.integers(-((n - 1) // 2), 3))
        after = draw(st.integers(-((n - 1) // 2), 3))
        left = n - max(-before, 0) - max(-after, 0)  # what remains after cropping
        if mode == "reflect":
            before, after = min(before, left - 1), min(after, left - 1)
        elif mode == "circular":
            before, after = min(before, left), min(after, left)
        pad += [before, after]
    return shape, tuple(pad)


@pytest.mark.parametrize("mode", list(NUMPY_MODE))
@FEW
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_pad_matches_numpy_and_pytorch(mode, data, seed):
    shape, pad = data.draw(pad_problems(mode), label="shape, pad")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    t = leaf(x)
    y = F.pad(t, pad, mode=mode)
    np.testing.assert_array_equal(y.numpy(), numpy_pad(x, pad, mode))
    w = rng.standard_normal(y.shape)
    (y * mdl.tensor(w)).sum().backward()
    torch = pytest.importorskip("torch")
    tt = torch.tensor(x, requires_grad=True)
    yt = torch.nn.functional.pad(tt, pad, mode=mode)
    np.testing.assert_array_equal(y.numpy(), yt.detach().numpy())
    (yt * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(t.grad.numpy(), tt.grad.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode, pad, shape", [
    ("constant", (1, 2), (2, 3)), ("constant", (0, 1, 2, -1), (3, 4)), ("constant", (1, 1, 1, 1, 1, 1), (2, 2, 2)),
    ("reflect", (2, 1), (1, 4)), ("reflect", (1, 2, 2, 0), (1, 3, 4)),
    ("replicate", (3, -1), (2, 3)), ("replicate", (1, 0, 0, 2, 1, 1), (1, 2, 2, 3)),
    ("circular", (1, 3), (1, 2, 3)), ("circular", (2, 0, 1, 1), (2, 2, 3)),
])
def test_pad_first_and_second_derivatives(mode, pad, shape):
    t = leaf(np.random.default_rng(0).standard_normal(shape))
    assert mdl.gradcheck(lambda a: F.pad(a, pad, mode=mode), [t])
    assert mdl.gradgradcheck(lambda a: F.pad(a * a, pad, mode=mode), [t])


def test_the_last_dim_is_padded_first_as_in_pytorch():
    x = mdl.zeros(2, 3)
    assert F.pad(x, (1, 2)).shape == (2, 6)  # NumPy would read (1, 2) as every axis: (5, 6)
    assert F.pad(x, (1, 2, 3, 4)).shape == (9, 6)
    assert F.pad(mdl.zeros(1, 2, 3), (1, 1)).shape == (1, 2, 5)


def test_constant_value_fills_the_border_only():
    x = np.arange(6.0).reshape(2, 3)
    y = F.pad(leaf(x), (1, 0, 0, 1), value=-2.5).numpy()
    np.testing.assert_array_equal(y, [[-2.5, 0, 1, 2], [-2.5, 3, 4, 5], [-2.5, -2.5, -2.5, -2.5]])


def test_reflect_does_not_repeat_the_edge_and_its_gradient_adds_the_copies():
    t = leaf([[1.0, 2.0, 3.0]])
    y = F.pad(t, (2, 1), mode="reflect")
    np.testing.assert_array_equal(y.numpy(), [[3.0, 2.0, 1.0, 2.0, 3.0, 2.0]])
    y.backward(grad=np.array([[1.0, 10.0, 100.0, 1000.0, 10000.0, 100000.0]]))
    np.testing.assert_array_equal(t.grad.numpy(), [[100.0, 101010.0, 10001.0]])


def test_replicate_and_circular_gradients_collect_every_copy():
    t = leaf([[1.0, 2.0, 3.0]])
    F.pad(t, (2, 1), mode="replicate").sum().backward()
    np.testing.assert_array_equal(t.grad.numpy(), [[3.0, 1.0, 2.0]])
    t.grad = None
    F.pad(t, (3, 2), mode="circular").sum().backward()
    np.testing.assert_array_equal(t.grad.numpy(), [[3.0, 3.0, 2.0]])


def test_zero_widths_return_the_input_and_float32_stays_float32():
    x = mdl.tensor([[0.5, 1.0]], requires_grad=True)
    assert F.pad(x, (0, 0)) is x
    for mode in NUMPY_MODE:
        y = F.pad(x, (1, 1), mode=mode)
        assert y.dtype == np.float32
        y.sum().backward()
        assert x.grad.dtype == np.float32


@pytest.mark.parametrize("mode", list(NUMPY_MODE))
def test_pad_on_device(device, mode):
    x = np.random.default_rng(0).standard_normal((1, 3, 4))
    t, c = leaf(x, device), leaf(x)
    y, yc = F.pad(t, (1, 2, 2, 1), mode=mode), F.pad(c, (1, 2, 2, 1), mode=mode)
    assert y.device == t.device
    np.testing.assert_array_equal(y.numpy(), yc.numpy())
    w = np.random.default_rng(1).standard_normal(yc.shape)
    (y * mdl.tensor(w, device=device)).sum().backward()
    (yc * mdl.tensor(w)).sum().backward()
    np.testing.assert_allclose(t.grad.numpy(), c.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("shape, pad, kwargs, error, words", [
    ((2, 3), ((1, 0), (2, 1)), {}, TypeError, "flat tuple of ints.*NumPy's per-axis"),
    ((2, 3), 1, {}, TypeError, "flat tuple of ints"),
    ((2, 3), (1, 2, 3), {}, ValueError, "pair per padded dim, got 3 numbers"),
    ((2, 3), (1, 1, 1, 1, 1, 1), {}, ValueError, r"names 3 dims, but the tensor of shape \(2, 3\) has 2"),
    ((2, 3), (1, 1), {"mode": "edge"}, ValueError, "mode must be one of"),
    ((1, 3), (3, 0), {"mode": "reflect"}, ValueError, "reflect' needs widths less than the size"),
    ((1, 3), (0, 4), {"mode": "circular"}, ValueError, "circular' needs widths at most the size"),
    ((1, 0), (1, 1), {"mode": "replicate"}, ValueError, "replicate' needs a non-empty dim"),
    ((3,), (1, 1), {"mode": "reflect"}, ValueError, r"needs 2 or 3 dims, got shape \(3,\)"),
    ((2, 3), (1, 1, 1, 1), {"mode": "replicate"}, ValueError, "needs 3 or 4 dims"),
    ((1, 2, 3), (1, 1), {"mode": "reflect", "value": 1.0}, ValueError, "takes no value"),
    ((2, 3), (-2, -2), {}, ValueError, "crops more than"),
])
def test_bad_pad_arguments(shape, pad, kwargs, error, words):
    with pytest.raises(error, match=words):
        F.pad(mdl.zeros(*shape), pad, **kwargs)


CROPS = [(3, -2), (-2, 3), (-4, 3), (3, -4), (-5, 1), (1, -5), (2, -1, -3, 1), (-1, 1, 3, -2)]


@pytest.mark.parametrize("mode, pad", [("reflect", pad) for pad in CROPS] +  # reflect: widths below 4 and 5
                         [("replicate", pad) for pad in CROPS + [(-4, 4), (4, -4), (6, -5)]])
def test_a_negative_width_with_reflect_or_replicate_crops_and_pads_as_pytorch(mode, pad):
    """PyTorch counts the places of a padded axis in x's own coordinates, p from −before to n + after − 1,
    so the side that is not cropped still mirrors (repeats) about x's own edge, reading the cropped values."""
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(5).standard_normal((2, 4, 5))
    if len(pad) == 4:
        x = x.reshape(1, 2, 4, 5)
    t = leaf(x)
    y = F.pad(t, pad, mode=mode)
    tt = torch.tensor(x, requires_grad=True)
    yt = torch.nn.functional.pad(tt, pad, mode=mode)
    np.testing.assert_array_equal(y.numpy(), yt.detach().numpy())
    w = np.random.default_rng(6).standard_normal(y.shape)
    (y * mdl.tensor(w)).sum().backward()
    (yt * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(t.grad.numpy(), tt.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_reflect_with_a_crop_reads_the_cropped_values():
    x = mdl.tensor(np.arange(5.0).reshape(1, 5))
    np.testing.assert_array_equal(F.pad(x, (3, -2), mode="reflect").numpy(), [[3, 2, 1, 0, 1, 2]])
    np.testing.assert_array_equal(F.pad(x, (-4, 2), mode="reflect").numpy(), [[4, 3, 2]])
    np.testing.assert_array_equal(F.pad(x, (-5, 2), mode="replicate").numpy(), [[4, 4]])
    with pytest.raises(ValueError, match=r"pad: pad \(-5, -1\) crops away all of dim 1"):
        F.pad(x, (-5, -1), mode="replicate")
