"""Assignment 4's checks: each optimizer's trajectory against its equations, step by step.

The student's update functions are run through the optimizer classes
(``optim.SGD(...).step()``), as training runs them, on a parameter fed a fixed
sequence of gradients; after every step the weights are compared with the
reference written here in NumPy from the book's lines. The known mistakes are
the same reference with one line changed (t − 1 for t, ε inside the root, no
look-ahead...), run on the same gradients. Each step also checks that the
gradient the optimizer was handed was not written into.
"""
from __future__ import annotations

import numpy as np

import minidl
from minidl import nn, optim

from .core import check, compare, unchanged

STEPS = 5


def _run(case, make, shapes):
    """The student's trajectory: [w after each step] per parameter, from weights and gradients drawn for the case."""
    dtype = np.dtype(case.get("dtype", "float64"))
    weights = [case.rng.standard_normal(s).astype(dtype) for s in shapes]
    grads = [[case.rng.standard_normal(s).astype(dtype) * (1 + t % 3) for s in shapes] for t in range(STEPS)]
    params = [nn.Parameter(minidl.tensor(w.copy())) for w in weights]
    opt = make(params)
    path = []
    for t in range(STEPS):
        for p, g in zip(params, grads[t]):
            p.grad = minidl.tensor(g.copy())
        handed = [p.grad for p in params]
        opt.step()
        for p, g, h in zip(params, grads[t], handed):
            unchanged(f"the gradient handed to step {t + 1}", g, h)
        path.append([p.numpy().copy() for p in params])
    return weights, grads, path, dtype


def _compare_path(path, expected, dtype, mistakes, weights):
    """Step by step: the first step whose weights differ is reported, with what each mistake gives there.

    Besides the named mistakes, a step taken uphill (the sign) or twice as long or half as long
    (a factor of 2) is recognized from the weights before the step.
    """
    for t in range(STEPS):
        for i, got in enumerate(path[t]):
            what = f"w after step {t + 1}" + (f" (parameter {i})" if len(path[t]) > 1 else "")
            before = weights[i].astype(np.float64) if t == 0 else expected[t - 1][i]
            step = expected[t][i] - before
            compare(what, expected[t][i], got, dtype,
                    [(name, (lambda ref=ref, t=t, i=i: ref[t][i] if ref is not None else None))
                     for name, ref in mistakes]
                    + [("sign", before - step), ("factor of 2", before + 2 * step), ("factor of 2", before + step / 2)])


def _steps(update, weights, grads, state):
    """Run a reference ``update(w, g, state, t)`` (float64) over the gradients: [[w per parameter] per step]."""
    ws = [w.astype(np.float64) for w in weights]
    states = [dict(state) for _ in ws]
    out = []
    for t in range(STEPS):
        ws = [update(w, g.astype(np.float64), s, t + 1) for w, g, s in zip(ws, grads[t], states)]
        out.append([w.copy() for w in ws])
    return out


# ---------------------------------------------------------------- 4.1 SGD
def sgd_reference(lr, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0, variant=None):
    def update(w, g, s, t):
        g = g + weight_decay * w
        if momentum:
            s["b"] = g.copy() if "b" not in s else momentum * s["b"] + (1 - dampening) * g
            d = g + momentum * s["b"] if nesterov and variant != "no look-ahead" else s["b"]
        else:
            d = g
        return w - lr * d
    return update


def _sgd_label(p):
    return f"SGD(lr={p['lr']}, momentum={p.get('momentum', 0)}, nesterov={p.get('nesterov', False)}, " \
           f"weight_decay={p.get('weight_decay', 0)}, dampening={p.get('dampening', 0)}), {p.get('dtype', 'float64')}"


@check("a4.sgd", public=[dict(lr=0.1), dict(lr=0.1, momentum=0.9)],
       hidden=lambda rng: [dict(lr=0.05, momentum=0.9, nesterov=True, dtype="float32"),
                           dict(lr=0.1, momentum=float(rng.choice([0.5, 0.8])), weight_decay=0.1),
                           dict(lr=0.1, momentum=0.9, dampening=0.5)], hidden_count=3, label=_sgd_label)
def sgd(case):
    keys = ("momentum", "dampening", "nesterov", "weight_decay")
    kwargs = {k: case[k] for k in keys if k in case.params}
    weights, grads, path, dtype = _run(case, lambda ps: optim.SGD(ps, lr=case["lr"], **kwargs), [(3, 4)])
    expected = _steps(sgd_reference(case["lr"], **kwargs), weights, grads, {})
    _compare_path(path, expected, dtype, [
        ("missing Nesterov look-ahead", _steps(sgd_reference(case["lr"], **kwargs, variant="no look-ahead"),
                                              weights, grads, {}) if kwargs.get("nesterov") else None)], weights)


# ---------------------------------------------------------------- 4.2 AdaGrad, RMSProp; 4.3 AdaDelta
def adagrad_reference(lr, eps=1e-10, lr_decay=0.0, weight_decay=0.0, variant=None):
    def update(w, g, s, t):
        g = g + weight_decay * w
        s["s"] = s.get("s", 0.0) + g * g if variant != "mean" else s.get("s", 0.0) * (t - 1) / t + g * g / t
        rate = lr / (1 + (t - 1) * lr_decay)
        denom = np.sqrt(s["s"] + eps) if variant == "eps inside" else np.sqrt(s["s"]) + eps
        return w - rate * g / denom
    return update


@check("a4.adagrad", public=[dict(lr=0.1)],
       hidden=lambda rng: [dict(lr=0.5, eps=1e-3, dtype="float32"), dict(lr=0.1, lr_decay=0.1, weight_decay=0.05)],
       hidden_count=2, label=lambda p: f"Adagrad({', '.join(f'{k}={v}' for k, v in p.items() if k != 'dtype')}), "
                                       f"{p.get('dtype', 'float64')}")
def adagrad(case):
    kwargs = {k: v for k, v in case.params.items() if k != "dtype"}
    weights, grads, path, dtype = _run(case, lambda ps: optim.Adagrad(ps, **kwargs), [(3, 4)])
    expected = _steps(adagrad_reference(**kwargs), weights, grads, {})
    _compare_path(path, expected, dtype, [
        ("ε inside the square root", _steps(adagrad_reference(**kwargs, variant="eps inside"), weights, grads, {})),
        ("averaged, not summed", _steps(adagrad_reference(**kwargs, variant="mean"), weights, grads, {}))], weights)


def rmsprop_reference(lr, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False, variant=None):
    def update(w, g, s, t):
        g = g + weight_decay * w
        s["s"] = alpha * s.get("s", 0.0) + (1 - alpha) * g * g if variant != "no 1-ρ" else \
            alpha * s.get("s", 0.0) + g * g
        var = s["s"]
        if centered:
            s["g"] = alpha * s.get("g", 0.0) + (1 - alpha) * g
            var = var - s["g"] ** 2
        denom = np.sqrt(var + eps) if variant == "eps inside" else np.sqrt(var) + eps
        r = g / denom
        if momentum:
            s["b"] = momentum * s.get("b", 0.0) + r
            r = s["b"]
        return w - lr * r
    return update


@check("a4.rmsprop", public=[dict(lr=0.01, alpha=0.9)],
       hidden=lambda rng: [dict(lr=0.01, alpha=0.99, eps=1e-2, dtype="float32"), dict(lr=0.01, alpha=0.9, momentum=0.5),
                           dict(lr=0.01, alpha=0.9, centered=True, eps=1e-3)],
       hidden_count=3, label=lambda p: f"RMSprop({', '.join(f'{k}={v}' for k, v in p.items() if k != 'dtype')}), "
                                       f"{p.get('dtype', 'float64')}")
def rmsprop(case):
    kwargs = {k: v for k, v in case.params.items() if k != "dtype"}
    weights, grads, path, dtype = _run(case, lambda ps: optim.RMSprop(ps, **kwargs), [(3, 4)])
    expected = _steps(rmsprop_reference(**kwargs), weights, grads, {})
    _compare_path(path, expected, dtype, [
        ("ε inside the square root", _steps(rmsprop_reference(**kwargs, variant="eps inside"), weights, grads, {})),
        ("missing scale", _steps(rmsprop_reference(**kwargs, variant="no 1-ρ"), weights, grads, {}))], weights)


def adadelta_reference(lr=1.0, rho=0.9, eps=1e-6, weight_decay=0.0, variant=None):
    def update(w, g, s, t):
        g = g + weight_decay * w
        v = rho * s.get("v", 0.0) + (1 - rho) * g * g
        u = s.get("u", 0.0)
        if variant == "u first":
            u = rho * u + (1 - rho) * g * g
        delta = np.sqrt(u + eps) / np.sqrt(v + eps) * g if variant != "no eps on top" else np.sqrt(u) / np.sqrt(
            v + eps) * g
        s["v"] = v
        s["u"] = rho * u + (1 - rho) * delta * delta if variant != "u first" else u
        return w - lr * delta
    return update


@check("a4.adadelta", public=[dict(lr=1.0, rho=0.9)],
       hidden=lambda rng: [dict(lr=1.0, rho=0.95, eps=1e-4, dtype="float32"), dict(lr=0.5, rho=0.9, weight_decay=0.1)],
       hidden_count=2, label=lambda p: f"Adadelta({', '.join(f'{k}={v}' for k, v in p.items() if k != 'dtype')}), "
                                       f"{p.get('dtype', 'float64')}")
def adadelta(case):
    kwargs = {k: v for k, v in case.params.items() if k != "dtype"}
    weights, grads, path, dtype = _run(case, lambda ps: optim.Adadelta(ps, **kwargs), [(3, 4)])
    expected = _steps(adadelta_reference(**kwargs), weights, grads, {})
    _compare_path(path, expected, dtype, [
        ("updated too early", _steps(adadelta_reference(**kwargs, variant="u first"), weights, grads, {})),
        ("missing term", _steps(adadelta_reference(**kwargs, variant="no eps on top"), weights, grads, {}))], weights)


# ---------------------------------------------------------------- 4.4 Adam and AdamW
def adam_reference(lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False, decoupled=False, variant=None):
    beta1, beta2 = betas

    def update(w, g, s, t):
        if decoupled and variant != "decay on gradient":
            w = w - (weight_decay if variant == "decay without lr" else lr * weight_decay) * w
        elif weight_decay:
            g = g + weight_decay * w
        s["m"] = beta1 * s.get("m", 0.0) + (1 - beta1) * g
        s["v"] = beta2 * s.get("v", 0.0) + (1 - beta2) * g * g
        v = s["v"]
        if amsgrad:
            s["v_max"] = np.maximum(s.get("v_max", 0.0), v)
            v = s["v_max"]
        k = {"t - 1": t - 1, "t + 1": t + 1}.get(variant, t)
        with np.errstate(divide="ignore", invalid="ignore"):
            m_hat = s["m"] / (1 - beta1 ** k) if variant != "no correction" else s["m"]
            v_hat = v / (1 - beta2 ** k) if variant != "no correction" else v
            return w - lr * m_hat / (np.sqrt(v_hat) + eps)
    return update


def _adam_label(p):
    return f"{p.get('kind', 'Adam')}({', '.join(f'{k}={v}' for k, v in p.items() if k not in ('dtype', 'kind'))}), " \
           f"{p.get('dtype', 'float64')}"


def _adam_check(case, cls, decoupled):
    kwargs = {k: v for k, v in case.params.items() if k not in ("dtype", "kind")}
    weights, grads, path, dtype = _run(case, lambda ps: cls(ps, **kwargs), [(3, 4)])

    def ref(variant=None):
        return _steps(adam_reference(**kwargs, decoupled=decoupled, variant=variant), weights, grads, {})
    mistakes = [("bias correction t off by one", ref("t - 1")), ("bias correction t off by one", ref("t + 1")),
                ("missing bias correction", ref("no correction"))]
    if decoupled and kwargs.get("weight_decay"):
        mistakes += [("weight decay on the gradient", ref("decay on gradient")),
                     ("missing scale", ref("decay without lr"))]
    _compare_path(path, ref(), dtype, mistakes, weights)


@check("a4.adam", public=[dict(lr=0.1)],
       hidden=lambda rng: [dict(lr=0.05, betas=(0.8, 0.99), dtype="float32"), dict(lr=0.1, weight_decay=0.1),
                           dict(lr=0.1, amsgrad=True, eps=1e-3)], hidden_count=3, label=_adam_label)
def adam(case):
    _adam_check(case, optim.Adam, decoupled=False)


@check("a4.adamw", public=[dict(lr=0.1, weight_decay=0.1, kind="AdamW")],
       hidden=lambda rng: [dict(lr=0.05, weight_decay=float(rng.choice([0.2, 0.5])), kind="AdamW", dtype="float32")],
       hidden_count=1, label=_adam_label)
def adamw(case):
    _adam_check(case, optim.AdamW, decoupled=True)


# ---------------------------------------------------------------- 4.5 LARS and LAMB
def _trust(a, b):
    return a / b if a > 0 and b > 0 else 1.0


def lars_reference(lr, momentum=0.9, trust_coefficient=0.001, weight_decay=0.0, variant=None):
    def update(w, g, s, t):
        adapt = w.ndim > 1 or variant == "adapt 1-D"
        decay = weight_decay if adapt else 0.0
        if adapt:
            wn, gn = float(np.linalg.norm(w)), float(np.linalg.norm(g))
            if variant == "inverted":
                local = trust_coefficient * _trust(gn + decay * wn, wn) if wn > 0 and gn > 0 else 1.0
            else:
                denominator = gn if variant == "no decay term" else gn + decay * wn
                local = trust_coefficient * _trust(wn, denominator) if wn > 0 and gn > 0 else 1.0
        else:
            local = 1.0
        s["b"] = momentum * s.get("b", 0.0) + lr * local * (g + decay * w)
        return w - s["b"]
    return update


@check("a4.lars", public=[dict(lr=0.5, trust_coefficient=0.02, shapes=[(4, 3)])],
       hidden=lambda rng: [dict(lr=0.5, trust_coefficient=0.02, weight_decay=0.1, shapes=[(5, 3), (5,)]),
                           dict(lr=1.0, trust_coefficient=0.01, momentum=0.5, shapes=[(2, 3, 2)], dtype="float32")],
       hidden_count=2, label=lambda p: "LARS(" + ", ".join(f"{k}={v}" for k, v in p.items()
                                                          if k not in ("dtype", "shapes")) +
                                       f") on parameters {p['shapes']}, {p.get('dtype', 'float64')}")
def lars(case):
    kwargs = {k: v for k, v in case.params.items() if k not in ("dtype", "shapes")}
    shapes = [tuple(s) for s in case["shapes"]]
    weights, grads, path, dtype = _run(case, lambda ps: optim.LARS(ps, **kwargs), shapes)

    def ref(variant=None):
        return _steps(lars_reference(**kwargs, variant=variant), weights, grads, {})
    mistakes = [("trust ratio inverted", ref("inverted")), ("missing term", ref("no decay term")),
                ("1-D layers adapted", ref("adapt 1-D"))]
    _compare_path(path, ref(), dtype, mistakes, weights)


def lamb_reference(lr, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0, variant=None):
    beta1, beta2 = betas

    def update(w, g, s, t):
        s["m"] = beta1 * s.get("m", 0.0) + (1 - beta1) * g
        s["v"] = beta2 * s.get("v", 0.0) + (1 - beta2) * g * g
        if variant == "no correction":
            m_hat, v_hat = s["m"], s["v"]
        else:
            m_hat, v_hat = s["m"] / (1 - beta1 ** t), s["v"] / (1 - beta2 ** t)
        r = m_hat / (np.sqrt(v_hat) + eps)
        u = r + weight_decay * w
        wn, un = float(np.linalg.norm(w)), float(np.linalg.norm(r if variant == "trust from r" else u))
        trust = _trust(un, wn) if variant == "inverted" else _trust(wn, un)
        return w - lr * trust * u
    return update


@check("a4.lamb", public=[dict(lr=0.05, shapes=[(4, 3)])],
       hidden=lambda rng: [dict(lr=0.05, weight_decay=0.1, shapes=[(5, 3), (5,)]),
                           dict(lr=0.02, betas=(0.8, 0.99), weight_decay=0.05, shapes=[(3, 3)], dtype="float32")],
       hidden_count=2, label=lambda p: "LAMB(" + ", ".join(f"{k}={v}" for k, v in p.items()
                                                          if k not in ("dtype", "shapes")) +
                                       f") on parameters {p['shapes']}, {p.get('dtype', 'float64')}")
def lamb(case):
    kwargs = {k: v for k, v in case.params.items() if k not in ("dtype", "shapes")}
    shapes = [tuple(s) for s in case["shapes"]]
    weights, grads, path, dtype = _run(case, lambda ps: optim.LAMB(ps, **kwargs), shapes)

    def ref(variant=None):
        return _steps(lamb_reference(**kwargs, variant=variant), weights, grads, {})
    _compare_path(path, ref(), dtype, [("trust ratio inverted", ref("inverted")), ("missing term", ref("trust from r")),
                                       ("missing bias correction", ref("no correction"))], weights)


