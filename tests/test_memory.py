"""minidl.memory.track: bytes held for backward, checked against counts made by hand."""
import gc
import tracemalloc

import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from minidl import autograd, memory, nn, profiler
from minidl.autograd import Function

B = 8  # batch size of the hand-computed examples


def chain(widths, dtype=np.float32):
    layers = []
    for a, b in zip(widths, widths[1:]):
        layers += [nn.Linear(a, b, dtype=dtype), nn.ReLU()]
    return nn.Sequential(*layers)


def hand_count(widths, itemsize=4):
    """Bytes a Linear→ReLU chain holds after forward, by hand.

    Every op keeps its inputs: Linear its input x (B·in floats, for dW = gᵀx),
    ReLU its input, the Linear output (B·out floats; backward recomputes the
    mask [x > 0] from it). The ReLU output is the next Linear's input, counted there.
    """
    return sum(B * a * itemsize + B * b * itemsize for a, b in zip(widths, widths[1:]))


def test_linear_relu_chain_matches_the_hand_count():
    widths = [10, 20, 5]
    model = chain(widths)
    x = mdl.randn(B, 10)
    with memory.track(timeline=True) as m:
        y = model(x)
        after_forward = m.current_bytes
        loss = y.sum()  # Sum keeps y, the last ReLU's output: B·5 floats more
        loss.backward()
    # x (8·10·4) + layer 1's Linear output (8·20·4) + ReLU 1's output (8·20·4) + layer 2's Linear output (8·5·4)
    assert after_forward == hand_count(widths) == 320 + 640 + 640 + 160
    assert m.peak_bytes == hand_count(widths) + B * 5 * 4  # + y held by Sum
    assert m.current_bytes == 0  # every node released by backward
    assert m.nodes == 5  # Linear, ReLU, Linear, ReLU, Sum
    assert m.timeline[-1] == 0 and max(m.timeline) == m.peak_bytes
    text = m.report()
    assert "peak" in text and "ops recorded" in text


def test_float64_doubles_the_float_part():
    widths = [6, 12, 3]
    model = chain(widths, dtype=np.float64)
    with memory.track() as m:
        y = model(mdl.randn(B, 6, dtype=np.float64))  # y holds the graph alive
    assert m.current_bytes == hand_count(widths, itemsize=8)
    del y


def test_a_view_and_its_base_count_once():
    x = mdl.randn(4, 6, requires_grad=True)  # a user's leaf tensor: counted (only Parameters are not)
    with memory.track() as m:
        y = x * 2.0  # Mul keeps x and the scalar 2 (a 4-byte float32 array)
        z = y.reshape(24)  # Reshape keeps y
        w = z * z.reshape(4, 6).reshape(24)  # a Mul of z and a view of y: y's buffer counted once
    held = x.array.nbytes + 4 + y.array.nbytes
    assert m.current_bytes == held
    del w


def test_parameters_are_left_out_unless_asked():
    layer = nn.Linear(10, 20)
    x = mdl.randn(B, 10)
    with memory.track() as without:
        y1 = layer(x)
    with memory.track(include_parameters=True) as with_params:
        y2 = layer(x)
    assert without.current_bytes == x.array.nbytes
    assert with_params.current_bytes == x.array.nbytes + layer.weight.array.nbytes + layer.bias.array.nbytes
    del y1, y2


def test_a_graph_dropped_without_backward_is_forgotten():
    model = chain([10, 10, 10])
    with memory.track() as m:
        y = model(mdl.randn(B, 10))
        assert m.current_bytes == hand_count([10, 10, 10])
        del y
        gc.collect()
        assert m.current_bytes == 0


def test_retain_graph_keeps_the_bytes():
    model = chain([10, 10])
    with memory.track() as m:
        loss = model(mdl.randn(B, 10)).sum()
        loss.backward(retain_graph=True)
        assert m.current_bytes == hand_count([10, 10]) + B * 10 * 4
        loss.backward()
        assert m.current_bytes == 0


def test_masks_saved_on_the_node_are_counted():
    x = mdl.randn(B, 50, requires_grad=True)
    mdl.manual_seed(0)
    with memory.track() as m:
        y = F.dropout(x, 0.5)  # keeps x and its scaled mask (B·50 float32)
    assert m.current_bytes == 2 * x.array.nbytes
    del y


def test_the_tracker_is_a_hook_removed_on_exit_and_nesting_refused():
    plain_call, plain_release = Function.__call__, Function.release
    with pytest.raises(ZeroDivisionError):
        with memory.track():
            (active,) = autograd.function_hooks.active
            assert isinstance(active, memory.track)
            1 / 0
    assert autograd.function_hooks.active == ()
    assert Function.__call__ is plain_call and Function.release is plain_release  # nothing was swapped
    with memory.track():
        with pytest.raises(RuntimeError, match="already active"):
            with memory.track():
                pass
    assert autograd.function_hooks.active == ()


def test_the_tracker_and_the_profiler_measure_together():
    """Two hooks at once: each sees what it sees alone, and the gradients do not change."""
    model = chain([10, 20, 5])
    x = mdl.randn(B, 10)
    with memory.track() as alone:
        model(x).sum().backward()
    plain_grads = [p.grad.numpy().copy() for p in model.parameters()]
    model.zero_grad()
    with profiler.profile() as prof, memory.track() as m:
        model(x).sum().backward()
    assert (m.peak_bytes, m.current_bytes, m.nodes) == (alone.peak_bytes, 0, alone.nodes)
    assert m.peak_bytes == hand_count([10, 20, 5]) + B * 5 * 4
    assert prof.stats[("Linear", "forward")].calls == 2 and prof.stats[("Linear", "backward")].calls == 2
    for p, g in zip(model.parameters(), plain_grads):
        np.testing.assert_array_equal(p.grad.numpy(), g)


def test_no_graph_under_no_grad():
    model = chain([10, 10])
    with memory.track() as m, mdl.no_grad():
        model(mdl.randn(B, 10))
    assert m.peak_bytes == 0 and m.nodes == 0


def test_tracemalloc_sees_at_least_the_tracked_bytes():
    """Python's tracemalloc sees NumPy's buffers: the step's growth covers what the graph holds."""
    model = chain([64, 256, 256, 256, 64])
    x = mdl.randn(64, 64)
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        with memory.track() as m:
            y = model(x)
            grown = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert m.current_bytes == hand_count([64, 256, 256, 256, 64]) * 64 // B
    assert m.current_bytes - x.array.nbytes <= grown  # x was allocated before: not part of the growth
    del y


def test_format_bytes():
    assert memory.format_bytes(512) == "512 B"
    assert memory.format_bytes(1536) == "1.5 KiB"
    assert memory.format_bytes(3 * 2**20) == "3.0 MiB"


def test_counts_on_the_device(device):
    model = chain([10, 20, 5]).to(device)
    with memory.track() as m:
        y = model(mdl.randn(B, 10, device=device))
    assert m.current_bytes == hand_count([10, 20, 5])
    del y
    assert set(m.by_device) == {"cpu" if device == "cpu" else "cuda:0"}
    if device != "cpu":
        assert m.pool_peak_bytes >= m.pool_start_bytes


# ---------------------------------------------------------------- the allocator's peak
MiB = 2**20


def test_the_host_allocator_peak_is_the_highest_sum_of_live_buffers():
    """tracemalloc sees NumPy's buffers: the peak is the largest total alive at one moment, by hand."""
    with memory.track() as m:
        a = np.ones(4 * MiB, dtype=np.uint8)  # 4 MiB
        b = np.ones(2 * MiB, dtype=np.uint8)  # 6 MiB alive: the peak
        del a
        c = np.ones(3 * MiB, dtype=np.uint8)  # 5 MiB alive
        del b, c
    assert m.peak_bytes == 0 and m.nodes == 0  # no graph: nothing saved for backward
    # Python's own small objects (frames, ints) add a few KiB over the 6 MiB of buffers
    assert 6 * MiB <= m.host_peak_bytes < 6 * MiB + 64 * 1024
    assert m.allocator_peak_bytes == m.host_peak_bytes  # the graph held no GPU array
    assert "tracemalloc" in m.report()


def test_the_allocator_sees_more_than_the_graph_saves():
    """A step's allocator peak covers every saved array plus the gradients and temporaries of backward."""
    model = chain([64, 256, 256, 64])
    with memory.track() as m:
        x = mdl.randn(B * 64, 64)  # made inside the block: the allocator sees it as the graph does
        loss = model(x).sum()
        loss.backward()
    saved = hand_count([64, 256, 256, 64]) * 64 + B * 64 * 64 * 4  # the chain's bytes and Sum's input
    assert m.peak_bytes == saved
    weights = sum(p.array.nbytes for p in model.parameters())  # their gradients are allocated in the step
    assert m.allocator_peak_bytes >= saved
    assert m.allocator_peak_bytes <= saved + weights + 4 * B * 64 * 256 * 4  # + a few gradients in flight


def test_tracemalloc_is_left_as_it_was():
    assert not tracemalloc.is_tracing()
    with memory.track():
        assert tracemalloc.is_tracing()
    assert not tracemalloc.is_tracing()  # started for the block, stopped after
    tracemalloc.start()
    try:
        with memory.track() as m:
            kept = np.ones(MiB, dtype=np.uint8)
        assert tracemalloc.is_tracing()  # a trace the caller started goes on
        assert MiB <= m.host_peak_bytes < MiB + 64 * 1024
    finally:
        tracemalloc.stop()
    with memory.track(allocator=False) as m:
        kept = np.ones(MiB, dtype=np.uint8)
    assert m.host_peak_bytes is None and m.allocator_peak_bytes is None and not tracemalloc.is_tracing()
    del kept


def test_the_pool_peak_sees_every_block_between_graph_events(standin_or_gpu):
    """CuPy's pool has no peak counter: the tracker's memory hook adds each block handed out and
    subtracts each one taken back, so a temporary that lives between two graph events counts."""
    from minidl import backend
    cp = backend.cupy_module()
    x = mdl.randn(B, 64, device="cuda", requires_grad=True)
    with memory.track() as m:
        y = x * 2.0  # a recorded op: the graph now holds x (on the GPU)
        a = cp.ones(4 * MiB, dtype=cp.uint8)  # 4 MiB
        b = cp.ones(2 * MiB, dtype=cp.uint8)  # 6 MiB: the peak, with y's 2 KiB
        del a, b
    assert set(m.by_device) == {"cuda:0"}
    rise = m.pool_peak_bytes - m.pool_start_bytes
    # y (B·64 float32) and the scalar 2.0 are alive across the peak; CuPy rounds each block up to 512 bytes
    assert 6 * MiB + y.array.nbytes <= rise <= 6 * MiB + y.array.nbytes + 2 * 512
    assert m.allocator_peak_bytes == rise
    assert "CuPy memory pool" in m.report()
    del y
