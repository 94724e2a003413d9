"""Analytic FLOP and byte counts against hand counts, NumPy's own FLOP count, and real arrays' sizes."""
import math
import re

import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from minidl.roofline import opcosts
from minidl.roofline.opcosts import Cost


def naive_flops(subscripts, *arrays):
    """NumPy's count of the FLOPs of an einsum done naively (2 per multiply-add)."""
    report = np.einsum_path(subscripts, *arrays, optimize="greedy")[1]
    return float(re.search(r"Naive FLOP count:\s*([0-9.e+]+)", report).group(1))


def nbytes(*arrays):
    return sum(a.nbytes for a in arrays)


def test_cost_intensity_and_sum():
    c = Cost(10, 40) + Cost(6, 24)
    assert (c.flops, c.bytes) == (16, 64)
    assert c.intensity == 0.25
    assert Cost(0, 8).intensity == 0
    assert math.isnan(Cost(0, 0).intensity) and not Cost(0, 0).work and Cost(0, 8).work


def test_add_and_sum_backward_hand_on_dy_without_copying():
    """Why their backward costs nothing: the engine passes dy itself (add) or a view of it (sum)."""
    a, b = mdl.randn(3, 4, requires_grad=True), mdl.randn(3, 4, requires_grad=True)
    dy = mdl.randn(3, 4)
    da, db = mdl.grad(a + b, [a, b], grad_outputs=dy)
    assert da.array is dy.array and db.array is dy.array
    x = mdl.randn(3, 4, requires_grad=True)
    g = mdl.randn(3)
    (dx,) = mdl.grad(x.sum(axis=-1), [x], grad_outputs=g)
    assert np.shares_memory(dx.array, g.array)


@pytest.mark.parametrize("n,k,m", [(2, 3, 4), (5, 1, 7), (16, 32, 8)])
def test_matmul_counts(n, k, m):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, k), dtype=np.float32)
    b = rng.standard_normal((k, m), dtype=np.float32)
    c = a @ b
    cost = opcosts.matmul(n, k, m)
    assert cost.forward.flops == naive_flops("ij,jk->ik", a, b)
    assert cost.forward.bytes == nbytes(a, b, c)
    g = np.ones_like(c)
    da, db = g @ b.T, a.T @ g
    assert cost.backward.flops == naive_flops("ik,jk->ij", g, b) + naive_flops("ij,ik->jk", a, g)
    assert cost.backward.bytes == nbytes(g, a, b, da, db)


def test_matmul_hand_count():
    cost = opcosts.matmul(2, 3, 4)  # 8 outputs, each 3 multiplies and 3 adds
    assert cost.forward == Cost(48, (6 + 12 + 8) * 4)
    assert cost.backward.flops == 96


def test_linear_counts_against_the_arrays():
    batch, fan_in, fan_out = 3, 5, 4
    x = mdl.randn(batch, fan_in, requires_grad=True)
    w = mdl.randn(fan_out, fan_in, requires_grad=True)
    b = mdl.randn(fan_out, requires_grad=True)
    y = F.linear(x, w, b)
    y.backward(mdl.ones(batch, fan_out))
    cost = opcosts.linear(batch, fan_in, fan_out)
    assert cost.forward.flops == 2 * batch * fan_in * fan_out + batch * fan_out
    assert cost.forward.bytes == nbytes(x.array, w.array, b.array, y.array)
    assert cost.backward.flops == 4 * batch * fan_in * fan_out + batch * fan_out
    assert cost.backward.bytes == nbytes(y.array, x.array, w.array, x.grad.array, w.grad.array, b.grad.array)
    first_layer = opcosts.linear(batch, fan_in, fan_out, input_grad=False)
    assert first_layer.backward.flops == 2 * batch * fan_in * fan_out + batch * fan_out
    assert first_layer.backward.bytes == cost.backward.bytes - x.array.nbytes
    no_bias = opcosts.linear(batch, fan_in, fan_out, bias=False)
    assert no_bias.forward == opcosts.matmul(batch, fan_in, fan_out).forward


@pytest.mark.parametrize("batch", [1, 4, 16])
def test_linear_intensity_is_about_the_batch(batch):
    """N×M weights by M×B inputs: 2NMB FLOPs over ≈ NM values, so ≈ B FLOP/byte with 2-byte values."""
    half = opcosts.linear(batch, 8192, 8192, bias=False, itemsize=2).forward.intensity
    single = opcosts.linear(batch, 8192, 8192, bias=False).forward.intensity
    assert half == pytest.approx(batch, rel=0.01)
    assert single == pytest.approx(batch / 2, rel=0.01)


def test_linear_intensity_saturates_for_large_batches():
    n = 1024
    big = opcosts.linear(1 << 20, n, n, bias=False).forward.intensity
    assert big == pytest.approx(2 * n * n / (4 * 2 * n), rel=0.01)  # 2NM / (4 (N + M)) when B ≫ N, M


def test_elementwise_hand_counts():
    assert opcosts.add(10) == opcosts.OpCost(Cost(10, 120), Cost(0, 0))  # dy is handed on as it is
    assert opcosts.mul((2, 5)) == opcosts.OpCost(Cost(10, 120), Cost(20, 200))
    assert opcosts.relu(10) == opcosts.OpCost(Cost(10, 80), Cost(10, 120))
    assert opcosts.exp(10, itemsize=8) == opcosts.OpCost(Cost(10, 160), Cost(10, 240))


def test_reduction_hand_counts():
    assert opcosts.sum_rows(2, 3) == opcosts.OpCost(Cost(4, 32), Cost(0, 0))  # 2 adds per row; dx is a view
    assert opcosts.softmax(2, 3) == opcosts.OpCost(Cost(30, 48), Cost(24, 72))
    assert opcosts.log_softmax(2, 3) == opcosts.OpCost(Cost(32, 48), Cost(24, 72))


def test_reduction_bytes_match_the_arrays():
    x = mdl.randn(4, 6, requires_grad=True)
    y = F.softmax(x, axis=-1)
    y.backward(mdl.ones(4, 6))
    assert opcosts.softmax(4, 6).forward.bytes == nbytes(x.array, y.array)
    assert opcosts.softmax(4, 6).backward.bytes == nbytes(y.array, y.array, x.grad.array)  # dy, y, dx


@pytest.mark.parametrize("stride,padding", [(1, 0), (1, 1), (2, 1)])
def test_conv2d_counts(stride, padding):
    n, c, h, w, o, k = 2, 3, 7, 6, 4, 3
    x = mdl.randn(n, c, h, w)
    weight = mdl.randn(o, c, k, k)
    bias = mdl.randn(o)
    y = F.conv2d(x, weight, bias, stride=stride, padding=padding)
    _, _, oh, ow = y.shape
    macs_flops = 2 * y.array.size * c * k * k  # every output is a dot product of length C·KH·KW
    windows = np.ones((n, c, oh, ow, k, k), np.float32)
    assert naive_flops("ncijpq,ocpq->noij", windows, weight.numpy()) == pytest.approx(macs_flops, rel=1e-3)
    cost = opcosts.conv2d(n, c, h, w, o, k, stride=stride, padding=padding)
    assert cost.forward.flops == macs_flops + y.array.size
    assert cost.forward.bytes == nbytes(x.array, weight.array, bias.array, y.array)
    assert cost.backward.flops == 2 * macs_flops + y.array.size
    assert cost.backward.bytes == nbytes(y.array, x.array, weight.array, x.array, weight.array, bias.array)


def test_normalization_hand_counts():
    ln = opcosts.layer_norm(2, 3)
    assert ln.forward == Cost(7 * 6 + 4 * 2, (12 + 6) * 4)
    assert ln.backward == Cost(13 * 6 + 2 * 2, (18 + 9) * 4)
    bn = opcosts.batch_norm(2, 3, 4, 5)  # 120 values, 3 channels
    assert bn.forward == Cost(7 * 120 + 4 * 3, (240 + 6) * 4)
    assert bn.backward == Cost(13 * 120 + 2 * 3, (360 + 9) * 4)


def test_optimizer_hand_counts():
    assert opcosts.sgd_step(10) == Cost(20, 120)
    assert opcosts.sgd_step(10, momentum=True) == Cost(40, 200)
    assert opcosts.adam_step(10) == Cost(140, 280)
    assert opcosts.adam_step(10).intensity == 0.5


def test_every_op_is_memory_bound_but_big_products():
    """The lesson in numbers: at a balance of ~10 FLOP/byte only the products clear it."""
    balance = 10
    memory_bound = [opcosts.add(1 << 20).forward, opcosts.relu(1 << 20).forward, opcosts.softmax(1024, 1024).forward,
                    opcosts.layer_norm(1024, 1024).forward, opcosts.adam_step(1 << 20),
                    opcosts.linear(1, 1024, 1024).forward]
    assert all(c.intensity < balance for c in memory_bound)
    assert opcosts.matmul(1024, 1024, 1024).forward.intensity > balance
    assert opcosts.linear(256, 1024, 1024).forward.intensity > balance
    assert math.isinf(Cost(5, 0).intensity)
