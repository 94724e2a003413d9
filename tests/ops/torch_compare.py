"""One function of minidl and its PyTorch twin, compared in value and gradient on the same inputs."""
import numpy as np

import minidl as mdl


def values_and_gradients(torch, fn_mdl, fn_torch, *arrays, seed=1, rtol=1e-12, atol=1e-14,
                         grad_rtol=None, grad_atol=None):
    """Assert that ``fn_mdl`` and ``fn_torch`` agree on ``arrays``: the shapes, the values (rtol, atol) and the
    gradients under one random upstream gradient (grad_rtol, grad_atol; the values' by default).

    Returns (minidl's value, [minidl's gradient of each input]) as NumPy arrays.
    """
    ours = [mdl.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    y, ty = fn_mdl(*ours), fn_torch(*theirs)
    assert y.shape == tuple(ty.shape)
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=rtol, atol=atol)
    g = np.random.default_rng(seed).standard_normal(y.shape)
    y.backward(grad=g)
    ty.backward(torch.tensor(g))
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=rtol if grad_rtol is None else grad_rtol,
                                   atol=atol if grad_atol is None else grad_atol)
    return y.numpy(), [a.grad.numpy() for a in ours]
