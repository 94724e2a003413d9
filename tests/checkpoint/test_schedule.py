"""The schedule under a memory budget: Griewank's closed form, a brute force, and the real run measured."""
import math

import numpy as np
import pytest

import minidl as mdl
from minidl import memory, nn
from minidl.checkpoint import SegmentPlan, balanced_segments, profile_layers
from minidl.checkpoint.schedule import (
    Schedule,
    Split,
    Tape,
    binomial_schedule,
    count_forward_calls,
    optimal_schedule,
    revolve_forward_steps,
    segment_schedule,
    smallest_peak,
)
from tests.checkpoint._helpers import assert_same_step, data, mlp, varying_net


def chain(inputs, act, forward=None):
    L = len(act)
    return SegmentPlan([0], list(inputs), list(act), list(forward or [1.0] * L), [0.0] * L)


# ---------------------------------------------------------------- the homogeneous chain: Revolve
def test_revolve_closed_form_by_hand():
    # one kept state: layer l is reached again from x_0, l steps: 0 + 1 + … + (L − 1)
    assert [revolve_forward_steps(L, 1) for L in range(1, 7)] == [L * (L - 1) // 2 for L in range(1, 7)]
    # enough states for every input: one forward sweep to the last layer, L − 1 steps
    assert [revolve_forward_steps(L, L) for L in range(1, 7)] == [L - 1 for L in range(1, 7)]
    # two states, 6 steps: keep x_0, advance 3 steps and keep x_3; reverse 3..5 from x_3 alone (2 + 1 + 0
    # steps); reverse 0..2 with two states: advance 1 and keep x_1, advance 1 more (2); no split does better
    assert revolve_forward_steps(6, 2) == 3 + 3 + 2


@pytest.mark.parametrize("act", [1, 3])
def test_dynamic_program_with_one_layer_tapes_is_griewanks_optimum(act):
    # a chain of equal layers: inputs of 1 unit, activations of `act` units (the input included)
    for L in range(1, 19):
        profile = chain([1] * L, [act] * L)
        for s in range(1, 5):
            budget = s * 1 + act  # s kept inputs and one layer recorded
            best = optimal_schedule(None, None, budget, profile=profile, longest_tape=1)
            revolve = binomial_schedule(L, s, profile=profile)
            assert sum(best.forward_calls()) == sum(revolve.forward_calls()) == L + revolve_forward_steps(L, s)
            assert best.peak_bytes() <= budget and revolve.peak_bytes() <= budget
    # taping several layers at once is never slower, and the plain run needs no recomputation
    profile = chain([1] * 12, [2] * 12)
    assert optimal_schedule(None, None, 24, profile=profile).recomputations() == 0
    assert optimal_schedule(None, None, 8, profile=profile).recomputations() <= \
        optimal_schedule(None, None, 8, profile=profile, longest_tape=1).recomputations()


# ---------------------------------------------------------------- the heterogeneous chain: a brute force
def _all_schedules(a, b):
    yield Tape(a, b)
    for m in range(a + 1, b):
        for left in _all_schedules(a, m):
            for right in _all_schedules(m, b):
                yield Split(a, m, b, left, right)


def test_dynamic_program_is_the_least_time_of_every_schedule_within_the_budget():
    rng = np.random.default_rng(0)
    for trial in range(4):
        L = 6
        inputs = (rng.integers(1, 5, L) * 8).tolist()
        act = [i + int(e) * 8 for i, e in zip(inputs, rng.integers(0, 6, L))]
        forward = rng.uniform(0.5, 2.0, L).tolist()
        profile = chain(inputs, act, forward)
        candidates = [Schedule(root, profile) for root in _all_schedules(0, L)]  # each by its own equations
        least = min(c.peak_bytes() for c in candidates)
        assert smallest_peak(profile) == least
        for budget in np.linspace(least, sum(act), 5).astype(int):
            time = min(sum(f * n for f, n in zip(forward, c.forward_calls()))
                       for c in candidates if c.peak_bytes() <= budget)
            best = optimal_schedule(None, None, int(budget), profile=profile)
            assert best.peak_bytes() <= budget
            assert math.isclose(sum(f * n for f, n in zip(forward, best.forward_calls())), time, rel_tol=1e-12)


def test_a_coarse_resolution_still_fits_the_budget():
    # sizes with no common divisor: 1-byte units, more of them than the resolution allows
    profile = chain([101, 103, 107, 109, 113, 127], [307, 211, 401, 199, 503, 263], [1.0, 2.0, 1.5, 1.0, 0.5, 2.0])
    budget = smallest_peak(profile) + 300
    exact = optimal_schedule(None, None, budget, profile=profile)
    coarse = optimal_schedule(None, None, budget, profile=profile, resolution=64)  # sizes rounded up to 15-byte units
    assert exact.peak_bytes() <= budget and coarse.peak_bytes() <= budget
    assert coarse.slowdown() >= exact.slowdown()  # rounding up can only cost time


# the GPT of benchmarks/bench_memory_strategies.py as a chain (models.gpt.pipeline_layers: embedding, 4 blocks,
# tied head; batch 8 × 128 tokens, n_embd 128, float32), its sizes as profile_layers measures them
GPT_CHAIN = ([8192] + [524288] * 5, [599040] + [16822272] * 4 + [2375680])


@pytest.mark.parametrize("resolution", [4, 64, 2048, 100_000])
def test_the_smallest_peak_is_a_budget_optimal_schedule_meets_at_any_resolution(resolution):
    rng = np.random.default_rng(resolution)
    profiles = [chain(*GPT_CHAIN)]  # at 2048, this budget was refused (rounded sizes no longer fit it)
    for _ in range(4):  # sizes with no useful common divisor: rounding is needed at every resolution here
        inputs = rng.integers(100, 5000, 7).tolist()
        profiles.append(chain(inputs, [i + int(e) for i, e in zip(inputs, rng.integers(0, 20000, 7))],
                              rng.uniform(0.5, 2.0, 7).tolist()))
    for profile in profiles:
        least = smallest_peak(profile)
        by_brute_force = min(Schedule(root, profile).peak_bytes() for root in _all_schedules(0, profile.num_layers))
        assert least == by_brute_force
        for budget in (least, least + 1, (3 * least + profile.plain_bytes()) // 4, profile.plain_bytes()):
            schedule = optimal_schedule(None, None, budget, profile=profile, resolution=resolution)
            assert schedule.peak_bytes() <= budget
        assert optimal_schedule(None, None, least, profile=profile, resolution=resolution).peak_bytes() == least


def test_segments_are_schedules_with_the_planners_equations():
    model, x = varying_net(), mdl.randn(16, 8)
    profile = profile_layers(model, x)
    for k in (2, 3, 4):
        plan = balanced_segments(model, x, k, profile)
        as_schedule = segment_schedule(plan)
        assert as_schedule.peak_bytes() == plan.peak_bytes()
        assert math.isclose(as_schedule.slowdown(), plan.slowdown(), rel_tol=1e-12)
        # the optimum at the planner's peak recomputes no more than the planner
        best = optimal_schedule(model, x, plan.peak_bytes(), profile=profile)
        assert best.peak_bytes() <= plan.peak_bytes() and best.slowdown() <= plan.slowdown() + 1e-12


def test_describe_names_each_tape_by_its_first_and_last_layer():
    # segments of layers 0-1, 2-4 and 5 of six: each split right part first, indented one level per nesting
    schedule = segment_schedule(chain([8] * 6, [8] * 6), starts=[0, 2, 5])
    assert schedule.describe() == ("split 0|2|6\n"
                                   "  split 2|5|6\n"
                                   "    tape 5..5\n"
                                   "    tape 2..4\n"
                                   "  tape 0..1")


# ---------------------------------------------------------------- run on a model, measured
def _measure(model, schedule, x, seed=1):
    grad = mdl.tensor(np.random.default_rng(seed).standard_normal(model(x).shape).astype(x.dtype))
    with count_forward_calls(model) as counter, memory.track() as tracked:
        out = schedule.run(model, x)
        out.backward(grad)  # no loss node: the tracker sees exactly the schedule's nodes
    return tracked.peak_bytes, counter.calls


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_schedules_give_the_plain_gradients_and_their_predicted_peak_and_calls(dtype):
    model, x = varying_net(), data(16, 8)
    model = model.double() if dtype == "float64" else model.float()
    x = x.double() if dtype == "float64" else x.float()
    profile = profile_layers(model, x)
    least, plain = smallest_peak(profile), profile.plain_bytes()
    for budget in (least, (2 * least + plain) // 3, (least + 2 * plain) // 3, plain):
        schedule = optimal_schedule(model, x, budget, profile=profile)
        peak, calls = _measure(model, schedule, x)
        assert peak == schedule.peak_bytes() <= budget
        assert calls == schedule.forward_calls()
        x.requires_grad = True
        assert_same_step(model, lambda v, schedule=schedule: schedule.run(model, v), x)
        x.requires_grad = False
    assert optimal_schedule(model, x, least, profile=profile).recomputations() > 0
    assert optimal_schedule(model, x, plain, profile=profile).forward_calls() == [1] * profile.num_layers


def test_binomial_schedule_runs_on_a_chain_of_equal_layers():
    L, s = 10, 3
    model, x = mlp(layers=L), data(4, 12, requires_grad=True)
    profile = profile_layers(model, x)
    schedule = binomial_schedule(L, s, profile=profile)
    peak, calls = _measure(model, schedule, x)
    assert calls == schedule.forward_calls() and sum(calls) == L + revolve_forward_steps(L, s)
    assert peak == schedule.peak_bytes()
    assert peak <= s * profile.input_bytes[1] + max(profile.layer_bytes)  # s inputs kept, one layer recorded
    assert_same_step(model, lambda v: schedule.run(model, v), x)


def test_random_draws_are_replayed_in_nested_recomputations():
    model, x = mlp(layers=6, dropout=0.3), data(5, 12, requires_grad=True)
    schedule = binomial_schedule(6, 2, profile=profile_layers(model, x))
    assert schedule.recomputations() > 0
    assert_same_step(model, lambda v: schedule.run(model, v), x)


# ---------------------------------------------------------------- bad input
def test_a_budget_below_the_smallest_peak_names_both():
    profile = chain([8, 16, 8], [24, 40, 24])
    least = smallest_peak(profile)
    assert least == 8 + 40  # x_0 kept, then the widest layer recorded alone
    with pytest.raises(ValueError, match=f"budget of {least - 1} bytes.*smallest feasible peak.* {least} bytes"):
        optimal_schedule(None, None, least - 1, profile=profile)
    with pytest.raises(ValueError, match="longest_tape"):
        optimal_schedule(None, None, 100, profile=profile, longest_tape=0)
    with pytest.raises(ValueError, match="budget"):
        optimal_schedule(None, None, -5, profile=profile)
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    with pytest.raises(ValueError, match="schedule is for 3 layers, the model has 2"):
        binomial_schedule(3, 1).run(model, mdl.randn(1, 2))


def test_a_schedule_runs_on_the_gpu_with_the_plain_gradients(standin_or_gpu):
    model, x = varying_net().double(), data(16, 8)
    profile = profile_layers(model, x)
    schedule = optimal_schedule(model, x, smallest_peak(profile), profile=profile)
    model.to("cuda")
    x = x.to("cuda")
    grad = mdl.tensor(np.random.default_rng(1).standard_normal((16, 8))).to("cuda")
    model.zero_grad()
    model(x).backward(grad)
    plain = [p.grad.numpy().copy() for p in model.parameters()]
    model.zero_grad()
    with memory.track() as tracked:
        schedule.run(model, x).backward(grad)
    assert tracked.peak_bytes == schedule.peak_bytes()  # the sizes measured on the CPU hold on the device
    for a, b in zip((p.grad.numpy() for p in model.parameters()), plain):
        np.testing.assert_array_equal(a, b)
