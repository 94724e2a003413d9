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


# ---------------------------------------------------------------- whole states (checkpoints)
class ThreadGroup(parallel.LocalComm):
    """Rank ``rank`` of a group whose ranks are threads of this process: each collective hands every
    rank's array to all of them at a barrier (what MPI's Allgather and Allreduce return, summed in rank
    order)."""

    def __init__(self, rank, meeting):
        self.rank, self.size, self.meeting = rank, len(meeting["slots"]), meeting

    def _exchange(self, array):
        slots, barrier = self.meeting["slots"], self.meeting["barrier"]
        slots[self.rank] = np.array(array, copy=True)
        barrier.wait()
        parts = [s.copy() for s in slots]
        barrier.wait()                                  # nobody overwrites a slot before all have read
        return parts

    def allreduce_(self, array):
        parts = self._exchange(array)
        total = parts[0]
        for part in parts[1:]:
            total = total + part
        array[...] = total
        return array

    host_allreduce_ = allreduce_

    def allgather(self, array):
        return np.stack(self._exchange(array))


def _on_threads(size, build, work):
    """``work(model)`` on ``size`` ranks, each a thread, ``model = build(comm)`` made first for each rank
    in turn (the seeded generator is one for the process) with its ThreadGroup; their results by rank."""
    import threading
    meeting = {"slots": [None] * size, "barrier": threading.Barrier(size, timeout=60)}
    models = [build(ThreadGroup(rank, meeting)) for rank in range(size)]
    results, errors = [None] * size, []

    def run(rank):
        try:
            results[rank] = work(models[rank])
        except BaseException as exc:  # noqa: BLE001 - reported below, the others released
            errors.append(exc)
            meeting["barrier"].abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


CFG = dict(vocab_size=11, block_size=6, n_layer=2, n_head=4, n_embd=8)


def _gpt(comm=None, seed=7):
    mdl.manual_seed(seed)
    model = GPT(GPTConfig(**CFG)).to(dtype=np.float64)
    return model if comm is None else tensor_parallel(model, comm)


@pytest.mark.parametrize("size", [2, 4])
def test_whole_to_slices_to_whole_is_exact(size):
    """Any array shaped like a split parameter (a weight, or Adam's moment of it) cut into the ranks'
    slices and gathered again is the original, bit for bit; the slices of the plain model's state are
    the split model's own parameters."""
    plain = _gpt().state_dict()
    noise = {k: np.random.default_rng(1).standard_normal(np.shape(v)) for k, v in plain.items()}

    def work(split):
        from minidl.parallel.tensor_parallel import consolidated_state_dict, local_state_dict, parameter_layers
        local = local_state_dict(split, plain)
        for key, value in split.state_dict().items():
            np.testing.assert_array_equal(local[key], value, err_msg=key)   # as the split model cut them
        layers, back = parameter_layers(split), {}
        for key, p in split.named_parameters():
            if id(p) in layers:
                layer, name = layers[id(p)]
                back[key] = layer.gather_whole(name, layer.slice_whole(name, noise[key]))
        split.load_state_dict(local_state_dict(split, noise))
        return back, consolidated_state_dict(split)

    for back, whole in _on_threads(size, _gpt, work):
        assert sorted(back) == sorted(k for k in plain if ".attn." in k or ".mlp." in k)
        for key in back:
            np.testing.assert_array_equal(back[key], noise[key], err_msg=key)
        assert list(whole) == list(plain)
        for key in plain:
            np.testing.assert_array_equal(whole[key], noise[key], err_msg=key)


def _adam_steps(model, steps=3):
    """AdamW over the GPT recipe's decay groups, a few steps on fixed token batches; the optimizer."""
    from minidl import optim
    from minidl.models.gpt_train import decay_groups, lm_loss
    opt = optim.AdamW(decay_groups(model, 0.1), lr=1e-2, betas=(0.9, 0.99))
    rng = np.random.default_rng(3)
    for _ in range(steps):
        idx = rng.integers(0, CFG["vocab_size"], size=(3, CFG["block_size"] + 1))
        lm_loss(model(idx[:, :-1]), idx[:, 1:]).backward()
        opt.step()
        opt.zero_grad()
    return opt


def test_one_processes_adam_state_cut_for_the_ranks_and_gathered_again_is_itself():
    """The AdamW state of 3 steps on the unsplit model, cut for each of 2 ranks, holds for each split
    parameter the slices NumPy indexing gives (the Q, K and V blocks' rows; the row-parallel columns),
    loads into the split model's optimizer, and gathered from the ranks again is the state, bit for bit.
    (That the state a split run reaches equals one process's is test_cli_gpt_parallel.py's, on MPI ranks.)"""
    from minidl import optim
    from minidl.models.gpt_train import decay_groups
    from minidl.parallel.tensor_parallel import consolidate_optimizer_state, local_optimizer_state
    plain = _gpt()
    want = _adam_steps(plain).state_dict()
    names = [n for g in decay_groups(plain, 0.1) for n, p in plain.named_parameters()
             if any(p is q for q in g["params"])]
    qkv, proj = names.index("blocks.0.attn.qkv.weight"), names.index("blocks.1.mlp.proj.weight")

    def build(comm):
        split = _gpt(comm)
        opt = optim.AdamW(decay_groups(split, 0.1), lr=1e-2, betas=(0.9, 0.99))
        params = [p for g in opt.param_groups for p in g["params"]]
        opt.load_state_dict(local_optimizer_state(split, want, params))
        return split, opt, params

    def work(built):
        split, opt, params = built
        return opt.state_dict(), consolidate_optimizer_state(split, opt.state_dict(), params)

    for rank, (own, whole) in enumerate(_on_threads(2, build, work)):
        m = want["state"][qkv]["m"]                      # (24, 8): Q, K, V blocks of 8 rows, 4 each per rank
        np.testing.assert_array_equal(own["state"][qkv]["m"],
                                      np.concatenate([m[j * 8 + 4 * rank: j * 8 + 4 * rank + 4] for j in range(3)]))
        v = want["state"][proj]["v"]                     # (8, 32): 16 input columns per rank
        np.testing.assert_array_equal(own["state"][proj]["v"], v[:, 16 * rank: 16 * rank + 16])
        assert own["state"][qkv]["t"] == want["state"][qkv]["t"] == 3
        assert whole["param_groups"] == want["param_groups"]
        assert list(whole["state"]) == list(want["state"])
        for pos, entry in want["state"].items():
            assert list(whole["state"][pos]) == list(entry)
            for key, value in entry.items():
                np.testing.assert_array_equal(whole["state"][pos][key], value, err_msg=f"{names[pos]} {key}")


def test_one_ranks_slices_loaded_into_another_split_are_refused_naming_the_parameter_and_the_shapes():
    from minidl.parallel.tensor_parallel import TensorParallel, local_optimizer_state
    two = _gpt(ClaimedGroup(rank=0, size=2))
    slices = two.state_dict()                               # rank 0's slices of a 2-way split
    four = TensorParallel(_gpt(ClaimedGroup(rank=1, size=4), seed=8))
    before = {k: v.copy() for k, v in four.state_dict().items()}
    for attempt in (four.check_state_dict, four.load_state_dict):
        with pytest.raises(ValueError) as info:
            attempt(slices)
        message = str(info.value)
        assert message.startswith("parameter 'blocks.0.attn.qkv.weight': got shape (12, 8) (the shape of one "
                                  "rank's slice of a 2-way split")
        assert "the whole (unsplit) parameter has shape (24, 8)" in message
        assert "this rank's slice (rank 1 of 4) has shape (6, 8)" in message
        assert "Load a consolidated state" in message and "consolidated_state_dict(model)" in message
    assert all(np.array_equal(before[k], v) for k, v in four.state_dict().items())   # nothing changed
    row = {**_gpt().state_dict(), "blocks.1.mlp.proj.weight": slices["blocks.1.mlp.proj.weight"]}
    with pytest.raises(ValueError, match=r"parameter 'blocks.1.mlp.proj.weight': got shape \(8, 16\) .*2-way "
                                         r"split.*whole \(unsplit\) parameter has shape \(8, 32\) and this rank's "
                                         r"slice \(rank 1 of 4\) has shape \(8, 8\)"):
        four.load_state_dict(row)
    # an optimizer state holding one rank's slices: the same refusal, naming the state
    from minidl.models.gpt_train import decay_groups
    state = _adam_steps(_gpt(), steps=1).state_dict()
    params = [p for g in decay_groups(four, 0.1) for p in g["params"]]
    position = next(i for i, p in enumerate(params) if p is four.module.blocks[0].attn.qkv.weight)
    state["state"][position]["m"] = state["state"][position]["m"][:12]
    with pytest.raises(ValueError, match=r"the optimizer state 'm' of parameter 'blocks.0.attn.qkv.weight': got "
                                         r"shape \(12, 8\).*whole \(unsplit\) parameter has shape \(24, 8\)"):
        local_optimizer_state(four, state, params)
