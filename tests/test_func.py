"""minidl.func (jvp, vjp, grad, jacfwd, jacrev, hessian, hvp) against torch.func in float64, and the
forward-mode engine under it (ForwardMode: levels, nesting, errors)."""
import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from minidl import func
from minidl.autograd import ForwardMode, Function, MissingTangentRule
from minidl.tensor import Tensor


def _leaf(array):
    return Tensor(np.array(array, dtype=np.float64))


def _close(ours, theirs, rtol=1e-12, atol=1e-13):
    ours = ours if isinstance(ours, (tuple, list)) else (ours,)
    theirs = theirs if isinstance(theirs, (tuple, list)) else (theirs,)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        if isinstance(a, (tuple, list)):
            _close(a, b, rtol, atol)
            continue
        np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=rtol, atol=atol)


@pytest.fixture
def torch():
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch.func")
    return torch


RNG = np.random.default_rng(7)
X34, Y4 = RNG.standard_normal((3, 4)), RNG.standard_normal(4)
W23, X3, A33 = RNG.standard_normal((2, 3)), RNG.standard_normal(3), RNG.standard_normal((3, 3))


def _two_outputs(lib, x, y):
    """Broadcasting, a tuple of outputs, elementwise and math ops."""
    return lib.sin(x) * y + lib.exp(x), lib.tanh(x) / (1 + y * y)


def _layer(lib, w, x):
    """R^(2×3) × R^3 → R^2: a matrix-vector product through a nonlinearity."""
    return lib.tanh(lib.matmul(w, x)) * lib.sigmoid(lib.matmul(w, x * x))


def _scalar(lib, x, a):
    """R^3 → R, written with einsum so that its backward needs no shape op: a quadratic form and more."""
    return lib.einsum("i,ij,j->", lib.tanh(x), a, x) + lib.einsum("i,i->", lib.exp(x), lib.sin(x))


def test_jvp_equals_torch_func(torch):
    x, y, dx, dy = (RNG.standard_normal(s) for s in ((3, 4), (4,), (3, 4), (4,)))
    out, tangent = func.jvp(lambda a, b: _two_outputs(mdl, a, b), (_leaf(x), _leaf(y)), (_leaf(dx), _leaf(dy)))
    t = [torch.tensor(v) for v in (x, y, dx, dy)]
    t_out, t_tangent = torch.func.jvp(lambda a, b: _two_outputs(torch, a, b), tuple(t[:2]), tuple(t[2:]))
    _close(out, t_out)
    _close(tangent, t_tangent)


def test_jvp_records_no_graph():
    """One forward sweep: the outputs and tangents of inputs that need no gradient have no creator."""
    out, tangent = func.jvp(lambda a: F.exp(a) * a, (_leaf(X3),), (_leaf(np.ones(3)),))
    assert out.creator is None and tangent.creator is None and not tangent.requires_grad
    np.testing.assert_allclose(tangent.numpy(), np.exp(X3) * (1 + X3), rtol=1e-14)


def test_vjp_equals_torch_func(torch):
    u = (RNG.standard_normal((3, 4)), RNG.standard_normal((3, 4)))
    out, pullback = func.vjp(lambda a, b: _two_outputs(mdl, a, b), _leaf(X34), _leaf(Y4))
    t_out, t_pullback = torch.func.vjp(lambda a, b: _two_outputs(torch, a, b), torch.tensor(X34), torch.tensor(Y4))
    _close(out, t_out)
    _close(pullback(tuple(_leaf(v) for v in u)), t_pullback(tuple(torch.tensor(v) for v in u)))


@pytest.mark.parametrize("argnums", [0, 1, (0, 1)])
def test_jacobians_equal_torch_func(torch, argnums):
    """jacfwd (a column per input element) and jacrev (a row per output element) give torch.func's
    Jacobians, in its shapes: (2, 2, 3) for w, (2, 3) for x, a tuple of both for argnums=(0, 1)."""
    ours = [transform(lambda w, x: _layer(mdl, w, x), argnums)(_leaf(W23), _leaf(X3))
            for transform in (func.jacfwd, func.jacrev)]
    theirs = torch.func.jacrev(lambda w, x: _layer(torch, w, x), argnums)(torch.tensor(W23), torch.tensor(X3))
    for jacobian in ours:
        _close(jacobian, theirs)


def test_jacobians_of_several_outputs_equal_torch_func(torch):
    for transform, theirs in ((func.jacfwd, torch.func.jacfwd), (func.jacrev, torch.func.jacrev)):
        ours = transform(lambda a, b: _two_outputs(mdl, a, b), (0, 1))(_leaf(X34[:2, :2]), _leaf(Y4[:2]))
        expected = theirs(lambda a, b: _two_outputs(torch, a, b), (0, 1))(torch.tensor(X34[:2, :2]),
                                                                          torch.tensor(Y4[:2]))
        _close(ours, expected)


def test_hessian_equals_torch_func(torch):
    """Forward over reverse: forward mode differentiates the whole backward pass, its ops included."""
    a = _leaf(A33)
    ours = func.hessian(lambda x: _scalar(mdl, x, a))(_leaf(X3))
    theirs = torch.func.hessian(lambda x: _scalar(torch, x, torch.tensor(A33)))(torch.tensor(X3))
    _close(ours, theirs)


def test_reverse_over_forward_equals_forward_over_reverse():
    """jacrev(jacfwd(f)) records the tangent rules' ops and differentiates them: the same Hessian."""
    a = _leaf(A33)
    f = lambda x: _scalar(mdl, x, a)  # noqa: E731
    np.testing.assert_allclose(func.jacrev(func.jacfwd(f))(_leaf(X3)).numpy(),
                               func.hessian(f)(_leaf(X3)).numpy(), rtol=1e-12, atol=1e-13)


def test_forward_over_forward_equals_the_hessian():
    """Two forward levels: the inner level's tangent rules are differentiated by the outer one."""
    a = _leaf(A33)
    f = lambda x: _scalar(mdl, x, a)  # noqa: E731
    twice = func.jacfwd(func.jacfwd(f))(_leaf(X3))  # jacfwd stacks its columns under the outer level
    np.testing.assert_allclose(twice.numpy(), func.hessian(f)(_leaf(X3)).numpy(), rtol=1e-12, atol=1e-13)


def test_hvp_equals_torch(torch):
    v = RNG.standard_normal(3)
    value, product = func.hvp(lambda x: _scalar(mdl, x, _leaf(A33)), _leaf(X3), _leaf(v))
    t_value, t_product = torch.autograd.functional.hvp(lambda x: _scalar(torch, x, torch.tensor(A33)),
                                                       torch.tensor(X3), torch.tensor(v))
    _close((value, product), (t_value, t_product))


def test_grad_equals_torch_func(torch):
    ours = func.grad(lambda x, a: _scalar(mdl, x, a), (0, 1))(_leaf(X3), _leaf(A33))
    theirs = torch.func.grad(lambda x, a: _scalar(torch, x, a), (0, 1))(torch.tensor(X3), torch.tensor(A33))
    _close(ours, theirs)


def test_nested_levels_keep_their_tangents_apart():
    """d/dx [x · d/dy (x + y)] = 1: the inner derivative is 1 whatever x is (perturbation confusion
    would make it 2, mixing the inner level's tangent with the outer one's)."""
    def outer(x):
        _, inner = func.jvp(lambda y: x + y, (_leaf(1.0),), (_leaf(1.0),))
        return x * inner
    _, tangent = func.jvp(outer, (_leaf(3.0),), (_leaf(1.0),))
    assert tangent.item() == 1.0


def test_a_pytorch_style_function_uses_its_jvp():
    class Cube(Function):
        @staticmethod
        def forward(ctx, x, scale):
            ctx.save_for_backward(x)
            ctx.scale = scale
            return x * x * x * scale

        @staticmethod
        def backward(ctx, gy):
            (x,) = ctx.saved_tensors
            return gy * 3 * x * x * ctx.scale, None

        @staticmethod
        def jvp(ctx, dx, dscale):
            assert dscale is None  # a non-Tensor argument
            (x,) = ctx.saved_tensors
            return dx * 3 * x * x * ctx.scale

    _, tangent = func.jvp(lambda x: Cube.apply(x, 2.0), (_leaf([1.0, -2.0]),), (_leaf([1.0, 0.5]),))
    np.testing.assert_allclose(tangent.numpy(), [6.0, 12.0])


def test_an_op_without_a_tangent_rule_is_named():
    class Square(Function):
        def forward(self, x):
            return x * x

        def backward(self, gy):
            return gy * 2 * self.inputs[0]

    with pytest.raises(MissingTangentRule, match="Square has no tangent rule"):
        func.jvp(lambda x: Square()(x), (_leaf([1.0]),), (_leaf([1.0]),))


def test_bad_calls_say_what_is_wrong():
    with pytest.raises(ValueError, match="a tangent must have its primal's shape"):
        func.jvp(F.exp, (_leaf([1.0, 2.0]),), (_leaf([1.0]),))
    with pytest.raises(ValueError, match="2 primals but 1 tangents"):
        func.jvp(F.mul, (_leaf(1.0), _leaf(2.0)), (_leaf(1.0),))
    with pytest.raises(ValueError, match="argnums=2"):
        func.jacrev(F.mul, 2)(_leaf(1.0), _leaf(2.0))
    with pytest.raises(ValueError, match="one-element Tensor"):
        func.grad(F.exp)(_leaf([1.0, 2.0]))


def test_a_tangent_goes_stale_when_its_tensor_changes_in_place():
    x = _leaf([1.0, 2.0])
    with ForwardMode() as level:
        level.attach(x, _leaf([1.0, 1.0]))
        x.copy_(np.array([3.0, 4.0]))
        with pytest.raises(RuntimeError, match="changed in place"):
            F.exp(x)


def test_forward_mode_is_gone_after_the_block():
    x = _leaf([1.0, 2.0])
    with ForwardMode() as level:
        level.attach(x, _leaf([1.0, 1.0]))
        y = F.exp(x)
        assert level.tangent(y) is not None
    assert not mdl.autograd.forward_levels()
    assert F.exp(x).creator is None


def test_forward_mode_on_each_device(device):
    """The tangents live on the primals' device: jvp, jacfwd and the adjoint test give the CPU's numbers."""
    from minidl.gradcheck import adjoint_error
    w = mdl.tensor(W23, device=device)
    x = mdl.tensor(X3, device=device, requires_grad=True)
    out, tangent = func.jvp(lambda x: _layer(mdl, w, x), (x,), (mdl.tensor(np.ones(3), device=device),))
    assert tangent.device == out.device == x.device
    expected = func.jacrev(lambda x: _layer(mdl, _leaf(W23), x))(_leaf(X3)).numpy()
    np.testing.assert_allclose(tangent.numpy(), expected.sum(axis=1), rtol=1e-12)
    np.testing.assert_allclose(func.jacfwd(lambda x: _layer(mdl, w, x))(x).numpy(), expected, rtol=1e-12)
    assert adjoint_error(lambda x: _layer(mdl, w, x), [x]) <= 32


# ---------------------------------------------------------------- inputs forward mode refuses, as torch.func
_INTEGER_CALLS = {
    "jacfwd": lambda lib, x, v: lib.func.jacfwd(lambda t: t / 3)(x),
    "jvp primal": lambda lib, x, v: lib.func.jvp(lambda t: t / 3, (x,), (v,)),
    "jvp tangent": lambda lib, x, v: lib.func.jvp(lambda t: t / 3, (v,), (x,)),
    "hessian": lambda lib, x, v: lib.func.hessian(lambda t: (t * t).sum())(x),
}


@pytest.mark.parametrize("call", list(_INTEGER_CALLS))
def test_integer_inputs_are_refused_not_differentiated_to_zero(torch, call):
    # before: jacfwd(lambda x: x / 3)(arange(3)) returned all zeros; the true Jacobian is I/3
    with pytest.raises(ValueError, match="floating point"):
        _INTEGER_CALLS[call](torch, torch.arange(3), torch.ones(3))
    with pytest.raises(ValueError, match=r"dtype int64.*floating-point or complex.*x.astype\('float64'\)"):
        _INTEGER_CALLS[call](mdl, mdl.tensor(np.arange(3)), mdl.tensor(np.ones(3)))


def test_forward_mode_refuses_an_integer_tangent_at_any_level():
    with ForwardMode() as level, pytest.raises(ValueError, match="forward mode: the primal has dtype int64"):
        level.attach(mdl.tensor(np.arange(3)), mdl.tensor(np.arange(3)))


def test_hvp_names_itself_when_refusing_integers():
    with pytest.raises(ValueError, match=r"minidl.func.hvp: the input 0 has dtype int64"):
        func.hvp(lambda t: (t * t).sum(), mdl.tensor(np.arange(3)), mdl.tensor(np.ones(3)))
    with pytest.raises(ValueError, match=r"minidl.func.hvp: the vector 0 has dtype int64"):
        func.hvp(lambda t: (t * t).sum(), mdl.tensor(np.ones(3)), mdl.tensor(np.arange(3)))


def test_converted_integers_give_the_true_jacobian():
    x = mdl.tensor(np.arange(3)).astype("float64")
    np.testing.assert_allclose(func.jacfwd(lambda t: t / 3)(x).numpy(), np.eye(3) / 3)


@pytest.mark.parametrize("bare", ["primals", "tangents"])
def test_jvp_given_bare_tensors_says_to_pass_tuples(torch, bare):
    x, v = np.ones((2, 3)), np.ones((2, 3))
    args = {"primals": (x, (v,)), "tangents": ((x,), v)}[bare]
    with pytest.raises(RuntimeError, match="Expected primals (to be a tuple|and tangents to have the same)"):
        torch.func.jvp(torch.sin, *[tuple(map(torch.tensor, a)) if isinstance(a, tuple) else torch.tensor(a)
                                    for a in args])
    with pytest.raises(TypeError, match=rf"minidl.func.jvp: {bare} must be a tuple of Tensors.*"
                                        r"got a Tensor; for one input write jvp\(f, \(x,\), \(v,\)\)"):
        func.jvp(mdl.sin, *[tuple(map(mdl.tensor, a)) if isinstance(a, tuple) else mdl.tensor(a) for a in args])
