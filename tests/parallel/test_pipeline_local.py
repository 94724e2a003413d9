"""Pipeline schedules without MPI: their messages never deadlock, their bubble is (p − 1)/(m + p − 1), bad sizes.

The multi-rank proof (training equal to one process on 2 and 4 MPI ranks) is in test_model_parallel.py.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidl import nn, parallel
from minidl.parallel.pipeline import (
    balanced_boundaries,
    bubble_fraction,
    draw_timeline,
    equal_boundaries,
    layer_costs,
    message_plan,
    schedule,
    simulate,
)


def _events(plan, stage, blocking_only=False):
    """The messages of a stage's plan, as a list of events; each event a list of parts posted together:
    ("send" | "recv", peer, what), what = ("act" | "grad", micro-batch)."""
    events, held = [], None
    for op, k, before, after in plan:
        source = stage - 1 if op == "F" else stage + 1
        wanted = ("recv", source, ("act" if op == "F" else "grad", k))
        if before == "sendrecv":
            events += [[held], [wanted]] if blocking_only else [[held, wanted]]
        elif before == "recv":
            events.append([wanted])
        dest = stage + 1 if op == "F" else stage - 1
        message = ("send", dest, ("act" if op == "F" else "grad", k))
        if after == "send":
            events.append([message])
        elif after == "hold":
            held = message
    return events


def _run_rendezvous(stages, events_of):
    """Every send waits for its receive and every receive for its send (MPI once messages are too large
    to buffer); the parts of one event are posted together. Returns the delivered messages per stage,
    or raises on a deadlock."""
    events = [events_of(s) for s in range(stages)]
    position, done = [0] * stages, [set() for _ in range(stages)]
    delivered = [[] for _ in range(stages)]
    while any(position[s] < len(events[s]) for s in range(stages)):
        progressed = False
        for s in range(stages):
            if position[s] == len(events[s]):
                continue
            for i, (kind, peer, what) in enumerate(events[s][position[s]]):
                if kind != "send" or i in done[s] or position[peer] == len(events[peer]):
                    continue
                for j, (their_kind, their_peer, their_what) in enumerate(events[peer][position[peer]]):
                    if their_kind == "recv" and their_peer == s and j not in done[peer]:
                        assert their_what == what, f"stage {peer} expected {their_what} from {s}, got {what}"
                        done[s].add(i)
                        done[peer].add(j)
                        delivered[peer].append(what)
                        progressed = True
                        break
        for s in range(stages):
            if position[s] < len(events[s]) and len(done[s]) == len(events[s][position[s]]):
                position[s], done[s] = position[s] + 1, set()
                progressed = True
        if not progressed:
            raise RuntimeError(f"deadlock: stages wait at events {position}")
    return delivered


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages", [1, 2, 3, 4])
@pytest.mark.parametrize("micro_batches", [1, 2, 3, 5])
def test_messages_reach_every_stage_in_order_without_deadlock(kind, stages, micro_batches):
    delivered = _run_rendezvous(stages, lambda s: _events(message_plan(kind, s, stages, micro_batches), s))
    for s in range(stages):
        acts = [w for w in delivered[s] if w[0] == "act"]
        grads = [w for w in delivered[s] if w[0] == "grad"]
        assert len(acts) == (micro_batches if s > 0 else 0)
        assert len(grads) == (micro_batches if s < stages - 1 else 0)


def test_blocking_sends_alone_would_deadlock_1f1b():
    """Why a held result goes out with the next receive: sent on its own first, two neighbours both wait."""
    with pytest.raises(RuntimeError, match="deadlock"):
        _run_rendezvous(2, lambda s: _events(message_plan("1f1b", s, 2, 3), s, blocking_only=True))


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages, micro_batches", [(2, 1), (2, 4), (4, 4), (4, 8), (3, 16)])
def test_the_bubble_is_p_minus_1_over_m_plus_p_minus_1(kind, stages, micro_batches):
    timelines = simulate(kind, stages, micro_batches, forward_time=1.0, backward_time=2.0)
    assert bubble_fraction(timelines) == pytest.approx((stages - 1) / (micro_batches + stages - 1))
    assert [[(op, k) for op, k, _, _ in line] for line in timelines] == \
        [schedule(kind, s, stages, micro_batches) for s in range(stages)]


def test_gpipe_timeline_by_hand():
    # 2 stages, 2 micro-batches, forward 1, backward 2:
    #   stage 0:  F0 [0,1]  F1 [1,2]                  B0 [5,7]  B1 [7,9]
    #   stage 1:            F0 [1,2]  F1 [2,3]  B0 [3,5]  B1 [5,7]
    timelines = simulate("gpipe", 2, 2)
    assert timelines[0] == [("F", 0, 0, 1), ("F", 1, 1, 2), ("B", 0, 5, 7), ("B", 1, 7, 9)]
    assert timelines[1] == [("F", 0, 1, 2), ("F", 1, 2, 3), ("B", 0, 3, 5), ("B", 1, 5, 7)]
    # busy 2·(2 + 4) = 12 of 2 stages × 9: bubble 1/3 = (p − 1)/(m + p − 1)
    assert bubble_fraction(timelines) == pytest.approx(1 / 3)


def test_draw_timeline_draws_one_box_per_op():
    import matplotlib
    matplotlib.use("Agg")
    ax = draw_timeline(simulate("1f1b", 3, 4))
    assert len(ax.patches) == 2 * 3 * 4 and ax.get_title() == "bubble 33%"


class Claimed(parallel.LocalComm):
    def __init__(self, rank, size):
        self.rank, self.size = rank, size


def _stack():
    return nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2), nn.Identity())


def test_bad_sizes_are_refused_before_any_work():
    with pytest.raises(ValueError, match="6 layers do not divide into 4 stages .* among 1, 2, 3, 6"):
        parallel.Pipeline(_stack(), Claimed(0, 4), micro_batches=2)
    with pytest.raises(ValueError, match=r"boundaries must be 3 increasing layer indices from 0 to 6"):
        parallel.Pipeline(_stack(), Claimed(0, 2), micro_batches=2, boundaries=[0, 6, 6])
    with pytest.raises(TypeError, match="must be an nn.Sequential"):
        parallel.Pipeline(nn.Linear(2, 2), Claimed(0, 2), micro_batches=2)
    with pytest.raises(ValueError, match="unknown schedule 'zero-bubble'"):
        parallel.Pipeline(_stack(), Claimed(0, 2), micro_batches=2, schedule="zero-bubble")
    pipe = parallel.Pipeline(_stack(), Claimed(0, 2), micro_batches=4, boundaries=[0, 4, 6])
    assert len(pipe.stage) == 4 and len(list(pipe.parameters())) == 4
    # no message is sent before the sizes are checked: a world of claimed ranks would fail at the first one
    with pytest.raises(ValueError, match="a batch of 10 does not split into 4 equal micro-batches; choose "
                                         "micro_batches among 1, 2, 5, 10"):
        pipe.train_step(np.zeros((10, 4)), np.zeros(10, int), None)


def test_a_world_of_one_is_plain_gradient_accumulation():
    import minidl as mdl
    import minidl.functional as F
    mdl.manual_seed(0)
    plain = _stack().to(dtype=np.float64)
    mdl.manual_seed(0)
    pipe = parallel.Pipeline(_stack().to(dtype=np.float64), parallel.LocalComm(), micro_batches=3)
    x, y = np.random.default_rng(0).normal(size=(6, 4)), np.array([0, 1, 1, 0, 1, 0])
    loss = pipe.train_step(x, y, lambda out, t: F.cross_entropy(out, mdl.tensor(t)))
    want = F.cross_entropy(plain(mdl.tensor(x)), mdl.tensor(y))
    want.backward()
    assert loss == pytest.approx(want.item(), abs=1e-14)
    for p, q in zip(pipe.parameters(), plain.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=0, atol=1e-14)


# ---------------------------------------------------------------- stages of unequal cost
def _brute_force_pace(costs, stages):
    """The least largest stage over every cut of ``costs`` into ``stages`` non-empty contiguous stages."""
    import itertools
    best = np.inf
    for inner in itertools.combinations(range(1, len(costs)), stages - 1):
        bounds = [0, *inner, len(costs)]
        best = min(best, max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:])))
    return best


@given(st.lists(st.integers(0, 50), min_size=1, max_size=9), st.integers(1, 9))
@settings(max_examples=200, deadline=None)
def test_balanced_boundaries_reach_the_least_largest_stage(costs, stages):
    """Integer costs: the sums are exact, so the DP's pace must equal the brute force's to the unit."""
    stages = min(stages, len(costs))
    bounds = balanced_boundaries(costs, stages)
    assert bounds[0] == 0 and bounds[-1] == len(costs) and len(bounds) == stages + 1
    assert all(a < b for a, b in zip(bounds, bounds[1:]))            # every stage holds a layer
    assert max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:])) == _brute_force_pace(costs, stages)


def test_balanced_boundaries_by_hand_and_bad_input():
    assert balanced_boundaries([1, 1, 1, 1, 1, 1], 3) == equal_boundaries(6, 3) == [0, 2, 4, 6]
    # a first layer as dear as three others: a stage to itself; then 3 | 2, the pace 3 (the later cut of
    # the equally good 3 | 1 1 1 | 1 1 and 3 | 1 1 | 1 1 1)
    assert balanced_boundaries([3, 1, 1, 1, 1, 1], 3) == [0, 1, 4, 6]
    assert balanced_boundaries([1, 9, 1], 2) == [0, 2, 3]            # ties (10 either way): the later cut
    with pytest.raises(ValueError, match="3 layers make 1 to 3 non-empty stages, got stages=4"):
        balanced_boundaries([1, 1, 1], 4)
    with pytest.raises(ValueError, match="must be a finite number ≥ 0"):
        balanced_boundaries([1, -1, 1], 2)


def test_a_pipeline_cut_by_costs_keeps_the_balanced_stage():
    costs = [5, 1, 1, 1, 1, 1]
    pipes = [parallel.Pipeline(_stack(), Claimed(r, 2), micro_batches=2, costs=costs) for r in range(2)]
    assert [p.boundaries for p in pipes] == [[0, 1, 6]] * 2             # 5 | 5: the first Linear alone
    assert len(pipes[0].stage) == 1 and len(pipes[1].stage) == 5
    with pytest.raises(ValueError, match="costs= has 2 numbers for the 6 layers"):
        parallel.Pipeline(_stack(), Claimed(0, 2), micro_batches=2, costs=[1, 2])
    with pytest.raises(ValueError, match="not both"):
        parallel.Pipeline(_stack(), Claimed(0, 2), micro_batches=2, costs=costs, boundaries=[0, 3, 6])


def test_layer_costs_times_each_layer_and_takes_rank_0s_numbers():
    model = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 2))
    x = np.random.default_rng(0).normal(size=(16, 8)).astype(np.float32)
    costs = layer_costs(model, x, repeats=2)
    assert len(costs) == 3 and all(np.isfinite(c) and c > 0 for c in costs)
    assert all(p.grad is None for p in model.parameters())            # the timing leaves no gradient behind

    class FromRankZero(parallel.LocalComm):                            # what a broadcast from rank 0 does
        def broadcast_(self, array, root=0):
            array[...] = np.arange(1.0, len(array) + 1)
            return array

    assert layer_costs(model, x, repeats=1, comm=FromRankZero()) == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_unequal_stages_set_the_pace(kind):
    """Forwards of 1 and 3 on two stages, backwards twice as long, m = 4 micro-batches. The forwards form
    a flow shop of identical jobs: the last one leaves the last stage at Σ_s f_s + (m − 1)·max_s f_s =
    4 + 3·3 = 13 (GPipe, whose forwards all come first). Whatever the schedule, the slow stage computes
    m·(3 + 6) = 36 after its first input arrives at 1 and before the first stage's last backward (2):
    the step takes at least 1 + 36 + 2 = 39, and both schedules meet it (the slow stage never waits once
    started): the bubble is 1 − (4·3 + 4·9)/(2·39) = 38 %, where equal stages of the same total work
    (2 and 4 per micro-batch each) would idle 1/5 of the time."""
    lines = simulate(kind, 2, 4, forward_time=[1, 3], backward_time=[2, 6])
    if kind == "gpipe":
        assert max(end for op, _, _, end in lines[1] if op == "F") == 13
    assert max(end for line in lines for *_, end in line) == 39
    assert bubble_fraction(lines) == pytest.approx(1 - 48 / 78)
    assert bubble_fraction(simulate(kind, 2, 4, forward_time=2, backward_time=4)) == pytest.approx(1 / 5)
    with pytest.raises(ValueError, match=r"forward_time must be a number ≥ 0 or one per stage \(2\)"):
        simulate(kind, 2, 4, forward_time=[1, 2, 3])
