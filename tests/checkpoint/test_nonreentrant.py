"""The non-reentrant checkpoint: placeholders packed in forward, the segment rerun on the first unpack."""
import numpy as np
import pytest

import minidl as mdl
from minidl import memory, nn
from minidl.checkpoint import checkpoint
from minidl.checkpoint.nonreentrant import checkpoint_nonreentrant
from tests.checkpoint._helpers import assert_same_step, data, mlp


def nonreentrant(model):
    return lambda v: checkpoint(model, v, use_reentrant=False)


@pytest.mark.parametrize("dropout,batchnorm", [(0.0, False), (0.3, False), (0.0, True)])
def test_gradients_are_the_plain_runs_exactly(dropout, batchnorm):
    model, x = mlp(dropout=dropout, batchnorm=batchnorm), data(16, 12, requires_grad=True)
    assert_same_step(model, nonreentrant(model), x)  # the dropout masks are replayed: the same masks


def test_segments_in_a_chain_with_an_input_that_needs_no_gradient():
    model, x = mlp(layers=6), data(16, 12)  # x.requires_grad is False: the parameters still get theirs

    def by_segments(v):
        for block in model:
            v = checkpoint(block, v, use_reentrant=False)
        return v
    assert_same_step(model, by_segments, x)


def test_each_segment_is_recomputed_once_on_the_first_unpack():
    model, x = mlp(layers=3), data(8, 12, requires_grad=True)
    calls = []
    model[1].register_forward_hook(lambda module, inputs, output: calls.append(1))
    y = checkpoint(model, x, use_reentrant=False)
    assert len(calls) == 1
    (y * y).sum().backward()
    assert len(calls) == 2  # one rerun serves every saved tensor of the segment


def test_partial_backward_with_autograd_grad_and_a_second_pass_with_retain_graph():
    model, x = mlp(layers=4), data(8, 12, requires_grad=True)
    expected = mdl.autograd.grad((model(x) ** 2).sum(), [x, model[2][0].weight])
    y = checkpoint(model, x, use_reentrant=False)
    loss = (y * y).sum()
    first = mdl.autograd.grad(loss, [x, model[2][0].weight], retain_graph=True)
    second = mdl.autograd.grad(loss, [x])  # the values were handed out: the segment is recomputed again
    for got, want in zip(first, expected):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    np.testing.assert_array_equal(second[0].numpy(), expected[0].numpy())
    assert all(p.grad is None for p in model.parameters())  # grad() accumulates nothing


def test_a_gradient_with_respect_to_a_tensor_inside_the_segment_which_the_reentrant_one_cannot_give():
    model, x = mlp(layers=2), data(8, 12, requires_grad=True)
    inside = []

    def fn(v):
        h = model[0](v)
        inside.append(h)
        return model[1](h)
    plain_h = model[0](x)
    expected = mdl.autograd.grad((model[1](plain_h) ** 2).sum(), [plain_h])[0]
    y = checkpoint(fn, x, use_reentrant=False)
    got = mdl.autograd.grad((y * y).sum(), [inside[-1]])[0]
    np.testing.assert_array_equal(got.numpy(), expected.numpy())
    y = checkpoint(fn, x)  # reentrant: fn ran without a graph, so h is not connected to y
    with pytest.raises(RuntimeError, match="not used to compute the outputs"):
        mdl.autograd.grad((y * y).sum(), [inside[-1]])


def test_a_function_that_saves_differently_when_rerun_is_an_error():
    w = mdl.tensor(np.ones((3, 3)), requires_grad=True)
    runs = []

    def fn(v):
        runs.append(1)
        out = v @ w
        return out.tanh() if len(runs) == 1 else out  # tanh saves its output: one value more the first time
    y = checkpoint_nonreentrant(fn, mdl.tensor(np.ones((2, 3))))
    with pytest.raises(RuntimeError, match="fn must compute the same thing"):
        y.sum().backward()


def test_policy_with_the_nonreentrant_checkpoint_is_an_error():
    with pytest.raises(ValueError, match="use_reentrant=True"):
        checkpoint(lambda v: v, data(2, 2), use_reentrant=False, policy="matmul")


def test_the_step_holds_less_memory_than_without_checkpointing():
    """Six blocks of two Linear(128, 128) layers, batch 512, float32, one checkpoint per block: measured by
    the allocator (tracemalloc), which sees the recomputed arrays the segments hand out too."""
    mdl.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 128), nn.Tanh()) for _ in range(6)]
    x = mdl.tensor(np.random.default_rng(0).standard_normal((512, 128)).astype(np.float32))

    def step(checkpointed):
        for block in blocks:
            block.zero_grad()
        with memory.track() as m:
            h = x
            for block in blocks:
                h = checkpoint(block, h, use_reentrant=False) if checkpointed else block(h)
            (h * h).sum().backward()
        return m.allocator_peak_bytes, [p.grad.numpy().copy() for b in blocks for p in b.parameters()]
    plain, plain_grads = step(False)
    checked, checked_grads = step(True)
    activation = x.array.nbytes  # 256 KiB: every array between layers has x's shape
    # plain: 6 blocks × 4 saved activations (24 of them) beside the gradients; checkpointed: the 6 block
    # inputs and one block's activations. The difference is at least 12 activations (3 MiB).
    assert checked <= plain - 12 * activation
    for a, b in zip(checked_grads, plain_grads):
        np.testing.assert_array_equal(a, b)
