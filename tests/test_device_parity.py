"""CPU against "cuda" (the CuPy stand-in without a GPU, the GPU with one): every op case gives the
same values and gradients on both devices, so every op's CuPy path runs on every CI run."""
import functools

import numpy as np
import pytest

import minidl as mdl
from minidl import backend
from minidl.op_cases import cases
from minidl.tensor import Tensor

ALL = cases()
IDS = [c[0] for c in ALL]
# Cases that draw random numbers: each device has its own generator, so the two runs differ by design.
RANDOM = {name for name in IDS if "dropout" in name}


def _on(value, device):
    if isinstance(value, Tensor):
        return mdl.tensor(value.data, requires_grad=value.requires_grad, device=device)
    if isinstance(value, np.ndarray):
        return backend.to_device(value, device)
    return value


def _case_on(fn, device):
    """``fn`` with the arrays and Tensors it closes over (targets, masks, weights) moved to ``device``."""
    if isinstance(fn, functools.partial):
        return functools.partial(_case_on(fn.func, device), *[_on(a, device) for a in fn.args],
                                 **{k: _on(v, device) for k, v in fn.keywords.items()})
    for cell in getattr(fn, "__closure__", None) or ():
        value = cell.cell_contents
        if isinstance(value, (Tensor, np.ndarray)):
            cell.cell_contents = _on(value, device)
        elif callable(value) and getattr(value, "__module__", None) == "minidl.op_cases":
            _case_on(value, device)
    if getattr(fn, "__defaults__", None):
        fn.__defaults__ = tuple(_on(v, device) for v in fn.__defaults__)
    if getattr(fn, "__kwdefaults__", None):
        fn.__kwdefaults__ = {k: _on(v, device) for k, v in fn.__kwdefaults__.items()}
    return fn


def _run(fn, inputs, seed=1):
    """Outputs, and the first and second derivatives along fixed random directions, as NumPy arrays."""
    outputs = fn(*inputs)
    outputs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    wrt = [x for x in inputs if isinstance(x, Tensor) and x.requires_grad]
    rng = np.random.default_rng(seed)
    vs = [mdl.tensor(rng.standard_normal(o.shape).astype(o.dtype), device=o.device) for o in outputs]
    differentiable = [(o, v) for o, v in zip(outputs, vs) if o.requires_grad]
    values = [o.numpy() for o in outputs]
    if not differentiable:
        return values, [], []
    grads = mdl.grad([o for o, _ in differentiable], wrt, grad_outputs=[v for _, v in differentiable],
                     create_graph=True, allow_unused=True)
    live = [g for g in grads if g is not None and g.requires_grad]
    second = []
    if live:
        us = [mdl.tensor(rng.standard_normal(g.shape).astype(g.dtype), device=g.device) for g in live]
        second = mdl.grad(live, wrt, grad_outputs=us, allow_unused=True)
    as_numpy = lambda gs: [None if g is None else g.numpy() for g in gs]  # noqa: E731
    return values, as_numpy(grads), as_numpy(second)


@pytest.mark.parametrize("case", range(len(ALL)), ids=IDS)
def test_op_case_gives_the_same_values_and_gradients_on_cuda(case, standin_or_gpu):
    name, _, _ = ALL[case]
    # fresh cases for each device: a case may keep state (a fixed mask, a closed-over array)
    _, fn, inputs = cases()[case]
    cpu = _run(fn, inputs)
    _, fn, inputs = cases()[case]
    cuda = _run(_case_on(fn, "cuda"), [_on(x, "cuda") for x in inputs])
    for part, (a, b) in zip(("values", "gradients", "second derivatives"), zip(cpu, cuda)):
        assert len(a) == len(b), f"{name}: {part} differ in number"
        for x, y in zip(a, b):
            assert (x is None) == (y is None), f"{name}: {part}: None on one device only"
            if x is None:
                continue
            assert x.shape == y.shape and x.dtype == y.dtype, \
                f"{name}: {part}: {x.shape} {x.dtype} vs {y.shape} {y.dtype}"
            if name not in RANDOM:
                np.testing.assert_allclose(y, x, rtol=1e-9, atol=1e-12, err_msg=f"{name}: {part}")
