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
