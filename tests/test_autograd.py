"""The backward engine: graph walks, accumulation, retain/create graph, grad(), grad modes, anomalies."""
import inspect
import os
import sys

import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from minidl import autograd
from minidl.autograd import Function
from minidl.tensor import Tensor


def f64(data, requires_grad=True):
    return mdl.tensor(np.asarray(data, dtype=np.float64), requires_grad=requires_grad)


# ---------------------------------------------------------------- graph shapes
def test_ten_thousand_op_chain_needs_no_recursion():
    x = f64(1.0)
    y = x
    for _ in range(10_000):
        y = y * 1.0001
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(200)  # a recursive walk would need ~10,000 frames
    try:
        y.backward()
    finally:
        sys.setrecursionlimit(limit)
    assert x.grad.item() == pytest.approx(1.0001 ** 10_000, rel=1e-9)
    del y  # freeing a 10,000-node chain must not crash either


def test_diamond_sums_both_paths():
    a = f64(3.0)
    b = a + a
    c = b + b
    c.backward()
    assert a.grad.item() == 4.0


def test_node_used_many_times():
    x = f64([1.0, 2.0])
    y = x * x  # an intermediate used by many consumers
    total = y
    for _ in range(99):
        total = total + y
    total.sum().backward()  # 100 · x² → 200 x
    np.testing.assert_allclose(x.grad.numpy(), [200.0, 400.0])


def test_graph_with_shared_subexpressions_matches_hand_derivative():
    x = f64(0.7)
    s = x.tanh()
    y = s * s + s.exp() * x
    y.backward()
    t = np.tanh(0.7)
    dt = 1 - t * t
    expected = 2 * t * dt + np.exp(t) * dt * 0.7 + np.exp(t)
    assert x.grad.item() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("op, derivative", [
    (lambda t: t.exp(), np.exp),
    (lambda t: t.tanh(), lambda v: 1 - np.tanh(v) ** 2),
    (lambda t: t.sigmoid(), lambda v: np.exp(-v) / (1 + np.exp(-v)) ** 2),
    (lambda t: t.sqrt(), lambda v: 0.5 / np.sqrt(v)),
])
def test_backward_that_reads_its_output_after_the_consumer_was_freed(op, derivative):
    # y = op(x) is held only by the Mul node, which is released before op's own
    # backward runs; that backward still needs y (dx = dy·y for exp).
    v = np.array([0.5, 1.5])
    x = f64(v)
    (op(x) * x).sum().backward()
    value = op(f64(v, requires_grad=False)).numpy()
    np.testing.assert_allclose(x.grad.numpy(), derivative(v) * v + value, rtol=1e-12)


def test_multi_output_function_with_an_unused_output_gets_zero_for_it():
    class Split(Function):
        """(y1, y2) = (2x, 3x);  dx = 2 dy1 + 3 dy2."""
        def forward(self, x):
            return 2 * x, 3 * x

        def backward(self, g1, g2):
            return g1 * 2 + g2 * 3

    x = f64([1.0, 2.0])
    y1, y2 = Split()(x)
    (y2 * y2).sum().backward()  # y1 unused: its gradient is filled with zeros
    np.testing.assert_allclose(x.grad.numpy(), 3 * 2 * 3 * np.array([1.0, 2.0]))
    x.grad = None
    y1, y2 = Split()(x)
    (y1 + y2).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [5.0, 5.0])


# ---------------------------------------------------------------- accumulation
def test_leaf_gradients_accumulate_over_backward_calls():
    x = f64([1.0, -2.0])
    (x * x).sum().backward()
    first = x.grad.numpy().copy()
    (x * x * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), first + 3 * x.numpy() ** 2)
    (x * 5).sum().backward()  # a third call: by now accumulated in place
    np.testing.assert_allclose(x.grad.numpy(), first + 3 * x.numpy() ** 2 + 5)


def test_accumulation_never_corrupts_a_gradient_shared_by_two_leaves():
    x, y = f64([1.0, 2.0]), f64([3.0, 4.0])
    (x + y).sum().backward()  # Add hands the same gradient to both leaves
    (x + y).sum().backward()
    assert x.grad is not y.grad and not np.shares_memory(x.grad.data, y.grad.data)
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 2.0])
    np.testing.assert_array_equal(y.grad.numpy(), [2.0, 2.0])
    x.grad.data[0] = 100.0
    np.testing.assert_array_equal(y.grad.numpy(), [2.0, 2.0])
    (x + y).sum().backward()  # in-place accumulation from here on stays per leaf
    np.testing.assert_array_equal(x.grad.numpy(), [101.0, 3.0])
    np.testing.assert_array_equal(y.grad.numpy(), [3.0, 3.0])


def test_accumulation_does_not_write_into_a_user_held_first_gradient():
    x, y = f64([1.0, 2.0]), f64([3.0, 4.0])
    (x + y).sum().backward()
    held = y.grad.numpy().copy()
    shared = x.grad.data  # the first gradient may be shared; it must never be written into
    (x * 2).sum().backward()
    np.testing.assert_array_equal(shared, held)
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 3.0])


def test_retain_grad_on_a_non_leaf():
    x = f64([1.0, 2.0])
    h = (x * 3).retain_grad()
    other = x * 4
    (h * h).sum().backward()
    np.testing.assert_allclose(h.grad.numpy(), 2 * 3 * np.array([1.0, 2.0]))
    assert other.grad is None
    np.testing.assert_allclose(x.grad.numpy(), 18 * np.array([1.0, 2.0]))


# ---------------------------------------------------------------- retain_graph and create_graph
def test_second_backward_without_retain_graph_raises():
    x = f64([1.0, 2.0])
    y = (x.exp() * x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="retain_graph"):
        y.backward()


def test_retain_graph_allows_a_second_backward_and_grads_add_up():
    x = f64([1.0, 2.0])
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * 2 * np.array([1.0, 2.0]))


@pytest.mark.parametrize("value", [-1.5, 0.5, 2.0])
def test_second_derivative_of_cube_is_6x(value):
    x = f64(value)
    (g,) = mdl.grad(x ** 3, x, create_graph=True)
    assert g.item() == pytest.approx(3 * value ** 2, rel=1e-12)
    (h,) = mdl.grad(g, x)
    assert h.item() == pytest.approx(6 * value, rel=1e-12)


def test_backward_with_create_graph_makes_grad_differentiable():
    x = f64(2.0)
    (x ** 3).backward(create_graph=True)
    g = x.grad
    assert g.requires_grad and g.item() == 12.0
    x.grad = None
    g.backward()
    assert x.grad.item() == 12.0


def test_hessian_vector_product_of_a_quadratic_form():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((4, 4))
    v = rng.standard_normal(4)
    x = f64(rng.standard_normal(4))
    A = mdl.tensor(a)
    f = (x * (A @ x)).sum()  # xᵀ A x
    (g,) = mdl.grad(f, x, create_graph=True)
    np.testing.assert_allclose(g.numpy(), (a + a.T) @ x.numpy(), rtol=1e-12)
    (hv,) = mdl.grad((g * mdl.tensor(v)).sum(), x)
    np.testing.assert_allclose(hv.numpy(), (a + a.T) @ v, rtol=1e-12)


# ---------------------------------------------------------------- mdl.grad
def test_grad_returns_gradients_without_touching_dot_grad():
    x, y = f64([1.0, 2.0]), f64([3.0, 4.0])
    gx, gy = mdl.grad((x * y).sum(), [x, y])
    np.testing.assert_array_equal(gx.numpy(), [3.0, 4.0])
    np.testing.assert_array_equal(gy.numpy(), [1.0, 2.0])
    assert x.grad is None and y.grad is None


def test_grad_for_a_non_leaf_input():
    x = f64([1.0, 2.0])
    h = x * 3
    (gh,) = mdl.grad((h * h).sum(), h)
    np.testing.assert_allclose(gh.numpy(), [6.0, 12.0])
    assert h.grad is None and x.grad is None


def test_grad_of_an_unused_input_raises_unless_allowed():
    x, unused = f64([1.0]), f64([2.0, 3.0])
    with pytest.raises(RuntimeError, match=r"input 1 \(shape \(2,\)\).*allow_unused=True"):
        mdl.grad((x * 2).sum(), [x, unused])  # PyTorch's default: allow_unused=False
    gx, gu = mdl.grad((x * 2).sum(), [x, unused], allow_unused=True)
    assert gx.item() == 2.0 and gu is None


def test_grad_names_an_input_that_does_not_require_grad():
    x, constant = f64([1.0]), f64([2.0], requires_grad=False)
    with pytest.raises(RuntimeError, match=r"input 1 \(shape \(1,\), requires_grad=False\)"):
        mdl.grad((x * constant).sum(), [x, constant])


def test_grad_with_grad_outputs():
    x = f64([1.0, 2.0])
    (g,) = mdl.grad(x * x, x, grad_outputs=f64([10.0, 100.0], requires_grad=False))
    np.testing.assert_allclose(g.numpy(), [20.0, 400.0])



def test_a_walk_from_several_outputs_sums_in_the_same_order_every_time():
    """The roots of a walk keep the outputs' order (not a set's, which follows where the Functions lie in
    memory): a Hessian-vector product through several gradients (AdaHessian's Hz) is the same bits on
    every fresh build of the same graph (before, runs differed by ~1e-16 relative)."""
    rng = np.random.default_rng(0)
    x, z = rng.normal(size=(8, 5)), [rng.choice([-1.0, 1.0], size=s) for s in ((5, 7), (7,), (7, 3), (3,))]
    values = [rng.normal(size=s) for s in ((5, 7), (7,), (7, 3), (3,))]

    def hessian_vector_product():
        w1, b1, w2, b2 = params = [f64(v) for v in values]
        loss = (((mdl.tensor(x) @ w1 + b1).tanh() @ w2 + b2) ** 2).tanh().sum()
        grads = mdl.grad(loss, params, create_graph=True)
        return np.concatenate([h.numpy().ravel() for h in
                               mdl.grad(grads, params, grad_outputs=[mdl.tensor(v) for v in z])])

    first = hessian_vector_product()
    for _ in range(12):
        np.testing.assert_array_equal(hessian_vector_product(), first)


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
            assert sum(isinstance(h, autograd._AnomalyCheck) for h in autograd._hooks) == 1
        with pytest.raises(mdl.AnomalyError) as info:
            y.sum().backward()
    message = str(info.value)
    assert "Sqrt" in message and "backward" in message
    assert "created outside detect_anomaly(); wrap the forward pass too to see where" in message
    assert os.path.basename(__file__) not in message  # the backward line is not named as where Sqrt was made
    assert autograd._hooks == ()


# ---------------------------------------------------------------- errors that speak to the user
def test_backward_on_a_non_scalar_needs_grad():
    x = f64([1.0, 2.0])
    with pytest.raises(RuntimeError) as info:
        (x * 2).backward()
    assert "(2,)" in str(info.value) and "grad" in str(info.value)
    (x * 2).backward(grad=np.array([1.0, 10.0]))
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 20.0])


def test_backward_grad_of_the_wrong_shape():
    x = f64([1.0, 2.0])
    with pytest.raises(ValueError, match=r"\(3,\).*\(2,\)"):
        (x * 2).backward(grad=np.ones(3))


def test_backward_on_a_tensor_that_does_not_require_grad():
    with pytest.raises(RuntimeError, match="does not require grad"):
        (f64([1.0], requires_grad=False) * 2).sum().backward()
    with mdl.no_grad():
        y = (f64([1.0]) * 2).sum()
    with pytest.raises(RuntimeError, match="no_grad"):
        y.backward()


def test_mixing_devices_names_the_op_and_both_devices(standin_or_gpu):
    a = mdl.randn(2, 3)
    b = mdl.randn(2, 3, device="cuda")
    with pytest.raises(ValueError) as info:
        a + b
    message = str(info.value)
    assert "Add" in message and "cpu" in message and "cuda" in message and "(2, 3)" in message


# ---------------------------------------------------------------- on each device
def test_backward_engine_on_device(device):
    x = mdl.tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True, device=device)
    b = x * x
    c = (b + b).sum()
    c.backward(retain_graph=True)
    c.backward()
    assert x.grad.device == x.device
    np.testing.assert_allclose(x.grad.numpy(), 8 * np.array([1.0, 2.0, 3.0]))
    (g,) = mdl.grad((x ** 3).sum(), x, create_graph=True)
    (h,) = mdl.grad(g.sum(), x)
    np.testing.assert_allclose(h.numpy(), 6 * np.array([1.0, 2.0, 3.0]))


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
        return (mdl.tensor(x) * 2.0).data

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
    assert autograd._hooks == ()


def test_a_hook_is_removed_when_its_block_raises_and_is_entered_once_at_a_time():
    hook = Recorder()
    with pytest.raises(KeyError):
        with hook:
            raise KeyError("the block failed")
    assert autograd._hooks == ()
    f64([1.0]) * 2.0
    assert hook.log == []
    with hook:
        with pytest.raises(RuntimeError, match="already active"):
            with hook:
                pass
        assert autograd._hooks == (hook,)
    assert autograd._hooks == ()


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
    assert autograd._hooks == ()


# ---------------------------------------------------------------- a custom Function's gradients are checked
class _ReturnsGradient(Function):
    """y = 2x, with a backward that returns whatever the test hands it."""

    def __init__(self, make):
        self.make = make

    def forward(self, x):
        return 2 * x

    def backward(self, gy):
        return self.make(gy)


@pytest.mark.parametrize("make,error,message", [
    (lambda gy: (gy * 2).sum(), RuntimeError,
     r"_ReturnsGradient.backward returned an invalid gradient at input 0: got shape \(\), expected shape \(3,\)"),
    (lambda gy: Tensor(np.ones(3, dtype=np.int64)), TypeError,
     r"_ReturnsGradient.backward returned an invalid gradient at input 0: dtype int64 is not floating"),
    (lambda gy: (gy * 2, gy), RuntimeError, r"_ReturnsGradient.backward returned 2 gradients for 1 input"),
    (lambda gy: "2", TypeError, r"_ReturnsGradient.backward returned an invalid gradient at input 0: expected a "
                                r"Tensor of shape \(3,\) or None, got str"),
], ids=["scalar", "integer", "too-many", "string"])
def test_a_custom_backward_returning_an_invalid_gradient_is_named(make, error, message):
    x = mdl.tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    y = _ReturnsGradient(make)(x)
    with pytest.raises(error, match=message):
        y.sum().backward()
    assert x.grad is None


def test_a_custom_backward_may_return_an_array_which_becomes_a_tensor():
    x = mdl.tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    _ReturnsGradient(lambda gy: 2 * gy.numpy())(x).sum().backward()
    assert isinstance(x.grad, Tensor)
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 2.0, 2.0])


def test_gradcheck_names_the_function_whose_gradient_has_the_wrong_shape():
    x = mdl.tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    with pytest.raises(RuntimeError, match=r"_ReturnsGradient.backward returned an invalid gradient at input 0"):
        mdl.gradcheck(lambda t: _ReturnsGradient(lambda gy: (gy * 2).sum())(t), [x])


# ---------------------------------------------------------------- Functions in PyTorch's style
class _Scale(Function):
    """y = a·x, x², in PyTorch's style: static methods taking ctx; a is a number (no gradient)."""

    @staticmethod
    def forward(ctx, x, a):
        ctx.save_for_backward(x)
        ctx.a = a
        square = x * x
        ctx.mark_non_differentiable(square)
        return x * a, square

    @staticmethod
    def backward(ctx, g, g_square):
        x, = ctx.saved_tensors
        assert ctx.needs_input_grad == (True, False)
        return g * ctx.a, None


def test_a_pytorch_style_function_records_a_node_named_after_it():
    x = mdl.tensor(np.array([1.0, -2.0]), requires_grad=True)
    y, square = _Scale.apply(x, 3.0)
    assert type(y.grad_fn).__name__ == "_ScaleBackward" and y.grad_fn.next_functions[0][0].variable is x
    assert square.creator is None and not square.requires_grad  # mark_non_differentiable
    (y * y).sum().backward()  # d/dx Σ(3x)² = 18x
    np.testing.assert_allclose(x.grad.numpy(), [18.0, -36.0])


def test_the_tutorials_legendre_function_gives_pytorchs_gradients_and_second_derivatives():
    torch = pytest.importorskip("torch")

    def legendre(base):
        class LegendrePolynomial3(base.autograd.Function):
            @staticmethod
            def forward(ctx, input):
                ctx.save_for_backward(input)
                return 0.5 * (5 * input ** 3 - 3 * input)

            @staticmethod
            def backward(ctx, grad_output):
                input, = ctx.saved_tensors
                return grad_output * 1.5 * (5 * input ** 2 - 1)
        return LegendrePolynomial3

    values = np.linspace(-1.0, 1.0, 7)
    x, t = mdl.tensor(values, requires_grad=True), torch.tensor(values, requires_grad=True)
    g, = mdl.grad(legendre(mdl).apply(x).sum(), x, create_graph=True)
    tg, = torch.autograd.grad(legendre(torch).apply(t).sum(), t, create_graph=True)
    np.testing.assert_allclose(g.numpy(), tg.detach().numpy(), rtol=1e-13)
    np.testing.assert_allclose(mdl.grad(g.sum(), x)[0].numpy(), torch.autograd.grad(tg.sum(), t)[0].numpy(),
                               rtol=1e-13)  # 15x: saved_tensors are the inputs themselves, so this is recorded


def test_a_pytorch_style_function_sees_its_saved_input_changed_in_place():
    x = mdl.tensor(np.array([1.0, 2.0]), requires_grad=True)
    y, _ = _Scale.apply(x, 2.0)
    with mdl.no_grad():
        x += 1.0
    with pytest.raises(RuntimeError, match=r"backward through _ScaleBackward.*saved tensor"):
        y.sum().backward()


def test_pytorch_style_errors_name_the_function():
    class TooFew(Function):
        @staticmethod
        def forward(ctx, x, y):
            return x * y

        @staticmethod
        def backward(ctx, g):
            return g
    a, b = mdl.tensor([1.0], requires_grad=True), mdl.tensor([2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match=r"TooFewBackward: backward returned 1 gradients for the 2 arguments"):
        TooFew.apply(a, b).sum().backward()
    with pytest.raises(TypeError, match=r"_ReturnsGradient.apply calls Functions written in PyTorch's style"):
        _ReturnsGradient.apply(a)


# ---------------------------------------------------------------- tensor hooks
def test_hooks_see_the_total_gradient_run_in_order_and_may_replace_it():
    torch = pytest.importorskip("torch")

    def run(lib, make):
        x = make([1.0, 2.0])
        y = x * 3
        seen = []
        y.register_hook(lambda g: seen.append(("first", g.tolist())))
        y.register_hook(lambda g: g * 2)
        y.register_hook(lambda g: seen.append(("third", g.tolist())))
        y.retain_grad()
        handle = x.register_hook(lambda g: g + 1)
        x.register_hook(lambda g: seen.append(("leaf", g.tolist())))
        (y * y + y).sum().backward()  # y is used twice: its hooks see the sum, once
        handle.remove()
        (x * 1).sum().backward()
        return seen, y.grad.tolist(), x.grad.tolist()

    ours = run(mdl, lambda v: mdl.tensor(v, dtype="float64", requires_grad=True))
    theirs = run(torch, lambda v: torch.tensor(v, dtype=torch.float64, requires_grad=True))
    assert ours == theirs


def test_register_hook_needs_a_tensor_that_requires_grad():
    with pytest.raises(RuntimeError, match=r"register_hook: this tensor \(shape \(2,\)\) does not require grad"):
        mdl.tensor([1.0, 2.0]).register_hook(lambda g: g)


def test_a_hook_returning_the_wrong_shape_is_refused():
    x = mdl.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    y.register_hook(lambda g: g.sum())
    with pytest.raises(RuntimeError, match=r"a hook registered on a tensor of shape \(2,\) returned a gradient of "
                                           r"shape \(\)"):
        y.sum().backward()
