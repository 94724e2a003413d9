"""minidl.profiler: what it records, that it changes no result, and that it leaves nothing behind."""
import time

import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from minidl import autograd, profiler
from minidl.ops.linalg import Linear


def mlp_step(device, with_region=None):
    mdl.manual_seed(0)
    params = [mdl.randn(16, 8, device=device, requires_grad=True), mdl.randn(16, device=device, requires_grad=True),
              mdl.randn(4, 16, device=device, requires_grad=True), mdl.randn(4, device=device, requires_grad=True)]
    x = mdl.randn(5, 8, device=device)
    y = np.array([0, 1, 2, 3, 0])
    h = F.relu(F.linear(x, params[0], params[1]))
    loss = F.cross_entropy(F.linear(h, params[2], params[3]), y)
    loss.backward()
    if with_region is not None:
        with with_region.region("update"):
            with mdl.no_grad():
                for p in params:
                    p.array -= 0.1 * p.grad.array
    return params


def originals():
    """What a profile must leave as it found it: the engine's functions, an op class, the active hooks."""
    return (autograd.Function.__call__, autograd.backward, Linear.__dict__["forward"], autograd.function_hooks.active)


def test_records_each_op_type_forward_and_backward(device):
    with profiler.profile() as prof:
        mlp_step(device)
    calls = {(s.name, s.phase): s.calls for s in prof.rows()}
    assert calls[("Linear", "forward")] == 2
    assert calls[("Linear", "backward")] == 2
    assert calls[("ReLU", "forward")] == 1 and calls[("ReLU", "backward")] == 1
    assert calls[("CrossEntropy", "forward")] == 1 and calls[("CrossEntropy", "backward")] == 1
    assert calls[(profiler.ENGINE, "backward")] == 1
    # ops run inside a node's backward (Linear's matmuls, transposes, sums) belong to that node
    assert not any(name in ("MatMul", "Transpose", "Sum") for name, _ in calls)
    if device == "cuda":
        assert all(s.gpu is not None for s in prof.rows() if s.name != profiler.ENGINE)


def test_times_are_consistent(device):
    with profiler.profile() as prof:
        mlp_step(device)
    rows = prof.rows()
    assert [s.time for s in rows] == sorted((s.time for s in rows), reverse=True)
    for s in rows:
        assert 0 <= s.overhead <= s.total * (1 + 1e-9) + 1e-12
        assert s.work == pytest.approx(s.total - s.overhead, abs=1e-12)
        assert s.overhead_us >= 0 and s.mean_us >= 0
    if device == "cpu":
        assert prof.total_time <= prof.wall
    assert prof.op_calls == sum(s.calls for s in rows if s.phase == "forward")
    assert prof.overhead_us_per_op > 0
    by_op = prof.by_op()
    assert set(by_op["Linear"]) == {"forward", "backward"}
    assert by_op["Linear"]["forward"] == prof.stats[("Linear", "forward")].time


def test_gradients_are_unchanged_by_profiling(device):
    plain = mlp_step(device)
    with profiler.profile():
        profiled = mlp_step(device)
    for a, b in zip(plain, profiled):
        np.testing.assert_array_equal(a.grad.numpy(), b.grad.numpy())


def test_higher_order_gradients_under_the_profiler():
    x = mdl.tensor(np.array([0.5, -1.0, 2.0]), requires_grad=True)
    with profiler.profile() as prof:
        (g,) = mdl.grad((x ** 3).sum(), [x], create_graph=True)
        g.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 6 * x.numpy())  # d/dx Σ 3x² = 6x
    assert prof.stats[("PowScalar", "backward")].calls >= 1


def test_nothing_is_left_installed_even_after_an_error():
    before = originals()
    with pytest.raises(ValueError, match="linear"):
        with profiler.profile():
            F.linear(mdl.randn(2, 3), mdl.randn(4, 5))
    assert originals() == before
    with profiler.profile():
        mlp_step("cpu")
    assert originals() == before
    assert profiler._active is None


def test_profiles_do_not_nest():
    before = originals()
    with profiler.profile():
        with pytest.raises(RuntimeError, match="already running"):
            with profiler.profile():
                pass
    assert originals() == before


def test_region_is_one_row_with_its_ops_inside():
    with profiler.profile() as prof:
        with prof.region("data"):
            (mdl.randn(3, 3) * 2).sum()
        mlp_step("cpu", with_region=prof)
    assert prof.stats[("data", "region")].calls == 1
    assert prof.stats[("update", "region")].calls == 1
    assert ("Mul", "forward") not in prof.stats  # the Mul ran inside the region
    with prof.region("after the block"):  # a region of a finished profile records nothing
        pass
    assert ("after the block", "region") not in prof.stats


def test_optimizer_steps_are_rows():
    optim = pytest.importorskip("minidl.optim")
    w = mdl.randn(4, 3, requires_grad=True)
    opt = optim.SGD([w], lr=0.1)
    with profiler.profile() as prof:
        (w * w).sum().backward()
        opt.step()
    assert prof.stats[("SGD.step", "update")].calls == 1
    opt.step()  # outside the block: the profile's step hooks are gone
    assert prof.stats[("SGD.step", "update")].calls == 1
    wrapped = optim.Lookahead(optim.SGD([w], lr=0.1), k=2)
    with profiler.profile() as prof:
        wrapped.step()
    assert prof.stats[("Lookahead.step", "update")].calls == 1  # the inner SGD's step is part of its row
    assert ("SGD.step", "update") not in prof.stats


def test_table_lists_rows_largest_first(capsys):
    with profiler.profile(show=True) as prof:
        mlp_step("cpu")
    printed = capsys.readouterr().out
    assert printed.strip() == prof.table().strip()
    lines = printed.splitlines()
    names = [line.split()[0] for line in lines[2:2 + len(prof.rows())]]
    assert names == [s.name.split()[0] for s in prof.rows()]
    assert "framework overhead" in printed and "µs per op call" in printed
    data = prof.as_dict()
    assert data["rows"][0]["name"] == prof.rows()[0].name and data["wall_s"] == prof.wall


class Sleepy(mdl.Function):
    """y = x, with a forward that takes at least 20 ms of 'work'."""

    def forward(self, x):
        time.sleep(0.02)
        return x.copy()

    def backward(self, gy):
        return gy * 1.0  # one op call inside the node: its machinery is the node's overhead


def test_work_and_overhead_are_told_apart():
    x = mdl.randn(3, requires_grad=True)
    with profiler.profile() as prof:
        Sleepy()(x).sum().backward()
    forward = prof.stats[("Sleepy", "forward")]
    assert forward.work >= 0.02  # the sleep is the op's work...
    assert forward.overhead < forward.total - 0.02 + 1e-9  # ...and none of it is counted as overhead
    backward = prof.stats[("Sleepy", "backward")]
    assert 0 < backward.overhead <= backward.total


def test_a_profile_can_be_entered_again_to_add_steps():
    prof = profiler.profile()
    with prof:
        mlp_step("cpu")
    with prof:
        mlp_step("cpu")
    linear = prof.stats[("Linear", "forward")]
    assert linear.calls == 4
    assert linear.work > 0  # the forward was timed on the second entry too


def test_a_failed_op_closes_its_row_and_leaves_the_op_object_as_it_was():
    with profiler.profile() as prof:
        with pytest.raises(ValueError, match="linear"):
            F.linear(mdl.randn(2, 3), mdl.randn(4, 5))
        y = mdl.randn(3, requires_grad=True) * 2.0  # the next op is a row of its own: the failed call closed
    assert prof.stats[("Linear", "forward")].calls == 1
    assert prof.stats[("Mul", "forward")].calls == 1
    assert "forward" not in vars(y.creator)  # the timed forward was handed to this one call only


class Refuses(autograd.FunctionHook):
    def forward_preprocess(self, function, inputs):
        raise KeyError("refused")


def test_an_op_stopped_before_its_forward_is_left_as_it_was():
    op = Sleepy()
    with profiler.profile() as prof:
        with Refuses(), pytest.raises(KeyError):
            op(mdl.randn(3))
    assert "forward" not in vars(op)
    row = prof.stats[("Sleepy", "forward")]
    assert row.calls == 1 and row.total < 0.02  # its 20 ms forward never ran


# ---------------------------------------------------------------- the timeline and its Chrome trace
def test_chrome_trace_has_every_interval_nested_in_time(tmp_path):
    import json
    with profiler.profile() as prof:
        mlp_step("cpu", with_region=prof)
    path = tmp_path / "step.json"
    prof.export_chrome_trace(path)
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    assert not list(tmp_path.glob("*.tmp*"))  # written, then renamed
    # one event per call of each row: the table's calls and the trace's events agree
    counted = {}
    for e in events:
        assert e["ph"] == "X" and e["dur"] >= 0 and e["ts"] >= 0
        counted[(e["name"], e["cat"])] = counted.get((e["name"], e["cat"]), 0) + 1
    assert counted == {(s.name, s.phase): s.calls for s in prof.rows()}
    # the two Linear forwards carry their inputs' shapes: x, W, b
    linears = [e["args"]["shapes"] for e in events if e["name"] == "Linear" and e["cat"] == "forward"]
    assert linears == [[[5, 8], [16, 8], [16]], [[5, 16], [4, 16], [4]]]
    # every node's backward lies inside the one walk; forwards end before the walk starts
    (walk,) = [e for e in events if e["name"] == profiler.ENGINE]
    nodes = [e for e in events if e["cat"] == "backward" and e["name"] != profiler.ENGINE]
    assert nodes and all(walk["ts"] <= e["ts"] and e["ts"] + e["dur"] <= walk["ts"] + walk["dur"] + 1e-3
                         for e in nodes)
    assert all(e["ts"] + e["dur"] <= walk["ts"] + 1e-3 for e in events if e["cat"] == "forward")
    (update,) = [e for e in events if e["name"] == "update"]
    assert update["ts"] >= walk["ts"] + walk["dur"] - 1e-3
    assert update["dur"] == pytest.approx(prof.stats[("update", "region")].total * 1e6)  # microseconds
    assert all(e["ts"] + e["dur"] <= prof.wall * 1e6 + 1e-3 for e in events)


def test_chrome_trace_to_a_missing_folder_fails_and_leaves_nothing(tmp_path):
    with profiler.profile() as prof:
        mlp_step("cpu")
    with pytest.raises(OSError):
        prof.export_chrome_trace(tmp_path / "absent" / "step.json")
    assert not list(tmp_path.rglob("*"))
