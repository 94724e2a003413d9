"""Filter-wise and spatial parallelism in one process: the world of one, the parts each rank keeps, the
checks made before any communication, the gather/split op pair.

The multi-rank proof (equal to one process on 2 and 4 MPI ranks, bytes against the cost model) is in
test_split_mpi.py.
"""
import os
import sys

import numpy as np
import pytest

import minidl as mdl
from minidl import nn, parallel
from minidl.ops.group_gather import gather_from_group, split_to_group
from minidl.parallel import cost_model
from minidl.parallel.filter_parallel import (
    FilterParallel,
    FilterParallelConv2d,
    InputChannelParallelConv2d,
    filter_parallel,
)
from minidl.parallel.spatial import SpatialConv2d, SpatialParallel, halo_exchange

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import split_scenarios as S  # noqa: E402


class ClaimedGroup(parallel.LocalComm):
    """Claims a rank and a size; its all-gather stacks (r + 1) · x for every rank r (what a group returns when
    rank r holds (r + 1) times this rank's values)."""

    def __init__(self, rank=0, size=2):
        self.rank, self.size = rank, size

    def allgather(self, array):
        return np.stack([(r + 1) * array for r in range(self.size)])


def _plain_and(wrap, make=S.cnn, batch=S.cnn_batch):
    want = S.forward_backward(make(), *batch())
    reference = make()
    S.forward_backward(reference, *batch())
    model = make()
    got = S.forward_backward(wrap(model), *batch())
    return want, got, reference, model


@pytest.mark.parametrize("scheme", ["filter_gathered", "filter_paired", "spatial"])
@pytest.mark.parametrize("make,batch", [(S.cnn, S.cnn_batch), (S.odd_cnn, S.odd_batch)], ids=["cnn", "odd"])
def test_the_world_of_one_computes_what_the_plain_model_does(scheme, make, batch):
    comm = parallel.LocalComm()
    wrap = {"filter_gathered": lambda m: FilterParallel(filter_parallel(m, comm, pair=False)),
            "filter_paired": lambda m: FilterParallel(filter_parallel(m, comm)),
            "spatial": lambda m: SpatialParallel(m, comm)}[scheme]
    (want_out, want_gx), (out, gx), reference, model = _plain_and(wrap, make, batch)
    np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(gx, want_gx, rtol=1e-12, atol=1e-14)
    grads = dict(model.named_parameters())
    for name, p in reference.named_parameters():
        np.testing.assert_allclose(grads[name].grad.numpy(), p.grad.numpy(), rtol=1e-12, atol=1e-14)


def test_each_rank_keeps_its_filters_and_its_input_channels():
    mdl.manual_seed(0)
    conv = nn.Conv2d(6, 8, 3, padding=1)
    w, b = conv.weight.numpy(), conv.bias.numpy()
    layer = FilterParallelConv2d.from_layer(conv, ClaimedGroup(rank=1, size=2))
    np.testing.assert_array_equal(layer.weight.numpy(), w[4:8])          # filters 4..7 of 8
    np.testing.assert_array_equal(layer.bias.numpy(), b[4:8])
    rows = InputChannelParallelConv2d.from_layer(conv, ClaimedGroup(rank=2, size=3))
    np.testing.assert_array_equal(rows.weight.numpy(), w[:, 4:6])        # input channels 4, 5 of 6
    np.testing.assert_array_equal(rows.bias.numpy(), b)                  # the bias whole, added once
    # whole ↔ part: the slice of the whole is the part; the gather lays the ranks' parts in order
    np.testing.assert_array_equal(layer.slice_whole("weight", w), w[4:8])
    gathered = layer.gather_whole("weight", layer.weight.numpy())        # rank r holds (r + 1) · part
    np.testing.assert_array_equal(gathered, np.concatenate([w[4:8], 2 * w[4:8]]))
    gathered = rows.gather_whole("weight", rows.weight.numpy())
    np.testing.assert_array_equal(gathered, np.concatenate([w[:, 4:6], 2 * w[:, 4:6], 3 * w[:, 4:6]], axis=1))
    with pytest.raises(ValueError, match="whole .*unsplit.* weights"):
        layer.slice_whole("weight", w[:4])


def test_uneven_channel_counts_are_refused_with_the_divisors():
    mdl.manual_seed(0)
    conv = nn.Conv2d(6, 8, 3, padding=1)
    with pytest.raises(ValueError, match=r"out_channels \(8\) does not split evenly over 3 ranks.*1, 2, 4, 8"):
        FilterParallelConv2d.from_layer(conv, ClaimedGroup(size=3))
    with pytest.raises(ValueError, match=r"in_channels \(6\) does not split evenly over 4 ranks.*1, 2, 3, 6"):
        InputChannelParallelConv2d.from_layer(conv, ClaimedGroup(size=4))
    with pytest.raises(ValueError, match="groups=2"):
        FilterParallelConv2d.from_layer(nn.Conv2d(4, 4, 3, groups=2), parallel.LocalComm())
    with pytest.raises(TypeError, match="expected an nn.Conv2d"):
        FilterParallelConv2d.from_layer(nn.Linear(3, 4), parallel.LocalComm())


def test_filter_parallel_pairs_a_convolution_with_the_next_through_elementwise_layers():
    model = filter_parallel(S.cnn(), parallel.LocalComm())
    assert isinstance(model[0], FilterParallelConv2d) and not model[0].gather_output
    assert isinstance(model[2], InputChannelParallelConv2d)
    alone = filter_parallel(S.cnn(), parallel.LocalComm(), pair=False)
    assert isinstance(alone[2], FilterParallelConv2d) and alone[0].gather_output and alone[2].gather_output
    with pytest.raises(ValueError, match="no nn.Conv2d"):
        filter_parallel(nn.Sequential(nn.Linear(2, 2)), parallel.LocalComm())
    with pytest.raises(ValueError, match="no filter-wise split"):
        FilterParallel(nn.Sequential(nn.Linear(2, 2)))


def test_the_filter_wrapper_saves_and_loads_whole_weights():
    plain = S.cnn()
    model = FilterParallel(filter_parallel(S.cnn(), parallel.LocalComm()))
    state = model.consolidated_state_dict()
    assert sorted(state) == sorted(plain.state_dict())
    for name, value in plain.state_dict().items():
        np.testing.assert_array_equal(np.asarray(state[name]), np.asarray(value))
    doubled = {name: 2 * np.asarray(value) for name, value in plain.state_dict().items()}
    model.load_state_dict(doubled)
    np.testing.assert_array_equal(model.module[2].weight.numpy(), doubled["2.weight"])


def test_a_strip_thinner_than_its_halo_is_refused_before_any_exchange():
    mdl.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 2, 7, padding=3), nn.Flatten())   # halo 3; 4 ranks of 8 rows: strips of 2
    spatial = SpatialParallel(model, ClaimedGroup(rank=0, size=4))
    with pytest.raises(ValueError, match="strip has 2 rows, thinner than the halo of 3 rows"):
        spatial(np.zeros((1, 1, 8, 8)))
    with pytest.raises(ValueError, match="height divides by the 4 ranks"):
        spatial(np.zeros((1, 1, 10, 8)))
    with pytest.raises(ValueError, match="thinner than the halo"):
        halo_exchange(np.zeros((1, 1, 2, 3)), 3, ClaimedGroup())


@pytest.mark.parametrize("conv,match", [
    (lambda: nn.Conv2d(1, 1, 3, stride=2, padding=1), "stride 2 along the height"),
    (lambda: nn.Conv2d(1, 1, (2, 3), padding=(1, 1)), "kernel height 2 is even"),
    (lambda: nn.Conv2d(1, 1, 3, padding=0), "padding 0 along the height"),
    (lambda: nn.Conv2d(1, 1, 3, padding="valid"), "padding 0 along the height"),
    (lambda: nn.Conv2d(1, 1, (3, 2), padding="same"), "even kernel width 2"),
])
def test_spatial_refuses_convolutions_that_cannot_run_on_strips(conv, match):
    with pytest.raises(ValueError, match=match):
        SpatialConv2d.from_layer(conv(), parallel.LocalComm())


def test_spatial_refuses_models_that_do_not_start_with_convolutions():
    with pytest.raises(ValueError, match="does not start with convolutions"):
        SpatialParallel(nn.Sequential(nn.Flatten(), nn.Linear(4, 2)), parallel.LocalComm())
    with pytest.raises(TypeError, match="expected an nn.Sequential"):
        SpatialParallel(nn.Conv2d(1, 1, 3, padding=1), parallel.LocalComm())


def test_gather_lays_the_parts_in_rank_order_and_its_gradient_is_this_ranks_part():
    group = ClaimedGroup(rank=1, size=2)
    x = mdl.tensor(np.arange(12.0).reshape(2, 3, 2), requires_grad=True)
    y = gather_from_group(x, group, axis=1)                                  # (2, 6, 2): rank 0's x, then 2x
    np.testing.assert_array_equal(y.numpy(), np.concatenate([x.numpy(), 2 * x.numpy()], axis=1))
    weights = np.arange(24.0).reshape(2, 6, 2)
    (y * mdl.tensor(weights)).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), weights[:, 3:6])           # rank 1's rows of the gradient
    part = split_to_group(mdl.tensor(np.arange(8.0).reshape(2, 4)), group, axis=1)
    np.testing.assert_array_equal(part.numpy(), [[2.0, 3.0], [6.0, 7.0]])
    with pytest.raises(ValueError, match="do not split evenly over the 2 ranks"):
        split_to_group(mdl.tensor(np.zeros((3, 3))), group, axis=1)


def test_bytes_of_the_world_of_one_equal_the_cost_model():
    comm = parallel.LocalComm()
    model = FilterParallel(filter_parallel(S.cnn(), comm, pair=False))
    comm.reset_traffic()
    S.forward_backward(model, *S.cnn_batch())
    layers = [("gathered", (1, 8, 8), (8, 8, 8), True), ("gathered", (8, 8, 8), (8, 8, 8), True)]
    assert comm.traffic == cost_model.filter_parallel_step_payloads(1, 8, layers, itemsize=8)
    assert comm.traffic == {"allgather": 2 * 8 * 8 * 64 * 8, "allreduce": (8 * 1 * 64 + 8 * 8 * 64) * 8}
