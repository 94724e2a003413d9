"""normalize, cosine_similarity, pairwise_distance: NumPy formulas, PyTorch values and gradients, zero vectors."""
import math

import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F


def p_norm_np(x, p, axis, keepdims=False):
    if p == math.inf:
        return np.abs(x).max(axis=axis, keepdims=keepdims)
    return (np.abs(x) ** p).sum(axis=axis, keepdims=keepdims) ** (1 / p)


def check_against_torch(torch, fn, tfn, arrays):
    xs = [mdl.tensor(a, requires_grad=True) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    got, want = fn(*xs), tfn(*ts)
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-12, atol=1e-14)
    g = np.random.default_rng(0).standard_normal(got.shape)
    got.backward(mdl.tensor(g))
    want.backward(torch.tensor(g))
    for x, t in zip(xs, ts):
        np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("p, dim", [(2.0, 1), (1, 0), (3, -1), (math.inf, 1)])
def test_normalize_matches_formula_and_torch(torch, p, dim):
    x = np.random.default_rng(1).standard_normal((3, 4, 2))
    want = x / np.maximum(p_norm_np(x, p, dim, keepdims=True), 1e-12)
    np.testing.assert_allclose(F.normalize(mdl.tensor(x), p, dim).numpy(), want, rtol=1e-12)
    check_against_torch(torch, lambda x: F.normalize(x, p=p, dim=dim),
                        lambda x: torch.nn.functional.normalize(x, p=p, dim=dim), [x])


def test_normalize_of_a_zero_vector_is_zero_with_pytorch_gradient(torch):
    x = np.array([[0.0, 0.0, 0.0], [3.0, 4.0, 0.0]])
    got = F.normalize(mdl.tensor(x))
    np.testing.assert_allclose(got.numpy(), [[0, 0, 0], [0.6, 0.8, 0]])
    check_against_torch(torch, F.normalize, torch.nn.functional.normalize, [x])  # 1/eps on the zero row


@pytest.mark.parametrize("p", [0, -1, -2.5, -math.inf])
def test_normalize_with_p_at_most_zero_computes_as_pytorch(torch, p):
    """‖x‖_p is torch.norm's: the count of nonzeros (p = 0), min |x| (−inf), (Σ|x|ᵖ)^(1/p) (0 with a zero entry)."""
    x = np.random.default_rng(2).standard_normal((4, 5))
    x[1, 2] = 0.0  # a zero entry: the norm of that row is 0 for p < 0, so eps takes over
    x[3] = 0.0  # a zero row
    if p == 0:
        norms = (x != 0).sum(axis=1, keepdims=True)
    elif p == -math.inf:
        norms = np.abs(x).min(axis=1, keepdims=True)
    else:
        with np.errstate(divide="ignore"):
            norms = (np.abs(x) ** p).sum(axis=1, keepdims=True) ** (1 / p)
    np.testing.assert_allclose(F.normalize(mdl.tensor(x), p).numpy(), x / np.maximum(norms, 1e-12), rtol=1e-12)
    check_against_torch(torch, lambda a: F.normalize(a, p=p), lambda a: torch.nn.functional.normalize(a, p=p), [x])


@pytest.mark.parametrize("shapes, dim", [(((4, 5), (4, 5)), 1), (((3, 1, 5), (1, 4, 5)), -1), (((2, 3), (3,)), 1),
                                         (((3, 6, 2), (3, 6, 2)), 0)])
def test_cosine_similarity_matches_formula_and_torch(torch, shapes, dim):
    rng = np.random.default_rng(2)
    a, b = (rng.standard_normal(s) for s in shapes)
    a_, b_ = np.broadcast_arrays(a, b)
    want = (a_ * b_).sum(axis=dim) / (np.linalg.norm(a_, axis=dim) * np.linalg.norm(b_, axis=dim))
    np.testing.assert_allclose(F.cosine_similarity(mdl.tensor(a), mdl.tensor(b), dim).numpy(), want, rtol=1e-12)
    check_against_torch(torch, lambda a, b: F.cosine_similarity(a, b, dim=dim),
                        lambda a, b: torch.nn.functional.cosine_similarity(a, b, dim=dim), [a, b])


def test_cosine_similarity_of_zero_vectors_is_zero_and_finite(torch):
    a, b = np.zeros((2, 3)), np.random.default_rng(3).standard_normal((2, 3))
    check_against_torch(torch, F.cosine_similarity, torch.nn.functional.cosine_similarity, [a, b])
    x = mdl.tensor(a, requires_grad=True)
    F.cosine_similarity(x, x).sum().backward()
    assert np.isfinite(x.grad.numpy()).all()


@pytest.mark.parametrize("p", [2.0, 1.0, 3.0, math.inf])
@pytest.mark.parametrize("keepdim", [False, True])
def test_pairwise_distance_matches_formula_and_torch(torch, p, keepdim):
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((5, 3)), rng.standard_normal((5, 3))
    want = p_norm_np(a - b + 1e-6, p, -1, keepdims=keepdim)
    got = F.pairwise_distance(mdl.tensor(a), mdl.tensor(b), p, keepdim=keepdim).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-12)
    check_against_torch(torch, lambda a, b: F.pairwise_distance(a, b, p=p, keepdim=keepdim),
                        lambda a, b: torch.nn.functional.pairwise_distance(a, b, p=p, keepdim=keepdim), [a, b])


def test_pairwise_distance_broadcasts_and_identical_vectors_stay_finite(torch):
    rng = np.random.default_rng(5)
    check_against_torch(torch, F.pairwise_distance, torch.nn.functional.pairwise_distance,
                        [rng.standard_normal((4, 3)), rng.standard_normal(3)])
    x = mdl.tensor(np.ones((2, 3)), requires_grad=True)
    d = F.pairwise_distance(x, mdl.tensor(np.ones((2, 3))))
    np.testing.assert_allclose(d.numpy(), np.sqrt(3) * 1e-6, rtol=1e-9)
    d.sum().backward()
    assert np.isfinite(x.grad.numpy()).all()


def test_float32_and_errors():
    x = mdl.randn(3, 4, requires_grad=True)
    for out in (F.normalize(x), F.cosine_similarity(x, x), F.pairwise_distance(x, x)):
        assert out.dtype == np.float32
    np.testing.assert_allclose(F.cosine_similarity(x, x).numpy(), 1.0, rtol=1e-6)
    with pytest.raises(ValueError, match=r"normalize: p must be a positive number or math.inf, got 'fro'"):
        F.normalize(x, p="fro")
    with pytest.raises(ValueError, match=r"normalize"):
        F.normalize(mdl.randn(3))  # dim=1 does not exist in a vector (as in PyTorch)
    with pytest.raises(ValueError, match=r"cosine_similarity: shapes \(3, 4\) and \(3,\) do not broadcast"):
        F.cosine_similarity(x, mdl.randn(3))
    with pytest.raises(ValueError, match=r"pairwise_distance: p must be a positive number"):
        F.pairwise_distance(x, x, p=-1)
