"""minidl.amp: the GradScaler's rules (scripted, and against torch.amp.GradScaler), autocast's table."""
import math

import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from minidl import amp, nn, optim
from minidl.autograd import Cast, FunctionHook
from minidl.optim import clip_grad_norm_

INF, NAN = float("inf"), float("nan")
# A scripted run: the gradient factor of each step (inf or NaN: an overflow the scaler must catch).
SCRIPT = [1.0, INF, 1.0, 1.0, 1.0, NAN, 1.0, 1.0, 1.0, 1.0, INF, INF, 1.0, 1.0, 1.0]


def run_minidl(script, **scaler_args):
    """Train one parameter on loss = Σ p·v for each scripted v; scales, parameters, skipped flags."""
    p = mdl.tensor(np.ones(2, np.float32), requires_grad=True)
    opt = optim.SGD([p], lr=0.1)
    scaler = amp.GradScaler(**scaler_args)
    scales, values, skipped = [], [], []
    for v in script:
        before = p.numpy().copy()
        opt.zero_grad()
        scaler.scale((p * v).sum()).backward()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        values.append(p.numpy().copy())
        skipped.append(bool(np.array_equal(before, p.numpy())))
    return scales, values, skipped, scaler


def expected_scales(script, init_scale, growth_factor, backoff_factor, growth_interval):
    """The rule, written out: back off on a non-finite step, grow after growth_interval good ones."""
    scale, good, out = init_scale, 0, []
    for v in script:
        if not math.isfinite(v):
            scale, good = scale * backoff_factor, 0
        else:
            good += 1
            if good == growth_interval:
                scale, good = scale * growth_factor, 0
        out.append(scale)
    return out


ARGS = dict(init_scale=8.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)


def test_scaler_follows_the_scripted_sequence():
    scales, values, skipped, scaler = run_minidl(SCRIPT, **ARGS)
    assert scales == expected_scales(SCRIPT, **ARGS)
    assert skipped == [not math.isfinite(v) for v in SCRIPT]
    assert scaler.skipped_steps == sum(not math.isfinite(v) for v in SCRIPT)
    good = sum(math.isfinite(v) for v in SCRIPT)  # each good step moves p by -lr·v = -0.1
    np.testing.assert_allclose(values[-1], 1.0 - 0.1 * good, rtol=1e-6)


def test_scaler_matches_torch_grad_scaler():
    torch = pytest.importorskip("torch")
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", **ARGS)
    t_scales, t_values, t_skipped = [], [], []
    for v in SCRIPT:
        before = p.detach().clone()
        opt.zero_grad()
        scaler.scale((p * v).sum()).backward()
        scaler.step(opt)
        scaler.update()
        t_scales.append(scaler.get_scale())
        t_values.append(p.detach().numpy().copy())
        t_skipped.append(bool(torch.equal(before, p.detach())))
    scales, values, skipped, ours = run_minidl(SCRIPT, **ARGS)
    assert scales == t_scales
    assert skipped == t_skipped
    np.testing.assert_array_equal(np.array(values), np.array(t_values))  # bit for bit
    theirs = scaler.state_dict()
    mine = ours.state_dict()
    assert {k: mine[k] for k in theirs} == theirs


@pytest.mark.filterwarnings("ignore:overflow encountered")
def test_scaler_growth_stops_at_float32_max_and_backoff_factors():
    # growth that would overflow float32 keeps the scale (PyTorch checks the grown scale is finite)
    scales, *_ = run_minidl([1.0] * 3, init_scale=2.0 ** 127, growth_interval=1)
    assert scales == [2.0 ** 127] * 3
    scales, *_ = run_minidl([INF, INF], init_scale=1.0, backoff_factor=0.25)
    assert scales == [0.25, 0.0625]


def test_unscale_then_clip_then_step_unscales_once():
    p = mdl.tensor(np.array([3.0, 4.0], np.float32), requires_grad=True)
    opt = optim.SGD([p], lr=1.0)
    scaler = amp.GradScaler(init_scale=1024.0)
    scaler.scale((p * p).sum() / 2).backward()  # g = p = (3, 4), scaled: 1024·(3, 4)
    np.testing.assert_array_equal(p.grad.numpy(), [3072.0, 4096.0])
    scaler.unscale_(opt)
    np.testing.assert_array_equal(p.grad.numpy(), [3.0, 4.0])
    norm = clip_grad_norm_([p], max_norm=1.0)
    assert float(norm) == pytest.approx(5.0)
    scaler.step(opt)  # must not divide by 1024 again
    np.testing.assert_allclose(p.numpy(), [3.0 - 0.6, 4.0 - 0.8], rtol=1e-5)
    with pytest.raises(RuntimeError, match="after step"):
        scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="already been called"):
        scaler.step(opt)
    scaler.update()
    scaler.scale((p * p).sum()).backward()
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="already been called on this optimizer"):
        scaler.unscale_(opt)


class _SpreadSGD(optim.SGD):
    """SGD over one part of a gradient whose other parts (on other processes) found ``others`` inf/NaN."""

    def __init__(self, params, others: bool, **options):
        super().__init__(params, **options)
        self.others, self.asked = others, []

    def reduce_found_inf(self, found_inf):
        self.asked.append(found_inf)
        return found_inf or self.others


@pytest.mark.parametrize("others", [False, True])
def test_unscale_asks_the_optimizer_to_reduce_the_inf_check(others):
    # this part is finite; the scaler steps unless another part overflowed, and backs off S alike
    p = mdl.tensor(np.array([1.0, -2.0], np.float32), requires_grad=True)
    opt = _SpreadSGD([p], others, lr=0.5)
    scaler = amp.GradScaler(init_scale=8.0)
    scaler.scale((p * p).sum() / 2).backward()
    scaler.step(opt)
    scaler.update()
    assert opt.asked == [False]  # the local check, handed over once
    if others:
        np.testing.assert_array_equal(p.numpy(), [1.0, -2.0])
        assert (scaler.get_scale(), scaler.skipped_steps) == (4.0, 1)
    else:
        np.testing.assert_array_equal(p.numpy(), [0.5, -1.0])  # p - 0.5 · p
        assert (scaler.get_scale(), scaler.skipped_steps) == (8.0, 0)


def test_gradient_accumulation_sums_scaled_gradients_then_unscales():
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((4, 3)).astype(np.float32) for _ in range(3)]
    w0 = rng.standard_normal(3).astype(np.float32)
    w = mdl.tensor(w0.copy(), requires_grad=True)
    opt = optim.SGD([w], lr=0.5)
    scaler = amp.GradScaler(init_scale=256.0)
    for x in xs:  # three micro-batches, one step
        scaler.scale((mdl.tensor(x) @ w).sum() / len(xs)).backward()
    scaler.step(opt)
    scaler.update()
    expected = w0 - 0.5 * sum(x.sum(0) for x in xs) / len(xs)
    np.testing.assert_allclose(w.numpy(), expected, rtol=1e-6)


def test_scaler_state_dict_round_trip_and_disabled_scaler():
    *_, scaler = run_minidl(SCRIPT[:4], **ARGS)
    state = scaler.state_dict()
    fresh = amp.GradScaler()
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state and fresh.get_scale() == scaler.get_scale()
    off = amp.GradScaler(enabled=False)
    assert off.state_dict() == {} and off.get_scale() == 1.0 and not off.is_enabled()
    loss = mdl.tensor(2.0, requires_grad=True)
    assert off.scale(loss) is loss
    with pytest.raises(RuntimeError, match="empty"):
        amp.GradScaler().load_state_dict({})
    with pytest.raises(RuntimeError, match="No inf checks"):
        amp.GradScaler().update()
    with pytest.raises(ValueError, match="growth_factor"):
        amp.GradScaler(growth_factor=1.0)


def test_scaler_refuses_float16_gradients_and_scales_lists():
    w = mdl.tensor(np.ones(2, np.float16), requires_grad=True)
    opt = optim.SGD([w], lr=0.1)
    scaler = amp.GradScaler(init_scale=4.0)
    scaler.scale((w * w).sum()).backward()
    with pytest.raises(ValueError, match="FP16 gradients"):
        scaler.unscale_(opt)
    a, (b,) = scaler.scale([mdl.tensor(1.0), (mdl.tensor(2.0),)])
    assert a.item() == 4.0 and b.item() == 8.0


# ---------------------------------------------------------------- autocast


def _inputs(rng, *shapes):
    return [mdl.tensor(rng.standard_normal(s).astype(np.float32)) for s in shapes]


def _cases():
    """One call per op of amp.OPS, on float32 (for 'lower' ops) or 16-bit (for 'float32' ops) inputs."""
    rng = np.random.default_rng(0)
    x, w, b = _inputs(rng, (4, 8), (6, 8), (6,))
    img, k = _inputs(rng, (2, 3, 6, 6), (4, 3, 3, 3))
    seq, k1 = _inputs(rng, (2, 3, 7), (4, 3, 3))
    vol, k3 = _inputs(rng, (1, 2, 4, 4, 4), (3, 2, 2, 2, 2))
    t = mdl.tensor(np.array([0, 2, 5, 1]))
    return {
        "linear": lambda lo: F.linear(x, w, b),
        "matmul": lambda lo: x @ w.T,
        "conv2d": lambda lo: F.conv2d(img, k),
        "conv1d": lambda lo: F.conv1d(seq, k1),
        "conv_transpose2d": lambda lo: F.conv_transpose2d(img[:, :, :4, :4], k.transpose(1, 0, 2, 3)),
        "conv_transpose1d": lambda lo: F.conv_transpose1d(seq, k1.transpose(1, 0, 2)),
        "conv3d": lambda lo: F.conv3d(vol, k3),
        "conv_transpose3d": lambda lo: F.conv_transpose3d(vol, k3.transpose(1, 0, 2, 3, 4)),
        "prod": lambda lo: (x * 0.1 + 1).astype(lo).prod(),
        "cumsum": lambda lo: F.cumsum(x.astype(lo), dim=1),
        "cumprod": lambda lo: F.cumprod(x.astype(lo), dim=1),
        "norm": lambda lo: F.norm(x.astype(lo)),
        "instance_norm": lambda lo: F.instance_norm(img.astype(lo)),
        "rms_norm": lambda lo: F.rms_norm(x.astype(lo), (8,)),
        "softmax": lambda lo: F.softmax(x.astype(lo), dim=-1),
        "softmin": lambda lo: F.softmin(x.astype(lo), dim=-1),
        "log_softmax": lambda lo: F.log_softmax(x.astype(lo), dim=-1),
        "sum": lambda lo: x.astype(lo).sum(),
        "normalize": lambda lo: F.normalize(x.astype(lo)),
        "cosine_similarity": lambda lo: F.cosine_similarity(x.astype(lo), x.astype(lo) + 1),
        "cross_entropy": lambda lo: F.cross_entropy(x[:, :6].astype(lo), t),
        "nll_loss": lambda lo: F.nll_loss(F.log_softmax(x[:, :6], dim=-1).astype(lo), t),
        "mse_loss": lambda lo: F.mse_loss(x.astype(lo), (x * 0.5).astype(lo)),
        "l1_loss": lambda lo: F.l1_loss(x.astype(lo), (x * 0.5).astype(lo)),
        "smooth_l1_loss": lambda lo: F.smooth_l1_loss(x.astype(lo), (x * 0.5).astype(lo)),
        "huber_loss": lambda lo: F.huber_loss(x.astype(lo), (x * 0.5).astype(lo)),
        "kl_div": lambda lo: F.kl_div(F.log_softmax(x, dim=-1).astype(lo), F.softmax(x * 2, dim=-1).astype(lo),
                                      reduction="batchmean"),
        "binary_cross_entropy": lambda lo: F.binary_cross_entropy(F.sigmoid(x).astype(lo),
                                                                  (x > 0).astype(np.float32).astype(lo)),
        "binary_cross_entropy_with_logits": lambda lo: F.binary_cross_entropy_with_logits(
            x.astype(lo), (x > 0).astype(np.float32).astype(lo)),
        "batch_norm": lambda lo: F.batch_norm(img.astype(lo), None, None, training=True),
        "scaled_dot_product_attention": lambda lo: F.scaled_dot_product_attention(
            *(x.reshape(2, 2, 8).astype(lo) for _ in range(3))),
        "layer_norm": lambda lo: F.layer_norm(x.astype(lo), (8,)),
        "group_norm": lambda lo: F.group_norm(img.astype(lo), 1),
    }


LOW = [mdl.float16, pytest.param("bfloat16", id="bfloat16")]


def _low(name):
    return mdl.bfloat16 if name == "bfloat16" else name


def test_every_op_in_the_table_has_a_case():
    assert set(_cases()) == set(amp.OPS)


@pytest.mark.parametrize("low", LOW)
def test_autocast_gives_each_op_its_tables_dtype(low):
    pytest.importorskip("ml_dtypes")
    low = _low(low)
    for name, call in _cases().items():
        with amp.autocast("cpu", dtype=low):
            out = call(low)
        want = low if amp.OPS[name] == "lower" else np.float32
        assert out.dtype == want, f"{name} under autocast({low}) gave {out.dtype}, the table says {want}"


def test_autocast_dtypes_agree_with_torch_where_torch_cpu_lists_the_op():
    """torch.autocast('cpu') puts the products in bfloat16 and the losses in float32, as minidl's table.

    softmax, log_softmax, the norms and sum run in float32 in PyTorch's CUDA list only (on the CPU PyTorch
    runs them in their input's dtype): minidl uses the CUDA list on both devices (docs/mixed_precision.md).
    """
    torch = pytest.importorskip("torch")
    pytest.importorskip("ml_dtypes")
    # float32 in minidl (PyTorch's CUDA list, and every norm), the input's dtype under torch.autocast("cpu")
    input_dtype_on_torch_cpu = {"softmax", "softmin", "log_softmax", "sum", "cumsum", "cumprod", "norm", "normalize",
                                "cosine_similarity", "batch_norm", "layer_norm", "group_norm", "rms_norm",
                                "instance_norm"}
    differs = {"scaled_dot_product_attention"}  # float32 in minidl, lower in PyTorch (docs)
    tf = torch.nn.functional
    rng = np.random.default_rng(0)
    x, w = torch.tensor(rng.standard_normal((4, 8)), dtype=torch.float32), torch.randn(6, 8)
    xb, t = x.bfloat16(), torch.tensor([0, 2, 5, 1])
    calls = {
        "linear": lambda: tf.linear(x, w), "matmul": lambda: x @ w.T,
        "conv2d": lambda: tf.conv2d(torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3)),
        "conv1d": lambda: tf.conv1d(torch.randn(2, 3, 7), torch.randn(4, 3, 3)),
        "conv_transpose2d": lambda: tf.conv_transpose2d(torch.randn(2, 3, 4, 4), torch.randn(3, 4, 3, 3)),
        "conv_transpose1d": lambda: tf.conv_transpose1d(torch.randn(2, 3, 7), torch.randn(3, 4, 3)),
        "conv3d": lambda: tf.conv3d(torch.randn(1, 2, 4, 4, 4), torch.randn(3, 2, 2, 2, 2)),
        "conv_transpose3d": lambda: tf.conv_transpose3d(torch.randn(1, 2, 4, 4, 4), torch.randn(2, 3, 2, 2, 2)),
        "prod": lambda: xb.prod(),
        "cross_entropy": lambda: tf.cross_entropy(xb[:, :6], t), "nll_loss": lambda: tf.nll_loss(xb[:, :6], t),
        "mse_loss": lambda: tf.mse_loss(xb, xb), "l1_loss": lambda: tf.l1_loss(xb, xb),
        "smooth_l1_loss": lambda: tf.smooth_l1_loss(xb, xb), "huber_loss": lambda: tf.huber_loss(xb, xb),
        "kl_div": lambda: tf.kl_div(xb, xb, reduction="batchmean", log_target=True),
        "binary_cross_entropy": lambda: tf.binary_cross_entropy(torch.sigmoid(xb), (xb > 0).bfloat16()),
        "binary_cross_entropy_with_logits": lambda: tf.binary_cross_entropy_with_logits(xb, (xb > 0).bfloat16()),
    }
    assert set(calls) | input_dtype_on_torch_cpu | differs == set(amp.OPS)
    for name, call in calls.items():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            theirs = call().dtype
        assert (theirs == torch.bfloat16) == (amp.OPS[name] == "lower"), name
    img = torch.randn(2, 3, 4, 4).bfloat16()
    kept = {  # the documented difference: PyTorch's CPU autocast leaves these in their input's dtype
        "softmax": lambda: tf.softmax(xb, -1), "softmin": lambda: tf.softmin(xb, -1),
        "log_softmax": lambda: tf.log_softmax(xb, -1), "sum": lambda: xb.sum(), "cumsum": lambda: xb.cumsum(1),
        "cumprod": lambda: xb.cumprod(1), "norm": lambda: torch.linalg.norm(xb), "normalize": lambda: tf.normalize(xb),
        "cosine_similarity": lambda: tf.cosine_similarity(xb, xb), "layer_norm": lambda: tf.layer_norm(xb, (8,)),
        "group_norm": lambda: tf.group_norm(img, 1), "rms_norm": lambda: tf.rms_norm(xb, (8,)),
        "batch_norm": lambda: tf.batch_norm(img, None, None, training=True),
        "instance_norm": lambda: tf.instance_norm(img),
    }
    assert set(kept) == input_dtype_on_torch_cpu
    for name, call in kept.items():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert call().dtype == torch.bfloat16, name
        assert amp.OPS[name] == "float32"


def test_autocast_linear_values_match_torch_bfloat16():
    torch = pytest.importorskip("torch")
    pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(1)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in [(16, 32), (8, 32), (8,)])
    with amp.autocast("cpu", dtype=mdl.bfloat16):
        ours = F.linear(mdl.tensor(x), mdl.tensor(w), mdl.tensor(b)).astype(np.float32).numpy()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        theirs = torch.nn.functional.linear(*map(torch.tensor, (x, w, b))).float().numpy()
    exact = x @ w.T + b
    # both round the inputs to bfloat16, sum in float32 and round the result: within one bfloat16 step
    np.testing.assert_allclose(ours, theirs, rtol=2 ** -7, atol=1e-2)
    assert np.abs(ours - exact).max() > 0  # it really ran in 16 bits
    np.testing.assert_allclose(ours, exact, rtol=2 ** -5, atol=0.1)


@pytest.mark.parametrize("low", LOW)
def test_master_weights_stay_float32_and_gradients_arrive_float32(low):
    pytest.importorskip("ml_dtypes")
    low = _low(low)
    mdl.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16, 3))
    opt = optim.SGD(model.parameters(), lr=0.1)
    x, y = mdl.randn(5, 1, 4, 4), mdl.tensor(np.array([0, 1, 2, 0, 1]))
    scaler = amp.GradScaler(init_scale=2.0 ** 10)
    for _ in range(3):
        opt.zero_grad()
        with amp.autocast("cpu", dtype=low):
            logits = model(x)
            loss = F.cross_entropy(logits, y)
        assert logits.dtype == low and loss.dtype == np.float32
        scaler.scale(loss).backward()
        assert all(p.grad.dtype == np.float32 for p in model.parameters())
        scaler.step(opt)
        scaler.update()
    assert all(p.dtype == np.float32 for p in model.parameters())
    # the same model in float32 takes nearly the same first step: the 16-bit math only rounds
    with amp.autocast("cpu", dtype=low):
        mixed = float(F.cross_entropy(model(x), y))
    assert mixed == pytest.approx(float(F.cross_entropy(model(x), y)), rel=0.05)


def test_bfloat16_cast_carries_gradients_back_in_float32():
    pytest.importorskip("ml_dtypes")
    x = mdl.tensor(np.array([1.0, 2.5, -3.0], np.float32), requires_grad=True)
    y = x.astype(mdl.bfloat16)
    assert y.dtype == mdl.bfloat16 and y.requires_grad and isinstance(y.creator, Cast)
    (y.astype(np.float32) * mdl.tensor(np.array([2.0, 3.0, 4.0], np.float32))).sum().backward()
    assert x.grad.dtype == np.float32
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 3.0, 4.0])
    z = mdl.tensor(np.ones(2, np.float32)).astype(mdl.bfloat16).requires_grad_()
    assert z.requires_grad


def test_float64_and_other_devices_are_left_alone_and_contexts_nest():
    x64 = mdl.randn(3, 4, dtype=np.float64)
    w64 = mdl.randn(2, 4, dtype=np.float64)
    x, w = mdl.randn(3, 4), mdl.randn(2, 4)
    with amp.autocast("cpu", dtype=mdl.float16):
        assert F.linear(x64, w64).dtype == np.float64
        assert amp.is_autocast_enabled() and amp.get_autocast_dtype("cpu") == np.float16
        with amp.autocast("cpu", enabled=False):
            assert F.linear(x, w).dtype == np.float32 and not amp.is_autocast_enabled()
        assert F.linear(x, w).dtype == np.float16
        c = mdl.tensor(np.ones((2, 2), np.complex64))
        assert (c @ c).dtype == np.complex64  # only real floats are eligible, as PyTorch
        assert F.cross_entropy(x.astype(np.float64), mdl.tensor(np.array([0, 1, 2]))).dtype == np.float64
    with amp.autocast("cuda", dtype=mdl.float16):  # CPU tensors are not cast by a GPU autocast
        assert F.linear(x, w).dtype == np.float32
    assert not amp.is_autocast_enabled() and F.linear(x, w).dtype == np.float32


def test_autocast_rejects_what_it_cannot_do():
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        amp.autocast("cpu", dtype=np.float64)
    with pytest.raises(TypeError, match="CuPy has no bfloat16"):
        amp.autocast("cuda", dtype="bfloat16")
    with pytest.raises(ValueError, match="unknown device"):
        amp.autocast("tpu")


class _Casts(FunctionHook):
    def __init__(self):
        self.count = 0

    def forward_postprocess(self, fn, inputs, outputs):
        self.count += isinstance(fn, Cast)


def test_a_weight_used_twice_is_cast_once_until_it_changes():
    w = mdl.tensor(np.ones((4, 4), np.float32), requires_grad=True)
    x = mdl.randn(2, 4)
    with amp.autocast("cpu", dtype=mdl.float16):
        with _Casts() as casts:
            y = F.linear(F.linear(x, w), w)  # x cast once, w cast once (cached), the product is float16
        assert casts.count == 2
        with mdl.no_grad():
            w.sub_(1.0)  # an in-place change: the cached copy is stale
        with _Casts() as casts:
            F.linear(x, w)
        assert casts.count == 2
    y.sum().backward()
    assert w.grad.dtype == np.float32


def test_sixteen_bit_sums_and_products_accumulate_in_float32():
    pytest.importorskip("ml_dtypes")
    ones = mdl.tensor(np.ones(1000, np.float32)).astype(mdl.bfloat16)
    assert float(ones.astype(np.float32).sum()) == 1000.0
    with amp.autocast("cpu", enabled=False):
        total = ones.sum()
    assert total.dtype == mdl.bfloat16 and float(total.astype(np.float32)) == 1000.0  # bfloat16 adds stall at 256
    assert float(ones.mean().astype(np.float32)) == 1.0
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((5, 64)).astype(np.float32), rng.standard_normal((64, 3)).astype(np.float32)
    for low in (np.float16, mdl.bfloat16):
        got = (mdl.tensor(a).astype(low) @ mdl.tensor(b).astype(low))
        assert got.dtype == low
        exact = a.astype(low).astype(np.float32) @ b.astype(low).astype(np.float32)
        np.testing.assert_array_equal(got.astype(np.float32).numpy(), exact.astype(low).astype(np.float32))


def test_the_docs_table_is_the_table():
    """docs/mixed_precision.md's autocast table lists each op of amp.OPS once, with its policy."""
    import pathlib
    import re
    page = pathlib.Path(__file__).resolve().parents[1] / "docs" / "mixed_precision.md"
    documented = {}
    for line in page.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[1] in ("lower", "float32") and "`" in cells[0]:
            for name in re.findall(r"`(\w+)`", cells[0]):
                documented[name] = cells[1]
    assert documented == amp.OPS
