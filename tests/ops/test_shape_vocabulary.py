"""The PyTorch shape vocabulary: flatten, unflatten, squeeze, unsqueeze, permute, movedim, expand, cat,
split, chunk, narrow, flip, roll, repeat, repeat_interleave, tril, triu, diagonal, unfold.

Each op is checked three ways: its values against a NumPy formula, its values and gradient
against PyTorch on the same input (when torch is installed), and its first and second
derivatives against finite differences. F.pad has its own file, test_shape_pad.py.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import minidl as mdl
import minidl.functional as F
from minidl import nn
from tests.conftest import check_device_against_cpu, leaf

FEW = settings(max_examples=15, deadline=None)


def windows(x, dim, size, step):
    """NumPy's reference for Tensor.unfold: every window of ``size`` along ``dim``, ``step`` apart."""
    view = np.lib.stride_tricks.sliding_window_view(x, size, axis=dim)
    return view[(slice(None),) * dim + (slice(None, None, step),)]


def torch_split(t, sizes, dim):
    return tuple(t.split(sizes, dim))


# name: (input shape, minidl call, NumPy formula, torch call). Each minidl call is the spelling a
# PyTorch user writes; the functional spelling is checked against the method in test_functional_forms.
OPS = {
    "flatten": ((2, 3, 4), lambda a: a.flatten(), lambda x: x.reshape(-1), lambda t: t.flatten()),
    "flatten_dims": ((2, 3, 4, 2), lambda a: a.flatten(1, 2), lambda x: x.reshape(2, 12, 2),
                     lambda t: t.flatten(1, 2)),
    "flatten_negative": ((2, 3, 4), lambda a: a.flatten(-2), lambda x: x.reshape(2, 12), lambda t: t.flatten(-2)),
    "unflatten": ((2, 12), lambda a: a.unflatten(1, (3, -1, 2)), lambda x: x.reshape(2, 3, 2, 2),
                  lambda t: t.unflatten(1, (3, -1, 2))),
    "squeeze_all": ((1, 3, 1, 2), lambda a: a.squeeze(), lambda x: np.squeeze(x), lambda t: t.squeeze()),
    "squeeze_dim": ((1, 3, 1, 2), lambda a: a.squeeze(2), lambda x: np.squeeze(x, 2), lambda t: t.squeeze(2)),
    "squeeze_not_one": ((1, 3, 1, 2), lambda a: a.squeeze(1), lambda x: x, lambda t: t.squeeze(1)),
    "squeeze_tuple": ((1, 3, 1, 2), lambda a: a.squeeze((0, 1, -2)), lambda x: np.squeeze(x, (0, 2)),
                      lambda t: t.squeeze((0, 1, -2))),
    "unsqueeze": ((2, 3), lambda a: a.unsqueeze(1), lambda x: np.expand_dims(x, 1), lambda t: t.unsqueeze(1)),
    "unsqueeze_end": ((2, 3), lambda a: a.unsqueeze(-1), lambda x: x[..., None], lambda t: t.unsqueeze(-1)),
    "unsqueeze_front": ((2, 3), lambda a: a.unsqueeze(-3), lambda x: x[None], lambda t: t.unsqueeze(-3)),
    "permute": ((2, 3, 4), lambda a: a.permute(2, 0, 1), lambda x: x.transpose(2, 0, 1),
                lambda t: t.permute(2, 0, 1)),
    "permute_tuple": ((2, 3, 4), lambda a: a.permute((1, -1, 0)), lambda x: x.transpose(1, 2, 0),
                      lambda t: t.permute((1, -1, 0))),
    "movedim": ((2, 3, 4, 5), lambda a: a.movedim(0, -1), lambda x: np.moveaxis(x, 0, -1),
                lambda t: t.movedim(0, -1)),
    "movedim_many": ((2, 3, 4, 5), lambda a: a.movedim((0, 3), (2, 0)), lambda x: np.moveaxis(x, (0, 3), (2, 0)),
                     lambda t: t.movedim((0, 3), (2, 0))),
    "expand": ((3, 1), lambda a: a.expand(2, 3, 4), lambda x: np.broadcast_to(x, (2, 3, 4)),
               lambda t: t.expand(2, 3, 4)),
    "expand_keep": ((3, 1), lambda a: a.expand((-1, 5)), lambda x: np.broadcast_to(x, (3, 5)),
                    lambda t: t.expand((-1, 5))),
    "transpose_two_dims": ((2, 3, 4), lambda a: a.transpose(0, 2), lambda x: np.swapaxes(x, 0, 2),
                           lambda t: t.transpose(0, 2)),
    "transpose_keywords": ((2, 3), lambda a: a.transpose(dim0=1, dim1=0), lambda x: x.T,
                           lambda t: t.transpose(dim0=1, dim1=0)),
    "view_varargs": ((2, 6), lambda a: a.view(3, -1), lambda x: x.reshape(3, 4), lambda t: t.view(3, -1)),
    "cat": ((3, 2), lambda a: F.cat([a, a * a], dim=1), lambda x: np.concatenate([x, x * x], 1),
            lambda t: __import__("torch").cat([t, t * t], dim=1)),
    "split": ((5, 2), lambda a: a.split(2), lambda x: tuple(np.split(x, [2, 4])), lambda t: t.split(2)),
    "split_sizes": ((2, 6), lambda a: a.split([1, 0, 5], dim=1), lambda x: tuple(np.split(x, [1, 1], axis=1)),
                    lambda t: torch_split(t, [1, 0, 5], 1)),
    "chunk": ((2, 7), lambda a: a.chunk(3, -1), lambda x: tuple(np.split(x, [3, 6], axis=1)),
              lambda t: t.chunk(3, -1)),
    "chunk_fewer": ((6, 2), lambda a: a.chunk(4), lambda x: tuple(np.split(x, [2, 4])), lambda t: t.chunk(4)),
    "narrow": ((3, 5), lambda a: a.narrow(1, 1, 3), lambda x: x[:, 1:4], lambda t: t.narrow(1, 1, 3)),
    "narrow_negative": ((3, 5), lambda a: a.narrow(1, -2, 2), lambda x: x[:, 3:5], lambda t: t.narrow(1, -2, 2)),
    "flip": ((2, 3, 4), lambda a: a.flip(0, 2), lambda x: x[::-1, :, ::-1], lambda t: t.flip(0, 2)),
    "flip_tuple": ((2, 3), lambda a: a.flip((-1,)), lambda x: x[:, ::-1], lambda t: t.flip((-1,))),
    "roll": ((3, 4), lambda a: a.roll((1, -3), (0, 1)), lambda x: np.roll(x, (1, -3), (0, 1)),
             lambda t: t.roll((1, -3), (0, 1))),
    "roll_flattened": ((3, 4), lambda a: a.roll(5), lambda x: np.roll(x, 5), lambda t: t.roll(5)),
    "roll_one_dim": ((3, 4), lambda a: a.roll(-1, 1), lambda x: np.roll(x, -1, 1), lambda t: t.roll(-1, 1)),
    "repeat": ((2, 3), lambda a: a.repeat(2, 3), lambda x: np.tile(x, (2, 3)), lambda t: t.repeat(2, 3)),
    "repeat_new_dims": ((2, 3), lambda a: a.repeat((3, 1, 2)), lambda x: np.tile(x, (3, 1, 2)),
                        lambda t: t.repeat((3, 1, 2))),
    "repeat_interleave": ((2, 3), lambda a: a.repeat_interleave(2, dim=1), lambda x: np.repeat(x, 2, axis=1),
                          lambda t: t.repeat_interleave(2, dim=1)),
    "repeat_interleave_flat": ((2, 3), lambda a: a.repeat_interleave(3), lambda x: np.repeat(x, 3),
                               lambda t: t.repeat_interleave(3)),
    "repeat_interleave_counts": ((3, 2), lambda a: a.repeat_interleave(mdl.tensor([2, 0, 3]), dim=0),
                                 lambda x: np.repeat(x, [2, 0, 3], axis=0),
                                 lambda t: t.repeat_interleave(__import__("torch").tensor([2, 0, 3]), dim=0)),
    "tril": ((2, 3, 4), lambda a: a.tril(), lambda x: np.tril(x), lambda t: t.tril()),
    "tril_above": ((3, 4), lambda a: a.tril(1), lambda x: np.tril(x, 1), lambda t: t.tril(1)),
    "triu": ((4, 3), lambda a: a.triu(), lambda x: np.triu(x), lambda t: t.triu()),
    "triu_below": ((2, 4, 3), lambda a: a.triu(-2), lambda x: np.triu(x, -2), lambda t: t.triu(-2)),
    "diagonal": ((3, 4), lambda a: a.diagonal(), lambda x: np.diagonal(x), lambda t: t.diagonal()),
    "diagonal_offset": ((3, 4), lambda a: a.diagonal(1), lambda x: np.diagonal(x, 1), lambda t: t.diagonal(1)),
    "diagonal_below": ((4, 3), lambda a: a.diagonal(-2), lambda x: np.diagonal(x, -2), lambda t: t.diagonal(-2)),
    "diagonal_dims": ((3, 2, 4), lambda a: a.diagonal(1, 2, 0), lambda x: np.diagonal(x, 1, 2, 0),
                      lambda t: t.diagonal(1, 2, 0)),
    "diagonal_neighbours": ((2, 3, 4), lambda a: a.diagonal(0, -1, -2), lambda x: np.diagonal(x, 0, -1, -2),
                            lambda t: t.diagonal(0, -1, -2)),
    "unfold": ((2, 7), lambda a: a.unfold(1, 3, 2), lambda x: windows(x, 1, 3, 2), lambda t: t.unfold(1, 3, 2)),
    "unfold_overlapping": ((5, 2), lambda a: a.unfold(0, 3, 1), lambda x: windows(x, 0, 3, 1),
                           lambda t: t.unfold(0, 3, 1)),
    "unfold_middle": ((2, 6, 3), lambda a: a.unfold(-2, 2, 3), lambda x: windows(x, 1, 2, 3),
                      lambda t: t.unfold(-2, 2, 3)),
}


def _as_list(y):
    return list(y) if isinstance(y, tuple) else [y]


@pytest.mark.parametrize("name", OPS)
def test_values_match_numpy(name):
    shape, fn, formula, _ = OPS[name]
    x = np.random.default_rng(0).standard_normal(shape)
    got, expected = _as_list(fn(leaf(x))), _as_list(formula(x))
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape
        np.testing.assert_array_equal(g.numpy(), e)


@pytest.mark.parametrize("name", OPS)
def test_values_and_gradients_match_pytorch(name):
    torch = pytest.importorskip("torch")
    shape, fn, _, torch_fn = OPS[name]
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape)
    t, tt = leaf(x), torch.tensor(x, requires_grad=True)
    ys, yts = _as_list(fn(t)), _as_list(torch_fn(tt))
    assert len(ys) == len(yts)
    loss, torch_loss = 0, 0
    for y, yt in zip(ys, yts):
        assert y.shape == tuple(yt.shape)
        np.testing.assert_array_equal(y.numpy(), yt.detach().numpy())
        w = rng.standard_normal(y.shape)  # a different weight per output: a wrong routing shows
        loss = loss + (y * mdl.tensor(w)).sum()
        torch_loss = torch_loss + (yt * torch.tensor(w)).sum()
    loss.backward()
    torch_loss.backward()
    np.testing.assert_allclose(t.grad.numpy(), tt.grad.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", OPS)
def test_first_and_second_derivatives_pass_finite_differences(name):
    shape, fn, _, _ = OPS[name]
    t = leaf(np.random.default_rng(2).standard_normal(shape))
    assert mdl.gradcheck(fn, [t])
    assert mdl.gradgradcheck(lambda a: fn(a * a), [t])


# ---------------------------------------------------------------- the functional spellings
FUNCTIONAL = [
    (lambda a: F.flatten(a, 1), lambda a: a.flatten(1)),
    (lambda a: F.unflatten(a, -1, (2, 2)), lambda a: a.unflatten(-1, (2, 2))),
    (lambda a: F.squeeze(a, 0), lambda a: a.squeeze(0)),
    (lambda a: F.unsqueeze(a, 0), lambda a: a.unsqueeze(0)),
    (lambda a: F.permute(a, (1, 0, 2)), lambda a: a.permute(1, 0, 2)),
    (lambda a: F.movedim(a, 1, 0), lambda a: a.movedim(1, 0)),
    (lambda a: F.expand(a, 2, -1, -1, -1), lambda a: a.expand(2, 1, 3, 4)),
    (lambda a: F.split(a, [1, 2], 1), lambda a: a.split([1, 2], dim=1)),
    (lambda a: F.chunk(a, 2, dim=2), lambda a: a.chunk(2, 2)),
    (lambda a: F.narrow(a, 2, 1, 2), lambda a: a.narrow(2, 1, 2)),
    (lambda a: F.flip(a, [0, 1]), lambda a: a.flip(0, 1)),
    (lambda a: F.flip(a, dims=(2,)), lambda a: a.flip(2)),
    (lambda a: F.permute(a, dims=[2, 0, 1]), lambda a: a.permute(2, 0, 1)),
    (lambda a: F.roll(a, 1, 2), lambda a: a.roll(1, 2)),
    (lambda a: F.repeat(a, 1, 2, 1), lambda a: a.repeat(1, 2, 1)),
    (lambda a: F.repeat_interleave(a, [1, 2, 0], dim=1), lambda a: a.repeat_interleave([1, 2, 0], 1)),
    (lambda a: F.tril(a, -1), lambda a: a.tril(-1)),
    (lambda a: F.triu(a, 1), lambda a: a.triu(1)),
    (lambda a: F.diagonal(a, 0, 1, 2), lambda a: a.diagonal(0, 1, 2)),
    (lambda a: F.cat([a, a], 0), lambda a: mdl.concatenate([a, a], axis=0)),
    (lambda a: F.cat([a, a], axis=-1), lambda a: mdl.concatenate([a, a], dim=-1)),
    (lambda a: F.transpose(a, 0, 1), lambda a: a.transpose(1, 0)),
]


@pytest.mark.parametrize("index", range(len(FUNCTIONAL)))
def test_functional_forms(index):
    functional, method = FUNCTIONAL[index]
    x = np.random.default_rng(3).standard_normal((1, 3, 4))
    for f, m in zip(_as_list(functional(leaf(x))), _as_list(method(leaf(x)))):
        np.testing.assert_array_equal(f.numpy(), m.numpy())


# ---------------------------------------------------------------- properties over random shapes
shapes = hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4)
seeds = st.integers(0, 2**32 - 1)


@FEW
@given(shape=shapes, seed=seeds, data=st.data())
def test_flatten_and_unflatten_are_inverse(shape, seed, data):
    x = np.random.default_rng(seed).standard_normal(shape)
    start = data.draw(st.integers(-len(shape), len(shape) - 1), label="start")
    end = data.draw(st.integers(start % len(shape), len(shape) - 1), label="end")
    start_pos = start % len(shape)
    flat = leaf(x).flatten(start, end)
    assert flat.shape == shape[:start_pos] + (int(np.prod(shape[start_pos:end + 1])),) + shape[end + 1:]
    back = flat.unflatten(start_pos, shape[start_pos:end + 1])
    np.testing.assert_array_equal(back.numpy(), x)


@FEW
@given(shape=shapes, seed=seeds, data=st.data())
def test_movedim_matches_numpy_moveaxis(shape, seed, data):
    x = np.random.default_rng(seed).standard_normal(shape)
    count = data.draw(st.integers(1, len(shape)), label="count")
    source = data.draw(st.permutations(range(len(shape))), label="source")[:count]
    destination = data.draw(st.permutations(range(len(shape))), label="destination")[:count]
    t = leaf(x)
    y = t.movedim(tuple(source), tuple(destination))
    np.testing.assert_array_equal(y.numpy(), np.moveaxis(x, source, destination))
    w = np.random.default_rng(seed + 1).standard_normal(y.shape)
    (y * mdl.tensor(w)).sum().backward()
    np.testing.assert_array_equal(t.grad.numpy(), np.moveaxis(w, destination, source))


@FEW
@given(shape=shapes, seed=seeds, data=st.data())
def test_split_pieces_join_back_and_unused_pieces_get_zero_gradient(shape, seed, data):
    x = np.random.default_rng(seed).standard_normal(shape)
    dim = data.draw(st.integers(-len(shape), len(shape) - 1), label="dim")
    size = data.draw(st.integers(1, 5), label="size")
    t = leaf(x)
    pieces = t.split(size, dim)
    assert len(pieces) == -(-shape[dim] // size)
    assert all(p.shape[dim] == size for p in pieces[:-1]) and 1 <= pieces[-1].shape[dim] <= size
    np.testing.assert_array_equal(mdl.concatenate(pieces, dim=dim).numpy(), x)
    (pieces[0] * 3.0).sum().backward()  # only the first piece is used
    expected = np.zeros_like(x)
    np.moveaxis(expected, dim, 0)[:size] = 3.0
    np.testing.assert_array_equal(t.grad.numpy(), expected)


@FEW
@given(shape=shapes, seed=seeds, data=st.data())
def test_repeat_gradient_sums_the_copies(shape, seed, data):
    x = np.random.default_rng(seed).standard_normal(shape)
    sizes = tuple(data.draw(st.lists(st.integers(0, 3), min_size=len(shape), max_size=len(shape) + 2),
                            label="sizes"))
    t = leaf(x)
    y = t.repeat(sizes)
    np.testing.assert_array_equal(y.numpy(), np.tile(x, sizes))
    w = np.random.default_rng(seed + 1).standard_normal(y.shape)
    (y * mdl.tensor(w)).sum().backward()
    # dL/dx[i] = Σ of w over every place that copies x[i]: place j copies x[j mod n]
    expected = np.zeros(x.size)
    np.add.at(expected, np.tile(np.arange(x.size).reshape(shape), sizes).reshape(-1), w.reshape(-1))
    np.testing.assert_allclose(t.grad.numpy(), expected.reshape(shape), rtol=1e-12, atol=1e-12)


@FEW
@given(n=st.integers(1, 9), size=st.integers(0, 9), step=st.integers(1, 4), seed=seeds)
def test_unfold_gradient_counts_each_window_an_element_is_in(n, size, step, seed):
    size = min(size, n)
    x = np.random.default_rng(seed).standard_normal((2, n))
    t = leaf(x)
    y = t.unfold(1, size, step)
    np.testing.assert_array_equal(y.numpy(), windows(x, 1, size, step))
    y.sum().backward()
    starts = np.arange(0, n - size + 1, step)
    counts = np.array([((starts <= i) & (i < starts + size)).sum() for i in range(n)], dtype=float)
    np.testing.assert_array_equal(t.grad.numpy(), np.broadcast_to(counts, (2, n)))


@pytest.mark.parametrize("call", [lambda t: t.split(2), lambda t: t.split(0), lambda t: t.split([0, 0]),
                                  lambda t: t.chunk(3), lambda t: t.split(2, dim=1)])
def test_split_and_chunk_of_an_empty_dim_give_pytorchs_pieces(call):
    torch = pytest.importorskip("torch")
    pieces, expected = call(mdl.zeros(0, 2)), call(torch.zeros(0, 2))
    assert [p.shape for p in pieces] == [tuple(e.shape) for e in expected]


def test_repeat_interleave_counts_sum_the_gradient_of_each_elements_copies():
    t = leaf([1.0, 2.0, 3.0])
    y = t.repeat_interleave([2, 0, 3])
    np.testing.assert_array_equal(y.numpy(), [1, 1, 3, 3, 3])
    y.backward(grad=np.array([1.0, 10.0, 100.0, 1000.0, 10000.0]))
    np.testing.assert_array_equal(t.grad.numpy(), [11.0, 0.0, 11100.0])


def test_tril_keeps_infinities_and_zeros_the_rest():
    x = mdl.tensor(np.full((2, 2), np.inf))
    np.testing.assert_array_equal(x.tril().numpy(), [[np.inf, 0.0], [np.inf, np.inf]])
    np.testing.assert_array_equal(x.triu(1).numpy(), [[0.0, np.inf], [0.0, 0.0]])


def test_integer_tensors_keep_their_dtype():
    x = mdl.arange(12).reshape(3, 4)
    for y in [x.flatten(), x.permute(1, 0), x.flip(0), x.roll(1, 0), x.repeat(2, 1), x.repeat_interleave(2, 0),
              x.tril(), x.diagonal(), x.unfold(1, 2, 1), x.unsqueeze(0).squeeze(0), x.expand(2, 3, 4)]:
        assert y.dtype == np.int64
    np.testing.assert_array_equal(x.tril().numpy(), np.tril(np.arange(12).reshape(3, 4)))


# ---------------------------------------------------------------- the PyTorch spelling gives PyTorch's number
def test_flatten_defaults_to_every_dim_and_nn_flatten_keeps_the_batch():
    x = mdl.zeros(2, 3, 4)
    assert x.flatten().shape == (24,) and F.flatten(x).shape == (24,)
    assert nn.Flatten()(x).shape == (2, 12)
    assert mdl.tensor(5.0).flatten().shape == (1,)
    torch = pytest.importorskip("torch")
    assert tuple(torch.zeros(2, 3, 4).flatten().shape) == x.flatten().shape
    assert tuple(torch.nn.Flatten()(torch.zeros(2, 3, 4)).shape) == nn.Flatten()(x).shape


def test_transpose_of_two_dims_swaps_them_on_a_matrix():
    m = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(mdl.tensor(m).transpose(0, 1).numpy(), m.T)
    np.testing.assert_array_equal(mdl.tensor(m).transpose(1, 0).numpy(), m.T)


def test_nn_unflatten_inverts_nn_flatten():
    x = leaf(np.random.default_rng(4).standard_normal((2, 3, 4)))
    layer = nn.Unflatten(1, (3, 4))
    y = layer(nn.Flatten()(x))
    assert y.shape == (2, 3, 4)
    np.testing.assert_array_equal(y.numpy(), x.numpy())
    assert nn.Unflatten(-1, (2, -1))(x).shape == (2, 3, 2, 2)
    assert "unflattened_size=(3, 4)" in repr(layer) and not list(layer.parameters())
    torch = pytest.importorskip("torch")
    assert tuple(torch.nn.Unflatten(-1, (2, -1))(torch.zeros(2, 3, 4)).shape) == (2, 3, 2, 2)


# ---------------------------------------------------------------- clear errors
@pytest.mark.parametrize("call, error, words", [
    (lambda x: x.flatten(2, 1), ValueError, "flatten: start_dim 2 comes after end_dim 1"),
    (lambda x: x.flatten(3), ValueError, r"flatten: dim 3 is out of range.*\(2, 3, 4\)"),
    (lambda x: x.unflatten(1, (2, 2)), ValueError, r"unflatten: sizes \(2, 2\).*size 3"),
    (lambda x: x.unflatten(1, (-1, -1)), ValueError, "at most one -1"),
    (lambda x: x.squeeze(3), ValueError, "squeeze: dim 3 is out of range"),
    (lambda x: x.unsqueeze(4), ValueError, r"unsqueeze: dim 4.*from -4 to 3"),
    (lambda x: x.permute(0, 1), ValueError, r"permute: axes \(0, 1\) name 2 axes"),
    (lambda x: x.permute(0, 1, 1), ValueError, "permute.*repeat an axis"),
    (lambda x: x.movedim((0, 1), 2), ValueError, "movedim: source .* as many dims"),
    (lambda x: x.movedim((0, 0), (1, 2)), ValueError, "movedim.*repeats a dim"),
    (lambda x: x.expand(2, 5, 4), ValueError, r"expand: cannot expand a tensor of shape \(2, 3, 4\)"),
    (lambda x: x.expand(3, 4), ValueError, "expand: sizes .* fewer dims"),
    (lambda x: x.expand(-1, 2, 3, 4), ValueError, "expand"),
    (lambda x: x.split([1, 1], 1), ValueError, r"split: sizes \(1, 1\) .* add up to 3"),
    (lambda x: x.split(0, 1), ValueError, "split: split_size must be positive"),
    (lambda x: x.chunk(0), ValueError, "chunk: chunks must be positive"),
    (lambda x: mdl.tensor(1.0).split(1), ValueError, "split: a 0-d tensor has no dim"),
    (lambda x: x.narrow(2, 3, 2), ValueError, "narrow: start 3 and length 2 do not fit in dim 2 of size 4"),
    (lambda x: x.narrow(2, -5, 1), ValueError, "narrow"),
    (lambda x: x.flip(0, 0), ValueError, "flip: dims .* twice"),
    (lambda x: x.roll((1, 2)), ValueError, "roll: without dims, shifts must be one int"),
    (lambda x: x.roll((1, 2), 0), ValueError, "roll: shifts .* same length"),
    (lambda x: x.repeat(2, 2), ValueError, r"repeat: sizes \(2, 2\) .* at least as many dims"),
    (lambda x: x.repeat(1, -1, 1), ValueError, "repeat: sizes .* non-negative"),
    (lambda x: x.repeat_interleave([1, 2], dim=1), ValueError, "repeat_interleave: repeats must be an int or 3"),
    (lambda x: x.repeat_interleave(-1), ValueError, "repeat_interleave: repeats must be non-negative"),
    (lambda x: x.repeat_interleave(1.5), ValueError, "repeat_interleave"),
    (lambda x: x[0, 0].tril(), ValueError, r"tril: needs a tensor with at least 2 dims.*\(4,\)"),
    (lambda x: x.diagonal(0, 1, -2), ValueError, "diagonal: dim1 1 and dim2 -2 must be two different dims"),
    (lambda x: x.unfold(1, 4, 1), ValueError, "unfold: size 4 must be from 0 to the size 3 of dim 1"),
    (lambda x: x.unfold(1, 2, 0), ValueError, "unfold: .* step 0 positive"),
    (lambda x: mdl.tensor(1.0).unfold(0, 1, 1), ValueError, "unfold: a 0-d tensor"),
    (lambda x: x.permute(0, 1.0, 2), TypeError, "permute: axes must be integers"),
    (lambda x: x.unsqueeze(1.0), TypeError, "unsqueeze: dim must be an integer"),
    (lambda x: x.transpose(0, dim1=1), TypeError, "transpose: pass two dims"),
    (lambda x: x.flip(), TypeError, "flip: name the dims once"),
    (lambda x: x.flip(0, dims=(1,)), TypeError, "flip: name the dims once"),
    (lambda x: x.permute(0, 1, 2, dims=(0, 1, 2)), TypeError, "permute: name the dims once"),
])
def test_bad_arguments_name_the_op_and_what_it_expected(call, error, words):
    with pytest.raises(error, match=words):
        call(mdl.zeros(2, 3, 4))


# ---------------------------------------------------------------- dtypes and devices
DEVICE_OPS = {
    "flatten": lambda a: a.flatten(), "unflatten": lambda a: a.unflatten(1, (3, 1)),
    "squeeze": lambda a: a[None].squeeze(0), "unsqueeze": lambda a: a.unsqueeze(1),
    "permute": lambda a: a.permute(1, 0), "movedim": lambda a: a.movedim(0, 1),
    "expand": lambda a: a[:, None].expand(2, 3, 3), "cat": lambda a: F.cat([a, a * 2], 1),
    "split": lambda a: a.split([2, 1], 1)[1], "chunk": lambda a: a.chunk(2, 1)[0],
    "narrow": lambda a: a.narrow(1, 1, 2), "flip": lambda a: a.flip(1), "roll": lambda a: a.roll(1, 1),
    "repeat": lambda a: a.repeat(2, 2), "repeat_interleave": lambda a: a.repeat_interleave(2, 1),
    "repeat_interleave_counts": lambda a: a.repeat_interleave([3, 0, 1], 1), "tril": lambda a: a.tril(),
    "triu": lambda a: a.triu(1), "diagonal": lambda a: a.diagonal(), "unfold": lambda a: a.unfold(1, 2, 1),
}


@pytest.mark.parametrize("name", DEVICE_OPS)
def test_float32_stays_float32(name):
    x = mdl.tensor([[0.25, 1.0, 2.0], [-1.0, 0.75, 3.0]], requires_grad=True)
    y = DEVICE_OPS[name](x)
    assert y.dtype == np.float32
    y.sum().backward()
    assert x.grad.dtype == np.float32 and x.grad.shape == x.shape


@pytest.mark.parametrize("name", DEVICE_OPS)
def test_forward_and_backward_on_device(device, name):
    x = np.random.default_rng(0).standard_normal((2, 3))
    check_device_against_cpu(DEVICE_OPS[name], x, device, exact=True, seed=1)
