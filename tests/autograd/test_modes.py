"""Grad modes (minidl.autograd.modes): no_grad, enable_grad, set_grad_enabled."""
import numpy as np
import pytest

import minidl as mdl
from tests.autograd._helpers import f64


# ---------------------------------------------------------------- grad modes
def test_no_grad_builds_no_graph():
    x = f64([1.0, 2.0])
    with mdl.no_grad():
        assert not mdl.is_grad_enabled()
        y = (x * 2).exp().sum()
    assert y.creator is None and not y.requires_grad
    assert mdl.is_grad_enabled()


def test_enable_grad_inside_no_grad():
    x = f64([1.0, 2.0])
    with mdl.no_grad():
        with mdl.enable_grad():
            y = (x * x).sum()
        z = x * 2
    assert y.requires_grad and y.creator is not None and z.creator is None
    y.backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 4.0])


def test_set_grad_enabled_restores_the_mode_after_an_exception():
    with pytest.raises(KeyError):
        with mdl.set_grad_enabled(False):
            raise KeyError
    assert mdl.is_grad_enabled()


def test_no_grad_as_a_decorator():
    @mdl.no_grad()
    def infer(x):
        return x * 2

    assert infer(f64([1.0])).creator is None
