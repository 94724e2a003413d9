"""Finite-difference checks of hand-written gradients.

For a function f and an input element x_i, the central difference

    ∂f/∂x_i ≈ (f(x + ε e_i) − f(x − ε e_i)) / 2ε

has error O(ε²), so in float64 with ε = 1e-6 it agrees with a correct
analytic gradient to about 1e-9 relative. ``gradcheck`` builds the whole
Jacobian both ways and compares; with ``fast=True`` it compares a single
random directional derivative vᵀJu (two forward passes, one backward), which
scales to large inputs. ``gradgradcheck`` applies the same test to the
gradient itself, checking second derivatives.
"""
from __future__ import annotations

import numpy as np

from minidl import backend
from minidl.autograd import ForwardMode, grad, no_grad
from minidl.tensor import Tensor


class GradcheckError(AssertionError):
    """The analytic and numerical gradients disagree (the message says where)."""


def _outputs_of(fn, inputs):
    out = fn(*inputs)
    return [out] if isinstance(out, Tensor) else [o for o in out if o is not None]


def _checked_inputs(inputs):
    inputs = [inputs] if isinstance(inputs, Tensor) else list(inputs)
    wrt = [x for x in inputs if isinstance(x, Tensor) and x.requires_grad]
    if not wrt:
        raise ValueError("gradcheck: no input has requires_grad=True; nothing to check")
    for x in wrt:
        if x.dtype != np.float64:
            raise TypeError(f"gradcheck: input of shape {x.shape} is {x.dtype}; finite differences need "
                            "float64 (use mdl.tensor(..., dtype='float64') or x.double())")
    return inputs, wrt


def _numeric_jacobian_column(fn, inputs, x, i, eps):
    """Column i of each output's Jacobian, d out / dx_i, by central difference."""
    at = np.unravel_index(i, x.shape)  # element i in C order, whatever x's memory layout
    original = x.data[at].item()
    # fn may itself need the graph (gradgradcheck), so no no_grad here; outputs are
    # copied because a view of x (reshape, transpose) would move with the next nudge.
    x.data[at] = original + eps
    plus = [o.data.copy() for o in _outputs_of(fn, inputs)]
    x.data[at] = original - eps
    minus = [o.data.copy() for o in _outputs_of(fn, inputs)]
    x.data[at] = original
    return [(p - m).reshape(-1) / (2 * eps) for p, m in zip(plus, minus)]


def _describe(which, x, index, analytic, numeric):
    rel = abs(analytic - numeric) / max(abs(numeric), 1e-12)
    where = np.unravel_index(index, x.shape) if x.ndim else ()
    return (f"{which}: gradient mismatch for input {x.shape} at element {tuple(int(i) for i in where)}: "
            f"analytic {analytic:.10g}, numeric {numeric:.10g}, relative error {rel:.3g}")


def _jacobians(fn, inputs, wrt, eps):
    """Analytic and numeric Jacobians, one (outputs × input) matrix per checked input."""
    outputs = _outputs_of(fn, inputs)
    sizes = [o.data.size for o in outputs]
    analytic = [np.zeros((sum(sizes), x.data.size)) for x in wrt]
    row = 0
    for out in outputs:
        for k in range(out.data.size):
            if out.requires_grad:  # an output cut from the graph has a zero analytic row
                seed = Tensor(out.xp.zeros(out.shape, out.dtype))
                seed.data.reshape(-1)[k] = 1.0
                grads = grad([out], wrt, grad_outputs=[seed], retain_graph=True, allow_unused=True)
                for j, g in enumerate(grads):
                    if g is not None:
                        analytic[j][row] = backend.to_numpy(g.data).reshape(-1)
            row += 1
    numeric = [np.zeros_like(a) for a in analytic]
    for j, x in enumerate(wrt):
        for i in range(x.data.size):
            columns = _numeric_jacobian_column(fn, inputs, x, i, eps)
            if columns:  # no outputs at all: an empty Jacobian, nothing to compare
                numeric[j][:, i] = np.concatenate([backend.to_numpy(c) for c in columns])
    return analytic, numeric


def _directional(fn, inputs, wrt, eps, rng):
    """(vᵀ J u analytic, numeric) for random u over the inputs and v over the outputs."""
    outputs = _outputs_of(fn, inputs)
    v = [Tensor(backend.to_device(rng.standard_normal(o.shape), o.device).astype(o.dtype)) for o in outputs]
    u = [backend.to_device(rng.standard_normal(x.shape), x.device) for x in wrt]
    live = [(o, w) for o, w in zip(outputs, v) if o.requires_grad]  # the rest have zero gradient
    grads = (grad([o for o, _ in live], wrt, grad_outputs=[w for _, w in live], retain_graph=True,
                  allow_unused=True) if live else [])
    analytic = sum(float((g.data * d).sum()) for g, d in zip(grads, u) if g is not None)
    saved = [x.data.copy() for x in wrt]

    def weighted(sign):
        for x, base, d in zip(wrt, saved, u):
            x.data[...] = base + sign * eps * d
        outs = _outputs_of(fn, inputs)
        return sum(float((o.data * w.data).sum()) for o, w in zip(outs, v))

    numeric = (weighted(+1) - weighted(-1)) / (2 * eps)
    for x, base in zip(wrt, saved):
        x.data[...] = base
    return analytic, numeric


def max_relative_error(fn, inputs, eps=1e-6, fast=False, seed=0) -> float:
    """The largest |analytic − numeric| / max(|numeric|, 1) over every checked entry."""
    inputs, wrt = _checked_inputs(inputs)
    if fast:
        a, n = _directional(fn, inputs, wrt, eps, np.random.default_rng(seed))
        return abs(a - n) / max(abs(n), 1.0)
    analytic, numeric = _jacobians(fn, inputs, wrt, eps)
    return max((np.abs(a - n) / np.maximum(np.abs(n), 1.0)).max(initial=0.0) for a, n in zip(analytic, numeric))


def gradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-3, fast=False, seed=0) -> bool:
    """Check ``fn``'s gradients against central differences; True or GradcheckError.

    ``fn(*inputs)`` returns a Tensor or a tuple of Tensors; every input with
    ``requires_grad=True`` (float64) is checked. An entry passes when
    |analytic − numeric| ≤ atol + rtol·|numeric|. ``fast=True`` checks one
    random directional derivative vᵀJu instead of the full Jacobian.
    """
    inputs, wrt = _checked_inputs(inputs)
    if fast:
        a, n = _directional(fn, inputs, wrt, eps, np.random.default_rng(seed))
        if abs(a - n) > atol + rtol * abs(n):
            raise GradcheckError(f"gradcheck (fast): directional derivative vᵀJu analytic {a:.10g}, "
                                 f"numeric {n:.10g}, relative error {abs(a - n) / max(abs(n), 1e-12):.3g}")
        return True
    analytic, numeric = _jacobians(fn, inputs, wrt, eps)
    for x, a, n in zip(wrt, analytic, numeric):
        excess = np.abs(a - n) - (atol + rtol * np.abs(n))
        if excess.size and excess.max() > 0:
            row, col = np.unravel_index(np.argmax(excess), excess.shape)
            raise GradcheckError(_describe(f"gradcheck (output element {row})", x, col, a[row, col], n[row, col]))
    return True


def gradgradcheck(fn, inputs, grad_outputs=None, eps=1e-6, atol=1e-5, rtol=1e-3, fast=False, seed=0) -> bool:
    """Check second derivatives: gradcheck of (x, v) ↦ vᵀ ∂fn/∂x built with create_graph=True.

    ``grad_outputs`` (the v, float64) defaults to fixed random tensors. Both
    arguments are checked, as in PyTorch: the derivative with respect to x is
    the Hessian-vector product that higher-order methods (AdaHessian) rely
    on; the one with respect to v checks that the recorded backward is the
    gradient itself (for a piecewise-linear op like relu, where the first is
    zero, the second is not).
    """
    inputs, wrt = _checked_inputs(inputs)
    if grad_outputs is None:
        rng = np.random.default_rng(seed + 1)
        with no_grad():
            outs = _outputs_of(fn, inputs)
        grad_outputs = [backend.to_device(rng.standard_normal(o.shape), o.device).astype(o.dtype) for o in outs]
    vs = [Tensor(v.data if isinstance(v, Tensor) else v, requires_grad=True) for v in grad_outputs]
    n = len(inputs)

    def first_derivative(*args):
        outs = _outputs_of(fn, args[:n])
        grads = grad(outs, wrt, grad_outputs=list(args[n:]), create_graph=True, allow_unused=True)
        return tuple(g for g in grads if g is not None)

    return gradcheck(first_derivative, list(inputs) + vs, eps=eps, atol=atol, rtol=rtol, fast=fast, seed=seed)


# ---------------------------------------------------------------- the adjoint (dot-product) test
# The tolerance of the adjoint test, in units of the float64 epsilon times the products' magnitude S
# (see adjoint_error): both sides are sums of the same products rounded along different paths, each
# path a few roundings deep per op, so a correct pair of rules agrees to a few ulps of S (at most 1.1 over
# the op cases, measured); a rule off by a relative 1e-9 is millions of ulps away.
ADJOINT_ULPS = 32


def _adjoint_sides(fn, inputs, wrt, rng):
    """(⟨u, J v⟩, ⟨Jᵀu, v⟩, S): J v from the tangent rules, Jᵀu from the backward, u and v random."""
    vs = [Tensor(backend.to_device(rng.standard_normal(x.shape), x.device).astype(x.dtype)) for x in wrt]
    with ForwardMode() as level:
        for x, v in zip(wrt, vs):
            level.attach(x, v)
        outputs = _outputs_of(fn, inputs)
        jvs = [level.tangent(o) for o in outputs]
    us = [Tensor(backend.to_device(rng.standard_normal(o.shape), o.device).astype(o.dtype)) for o in outputs]
    live = [(o, u) for o, u in zip(outputs, us) if o.requires_grad]  # the rest have zero gradient
    jtus = (grad([o for o, _ in live], wrt, grad_outputs=[u for _, u in live], allow_unused=True)
            if live else [None] * len(wrt))
    forward = [backend.to_numpy(u.data) * backend.to_numpy(jv.data) for u, jv in zip(us, jvs) if jv is not None]
    reverse = [backend.to_numpy(g.data) * backend.to_numpy(v.data) for g, v in zip(jtus, vs) if g is not None]
    scale = max(sum(float(np.abs(p).sum()) for p in side) for side in (forward, reverse))
    return sum(float(p.sum()) for p in forward), sum(float(p.sum()) for p in reverse), scale


def adjoint_error(fn, inputs, seed=0) -> float:
    """|⟨u, J v⟩ − ⟨Jᵀu, v⟩| / (ε S): the dot-product test, in units of ε (float64's) times S.

    J v comes from the ops' tangent rules (forward mode, one sweep) and Jᵀu
    from their backward (one walk), for random u over the outputs and v over
    the inputs that require grad. Both sides are the same number, Σ uᵢ Jᵢⱼ vⱼ,
    summed in different orders; S is the larger of Σ|uᵢ (Jv)ᵢ| and
    Σ|(Jᵀu)ⱼ vⱼ|, the size of the terms, so rounding alone leaves an error of
    a few ulps of S. A backward or tangent rule off by a relative 1e-9
    anywhere moves one side by about 1e-9 of its terms: millions of ulps.
    """
    inputs, wrt = _checked_inputs(inputs)
    forward, reverse, scale = _adjoint_sides(fn, inputs, wrt, np.random.default_rng(seed))
    if scale == 0:
        return 0.0 if forward == reverse else float("inf")
    return abs(forward - reverse) / (np.finfo(np.float64).eps * scale)


def adjoint_check(fn, inputs, ulps=ADJOINT_ULPS, seed=0) -> bool:
    """The adjoint test: True when ⟨u, J v⟩ = ⟨Jᵀu, v⟩ to ``ulps`` ulps of S (see adjoint_error), else
    GradcheckError. It compares the backward with the tangent rules, not with finite differences:
    a pair of rules that agree could both be wrong, which :func:`tangent_error` checks."""
    error = adjoint_error(fn, inputs, seed)
    if not error <= ulps:
        raise GradcheckError(f"adjoint test: ⟨u, J v⟩ (tangent rules) and ⟨Jᵀu, v⟩ (backward) differ by {error:.3g} "
                             f"ulps of the products' size, more than {ulps}: a backward or a tangent rule is wrong")
    return True


def tangent_error(fn, inputs, eps=1e-6, seed=0) -> float:
    """The largest |J v − (f(x + εv) − f(x − εv)) / 2ε| / max(|·|, 1) over the outputs' entries: the
    tangent rules (forward mode) against central differences along one random direction v."""
    inputs, wrt = _checked_inputs(inputs)
    rng = np.random.default_rng(seed)
    vs = [backend.to_device(rng.standard_normal(x.shape), x.device).astype(x.dtype) for x in wrt]
    with ForwardMode() as level:
        for x, v in zip(wrt, vs):
            level.attach(x, Tensor(v))
        outputs = _outputs_of(fn, inputs)
        jvs = [level.tangent(o) for o in outputs]
    analytic = [np.zeros(o.shape) if jv is None else backend.to_numpy(jv.data) for o, jv in zip(outputs, jvs)]
    saved = [x.data.copy() for x in wrt]

    def moved(sign):
        for x, base, v in zip(wrt, saved, vs):
            x.data[...] = base + sign * eps * v
        return [backend.to_numpy(o.data).copy() for o in _outputs_of(fn, inputs)]  # fn may need the graph

    try:
        numeric = [(p - m) / (2 * eps) for p, m in zip(moved(+1), moved(-1))]
    finally:
        for x, base in zip(wrt, saved):
            x.data[...] = base
    return max((float((np.abs(a - n) / np.maximum(np.abs(n), 1.0)).max(initial=0.0))
                for a, n in zip(analytic, numeric)), default=0.0)


def forward_mode_errors(fn, inputs, eps=1e-6, seed=0) -> tuple:
    """(adjoint_error, tangent_error) of one case: what ``minidl gradcheck --adjoint`` prints for each op."""
    return adjoint_error(fn, inputs, seed), tangent_error(fn, inputs, eps, seed)
