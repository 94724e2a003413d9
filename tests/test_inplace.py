"""In-place changes after forward: the version check in backward, and the changes that count.

A recorded op keeps the mutation clock's value; backward raises when a tensor
it reads was changed in place after that, and only then: an op that never
reads an input (add, a reshape, a concatenation) does not care, as in PyTorch.
"""
import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from minidl import nn, optim
from minidl.op_cases import cases
from minidl.tensor import Tensor


def f64(data, requires_grad=True):
    return mdl.tensor(np.asarray(data, dtype=np.float64), requires_grad=requires_grad)


def stepped_graph():
    """w, v with gradients from one backward, SGD over both, and a graph recorded before its step."""
    w, v = f64([1.0, 2.0, 3.0]), f64([4.0, 5.0, 6.0])
    opt = optim.SGD([w, v], lr=0.1)
    (w * v).sum().backward()  # dw = v, dv = w: step() will change both
    return w, v, opt, (w * v).sum()


# ---------------------------------------------------------------- what raises
def test_backward_through_a_graph_recorded_before_an_optimizer_step_raises():
    w, v, opt, y = stepped_graph()
    opt.step()
    with pytest.raises(RuntimeError, match=r"backward through Mul.*shape \(3,\).*changed in place.*clone\(\)"):
        y.backward()


def test_the_forward_after_the_step_gives_the_gradient_at_the_new_values():
    w, v, opt, _ = stepped_graph()
    opt.step()  # w ← w − 0.1·v = [0.6, 1.5, 2.4];  v ← v − 0.1·w = [3.9, 4.8, 5.7]
    opt.zero_grad()
    (w * v).sum().backward()
    np.testing.assert_allclose(v.grad.numpy(), [0.6, 1.5, 2.4])
    np.testing.assert_allclose(w.grad.numpy(), [3.9, 4.8, 5.7])


def test_augmented_assignment_to_data_counts_as_a_change():
    w, v = f64([1.0, 2.0, 3.0]), f64([4.0, 5.0, 6.0])
    y = (w * v).sum()
    w.data -= 1.0  # the manual SGD line: goes through the .data setter
    with pytest.raises(RuntimeError, match="Mul"):
        y.backward()


@pytest.mark.parametrize("view", [lambda w: w.reshape(3, 1), lambda w: w.detach(), lambda w: w[1:]],
                         ids=["reshape", "detach", "slice"])
def test_a_change_to_the_base_is_seen_through_a_view(view):
    w, v = f64([1.0, 2.0, 3.0]), f64([4.0, 5.0])
    y = (view(w).reshape(-1)[:2] * v).sum()  # Mul saved memory that w owns
    with mdl.no_grad():
        w.mul_(2.0)
    with pytest.raises(RuntimeError, match="Mul"):
        y.backward()


def test_changing_an_output_that_backward_reads_raises():
    x = f64([0.0, 1.0])
    y = x.exp()  # backward computes dx = dy·y from the output
    with mdl.no_grad():
        y.mul_(2.0)
    with pytest.raises(RuntimeError, match=r"Exp.*output 0 of shape \(2,\)"):
        y.sum().backward()


def test_load_state_dict_between_forward_and_backward_raises():
    layer = nn.Linear(2, 1)
    x = mdl.tensor([[1.0, 2.0]], requires_grad=True)
    y = layer(x).sum()  # dx = W: Linear reads the weight
    layer.load_state_dict({"weight": np.ones((1, 2), np.float32), "bias": np.zeros(1, np.float32)})
    with pytest.raises(RuntimeError, match="Linear"):
        y.backward()


# ---------------------------------------------------------------- what does not raise
@pytest.mark.parametrize("build, dv", [
    (lambda w, v: (w + v).sum(), [1.0, 1.0, 1.0]),
    (lambda w, v: (v - w).sum(), [1.0, 1.0, 1.0]),
    (lambda w, v: (mdl.concatenate([w, v]).reshape(2, 3)[1] * 2.0).sum(), [2.0, 2.0, 2.0]),
    (lambda w, v: (w[1:] * 3.0).sum() + (v.sum() * 0.5), [0.5, 0.5, 0.5]),
    (lambda w, v: (w.exp() * v).sum(), np.exp([1.0, 2.0, 3.0])),  # e^w from forward, before the change
    (lambda w, v: (w.tanh() + v * v).sum(), [8.0, 10.0, 12.0]),
], ids=["add", "sub", "concatenate-reshape-getitem", "slice-times-constant", "exp", "tanh"])
def test_ops_that_do_not_read_the_changed_input_do_not_raise(build, dv):
    w, v = f64([1.0, 2.0, 3.0]), f64([4.0, 5.0, 6.0])
    y = build(w, v)
    with mdl.no_grad():
        w.add_(10.0)
    y.backward()
    np.testing.assert_allclose(v.grad.numpy(), dv, rtol=1e-12)


def test_a_changed_bias_does_not_stop_linear():
    x, weight, bias = f64([[1.0, 2.0]]), f64([[3.0, 4.0]]), f64([0.5])
    y = F.linear(x, weight, bias).sum()
    bias.data += 1.0  # dx = W and dW = x: the bias is never read
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), [[3.0, 4.0]])
    np.testing.assert_allclose(weight.grad.numpy(), [[1.0, 2.0]])


def test_training_accumulation_and_retain_graph_keep_working():
    w = f64([1.0, -2.0])
    opt = optim.SGD([w], lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        loss = (w * w).sum()
        loss.backward(retain_graph=True)
        loss.backward()  # the same graph twice, nothing changed: dw = 2·2w
        opt.step()  # w ← w − 0.1·4w = 0.6w
    np.testing.assert_allclose(w.numpy(), [0.36, -0.72])


def test_a_change_after_backward_is_harmless():
    w, v = f64([1.0, 2.0]), f64([3.0, 4.0])
    (w * v).sum().backward()
    with mdl.no_grad():
        w.zero_()
    np.testing.assert_allclose(v.grad.numpy(), [1.0, 2.0])


# ---------------------------------------------------------------- every op: an error or the right gradient
@pytest.mark.parametrize("name,fn,inputs", cases(), ids=[c[0] for c in cases()])
def test_changing_every_input_gives_an_error_or_the_unchanged_gradient(name, fn, inputs):
    """An op that declares an input unread (saved_inputs) must give the gradient of the values it saw."""
    wrt = [x for x in inputs if isinstance(x, Tensor) and x.requires_grad]

    def gradients():
        outputs = fn(*inputs)
        outputs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
        vs = [Tensor(np.random.default_rng(1).standard_normal(o.shape)) for o in outputs]
        return outputs, vs

    outputs, vs = gradients()
    expected = mdl.grad(outputs, wrt, grad_outputs=vs, allow_unused=True)
    outputs, vs = gradients()
    for x in inputs:
        if isinstance(x, Tensor) and x.dtype.kind == "f":
            x.data += 0.37  # stays positive where the case needs it, moves across relu/abs/clip kinks
    try:
        got = mdl.grad(outputs, wrt, grad_outputs=vs, allow_unused=True)
    except RuntimeError as error:
        assert "changed in place" in str(error)
        return
    for e, g in zip(expected, got):
        assert (e is None) == (g is None)
        if e is not None:
            np.testing.assert_array_equal(g.numpy(), e.numpy())


# ---------------------------------------------------------------- PyTorch raises in the same places
TORCH_CASES = {
    "mul": lambda w, v: (w * v).sum(),
    "add": lambda w, v: (w + v).sum(),
    "scale-then-add": lambda w, v: (w * 2.0 + v).sum(),
    "divide-by-w": lambda w, v: (v / w).sum(),
    "square": lambda w, v: (w ** 2).sum() + v.sum(),
    "exp": lambda w, v: (w.exp() * v).sum(),
    "tanh": lambda w, v: (w.tanh() * v).sum(),
    "sigmoid": lambda w, v: (w.sigmoid() + v).sum(),
    "view-times-v": lambda w, v: (w.reshape(3, 1) * v.reshape(3, 1)).sum(),
    "slice-times-constant": lambda w, v: (w[1:] * 3.0).sum() + v.sum(),
    "matmul": lambda w, v: w @ v,
}


@pytest.mark.parametrize("case", list(TORCH_CASES))
def test_raises_exactly_where_pytorch_raises(case):
    torch = pytest.importorskip("torch")
    build = TORCH_CASES[case]
    w0, v0 = np.array([0.5, 1.0, 1.5]), np.array([2.0, -1.0, 3.0])

    def run(tensor, no_grad):
        w, v = tensor(w0.copy()), tensor(v0.copy())
        y = build(w, v)
        with no_grad():
            w.add_(1.0)
        try:
            y.backward()
        except RuntimeError:
            return None
        return v.grad.numpy()

    ours = run(lambda a: f64(a), mdl.no_grad)
    theirs = run(lambda a: torch.tensor(a, requires_grad=True), torch.no_grad)
    assert (ours is None) == (theirs is None)
    if ours is not None:
        np.testing.assert_allclose(ours, theirs, rtol=1e-12)


# ---------------------------------------------------------------- in-place methods refuse a recorded tensor
def test_in_place_methods_refuse_a_tensor_that_requires_grad_outside_no_grad():
    w = f64([1.0, 2.0])
    with pytest.raises(RuntimeError, match=r"add_: in-place.*no_grad"):
        w.add_(1.0)
    np.testing.assert_array_equal(w.numpy(), [1.0, 2.0])
