"""SGD-Q: QSGD's quantizer is unbiased with its variance bound (by value), its bits, and 4-bit training."""
import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from minidl import nn, optim
from minidl.optim.quantized_grad import qsgd, qsgd_bits, qsgd_dequantize, qsgd_quantize


def exact_variance(v, s):
    """(‖v‖/s)² p(1 - p) per value: the variance of one QSGD draw, from its two outcomes."""
    ratio = s * np.abs(v) / np.linalg.norm(v)
    p = ratio - np.floor(ratio)
    return (np.linalg.norm(v) / s) ** 2 * p * (1 - p)


@pytest.mark.parametrize("bits", [2, 4])
def test_qsgd_is_unbiased_by_value_and_meets_the_variance_bound(bits):
    s = 2 ** (bits - 1) - 1
    v = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    n = 20000
    rng = np.random.default_rng(1)
    # n independent draws at once: each row of the (n, 64) array is a bucket of its own
    draws = qsgd(np.broadcast_to(v, (n, v.size)), bits, bucket_size=64, rng=rng).astype(np.float64)
    # each draw is ±‖v‖·ℓ/s with ℓ one of the two levels around s|v_i|/‖v‖
    norm = np.linalg.norm(v.astype(np.float64))
    level = np.abs(draws) * s / norm
    low = np.floor(s * np.abs(v) / norm)
    assert np.all(np.isclose(level, low, atol=1e-4) | np.isclose(level, low + 1, atol=1e-4))
    var = exact_variance(v.astype(np.float64), s)
    np.testing.assert_array_less(np.abs(draws.mean(0) - v), 5 * np.sqrt(var / n) + 1e-9)
    # the sample variance a²·p̂(1 - p̂) of a two-valued draw (a = ‖v‖/s) has standard deviation about
    # a²·|1 - 2p|·sqrt(p(1 - p)/n): allow 5 of them
    q = var / (norm / s) ** 2                                           # p(1 - p)
    np.testing.assert_array_less(np.abs(draws.var(0) - var), 5 * (norm / s) ** 2 * np.sqrt(q / n) + 1e-9)
    total = ((draws - v) ** 2).sum(1).mean()
    np.testing.assert_allclose(total, var.sum(), rtol=0.05)
    assert total <= min(v.size / s ** 2, np.sqrt(v.size) / s) * norm ** 2       # QSGD Lemma 3.1


def test_codes_and_bits():
    g = np.random.default_rng(2).standard_normal((3, 700)).astype(np.float32)
    codes = qsgd_quantize(g, bits=4, bucket_size=512, rng=np.random.default_rng(0))
    assert codes.levels.dtype == np.uint8 and codes.levels.max() <= 7 and codes.norms.shape == (5,)
    np.testing.assert_allclose(codes.norms[0], np.linalg.norm(g.ravel()[:512]), rtol=1e-6)
    assert qsgd_dequantize(codes).shape == (3, 700)
    assert qsgd_bits(2100, 4, 512) == 32 * 5 + 4 * 2100
    assert 32 * 512 / qsgd_bits(512, 4, 512) == pytest.approx(512 * 32 / (32 + 2048))
    np.testing.assert_array_equal(qsgd(np.zeros(10, np.float32)), 0)
    with pytest.raises(ValueError, match="QSGD: bits must be an integer from 2 to 8"):
        qsgd(g, bits=1)


def test_training_with_4_bit_gradients_converges():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 20)).astype(np.float32)
    y = (x @ rng.standard_normal((20, 3))).argmax(1)
    xt, yt = mdl.tensor(x), mdl.tensor(y)

    def run(bits):
        mdl.manual_seed(0)
        model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 3))
        opt = optim.SGD(model.parameters(), lr=0.2)
        if bits:
            opt = optim.QuantizedGradients(opt, bits=bits)
        for _ in range(150):
            loss = F.cross_entropy(model(xt), yt)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with mdl.no_grad():
            return float(F.cross_entropy(model(xt), yt)), opt

    full, _ = run(None)
    quantized, opt = run(4)
    assert quantized < 0.3 * np.log(3) and quantized < full + 0.05       # from ln 3 at the start to float32's level
    assert opt.bits_dense / opt.bits_sent > 7                             # 32 bits a value against 4 + norms
    assert opt.bits_dense == 150 * 32 * (20 * 32 + 32 + 32 * 3 + 3)


def test_qsgd_on_the_device_gives_levels_of_the_norm(standin_or_gpu):
    g = mdl.randn(3, 100, device=standin_or_gpu)
    q = mdl.backend.to_numpy(qsgd(g.array, bits=4, bucket_size=300))
    norm = np.linalg.norm(g.numpy().astype(np.float64))
    levels = np.abs(q) * 7 / norm
    np.testing.assert_allclose(levels, np.round(levels), atol=1e-4)
    assert np.all(np.abs(levels - 7 * np.abs(g.numpy()) / norm) < 1 + 1e-4)
