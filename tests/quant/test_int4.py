"""4-bit weights (NF4, int4): the levels, packing, the per-block error bound, size, Linear4bit, and QLoRA."""
import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from minidl import nn, optim, quant

# QLoRA's NF4 table as published (Dettmers et al. 2023, Appendix E; bitsandbytes' create_normal_map),
# computed there with a float32 linspace: it agrees with the float64 derivation to 2e-7.
PUBLISHED_NF4 = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                 -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                 0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                 0.7229568362236023, 1.0]


def test_nf4_levels_are_the_published_table():
    np.testing.assert_allclose(quant.nf4_levels(), PUBLISHED_NF4, rtol=0, atol=5e-7)


def test_nf4_levels_are_normal_quantiles():
    # each positive level (before normalizing by the largest) is Φ⁻¹ of a probability evenly spaced
    # from 1 - δ to 1/2: check with SciPy's quantile function, independent of the module's NormalDist
    scipy_stats = pytest.importorskip("scipy.stats")
    delta = 0.5 * (1 / 30 + 1 / 32)
    top = scipy_stats.norm.ppf(1 - delta)
    np.testing.assert_allclose(quant.nf4_levels()[8:][::-1] * top,
                               scipy_stats.norm.ppf(np.linspace(1 - delta, 0.5, 9)[:-1]), rtol=1e-6)
    np.testing.assert_allclose(quant.nf4_levels()[:7] * top,
                               -scipy_stats.norm.ppf(np.linspace(1 - delta, 0.5, 8)[:-1]), rtol=1e-6)


def test_pack_unpack_round_trip_and_layout():
    codes = np.random.default_rng(0).integers(0, 16, 101).astype(np.uint8)
    packed = quant.pack_4bit(codes)
    assert packed.dtype == np.uint8 and packed.size == 51
    assert packed[0] == codes[0] | (codes[1] << 4)                 # low nibble first
    np.testing.assert_array_equal(quant.unpack_4bit(packed, 101), codes)
    with pytest.raises(ValueError, match="pack_4bit: codes must be in 0..15, got 16"):
        quant.pack_4bit([16])


@pytest.mark.parametrize("kind, half_gap", [("nf4", (1 - 0.6961928009986877) / 2), ("int4", 1 / 14)])
def test_quantization_error_bound_per_block(kind, half_gap):
    # every value within m_b · g/2 of its dequantized value, g the widest gap between levels; the
    # bound is nearly attained somewhere (4,800 normal values), and each block's largest value is exact (it is ±m_b)
    w = np.random.default_rng(1).standard_normal((48, 100)).astype(np.float32)
    w_hat = quant.dequantize_4bit(quant.quantize_4bit(w, kind, 64))
    blocks = np.pad(w.ravel(), (0, -w.size % 64)).reshape(-1, 64)
    errors = np.pad(np.abs(w_hat - w).ravel(), (0, -w.size % 64)).reshape(-1, 64)
    absmax = np.abs(blocks).max(1)
    assert np.all(errors.max(1) <= absmax * half_gap * (1 + 1e-6))
    assert (errors.max(1) / absmax).max() > 0.8 * half_gap
    top = np.abs(blocks).argmax(1)
    np.testing.assert_allclose(np.abs(w_hat.ravel()[np.arange(len(top)) * 64 + top][:-1]), absmax[:-1], rtol=1e-6)


def test_nearest_level_by_brute_force():
    w = np.random.default_rng(2).standard_normal(640).astype(np.float32)
    w_hat = quant.dequantize_4bit(quant.quantize_4bit(w, "nf4", 64))
    blocks = w.reshape(-1, 64)
    m = np.abs(blocks).max(1, keepdims=True)
    candidates = m[..., None] * np.asarray(PUBLISHED_NF4, np.float32)        # (blocks, 64, 16)
    best = np.take_along_axis(candidates, np.abs(candidates - blocks[..., None]).argmin(-1)[..., None], -1)
    np.testing.assert_allclose(w_hat, best.reshape(-1), atol=1e-6)


def test_size_in_bytes():
    w = np.random.default_rng(3).standard_normal((64, 256)).astype(np.float32)    # 256 blocks of 64
    plain = quant.quantize_4bit(w, "nf4", 64)
    assert plain.nbytes() == 64 * 256 // 2 + 256 * 4                              # codes + a float32 per block
    assert plain.bits_per_weight() == 4.0 + 32 / 64
    double = quant.quantize_4bit(w, "nf4", 64, double_quant=True)
    # int8 per block, one float32 per 256 scales, the mean: 4 + 8/64 + 32/(64·256) + 32/16384 bits
    assert double.nbytes() == 64 * 256 // 2 + 256 + 4 + 4
    assert double.bits_per_weight() == pytest.approx(4.0 + 8 / 64 + 2 * 32 / (64 * 256))


def test_double_quantization_error_of_the_scales():
    w = np.random.default_rng(4).standard_normal((40, 640)).astype(np.float32)
    plain, double = (quant.quantize_4bit(w, "nf4", 64, dq) for dq in (False, True))
    m, m_hat = plain.absmax, quant.int4.block_absmax(double)
    centred = m - m.mean()
    step = np.abs(np.pad(centred, (0, -m.size % 256)).reshape(-1, 256)).max(1) / 127
    assert np.all(np.abs(m_hat - m) <= np.repeat(step, 256)[:m.size] / 2 * (1 + 1e-5) + 1e-7)
    np.testing.assert_array_equal(double.packed, plain.packed)     # the codes do not depend on it


def test_linear4bit_matches_dequantize_then_matmul_and_passes_gradient_to_input():
    mdl.manual_seed(0)
    layer = nn.Linear(70, 30)
    q4 = quant.Linear4bit.from_linear(layer, "nf4", double_quant=True)
    x = mdl.randn(5, 70, requires_grad=True)
    y = q4(x)
    w_hat = quant.dequantize_4bit(quant.quantize_4bit(layer.weight.numpy(), "nf4", 64, True))
    np.testing.assert_allclose(y.numpy(), x.numpy() @ w_hat.T + layer.bias.numpy(), rtol=1e-5, atol=1e-5)
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.ones((5, 30)) @ w_hat, rtol=1e-5, atol=1e-5)
    assert np.abs(w_hat - layer.weight.numpy()).max() > 0                     # really quantized
    with pytest.raises(ValueError, match=r"Linear4bit: expected input \(..., 70\), got \(5, 3\)"):
        q4(mdl.randn(5, 3))


def test_linear4bit_state_dict_round_trip_and_refuses_damaged_scales(tmp_path):
    layer = quant.Linear4bit.from_linear(nn.Linear(20, 8), "int4")
    path = tmp_path / "q.safetensors"
    mdl.save(layer.state_dict(), str(path))
    fresh = quant.Linear4bit(20, 8, kind="int4")
    fresh.load_state_dict(mdl.load(str(path)))
    np.testing.assert_array_equal(fresh.dequantized_weight(), layer.dequantized_weight())
    bad = layer.state_dict()
    bad["weight_absmax"] = -bad["weight_absmax"]
    with pytest.raises(ValueError, match="weight_absmax.*finite and non-negative"):
        quant.Linear4bit(20, 8, kind="int4").load_state_dict(bad)


def _task(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((256, 16)).astype(np.float32)
    return x, (x @ rng.standard_normal((16, 4)) * 0.5).astype(np.float32)


def test_qlora_trains_only_adapters_and_improves_the_loss(tmp_path):
    mdl.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 4))
    model = quant.apply_qlora(model, rank=4, alpha=8)
    bases = [m.base for m in model.modules() if isinstance(m, nn.lora.LoRALinear)]
    assert len(bases) == 2 and all(isinstance(b, quant.Linear4bit) for b in bases)
    codes_before = [b.weight_packed.numpy().copy() for b in bases]
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert sorted(trainable) == ["0.lora_A", "0.lora_B", "2.lora_A", "2.lora_B"]
    x, y = (mdl.tensor(a) for a in _task())
    opt = optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(60):
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < 0.5 * losses[0]
    for base, before in zip(bases, codes_before):
        np.testing.assert_array_equal(base.weight_packed.numpy(), before)
        assert base.bias.grad is None
    # the lower layer's adapters got a gradient: it flowed through the upper layer's dequantized base
    assert np.abs(model[0].lora_B.grad.numpy()).max() > 0
    path = tmp_path / "qlora.safetensors"
    mdl.save(model.state_dict(), str(path))
    mdl.manual_seed(5)
    again = quant.apply_qlora(nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 4)), rank=4, alpha=8)
    again.load_state_dict(mdl.load(str(path)))
    with mdl.no_grad():
        np.testing.assert_array_equal(again(x).numpy(), model(x).numpy())
    merged = nn.lora.merge_lora(again)                                # a float model: Ŵ + (α/r) B A
    with mdl.no_grad():
        np.testing.assert_allclose(merged(x).numpy(), model(x).numpy(), rtol=1e-4, atol=1e-5)


def test_linear4bit_on_the_device_matches_the_cpu(standin_or_gpu):
    mdl.manual_seed(0)
    layer = quant.Linear4bit.from_linear(nn.Linear(70, 30), "nf4", double_quant=True)
    x = np.random.default_rng(0).standard_normal((4, 70)).astype(np.float32)
    expected = layer(mdl.tensor(x)).numpy()
    layer.to(standin_or_gpu)
    y = layer(mdl.tensor(x, device=standin_or_gpu))
    assert y.device.startswith("cuda")
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-5, atol=1e-5)
