"""Numerical checks of hand-written gradients: central differences, Richardson, the complex step.

For a function f and an input element x_i, the central difference

    ∂f/∂x_i ≈ (f(x + h e_i) − f(x − h e_i)) / 2h

has a truncation error |f‴|h²/6 and a rounding error ε|f|/h (ε = 2.2e-16 in
float64), smallest near h = 1e-5; with h = 1e-6 it agrees with a correct
analytic gradient to about 1e-10. ``method="richardson"`` combines the steps
h, h/2, h/4 to cancel the h² and h⁴ terms (error O(h⁶), about 1e-13);
``method="complex"`` takes Im f(x + ih)/h, which subtracts nothing and is
exact to a few ulps for f analytic (every op computing the analytic
continuation on complex128; minidl.op_cases says which do). Each check
reports its method's own error estimate: how far it can see.

``gradcheck`` builds the whole Jacobian both ways and compares; with
``fast=True`` it compares a single random directional derivative vᵀJu (one
backward, a few forward passes), which scales to large inputs.
``gradgradcheck`` applies the same test to the gradient itself, checking
second derivatives. ``error_sweep`` measures the error against the step
(the V of truncation and rounding), and ``plot_error_sweep`` draws it.
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


METHODS = ("central", "richardson", "complex")
DEFAULT_STEPS = {"central": 1e-6, "richardson": 1e-2, "complex": 1e-20}
_ULP = float(np.finfo(np.float64).eps)  # 2.2e-16: float64's relative rounding


def _check_method(method, eps):
    if method not in METHODS:
        raise ValueError(f"gradcheck: unknown method {method!r}; expected one of {', '.join(METHODS)}")
    return DEFAULT_STEPS[method] if eps is None else eps


def _flat_outputs(fn, inputs):
    """fn's outputs, copied and flattened into one host vector (copies: a view of x would move with x)."""
    return np.concatenate([backend.to_numpy(o.array).reshape(-1) for o in _outputs_of(fn, inputs)] or [np.zeros(0)])


def _central(fn, inputs, nudge, step):
    """(f(x + step·d) − f(x − step·d)) / 2·step, and the rounding in it: ε·(|f₊| + |f₋|) / 2·step.

    ``nudge(s)`` moves the checked inputs to x + s·d (s = 0 restores them). fn may itself
    need the graph (gradgradcheck), so no no_grad here.
    """
    nudge(step)
    plus = _flat_outputs(fn, inputs)
    nudge(-step)
    minus = _flat_outputs(fn, inputs)
    nudge(0.0)
    return (plus - minus) / (2 * step), _ULP * (np.abs(plus) + np.abs(minus)) / (2 * step)


def _derivative(fn, inputs, nudge, method, h, truncation=True):
    """The directional derivative of fn's outputs along the nudge, and the method's estimate of its error.

    central     D(h), error O(h²): the estimate is the rounding ε|f|/h plus the
                truncation |D(2h) − D(h)| / 3 (D(2h) − D(h) = 3·c·h² + O(h⁴)); with
                ``truncation=False`` the rounding only (the Jacobian adds one estimate
                of the truncation for all its columns: two evaluations, not 2n).
    richardson  D(h), D(h/2), D(h/4) combined to cancel the h² and h⁴ terms:
                R₁(h) = (4·D(h/2) − D(h)) / 3,  R₂(h) = (16·R₁(h/2) − R₁(h)) / 15, error O(h⁶).
                The estimate is |R₂(h) − R₂(h/2)| (= (63/64)·c·h⁶, from one more step,
                h/8) plus the rounding, amplified ×(64·4 + 20·2 + 1)/45 ≈ 6.6 by the weights.
    """
    if method == "central":
        d_h, rounding = _central(fn, inputs, nudge, h)
        if not truncation:
            return d_h, rounding
        d_2h, _ = _central(fn, inputs, nudge, 2 * h)
        return d_h, rounding + np.abs(d_2h - d_h) / 3
    d_h, rounding = _central(fn, inputs, nudge, h)
    d = [d_h] + [_central(fn, inputs, nudge, h / 2 ** k)[0] for k in (1, 2, 3)]
    r1 = [(4 * fine - coarse) / 3 for coarse, fine in zip(d, d[1:])]
    r2 = [(16 * fine - coarse) / 15 for coarse, fine in zip(r1, r1[1:])]
    return r2[0], np.abs(r2[0] - r2[1]) + 6.6 * rounding


def _complex_step(fn, inputs, wrt, direction, h):
    """Im f(x + i·h·d) / h: no subtraction, so no cancellation. Its truncation, h²·|f‴|/6, is 0 at
    h = 1e-20; what is left is each op's own rounding, a few ulps (estimated as 4ε·|f′|).

    Runs fn on complex128 copies of the checked inputs, under no_grad: it needs ops whose
    forward is analytic (the analytic continuation: no abs, no comparisons, no rounding).
    """
    moved = {id(x): Tensor(backend.to_device(backend.to_numpy(x.array) + 1j * h * d, x.device))
             for x, d in zip(wrt, direction)}
    with no_grad():
        outputs = _outputs_of(fn, [moved.get(id(x), x) if isinstance(x, Tensor) else x for x in inputs])
    values = [backend.to_numpy(o.array).reshape(-1) for o in outputs]
    for o, v in zip(outputs, values):
        if v.dtype.kind != "c":
            raise TypeError(f"gradcheck (complex step): an output of shape {o.shape} came back {o.dtype}, not "
                            "complex: fn drops the imaginary part somewhere (a cast, abs, a comparison), so "
                            "it is not analytic there; use method='richardson' or 'central'")
    derivative = np.concatenate([v.imag for v in values] or [np.zeros(0)]) / h
    return derivative, 4 * _ULP * np.abs(derivative)


def _unit_direction(wrt, j, i):
    """The unit direction on element i (C order) of the j-th checked input, as one array per input."""
    direction = [np.zeros(x.shape) for x in wrt]
    direction[j].reshape(-1)[i] = 1.0
    return direction


def _numeric_derivative(fn, inputs, wrt, direction, method, h):
    """fn's outputs' derivative along ``direction`` (one host array per checked input), with its error estimate."""
    if method == "complex":
        return _complex_step(fn, inputs, wrt, direction, h)
    saved = [x.array.copy() for x in wrt]
    moves = [backend.to_device(d, x.device).astype(x.dtype) for x, d in zip(wrt, direction)]

    def nudge(s):
        for x, base, d in zip(wrt, saved, moves):
            x.array[...] = base + s * d if s else base

    return _derivative(fn, inputs, nudge, method, h)


def numerical_derivative(fn, inputs, tangents, method="central", eps=None):
    """The derivative of ``fn``'s outputs along ``tangents`` by one numerical method, and its error estimate.

    ``tangents`` has one array per input with ``requires_grad=True`` (the direction u);
    returns two host arrays over the outputs, flattened and concatenated: J·u, and the
    method's estimate of the error in each entry (see :func:`gradcheck` for the methods).
    No backward runs: this is the reference alone, to compare with anything.
    """
    inputs, wrt = _checked_inputs(inputs)
    tangents = [tangents] if isinstance(tangents, np.ndarray) else list(tangents)
    if len(tangents) != len(wrt) or any(np.shape(u) != x.shape for u, x in zip(tangents, wrt)):
        raise ValueError(f"numerical_derivative: expected one tangent per input that requires grad, shaped "
                         f"{[x.shape for x in wrt]}, got {[np.shape(u) for u in tangents]}")
    directions = [np.asarray(backend.to_numpy(u.array if isinstance(u, Tensor) else u), np.float64)
                  for u in tangents]
    return _numeric_derivative(fn, inputs, wrt, directions, method, _check_method(method, eps))


def _numeric_jacobian_column(fn, inputs, wrt, j, i, method, h):
    """Column i of the Jacobian with respect to the j-th checked input, d out / dx_i, and its error estimate."""
    if method == "complex":
        return _complex_step(fn, inputs, wrt, _unit_direction(wrt, j, i), h)
    x = wrt[j]
    at = np.unravel_index(i, x.shape)  # element i in C order, whatever x's memory layout
    original = x.array[at].item()

    def nudge(s):
        x.array[at] = original + s

    return _derivative(fn, inputs, nudge, method, h, truncation=False)


class GradcheckResult:
    """What a passing check saw; true in a boolean context (``assert mdl.gradcheck(...)`` works).

    ``method`` and ``eps`` (the step) say how the numerical reference was made;
    ``max_error`` is the largest |analytic − numeric| / max(|numeric|, 1) found;
    ``error_estimate`` is, on the same scale, the method's estimate of its own
    error: how far it can see. A backward wrong by less than that passes any
    check with this method, whatever the tolerance. ``tolerance`` is the bound
    max_error was held to when the method set its own (Richardson, complex step,
    no atol/rtol given: 8·error_estimate + 256 ulps), else None.
    """

    def __init__(self, method, eps, max_error, error_estimate, tolerance=None):
        self.method, self.eps = method, eps
        self.max_error, self.error_estimate = float(max_error), float(error_estimate)
        self.tolerance = None if tolerance is None else float(tolerance)

    def __bool__(self):
        return True

    def __repr__(self):
        own = "" if self.tolerance is None else f", tolerance={self.tolerance:.3g}"
        return (f"GradcheckResult(method={self.method!r}, eps={self.eps:g}, max_error={self.max_error:.3g}, "
                f"error_estimate={self.error_estimate:.3g}{own})")


def _describe(which, x, index, analytic, numeric, estimate):
    rel = abs(analytic - numeric) / max(abs(numeric), 1e-12)
    where = np.unravel_index(index, x.shape) if x.ndim else ()
    return (f"{which}: gradient mismatch for input {x.shape} at element {tuple(int(i) for i in where)}: "
            f"analytic {analytic:.10g}, numeric {numeric:.10g}, relative error {rel:.3g} "
            f"(the numeric value's own error is estimated at {estimate:.2g})")


def _jacobians(fn, inputs, wrt, method, eps):
    """Analytic and numeric Jacobians, one (outputs × input) matrix per checked input, and the numeric
    ones' error estimates (same shapes)."""
    outputs = _outputs_of(fn, inputs)
    sizes = [o.array.size for o in outputs]
    analytic = [np.zeros((sum(sizes), x.array.size)) for x in wrt]
    row = 0
    for out in outputs:
        for k in range(out.array.size):
            if out.requires_grad:  # an output cut from the graph has a zero analytic row
                seed = Tensor(out.xp.zeros(out.shape, out.dtype))
                seed.array.reshape(-1)[k] = 1.0
                grads = grad([out], wrt, grad_outputs=[seed], retain_graph=True, allow_unused=True)
                for j, g in enumerate(grads):
                    if g is not None:
                        analytic[j][row] = backend.to_numpy(g.array).reshape(-1)
            row += 1
    numeric = [np.zeros_like(a) for a in analytic]
    estimate = [np.zeros_like(a) for a in analytic]
    for j, x in enumerate(wrt):
        for i in range(x.array.size):
            numeric[j][:, i], estimate[j][:, i] = _numeric_jacobian_column(fn, inputs, wrt, j, i, method, eps)
    if method == "central" and numeric and numeric[0].size:
        # The truncation, once for every column: along a random ±1 direction u, whose third derivative
        # f‴[u, u, u] is each column's f‴ for an elementwise f and a sum over columns (an overestimate)
        # for a dense one. Per column it would double the cost of every check.
        signs = np.random.default_rng(0)
        u = [signs.choice([-1.0, 1.0], size=x.shape) for x in wrt]
        _, along = _numeric_derivative(fn, inputs, wrt, u, "central", eps)
        for e in estimate:
            e += along[:, None]  # along includes the rounding of u's direction: a bound, not a guess
    return analytic, numeric, estimate


def _directional(fn, inputs, wrt, method, eps, rng):
    """(vᵀ J u analytic, numeric, the numeric one's error estimate) for random u over the inputs and v over
    the outputs."""
    outputs = _outputs_of(fn, inputs)
    v = [Tensor(backend.to_device(rng.standard_normal(o.shape), o.device).astype(o.dtype)) for o in outputs]
    u = [rng.standard_normal(x.shape) for x in wrt]
    live = [(o, w) for o, w in zip(outputs, v) if o.requires_grad]  # the rest have zero gradient
    grads = (grad([o for o, _ in live], wrt, grad_outputs=[w for _, w in live], retain_graph=True,
                  allow_unused=True) if live else [])
    analytic = sum(float((backend.to_numpy(g.array) * d).sum()) for g, d in zip(grads, u) if g is not None)
    derivative, estimate = _numeric_derivative(fn, inputs, wrt, u, method, eps)
    weights = np.concatenate([backend.to_numpy(w.array).reshape(-1) for w in v] or [np.zeros(0)])
    return analytic, float(weights @ derivative), float(np.abs(weights) @ estimate)


def _scaled(error, numeric):
    """error / max(|numeric|, 1): the scale every check reports on (relative for large entries, absolute
    for small ones)."""
    return np.abs(error) / np.maximum(np.abs(numeric), 1.0)


def _measure(fn, inputs, method, eps, fast, seed):
    inputs, wrt = _checked_inputs(inputs)
    eps = _check_method(method, eps)
    if fast:
        a, n, e = _directional(fn, inputs, wrt, method, eps, np.random.default_rng(seed))
        return inputs, wrt, eps, [(np.array([[a]]), np.array([[n]]), np.array([[e]]))]
    return inputs, wrt, eps, list(zip(*_jacobians(fn, inputs, wrt, method, eps)))


def max_relative_error(fn, inputs, eps=None, fast=False, seed=0, method="central") -> float:
    """The largest |analytic − numeric| / max(|numeric|, 1) over every checked entry."""
    *_, checked = _measure(fn, inputs, method, eps, fast, seed)
    return max((_scaled(a - n, n).max(initial=0.0) for a, n, _ in checked), default=0.0)


# A method's own tolerance (``method="richardson"`` or ``"complex"`` with no atol or rtol given), on
# the scale of max_error (|error| / max(|numeric|, 1)): OWN_TOLERANCE_ESTIMATES times the method's largest
# error estimate, plus OWN_TOLERANCE_ULPS float64 ulps for the rounding of the analytic side itself (a
# backward's sums round too). Over the op cases a correct backward stays below 1/8 of it (Richardson) and
# 1/40 (complex step), measured; a backward wrong by a relative 1e-9 is tens of times over it (Richardson:
# about 2e-11 for x³ near |x| = 2) and thousands of times (complex step).
OWN_TOLERANCE_ESTIMATES = 8
OWN_TOLERANCE_ULPS = 256
PYTORCH_ATOL, PYTORCH_RTOL = 1e-5, 1e-3  # torch.autograd.gradcheck's defaults, kept for central differences


def own_tolerance(error_estimate: float) -> float:
    """The tolerance a method sets itself from its error estimate: 8·estimate + 256 ulps (see gradcheck)."""
    return OWN_TOLERANCE_ESTIMATES * error_estimate + OWN_TOLERANCE_ULPS * _ULP


def gradcheck(fn, inputs, eps=None, atol=None, rtol=None, fast=False, seed=0, method="central"):
    """Check ``fn``'s gradients against a numerical reference; a true GradcheckResult, or GradcheckError.

    ``fn(*inputs)`` returns a Tensor or a tuple of Tensors; every input with
    ``requires_grad=True`` (float64) is checked. ``fast=True`` checks one
    random directional derivative vᵀJu instead of the full Jacobian.

    ``method`` picks the reference (``eps`` its step, by default the method's own):

    - ``"central"`` (h = 1e-6): (f(x + h) − f(x − h)) / 2h, error O(h²) + O(ε/h), about 1e-10 here;
    - ``"richardson"`` (h = 1e-2): central differences at h, h/2, h/4 combined to
      cancel the h² and h⁴ terms, error O(h⁶) + O(ε/h), about 1e-13;
    - ``"complex"`` (h = 1e-20): the complex step Im f(x + ih) / h, exact to a few ulps
      (no subtraction) for fn analytic in its checked inputs: every op it calls takes
      complex128 and computes the analytic continuation (no abs, comparisons, rounding).

    The tolerance: with ``atol`` or ``rtol`` given, an entry passes when
    |analytic − numeric| ≤ atol + rtol·|numeric| (a missing one takes PyTorch's default,
    atol = 1e-5, rtol = 1e-3). With neither given, central differences use PyTorch's
    defaults, and Richardson and the complex step use their own: an entry passes when

        |analytic − numeric| / max(|numeric|, 1) ≤ 8·E + 256ε,

    E the method's error estimate (``error_estimate`` below) and ε = 2.2e-16, so that they
    catch what they can see (a backward wrong by a relative 1e-9 fails both), which
    PyTorch's defaults, made for central differences, would pass.

    The result's ``error_estimate`` is the method's estimate of its own error (on the scale of
    ``max_error``, |error| / max(|numeric|, 1)): a backward wrong by less cannot be told apart;
    ``tolerance`` is the method's own tolerance on that scale, or None when atol/rtol were used.
    """
    inputs, wrt, eps, checked = _measure(fn, inputs, method, eps, fast, seed)
    estimate = max((_scaled(e, n).max(initial=0.0) for _, n, e in checked), default=0.0)
    own = method != "central" and atol is None and rtol is None
    tolerance = own_tolerance(estimate) if own else None
    atol = PYTORCH_ATOL if atol is None else atol
    rtol = PYTORCH_RTOL if rtol is None else rtol
    for x, (a, n, e) in zip(wrt, checked):
        excess = _scaled(a - n, n) - tolerance if own else np.abs(a - n) - (atol + rtol * np.abs(n))
        if excess.size and excess.max() > 0:
            row, col = np.unravel_index(np.argmax(excess), excess.shape)
            allowed = (f"; the method's own tolerance is {tolerance:.2g} = 8 × its error estimate "
                       f"{estimate:.2g} + 256 ulps, on the scale |error| / max(|numeric|, 1)" if own else "")
            if fast:
                raise GradcheckError(f"gradcheck (fast, {method}): directional derivative vᵀJu analytic "
                                     f"{a[0, 0]:.10g}, numeric {n[0, 0]:.10g}, relative error "
                                     f"{abs(a[0, 0] - n[0, 0]) / max(abs(n[0, 0]), 1e-12):.3g} (the numeric "
                                     f"value's own error is estimated at {e[0, 0]:.2g}){allowed}")
            raise GradcheckError(_describe(f"gradcheck ({method}, output element {row})", x, col,
                                           a[row, col], n[row, col], e[row, col]) + allowed)
    max_error = max((_scaled(a - n, n).max(initial=0.0) for a, n, _ in checked), default=0.0)
    return GradcheckResult(method, eps, max_error, estimate, tolerance)


def gradgradcheck(fn, inputs, grad_outputs=None, eps=None, atol=None, rtol=None, fast=False, seed=0,
                  method="central"):
    """Check second derivatives: gradcheck of (x, v) ↦ vᵀ ∂fn/∂x built with create_graph=True.

    ``grad_outputs`` (the v, float64) defaults to fixed random tensors. Both
    arguments are checked, as in PyTorch: the derivative with respect to x is
    the Hessian-vector product that higher-order methods (AdaHessian) rely
    on; the one with respect to v checks that the recorded backward is the
    gradient itself (for a piecewise-linear op like relu, where the first is
    zero, the second is not). ``method`` is ``"central"`` or ``"richardson"``
    (the complex step would need every backward to run on complex numbers); the
    tolerances default as in :func:`gradcheck`.
    """
    if method == "complex":
        raise ValueError("gradgradcheck: method='complex' is not supported (the backward it would "
                         "differentiate runs mdl.grad on the real inputs); use 'central' or 'richardson'")
    inputs, wrt = _checked_inputs(inputs)
    if grad_outputs is None:
        rng = np.random.default_rng(seed + 1)
        with no_grad():
            outs = _outputs_of(fn, inputs)
        grad_outputs = [backend.to_device(rng.standard_normal(o.shape), o.device).astype(o.dtype) for o in outs]
    vs = [Tensor(v.array if isinstance(v, Tensor) else v, requires_grad=True) for v in grad_outputs]
    n = len(inputs)

    def first_derivative(*args):
        outs = _outputs_of(fn, args[:n])
        grads = grad(outs, wrt, grad_outputs=list(args[n:]), create_graph=True, allow_unused=True)
        return tuple(g for g in grads if g is not None)

    return gradcheck(first_derivative, list(inputs) + vs, eps=eps, atol=atol, rtol=rtol, fast=fast, seed=seed,
                     method=method)


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
    forward = [backend.to_numpy(u.array) * backend.to_numpy(jv.array) for u, jv in zip(us, jvs) if jv is not None]
    reverse = [backend.to_numpy(g.array) * backend.to_numpy(v.array) for g, v in zip(jtus, vs) if g is not None]
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
    analytic = [np.zeros(o.shape) if jv is None else backend.to_numpy(jv.array) for o, jv in zip(outputs, jvs)]
    saved = [x.array.copy() for x in wrt]

    def moved(sign):
        for x, base, v in zip(wrt, saved, vs):
            x.array[...] = base + sign * eps * v
        return [backend.to_numpy(o.array).copy() for o in _outputs_of(fn, inputs)]  # fn may need the graph

    try:
        numeric = [(p - m) / (2 * eps) for p, m in zip(moved(+1), moved(-1))]
    finally:
        for x, base in zip(wrt, saved):
            x.array[...] = base
    return max((float((np.abs(a - n) / np.maximum(np.abs(n), 1.0)).max(initial=0.0))
                for a, n in zip(analytic, numeric)), default=0.0)


def forward_mode_errors(fn, inputs, eps=1e-6, seed=0) -> tuple:
    """(adjoint_error, tangent_error) of one case: what ``minidl gradcheck --adjoint`` prints for each op."""
    return adjoint_error(fn, inputs, seed), tangent_error(fn, inputs, eps, seed)



# ---------------------------------------------------------------- the error against the step
class ErrorSweep:
    """The numerical derivative's relative error against the step h, with the theory's lines.

    ``steps`` runs from 1e-1 down to 1e-13; ``central``, ``richardson`` and ``complex``
    (None where fn is not analytic) are |numeric − analytic| / |analytic| at each step,
    for one random directional derivative vᵀJu (the analytic value from the backward).
    ``truncation`` = |g‴|·h²/6 / |g′| and ``rounding`` = ε·Σ|v||f| / h / |g′| are the two
    terms of the central difference's error, with g(t) = vᵀf(x + t·u); they cross at
    ``best_step`` = (3ε·Σ|v||f| / |g‴|)^(1/3), where the error is smallest.
    """

    def __init__(self, name, steps, central, richardson, complex_, truncation, rounding, best_step):
        self.name, self.steps = name, steps
        self.central, self.richardson, self.complex = central, richardson, complex_
        self.truncation, self.rounding, self.best_step = truncation, rounding, best_step

    def __repr__(self):
        best = int(np.argmin(self.central))
        return (f"ErrorSweep({self.name!r}: central smallest {self.central[best]:.2g} at h={self.steps[best]:.0e}, "
                f"theory's best h {self.best_step:.1e})")


def error_sweep(fn, inputs, steps=None, seed=0, name="f", complex_step=True) -> ErrorSweep:
    """Central differences, Richardson and the complex step at every step in ``steps`` (default
    1e-1 to 1e-13, four per decade), against the backward's vᵀJu for random u and v (``seed``).

    ``complex_step=False`` leaves the complex step out (for fn known not to be analytic: one
    that drops the imaginary part is detected and left out anyway, but one that keeps it
    through |x| or a comparison would give a wrong curve, not an error)."""
    inputs, wrt = _checked_inputs(inputs)
    steps = np.logspace(-1, -13, 49) if steps is None else np.asarray(steps, dtype=np.float64)
    rng = np.random.default_rng(seed)
    outputs = _outputs_of(fn, inputs)
    v = [rng.standard_normal(o.shape) for o in outputs]
    u = [rng.standard_normal(x.shape) for x in wrt]
    live = [(o, w) for o, w in zip(outputs, v) if o.requires_grad]
    grads = grad([o for o, _ in live], wrt, allow_unused=True, retain_graph=True,
                 grad_outputs=[Tensor(backend.to_device(w, o.device).astype(o.dtype)) for o, w in live])
    exact = sum(float((backend.to_numpy(g.array) * d).sum()) for g, d in zip(grads, u) if g is not None)
    if exact == 0:
        raise ValueError(f"error_sweep: the directional derivative of {name} is 0 at these inputs; a relative "
                         "error means nothing there (try another seed or inputs)")
    weights = np.concatenate([w.reshape(-1) for w in v])
    saved = [x.array.copy() for x in wrt]
    moves = [backend.to_device(d, x.device).astype(x.dtype) for x, d in zip(wrt, u)]

    def g(t):  # vᵀ f(x + t·u)
        for x, base, d in zip(wrt, saved, moves):
            x.array[...] = base + t * d if t else base
        return float(weights @ _flat_outputs(fn, inputs))

    def central(h):
        return (g(h) - g(-h)) / (2 * h)

    def richardson(h):
        d = [central(h / 2 ** k) for k in range(3)]
        r1 = [(4 * fine - coarse) / 3 for coarse, fine in zip(d, d[1:])]
        return (16 * r1[1] - r1[0]) / 15

    def relative(values):
        return np.abs(np.asarray(values) - exact) / abs(exact)

    try:
        magnitude = float(np.abs(weights) @ np.abs(_flat_outputs(fn, inputs)))
        a = 1e-2  # g‴(0) by (g(2a) − 2g(a) + 2g(−a) − g(−2a)) / 2a³, error O(a²)
        third = abs(g(2 * a) - 2 * g(a) + 2 * g(-a) - g(-2 * a)) / (2 * a ** 3)
        errors_central = relative([central(h) for h in steps])
        errors_richardson = relative([richardson(h) for h in steps])
    finally:
        g(0.0)
    try:
        if not complex_step:
            raise TypeError("not analytic")
        errors_complex = relative([float(weights @ _complex_step(fn, inputs, wrt, u, h)[0]) for h in steps])
    except TypeError:  # not analytic: the complex step does not apply
        errors_complex = None
    truncation = third * steps ** 2 / 6 / abs(exact)
    rounding = _ULP * magnitude / steps / abs(exact)
    best = (3 * _ULP * magnitude / third) ** (1 / 3) if third > 0 else float("nan")
    return ErrorSweep(name, steps, errors_central, errors_richardson, errors_complex, truncation, rounding, best)


def plot_error_sweep(sweep: ErrorSweep, path=None, ax=None):
    """Draw the sweep on log-log axes: central differences' V between its two theory lines, Richardson and
    the complex step. Writes a PNG to ``path`` when given (complete or not at all). Returns the figure."""
    if ax is None:
        from matplotlib.figure import Figure  # a bare Figure: no pyplot, no GUI backend needed
        figure = Figure(figsize=(8.6, 4.4), layout="constrained")
        ax = figure.subplots()
    figure = ax.figure
    floor = _ULP / 10  # an error of exactly 0 drawn at the bottom of the axes, not dropped
    h = sweep.steps
    ax.loglog(h, np.maximum(sweep.central, floor), "o-", color="C0", ms=3, label="central difference")
    ax.loglog(h, np.maximum(sweep.richardson, floor), "s-", color="C2", ms=3, label="Richardson (h, h/2, h/4)")
    if sweep.complex is not None:
        ax.loglog(h, np.maximum(sweep.complex, floor), "^-", color="C3", ms=3, label="complex step")
    ax.loglog(h, sweep.truncation, "--", color="0.45", label="truncation |f‴|h²/6")
    ax.loglog(h, sweep.rounding, ":", color="0.3", label="rounding ε|f|/h")
    if np.isfinite(sweep.best_step):
        ax.axvline(sweep.best_step, color="0.6", lw=0.8)
        ax.annotate(f"best h ≈ {sweep.best_step:.0e}", (sweep.best_step, 1e-2), fontsize=8, ha="left",
                    xytext=(4, 0), textcoords="offset points", color="0.35")
    ax.set_ylim(floor / 2, 3)
    ax.set_xlim(h.max() * 2, h.min() / 2)  # the step shrinks from left to right, as one tries smaller steps
    ax.set_xlabel("step h")
    ax.set_ylabel("relative error of the derivative")
    ax.set_title(f"numerical derivative of {sweep.name}: error against step")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))
    if path is not None:
        from minidl.serialization import atomic_write
        atomic_write(path, lambda tmp: figure.savefig(tmp, format="png", dpi=110))
    return figure


def sweep_op_case(name, out_dir, seed=0):
    """The error sweep of the op case ``name`` (minidl.op_cases), drawn to ``out_dir``/sweep_<name>.png.

    The complex step is drawn only for the cases it can check (minidl.op_cases.NOT_ANALYTIC says which
    not, and why). Returns the ErrorSweep and the path written.
    """
    import os

    from minidl.op_cases import NOT_ANALYTIC, cases

    found = {case[0]: case for case in cases(seed)}
    if name not in found:
        raise ValueError(f"error sweep: no op case named {name!r} in minidl.op_cases")
    _, fn, inputs = found[name]
    sweep = error_sweep(fn, inputs, seed=seed, name=name, complex_step=name not in NOT_ANALYTIC)
    path = os.path.join(out_dir, f"sweep_{name}.png")
    plot_error_sweep(sweep, path)
    return sweep, path
