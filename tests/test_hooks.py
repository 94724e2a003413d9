"""The seams outside autograd: optimizer step hooks, global module hooks, the random generator's hook.
(The backward walk's hooks are tested with FunctionHook, in tests/autograd/test_function_hooks.py.)"""
import numpy as np
import pytest

import minidl as mdl
from minidl import backend, hooks, nn, optim


def _sgd_problem():
    w = mdl.tensor([1.0, -2.0], requires_grad=True)
    (w * w).sum().backward()  # g = 2w = [2, -4]
    return w, optim.SGD([w], lr=0.1)


def _record_step_hooks(opt, register_pre, register_post, calls):
    """Four hooks, one of each kind, each noting what it was given."""
    def note(name):
        return lambda o, a, k: calls.append((name, o is opt, a[0] is opt, len(a), sorted(k)))
    return [register_pre(note("all pre")), opt.register_step_post_hook(note("own post")),
            opt.register_step_pre_hook(note("own pre")), register_post(note("all post"))]


def test_step_hooks_run_in_order_and_can_replace_the_arguments():
    w, opt = _sgd_problem()
    calls = []
    handles = _record_step_hooks(opt, hooks.register_optimizer_step_pre_hook,
                                 hooks.register_optimizer_step_post_hook, calls)
    loss = opt.step(lambda: mdl.tensor(7.0))
    # PyTorch's order and arguments: args starts with the optimizer, then the step's own
    assert calls == [("all pre", True, True, 2, []), ("own pre", True, True, 2, []),
                     ("own post", True, True, 2, []), ("all post", True, True, 2, [])]
    assert float(loss.item()) == 7.0
    np.testing.assert_allclose(w.numpy(), [1.0 - 0.1 * 2.0, -2.0 + 0.1 * 4.0], rtol=1e-6)
    for h in handles:
        h.remove()
    calls.clear()
    opt.step()
    assert calls == []  # removed: nothing runs
    # A pre-hook that returns (args, kwargs) replaces them: here the closure.
    handle = opt.register_step_pre_hook(lambda o, a, k: ((o, lambda: mdl.tensor(3.0)), {}))
    assert float(opt.step(lambda: mdl.tensor(7.0)).item()) == 3.0
    handle.remove()
    handle = opt.register_step_pre_hook(lambda o, a, k: "not a pair")
    with pytest.raises(RuntimeError, match="must return None or a tuple"):
        opt.step()
    handle.remove()


def test_step_hooks_as_pytorch_calls_them():
    torch = pytest.importorskip("torch")
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
    theirs, ours = [], []
    t = torch.tensor([1.0, -2.0], requires_grad=True)
    (t * t).sum().backward()
    t_opt = torch.optim.SGD([t], lr=0.1)
    handles = _record_step_hooks(t_opt, register_optimizer_step_pre_hook, register_optimizer_step_post_hook, theirs)
    t_opt.step(closure=lambda: torch.tensor(7.0))
    for h in handles:
        h.remove()
    w, opt = _sgd_problem()
    handles = _record_step_hooks(opt, hooks.register_optimizer_step_pre_hook,
                                 hooks.register_optimizer_step_post_hook, ours)
    opt.step(closure=lambda: mdl.tensor(7.0))
    for h in handles:
        h.remove()
    assert ours == theirs
    np.testing.assert_allclose(w.numpy(), t.detach().numpy(), rtol=1e-6)


def test_step_hooks_of_a_wrapper_and_its_inner_optimizer():
    w, inner = _sgd_problem()
    wrapper = optim.Lookahead(inner, k=5)
    seen = []
    handle = hooks.register_optimizer_step_pre_hook(lambda o, a, k: seen.append(type(o).__name__))
    own = wrapper.register_step_post_hook(lambda o, a, k: seen.append("lookahead post"))
    wrapper.step()
    handle.remove()
    own.remove()
    assert seen == ["Lookahead", "SGD", "lookahead post"]


def test_post_hooks_do_not_run_when_the_step_raises():
    w, opt = _sgd_problem()
    seen = []
    opt.register_step_pre_hook(lambda o, a, k: seen.append("pre"))
    opt.register_step_post_hook(lambda o, a, k: seen.append("post"))

    def closure():
        raise ValueError("the closure failed")
    with pytest.raises(ValueError, match="the closure failed"):
        opt.step(closure)
    assert seen == ["pre"]  # as PyTorch: the step did not happen


def test_global_module_hooks_wrap_every_call_before_the_modules_own():
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU())
    order = []
    own = model[0].register_forward_hook(lambda m, i, o: order.append(("own", type(m).__name__)))
    pre = hooks.register_module_forward_pre_hook(lambda m, i: order.append(("pre", type(m).__name__)))
    post = nn.module.register_module_forward_hook(lambda m, i, o: order.append(("post", type(m).__name__)))
    x = mdl.tensor(np.array([[1.0, -1.0]], np.float32))
    model(x)
    assert order == [("pre", "Sequential"), ("pre", "Linear"), ("post", "Linear"), ("own", "Linear"),
                     ("pre", "ReLU"), ("post", "ReLU"), ("post", "Sequential")]
    pre.remove()
    post.remove()
    own.remove()
    # A pre-hook's value replaces the inputs, a post-hook's the output.
    doubled = hooks.register_module_forward_pre_hook(lambda m, i: (i[0] * 2.0,) if isinstance(m, nn.Linear) else None)
    plus_one = hooks.register_module_forward_hook(lambda m, i, o: o + 1.0 if isinstance(m, nn.Sequential) else None)
    got = model(x).numpy()
    doubled.remove()
    plus_one.remove()
    w, b = model[0].weight.numpy(), model[0].bias.numpy()
    np.testing.assert_allclose(got, np.maximum((2.0 * x.numpy()) @ w.T + b, 0.0) + 1.0, rtol=1e-6)
    order.clear()
    model(x)
    assert order == []


def test_rng_hook_sees_each_generator_before_the_draw():
    mdl.manual_seed(0)
    seen = []

    def record(device, generator):
        seen.append((device, generator.bit_generator.state["state"]["state"]))
    with backend.rng_hook(record):
        a = mdl.rand(3).numpy()
    b = mdl.rand(3).numpy()  # outside: not seen
    assert len(seen) == 1 and seen[0][0] == "cpu"
    mdl.manual_seed(0)
    before = backend.rng("cpu").bit_generator.state["state"]["state"]
    assert seen[0][1] == before  # the state before the draw
    np.testing.assert_array_equal(mdl.rand(3).numpy(), a)
    assert not np.array_equal(a, b)


def test_checkpointing_replay_attaches_only_while_its_blocks_are_open():
    from minidl.checkpoint.replay import BufferGuard, RngState, first_draws_recorded
    bn = nn.BatchNorm1d(2)
    x = mdl.tensor(np.array([[1.0, 2.0], [3.0, 6.0]], np.float32))
    before = bn.running_mean.numpy().copy()
    with BufferGuard(), BufferGuard():
        assert len(hooks.module_call_hooks) == 1  # one module hook shared by the open guards
        bn(x)
        np.testing.assert_allclose(bn.running_mean.numpy(), 0.9 * before + 0.1 * np.array([2.0, 4.0]), rtol=1e-6)
    assert len(hooks.module_call_hooks) == 0
    np.testing.assert_array_equal(bn.running_mean.numpy(), before)  # put back
    mdl.manual_seed(3)
    with first_draws_recorded(RngState()) as state:
        first = mdl.rand(4).numpy()
    assert backend._rng_hooks == () and state.cpu is not None
    state.restore()
    np.testing.assert_array_equal(mdl.rand(4).numpy(), first)  # the recorded state draws the same numbers
