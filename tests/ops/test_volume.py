"""3-D convolution and pooling (N, C, D, H, W) against PyTorch: values and gradients."""
import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from tests.ops.torch_compare import values_and_gradients


def _both(torch, fn_mdl, fn_torch, *arrays, rtol=1e-12):
    return values_and_gradients(torch, fn_mdl, fn_torch, *arrays, rtol=rtol, atol=1e-12)[0]


def _x(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


@pytest.mark.parametrize("stride, padding, dilation, groups", [
    (1, 0, 1, 1), (2, 1, 1, 2), ((1, 2, 2), (1, 0, 1), (2, 1, 1), 1), (1, "same", (2, 1, 1), 2), (1, "valid", 1, 1),
])
def test_conv3d_matches_pytorch(torch, stride, padding, dilation, groups):
    x, w, b = _x(2, 4, 5, 6, 7), _x(6, 4 // groups, 3, 2, 3, seed=1), _x(6, seed=2)
    _both(torch, lambda x, w, b: F.conv3d(x, w, b, stride, padding, dilation, groups),
          lambda x, w, b: torch.nn.functional.conv3d(x, w, b, stride, padding, dilation, groups), x, w, b)


def test_conv3d_is_the_sum_over_depth_of_its_definition():
    """y[n, o, d, i, j] = Σ_{c, kd, p, q} x[n, c, d + kd, i + p, j + q] W[o, c, kd, p, q] + b[o], as a loop."""
    x, w, b = _x(1, 2, 3, 4, 4), _x(3, 2, 2, 2, 3, seed=1), _x(3, seed=2)
    y = F.conv3d(mdl.tensor(x), mdl.tensor(w), mdl.tensor(b)).numpy()
    want = np.zeros((1, 3, 2, 3, 2))
    for o, d, i, j in np.ndindex(3, 2, 3, 2):
        want[0, o, d, i, j] = (x[0, :, d:d + 2, i:i + 2, j:j + 3] * w[o]).sum() + b[o]
    np.testing.assert_allclose(y, want, rtol=1e-12)


@pytest.mark.parametrize("stride, padding, output_padding, dilation, groups", [
    (1, 0, 0, 1, 1), (2, 1, 1, 1, 2), ((2, 1, 2), (1, 0, 1), (1, 0, 1), (1, 2, 1), 1), (3, 0, 2, 1, 1),
    (2, 2, 1, 2, 2),
])
def test_conv_transpose3d_matches_pytorch(torch, stride, padding, output_padding, dilation, groups):
    x, w, b = _x(2, 4, 3, 4, 5), _x(4, 3, 3, 2, 3, seed=1), _x(3 * groups, seed=2)
    _both(torch, lambda x, w, b: F.conv_transpose3d(x, w, b, stride, padding, output_padding, groups, dilation),
          lambda x, w, b: torch.nn.functional.conv_transpose3d(x, w, b, stride, padding, output_padding, groups,
                                                               dilation), x, w, b)


MAX_CONFIGS = [(2, None, 0, 1, False), (3, 2, 1, 1, True), ((2, 3, 2), (1, 2, 1), (1, 1, 0), (2, 1, 1), False),
               (3, 2, 1, 2, True), (4, 3, 0, 1, True)]


@pytest.mark.parametrize("kernel, stride, padding, dilation, ceil_mode", MAX_CONFIGS)
def test_max_pool3d_matches_pytorch(torch, kernel, stride, padding, dilation, ceil_mode):
    x = np.random.default_rng(3).permutation(2 * 3 * 5 * 6 * 7).reshape(2, 3, 5, 6, 7) * 0.5
    _both(torch, lambda a: F.max_pool3d(a, kernel, stride, padding, dilation, ceil_mode),
          lambda a: torch.nn.functional.max_pool3d(a, kernel, stride, padding, dilation, ceil_mode), x)


def test_max_pool3d_sends_a_tie_to_the_first_maximum_as_pytorch(torch):
    x = np.maximum(np.round(_x(1, 2, 4, 4, 4, seed=4)), 0)  # many zeros and equal values: ReLU's output
    _both(torch, lambda a: F.max_pool3d(a, 2, 1), lambda a: torch.nn.functional.max_pool3d(a, 2, 1), x)


@pytest.mark.parametrize("kernel, stride, padding, ceil_mode, count_include_pad, divisor_override", [
    (2, None, 0, False, True, None), (3, 2, 1, True, True, None), (3, 2, 1, True, False, None),
    ((2, 3, 2), (1, 2, 1), (1, 1, 0), False, False, None), (3, 2, 1, False, True, 5),
])
def test_avg_pool3d_matches_pytorch(torch, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override):
    _both(torch, lambda a: F.avg_pool3d(a, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override),
          lambda a: torch.nn.functional.avg_pool3d(a, kernel, stride, padding, ceil_mode, count_include_pad,
                                                   divisor_override), _x(2, 3, 5, 6, 7, seed=5))


@pytest.mark.parametrize("call, match", [
    (lambda: F.conv3d(mdl.zeros(1, 2, 3, 3), mdl.zeros(1, 2, 1, 1, 1)), r"conv3d: input must be 5-D"),
    (lambda: F.conv3d(mdl.zeros(1, 2, 2, 3, 3), mdl.zeros(1, 2, 3, 1, 1)), r"conv3d: kernel depth 3"),
    (lambda: F.conv3d(mdl.zeros(1, 2, 2, 3, 3), mdl.zeros(1, 3, 1, 1, 1)), r"conv3d: input .* needs a weight"),
    (lambda: F.max_pool3d(mdl.zeros(1, 1, 2, 2, 2), 3), r"max_pool3d: kernel \(3, 3, 3\) is larger"),
    (lambda: F.max_pool3d(mdl.zeros(1, 1, 4, 4, 4), 2, return_indices=True), r"max_pool3d: return_indices"),
    (lambda: F.avg_pool3d(mdl.zeros(1, 1, 4, 4, 4), 2, padding=2), r"avg_pool3d: padding .* at most half"),
    (lambda: F.conv_transpose3d(mdl.zeros(1, 2, 2, 2, 2), mdl.zeros(3, 1, 1, 1, 1)),
     r"conv_transpose3d: weight must be 5-D \(in_channels=2"),
])
def test_3d_ops_refuse_bad_arguments_clearly(call, match):
    with pytest.raises(ValueError, match=match):
        call()
