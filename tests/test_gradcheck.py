"""gradcheck and gradgradcheck themselves: they pass correct ops and catch wrong ones."""
import numpy as np
import pytest

import minidl as mdl
from minidl.autograd import Function
from minidl.gradcheck import max_relative_error, numerical_derivative
from minidl.tensor import Tensor


def f64(*shape, seed=0, requires_grad=True):
    data = np.random.default_rng(seed).standard_normal(shape)
    return mdl.tensor(data, requires_grad=requires_grad)


class Square(Function):
    """y = x²;  dx = 2x dy (differentiable: a correct second derivative too)."""

    def forward(self, x):
        return x * x

    def backward(self, gy):
        return gy * 2 * self.inputs[0]


class SquareWrongAtOneElement(Function):
    """y = x²;  dx = 2x dy, plus 1 at flat element 4 (a bug a reader could plant)."""

    def forward(self, x):
        return x * x

    def backward(self, gy):
        bump = np.zeros(gy.shape)
        bump.reshape(-1)[4] = 1.0
        return gy * 2 * self.inputs[0] + Tensor(bump)


class Cube(Function):
    """y = x³;  dx = 3x² dy written with Tensor ops, so d²y/dx² = 6x comes out right."""

    def forward(self, x):
        return x ** 3

    def backward(self, gy):
        x = self.inputs[0]
        return gy * 3 * x * x


class CubeBackwardFromConstants(Function):
    """y = x³;  dx = 3x² dy with 3x² built from raw arrays: first derivative right, second wrong."""

    def forward(self, x):
        return x ** 3

    def backward(self, gy):
        x = self.inputs[0].array
        return gy * Tensor(3 * x * x)  # no graph back to x: d(dx)/dx looks like 0


def test_gradcheck_passes_a_correct_op():
    x, y = f64(2, 3), f64(3, seed=1)
    assert mdl.gradcheck(lambda a, b: Square()(a) * b + a.exp(), [x, y])
    assert mdl.gradcheck(lambda a, b: Square()(a) * b, [x, y], fast=True)


def test_gradcheck_with_several_outputs_and_a_constant_input():
    x = f64(3)
    c = f64(3, seed=2, requires_grad=False)
    assert mdl.gradcheck(lambda a, k: (a * k, a.tanh().sum()), [x, c])


def test_gradcheck_leaves_the_inputs_unchanged():
    x = f64(2, 2)
    before = x.numpy().copy()
    mdl.gradcheck(lambda a: Square()(a), [x])
    mdl.gradcheck(lambda a: Square()(a), [x], fast=True)
    np.testing.assert_array_equal(x.numpy(), before)


def test_gradcheck_catches_a_wrong_backward_and_says_where():
    x = f64(2, 3)
    with pytest.raises(mdl.GradcheckError) as info:
        mdl.gradcheck(lambda a: SquareWrongAtOneElement()(a), [x])
    message = str(info.value)
    assert "analytic" in message and "numeric" in message
    assert "(1, 1)" in message  # flat element 4 of a (2, 3) input
    assert "(2, 3)" in message


def test_fast_gradcheck_also_catches_it():
    with pytest.raises(mdl.GradcheckError, match="analytic.*numeric"):
        mdl.gradcheck(lambda a: SquareWrongAtOneElement()(a), [f64(2, 3)], fast=True)


def test_gradcheck_rejects_float32_inputs():
    x = mdl.randn(3, requires_grad=True)  # float32
    with pytest.raises(TypeError, match="float64"):
        mdl.gradcheck(lambda a: a * 2, [x])
    with pytest.raises(TypeError, match="float64"):
        mdl.gradgradcheck(lambda a: a * a, [x])


def test_gradcheck_needs_an_input_that_requires_grad():
    with pytest.raises(ValueError, match="requires_grad"):
        mdl.gradcheck(lambda a: a * 2, [f64(3, requires_grad=False)])


def test_gradcheck_catches_an_output_cut_from_the_graph():
    x = f64(3)
    with pytest.raises(mdl.GradcheckError):
        mdl.gradcheck(lambda a: a.detach() * 2, [x])


def test_max_relative_error_is_small_for_a_correct_op_and_large_for_a_wrong_one():
    x = f64(2, 3)
    assert max_relative_error(lambda a: Square()(a), [x]) < 1e-6
    assert max_relative_error(lambda a: SquareWrongAtOneElement()(a), [x]) > 0.1


def test_gradgradcheck_passes_a_correct_second_derivative():
    x = f64(2, 3)
    assert mdl.gradcheck(lambda a: Cube()(a), [x])
    assert mdl.gradgradcheck(lambda a: Cube()(a), [x])
    assert mdl.gradgradcheck(lambda a: Cube()(a), [x], fast=True)


def test_gradgradcheck_catches_a_backward_built_from_constants():
    x = f64(2, 3)
    assert mdl.gradcheck(lambda a: CubeBackwardFromConstants()(a), [x])  # first order is right
    with pytest.raises(mdl.GradcheckError, match="analytic.*numeric"):
        mdl.gradgradcheck(lambda a: CubeBackwardFromConstants()(a), [x])
    with pytest.raises(mdl.GradcheckError):
        mdl.gradgradcheck(lambda a: CubeBackwardFromConstants()(a), [x], fast=True)


def test_gradgradcheck_accepts_piecewise_linear_ops():
    x = mdl.tensor(np.array([-1.5, -0.5, 0.5, 2.0]), requires_grad=True)
    assert mdl.gradgradcheck(lambda a: a.relu(), [x])
    assert mdl.gradgradcheck(lambda a: abs(a) * 3, [x])


def test_gradgradcheck_with_given_grad_outputs():
    x = f64(3)
    v = mdl.tensor(np.array([1.0, -2.0, 0.5]))
    assert mdl.gradgradcheck(lambda a: Cube()(a), [x], grad_outputs=[v])


@pytest.mark.parametrize("layout", ["fortran", "transposed view", "0-d"])
def test_gradcheck_works_whatever_the_input_memory_layout(layout):
    data = np.random.default_rng(3).standard_normal((2, 3))
    if layout == "fortran":
        x = Tensor(np.asfortranarray(data), requires_grad=True)
    elif layout == "transposed view":
        x = Tensor(np.ascontiguousarray(data.T).T, requires_grad=True)  # a non-contiguous view
    else:
        x = Tensor(np.array(0.7), requires_grad=True)
    before = x.numpy().copy()
    assert mdl.gradcheck(lambda a: a.exp() * a, [x])
    assert mdl.gradgradcheck(lambda a: a.exp() * a, [x])
    np.testing.assert_array_equal(x.numpy(), before)


# ---------------------------------------------------------------- the three numerical references
class CubeOffByOnePart(Function):
    """y = x³ with dx = 3x²·(1 + 1e-9) dy: a backward wrong by 1e-9, below what central differences see."""

    def forward(self, x):
        return x * x * x

    def backward(self, gy):
        x = self.inputs[0]
        return gy * 3 * x * x * (1 + 1e-9)


def smooth(x):
    """exp(sin x)·x, elementwise and mixed: analytic everywhere."""
    return mdl.exp(mdl.sin(x)) * x.sum()


@pytest.mark.parametrize("method", ["central", "richardson", "complex"])
def test_each_method_passes_a_correct_op_and_reports_how_far_it_sees(method):
    result = mdl.gradcheck(smooth, [f64(5)], method=method, atol=1e-8, rtol=1e-8)
    assert result and result.method == method
    assert result.max_error <= result.error_estimate  # the estimate bounds the error it made
    bound = {"central": 1e-8, "richardson": 1e-11, "complex": 1e-14}[method]
    assert result.error_estimate < bound


def test_the_estimates_order_the_methods():
    """central (≈ ε/h at h = 1e-6) sees less far than Richardson, which sees less far than the complex step."""
    est = {m: mdl.gradcheck(smooth, [f64(4)], method=m).error_estimate for m in ("central", "richardson", "complex")}
    assert est["complex"] < est["richardson"] / 10 < est["central"] / 100


def test_central_error_falls_as_h_squared_and_richardson_as_h_to_the_sixth():
    """Halving h divides the truncation error by 4 (central) and by 64 (Richardson), where truncation dominates."""
    x = [f64(3, seed=2)]
    central = [max_relative_error(smooth, x, eps=h) for h in (4e-3, 2e-3)]
    richardson = [max_relative_error(smooth, x, eps=h, method="richardson") for h in (0.2, 0.1)]
    assert 3.5 < central[0] / central[1] < 4.5
    assert 45 < richardson[0] / richardson[1] < 80


def test_the_complex_step_sees_a_backward_wrong_by_1e_9_that_central_differences_miss():
    x = f64(6, seed=3)
    central = mdl.gradcheck(lambda t: CubeOffByOnePart()(t), [x])  # passes: the error is below what it sees
    assert central.error_estimate > 1e-9 * 0.3
    with pytest.raises(mdl.GradcheckError, match=r"complex"):
        mdl.gradcheck(lambda t: CubeOffByOnePart()(t), [x], method="complex", atol=1e-13, rtol=1e-13)
    assert mdl.gradcheck(lambda t: Cube()(t), [x], method="complex", atol=1e-13, rtol=1e-13)


@pytest.mark.parametrize("method", ["richardson", "complex"])
@pytest.mark.parametrize("fast", [False, True])
def test_a_backward_wrong_by_1e_9_fails_each_precise_method_at_its_default_tolerance(method, fast):
    """No tolerance given: Richardson and the complex step compare at their own (8·estimate + 256 ulps),
    so they catch the 1e-9 that PyTorch's atol 1e-5 / rtol 1e-3 let through (before: these passed)."""
    x = f64(6, seed=3)
    with pytest.raises(mdl.GradcheckError, match=r"own tolerance is .* = 8 × its error estimate"):
        mdl.gradcheck(lambda t: CubeOffByOnePart()(t), [x], method=method, fast=fast)
    result = mdl.gradcheck(lambda t: Cube()(t), [x], method=method, fast=fast)
    assert result.tolerance == pytest.approx(8 * result.error_estimate + 256 * np.finfo(np.float64).eps)
    assert result.max_error <= result.tolerance < 1e-10
    # the planted error is 1e-9 of 3x² on the max(|numeric|, 1) scale: far beyond the tolerance
    expected = 1e-9 * (3 * x.numpy() ** 2 / np.maximum(3 * x.numpy() ** 2, 1)).max()
    assert expected > 10 * result.tolerance


def test_central_differences_keep_pytorchs_defaults_and_given_tolerances_win():
    x = f64(6, seed=3)
    central = mdl.gradcheck(lambda t: CubeOffByOnePart()(t), [x])   # atol 1e-5, rtol 1e-3, as PyTorch
    assert central.tolerance is None
    loose = mdl.gradcheck(lambda t: CubeOffByOnePart()(t), [x], method="complex", rtol=1e-3)
    assert loose.tolerance is None and loose.max_error > 1e-10   # an explicit tolerance is the one used
    with pytest.raises(mdl.GradcheckError):
        mdl.gradcheck(lambda t: SquareWrongAtOneElement()(t), [f64(6)], atol=1e-5)


def test_pytorch_passes_the_same_1e_9_error_at_its_defaults(torch):
    """The reason for the change: PyTorch's gradcheck (central differences, atol 1e-5, rtol 1e-3) can't see it."""
    class Cube1e9(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x ** 3

        @staticmethod
        def backward(ctx, gy):
            (x,) = ctx.saved_tensors
            return gy * 3 * x ** 2 * (1 + 1e-9)

    x = torch.tensor(np.random.default_rng(3).standard_normal(6), dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(Cube1e9.apply, (x,))
    with pytest.raises(mdl.GradcheckError):
        mdl.gradcheck(lambda t: CubeOffByOnePart()(t), [f64(6, seed=3)], method="complex")


def squire_trapp(x):
    """f(x) = eˣ / √(sin³x + cos³x), the complex step's classic test function (Squire & Trapp 1998)."""
    return mdl.exp(x) / mdl.sqrt(mdl.sin(x) ** 3 + mdl.cos(x) ** 3)


def test_the_complex_step_takes_no_difference_so_a_tiny_step_loses_nothing():
    """At h = 1e-10, f(x + h) − f(x − h) cancels all but ~6 of f's 16 digits; Im f(x + ih) cancels nothing.
    Reference: f' = f·(1 − 3 sin x cos x (sin x − cos x) / (2 (sin³x + cos³x))), by hand."""
    x0 = 1.5
    s, c = np.sin(x0), np.cos(x0)
    f0 = np.exp(x0) / np.sqrt(s ** 3 + c ** 3)
    exact = f0 * (1 - 3 * s * c * (s - c) / (2 * (s ** 3 + c ** 3)))
    x = Tensor(np.array([x0]), requires_grad=True)

    def error(method, h):
        return abs(numerical_derivative(squire_trapp, [x], [np.ones(1)], method=method, eps=h)[0][0] - exact) / exact

    assert error("complex", 1e-20) < 4e-16 and error("complex", 1e-10) < 4e-16
    assert error("complex", 1e-200) < 4e-16  # any step: the truncation h²f‴/6 underflows
    assert error("central", 1e-10) > 1e-8  # rounding ε|f|/h dominates
    assert error("central", 1e-6) < 1e-9 and error("richardson", 1e-2) < 1e-12


def test_fast_mode_with_each_method():
    x = f64(4, 3, seed=4)
    for method in ("central", "richardson", "complex"):
        assert mdl.gradcheck(smooth, [x], fast=True, method=method)
    with pytest.raises(mdl.GradcheckError, match=r"fast, complex"):
        mdl.gradcheck(lambda t: CubeOffByOnePart()(t), [x], fast=True, method="complex", atol=0, rtol=1e-13)


def test_method_errors_speak_to_the_user():
    with pytest.raises(ValueError, match="unknown method 'forward'"):
        mdl.gradcheck(smooth, [f64(3)], method="forward")
    with pytest.raises(TypeError, match="not analytic"):  # |x| drops the imaginary part
        mdl.gradcheck(lambda t: t.abs(), [f64(3)], method="complex")
    with pytest.raises(ValueError, match="gradgradcheck: method='complex'"):
        mdl.gradgradcheck(smooth, [f64(3)], method="complex")


def test_gradgradcheck_with_richardson():
    assert mdl.gradgradcheck(lambda t: Cube()(t), [f64(4)], method="richardson", atol=1e-10, rtol=1e-10)


# ---------------------------------------------------------------- the error against the step
def test_error_sweep_follows_the_theory():
    """tanh: central differences fall as h² (on the truncation line) until rounding, ε|f|/h, takes over near
    the theory's best step; Richardson gets to 1e-12; the complex step stays at ulps for every small step."""
    from minidl.gradcheck import error_sweep
    sweep = error_sweep(lambda t: t.tanh(), [f64(3, 4, seed=5)], name="tanh")
    h = sweep.steps
    assert h[0] == pytest.approx(1e-1) and h[-1] == pytest.approx(1e-13)
    large = (h <= 1e-2) & (h >= 1e-4)
    np.testing.assert_allclose(sweep.central[large], sweep.truncation[large], rtol=0.05)
    slope = np.polyfit(np.log(h[large]), np.log(sweep.central[large]), 1)[0]
    assert slope == pytest.approx(2, abs=0.05)
    small = h <= 1e-10  # rounding: noise, of the size of its bound
    assert np.all(sweep.central[small] < 3 * sweep.rounding[small])
    assert np.median(sweep.central[small] / sweep.rounding[small]) > 0.05
    best = h[np.argmin(sweep.central)]
    assert sweep.best_step / 30 < best < sweep.best_step * 30
    assert sweep.richardson.min() < 1e-12 and sweep.central.min() > 1e-13
    assert np.all(sweep.complex[h <= 1e-8] < 1e-14)  # a few ulps of the sum vᵀJu, both ways


def test_sweep_of_an_op_case_writes_its_figure(tmp_path):
    from minidl.gradcheck import sweep_op_case
    sweep, path = sweep_op_case("softplus", tmp_path)  # not analytic: no complex-step curve
    assert sweep.complex is None and path == str(tmp_path / "sweep_softplus.png")
    assert (tmp_path / "sweep_softplus.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["sweep_softplus.png"]  # no temporary left behind
    with pytest.raises(ValueError, match="no op case named 'softplos'"):
        sweep_op_case("softplos", tmp_path)
