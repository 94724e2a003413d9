"""Tensor parallelism in one process: slicing, the direction of each collective, the checks made before any work.

The multi-rank proof (training equal to one process on 2 and 4 MPI ranks) is in test_model_parallel.py.
"""
import numpy as np
import pytest

import minidl as mdl
from minidl import nn, parallel
from minidl.models.gpt import GPT, CausalSelfAttention, GPTConfig, tensor_parallel
from minidl.ops.distributed import copy_to_group, sum_over_group
from minidl.parallel.tensor_parallel import (
    ColumnParallelLinear,
    ParallelCausalSelfAttention,
    ParallelMLP,
    RowParallelLinear,
)


class ClaimedGroup(parallel.LocalComm):
    """Claims a rank and a size; its all-reduce records each call and sums ``size`` copies of the array
    (what a real group returns when every rank holds the same values)."""

    def __init__(self, rank=0, size=2):
        self.rank, self.size, self.calls = rank, size, []

    def allreduce_(self, array):
        self.calls.append(array.shape)
        array *= self.size
        return array


def test_copy_all_reduces_the_gradient_and_sum_all_reduces_the_value():
    group = ClaimedGroup(size=2)
    x = mdl.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    y = copy_to_group(x, group)
    np.testing.assert_array_equal(y.numpy(), x.numpy())
    assert group.calls == []                           # f: nothing sent forward
    (y * 3.0).sum().backward()
    assert group.calls == [(2, 3)]                     # ... its gradient all-reduced
    np.testing.assert_array_equal(x.grad.numpy(), np.full((2, 3), 6.0))  # 2 ranks × 3
    group.calls.clear()
    x.grad = None
    z = sum_over_group(x, group)
    np.testing.assert_array_equal(z.numpy(), 2 * x.numpy())
    assert group.calls == [(2, 3)]                     # g: the value all-reduced
    (z * 3.0).sum().backward()
    assert group.calls == [(2, 3)]                     # ... its gradient passed through
    np.testing.assert_array_equal(x.grad.numpy(), np.full((2, 3), 3.0))


def test_the_communication_ops_refuse_what_is_not_a_communicator():
    with pytest.raises(TypeError, match="copy_to_group: comm must be a communicator"):
        copy_to_group(mdl.tensor([1.0]), object())


def test_column_and_row_slices_of_the_seeded_layer():
    mdl.manual_seed(0)
    full = nn.Linear(8, 12)
    mdl.manual_seed(0)
    column = ColumnParallelLinear(8, 12, ClaimedGroup(rank=1, size=4))
    np.testing.assert_array_equal(column.weight.numpy(), full.weight.numpy()[3:6])
    np.testing.assert_array_equal(column.bias.numpy(), full.bias.numpy()[3:6])
    qkv = ColumnParallelLinear.from_linear(full, ClaimedGroup(rank=1, size=2), stacked=3)  # blocks of 4 rows
    np.testing.assert_array_equal(qkv.weight.numpy(), full.weight.numpy()[[2, 3, 6, 7, 10, 11]])
    mdl.manual_seed(0)
    row = RowParallelLinear(12, 8, ClaimedGroup(rank=2, size=4))
    mdl.manual_seed(0)
    full = nn.Linear(12, 8)
    np.testing.assert_array_equal(row.weight.numpy(), full.weight.numpy()[:, 6:9])
    np.testing.assert_array_equal(row.bias.numpy(), full.bias.numpy())  # the bias stays whole


def test_in_a_world_of_one_the_split_model_is_the_plain_model():
    cfg = GPTConfig(vocab_size=7, block_size=6, n_layer=1, n_head=2, n_embd=8)
    mdl.manual_seed(3)
    plain = GPT(cfg).to(dtype=np.float64)
    mdl.manual_seed(3)
    split = tensor_parallel(GPT(cfg).to(dtype=np.float64), parallel.LocalComm())
    assert isinstance(split.blocks[0].attn, ParallelCausalSelfAttention)
    assert isinstance(split.blocks[0].mlp, ParallelMLP)
    assert [n for n, _ in plain.named_parameters()] == [n for n, _ in split.named_parameters()]
    idx = np.random.default_rng(0).integers(0, 7, size=(2, 6))
    np.testing.assert_allclose(split(idx).numpy(), plain(idx).numpy(), rtol=0, atol=1e-14)


def _draws_nothing(build):
    """Run ``build`` (which must raise) and check it drew no random number first."""
    mdl.manual_seed(5)
    with pytest.raises(ValueError) as info:
        build()
    after = mdl.rand(3).numpy()
    mdl.manual_seed(5)
    np.testing.assert_array_equal(after, mdl.rand(3).numpy())
    return str(info.value)


def test_sizes_that_do_not_divide_are_refused_before_any_weight_is_drawn():
    group = ClaimedGroup(size=4)
    message = _draws_nothing(lambda: ColumnParallelLinear(8, 10, group))
    assert "ColumnParallelLinear(8, 10): out_features (10) does not divide among the 4 ranks" in message
    assert "among 1, 2, 5, 10" in message
    message = _draws_nothing(lambda: RowParallelLinear(6, 8, group))
    assert "RowParallelLinear(6, 8): in_features (6) does not divide among the 4 ranks" in message
    assert "among 1, 2, 3, 6" in message
    message = _draws_nothing(lambda: ParallelMLP(8, 18, group))
    assert "ParallelMLP(8, 18): hidden_features (18)" in message
    message = _draws_nothing(lambda: ParallelCausalSelfAttention(12, 6, group))
    assert "num_heads (6) does not divide among the 4 ranks" in message and "among 1, 2, 3, 6" in message


def test_a_gpt_that_does_not_split_is_left_as_it_was():
    cfg = GPTConfig(vocab_size=7, block_size=6, n_layer=2, n_head=6, n_embd=12)
    model = GPT(cfg)
    before = {k: v.copy() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"GPT\(n_head=6, n_embd=12\): n_head \(6\) does not divide among the "
                                         r"4 ranks.*among 1, 2, 3, 6"):
        tensor_parallel(model, ClaimedGroup(size=4))
    assert all(isinstance(b.attn, CausalSelfAttention) for b in model.blocks)
    assert all(np.array_equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match="dropout=0.1 would draw a different mask"):
        tensor_parallel(GPT(GPTConfig(vocab_size=7, block_size=6, n_head=2, n_embd=8, dropout=0.1)),
                        ClaimedGroup(size=2))
    split = tensor_parallel(GPT(GPTConfig(vocab_size=7, block_size=6, n_head=2, n_embd=8)), ClaimedGroup(size=2))
    with pytest.raises(ValueError, match="already split"):
        tensor_parallel(split, ClaimedGroup(size=2))


def test_a_row_parallel_layer_names_the_slice_it_expects():
    layer = RowParallelLinear(8, 3, ClaimedGroup(size=2))
    with pytest.raises(ValueError, match=r"has 8 features; this rank takes its slice of 4 \(in_features / 2"):
        layer(mdl.tensor(np.ones((2, 8))))


def test_the_split_linear_weights_decay_as_the_plain_ones():
    """AdamW's decay group of the GPT recipe holds the Linear weights; split, they are column- and
    row-parallel layers, and decay all the same (the same names in each group as the plain model's)."""
    from minidl.models.gpt_train import decay_groups
    cfg = GPTConfig(vocab_size=7, block_size=6, n_layer=2, n_head=2, n_embd=8)
    plain, split = GPT(cfg), tensor_parallel(GPT(cfg), ClaimedGroup(rank=0, size=2))

    def names(model):
        name_of = {id(p): n for n, p in model.named_parameters()}
        return [[name_of[id(p)] for p in group["params"]] for group in decay_groups(model, 0.1)]

    want = names(plain)
    assert want[0] == [f"blocks.{i}.{layer}.weight" for i in range(2)
                       for layer in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")]
    assert names(split) == want
