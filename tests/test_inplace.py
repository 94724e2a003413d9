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
    w.array -= 1.0  # the manual SGD line: goes through the .array setter
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
    bias.array += 1.0  # dx = W and dW = x: the bias is never read
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
            x.array += 0.37  # stays positive where the case needs it, moves across relu/abs/clip kinks
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


# ---------------------------------------------------------------- augmented assignment and item assignment
def test_the_textbook_sgd_step_changes_the_model_as_pytorch_does():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    w1, b1, x = rng.standard_normal((3, 4)), rng.standard_normal(3), rng.standard_normal((5, 4))
    model = nn.Linear(4, 3).double()
    theirs = torch.nn.Linear(4, 3).double()
    with mdl.no_grad():
        model.weight.copy_(w1)
        model.bias.copy_(b1)
    with torch.no_grad():
        theirs.weight.copy_(torch.tensor(w1))
        theirs.bias.copy_(torch.tensor(b1))
    for _ in range(3):
        model(mdl.tensor(x)).pow(2).sum().backward()
        theirs(torch.tensor(x)).pow(2).sum().backward()
        with mdl.no_grad():
            for p in model.parameters():
                p -= 0.01 * p.grad
                p.grad = None
        with torch.no_grad():
            for p in theirs.parameters():
                p -= 0.01 * p.grad
                p.grad = None
    np.testing.assert_allclose(model.weight.numpy(), theirs.weight.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(model.bias.numpy(), theirs.bias.detach().numpy(), rtol=1e-12)
    assert not np.allclose(model.weight.numpy(), w1)  # the step did change the weights


def test_a_manual_step_on_a_standalone_tensor_keeps_it_a_leaf_that_learns():
    w = f64([1.0, -2.0])
    (w * w).sum().backward()  # dw = 2w
    with mdl.no_grad():
        w -= 0.25 * w.grad  # w ← w − ½w
    np.testing.assert_allclose(w.numpy(), [0.5, -1.0])
    assert w.requires_grad and w.is_leaf
    w.grad = None
    (w * w).sum().backward()  # the next backward reaches the same tensor
    np.testing.assert_allclose(w.grad.numpy(), [1.0, -2.0])


@pytest.mark.parametrize("op,apply", [("+=", lambda a, b: a.__iadd__(b)), ("-=", lambda a, b: a.__isub__(b)),
                                      ("*=", lambda a, b: a.__imul__(b)), ("/=", lambda a, b: a.__itruediv__(b)),
                                      ("**=", lambda a, b: a.__ipow__(b))])
def test_augmented_assignments_change_the_tensor_itself(op, apply):
    a, b = np.array([[1.5, 2.0, 3.0], [0.5, 4.0, 1.0]]), np.array([2.0, 0.5, 3.0])
    x = mdl.tensor(a)
    buffer = x.array
    y = apply(x, mdl.tensor(b))
    assert y is x and x.array is buffer  # the same tensor, the same memory
    np.testing.assert_allclose(x.numpy(), apply(a.copy(), b))


def test_an_augmented_assignment_counts_as_an_in_place_change():
    w, v = f64([1.0, 2.0]), f64([3.0, 4.0])
    y = (w * v).sum()
    with mdl.no_grad():
        w += 1.0
    with pytest.raises(RuntimeError, match="backward through Mul"):
        y.backward()


def test_in_place_outside_no_grad_follows_pytorch_rules():
    leaf = f64([1.0, 2.0])
    with pytest.raises(RuntimeError, match=r"\+=: in-place change of a leaf that requires grad \(shape \(2,\)\)"):
        leaf += 1.0
    inner = leaf * 2.0
    with pytest.raises(RuntimeError, match=r"\*=: in-place change of a tensor in a graph.*out of place"):
        inner *= 3.0
    plain = mdl.tensor(np.zeros(2))
    with pytest.raises(RuntimeError, match=r"-=: in-place change by a value that requires grad"):
        plain -= leaf
    with pytest.raises(RuntimeError, match=r"item assignment.*by a value that requires grad"):
        plain[0] = leaf[1]
    np.testing.assert_array_equal(leaf.numpy(), [1.0, 2.0])  # refused before any change
    np.testing.assert_array_equal(plain.numpy(), [0.0, 0.0])
    plain += mdl.tensor([1.0, 2.0], dtype="float64")  # nothing needs a gradient: allowed, as in PyTorch
    np.testing.assert_array_equal(plain.numpy(), [1.0, 2.0])


def test_pytorch_refuses_the_same_leaf_change():
    torch = pytest.importorskip("torch")
    leaf = torch.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        leaf += 1.0


def test_an_integer_tensor_refuses_a_float_result_in_place():
    counts = mdl.tensor(np.array([1, 2]))
    with pytest.raises(TypeError, match=r"\+=: the result of a int64 tensor and a float operand can't be stored"):
        counts += 0.5
    np.testing.assert_array_equal(counts.numpy(), [1, 2])


@pytest.mark.parametrize("key", [
    (1,), (slice(None), 2), (1, slice(None), [0, 3]), ([1, 0], slice(None), 2), (Ellipsis, [2, 0]),
    (0, [1, 2], [3, 0]), (None, 1, slice(None), [0, 2]), ([[0], [1]], 1, [2, 3]),
], ids=str)
def test_item_assignment_and_indexing_place_axes_as_pytorch(key):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    base = rng.standard_normal((2, 3, 4))
    theirs = torch.tensor(base)[key]
    ours = mdl.tensor(base)[key]
    assert ours.shape == tuple(theirs.shape)
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    value = rng.standard_normal(tuple(theirs.shape))
    x, tx = mdl.tensor(base), torch.tensor(base)
    x[key] = value
    tx[key] = torch.tensor(value)
    np.testing.assert_array_equal(x.numpy(), tx.numpy())
    w, tw = f64(base), torch.tensor(base, requires_grad=True)  # the gradient goes back to the same places
    (w[key] * mdl.tensor(value)).sum().backward()
    (tw[key] * torch.tensor(value)).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), tw.grad.numpy())


def test_item_assignment_with_a_mask_and_a_broadcast_value():
    x = mdl.tensor(np.array([[1.0, -2.0], [-3.0, 4.0]]))
    x[x < 0] = 0.0
    np.testing.assert_array_equal(x.numpy(), [[1.0, 0.0], [0.0, 4.0]])
    x[:, 1] = mdl.tensor(np.array([7.0, 8.0]))
    np.testing.assert_array_equal(x.numpy(), [[1.0, 7.0], [0.0, 8.0]])
    with pytest.raises(ValueError, match=r"item assignment: a value of shape \(3,\) can't be written into x\[key\] "
                                         r"of shape \(2,\) \(x has shape \(2, 2\)\)"):
        x[:, 0] = np.ones(3)


def test_item_assignment_to_a_parameter_under_no_grad_counts_as_a_change():
    layer = nn.Linear(2, 1)
    x = mdl.tensor([[1.0, 2.0]], requires_grad=True)
    y = layer(x).sum()
    with mdl.no_grad():
        layer.weight[0, 0] = 5.0
    assert layer.weight.numpy()[0, 0] == 5.0
    with pytest.raises(RuntimeError, match="Linear"):
        y.backward()


# ---------------------------------------------------------------- saved indices, masks and conditions
def _integer_or_boolean_inputs(inputs):
    return [i for i, x in enumerate(inputs) if isinstance(x, Tensor) and x.dtype.kind in "biu"]


SAVED_INDEX_CASES = [(name, position) for name, _, inputs in cases()
                     for position in _integer_or_boolean_inputs(inputs)]


def _case(name):
    return next((fn, inputs) for n, fn, inputs in cases() if n == name)  # fresh inputs for each test


def _loss_of(outputs):
    outputs = [outputs] if isinstance(outputs, Tensor) else [o for o in outputs if o.requires_grad]
    return sum(((o * o).sum() for o in outputs), mdl.tensor(0.0, dtype="float64"))


def test_the_sweep_covers_every_op_with_an_index_mask_or_condition():
    names = {name for name, _ in SAVED_INDEX_CASES}
    assert {"embedding", "gather", "index_select", "scatter", "scatter_add", "masked_fill", "masked_select",
            "where", "getitem", "cross_entropy", "nll_loss", "scaled_dot_product_attention_bool_mask"} <= names


@pytest.mark.parametrize("name,position", SAVED_INDEX_CASES, ids=[f"{n}-input{p}" for n, p in SAVED_INDEX_CASES])
def test_changing_a_saved_index_mask_or_condition_in_place_makes_backward_refuse(name, position):
    fn, inputs = _case(name)
    loss = _loss_of(fn(*inputs))
    index = inputs[position]
    with mdl.no_grad():
        index.copy_(index.array.copy())  # the same values: PyTorch refuses any change, and so do we
    with pytest.raises(RuntimeError, match=r"backward through \w+: .*its index, mask or condition"):
        loss.backward()


@pytest.mark.parametrize("name", sorted({n for n, _ in SAVED_INDEX_CASES}))
def test_no_recorded_op_keeps_an_index_outside_the_version_check(name):
    """Every array a recorded node holds that shares memory with an index, mask or condition the
    caller passed is covered by a Tensor of the node's saved_indices (or is the node's own input)."""
    from minidl.tensor import _owner
    fn, inputs = _case(name)
    outputs = fn(*inputs)
    given = [inputs[i] for i in _integer_or_boolean_inputs(inputs)]
    nodes, stack = set(), [o.creator for o in ([outputs] if isinstance(outputs, Tensor) else outputs)]
    while stack:
        node = stack.pop()
        if node is None or node in nodes:
            continue
        nodes.add(node)
        stack.extend(x.creator for x in node.inputs)
    assert nodes
    for node in nodes:
        checked = {id(_owner(t.array)) for t in node.saved_indices} | {id(_owner(x.array)) for x in node.inputs}
        values = list(vars(node).values())
        while values:
            value = values.pop()
            if isinstance(value, (tuple, list)):
                values.extend(value)
                continue
            array = value.array if isinstance(value, Tensor) else value
            if not isinstance(array, np.ndarray):
                continue
            for x in given:
                if np.shares_memory(array, x.array):
                    assert id(_owner(x.array)) in checked, (
                        f"{type(node).__name__} keeps memory of input {x.shape} {x.dtype} outside its checks")


def test_gather_refuses_instead_of_sending_the_gradient_to_the_new_positions():
    x = f64(np.arange(6.0).reshape(2, 3))
    index = mdl.tensor(np.array([[0], [1]]))
    y = mdl.gather(x, 1, index).sum()
    with mdl.no_grad():
        index.copy_(np.array([[2], [2]]))  # before: the gradient would have come back [[0,0,1],[0,0,1]]
    with pytest.raises(RuntimeError, match=r"backward through Gather.*index, mask or condition.*\(2, 1\), int64"):
        y.backward()
    x.grad = None
    mdl.gather(x, 1, mdl.tensor(np.array([[0], [1]]))).sum().backward()  # unchanged: the right places
    np.testing.assert_array_equal(x.grad.numpy(), [[1, 0, 0], [0, 1, 0]])


@pytest.mark.parametrize("op", ["embedding", "gather", "index_select", "scatter", "masked_fill", "where"])
def test_pytorch_refuses_the_same_six_changes(op):
    torch = pytest.importorskip("torch")
    x = torch.arange(6.0, dtype=torch.float64).reshape(2, 3).requires_grad_()
    index = torch.tensor([[0], [1]])
    mask = torch.tensor([[True, False, True], [False, True, False]])
    calls = {
        "embedding": (lambda: torch.nn.functional.embedding(index, x), index),
        "gather": (lambda: x.gather(1, index), index),
        "index_select": (lambda: x.index_select(1, index[:, 0]), index),
        "scatter": (lambda: x.scatter(1, index, 0.5), index),
        "masked_fill": (lambda: x.masked_fill(mask, 0.0), mask),
        "where": (lambda: torch.where(mask, x, 2 * x), mask),
    }
    make, changed = calls[op]
    y = make().pow(2).sum()
    with torch.no_grad():
        changed.copy_(changed.clone())
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()
