"""What a recomputation replays or restores: random draws from the recorded state, layer buffers in place."""
import numpy as np

import minidl as mdl
from minidl import nn
from minidl.checkpoint.replay import BufferGuard, RngState, first_draws_recorded
from minidl.nn.module import Module


def test_a_function_that_draws_nothing_records_nothing():
    state = RngState()
    with first_draws_recorded(state):
        (mdl.ones(3) * 2).sum()
    assert not state


def test_the_state_is_recorded_just_before_the_first_draw():
    state = RngState()
    mdl.manual_seed(5)
    mdl.rand(2)  # drawn before the block: not replayed
    with first_draws_recorded(state):
        first = mdl.rand(3).numpy()
        mdl.rand(3)  # later draws do not move the recorded state
    now = state.now()
    after = mdl.rand(2).numpy()
    state.restore()
    np.testing.assert_array_equal(mdl.rand(3).numpy(), first)
    now.restore()
    np.testing.assert_array_equal(mdl.rand(2).numpy(), after)  # the stream goes on where it was


def test_buffer_guard_puts_batchnorm_statistics_back_in_the_same_arrays():
    plain_call = Module.__call__
    bn = nn.BatchNorm1d(3).double()
    mean = bn.running_mean
    array, before = mean.array, mean.array.copy()
    x = mdl.tensor(np.random.default_rng(0).standard_normal((5, 3)) + 4.0)
    with BufferGuard():
        with BufferGuard():  # guards nest (a checkpoint recomputed inside another's recomputation)
            bn(x)
            assert not np.array_equal(bn.running_mean.numpy(), before)  # updated inside...
        np.testing.assert_array_equal(array, before)  # ...and put back, in place
        bn(x)
    np.testing.assert_array_equal(array, before)
    assert bn.running_mean is mean and mean.array is array
    assert Module.__call__ is plain_call
