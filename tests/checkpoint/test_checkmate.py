"""Checkmate's integer program on graphs with skips: against exhaustive search, against the chain schedules,
and run: the plain gradients, and the predicted peak equal to the one memory.track measures."""
import sys

import numpy as np
import pytest

import minidl as mdl
from minidl import memory, nn
from minidl.checkpoint import count_forward_calls, optimal_schedule, profile_layers, smallest_peak
from minidl.checkpoint.checkmate import (
    CheckmateSchedule,
    checkmate_schedule,
    exhaustive_schedule,
    plain_schedule,
    profile_graph,
)
from minidl.checkpoint.graph import Add, LayerGraph
from tests.checkpoint._graphs import flop_costs, flops, residual_stack, unet_like


def tiny(kind):
    """Three layers of width 32 (batch 64): a chain, or a skip from the first layer to the last."""
    mdl.manual_seed(4)
    graph = LayerGraph()
    graph.add("a", nn.Linear(32, 32))
    graph.add("b", nn.Tanh(), "a")
    if kind == "chain":
        graph.add("c", nn.Linear(32, 32), "b")
    else:
        graph.add("c", Add(), "a", "b")
    return graph, mdl.tensor(np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32))


def measured(run, module, x, gy):
    """One step from no gradients under memory.track: (allocator peak above the start, the gradients)."""
    for p in module.parameters():
        p.grad = None
    with memory.track() as m:
        run(x).backward(gy)
    return m.allocator_peak_bytes, [p.grad.numpy().copy() for p in module.parameters()]


# The tolerance of predicted against measured: the program counts every array the step holds exactly; what it
# does not count are the Python objects created per step (the schedule's node, the per-stage lists) and
# tracemalloc's view of them: measured at under 0.7% of the peak on these graphs, allowed 1.5%.
TOLERANCE = 0.015


@pytest.mark.parametrize("kind", ["chain", "skip"])
def test_the_integer_program_finds_the_exhaustive_optimum(kind):
    graph, x = tiny(kind)
    profile = profile_graph(graph, x, **flop_costs())
    plain = plain_schedule(profile).peak_bytes()
    feasible, recomputing = 0, 0
    for fraction in (1.0, 0.95, 0.9, 0.85, 0.8, 0.7):
        budget = fraction * plain
        try:
            reference = exhaustive_schedule(profile, budget)
        except ValueError:
            with pytest.raises(ValueError, match="no schedule fits"):
                checkmate_schedule(profile, budget)
            continue
        found = checkmate_schedule(profile, budget)
        feasible += 1
        recomputing += reference.recompute_cost() > 0
        assert found.cost() == reference.cost()  # FLOP counts: integers, compared exactly
        assert found.peak_bytes() <= budget
    assert feasible >= 2 and recomputing >= 1  # the sweep reaches budgets that need recomputation


def test_from_sequential_computes_the_sequentials_function():
    model, graph, x, _ = residual_stack(2, width=16, batch=4)
    assert graph.names[:6] == ["l0", "l1_body_0", "l1_body_1", "l1_body_2", "l1_body_3", "l1_add"]
    assert graph.inputs[5] == (0, 4)  # the skip: the add reads the stem's output and the body's
    np.testing.assert_array_equal(graph(x).numpy(), model(x).numpy())


@pytest.mark.parametrize("network", ["residual", "unet"])
def test_schedules_give_the_plain_gradients_and_the_peak_they_predict(network):
    if network == "residual":
        model, graph, x, gy = residual_stack(2)
    else:
        graph, x, gy = unet_like()
        model = graph
    profile = profile_graph(graph, x, **flop_costs())
    plain_run = measured(model, model, x, gy)
    plain = plain_schedule(profile)
    schedules = [plain, checkmate_schedule(profile, 0.9 * plain.peak_bytes(), time_limit=30)]
    assert schedules[1].recompute_cost() > 0
    for schedule in schedules:
        with count_forward_calls(list(graph.layers)) as calls:
            peak, grads = measured(lambda v, s=schedule: s.run(graph, v), model, x, gy)
        for a, b in zip(grads, plain_run[1]):
            np.testing.assert_array_equal(a, b)  # the same float32 operations on the same values
        assert calls.calls == schedule.forward_calls()
        predicted = schedule.peak_bytes()
        assert abs(peak - predicted) <= TOLERANCE * predicted, (peak, predicted)
    assert measured(lambda v: schedules[1].run(graph, v), model, x, gy)[0] < plain_run[0]


def test_it_beats_the_best_chain_schedule_on_a_network_with_skips():
    """The chain schedules see each Residual block as one layer: the least peak they reach, measured, against
    Checkmate under a budget 10% below it. Recomputation is counted in FLOPs (the roofline's counts)."""
    model, graph, x, gy = residual_stack(2)
    chain_profile = profile_layers(model, x)
    chain = optimal_schedule(model, x, smallest_peak(chain_profile), profile=chain_profile)
    with count_forward_calls(model) as calls:
        chain_peak, chain_grads = measured(lambda v: chain.run(model, v), model, x, gy)
    chain_recompute = sum((c - 1) * flops(layer, x.shape) for c, layer in zip(calls.calls, model))
    assert chain_recompute > 0
    profile = profile_graph(graph, x, **flop_costs())
    schedule = checkmate_schedule(profile, 0.9 * chain_peak, time_limit=30)
    peak, grads = measured(lambda v: schedule.run(graph, v), model, x, gy)
    assert peak < 0.9 * chain_peak * (1 + TOLERANCE)  # lower peak ...
    assert schedule.recompute_cost() <= chain_recompute  # ... at no more recomputation
    for a, b in zip(grads, chain_grads):
        np.testing.assert_array_equal(a, b)


def test_random_draws_are_replayed_when_a_layer_is_recomputed():
    mdl.manual_seed(6)
    graph = LayerGraph()
    graph.add("a", nn.Linear(64, 64))
    graph.add("drop", nn.Dropout(0.5), "a")
    graph.add("b", nn.Linear(64, 64), "drop")
    graph.add("skip", Add(), "a", "b")
    x = mdl.tensor(np.random.default_rng(1).standard_normal((128, 64)).astype(np.float32))
    gy = mdl.tensor(np.ones((128, 64), np.float32))
    profile = profile_graph(graph, x)
    R = np.eye(8, dtype=bool)
    R[5, 1] = True  # the dropout's forward again in the stage of b's backward (node 5), which reads its output
    schedule = CheckmateSchedule.from_recomputations(R, profile)
    assert schedule.forward_calls() == [1, 2, 1, 1]
    mdl.manual_seed(3)
    plain = measured(graph, graph, x, gy)[1]
    mdl.manual_seed(3)
    recomputed = measured(lambda v: schedule.run(graph, v), graph, x, gy)[1]
    for a, b in zip(recomputed, plain):
        np.testing.assert_array_equal(a, b)


def test_bad_input_is_named():
    graph, x = tiny("skip")
    with pytest.raises(ValueError, match="names input 'nope'"):
        graph.add("d", nn.Tanh(), "nope")
    with pytest.raises(ValueError, match="must be a new identifier"):
        graph.add("a", nn.Tanh())
    profile = profile_graph(graph, x)
    with pytest.raises(ValueError, match="no schedule fits a budget of 1000 bytes"):
        checkmate_schedule(profile, 1000)
    with pytest.raises(ValueError, match="budget is a number of bytes"):
        checkmate_schedule(profile, -1)
    with pytest.raises(TypeError, match="expected a LayerGraph"):
        profile_graph(nn.Sequential(nn.Tanh()), x)
    model, big, x, _ = residual_stack(2, width=8, batch=2)
    with pytest.raises(ValueError, match="use checkmate_schedule for this graph"):
        exhaustive_schedule(profile_graph(big, x), 1e9)


def test_without_scipy_the_error_names_the_extra(monkeypatch):
    graph, x = tiny("chain")
    profile = profile_graph(graph, x)
    monkeypatch.setitem(sys.modules, "scipy.optimize", None)  # as if SciPy were not installed
    with pytest.raises(ImportError, match=r"minidl\[plan\]"):
        checkmate_schedule(profile, 1e9)
