"""FunctionHook (minidl.autograd.function_hooks): around every op call, node backward and walk."""
import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from minidl.autograd import Function, function_hooks
from tests.autograd._helpers import f64


# ---------------------------------------------------------------- the hook point (FunctionHook)
class Recorder(mdl.FunctionHook):
    """Logs every call the engine makes to it, with the op's name."""

    def __init__(self, name="hook", log=None):
        self.name = name
        self.log = [] if log is None else log

    def forward_preprocess(self, function, inputs):
        self.log.append((self.name, "forward_pre", type(function).__name__, inputs))

    def forward_postprocess(self, function, inputs, outputs):
        self.log.append((self.name, "forward_post", type(function).__name__, outputs))

    def backward_preprocess(self, function, grad_outputs):
        self.log.append((self.name, "backward_pre", type(function).__name__, grad_outputs))

    def backward_postprocess(self, function, grad_outputs, grad_inputs):
        self.log.append((self.name, "backward_post", type(function).__name__, grad_inputs))


def outside_backwards(log):
    """The events not made by ops running inside a node's backward."""
    kept, depth = [], 0
    for event in log:
        if event[1] == "backward_post":
            depth -= 1
        if depth == 0:
            kept.append(event)
        if event[1] == "backward_pre":
            depth += 1
    assert depth == 0  # every backward_pre was closed
    return kept


def test_a_hook_sees_each_forward_and_each_backward_in_order():
    x, w = f64([1.0, 2.0]), f64([3.0, -1.0])
    with Recorder() as hook:
        y = x * w
        loss = y.sum()
        loss.backward()
    events = outside_backwards(hook.log)
    assert [(kind, op) for _, kind, op, _ in events] == [
        ("forward_pre", "Mul"), ("forward_post", "Mul"), ("forward_pre", "Sum"), ("forward_post", "Sum"),
        ("backward_pre", "Sum"), ("backward_post", "Sum"), ("backward_pre", "Mul"), ("backward_post", "Mul")]
    (a, b), (c,) = events[0][3], events[2][3]
    assert a is x and b is w and events[1][3] is y and c is y and events[3][3] is loss
    np.testing.assert_array_equal(events[4][3][0].numpy(), 1.0)  # d loss / d loss
    np.testing.assert_array_equal(events[6][3][0].numpy(), [1.0, 1.0])  # d loss / d y
    gx, gw = events[7][3]
    np.testing.assert_array_equal(gx.numpy(), w.numpy())  # d Σ x·w / dx = w
    np.testing.assert_array_equal(gw.numpy(), x.numpy())
    # the ops a backward computes with are seen, between that node's two events
    inside = [event for event in hook.log if not any(event is kept for kept in events)]
    assert inside and all(kind.startswith("forward") for _, kind, _, _ in inside)


class DoubleThroughAnOp(Function):
    """y = 2x, computed in forward by calling another op: that op is part of this one."""

    def forward(self, x):
        return (mdl.tensor(x) * 2.0).array

    def backward(self, gy):
        return gy * 2.0


def test_ops_run_inside_a_forward_are_part_of_that_op():
    with Recorder() as hook:
        y = DoubleThroughAnOp()(f64([1.5]))
    assert [(kind, op) for _, kind, op, _ in hook.log] == [
        ("forward_pre", "DoubleThroughAnOp"), ("forward_post", "DoubleThroughAnOp")]
    assert y.item() == 3.0


def test_nested_hooks_open_outermost_first_and_close_innermost_first():
    log = []
    x = f64([1.0])
    with Recorder("outer", log):
        with Recorder("inner", log):
            x * 2.0
        x * 3.0  # the inner hook is gone
    assert [(name, kind) for name, kind, _, _ in log] == [
        ("outer", "forward_pre"), ("inner", "forward_pre"), ("inner", "forward_post"), ("outer", "forward_post"),
        ("outer", "forward_pre"), ("outer", "forward_post")]
    assert function_hooks.active == ()


def test_a_hook_is_removed_when_its_block_raises_and_is_entered_once_at_a_time():
    hook = Recorder()
    with pytest.raises(KeyError):
        with hook:
            raise KeyError("the block failed")
    assert function_hooks.active == ()
    f64([1.0]) * 2.0
    assert hook.log == []
    with hook:
        with pytest.raises(RuntimeError, match="already active"):
            with hook:
                pass
        assert function_hooks.active == (hook,)
    assert function_hooks.active == ()


class BackwardFails(Function):
    def forward(self, x):
        return x.copy()

    def backward(self, gy):
        raise ArithmeticError("this backward fails")


def test_postprocess_follows_preprocess_even_when_the_op_raises():
    with Recorder() as hook:
        with pytest.raises(ValueError, match="linear"):
            F.linear(mdl.randn(2, 3), mdl.randn(4, 5))
        y = BackwardFails()(f64([1.0]))
        hook.log.clear()
        with pytest.raises(ArithmeticError):
            y.backward()
    assert [(kind, op, result) for _, kind, op, result in hook.log if kind.startswith("backward")] == [
        ("backward_pre", "BackwardFails", hook.log[0][3]), ("backward_post", "BackwardFails", None)]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_every_hook_closes_when_one_raises_in_its_postprocess():
    with Recorder() as outer:
        with mdl.detect_anomaly():
            with pytest.raises(mdl.AnomalyError):
                f64([-1.0]).log()
    kinds = [(kind, op) for _, kind, op, _ in outer.log]
    assert kinds == [("forward_pre", "Log"), ("forward_post", "Log")]
    assert np.isnan(outer.log[1][3].item())  # the op itself succeeded: the outer hook saw its output
    assert function_hooks.active == ()


# ---------------------------------------------------------------- the walk's own hooks
class _Log(mdl.FunctionHook):
    def __init__(self):
        self.events = []

    def walk_preprocess(self, outputs):
        self.events.append(("walk", len(outputs)))

    def walk_postprocess(self, outputs):
        self.events.append(("/walk", len(outputs)))

    def backward_preprocess(self, function, grad_outputs):
        self.events.append(("node", type(function).__name__))


def test_walk_hooks_surround_the_nodes_of_each_walk():
    x = mdl.tensor([1.0, 2.0, 3.0], requires_grad=True)
    with _Log() as log:
        y = (x * x).sum()
        y.backward()
        (g,) = mdl.grad((x * 3.0).sum(), [x])
    assert log.events[0] == ("walk", 1) and log.events[-1] == ("/walk", 1)
    assert [e[0] for e in log.events].count("walk") == 2  # backward() and grad()
    first = log.events[:log.events.index(("/walk", 1)) + 1]
    assert {e[1] for e in first if e[0] == "node"} == {"Sum", "Mul"}
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 4.0, 6.0])  # the walk itself is unchanged
    np.testing.assert_allclose(g.numpy(), [3.0, 3.0, 3.0])


def test_walk_postprocess_runs_when_the_walk_raises():
    x = mdl.tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    y.backward()
    with _Log() as log, pytest.raises(RuntimeError):
        y.backward()  # the graph was released by the first walk
    assert log.events[0] == ("walk", 1) and log.events[-1] == ("/walk", 1)
