"""Every op listed in minidl.op_cases (what `minidl gradcheck` runs) passes gradcheck and gradgradcheck."""
import pytest

import minidl as mdl
from minidl.op_cases import cases

ALL = cases()
PIECEWISE_LINEAR = {"abs", "clip", "maximum", "minimum", "where", "relu", "leaky_relu", "max", "min",
                    "max_pool2d", "l1_loss", "getitem", "reshape", "transpose", "broadcast_to", "concatenate",
                    "stack", "pad", "add", "sub", "neg", "sum", "mean", "embedding", "avg_pool2d"}


@pytest.mark.parametrize("name,fn,inputs", ALL, ids=[c[0] for c in ALL])
def test_gradcheck(name, fn, inputs):
    assert mdl.gradcheck(fn, inputs)


# Piecewise-linear ops have a zero second derivative almost everywhere: nothing to compare.
SMOOTH = [c for c in ALL if c[0] not in PIECEWISE_LINEAR]


@pytest.mark.parametrize("name,fn,inputs", SMOOTH, ids=[c[0] for c in SMOOTH])
def test_gradgradcheck(name, fn, inputs):
    assert mdl.gradgradcheck(fn, inputs)


def test_every_functional_op_has_a_case():
    """Adding an op to minidl.functional without a gradcheck case fails here."""
    import minidl.functional as F
    covered = {c[0] for c in ALL} | {"gelu", "getitem", "flatten"}
    missing = [name for name in F.__all__ if name not in covered]
    assert not missing, f"ops without a case in minidl/op_cases.py: {missing}"
