"""Quantization: scales against PyTorch's observers, int8 layers exact against NumPy, PTQ and QAT end to end."""
import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from minidl import nn, optim, quant
from minidl.quant.layers import QuantizedConv2d, QuantizedLinear


def test_qparams_by_hand():
    # asymmetric uint8 of [-1, 3]: s = 4 / 255, z = 0 − round(−1 / s) = round(63.75) = 64
    scale, zero = quant.qparams(-1.0, 3.0, "uint8")
    assert scale == np.float32(4 / 255) and zero == 64
    # the range is widened to hold 0: [2, 3] is treated as [0, 3], z = 0
    scale, zero = quant.qparams(2.0, 3.0, "uint8")
    assert scale == np.float32(3 / 255) and zero == 0
    # symmetric int8 of [-0.5, 2]: s = 2 / 127.5, z = 0
    scale, zero = quant.qparams(-0.5, 2.0, "int8", symmetric=True)
    assert scale == np.float32(2 / 127.5) and zero == 0
    q = quant.quantize(np.array([-1.0, 0.0, 3.0, 5.0]), *quant.qparams(-1.0, 3.0, "uint8"), "uint8")
    assert q.dtype == np.uint8 and q.tolist() == [0, 64, 255, 255]        # 5 is clipped to the top code
    x = np.linspace(-1, 3, 101)
    back = quant.dequantize(quant.quantize(x, 4 / 255, 64, "uint8"), 4 / 255, 64)
    assert np.max(np.abs(back - x)) <= 2 / 255 * (1 + 1e-5)            # at most half a step


def test_qparams_match_pytorch_observers():
    torch = pytest.importorskip("torch")
    obs = pytest.importorskip("torch.ao.quantization")
    rng = np.random.default_rng(0)
    batches = [rng.standard_normal((16, 6)).astype(np.float32) * 2 + 0.5 for _ in range(3)]
    for ours, theirs in [
            (quant.MinMaxObserver("uint8"), obs.MinMaxObserver(dtype=torch.quint8)),
            (quant.MinMaxObserver("int8", symmetric=True),
             obs.MinMaxObserver(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric)),
            (quant.MinMaxObserver("int8", symmetric=True, axis=1),
             obs.PerChannelMinMaxObserver(ch_axis=1, dtype=torch.qint8, qscheme=torch.per_channel_symmetric)),
            (quant.MovingAverageObserver(0.01, "uint8"), obs.MovingAverageMinMaxObserver(dtype=torch.quint8))]:
        for b in batches:
            ours.update(b)
            theirs(torch.from_numpy(b))
        scale, zero = ours.qparams()
        t_scale, t_zero = theirs.calculate_qparams()
        np.testing.assert_allclose(scale, t_scale.numpy(), rtol=1e-6)
        np.testing.assert_array_equal(zero, t_zero.numpy())


def test_percentile_observer_averages_the_batch_percentiles():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(1000), rng.standard_normal(1000) * 3
    observer = quant.PercentileObserver(99.0)
    observer.update(a)
    observer.update(b)
    assert observer.min_val == pytest.approx((np.percentile(a, 1) + np.percentile(b, 1)) / 2)
    assert observer.max_val == pytest.approx((np.percentile(a, 99) + np.percentile(b, 99)) / 2)


def test_fake_quantize_matches_pytorch_values_and_gradients():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 3, 5)).astype(np.float32) * 3
    scale = np.array([0.05, 0.1, 0.02], dtype=np.float32)
    zero = np.array([3, -5, 0])
    cases = [((0.07, 10, -128, 127), lambda t: torch.fake_quantize_per_tensor_affine(t, 0.07, 10, -128, 127)),
             ((0.03, 128, 0, 255), lambda t: torch.fake_quantize_per_tensor_affine(t, 0.03, 128, 0, 255)),
             ((scale.reshape(3, 1), zero.reshape(3, 1), -128, 127),
              lambda t: torch.fake_quantize_per_channel_affine(t, torch.from_numpy(scale),
                                                               torch.from_numpy(zero).int(), 1, -128, 127))]
    for args, reference in cases:
        ours = mdl.tensor(x, requires_grad=True)
        y = F.fake_quantize(ours, *args)
        (y * mdl.tensor(np.arange(60, dtype=np.float32).reshape(x.shape))).sum().backward()
        theirs = torch.tensor(x, requires_grad=True)
        t_y = reference(theirs)
        (t_y * torch.arange(60, dtype=torch.float32).reshape(x.shape)).sum().backward()
        np.testing.assert_allclose(y.numpy(), t_y.detach().numpy(), rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(ours.grad.numpy(), theirs.grad.numpy())


def test_fake_quantize_bad_input():
    x = mdl.tensor(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="scale must be positive"):
        F.fake_quantize(x, 0.0)
    with pytest.raises(ValueError, match="zero_point must be integers in \\[0, 255\\]"):
        F.fake_quantize(x, 0.1, 300, 0, 255)
    with pytest.raises(ValueError, match=r"scale of shape \(4, 1\) does not broadcast to x's shape \(2, 3\)"):
        F.fake_quantize(x, np.ones((4, 1)))


def _reference_codes(x, scale, zero, q_min, q_max):
    """The quantization equation on float64, written out: clip(round(x / s) + z)."""
    return np.clip(np.rint(x.astype(np.float32) / np.float32(scale)) + zero, q_min, q_max).astype(np.int64)


def test_int8_linear_is_exact_against_numpy():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((7, 20)).astype(np.float32)
    b = rng.standard_normal(7).astype(np.float32)
    x = rng.standard_normal((5, 20)).astype(np.float32)
    s_x, z_x = quant.qparams(x.min(), x.max(), "uint8")
    layer = QuantizedLinear(w, b, s_x, z_x)
    # reference: per-row symmetric int8 codes of w, uint8 codes of x, an int64 sum of products
    s_w = np.maximum(np.abs(w).max(axis=1), 0) / np.float32(127.5)
    q_w = np.clip(np.rint(w / s_w[:, None]), -128, 127).astype(np.int64)
    np.testing.assert_array_equal(layer.weight_q.numpy(), q_w)
    q_x = _reference_codes(x, s_x, z_x, 0, 255)
    acc = np.einsum("nk,ok->no", q_x - int(z_x), q_w)
    np.testing.assert_array_equal(layer.accumulate(x), acc)           # exactly, every accumulator
    y = layer(x).numpy()
    expected = acc.astype(np.float32) * (np.float32(s_x) * s_w.astype(np.float32)) + b
    np.testing.assert_array_equal(y, expected)
    # and close to the float layer: each product off by at most the two half-steps
    bound = 20 * (np.abs(x).max() * s_w.max() / 2 + np.abs(w).max() * s_x / 2 + s_x * s_w.max() / 4)
    assert np.max(np.abs(y - (x @ w.T + b))) < bound


def _int_conv_reference(q_centred, kernel, stride, padding):
    """Integer convolution by its definition: a loop over output pixels, in int64."""
    n, c, h, w = q_centred.shape
    o, _, kh, kw = kernel.shape
    padded = np.pad(q_centred, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    oh, ow = (h + 2 * padding - kh) // stride + 1, (w + 2 * padding - kw) // stride + 1
    out = np.zeros((n, o, oh, ow), dtype=np.int64)
    for i in range(oh):
        for j in range(ow):
            window = padded[:, :, i * stride:i * stride + kh, j * stride:j * stride + kw]
            out[:, :, i, j] = np.einsum("nchw,ochw->no", window, kernel)
    return out


def test_int8_conv_is_exact_against_numpy():
    rng = np.random.default_rng(4)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    x = np.maximum(rng.standard_normal((2, 3, 6, 5)), 0).astype(np.float32)     # ReLU outputs: z = 0
    x[0, 0, 0, 0] = -0.3                                                        # and one negative value
    s_x, z_x = quant.qparams(x.min(), x.max(), "uint8")
    assert z_x > 0
    layer = QuantizedConv2d(w, b, s_x, z_x, stride=(2, 2), padding=(1, 1))
    q_w = layer.weight_q.numpy().astype(np.int64)
    acc = _int_conv_reference(_reference_codes(x, s_x, z_x, 0, 255) - int(z_x), q_w, 2, 1)
    np.testing.assert_array_equal(layer.accumulate(x).transpose(0, 3, 1, 2), acc)
    expected = acc.astype(np.float32) * (np.float32(s_x) * layer.weight_scale.numpy())[None, :, None, None] \
        + b[None, :, None, None]
    np.testing.assert_array_equal(layer(x).numpy(), expected)
    float_out = F.conv2d(mdl.tensor(x), mdl.tensor(w), mdl.tensor(b), 2, 1).numpy()
    assert np.max(np.abs(layer(x).numpy() - float_out)) < 0.1 * np.abs(float_out).max()


def test_int32_accumulation_limit():
    with pytest.raises(ValueError, match="70000 terms per output could overflow int32"):
        quant.int_matmul(np.zeros((1, 70000), np.int32), np.zeros((70000, 1), np.int32))


def _small_cnn():
    mdl.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(4 * 4 * 4, 10))


def test_post_training_quantization_calibrates_each_input():
    model = _small_cnn()
    x = np.random.default_rng(5).standard_normal((300, 1, 8, 8)).astype(np.float32)
    before = [p.numpy().copy() for p in model.parameters()]
    int8 = quant.quantize_model(model, x)
    assert all(np.array_equal(a, p.numpy()) for a, p in zip(before, model.parameters()))   # untouched
    conv, linear = int8[0], int8[4]
    assert (conv.input_scale.item(), conv.input_zero_point.item()) == \
        tuple(v.item() for v in quant.qparams(x.min(), x.max(), "uint8"))       # the first input: x itself
    with mdl.no_grad():
        hidden = model[3](model[2](model[1](model[0](mdl.tensor(x))))).numpy()
    assert linear.input_scale.item() == quant.qparams(hidden.min(), hidden.max(), "uint8")[0]
    with mdl.no_grad():
        agree = (int8(x).numpy().argmax(1) == model(x).numpy().argmax(1)).mean()
    assert agree > 0.95                       # int8 rounding changes only near-ties
    percentile = quant.quantize_model(model, [x[:150], (x[150:], None)], method="percentile", percentile=99.0)
    assert percentile[0].input_scale.item() < conv.input_scale.item()   # outliers clipped: a finer grid
    assert quant.model_size_bytes(model) == 4 * model.num_parameters()
    # int8: 1 byte a weight; float32 biases, per-channel weight scales, input scale (4) and zero point (8)
    assert quant.model_size_bytes(int8) == (36 + 640) + 4 * (4 + 10) + 4 * (4 + 10) + 2 * (4 + 8)


def test_quantization_bad_input():
    model = _small_cnn()
    with pytest.raises(ValueError, match="no calibration data .* 0 samples"):
        quant.quantize_model(model, np.zeros((0, 1, 8, 8), np.float32))
    with pytest.raises(ValueError, match="no calibration data"):
        quant.quantize_model(model, [])
    with pytest.raises(ValueError, match="method must be 'minmax' or 'percentile', got 'mean'"):
        quant.quantize_model(model, np.zeros((2, 1, 8, 8), np.float32), method="mean")
    with pytest.raises(ValueError, match="no nn.Linear or nn.Conv2d"):
        quant.quantize_model(nn.Sequential(nn.ReLU()), np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="no fake-quantized layer"):
        quant.convert(model)
    with pytest.raises(ValueError, match="no data observed"):
        quant.MinMaxObserver().qparams()


def test_qat_trains_through_the_straight_through_gradient_and_converts_to_the_same_outputs():
    model = _small_cnn()
    rng = np.random.default_rng(6)
    x = rng.standard_normal((64, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 10, 64)
    qat = quant.prepare_qat(model)
    opt = optim.Adam(qat.parameters(), lr=0.01)
    losses = []
    for _ in range(30):
        loss = F.cross_entropy(qat(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]         # it learns (memorizes 64 samples) through fake quantization
    assert not np.array_equal(qat[0].weight.numpy(), model[0].weight.numpy())   # the copy trained, not model
    qat.eval()
    int8 = quant.convert(qat)
    with mdl.no_grad():
        simulated, integer = qat(x).numpy(), int8(x).numpy()
    # the same codes, summed exactly in int32 instead of in float32: float rounding apart, equal
    np.testing.assert_allclose(integer, simulated, rtol=1e-4, atol=1e-4 * np.abs(simulated).max())


def test_an_int8_model_saves_and_loads_without_pickle(tmp_path):
    model = _small_cnn()
    x = np.random.default_rng(7).standard_normal((40, 1, 8, 8)).astype(np.float32)
    int8 = quant.quantize_model(model, x)
    path = tmp_path / "int8.safetensors"
    mdl.save(int8.state_dict(), path)
    assert path.stat().st_size < quant.model_size_bytes(int8) + 2048     # the codes plus a small header
    twin = quant.quantize_model(_small_cnn(), x[::-1] * 2)               # another calibration
    twin.load_state_dict(mdl.load(path))
    assert twin[0].weight_q.dtype == np.int8
    np.testing.assert_array_equal(twin(x).numpy(), int8(x).numpy())
