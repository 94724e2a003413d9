"""The benchmarked ops, each written three ways: minidl, plain NumPy/CuPy by hand, and PyTorch.

A :class:`Case` is one op at one size. ``build(framework, device)`` returns
the callables to time, one per phase ("forward", "backward"; "update" for
an optimizer step); the analytic cost of each phase comes from
:mod:`minidl.roofline.opcosts`.

- **minidl** runs the op with its autograd: the forward records the graph,
  the backward is ``mdl.grad`` of the output (with retain_graph, so it can be
  timed again and again).
- **numpy** (CuPy on the GPU) is the same math written by hand, the floor
  for any engine built on these arrays.
- **torch** is the peer, with ``torch.autograd.grad`` for the backward.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from minidl import backend
from minidl.roofline import opcosts

FRAMEWORKS = ("minidl", "numpy", "torch")


@dataclass
class Case:
    op: str
    size: str
    shapes: list  # input shapes (all float32)
    grads: list  # which inputs need a gradient
    costs: dict  # phase -> opcosts.Cost
    minidl: object = None  # fn(F, *tensors) -> output, or a builder for optimizer cases
    torch: object = None  # fn(torch, *tensors) -> output
    numpy: object = None  # fn(xp, *arrays) -> (forward, backward(g))
    params: dict = field(default_factory=dict)

    @property
    def phases(self):
        return tuple(self.costs)

    def arrays(self, seed=0):
        rng = np.random.default_rng(seed)
        return [rng.standard_normal(s, dtype=np.float32) for s in self.shapes]

    def build(self, framework: str, device: str):
        """{phase: callable} for this framework on ``device``; None where it cannot run here."""
        if framework == "torch":
            return _build_torch(self, device)
        if framework == "numpy":
            return _build_numpy(self, device)
        return _build_minidl(self, device)


def _phases(op_cost: opcosts.OpCost) -> dict:
    return {"forward": op_cost.forward, "backward": op_cost.backward}


# ---------------------------------------------------------------- builders
def _torch_module(device):
    try:
        import torch
    except ImportError:
        return None
    if backend.parse_device(device)[0] == "cuda" and not torch.cuda.is_available():
        return None
    return torch


def _build_minidl(case, device):
    import minidl as mdl
    import minidl.functional as F
    if case.op in ("sgd", "adam"):
        return _optimizer_minidl(case, device)
    tensors = [mdl.tensor(a, requires_grad=g, device=device) for a, g in zip(case.arrays(), case.grads)]
    y = case.minidl(F, *tensors)
    g = mdl.tensor(np.random.default_rng(1).standard_normal(y.shape, dtype=np.float32), device=device)
    wrt = [t for t, needs in zip(tensors, case.grads) if needs]
    return {"forward": lambda: case.minidl(F, *tensors),
            "backward": lambda: mdl.grad(y, wrt, grad_outputs=g, retain_graph=True)}


def _build_torch(case, device):
    torch = _torch_module(device)
    if torch is None or case.torch is None:
        return None
    kind = backend.parse_device(device)[0]
    if case.op in ("sgd", "adam"):
        return _optimizer_torch(case, torch, kind)
    tensors = [torch.tensor(a, device=kind, requires_grad=g) for a, g in zip(case.arrays(), case.grads)]
    y = case.torch(torch, *tensors)
    g = torch.tensor(np.random.default_rng(1).standard_normal(tuple(y.shape), dtype=np.float32), device=kind)
    wrt = [t for t, needs in zip(tensors, case.grads) if needs]
    return {"forward": lambda: case.torch(torch, *tensors),
            "backward": lambda: torch.autograd.grad(y, wrt, g, retain_graph=True)}


def _build_numpy(case, device):
    xp = backend.xp_for(device)
    arrays = [xp.asarray(a) for a in case.arrays()]
    if case.op in ("sgd", "adam"):
        return {"update": case.numpy(xp, *arrays)}
    forward, backward = case.numpy(xp, *arrays)
    y = forward()
    g = xp.asarray(np.random.default_rng(1).standard_normal(y.shape, dtype=np.float32))
    return {"forward": forward, "backward": lambda: backward(g)}


# ---------------------------------------------------------------- hand-written NumPy/CuPy
def _np_matmul(xp, a, b):
    return (lambda: a @ b), (lambda g: (g @ b.T, a.T @ g))


def _np_linear(xp, x, w, b):
    def forward():
        y = x @ w.T
        y += b
        return y
    return forward, (lambda g: (g @ w, g.T @ x, g.sum(axis=0)))


def _np_relu(xp, x):
    return (lambda: xp.maximum(x, 0)), (lambda g: g * (x > 0))


def _np_exp(xp, x):
    y = xp.exp(x)
    return (lambda: xp.exp(x)), (lambda g: g * y)


def _np_softmax(xp, x):
    def forward():
        e = xp.exp(x - x.max(axis=-1, keepdims=True))
        e /= e.sum(axis=-1, keepdims=True)
        return e
    y = forward()
    return forward, (lambda g: y * (g - (g * y).sum(axis=-1, keepdims=True)))


def _np_log_softmax(xp, x):
    def forward():
        z = x - x.max(axis=-1, keepdims=True)
        return z - xp.log(xp.exp(z).sum(axis=-1, keepdims=True))
    y = forward()
    return forward, (lambda g: g - xp.exp(y) * g.sum(axis=-1, keepdims=True))


def _np_normalize(axes, param_shape):
    """Standardize over ``axes`` then scale and shift: batch norm and layer norm by hand."""
    def impl(xp, x, w, b):
        w, b = w.reshape(param_shape), b.reshape(param_shape)
        reduced = tuple(i for i in range(x.ndim) if param_shape[i] == 1)

        def forward():
            mu = x.mean(axis=axes, keepdims=True)
            xc = x - mu
            inv = 1 / xp.sqrt((xc * xc).mean(axis=axes, keepdims=True) + 1e-5)
            return xc * inv * w + b
        mu = x.mean(axis=axes, keepdims=True)
        inv = 1 / xp.sqrt(((x - mu) ** 2).mean(axis=axes, keepdims=True) + 1e-5)

        def backward(g):
            x_hat = (x - mu) * inv
            u = g * w
            gx = inv * (u - u.mean(axis=axes, keepdims=True) - x_hat * (u * x_hat).mean(axis=axes, keepdims=True))
            return gx, (g * x_hat).sum(axis=reduced), g.sum(axis=reduced)
        return forward, backward
    return impl


def _np_conv2d(padding):
    """im2col by a strided view, then one GEMM; col2im adds each kernel offset back."""
    def impl(xp, x, w, b):
        n, c, h, wd = x.shape
        o, _, kh, kw = w.shape
        oh, ow = h + 2 * padding - kh + 1, wd + 2 * padding - kw + 1
        w2 = w.reshape(o, -1)

        def columns():
            xpad = xp.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
            s = xpad.strides
            view = xp.lib.stride_tricks.as_strided(xpad, (n, oh, ow, c, kh, kw), (s[0], s[2], s[3], s[1], s[2], s[3]))
            return xp.ascontiguousarray(view).reshape(n * oh * ow, -1)

        def forward():
            y = columns() @ w2.T
            y += b
            return y.reshape(n, oh, ow, o).transpose(0, 3, 1, 2)
        cols = columns()

        def backward(g):
            g2 = g.transpose(0, 2, 3, 1).reshape(-1, o)
            gw = (g2.T @ cols).reshape(w.shape)
            gcols = (g2 @ w2).reshape(n, oh, ow, c, kh, kw)
            gpad = xp.zeros((n, c, h + 2 * padding, wd + 2 * padding), x.dtype)
            for p in range(kh):
                for q in range(kw):
                    gpad[:, :, p:p + oh, q:q + ow] += gcols[:, :, :, :, p, q].transpose(0, 3, 1, 2)
            return gpad[:, :, padding:padding + h, padding:padding + wd], gw, g2.sum(axis=0)
        return forward, backward
    return impl


def _np_sgd(xp, w, g, lr=1e-3, momentum=0.9):
    b, tmp = xp.zeros_like(w), xp.empty_like(w)

    def update():  # b ← μb + g;  w ← w − lr·b, in place
        xp.multiply(b, momentum, out=b)
        xp.add(b, g, out=b)
        xp.subtract(w, xp.multiply(b, lr, out=tmp), out=w)
    return update


def _np_adam(xp, w, g, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8):
    m, v, tmp, denom = xp.zeros_like(w), xp.zeros_like(w), xp.empty_like(w), xp.empty_like(w)
    step = [0]

    def update():  # the Adam lines, in place, with two scratch arrays
        step[0] += 1
        t = step[0]
        xp.multiply(m, beta1, out=m)
        xp.add(m, xp.multiply(g, 1 - beta1, out=tmp), out=m)
        xp.multiply(v, beta2, out=v)
        xp.add(v, xp.multiply(xp.square(g, out=tmp), 1 - beta2, out=tmp), out=v)
        xp.sqrt(xp.multiply(v, 1 / (1 - beta2 ** t), out=denom), out=denom)
        xp.add(denom, eps, out=denom)
        xp.divide(m, denom, out=tmp)
        xp.subtract(w, xp.multiply(tmp, lr / (1 - beta1 ** t), out=tmp), out=w)
    return update


# ---------------------------------------------------------------- optimizers in minidl and torch
def _optimizer_minidl(case, device):
    import minidl as mdl
    try:
        from minidl import optim
        cls = optim.SGD if case.op == "sgd" else optim.Adam
    except (ImportError, AttributeError):  # pragma: no cover - the optimizers are optional here
        return None
    w, g = case.arrays()
    param = mdl.tensor(w, requires_grad=True, device=device)
    param.grad = mdl.tensor(g, device=device)
    opt = cls([param], lr=1e-3, momentum=0.9) if case.op == "sgd" else cls([param], lr=1e-3)
    return {"update": opt.step}


def _optimizer_torch(case, torch, kind):
    w, g = case.arrays()
    param = torch.tensor(w, device=kind, requires_grad=True)
    param.grad = torch.tensor(g, device=kind)
    if case.op == "sgd":
        opt = torch.optim.SGD([param], lr=1e-3, momentum=0.9)
    else:
        opt = torch.optim.Adam([param], lr=1e-3)
    return {"update": opt.step}


# ---------------------------------------------------------------- the list of cases
SIZES = {
    "cuda": dict(square=(1024, 4096, 8192), linear=(4096, 4096),
                 batches=(1, 4, 16, 64, 256, 1024, 4096, 16384), elementwise=(1 << 20, 1 << 26),
                 rows=(32768, 1024), conv=(64, 128, 32, 32, 128), batch_norm=(128, 128, 32, 32),
                 layer_norm=(32768, 1024), params=1 << 24),
    False: dict(square=(256, 512, 1024), linear=(1024, 1024), batches=(1, 4, 16, 64, 256, 1024, 4096),
                elementwise=(1 << 16, 1 << 24), rows=(8192, 1024), conv=(32, 64, 16, 16, 64),
                batch_norm=(64, 64, 16, 16), layer_norm=(4096, 1024), params=1 << 22),
    True: dict(square=(64, 128), linear=(256, 256), batches=(1, 16, 256), elementwise=(1 << 12, 1 << 16),
               rows=(256, 256), conv=(4, 8, 8, 8, 8), batch_norm=(8, 8, 8, 8), layer_norm=(256, 256),
               params=1 << 14),
}


def _elements_label(n):
    return f"{n / 2 ** 20:g}M" if n >= 1 << 20 else f"{n / 2 ** 10:g}K"


def cases(quick: bool = False, device: str = "cpu") -> list[Case]:
    """Every op at every size of the suite (``quick``: tiny sizes for a smoke run; larger on a GPU)."""
    gpu = backend.parse_device(device)[0] == "cuda"
    s = SIZES["cuda" if gpu and not quick else bool(quick)]
    out = []
    for n in s["square"]:
        out.append(Case("matmul", f"{n}x{n}x{n}", [(n, n), (n, n)], [True, True],
                        _phases(opcosts.matmul(n, n, n)), lambda F, a, b: a @ b, lambda t, a, b: a @ b,
                        _np_matmul, dict(n=n)))
    fan_in, fan_out = s["linear"]
    for batch in s["batches"]:
        out.append(Case("linear", f"batch {batch}", [(batch, fan_in), (fan_out, fan_in), (fan_out,)],
                        [True, True, True], _phases(opcosts.linear(batch, fan_in, fan_out)),
                        lambda F, x, w, b: F.linear(x, w, b),
                        lambda t, x, w, b: t.nn.functional.linear(x, w, b), _np_linear,
                        dict(batch=batch, in_features=fan_in, out_features=fan_out)))
    for n in s["elementwise"]:
        label = _elements_label(n)
        out += [
            Case("add", label, [(n,), (n,)], [True, True], _phases(opcosts.add(n)),
                 lambda F, a, b: a + b, lambda t, a, b: a + b,
                 lambda xp, a, b: ((lambda: a + b), (lambda g: (g, g))), dict(n=n)),
            Case("mul", label, [(n,), (n,)], [True, True], _phases(opcosts.mul(n)),
                 lambda F, a, b: a * b, lambda t, a, b: a * b,
                 lambda xp, a, b: ((lambda: a * b), (lambda g: (g * b, g * a))), dict(n=n)),
            Case("relu", label, [(n,)], [True], _phases(opcosts.relu(n)),
                 lambda F, x: F.relu(x), lambda t, x: t.relu(x), _np_relu, dict(n=n)),
            Case("exp", label, [(n,)], [True], _phases(opcosts.exp(n)),
                 lambda F, x: F.exp(x), lambda t, x: t.exp(x), _np_exp, dict(n=n)),
        ]
    rows, cols = s["rows"]
    label = f"{rows}x{cols}"
    out += [
        Case("sum", label, [(rows, cols)], [True], _phases(opcosts.sum_rows(rows, cols)),
             lambda F, x: F.sum(x, axis=-1), lambda t, x: x.sum(-1),
             lambda xp, x: ((lambda: x.sum(axis=-1)), (lambda g: xp.broadcast_to(g[:, None], x.shape))),
             dict(rows=rows, cols=cols)),
        Case("softmax", label, [(rows, cols)], [True], _phases(opcosts.softmax(rows, cols)),
             lambda F, x: F.softmax(x, axis=-1), lambda t, x: t.softmax(x, -1), _np_softmax,
             dict(rows=rows, cols=cols)),
        Case("log_softmax", label, [(rows, cols)], [True], _phases(opcosts.log_softmax(rows, cols)),
             lambda F, x: F.log_softmax(x, axis=-1), lambda t, x: t.log_softmax(x, -1), _np_log_softmax,
             dict(rows=rows, cols=cols)),
    ]
    n, c, h, w, o = s["conv"]
    out.append(Case("conv2d", f"{n}x{c}x{h}x{w} k3 o{o}", [(n, c, h, w), (o, c, 3, 3), (o,)], [True] * 3,
                    _phases(opcosts.conv2d(n, c, h, w, o, 3, padding=1)),
                    lambda F, x, k, b: F.conv2d(x, k, b, padding=1),
                    lambda t, x, k, b: t.nn.functional.conv2d(x, k, b, padding=1), _np_conv2d(1),
                    dict(batch=n, channels=c, height=h, width=w, out_channels=o)))
    n, c, h, w = s["batch_norm"]
    out.append(Case("batch_norm", f"{n}x{c}x{h}x{w}", [(n, c, h, w), (c,), (c,)], [True] * 3,
                    _phases(opcosts.batch_norm(n, c, h, w)),
                    lambda F, x, g, b: F.batch_norm(x, None, None, g, b, training=True),
                    lambda t, x, g, b: t.nn.functional.batch_norm(x, None, None, g, b, training=True),
                    _np_normalize((0, 2, 3), (1, c, 1, 1)), dict(shape=(n, c, h, w))))
    rows, feats = s["layer_norm"]
    out.append(Case("layer_norm", f"{rows}x{feats}", [(rows, feats), (feats,), (feats,)], [True] * 3,
                    _phases(opcosts.layer_norm(rows, feats)),
                    lambda F, x, g, b: F.layer_norm(x, feats, g, b),
                    lambda t, x, g, b: t.nn.functional.layer_norm(x, (feats,), g, b),
                    _np_normalize((1,), (1, feats)), dict(shape=(rows, feats))))
    p = s["params"]
    label = f"{_elements_label(p)} params"
    out += [
        Case("sgd", label, [(p,), (p,)], [False, False], {"update": opcosts.sgd_step(p, momentum=True)},
             True, True, _np_sgd, dict(params=p, momentum=0.9)),
        Case("adam", label, [(p,), (p,)], [False, False], {"update": opcosts.adam_step(p)},
             True, True, _np_adam, dict(params=p)),
    ]
    return out
