"""Function (minidl.autograd.function): the op call's checks, a custom Function's gradients, PyTorch's style."""
import numpy as np
import pytest

import minidl as mdl
from minidl.autograd import Function
from minidl.tensor import Tensor


# ---------------------------------------------------------------- the op call
def test_mixing_devices_names_the_op_and_both_devices(standin_or_gpu):
    a = mdl.randn(2, 3)
    b = mdl.randn(2, 3, device="cuda")
    with pytest.raises(ValueError) as info:
        a + b
    message = str(info.value)
    assert "Add" in message and "cpu" in message and "cuda" in message and "(2, 3)" in message


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


# ---------------------------------------------------------------- what a Function declares
def test_reads_output_is_read_once_per_class_from_its_backward():
    from minidl.ops.activation import Tanh
    from minidl.ops.elementwise import Exp, Mul
    assert Exp.reads_output and Tanh.reads_output and not Mul.reads_output

    class Square(Function):
        def forward(self, x):
            return x * x

        def backward(self, gy):
            return 2 * gy * self.inputs[0]

    class SquareFromOutput(Square):  # a new backward: asked again
        def backward(self, gy):
            return 2 * gy * self.output() ** 0.5

    class SameBackward(SquareFromOutput):  # the parent's backward: the parent's answer
        pass

    assert not Square.reads_output and SquareFromOutput.reads_output and SameBackward.reads_output
    assert _Scale._node_class.reads_output  # a PyTorch-style node: a saved result comes from its output
