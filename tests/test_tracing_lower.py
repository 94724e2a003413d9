"""The traced step's lowering (minidl/tracing_lower.py): inline NumPy with out= into reused buffers,
nothing aliased that leaves the step, the plan printed as valid Python, and GPU chains fused."""
import ast
import tracemalloc

import numpy as np
import pytest

import minidl as mdl
from minidl.tracing_lower import ELEMENTWISE_C, Chain, chain_kernel, find_chains

N = 256  # 256 × 256 float32: 256 KiB per array, so that an array's allocation shows in the traced memory
ARRAY_BYTES = N * N * 4


def _deep_step():
    """Four residual ReLU layers sharing one weight, a mean of squares: 14 ops forward, 32 with backward."""
    rng = np.random.default_rng(0)
    w = mdl.tensor((rng.standard_normal((N, N)) / N).astype(np.float32), requires_grad=True)

    def step(x):
        w.grad = None
        h = x
        for _ in range(4):
            h = mdl.relu(h @ w) + x
        loss = (h * h).mean()
        loss.backward()
        return loss
    return w, step


def _batches(n):
    rng = np.random.default_rng(1)
    return [mdl.tensor(rng.standard_normal((N, N)).astype(np.float32)) for _ in range(n)]


def _peak_bytes(call):
    """The highest traced memory while ``call()`` runs, above what was traced before it."""
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        call()
        return tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()


def test_a_replay_reuses_its_buffers_and_allocates_a_few_arrays():
    """A replay of a 40-op step holds at most 7 arrays' worth of new memory at any time: the four
    weight-gradient terms and their running sums leave the step, so they are new arrays (about 6,
    kept to the end of the call); everything else is written into buffers allocated with the plan.
    The eager step, a new array per op, holds 16. The 23 results written with out= share 11
    buffers: the 8 activations backward reads, and 3 reused by everything else."""
    w, step = _deep_step()
    traced = mdl.compile(step)
    x1, x2, x3 = _batches(3)
    traced(x1)
    traced(x2)
    plan = list(traced.plans.values())[0]
    assert len(plan.ops) >= 30
    assert len(plan.memory.out_buffer) == 23  # the forward's products, ReLUs and sums, and backward's
    assert len(plan.buffers) == 11  # ... in 8 buffers kept for backward and 3 reused
    traced_peak = _peak_bytes(lambda: traced(x3))
    eager_peak = _peak_bytes(lambda: step(x3))
    assert traced_peak <= 7 * ARRAY_BYTES, traced_peak / ARRAY_BYTES
    assert eager_peak >= 12 * ARRAY_BYTES, eager_peak / ARRAY_BYTES


def test_returned_losses_and_gradients_are_new_arrays_with_their_own_values():
    """Two replays in a row: the first's loss and gradient are not overwritten by the second (no
    buffer leaves the step), and each equals the eager step's on its own batch bit for bit."""
    w, step = _deep_step()
    traced = mdl.compile(step)
    batches = _batches(4)
    traced(batches[0])
    traced(batches[1])
    loss_a = traced(batches[2])
    grad_a = w.grad.array
    loss_b = traced(batches[3])
    grad_b = w.grad.array
    assert traced.recordings == 2
    assert not np.shares_memory(grad_a, grad_b)
    assert not np.shares_memory(np.asarray(loss_a.array), np.asarray(loss_b.array))
    for x, loss, grad in ((batches[2], loss_a, grad_a), (batches[3], loss_b, grad_b)):
        expected = step(x)
        np.testing.assert_array_equal(loss.numpy(), expected.numpy())
        np.testing.assert_array_equal(grad, w.grad.array)


def test_the_plan_prints_inline_numpy_with_out_and_compiles():
    w, step = _deep_step()
    traced = mdl.compile(step)
    for x in _batches(2):
        traced(x)
    code = traced.code
    compile(code, "<plan>", "exec")  # valid Python
    assert isinstance(ast.parse(code).body[0], ast.FunctionDef)
    # the forward's product and ReLU, backward's mask: the ops' own NumPy calls, written into buffers
    assert "= np.matmul(v" in code and ", out=b" in code
    assert "= np.maximum(v" in code and ", 0, out=b" in code
    assert "np.multiply(v" in code and "np.greater(v" in code
    lines = code.splitlines()
    assert any("  # MatMul" in line and "np.matmul" in line for line in lines)
    assert any("  # ReLU" in line and "np.maximum" in line for line in lines)
    # the mean the step returns is a new array each call, written without out=
    assert any("np.mean(" in line and "out=" not in line for line in lines)


def test_a_lowered_linear_network_equals_eager_on_odd_shapes():
    """Linear with 3-D inputs (rows reshaped), with and without bias, few rows and many: the lowering's
    branches give the eager step's values bit for bit over several replays."""
    import minidl.functional as F
    from minidl import nn, optim

    def build():
        mdl.manual_seed(0)
        a, b = nn.Linear(5, 7), nn.Linear(7, 3, bias=False)
        opt = optim.SGD(list(a.parameters()) + list(b.parameters()), lr=0.1)

        def step(x, y):
            opt.zero_grad()
            loss = F.mse_loss(b(mdl.tanh(a(x))), y)
            loss.backward()
            opt.step()
            return loss
        return [a, b], step
    for shape in ((2, 3, 5), (70, 5), (4, 5)):
        rng = np.random.default_rng(len(shape))
        batches = [(mdl.tensor(rng.standard_normal(shape).astype(np.float32)),
                    mdl.tensor(rng.standard_normal(shape[:-1] + (3,)).astype(np.float32))) for _ in range(4)]
        eager_layers, eager_step = build()
        traced_layers, traced_step = build()
        traced = mdl.compile(traced_step)
        for x, y in batches:
            np.testing.assert_array_equal(traced(x, y).numpy(), eager_step(x, y).numpy())
        for e, t in zip(eager_layers, traced_layers):
            for p, q in zip(e.parameters(), t.parameters()):
                np.testing.assert_array_equal(q.numpy(), p.numpy())
        assert traced.recordings == 2
        assert "# Linear" in traced.code and "np.matmul(" in traced.code


# ---------------------------------------------------------------- GPU chains
def _entry(position, ins, out, shape=(3, 4), dtype=np.float32):
    return (position, tuple(ins), out, shape, np.dtype(dtype))


def test_chains_are_maximal_runs_whose_intermediates_only_the_next_op_reads():
    # v10 = v0 * v1; v11 = v10 + v2; v12 = exp(v11) | a matmul | v13 = v12 * v3; v14 = -v13, v14 read twice
    ops = [_entry(0, (0, 1), 10), _entry(1, (10, 2), 11), _entry(2, (11,), 12), None,
           _entry(4, (12, 3), 13), _entry(5, (13,), 14), _entry(6, (14, 14), 15, shape=(4,))]
    readers = {10: [1], 11: [2], 12: [3, 4], 13: [5], 14: [6, 9], 15: [7]}
    chains = find_chains(ops, readers, pinned_values=set())
    assert chains == [Chain((0, 1, 2), (0, 1, 2), (10, 11, 12)), Chain((4, 5), (12, 3), (13, 14))]
    # v11 also read by a later op: the run stops after it and starts again
    readers[11] = [2, 8]
    assert find_chains(ops, readers, set())[0] == Chain((0, 1), (0, 1, 2), (10, 11))
    # a gradient or a returned value cannot stay in registers either
    readers[11] = [2]
    assert find_chains(ops, readers, {10})[0] == Chain((1, 2), (10, 2), (11, 12))


def test_a_chain_kernel_is_the_ops_own_arithmetic_in_c():
    chain = Chain((0, 1, 2), (5, 6, 7), (10, 11, 12))
    kinds = {0: "Mul", 1: "Add", 2: "ReLUGrad"}
    inputs = {0: (5, 6), 1: (10, 7), 2: (11, 5)}
    in_params, out_params, body, name = chain_kernel(chain, kinds, inputs, "k")
    assert in_params == "T x0, T x1, T x2" and out_params == "T y"
    assert body.splitlines() == ["T t0 = x0 * x1;", "T t1 = t0 + x2;", "y = t1 * (T)(x0 > (T)0);"]
    assert set(ELEMENTWISE_C) >= set(kinds.values()) and "ReLU" not in ELEMENTWISE_C


def test_elementwise_chains_run_as_one_kernel_on_the_gpu_standin_equal_to_eager(standin):
    """On the stand-in (NumPy behind a CuPy face; its ElementwiseKernel runs the kernel's body as
    array statements): the chain's grouping and its C translated back give the eager values bit for
    bit. Real CUDA's rounding (with --fmad=false) is not tested here: no GPU."""
    rng = np.random.default_rng(2)
    w = mdl.tensor(rng.standard_normal((3, 4)).astype(np.float32), requires_grad=True, device="cuda")

    def step(x, y):
        w.grad = None
        loss = mdl.exp((w * x + y) * 0.5).sum()
        loss.backward()
        return loss
    traced = mdl.compile(step)
    for _ in range(4):
        x = mdl.tensor(rng.standard_normal((3, 4)).astype(np.float32), device="cuda")
        y = mdl.tensor(rng.standard_normal((3, 4)).astype(np.float32), device="cuda")
        got, got_grad = traced(x, y).numpy(), w.grad.numpy().copy()
        expected = step(x, y).numpy()
        np.testing.assert_array_equal(got, expected)
        np.testing.assert_array_equal(got_grad, w.grad.numpy())
    assert traced.recordings == 2
    assert "one GPU kernel: Mul → Add → Mul → Exp" in traced.code
    assert "one GPU kernel: Mul → Mul → Mul" in traced.code  # backward: dy·eᵗ, ·0.5, ·x
    compile(traced.code, "<plan>", "exec")


def test_lowering_leaves_other_dtypes_and_kinds_to_forward():
    """float16 goes through backend's own paths (float32 sums and products): never lowered."""
    w = mdl.tensor(np.ones((4, 4), np.float16), requires_grad=True)

    @mdl.compile
    def step(x):
        w.grad = None
        loss = (w * x).sum()
        loss.backward()
        return loss
    for _ in range(2):
        step(mdl.tensor(np.full((4, 4), 0.5, np.float16)))
    assert "out=" not in step.code and "np." not in step.code


def test_an_argument_in_another_memory_order_records_again():
    """x + y of two transposed arrays is F-ordered in NumPy; a buffer is C-ordered. The guard holds the
    arguments' layout, so a Fortran-ordered batch gets its own plan and the results stay the eager ones."""
    w = mdl.tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), requires_grad=True)

    def step(x):
        w.grad = None
        loss = ((x + x) * w).sum()
        loss.backward()
        return loss
    traced = mdl.compile(step)
    rng = np.random.default_rng(3)
    for order in "CCCFFF":
        x = mdl.tensor(np.asarray(rng.standard_normal((3, 4)), np.float32, order=order))
        got, got_grad = traced(x).numpy(), w.grad.numpy().copy()
        np.testing.assert_array_equal(got, step(x).numpy())
        np.testing.assert_array_equal(got_grad, w.grad.numpy())
    assert traced.recordings == 4 and len(traced.plans) == 2


def test_lower_false_keeps_each_ops_forward_with_the_same_values():
    _, step = _deep_step()
    lowered, plain = mdl.compile(step), mdl.compile(step, lower=False)
    for x in _batches(3):
        a, b = lowered(x).numpy(), plain(x).numpy()
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, step(x).numpy())
    assert "out=" in lowered.code and "out=" not in plain.code and "np." not in plain.code
    # results allocated per replay: 29 of the 38 ops (the 9 others return views: transposes, a
    # broadcast, a reshape), against 6 lowered (4 weight-gradient terms, the mean, Div's 1×1)
    assert list(plain.plans.values())[0].memory.new_arrays == 29
    assert list(lowered.plans.values())[0].memory.new_arrays == 6
    with pytest.raises(TypeError, match="compile: lower must be True or False"):
        mdl.compile(step, lower="yes")
