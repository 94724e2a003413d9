"""Every op listed in minidl.op_cases (what `minidl gradcheck` runs) passes gradcheck and gradgradcheck,
and its backward is one formula: the gradient recorded for create_graph is the plain one."""
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


# ---------------------------------------------------------------- the complex step over the op cases
from minidl.op_cases import NOT_ANALYTIC, PIECEWISE_ANALYTIC, complex_step_status  # noqa: E402

COMPLEX = [c for c in ALL if c[0] not in NOT_ANALYTIC]
NOT_COMPLEX = [c for c in ALL if c[0] in NOT_ANALYTIC]


@pytest.mark.parametrize("name,fn,inputs", COMPLEX, ids=[c[0] for c in COMPLEX])
def test_complex_step(name, fn, inputs):
    """The backward agrees with Im f(x + ih)/h, h = 1e-20, to 1e-13 relative (|error| ≤ 1e-13·max(|J|, 1))."""
    result = mdl.gradcheck(fn, inputs, method="complex", atol=1e-13, rtol=1e-13)
    assert result.error_estimate < 1e-13


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
