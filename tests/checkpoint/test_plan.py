"""Planning checkpoint segments: measured layers, the least modeled peak, 16-bit storage measured."""
import itertools

import numpy as np
import pytest

import minidl as mdl
from minidl import memory, nn
from minidl.checkpoint import (
    balanced_segments,
    checkpoint_sequential,
    choose_segments,
    flatten_layers,
    profile_layers,
    sqrt_segments,
    storage_report,
    uniform_boundaries,
)
from tests.checkpoint._helpers import data, mlp, residual_net, varying_net


# ---------------------------------------------------------------- 16-bit storage, measured
def test_16_bit_storage_halves_the_stored_inputs_with_a_bounded_error():
    L, n, w = 8, 16, 32
    mdl.manual_seed(0)
    # a smooth activation: the error is float16's rounding (2⁻¹¹ ≈ 4.9e-4 relative) carried through
    # a few layers; with ReLU a unit within rounding distance of 0 can flip its mask (see storage_report)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(w, w), nn.Tanh()) for _ in range(L)])
    x = mdl.randn(n, w)
    report = storage_report(model, x, L, "float16")
    # L − 2 segment inputs are stored (not the user's input, not the last segment's): each halves
    assert report["saved_bytes"] == (L - 2) * n * w * 2
    assert 0 < report["relative_grad_error"] < 4 * 2.0 ** -11
    assert 0 < report["max_relative_grad_error"] < 4 * 2.0 ** -11
    with mdl.no_grad():
        plain = model(x).numpy()
    stored = checkpoint_sequential(model, L, x, storage_dtype="float16")
    np.testing.assert_array_equal(stored.numpy(), plain)  # the forward pass itself is untouched


def test_bfloat16_storage_where_ml_dtypes_is_installed():
    pytest.importorskip("ml_dtypes")
    model = mlp().float()
    report = storage_report(model, mdl.randn(4, 12), 8, "bfloat16")
    assert report["saved_bytes"] > 0 and 0 < report["relative_grad_error"] < 4 * 2.0 ** -8  # 8 significant bits


# ---------------------------------------------------------------- segments
def test_uniform_boundaries_are_pytorchs():
    assert uniform_boundaries(10, 3) == [0, 3, 6]  # the last segment takes the rest: 6..9
    assert uniform_boundaries(100, 16) == [i * 6 for i in range(16)]
    assert sqrt_segments(100) == 10 and sqrt_segments(64) == 8 and sqrt_segments(1) == 1


def test_balanced_segments_find_the_least_modeled_peak():
    model, x = varying_net(), mdl.randn(16, 8)
    profile = profile_layers(model, x)
    L = profile.num_layers
    for k in (2, 3, 4):
        plan = balanced_segments(model, x, k, profile)
        brute = min(profile.peak_bytes([0, *rest]) for rest in itertools.combinations(range(1, L), k - 1))
        assert plan.peak_bytes() == brute
        assert plan.peak_bytes() <= profile.peak_bytes(uniform_boundaries(L, k))
        with memory.track() as m:
            out = checkpoint_sequential(model, plan, x)
            out.sum().backward()
        # the measured peak, by the model: inputs of earlier segments + this segment's layers (+ the
        # output, held by the final Sum, while the last segment's graph is alive)
        starts, held, expected = plan.boundaries + [L], 0, 0
        for a, b in zip(starts, starts[1:]):
            expected = max(expected, held + sum(profile.layer_bytes[a:b]) + (out.array.nbytes if b == L else 0))
            held += profile.input_bytes[a]
        assert m.peak_bytes == expected


def test_profile_measures_layers_and_leaves_state_alone():
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Dropout(0.5), nn.Linear(6, 2))
    x = mdl.randn(5, 4)
    before = [b.numpy().copy() for b in model.buffers()]
    mdl.manual_seed(3)
    expected_draw = mdl.rand(2).numpy()
    mdl.manual_seed(3)
    profile = profile_layers(model, x)
    np.testing.assert_array_equal(mdl.rand(2).numpy(), expected_draw)  # the dry run's dropout drew nothing
    assert all(np.array_equal(a, b.numpy()) for a, b in zip(before, model.buffers()))
    assert all(p.grad is None for p in model.parameters())
    assert profile.input_bytes == [5 * 4 * 4, 5 * 6 * 4, 5 * 6 * 4, 5 * 6 * 4]
    assert profile.layer_bytes[0] == 5 * 4 * 4  # Linear keeps its input
    assert profile.layer_bytes[2] == 2 * 5 * 6 * 4  # Dropout keeps its input and its scaled mask


def test_choose_segments_default_and_time_budget():
    model, x = varying_net(), mdl.randn(16, 8)
    profile = profile_layers(model, x)
    assert choose_segments(model, x, profile=profile).segments == sqrt_segments(10)
    assert choose_segments(model, x, 1.0, profile).boundaries == [0]  # no time to spare: no checkpoint
    previous = None
    for budget in (1.1, 1.3, 2.0):
        plan = choose_segments(model, x, budget, profile)
        assert plan.slowdown() <= budget
        assert previous is None or plan.peak_bytes() <= previous  # more time never costs memory
        previous = plan.peak_bytes()
    with pytest.raises(ValueError, match="at least 1"):
        choose_segments(model, x, 0.5, profile)


def test_boundaries_never_cut_a_residual_block():
    model = residual_net()
    layers = flatten_layers(nn.Sequential(model[0], nn.Sequential(model[1], model[2]), *list(model)[3:]))
    assert [type(layer).__name__ for layer in layers] == [
        "Linear", "Residual", "ReLU", "Residual", "Tanh", "Residual", "Linear"]
    plan = balanced_segments(layers, data(4, 6), 3)
    assert len(plan.layer_bytes) == 7  # a Residual is one layer: a boundary can only fall between blocks
    assert nn.Residual.checkpoint_atomic


def test_bad_segment_count():
    model, x = mlp(layers=4), data(2, 12)
    for segments in (0, 9, 2.5, True):
        with pytest.raises(ValueError, match="between 1 and the number of layers \\(4\\)"):
            balanced_segments(model, x, segments)
