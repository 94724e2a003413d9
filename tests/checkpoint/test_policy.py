"""Selective checkpointing: checkpoint(fn, *inputs, policy=...) keeps the outputs the policy names."""
import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from minidl import memory, nn
from minidl.autograd import Function
from minidl.checkpoint import checkpoint
from minidl.models.gpt import GPT, GPTConfig

B, T = 2, 16


def _gpt_grads(mode, dropout=0.0):
    """Gradients of every parameter of a 2-block GPT, each block run plainly or checkpointed."""
    mdl.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=T, n_layer=2, n_head=2, n_embd=16, dropout=dropout)).double()
    idx = mdl.tensor(np.random.default_rng(0).integers(0, 11, (B, T)))
    mdl.manual_seed(1)  # the same dropout draws in every mode
    with memory.track() as m:
        h = (model.tok_emb(idx) + model.pos_emb(mdl.arange(T))).reshape(B * T, 16)
        for block in model.blocks:
            h = block(h, T) if mode is None else checkpoint(block, h, T, policy=None if mode == "full" else mode)
        (h * h).mean().backward()
    return [p.grad.numpy() for p in model.blocks.parameters()], m


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_gpt_blocks_get_the_plain_gradients_under_every_policy(dropout):
    plain, m_plain = _gpt_grads(None, dropout)
    full, m_full = _gpt_grads("full", dropout)
    selective, m_selective = _gpt_grads("matmul,attention", dropout)
    for a, b, c in zip(plain, full, selective):
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(c, a, rtol=1e-12, atol=1e-15)
    # measured: keeping the products and the attention sits between keeping all and keeping inputs only
    assert m_full.peak_bytes < m_selective.peak_bytes < m_plain.peak_bytes


def test_kept_bytes_are_the_outputs_the_policy_names():
    """Linear → Tanh → Linear, checkpointed: after forward the node holds its input x, and with
    policy="matmul" the two Linear outputs as well: B·(32 + 8) float64 values, by hand."""
    mdl.manual_seed(0)
    block = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 8)).double()
    x = mdl.randn(5, 8, dtype=np.float64, requires_grad=True)
    held = {}
    for policy in (None, "matmul", ("Linear", "Tanh")):
        with memory.track() as m:
            y = checkpoint(block, x, policy=policy)
            held[policy] = m.current_bytes
        del y
    assert held[None] == 5 * 8 * 8  # x only
    assert held["matmul"] == 5 * 8 * 8 + 5 * (32 + 8) * 8
    assert held[("Linear", "Tanh")] == held["matmul"] + 5 * 32 * 8  # Tanh's output too


class _Counted(Function):
    """y = 3x, counting how often forward runs (an expensive op stands in here)."""
    runs = 0

    def forward(self, x):
        type(self).runs += 1
        return 3 * x

    def backward(self, gy):
        return 3 * gy


def test_a_kept_op_is_not_computed_again_and_the_rest_is():
    x = mdl.randn(4, 3, dtype=np.float64, requires_grad=True)

    def fn(t):
        return _Counted()(t.tanh()).sin()

    expected = None
    for policy, runs in ((None, 2), (lambda op: isinstance(op, _Counted), 1)):
        _Counted.runs = 0
        x.grad = None
        checkpoint(fn, x, policy=policy).sum().backward()
        assert _Counted.runs == runs  # full checkpointing runs it twice, the policy once
        expected = x.grad.numpy() if expected is None else expected
        np.testing.assert_allclose(x.grad.numpy(), 3 * np.cos(3 * np.tanh(x.numpy())) * (1 - np.tanh(x.numpy()) ** 2),
                                   rtol=1e-12)


def test_a_policy_naming_an_unknown_or_random_op_is_refused():
    x = mdl.randn(3, 4, requires_grad=True)
    with pytest.raises(ValueError, match=r"the policy names 'matmull': not an op family.*matmul, conv, attention"):
        checkpoint(F.relu, x, policy="matmull")
    with pytest.raises(ValueError, match=r"'Dropout': its draws are replayed"):
        checkpoint(F.relu, x, policy=["matmul", "Dropout"])
    with pytest.raises(TypeError, match="policy must be a callable, a string of op names or a sequence"):
        checkpoint(F.relu, x, policy=3)


def test_a_recomputation_calling_other_ops_is_an_error():
    calls = []

    def fickle(t):
        calls.append(1)
        return (t @ t.T).tanh() if len(calls) == 1 else t.tanh() @ t.T

    x = mdl.randn(3, 3, dtype=np.float64, requires_grad=True)
    y = checkpoint(fickle, x, policy="matmul")
    with pytest.raises(RuntimeError, match="op 1 of the recomputation is Transpose, but the forward pass ran MatMul"):
        y.sum().backward()
