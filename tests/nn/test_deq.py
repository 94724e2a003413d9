"""The deep equilibrium layer: its fixed point, its implicit gradient, and its memory flat in the iterations."""
import numpy as np
import pytest

import minidl as mdl
from minidl import memory, nn
from minidl.gradcheck import gradcheck
from minidl.nn.deq import DEQ, anderson, fixed_point_iteration


def contraction(width, seed=0, dtype=np.float64):
    """f(z, x) = tanh(z W + x U) with ‖W‖₂ = 0.5: a contraction in z, so the fixed point exists and is unique."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((width, width))
    w *= 0.5 / np.linalg.norm(w, 2)
    W = mdl.tensor(w.astype(dtype), requires_grad=True)
    U = mdl.tensor((rng.standard_normal((width, width)) / np.sqrt(width)).astype(dtype), requires_grad=True)
    return (lambda z, x: (z @ W + x @ U).tanh()), W, U


def unrolled(f, x, steps):
    z = mdl.tensor(np.zeros(x.shape, x.dtype))
    for _ in range(steps):
        z = f(z, x)
    return z


@pytest.mark.parametrize("solve", [anderson, fixed_point_iteration])
def test_the_solvers_find_the_fixed_point_of_a_linear_map(solve):
    rng = np.random.default_rng(1)
    A = rng.standard_normal((5, 5))
    A *= 0.6 / np.linalg.norm(A, 2)
    b = rng.standard_normal(5)
    z, info = solve(lambda v: A @ v + b, np.zeros(5), max_iter=200, tol=1e-14)
    np.testing.assert_allclose(z, np.linalg.solve(np.eye(5) - A, b), rtol=1e-12, atol=1e-13)  # z = Az + b
    assert info["residual"] < 1e-14


def test_anderson_needs_fewer_evaluations_than_plain_iteration():
    f, W, U = contraction(8)
    x = mdl.tensor(np.random.default_rng(2).standard_normal((4, 8)))
    counts = {}
    for solver in ("anderson", "iteration"):
        layer = DEQ(f, solver=solver, tol=1e-12, max_iter=500)
        layer(x)
        counts[solver] = layer.forward_info["iterations"]
    assert counts["anderson"] < counts["iteration"]


@pytest.mark.parametrize("solver", ["anderson", "iteration"])
def test_gradients_equal_finite_differences(solver):
    f, W, U = contraction(5)
    x = mdl.tensor(np.random.default_rng(3).standard_normal((3, 5)), requires_grad=True)
    layer = DEQ(f, solver=solver, tol=1e-14, max_iter=400)
    assert gradcheck(lambda x, W, U: layer(x), [x, W, U])


def test_gradients_equal_backpropagation_through_a_long_unrolled_iteration():
    f, W, U = contraction(6)
    x = mdl.tensor(np.random.default_rng(4).standard_normal((3, 6)), requires_grad=True)
    target = mdl.tensor(np.random.default_rng(5).standard_normal((3, 6)))

    def grads(forward):
        for t in (x, W, U):
            t.grad = None
        ((forward() - target) ** 2).sum().backward()
        return [t.grad.numpy().copy() for t in (x, W, U)]
    layer = DEQ(f, tol=1e-12, max_iter=200)
    implicit = grads(lambda: layer(x))
    by_backprop = grads(lambda: unrolled(f, x, 200))  # 0.5²⁰⁰: the unrolled map is at its fixed point
    assert layer.backward_info["residual"] < 1e-12
    for a, b in zip(implicit, by_backprop):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-11)


def test_a_module_as_f_registers_its_parameters():
    class Cell(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(4, 4)

        def forward(self, z, x):
            return (self.linear(z) * 0.3 + x).tanh()
    mdl.manual_seed(0)
    layer = DEQ(Cell()).double()
    assert [name for name, _ in layer.named_parameters()] == ["f.linear.weight", "f.linear.bias"]
    x = mdl.tensor(np.random.default_rng(6).standard_normal((2, 4)))
    layer(x).sum().backward()
    assert layer.f.linear.weight.grad is not None
    with mdl.no_grad():
        z = layer(x)
    np.testing.assert_allclose(z.numpy(), layer.f(z, x).numpy(), atol=1e-5)  # z* = f(z*, x) to the tolerance


def test_memory_is_flat_in_the_iterations_and_unrolled_grows_with_them():
    """Batch 256 × width 64 in float64 (128 KiB an activation). Forward and backward under memory.track at 10
    and 100 iterations of the solvers (tol=0: every iteration runs), against the same map unrolled."""
    f, W, U = contraction(64, seed=7)
    x = mdl.tensor(np.random.default_rng(8).standard_normal((256, 64)))
    activation = x.array.nbytes

    def measured(forward):
        for t in (W, U):
            t.grad = None
        with memory.track() as m:
            z = forward()
            (z * z).sum().backward()
        return m.allocator_peak_bytes, m.peak_bytes
    for solver in ("anderson", "iteration"):
        few = measured(lambda: DEQ(f, solver=solver, tol=0.0, max_iter=10)(x))
        many = measured(lambda: DEQ(f, solver=solver, tol=0.0, max_iter=100)(x))
        assert many[1] == few[1]  # the graph holds one application of f, whatever the iterations
        assert abs(many[0] - few[0]) < activation  # all the process allocated: flat to under one activation
    few, many = measured(lambda: unrolled(f, x, 10)), measured(lambda: unrolled(f, x, 100))
    assert many[1] - few[1] >= 90 * 2 * activation  # each application saves its input and its tanh output
    assert many[0] - few[0] >= 90 * 2 * activation


def test_bad_arguments_are_named():
    f, _, _ = contraction(3)
    with pytest.raises(ValueError, match="solver must be one of"):
        DEQ(f, solver="newton")
    with pytest.raises(ValueError, match="max_iter must be a positive integer"):
        DEQ(f, max_iter=0)
    with pytest.raises(TypeError, match="f must be a Module or function"):
        DEQ(3)
    with pytest.raises(ValueError, match="f must map z to its own shape"):
        DEQ(lambda z, x: x.sum(axis=1))(mdl.tensor(np.ones((2, 3))))
