"""Assignment 2's checks: each op's gradient against a NumPy formula, on public and hidden cases.

The expected gradients are computed here from the textbook formulas in
float64 NumPy, never through minidl's own backward; the student's gradients
come from a real backward walk through the op (``y.backward(dy)``), so a
check sees what training would see. Each check also keeps a copy of the
arrays the backward receives and verifies that none was written into.
"""
from __future__ import annotations

import numpy as np

import minidl
import minidl.functional as F
from minidl.ops import conv as conv_ops
from minidl.ops import norm as norm_ops
from minidl.ops import shape as shape_ops

from .core import again, check, compare, equal, unchanged


def _dtype(case):
    return np.dtype(case.get("dtype", "float64"))


def _draw(case, shape, positive=False):
    x = case.rng.standard_normal(shape)
    return (np.abs(x) + 0.5 if positive else x).astype(_dtype(case))


def _leaf(array):
    return minidl.tensor(array, requires_grad=True)


def _shapes(p, *names):
    return " ".join(f"{n} {tuple(p[n])}" for n in names) + f", {p.get('dtype', 'float64')}"


def sum_to_numpy(x, shape):
    """x summed over the axes broadcasting added (leading) or stretched (size 1 in ``shape``)."""
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and x.shape[lead + i] != 1)
    return x.sum(axis=axes, keepdims=True).reshape(shape)


# ---------------------------------------------------------------- 2.1 sum_to
def _sum_to_hidden(rng):
    cases = []
    for index in range(6):
        ndim = int(rng.integers(2, 5))
        shape = tuple(int(n) for n in rng.integers(2, 5, ndim))
        keep = int(rng.integers(0, ndim - 1)) if index % 3 else ndim - 1  # how many trailing axes stay
        target = list(shape[ndim - keep:]) if keep else []
        for i in range(len(target)):
            if rng.random() < 0.5:
                target[i] = 1
        if tuple(target) == shape:
            target[0] = 1
        cases.append(dict(x=shape, to=tuple(target), dtype="float32" if index % 2 else "float64"))
    return cases


@check("a2.sum_to", public=[dict(x=(2, 3), to=(3,)), dict(x=(4, 3), to=(1, 3)), dict(x=(2, 3, 4), to=(3, 1))],
       hidden=_sum_to_hidden, hidden_count=6, label=lambda p: f"x {p['x']} to {p['to']}, {p.get('dtype', 'float64')}")
def sum_to(case):
    x = _draw(case, case["x"])
    target = tuple(case["to"])
    expected = sum_to_numpy(x.astype(np.float64), target)
    mistakes = {"averaged, not summed": lambda: expected * np.prod(target or (1,)) / x.size}
    compare(f"sum_to(x, {target})", expected, shape_ops.sum_to(minidl.tensor(x), target), x.dtype, mistakes)
    # the same sum inside a backward: b broadcast in a + b gets dy summed back to its own shape
    a, b = _leaf(np.zeros(case["x"], x.dtype)), _leaf(np.zeros(target, x.dtype))
    g = minidl.tensor(_draw(case, case["x"]))
    kept = g.numpy().copy()
    (a + b).backward(g)
    expected_b = sum_to_numpy(kept.astype(np.float64), target)
    compare(f"the gradient of b {target} in a {case['x']} + b", expected_b, b.grad, x.dtype,
            {"averaged, not summed": lambda: expected_b * np.prod(target or (1,)) / kept.size})
    unchanged("the incoming gradient dy", kept, g)


# ---------------------------------------------------------------- 2.2 matmul
def _matmul_numpy(a, b, g):
    """(da, db) for y = a @ b with NumPy's rules (vectors promoted, batches broadcast and summed back)."""
    a2 = a.reshape(1, -1) if a.ndim == 1 else a
    b2 = b.reshape(-1, 1) if b.ndim == 1 else b
    batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    g2 = g.reshape(batch + (a2.shape[-2], b2.shape[-1]))
    da = sum_to_numpy(g2 @ np.swapaxes(b2, -1, -2), a2.shape).reshape(a.shape)
    db = sum_to_numpy(np.swapaxes(a2, -1, -2) @ g2, b2.shape).reshape(b.shape)
    return da, db, a2, b2, g2


def _matmul_hidden(rng):
    n = int(rng.integers(2, 5))
    return [dict(a=(2, 3, 4), b=(4, 5), dtype="float32"), dict(a=(3, 4), b=(2, 4, 2), dtype="float64"),
            dict(a=(2, 1, 3, 4), b=(3, 4, 2), dtype="float64"), dict(a=(n, n), b=(n, n), dtype="float64"),
            dict(a=(2, n, n), b=(n, n), dtype="float32"), dict(a=(4,), b=(4,), dtype="float64"),
            dict(a=(2, 3, 4), b=(4,), dtype="float32")]


@check("a2.matmul", public=[dict(a=(3, 4), b=(4, 5)), dict(a=(4,), b=(4, 3)), dict(a=(2, 3), b=(3,))],
       hidden=_matmul_hidden, hidden_count=7, label=lambda p: _shapes(p, "a", "b"))
def matmul(case):
    a, b = _draw(case, case["a"]), _draw(case, case["b"])
    y_shape = np.matmul(a, b).shape
    g = _draw(case, y_shape)
    gt = minidl.tensor(g)
    ta, tb = _leaf(a), _leaf(b)
    (ta @ tb).backward(gt)
    da, db, a2, b2, g2 = _matmul_numpy(a.astype(np.float64), b.astype(np.float64), g.astype(np.float64))
    compare("the gradient of a", da, ta.grad, a.dtype,
            {"transposed operand": lambda: sum_to_numpy(g2 @ b2, a2.shape).reshape(a.shape)})
    compare("the gradient of b", db, tb.grad, b.dtype,
            {"transposed operand": lambda: sum_to_numpy(a2 @ g2, b2.shape).reshape(b.shape)})
    unchanged("the incoming gradient dy", g, gt)


# ---------------------------------------------------------------- 2.3 softmax and cross-entropy
def _softmax_numpy(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@check("a2.softmax", public=[dict(x=(3, 5), axis=-1)],
       hidden=lambda rng: [dict(x=(4, 6), axis=0, dtype="float64"), dict(x=(2, 3, 4), axis=1, dtype="float32"),
                           dict(x=(5, 5), axis=-1, dtype="float32")],
       hidden_count=3, label=lambda p: f"x {p['x']}, axis {p['axis']}, {p.get('dtype', 'float64')}")
def softmax(case):
    x, axis = _draw(case, case["x"]), case["axis"]
    g = _draw(case, case["x"])
    gt = minidl.tensor(g)
    tx = _leaf(x)
    y = F.softmax(tx, dim=axis)
    y_kept = y.numpy().copy()
    y.backward(gt)
    p, g64 = _softmax_numpy(x.astype(np.float64), axis), g.astype(np.float64)
    other = 0 if axis % x.ndim else -1
    compare(f"the gradient of x (softmax over axis {axis})", p * (g64 - (g64 * p).sum(axis, keepdims=True)), tx.grad,
            x.dtype, {"missing term": lambda: p * g64,
                      "wrong axis": lambda: p * (g64 - (g64 * p).sum(other, keepdims=True))})
    unchanged("the incoming gradient dy", g, gt)
    unchanged("softmax's output y (kept for the backward)", y_kept, y)


def _cross_entropy_hidden(rng):
    c = int(rng.integers(3, 6))
    return [dict(n=4, c=c, reduction="mean", dtype="float32"), dict(n=3, c=c, reduction="sum"),
            dict(n=4, c=c, reduction="mean", weight=True), dict(n=4, c=c, reduction="mean", smoothing=0.1),
            dict(n=c, c=c, reduction="none", dtype="float32")]


@check("a2.cross_entropy", public=[dict(n=4, c=3, reduction="mean")], hidden=_cross_entropy_hidden, hidden_count=5,
       label=lambda p: f"{p['n']} samples of {p['c']} classes, reduction={p['reduction']}"
                       + (", class weights" if p.get("weight") else "")
                       + (f", label smoothing {p['smoothing']}" if p.get("smoothing") else "")
                       + f", {p.get('dtype', 'float64')}")
def cross_entropy(case):
    n, c, eps = case["n"], case["c"], case.get("smoothing", 0.0)
    x = _draw(case, (n, c))
    targets = case.rng.integers(0, c, n)
    weight = (case.rng.random(c) + 0.5).astype(x.dtype) if case.get("weight") else None
    tx = _leaf(x)
    loss = F.cross_entropy(tx, minidl.tensor(targets), weight=None if weight is None else minidl.tensor(weight),
                           reduction=case["reduction"], label_smoothing=eps)
    upstream = _draw(case, (n,)) if case["reduction"] == "none" else np.array(1.0, x.dtype)
    loss.backward(minidl.tensor(upstream), retain_graph=True)
    w = np.ones(c) if weight is None else weight.astype(np.float64)
    coefficients = (1 - eps) * np.eye(c)[targets] * w[targets][:, None] + eps / c * w[None, :]
    totals = coefficients.sum(axis=1, keepdims=True)
    p = _softmax_numpy(x.astype(np.float64), 1)
    if case["reduction"] == "none":
        gy = upstream.astype(np.float64)[:, None]
    else:
        gy = np.full((n, 1), 1.0 / (w[targets].sum() if case["reduction"] == "mean" else 1.0))
    expected = gy * (p * totals - coefficients)
    compare("the gradient of the logits", expected, tx.grad, x.dtype, {
        "missing scale": lambda: p * totals - coefficients,
        "missing term": lambda: gy * (p - coefficients),
        "wrong axis": lambda: gy.reshape(1, -1) * (p * totals - coefficients)})
    loss.backward(minidl.tensor(upstream))  # a second backward through the same graph adds the same gradient
    again("the gradient of the logits after a second backward (twice the first)", 2 * expected, tx.grad, x.dtype)


# ---------------------------------------------------------------- 2.4 conv2d: the output size and col2im
def _output_size_hidden(rng):
    out = []
    for index in range(6):  # every stride from 1 to 3 and both dilations, other values drawn
        k, s, d = int(rng.integers(2, 5)), 1 + index % 3, 1 + index % 2
        p = int(rng.integers(0, 3))
        size = d * (k - 1) + 1 + int(rng.integers(0, 9)) - 2 * p
        out.append(dict(size=max(size, d * (k - 1) + 1), kernel=k, stride=s, padding=p, dilation=d))
    return out


@check("a2.output_size",
       public=[dict(size=5, kernel=3, stride=1, padding=0, dilation=1), dict(size=7, kernel=3, stride=2, padding=1,
                                                                              dilation=1)],
       hidden=_output_size_hidden, hidden_count=6,
       label=lambda p: f"size {p['size']}, kernel {p['kernel']}, stride {p['stride']}, padding {p['padding']}, "
                       f"dilation {p['dilation']}")
def output_size(case):
    size, k, s, p, d = (case[key] for key in ("size", "kernel", "stride", "padding", "dilation"))
    expected = (size + 2 * p - d * (k - 1) - 1) // s + 1
    got = conv_ops.output_size(size, k, s, p, d)
    equal("the number of window positions", expected, got,
          {"stride off by one": lambda: got if abs(got - expected) == 1 else None,
           "dilation ignored": lambda: (size + 2 * p - k) // s + 1})


def _col2im_numpy(cols, in_shape, kernel, stride, padding, dilation, overwrite=False):
    """Every window's entries added back where im2col read them (``overwrite``: the last write wins)."""
    n, c, h, w = in_shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
    image = np.zeros((n, c, h + 2 * ph, w + 2 * pw))
    oh, ow = cols.shape[1:3]
    for p in range(kh):
        for q in range(kw):
            rows = slice(p * dh, p * dh + sh * (oh - 1) + 1, sh)
            columns = slice(q * dw, q * dw + sw * (ow - 1) + 1, sw)
            block = np.moveaxis(cols[:, :, :, p, q, :], -1, 1)
            if overwrite:
                image[:, :, rows, columns] = block
            else:
                image[:, :, rows, columns] += block
    return image[:, :, ph:ph + h, pw:pw + w]


def _col2im_hidden(rng):
    return [dict(x=(2, 3, 7, 6), kernel=(3, 2), stride=(2, 2), padding=(1, 0), dilation=(1, 1), dtype="float32"),
            dict(x=(1, 2, 9, 9), kernel=(3, 3), stride=(2, 3), padding=(1, 1), dilation=(2, 1)),
            dict(x=(2, 1, 6, 6), kernel=(2, 2), stride=(1, 1), padding=(0, 0), dilation=(2, 2), dtype="float32"),
            dict(x=(1, 2, 8, 5), kernel=(3, 3), stride=(3, 2), padding=(2, 1), dilation=(1, 1), conv=True)]


@check("a2.col2im",
       public=[dict(x=(1, 1, 4, 4), kernel=(2, 2), stride=(2, 2), padding=(0, 0), dilation=(1, 1)),
               dict(x=(2, 2, 5, 5), kernel=(3, 3), stride=(1, 1), padding=(1, 1), dilation=(1, 1)),
               dict(x=(1, 3, 6, 6), kernel=(3, 3), stride=(2, 2), padding=(1, 1), dilation=(1, 1), conv=True)],
       hidden=_col2im_hidden, hidden_count=4,
       label=lambda p: (f"conv2d of x {p['x']}" if p.get("conv") else f"col2im to {p['x']}")
                       + f", kernel {p['kernel']}, stride {p['stride']}, padding {p['padding']}, dilation "
                       f"{p['dilation']}, {p.get('dtype', 'float64')}")
def col2im(case):
    shape, kernel, stride, padding, dilation = (tuple(case[k]) for k in ("x", "kernel", "stride", "padding",
                                                                          "dilation"))
    n, c, h, w = shape
    oh = (h + 2 * padding[0] - dilation[0] * (kernel[0] - 1) - 1) // stride[0] + 1
    ow = (w + 2 * padding[1] - dilation[1] * (kernel[1] - 1) - 1) // stride[1] + 1
    if case.get("conv"):  # the whole strided convolution: its input gradient runs through col2im
        x, weight = _draw(case, shape), _draw(case, (2, c) + kernel)
        tx = _leaf(x)
        y = F.conv2d(tx, minidl.tensor(weight), stride=stride, padding=padding, dilation=dilation)
        g = _draw(case, y.shape)
        y.backward(minidl.tensor(g))
        # y[n,o,i,j] = Σ W[o,c,p,q] x_pad[n,c,i·s+p·d,j·s+q·d]: dx is the windows' gradients added back
        windows = np.einsum("noij,ocpq->nijpqc", g.astype(np.float64), weight.astype(np.float64))
        expected = _col2im_numpy(windows, shape, kernel, stride, padding, dilation)
        compare("the gradient of conv2d's input x", expected, tx.grad, x.dtype, {
            "gradient overwritten, not accumulated":
                lambda: _col2im_numpy(windows, shape, kernel, stride, padding, dilation, overwrite=True),
            "stride ignored": lambda: _col2im_numpy(windows, shape, kernel, (1, 1), padding, dilation)})
        return
    cols = _draw(case, (n, oh, ow) + kernel + (c,))
    kept = cols.copy()
    got = conv_ops.col2im_array(cols, shape, kernel, stride, padding, dilation)
    cols64 = cols.astype(np.float64)
    compare(f"col2im of windows {cols.shape} into {shape}", _col2im_numpy(cols64, shape, kernel, stride, padding,
                                                                          dilation), got, cols.dtype, {
        "gradient overwritten, not accumulated":
            lambda: _col2im_numpy(cols64, shape, kernel, stride, padding, dilation, overwrite=True),
        "stride ignored": lambda: _col2im_numpy(cols64, shape, kernel, (1, 1), padding, dilation),
        "dilation ignored": lambda: _col2im_numpy(cols64, shape, kernel, stride, padding, (1, 1))})
    unchanged("the windows (col2im's input)", kept, cols)


# ---------------------------------------------------------------- 2.5 layer normalization
def _normalize_numpy(x, g, axes, eps):
    mean = x.mean(axis=axes, keepdims=True)
    s = 1 / np.sqrt(((x - mean) ** 2).mean(axis=axes, keepdims=True) + eps)
    x_hat = (x - mean) * s
    return x_hat, s


@check("a2.normalize", public=[dict(x=(4, 6), axes=(1,))],
       hidden=lambda rng: [dict(x=(2, 3, 4), axes=(1, 2), dtype="float32"), dict(x=(3, 2, 2, 2), axes=(0, 2, 3)),
                           dict(x=(5, 4), axes=(1,), affine=True, dtype="float32")],
       hidden_count=3, label=lambda p: f"x {p['x']} normalized over axes {p['axes']}"
                                       + (" with a weight and bias (F.layer_norm)" if p.get("affine") else "")
                                       + f", {p.get('dtype', 'float64')}")
def normalize(case):
    x, axes, eps = _draw(case, case["x"]), tuple(case["axes"]), 1e-5
    tx = _leaf(x)
    g = _draw(case, case["x"])
    gt = minidl.tensor(g)
    x64, g64 = x.astype(np.float64), g.astype(np.float64)
    if case.get("affine"):
        weight, bias = _draw(case, x.shape[-1:]), _draw(case, x.shape[-1:])
        y = F.layer_norm(tx, x.shape[-1:], minidl.tensor(weight), minidl.tensor(bias), eps=eps)
        g64 = g64 * weight.astype(np.float64)  # what reaches the normalization through the affine map
    else:
        y = norm_ops.Normalize(axes, eps)(tx)
    y_kept = y.numpy().copy()
    y.backward(gt)
    x_hat, s = _normalize_numpy(x64, g64, axes, eps)
    n = np.prod([x.shape[a] for a in axes])

    def mean(a):
        return a.mean(axis=axes, keepdims=True)
    expected = s * (g64 - mean(g64) - x_hat * mean(g64 * x_hat))
    compare("the gradient of x", expected, tx.grad, x.dtype, [
        ("missing term", lambda: s * (g64 - x_hat * mean(g64 * x_hat))),
        ("missing term", lambda: s * (g64 - mean(g64))),
        ("missing scale", lambda: s * (g64 - n * mean(g64) - n * x_hat * mean(g64 * x_hat))),
        ("wrong axis", lambda: s * (g64 - g64.mean() - x_hat * (g64 * x_hat).mean()))])
    unchanged("the incoming gradient dy", g, gt)
    unchanged("the normalized output x̂ (kept for the backward)", y_kept, y)


# ---------------------------------------------------------------- 2.6 attention
def _attention_numpy(q, k, v, g, scale, mask=None, transpose_dz=True, softmax_sum=True):
    z = scale * q @ np.swapaxes(k, -1, -2)
    if mask is not None:
        z = np.where(mask, z, -np.inf)
    p = _softmax_numpy(z, -1)
    dv = sum_to_numpy(np.swapaxes(p, -1, -2) @ g, v.shape)
    dp = g @ np.swapaxes(v, -1, -2)
    dz = p * (dp - (dp * p).sum(-1, keepdims=True)) if softmax_sum else p * dp
    dq = sum_to_numpy(scale * dz @ k, q.shape)
    dk = sum_to_numpy(scale * (np.swapaxes(dz, -1, -2) if transpose_dz else dz) @ q, k.shape)
    return dq, dk, dv, p


@check("a2.attention", public=[dict(q=(1, 3, 4), k=(1, 3, 4))],
       hidden=lambda rng: [dict(q=(2, 3, 4), k=(2, 5, 4), dtype="float32"), dict(q=(2, 4, 3), k=(2, 4, 3), causal=True),
                           dict(q=(2, 2, 3, 4), k=(2, 1, 5, 4)), dict(q=(1, 4, 2), k=(1, 4, 2), dtype="float32")],
       hidden_count=4, label=lambda p: f"Q {p['q']}, K and V {p['k']}" + (", causal" if p.get("causal") else "")
                                       + f", {p.get('dtype', 'float64')}")
def attention(case):
    q, k, v = _draw(case, case["q"]), _draw(case, case["k"]), _draw(case, case["k"])
    scale = 1 / np.sqrt(q.shape[-1])
    tq, tk, tv = _leaf(q), _leaf(k), _leaf(v)
    y = F.scaled_dot_product_attention(tq, tk, tv, is_causal=bool(case.get("causal")), tiled=False)
    g = _draw(case, y.shape)
    gt = minidl.tensor(g)
    y.backward(gt)
    mask = np.tril(np.ones((q.shape[-2], k.shape[-2]), bool)) if case.get("causal") else None
    q64, k64, v64, g64 = (a.astype(np.float64) for a in (q, k, v, g))
    dq, dk, dv, p = _attention_numpy(q64, k64, v64, g64, scale, mask)
    no_sum = _attention_numpy(q64, k64, v64, g64, scale, mask, softmax_sum=False)
    compare("the gradient of V", dv, tv.grad, v.dtype,
            {"transposed operand": lambda: sum_to_numpy(p @ g64, v.shape)})
    compare("the gradient of Q", dq, tq.grad, q.dtype,
            {"missing scale": lambda: dq / scale, "missing term": lambda: no_sum[0]})
    compare("the gradient of K", dk, tk.grad, k.dtype, {
        "missing scale": lambda: dk / scale, "missing term": lambda: no_sum[1],
        "transposed operand": lambda: _attention_numpy(q64, k64, v64, g64, scale, mask, transpose_dz=False)[1]})
    unchanged("the incoming gradient dy", g, gt)
