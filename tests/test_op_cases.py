"""Every op listed in minidl.op_cases (what `minidl gradcheck` runs) passes gradcheck and gradgradcheck,
and its backward is one formula: the gradient recorded for create_graph is the plain one. Its tangent
rule (forward mode) passes the adjoint test against its backward and agrees with central differences."""
import numpy as np
import pytest

import minidl as mdl
from minidl.op_cases import cases
from minidl.tensor import Tensor

ALL = cases()
IDS = [c[0] for c in ALL]


@pytest.mark.parametrize("name,fn,inputs", ALL, ids=IDS)
def test_gradcheck(name, fn, inputs):
    assert mdl.gradcheck(fn, inputs)


@pytest.mark.parametrize("name,fn,inputs", ALL, ids=IDS)
def test_gradgradcheck(name, fn, inputs):
    """Second derivatives with respect to the inputs and to the upstream gradient v (never trivially zero)."""
    assert mdl.gradgradcheck(fn, inputs)


@pytest.mark.parametrize("name,fn,inputs", ALL, ids=IDS)
def test_recorded_gradient_equals_plain_gradient(name, fn, inputs):
    """mdl.grad with create_graph=True runs the same backward as without: the same numbers."""
    outputs = fn(*inputs)
    outputs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    wrt = [x for x in inputs if isinstance(x, Tensor) and x.requires_grad]
    rng = np.random.default_rng(1)
    vs = [Tensor(rng.standard_normal(o.shape)) for o in outputs]
    plain = mdl.grad(outputs, wrt, grad_outputs=vs, retain_graph=True, allow_unused=True)
    recorded = mdl.grad(outputs, wrt, grad_outputs=vs, create_graph=True, allow_unused=True)
    for p, r in zip(plain, recorded):
        assert (p is None) == (r is None)
        if p is not None:
            np.testing.assert_allclose(r.numpy(), p.numpy(), rtol=1e-12, atol=1e-14)


def test_every_functional_op_has_a_case():
    """Adding an op to minidl.functional without a gradcheck case fails here."""
    import minidl.functional as F
    covered = set(IDS) | {"gelu", "getitem", "flatten", "one_hot"}
    covered |= {"argmax", "argmin", "any", "all", "argsort", "nonzero"}  # integer or boolean results
    covered |= set(mdl.ops.math.BOOLEAN_RESULTS)  # no gradient to check: tested in tests/ops/test_math.py
    missing = [name for name in F.__all__ if name not in covered]
    assert not missing, f"ops without a case in minidl/op_cases.py: {missing}"


def _function_classes(base):
    for cls in base.__subclasses__():
        yield cls
        yield from _function_classes(cls)


def test_every_op_function_is_run_by_a_case():
    """Each Function in minidl.ops (gradient ops included) runs, forward and backward, in some case:
    so a wrong backward of any of them fails gradcheck above."""
    from minidl.autograd import Function, FunctionHook

    class Census(FunctionHook):
        def __init__(self):
            self.forward, self.backward = set(), set()

        def forward_preprocess(self, function, inputs):
            self.forward.add(type(function))

        def backward_preprocess(self, function, grad_outputs):
            self.backward.add(type(function))

    census = Census()
    with census:
        for _, fn, inputs in cases():
            outputs = fn(*inputs)
            outputs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
            wrt = [x for x in inputs if isinstance(x, Tensor) and x.requires_grad]
            gs = mdl.grad(outputs, wrt, grad_outputs=[Tensor(np.ones(o.shape)) for o in outputs],
                          create_graph=True, allow_unused=True)
            live = [g for g in gs if g is not None and g.requires_grad]
            if live:  # second order: runs the gradient ops' own backward
                mdl.grad(live, wrt, grad_outputs=[Tensor(np.ones(g.shape)) for g in live], allow_unused=True)
    ops = {cls for cls in _function_classes(Function)
           if cls.__module__.startswith("minidl.ops.") and "backward" in vars(cls)}
    assert ops, "no Function classes found in minidl.ops"
    not_run = sorted(cls.__qualname__ for cls in ops - census.forward)
    no_backward = sorted(cls.__qualname__ for cls in ops - census.backward)
    assert not not_run, f"ops never called by a case in minidl/op_cases.py: {not_run}"
    assert not no_backward, f"ops whose backward no case runs: {no_backward}"


# ---------------------------------------------------------------- forward mode: tangent rules
# The Function classes of minidl.ops whose tangent rule (jvp) is still to be written: the one list to
# empty. The census below fails when a class is missing from it or listed without need, and every
# adjoint and tangent test that reaches one of these is skipped by its name, nothing else.
def _op_classes():
    """Every Function class of minidl.ops with a backward of its own or inherited (gradient ops included)."""
    from minidl.autograd import Function
    return {cls for cls in _function_classes(Function)
            if cls.__module__.startswith("minidl.ops.") and cls.backward is not Function.backward}


@pytest.mark.parametrize("name,fn,inputs", ALL, ids=IDS)
def test_adjoint(name, fn, inputs):
    """⟨u, J v⟩ from the tangent rules equals ⟨Jᵀu, v⟩ from the backward to ADJOINT_ULPS (32) ulps of the
    products' size S = max(Σ|uᵢ (Jv)ᵢ|, Σ|(Jᵀu)ⱼ vⱼ|), for random u and v in float64 (see
    minidl.gradcheck.adjoint_error). Measured: at most 1.1 ulps over the op cases; a backward off by a
    relative 1e-9 is millions of ulps away (test_adjoint_test_sees_what_central_differences_cannot)."""
    from minidl.gradcheck import ADJOINT_ULPS, adjoint_error
    errors = [adjoint_error(fn, inputs, seed=seed) for seed in (0, 1)]
    assert max(errors) <= ADJOINT_ULPS, errors


@pytest.mark.parametrize("name,fn,inputs", ALL, ids=IDS)
def test_jvp_agrees_with_central_differences(name, fn, inputs):
    """J v from the tangent rules against (f(x + εv) − f(x − εv)) / 2ε: so a pair of rules that agree
    with each other in the adjoint test are also the derivative (measured: at most 2e-9 relative)."""
    from minidl.gradcheck import tangent_error
    error = tangent_error(fn, inputs)
    assert error <= 1e-6


def test_census_every_op_has_a_tangent_rule():
    """Every Function class in minidl.ops (gradient ops included) defines jvp."""
    from minidl.autograd import Function
    ops = _op_classes()
    assert ops, "no Function classes found in minidl.ops"
    missing = {cls.__name__ for cls in ops if cls.jvp is Function.jvp}
    assert not missing, f"ops without a tangent rule (jvp): {sorted(missing)}"


def test_census_every_tangent_rule_is_run_by_a_case():
    """Each op's jvp runs in some case (the gradient ops' through a backward recorded in forward mode),
    so a wrong tangent rule fails test_adjoint above."""
    from minidl.autograd import ForwardMode

    class Recording(ForwardMode):
        def __init__(self):
            super().__init__()
            self.ran = set()

        def forward_postprocess(self, function, inputs, outputs):
            if outputs is not None and any(self.tangent(x) is not None for x in inputs):
                self.ran.add(type(function))
            super().forward_postprocess(function, inputs, outputs)

    ran = set()
    for _, fn, inputs in cases():
        wrt = [x for x in inputs if isinstance(x, Tensor) and x.requires_grad]
        level = Recording()
        with level:
            for x in wrt:
                level.attach(x, Tensor(np.ones(x.shape)))
            outputs = fn(*inputs)
            outputs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
            live = [o for o in outputs if o.requires_grad]
            if live:  # the backward's ops, gradient ops included, carry the tangents too
                mdl.grad(live, wrt, grad_outputs=[Tensor(np.ones(o.shape)) for o in live], create_graph=True,
                         allow_unused=True)
        ran |= level.ran
    never = sorted(cls.__qualname__ for cls in _op_classes() - ran)
    assert not never, f"ops whose tangent rule no case runs: {never}"


def test_adjoint_test_sees_what_central_differences_cannot():
    """A backward multiplied by (1 + 1e-9) passes gradcheck (central differences agree to ~1e-9 at
    best) and fails the adjoint test by millions of ulps; the correct op passes both."""
    from minidl.gradcheck import GradcheckError, adjoint_check, adjoint_error
    from minidl.ops.activation import Tanh

    class OffByOnePartPerBillion(Tanh):
        def backward(self, gy):
            return super().backward(gy) * (1 + 1e-9)

    x = Tensor(np.random.default_rng(3).standard_normal((3, 4)), requires_grad=True)
    assert adjoint_check(lambda x: Tanh()(x) * x, [x])
    planted = lambda x: OffByOnePartPerBillion()(x) * x  # noqa: E731
    assert mdl.gradcheck(planted, [x])
    assert adjoint_error(planted, [x]) > 1e5
    with pytest.raises(GradcheckError, match="adjoint test"):
        adjoint_check(planted, [x])


# ---------------------------------------------------------------- the complex step over the op cases
from minidl.op_cases import NOT_ANALYTIC, PIECEWISE_ANALYTIC, complex_step_status  # noqa: E402

COMPLEX = [c for c in ALL if c[0] not in NOT_ANALYTIC]
NOT_COMPLEX = [c for c in ALL if c[0] in NOT_ANALYTIC]


@pytest.mark.parametrize("name,fn,inputs", COMPLEX, ids=[c[0] for c in COMPLEX])
def test_complex_step(name, fn, inputs):
    """The backward agrees with Im f(x + ih)/h, h = 1e-20, to 1e-13 relative (|error| ≤ 1e-13·max(|J|, 1))."""
    result = mdl.gradcheck(fn, inputs, method="complex", atol=1e-13, rtol=1e-13)
    assert result.error_estimate < 1e-13
    assert mdl.gradcheck(fn, inputs, method="complex").tolerance < 1e-13   # and at the method's own tolerance


@pytest.mark.parametrize("name,fn,inputs", COMPLEX, ids=[c[0] for c in COMPLEX])
def test_richardson_at_its_own_tolerance(name, fn, inputs):
    """Every analytic op case passes Richardson extrapolation with no tolerance given (8·estimate + 256 ulps,
    1e-12 to 1e-8 by the case): the default that fails a backward wrong by 1e-9 passes every correct one."""
    result = mdl.gradcheck(fn, inputs, method="richardson")
    assert result.tolerance is not None and result.max_error <= result.tolerance


def test_complex_step_census():
    """Every op case is analytic, piecewise analytic or listed as not analytic with its reason; no stale names.
    The ops the complex step must cover (elementwise math, matmul, linear, conv, sums and means, softmax,
    log-softmax, tanh, sigmoid, GELU's erf form, layer norm, attention) are not on the list."""
    names = set(IDS)
    assert not (set(NOT_ANALYTIC) | PIECEWISE_ANALYTIC) - names, "a name in minidl/op_cases.py is no op case"
    assert not set(NOT_ANALYTIC) & PIECEWISE_ANALYTIC
    assert all(len(reason) > 20 for reason in NOT_ANALYTIC.values())
    required = {"add", "sub", "mul", "div", "neg", "pow", "exp", "log", "sqrt", "sin", "cos", "tan", "erf",
                "matmul", "linear", "conv1d", "conv2d", "conv3d", "conv_transpose2d", "sum", "mean", "softmax",
                "log_softmax", "tanh", "sigmoid", "gelu", "layer_norm", "scaled_dot_product_attention",
                "scaled_dot_product_attention_causal", "scaled_dot_product_attention_float_mask"}
    assert {n: complex_step_status(n) for n in required} == dict.fromkeys(required, "analytic")
    print(f"\n{len(COMPLEX)} of {len(ALL)} op cases under the complex step; the rest:")
    for name in sorted(NOT_ANALYTIC):
        print(f"  {name}: {NOT_ANALYTIC[name]}")


@pytest.mark.parametrize("name,fn,inputs", NOT_COMPLEX, ids=[c[0] for c in NOT_COMPLEX])
def test_complex_step_cannot_check_the_listed_cases(name, fn, inputs):
    """Each case listed as not analytic really defeats the complex step (it is refused, or it disagrees):
    so the list says why, and an op made analytic later must leave it."""
    try:
        result = mdl.gradcheck(fn, inputs, method="complex", atol=1e-13, rtol=1e-13)
    except (TypeError, ValueError, mdl.GradcheckError):
        return
    pytest.fail(f"{name} passes the complex step ({result}); move it out of NOT_ANALYTIC")
