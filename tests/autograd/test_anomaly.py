"""Anomaly detection (minidl.autograd.anomaly): the first NaN or Inf, named by the line that made its op."""
import inspect
import os

import numpy as np
import pytest

import minidl as mdl
from minidl.autograd import anomaly, function_hooks
from tests.autograd._helpers import f64


# ---------------------------------------------------------------- anomaly detection
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_forward_nan_names_the_op_and_the_users_line():
    x = f64([-1.0, 1.0])
    with mdl.detect_anomaly():
        line = inspect.currentframe().f_lineno + 2
        with pytest.raises(mdl.AnomalyError) as info:
            x.log()
    message = str(info.value)
    assert "Log" in message and "forward" in message
    assert f"{os.path.basename(__file__)}:{line}" in message


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_backward_inf_names_the_op_and_the_line_that_created_it():
    x = f64([0.0, 4.0])
    with mdl.detect_anomaly():
        line = inspect.currentframe().f_lineno + 1
        y = x.sqrt()
        with pytest.raises(mdl.AnomalyError) as info:
            y.sum().backward()
    message = str(info.value)
    assert "Sqrt" in message and "backward" in message
    assert f"{os.path.basename(__file__)}:{line}" in message


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_without_anomaly_detection_nan_passes_silently_and_the_mode_is_restored():
    with pytest.raises(mdl.AnomalyError):
        with mdl.detect_anomaly():
            f64([0.0]).log()
    with np.errstate(all="ignore"):
        y = f64([-1.0]).log()
    assert np.isnan(y.item())


def test_anomaly_mode_does_not_disturb_a_clean_backward():
    x = f64([1.0, 2.0])
    with mdl.detect_anomaly():
        (x.exp() * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.exp([1.0, 2.0]) * (1 + np.array([1.0, 2.0])))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_anomaly_mode_around_backward_only_says_the_op_was_made_outside():
    x = f64([0.0, 4.0])
    y = x.sqrt()  # made before the block: its creation was not seen
    with mdl.detect_anomaly():
        with mdl.detect_anomaly():  # nested blocks check once
            assert sum(isinstance(h, anomaly._AnomalyCheck) for h in function_hooks.active) == 1
        with pytest.raises(mdl.AnomalyError) as info:
            y.sum().backward()
    message = str(info.value)
    assert "Sqrt" in message and "backward" in message
    assert "created outside detect_anomaly(); wrap the forward pass too to see where" in message
    assert os.path.basename(__file__) not in message  # the backward line is not named as where Sqrt was made
    assert function_hooks.active == ()
