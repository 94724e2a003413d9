"""norm and einsum against NumPy formulas and PyTorch (values and gradients)."""
import math

import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from tests.ops.torch_compare import values_and_gradients


def _both(torch, fn_mdl, fn_torch, *arrays, seed=1, rtol=1e-11):
    """Values and gradients (under one random upstream gradient) of one function in minidl and in PyTorch."""
    y, grads = values_and_gradients(torch, fn_mdl, fn_torch, *arrays, seed=seed, rtol=rtol, atol=1e-12)
    return mdl.tensor(y), grads


def _x(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


# ---------------------------------------------------------------- norm
@pytest.mark.parametrize("p", ["fro", 2, 1, 3, 0.5, math.inf, -math.inf, -1.5])
@pytest.mark.parametrize("dim, keepdim", [(None, False), (1, False), (0, True), ((0, 1), False)])
def test_vector_norms_match_pytorch_and_numpy(torch, p, dim, keepdim):
    v = _x(3, 4)
    y, _ = _both(torch, lambda a: a.norm(p, dim, keepdim), lambda a: torch.norm(a, p, dim, keepdim), v)
    ord_ = 2 if p == "fro" else p
    flat = dim is None or isinstance(dim, tuple)
    expected = (np.linalg.norm(v.ravel(), ord_) if flat
                else np.linalg.norm(v, ord_, axis=dim, keepdims=keepdim))
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-12)


def test_norm_zero_counts_nonzeros_without_a_gradient(torch):
    v = np.array([[0.0, 1.5, -2.0], [0.0, 0.0, 3.0]])
    x = mdl.tensor(v, requires_grad=True)
    y = F.norm(x, 0, dim=1)
    np.testing.assert_array_equal(y.numpy(), torch.norm(torch.tensor(v), 0, dim=1).numpy())
    np.testing.assert_array_equal(y.numpy(), [2.0, 1.0])
    assert not y.requires_grad


@pytest.mark.parametrize("p", [2, "fro", 3, 0.5, 1])
def test_norm_gradient_at_zeros_is_pytorchs(torch, p):
    v = np.array([[0.0, 0.0, 0.0], [0.0, 1.5, -2.0]])  # a zero vector and a zero entry
    _, (grad,) = _both(torch, lambda a: F.norm(a, p, dim=1), lambda a: torch.norm(a, p, dim=1), v)
    assert np.isfinite(grad).all()
    np.testing.assert_array_equal(grad[0], 0.0)


def test_two_norm_gradient_is_the_unit_vector():
    v = np.array([3.0, -4.0])
    x = mdl.tensor(v, requires_grad=True)
    x.norm().backward()
    np.testing.assert_allclose(x.grad.numpy(), v / 5.0, rtol=1e-15)


def test_norm_second_derivative_matches_pytorch(torch):
    v = _x(3, 4)
    w = _x(3, 4, seed=5)
    for p in (2, 3):
        x = mdl.tensor(v, requires_grad=True)
        (g,) = mdl.grad([F.norm(x, p, dim=1).sum()], [x], create_graph=True)
        (h,) = mdl.grad([(g * mdl.tensor(w)).sum()], [x])
        t = torch.tensor(v, requires_grad=True)
        (tg,) = torch.autograd.grad(torch.norm(t, p, dim=1).sum(), t, create_graph=True)
        (th,) = torch.autograd.grad((tg * torch.tensor(w)).sum(), t)
        np.testing.assert_allclose(h.numpy(), th.numpy(), rtol=1e-10)


@pytest.mark.parametrize("shape, dim, keepdim", [((3, 3), None, False), ((4, 2), None, False), ((2, 5), (0, 1), True),
                                             ((2, 3, 4), (1, 2), False), ((3, 2, 4), (2, 0), True)])
def test_nuclear_norm_matches_pytorch_and_the_singular_values(torch, shape, dim, keepdim):
    v = _x(*shape)
    y, (grad,) = _both(torch, lambda a: a.norm("nuc", dim, keepdim), lambda a: torch.norm(a, "nuc", dim, keepdim), v)
    if dim is None:
        np.testing.assert_allclose(y.numpy(), np.linalg.svd(v, compute_uv=False).sum(), rtol=1e-12)
        u, _, vh = np.linalg.svd(v, full_matrices=False)
        g = np.random.default_rng(1).standard_normal(())  # dA = dy U Vᵀ
        np.testing.assert_allclose(grad, g * u @ vh, rtol=1e-10)


def test_nuclear_norm_second_derivative_matches_pytorch(torch):
    for shape in [(3, 3), (4, 2), (2, 5)]:
        v, w = _x(*shape), _x(*shape, seed=3)
        x = mdl.tensor(v, requires_grad=True)
        (g,) = mdl.grad([F.norm(x, "nuc")], [x], create_graph=True)
        (h,) = mdl.grad([(g * mdl.tensor(w)).sum()], [x])
        t = torch.tensor(v, requires_grad=True)
        (tg,) = torch.autograd.grad(torch.linalg.matrix_norm(t, "nuc"), t, create_graph=True)
        (th,) = torch.autograd.grad((tg * torch.tensor(w)).sum(), t)
        np.testing.assert_allclose(h.numpy(), th.numpy(), rtol=1e-9, atol=1e-12)


def test_svd_gradient_of_a_sign_free_function_matches_pytorch(torch):
    from minidl.ops.linalg import SVD
    for shape in [(4, 3), (3, 5), (2, 3, 3)]:
        v = _x(*shape)
        k = min(shape[-2:])
        w = np.linspace(-1.0, 2.0, k)

        def ours(a):
            u, s, vh = SVD()(a)
            return (u * mdl.tensor(w)) @ vh + (s ** 3).sum()

        def theirs(a):
            u, s, vh = torch.linalg.svd(a, full_matrices=False)
            return (u * torch.tensor(w)) @ vh + (s ** 3).sum()

        _both(torch, ours, theirs, v, rtol=1e-9)


def test_nuclear_norm_needs_a_matrix():
    with pytest.raises(ValueError, match="norm: p='nuc' without dim needs a 2-D tensor, got shape \\(2, 3, 4\\)"):
        F.norm(mdl.zeros(2, 3, 4), "nuc")
    with pytest.raises(ValueError, match="two different dims"):
        F.norm(mdl.zeros(2, 3), "nuc", dim=(1, 1))


def test_norm_rejects_unknown_kinds():
    with pytest.raises(ValueError, match="norm: p must be 'fro', 'nuc' or a number, got 'max'"):
        F.norm(mdl.zeros(2, 2), "max")


def test_norm_float32_stays_float32():
    x = mdl.tensor([[1.0, -2.0], [0.5, 3.0]], requires_grad=True)
    for p in ("fro", 1, 3, math.inf):
        y = F.norm(x, p, dim=1)
        assert y.dtype == np.float32
        y.sum().backward()
        assert x.grad.dtype == np.float32


# ---------------------------------------------------------------- einsum
EINSUMS = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),              # matmul
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),     # batched matmul
    ("ij,kj", [(3, 4), (2, 4)]),                  # implicit output: ik
    ("bA,ba", [(2, 3), (2, 4)]),                  # implicit output, uppercase first: Aa
    ("i,j->ij", [(3,), (4,)]),                    # outer product
    ("ij->i", [(3, 4)]),                          # a sum inside one operand
    ("ii", [(3, 3)]),                             # trace
    ("ii->i", [(3, 3)]),                          # diagonal
    ("iij,j->i", [(3, 3, 2), (2,)]),              # a diagonal contracted
    ("...ij,...jk->...ik", [(2, 3, 4), (4, 5)]),  # ellipsis, broadcast from the right
    ("...ii->...", [(2, 3, 3)]),                  # batched trace
    ("ij,ij,ij->", [(2, 3), (1, 3), (2, 1)]),     # size-1 dims broadcast
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),   # a chain of three
    ("i->", [(4,)]),
]


@pytest.mark.parametrize("equation, shapes", EINSUMS, ids=[e for e, _ in EINSUMS])
def test_einsum_matches_numpy_and_pytorch(torch, equation, shapes):
    arrays = [_x(*s, seed=i) for i, s in enumerate(shapes)]
    y, _ = _both(torch, lambda *a: F.einsum(equation, *a), lambda *a: torch.einsum(equation, *a), *arrays)
    np.testing.assert_allclose(y.numpy(), np.einsum(equation, *arrays), rtol=1e-12)


def test_einsum_gradient_is_the_einsum_of_the_others():
    a, b = _x(3, 4), _x(4, 5, seed=1)
    ta, tb = mdl.tensor(a, requires_grad=True), mdl.tensor(b, requires_grad=True)
    g = _x(3, 5, seed=2)
    F.einsum("ij,jk->ik", ta, tb).backward(grad=g)
    np.testing.assert_allclose(ta.grad.numpy(), g @ b.T, rtol=1e-13)
    np.testing.assert_allclose(tb.grad.numpy(), a.T @ g, rtol=1e-13)


def test_einsum_trace_gradient_is_the_identity():
    x = mdl.tensor(_x(3, 3), requires_grad=True)
    F.einsum("ii", x).backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.eye(3))


def test_einsum_takes_a_list_of_operands():
    a, b = _x(2, 3), _x(3, 2)
    np.testing.assert_allclose(F.einsum("ij,jk", [mdl.tensor(a), mdl.tensor(b)]).numpy(), a @ b, rtol=1e-13)


def test_einsum_second_derivative_matches_pytorch(torch):
    a, b, w = _x(3, 3), _x(4, 3, seed=1), _x(3, 3, seed=2)
    x, y = mdl.tensor(a, requires_grad=True), mdl.tensor(b, requires_grad=True)
    out = F.einsum("ii,ij,kj->k", x, x, y).sum()
    gx, gy = mdl.grad([out], [x, y], create_graph=True)
    (h,) = mdl.grad([(gx * mdl.tensor(w)).sum() + gy.sum()], [x])
    tx, ty = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    tout = torch.einsum("ii,ij,kj->k", tx, tx, ty).sum()
    tgx, tgy = torch.autograd.grad(tout, [tx, ty], create_graph=True)
    (th,) = torch.autograd.grad((tgx * torch.tensor(w)).sum() + tgy.sum(), tx)
    np.testing.assert_allclose(h.numpy(), th.numpy(), rtol=1e-11)


@pytest.mark.parametrize("equation, shapes, match", [
    ("ij,jk->ik", [(3, 4), (5, 6)], "sizes 4 and 5"),
    ("ij->ii", [(3, 3)], "repeats a letter in the output"),
    ("ij->k", [(3, 3)], "no operand has"),
    ("ijk->i", [(3, 3)], "gives 'ijk' to an operand of shape \\(3, 3\\)"),
    ("ij,jk->ik", [(3, 3)], "names 2 operand"),
    ("i1->i", [(3, 3)], "subscripts are letters"),
    ("ij->i", [(3, 4)], None),
])
def test_einsum_errors_name_the_equation(equation, shapes, match):
    arrays = [mdl.zeros(*s) for s in shapes]
    if match is None:
        F.einsum(equation, *arrays)
        return
    with pytest.raises(ValueError, match=f"einsum: equation '{equation}' .*{match}"):
        F.einsum(equation, *arrays)


def test_einsum_sublist_form_is_a_clear_error():
    with pytest.raises(TypeError, match="sublist form"):
        F.einsum(mdl.zeros(2, 2), [0, 1])


def test_einsum_float32_and_device(device):
    a = mdl.tensor(_x(2, 3).astype(np.float32), requires_grad=True, device=device)
    b = mdl.tensor(_x(3, 4).astype(np.float32), requires_grad=True, device=device)
    y = F.einsum("ij,jk->ik", a, b)
    assert y.dtype == np.float32 and y.device == a.device
    y.sum().backward()
    assert a.grad.dtype == np.float32 and b.grad.device == b.device
    np.testing.assert_allclose(y.numpy(), a.numpy() @ b.numpy(), rtol=1e-5)
