"""The FLOP counter: products priced by hand-derived formulas, rows by module and phase, and PyTorch's count."""
import importlib.util
import pathlib
import sys

import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from minidl import nn
from minidl.models.gpt import GPT, GPTConfig
from minidl.roofline.flops import FlopCounter, count_flops, op_bytes, op_flops, transformer_training_flops

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _mlp():
    mdl.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def test_linear_forward_is_two_flops_per_multiply_add_plus_the_bias():
    b, i, o = 16, 64, 32
    counts = count_flops(nn.Linear(i, o), mdl.tensor(np.ones((b, i), np.float32)))
    assert counts.gemm_flops == 2 * b * i * o
    assert counts.total_flops == 2 * b * i * o + b * o  # one add per output for the bias
    assert counts.macs == b * i * o
    # compulsory bytes: x, W, b read, y written, float32
    assert counts.bytes == 4 * (b * i + o * i + o + b * o)


def test_an_mlp_trained_counts_each_product_three_times_except_the_first_input_gradient():
    b = 16
    x = mdl.tensor(np.random.default_rng(0).random((b, 64), dtype=np.float32))
    y = mdl.tensor(np.arange(b) % 10)
    counts = count_flops(_mlp(), x, loss_fn=lambda out: F.cross_entropy(out, y))
    forward = 2 * b * (64 * 32 + 32 * 10)
    # backward: dW for both layers, dx for the second only (x needs no gradient)
    assert counts.phase("forward").gemm_flops == forward
    assert counts.phase("backward").gemm_flops == 2 * forward - 2 * b * 64 * 32
    assert set(counts.by_module()) >= {"0", "1", "2"}
    # the ReLU: one compare forward and one multiply backward per element
    relu = [r for r in counts.rows if r.module == "1"]
    assert {r.phase: r.other_flops for r in relu} == {"forward": b * 32, "backward": b * 32}


def test_counting_leaves_gradients_and_mode_as_they_were():
    model = _mlp()
    x = mdl.tensor(np.ones((4, 64), np.float32))
    model(x).sum().backward()
    before = [p.grad.array.copy() for p in model.parameters()]
    count_flops(model, x, loss_fn=lambda out: out.sum())
    assert all(np.array_equal(p.grad.array, g) for p, g in zip(model.parameters(), before))


@pytest.mark.parametrize("stride", [1, 2])
def test_a_convolution_is_its_formula_forward_and_backward(stride):
    n, c, h, w, o, k = 2, 3, 9, 9, 5, 3
    mdl.manual_seed(0)
    conv = nn.Conv2d(c, o, k, padding=1, stride=stride)
    x = mdl.tensor(np.random.default_rng(1).random((n, c, h, w), dtype=np.float32), requires_grad=True)
    counts = count_flops(conv, x, loss_fn=lambda out: out.sum())
    oh = (h + 2 - k) // stride + 1
    macs = n * o * oh * oh * c * k * k
    assert counts.phase("forward").gemm_flops == 2 * macs
    assert counts.phase("backward").gemm_flops == 4 * macs  # dx and dW, each one forward's products


def test_a_gpt_counts_its_linears_three_times_and_attention_three_times():
    cfg = GPTConfig(vocab_size=17, block_size=8, n_layer=2, n_head=2, n_embd=16)
    mdl.manual_seed(0)
    model = GPT(cfg)
    b, t = 3, 8
    idx = mdl.tensor(np.random.default_rng(0).integers(0, 17, (b, t)))
    counts = count_flops(model, idx, loss_fn=lambda out: out.sum())
    d = cfg.n_embd
    linear_macs = b * t * cfg.n_layer * (d * 3 * d + d * d + d * 4 * d + 4 * d * d) + b * t * d * cfg.vocab_size
    attention_flops = cfg.n_layer * 2 * b * t * t * (d + d)  # Q Kᵀ and P V over every head
    assert counts.phase("forward").gemm_flops == 2 * linear_macs + attention_flops
    # every Linear's dx and dW, and attention's four products
    assert counts.phase("backward").gemm_flops == 4 * linear_macs + 2 * attention_flops


def test_ops_that_move_data_cost_no_flops_and_views_no_bytes():
    a = np.ones((4, 6), np.float32)
    assert op_flops("Transpose", [a], [a.T]) == (0.0, 0.0) and op_bytes("Transpose", [a], [a.T]) == 0.0
    assert op_flops("Concatenate", [a, a], [np.ones((8, 6), np.float32)]) == (0.0, 0.0)
    assert op_bytes("Concatenate", [a, a], [np.ones((8, 6), np.float32)]) == 4 * 48 * 2
    assert op_flops("Softmax", [a], [a]) == (0.0, 5 * 24)  # opcosts' count: max, subtract, exp, sum, divide


def test_get_total_flops_is_every_flop_counted_as_pytorch_names_it():
    model = _mlp()
    with FlopCounter(model) as fc:
        model(mdl.tensor(np.ones((2, 64), np.float32)))
    assert fc.get_total_flops() == int(fc.counts.total_flops) == 2 * 2 * (64 * 32 + 32 * 10) + 2 * (32 + 32 + 10)
    assert "total:" in fc.counts.table() and "GEMM MFLOP" in fc.counts.table()


def test_six_n_t():
    assert transformer_training_flops(1e6, 2e3) == 1.2e10


# ---------------------------------------------------------------- beside PyTorch's FlopCounterMode
def _torch_count(torch, fn):
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def test_products_equal_pytorchs_count_on_an_mlp_and_a_cnn():
    torch = pytest.importorskip("torch")
    tnn = torch.nn
    x = np.random.default_rng(0).random((4, 1, 8, 8), dtype=np.float32)
    for make in (
        lambda n: n.Sequential(n.Flatten(), n.Linear(64, 32), n.ReLU(), n.Linear(32, 10)),
        lambda n: n.Sequential(n.Conv2d(1, 8, 3, padding=1), n.ReLU(), n.Conv2d(8, 8, 3, padding=1, stride=2),
                               n.Flatten(), n.Linear(128, 10)),
    ):
        theirs = _torch_count(torch, lambda: make(tnn)(torch.from_numpy(x)).sum().backward())
        ours = count_flops(make(nn), mdl.tensor(x), loss_fn=lambda out: out.sum())
        assert ours.gemm_flops == theirs  # PyTorch counts products only, biases and elementwise ops not


def _load_nanogpt(library):
    spec = importlib.util.spec_from_file_location("bench_programs", ROOT / "benchmarks" / "bench_programs.py")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.load("nanogpt", library)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_nanogpts_linear_products_equal_pytorchs_count():
    """nanoGPT's program, run on both libraries: PyTorch's counter on the CPU sees only the ``mm`` of the
    Linear layers (its CPU attention kernel has no FLOP formula registered); ours equals that, plus
    attention's products by their formula."""
    torch = pytest.importorskip("torch")
    counts = {}
    for library in ("torch", "minidl"):
        program = _load_nanogpt(library)
        program.torch.manual_seed(0)
        model = program.GPT()
        x = program.torch.randint(0, program.VOCAB, (2, program.BLOCK))
        if library == "torch":
            counts[library] = _torch_count(torch, lambda: model(x, x)[1].backward())
        else:
            with FlopCounter(model) as counter:
                model(x, x)[1].backward()
            counts[library] = counter.counts
    ours = counts["minidl"]
    by_op = ours.by_op()
    attention = by_op["ScaledDotProductAttention"] + by_op["AttentionGrad"]
    program = _load_nanogpt("minidl")
    b, t, d = 2, program.BLOCK, program.N_EMBD
    attention_gemm = 3 * program.N_LAYER * 2 * b * t * t * (d + d)  # forward once, backward twice
    softmax = program.N_LAYER * (5 + 4) * b * program.N_HEAD * t * t
    assert attention == attention_gemm + softmax
    assert ours.gemm_flops - attention_gemm == counts["torch"]
