"""The backward walk (minidl.autograd.walk): graph shapes, accumulation, retain/create graph, grad(),
its errors, both devices, tensor hooks."""
import sys

import numpy as np
import pytest

import minidl as mdl
from minidl.autograd import Function
from tests.autograd._helpers import f64


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
    assert x.grad is not y.grad and not np.shares_memory(x.grad.array, y.grad.array)
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 2.0])
    np.testing.assert_array_equal(y.grad.numpy(), [2.0, 2.0])
    x.grad.array[0] = 100.0
    np.testing.assert_array_equal(y.grad.numpy(), [2.0, 2.0])
    (x + y).sum().backward()  # in-place accumulation from here on stays per leaf
    np.testing.assert_array_equal(x.grad.numpy(), [101.0, 3.0])
    np.testing.assert_array_equal(y.grad.numpy(), [3.0, 3.0])


def test_accumulation_does_not_write_into_a_user_held_first_gradient():
    x, y = f64([1.0, 2.0]), f64([3.0, 4.0])
    (x + y).sum().backward()
    held = y.grad.numpy().copy()
    shared = x.grad.array  # the first gradient may be shared; it must never be written into
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
