"""What `import minidl as torch` offers a PyTorch program: the namespace, devices, torch.cuda's and
torch.backends' names, inference_mode, thread counts, Tensor methods, and mdl.load's keywords."""
import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F

# torch.* names whose PyTorch form is ATen's own signature, not F's: left out of minidl's namespace.
DELIBERATE_GAPS = {"batch_norm", "instance_norm", "embedding", "kl_div", "binary_cross_entropy_with_logits"}


def test_subpackages_are_attributes_of_the_package():
    import importlib
    for name in ("nn", "optim", "data", "functional", "utils", "cuda", "backends", "amp"):
        assert getattr(mdl, name) is importlib.import_module(f"minidl.{name}")
    assert mdl.utils.data.DataLoader is mdl.data.DataLoader
    assert mdl.utils.checkpoint.checkpoint is mdl.checkpoint.checkpoint
    from minidl.utils.data import DataLoader, TensorDataset  # PyTorch's import line, with minidl's name
    assert DataLoader is mdl.data.DataLoader and TensorDataset is mdl.data.TensorDataset


def test_every_functional_op_pytorch_offers_at_top_level_is_at_minidls():
    torch = pytest.importorskip("torch")
    missing = sorted(name for name in F.__all__ if hasattr(torch, name) and not hasattr(mdl, name))
    assert missing == sorted(DELIBERATE_GAPS & set(missing)), f"add to minidl/__init__.py: {missing}"
    for name in F.__all__:
        if hasattr(torch, name) and name not in DELIBERATE_GAPS:
            assert getattr(mdl, name) is getattr(F, name), name


def test_top_level_ops_give_pytorchs_numbers():
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).standard_normal((3, 4))
    for name in ("relu", "tanh", "sigmoid", "sum", "logsumexp"):
        ours = getattr(mdl, name)(mdl.tensor(x)) if name != "logsumexp" else mdl.logsumexp(mdl.tensor(x), 1)
        theirs = getattr(torch, name)(torch.tensor(x)) if name != "logsumexp" else torch.logsumexp(torch.tensor(x), 1)
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-12)
    values, indices = mdl.max(mdl.tensor(x), 1)
    tvalues, tindices = torch.max(torch.tensor(x), 1)
    np.testing.assert_array_equal(values.numpy(), tvalues.numpy())
    np.testing.assert_array_equal(indices.numpy(), tindices.numpy())


@pytest.mark.parametrize("spec,kind,index,text", [
    (("cpu",), "cpu", None, "cpu"), (("cuda",), "cuda", None, "cuda"),
    (("cuda:1",), "cuda", 1, "cuda:1"), (("cuda", 2), "cuda", 2, "cuda:2")])
def test_device_objects_have_pytorchs_attributes_and_are_device_names(spec, kind, index, text):
    d = mdl.device(*spec)
    assert (d.type, d.index, str(d), d == text) == (kind, index, text, True)
    torch = pytest.importorskip("torch")
    theirs = torch.device(*spec)
    assert (theirs.type, theirs.index, str(theirs)) == (d.type, d.index, str(d))


def test_a_device_object_goes_wherever_a_device_name_goes():
    x = mdl.zeros(2, device=mdl.device("cpu")).to(mdl.device("cpu"))
    assert x.device == "cpu" and x.device.type == "cpu"
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        mdl.device("tpu")


def test_cuda_answers_without_a_gpu(monkeypatch):
    from minidl import backend
    monkeypatch.setattr(backend, "gpu_available", lambda: False)
    assert mdl.cuda.is_available() is False and mdl.cuda.device_count() == 0
    with pytest.raises(RuntimeError, match="minidl.cuda.synchronize: no GPU is available"):
        mdl.cuda.synchronize()
    assert mdl.cuda.amp.GradScaler is mdl.amp.GradScaler


def test_cuda_manual_seed_leaves_the_cpu_stream_alone():
    mdl.manual_seed(3)
    first = mdl.randn(3).numpy()
    mdl.manual_seed(3)
    mdl.cuda.manual_seed_all(99)  # PyTorch's torch.cuda.manual_seed_all touches only the GPUs' generators
    np.testing.assert_array_equal(mdl.randn(3).numpy(), first)


def test_backends_flags_exist_and_are_documented_as_without_effect():
    mdl.backends.cudnn.benchmark = True
    mdl.backends.cuda.matmul.allow_tf32 = True
    assert "does nothing" in mdl.backends.__doc__


def test_inference_mode_records_no_graph():
    w = mdl.tensor([1.0], requires_grad=True)
    with mdl.inference_mode():
        y = w * 2
    assert y.creator is None and not y.requires_grad

    @mdl.inference_mode()
    def predict(x):
        return w * x
    assert predict(mdl.tensor([3.0])).creator is None
    with mdl.inference_mode(False):
        assert (w * 2).creator is not None


def test_set_num_threads_sets_what_get_num_threads_reports():
    before = mdl.get_num_threads()
    try:
        mdl.set_num_threads(1)
        assert mdl.get_num_threads() == 1
    finally:
        mdl.set_num_threads(before)
    with pytest.raises(ValueError, match="set_num_threads: count must be a positive int, got 0"):
        mdl.set_num_threads(0)


# ---------------------------------------------------------------- Tensor methods PyTorch programs use
def test_tensor_methods_as_pytorch():
    torch = pytest.importorskip("torch")
    a = np.arange(6.0).reshape(2, 3)
    x, t = mdl.tensor(a), torch.tensor(a)
    assert x.T.is_contiguous() == t.T.is_contiguous() and x.T.contiguous().is_contiguous()
    np.testing.assert_array_equal(x.T.contiguous().numpy(), t.T.contiguous().numpy())
    for name in ("eq", "ne", "lt", "le", "gt", "ge"):
        np.testing.assert_array_equal(getattr(x, name)(2.0).numpy(), getattr(t, name)(2.0).numpy())
    np.testing.assert_array_equal(x.view_as(mdl.zeros(3, 2)).numpy(), t.view_as(torch.zeros(3, 2)).numpy())
    np.testing.assert_array_equal(mdl.tensor([1.0, 2.0, 3.0]).expand_as(x).numpy(),
                                  torch.tensor([1.0, 2.0, 3.0]).expand_as(t).numpy())
    for name, args in (("new_zeros", (2, 2)), ("new_ones", (3,)), ("new_full", ((2,), 7.0))):
        ours, theirs = getattr(x, name)(*args), getattr(t, name)(*args)
        assert ours.dtype == np.float64 and ours.shape == tuple(theirs.shape)
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    assert x.type_as(mdl.zeros(1)).dtype == np.float32
    assert (x.nelement(), x.ndimension(), x.element_size()) == (t.nelement(), t.ndimension(), t.element_size())


def test_a_one_element_integer_tensor_is_an_index():
    n = mdl.tensor(2)
    assert list(range(5))[:n] == [0, 1] and [10, 20, 30][n] == 30 and int(mdl.tensor(7.9)) == 7
    with pytest.raises(TypeError, match=r"only integer tensors of a single element can be used as an index, got a "
                                        r"float32 tensor of shape \(\)"):
        [1, 2][mdl.tensor(1.0)]


def test_format_of_a_tensor():
    assert f"{mdl.tensor(0.123456):.4f}" == "0.1235" and f"{mdl.tensor(3):5d}" == "    3"
    assert f"{mdl.tensor([1.0, 2.0])}" == str(mdl.tensor([1.0, 2.0]))
    with pytest.raises(TypeError, match=r"unsupported format string '.2f' for a tensor of shape \(2,\)"):
        f"{mdl.tensor([1.0, 2.0]):.2f}"


def test_contiguous_passes_the_gradient_back_unchanged():
    x = mdl.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    y = x.T.contiguous()
    assert x.contiguous() is x  # already row-major: itself, as PyTorch
    (y * mdl.tensor(np.arange(6.0).reshape(3, 2))).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.arange(6.0).reshape(3, 2).T)


# ---------------------------------------------------------------- loading with PyTorch's keywords
def test_load_takes_pytorchs_keywords_and_refuses_unpickling(tmp_path):
    path = tmp_path / "w.safetensors"
    layer = mdl.nn.Linear(2, 3)
    mdl.save(layer.state_dict(), path)
    state = mdl.load(path, map_location=mdl.device("cpu"), weights_only=True)
    np.testing.assert_array_equal(state["weight"], layer.weight.numpy())
    np.testing.assert_array_equal(mdl.load(path, weights_only=False)["weight"], layer.weight.numpy())
    with pytest.raises(TypeError, match="map_location must name one device"):
        mdl.load(path, map_location={"cuda:0": "cpu"})
    mdl.save(layer, tmp_path / "model.safetensors")    # a whole module is pickled, as torch.save does
    with pytest.raises(ValueError, match=r"pickled Python object \('minidl.nn.*Linear'.*weights_only=False"):
        mdl.load(tmp_path / "model.safetensors")
