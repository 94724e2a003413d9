"""CSR weights: the structure, the product and its gradients against the dense masked weight, the layer."""
import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from minidl import backend, nn
from minidl.ops.sparse import SAMPLED_DENSE_ABOVE, CSRStructure, csr_linear


@pytest.fixture(params=["numpy", "scipy"])
def product(request, monkeypatch):
    """Both ways of computing the product: NumPy's gather and reduceat, and SciPy's compiled CSR (when installed)."""
    if request.param == "scipy":
        pytest.importorskip("scipy.sparse")
    else:
        monkeypatch.setitem(backend._optional, "scipy.sparse", False)  # as if SciPy were absent
    return request.param


def _pruned(shape=(7, 9), density=0.3, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(shape)
    w[rng.random(shape) > density] = 0
    w[1] = 0  # an empty row
    w[:, 2] = 0  # an unused column
    return w


def test_structure_is_the_textbook_csr():
    w = np.array([[0, 5, 0, 0], [0, 0, 0, 0], [1, 0, 2, 3.]])
    s, values = CSRStructure.from_dense(w)
    assert s.indptr.tolist() == [0, 1, 1, 4] and s.indices.tolist() == [1, 0, 2, 3]
    assert values.tolist() == [5, 1, 2, 3] and s.nnz == 4 and s.density == 4 / 12
    np.testing.assert_array_equal(s.to_dense(values), w)
    transposed, order = s.transposed()  # Wᵀ in CSR: the columns' runs
    np.testing.assert_array_equal(transposed.to_dense(values[order]), w.T)


def test_a_mask_keeps_stored_zeros():
    w = np.array([[0., 2.], [3., 0.]])
    s, values = CSRStructure.from_dense(w, keep=np.array([[True, True], [True, False]]))
    assert s.nnz == 3 and values.tolist() == [0, 2, 3]


@pytest.mark.parametrize("lead,shape,density", [((4,), (7, 9), 0.3), ((2, 3), (7, 9), 0.3),
                                                 ((5,), (40, 60), 0.02)])
def test_product_and_gradients_equal_the_dense_masked_weight(product, lead, shape, density):
    w = _pruned(shape, density)
    assert (np.count_nonzero(w) / w.size > SAMPLED_DENSE_ABOVE) == (density > SAMPLED_DENSE_ABOVE)  # both routes
    s, values = CSRStructure.from_dense(w)
    rng = np.random.default_rng(1)
    x = mdl.tensor(rng.standard_normal((*lead, shape[1])), requires_grad=True)
    v = mdl.tensor(values, requires_grad=True)
    b = mdl.tensor(rng.standard_normal(shape[0]), requires_grad=True)
    y = csr_linear(x, v, s, b)
    np.testing.assert_allclose(y.numpy(), x.numpy() @ w.T + b.numpy(), rtol=1e-13, atol=1e-13)
    dense = mdl.tensor(w, requires_grad=True)
    want = F.linear(x, dense, b)
    gy = mdl.tensor(rng.standard_normal(y.shape))
    gx, gv = mdl.grad([y], [x, v], grad_outputs=[gy])
    hx, hw = mdl.grad([want], [x, dense], grad_outputs=[gy])
    np.testing.assert_allclose(gx.numpy(), hx.numpy(), rtol=1e-13, atol=1e-13)
    rows, cols = np.nonzero(w)
    np.testing.assert_allclose(gv.numpy(), hw.numpy()[rows, cols], rtol=1e-13, atol=1e-13)  # only stored places


@pytest.mark.parametrize("shape,density", [((5, 6), 0.3), ((30, 40), 0.02)])
def test_gradcheck_in_float64(product, shape, density):
    s, values = CSRStructure.from_dense(_pruned(shape, density))
    x = mdl.tensor(np.random.default_rng(2).standard_normal((3, shape[1])), requires_grad=True)
    v = mdl.tensor(values, requires_grad=True)
    assert mdl.gradcheck(lambda x, v: csr_linear(x, v, s), [x, v])
    assert mdl.gradgradcheck(lambda x, v: csr_linear(x, v, s), [x, v])


def test_refusals():
    s, values = CSRStructure.from_dense(_pruned())
    with pytest.raises(ValueError, match="csr_linear: x's last dimension must be 9"):
        csr_linear(mdl.tensor(np.ones((2, 8))), mdl.tensor(values), s)
    with pytest.raises(ValueError, match="values must have shape"):
        csr_linear(mdl.tensor(np.ones((2, 9))), mdl.tensor(values[:-1]), s)
    with pytest.raises(ValueError, match="expects a 2-D matrix"):
        CSRStructure.from_dense(np.ones(3))


# ---------------------------------------------------------------- the layer
def _pruned_model():
    mdl.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 4))
    nn.prune.Pruning(model).prune(0.8, scope="layer")
    return model


def test_to_sparse_gives_the_same_outputs_and_leaves_the_model():
    model = _pruned_model()
    sparse = nn.sparse.to_sparse(model)
    assert isinstance(sparse[0], nn.sparse.SparseLinear) and isinstance(model[0], nn.Linear)
    x = mdl.tensor(np.random.default_rng(0).standard_normal((5, 12)).astype(np.float32))
    np.testing.assert_allclose(sparse(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-6)
    assert sparse[0].structure.nnz == int(model[0].weight_mask.array.sum())  # the mask's kept places
    np.testing.assert_array_equal(sparse[0].to_dense().weight.numpy(), model[0].weight.numpy())


def test_training_the_sparse_layer_keeps_pruned_weights_out():
    sparse = nn.sparse.to_sparse(_pruned_model())
    opt = mdl.optim.SGD(sparse.parameters(), lr=0.1)
    x = mdl.tensor(np.random.default_rng(0).standard_normal((8, 12)).astype(np.float32))
    before = sparse[0].values.numpy().copy()
    sparse(x).sum().backward()
    opt.step()
    assert not np.array_equal(sparse[0].values.numpy(), before)
    dense = sparse[0].to_dense().weight.numpy()
    assert (dense == 0).mean() >= 0.8 - 1e-9  # nothing grew where nothing is stored


def test_state_dict_round_trip_and_a_bad_structure_is_refused(tmp_path):
    sparse = nn.sparse.to_sparse(_pruned_model())
    path = tmp_path / "sparse.safetensors"
    mdl.save(sparse.state_dict(), path)
    other = nn.sparse.to_sparse(_pruned_model())
    other.load_state_dict(mdl.load(path))
    x = mdl.tensor(np.ones((2, 12), np.float32))
    np.testing.assert_array_equal(other(x).numpy(), sparse(x).numpy())
    state = sparse.state_dict()
    state["0.indices"] = state["0.indices"] + 100
    with pytest.raises(Exception, match="columns outside"):
        other.load_state_dict(state)
    np.testing.assert_array_equal(other(x).numpy(), sparse(x).numpy())  # the model was left as it was
