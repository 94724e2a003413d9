"""The 3-D layers (Conv3d, ConvTranspose3d, MaxPool3d, AvgPool3d, BatchNorm3d, InstanceNorm3d) against
PyTorch's, with PyTorch's weights copied in: outputs, input gradients, parameter gradients, running statistics."""
import numpy as np
import pytest

import minidl as mdl
from minidl import nn

torch = pytest.importorskip("torch")


def _copy_parameters(ours, theirs):
    for name, p in theirs.named_parameters():
        getattr(ours, name).array[...] = p.detach().numpy()


@pytest.mark.parametrize("make", [
    lambda m: m.Conv3d(4, 6, (3, 2, 3), stride=(1, 2, 1), padding=1, groups=2),
    lambda m: m.Conv3d(4, 2, 3, padding="same", bias=False),
    lambda m: m.ConvTranspose3d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2),
    lambda m: m.MaxPool3d(3, stride=2, padding=1, ceil_mode=True),
    lambda m: m.AvgPool3d((2, 3, 3), stride=2, padding=1, count_include_pad=False),
    lambda m: m.BatchNorm3d(4),
    lambda m: m.InstanceNorm3d(4, affine=True),
])
def test_3d_layer_matches_pytorch_with_its_weights(make):
    ours, theirs = make(nn).double(), make(torch.nn).double()
    _copy_parameters(ours, theirs)
    x = np.random.default_rng(0).standard_normal((2, 4, 5, 6, 7))
    a, t = mdl.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    y, ty = ours(a), theirs(t)
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-10, atol=1e-12)
    g = np.random.default_rng(1).standard_normal(y.shape)
    y.backward(grad=g)
    ty.backward(torch.tensor(g))
    np.testing.assert_allclose(a.grad.numpy(), t.grad.numpy(), rtol=1e-10, atol=1e-12)
    for name, p in theirs.named_parameters():
        np.testing.assert_allclose(getattr(ours, name).grad.numpy(), p.grad.numpy(), rtol=1e-10, atol=1e-12)
    for name, b in theirs.named_buffers():
        if b is not None and b.dtype.is_floating_point:
            np.testing.assert_allclose(getattr(ours, name).numpy(), b.numpy(), rtol=1e-10)


def test_3d_layers_load_pytorchs_state_dict_keys():
    theirs = torch.nn.Sequential(torch.nn.Conv3d(2, 3, 2), torch.nn.BatchNorm3d(3), torch.nn.ConvTranspose3d(3, 2, 2))
    ours = nn.Sequential(nn.Conv3d(2, 3, 2), nn.BatchNorm3d(3), nn.ConvTranspose3d(3, 2, 2))
    state = {k: v.detach().numpy() for k, v in theirs.state_dict().items()}
    ours.load_state_dict(state)
    assert sorted(ours.state_dict()) == sorted(state)


def test_3d_layers_refuse_other_ranks():
    with pytest.raises(ValueError, match=r"Conv3d: expected input \(N, C, D, H, W\) with C=2"):
        nn.Conv3d(2, 3, 1)(mdl.zeros(1, 2, 4, 4))
    with pytest.raises(ValueError, match=r"MaxPool3d: expected input \(N, C, D, H, W\)"):
        nn.MaxPool3d(2)(mdl.zeros(1, 2, 4, 4))
    with pytest.raises(ValueError, match=r"BatchNorm3d\(2\): expected input \(N, C, D, H, W\)"):
        nn.BatchNorm3d(2)(mdl.zeros(1, 2, 4, 4))
