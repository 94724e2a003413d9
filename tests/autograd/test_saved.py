"""autograd.saved_tensors_hooks: what each op saves goes through pack and unpack, as in PyTorch."""
import contextlib
import gc
import weakref

import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from minidl import autograd, memory, nn


def _leaf(shape, seed, grad=True):
    return mdl.tensor(np.random.default_rng(seed).standard_normal(shape), requires_grad=grad)


def _copying_hooks(log=None):
    """pack: a copy of the array (the node then holds only the copy); unpack: that copy."""
    def pack(t):
        if log is not None:
            log.append(tuple(t.shape))
        return t.array.copy(order="K")  # the same layout: a product reads it in the same order
    return autograd.saved_tensors_hooks(pack, lambda a: a)


def _model():
    mdl.manual_seed(4)
    return nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.Tanh(), nn.Linear(8, 8), nn.GELU(),
                         nn.Dropout(0.3), nn.Linear(8, 3)).double()


def _grads(hooks):
    model = _model()
    mdl.manual_seed(5)  # the same dropout masks in both runs
    x = _leaf((5, 6), 1)
    with hooks:
        # exp, sigmoid and tanh read their own outputs in backward; the intermediates die here
        loss = (F.log_softmax(model(x), dim=-1).exp() * 2).sigmoid().sum() + model(x).tanh().pow(2).mean()
    gc.collect()
    loss.backward()
    return [x.grad.numpy()] + [p.grad.numpy() for p in model.parameters()]


def test_gradients_through_packed_copies_equal_the_plain_run_exactly():
    log = []
    plain, hooked = _grads(contextlib.nullcontext()), _grads(_copying_hooks(log))
    assert len(log) > 20  # every Linear, norm, activation and mask went through pack
    for a, b in zip(plain, hooked):
        np.testing.assert_array_equal(a, b)


def test_the_graph_keeps_only_what_pack_returned():
    """A pack that keeps the arrays elsewhere leaves no activation in the graph: the intermediate
    tensors are freed, the tracker counts almost nothing, and backward finds every value again."""
    store = {}

    def pack(t):
        store[len(store)] = t.array.copy()
        return len(store) - 1  # a ticket: the node keeps an int

    x, w1, w2 = _leaf((4, 5), 1, grad=False), _leaf((5, 6), 2), _leaf((6, 3), 3)
    with memory.track() as plain:
        (x @ w1).tanh() @ w2
    with memory.track() as m, autograd.saved_tensors_hooks(pack, store.pop):
        hidden = (x @ w1).tanh()
        watch = weakref.ref(hidden)
        loss = (hidden @ w2).sum()
        del hidden
        gc.collect()
        assert watch() is None  # nothing in the graph holds the activation any more
    assert plain.peak_bytes >= (4 * 5 + 4 * 6 + 4 * 6) * 8  # x, x·w1 and the tanh output
    # All the graph holds is w1, which the first product keeps as its edge to w1.grad (a leaf,
    # not saved: dw1 = xᵀ g reads x only); x went to the store, the activations too.
    assert m.peak_bytes == 5 * 6 * 8
    loss.backward()
    assert store == {}  # every ticket was unpacked, once
    h = np.tanh(x.numpy() @ w1.numpy())
    np.testing.assert_allclose(w2.grad.numpy(), h.T @ np.ones((4, 3)), rtol=1e-12)
    np.testing.assert_allclose(w1.grad.numpy(), x.numpy().T @ ((np.ones((4, 3)) @ w2.numpy().T) * (1 - h * h)),
                               rtol=1e-12)


def _pairs(lib, build, make):
    """(shapes packed, number of unpacks, packed objects left) for ``build`` under lib's hooks."""
    packed, unpacked = [], []

    def pack(t):
        packed.append(tuple(t.shape))
        return ("ticket", len(packed) - 1, t)

    def unpack(ticket):
        unpacked.append(ticket[1])
        return ticket[2]

    hooks = (lib.autograd.graph.saved_tensors_hooks if lib.__name__ == "torch" else lib.autograd.saved_tensors_hooks)
    tensors = make()
    with hooks(pack, unpack):
        loss = build(*tensors)
    loss.backward()
    return sorted(packed), sorted(unpacked), len(packed)


@pytest.mark.parametrize("build", [
    lambda x, w, v: ((x @ w) * v).sum(),
    lambda x, w, v: (x @ w + v).sum(),
    lambda x, w, v: ((x @ w).tanh() * v).exp().sum(),
    lambda x, w, v: (x @ w).sigmoid().mean() + (x.exp() @ w).sum(),
    lambda x, w, v: ((x * x) @ (w * w)).mean() + (v * v).sum(),
    lambda x, w, v: ((x @ w) / v).sum(),
], ids=["matmul-mul", "matmul-add", "tanh-exp", "sigmoid-exp", "mul-matmul", "div"])
def test_the_same_tensors_are_packed_as_in_pytorch(build):
    """For ops that save the same things in both (inputs for products and quotients, the output
    for tanh, exp and sigmoid), the same shapes are packed, and each is unpacked once in backward.
    (A Python scalar is a saved 0-d input in minidl, an attribute in PyTorch: not compared.)"""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((3, 4)), rng.standard_normal((4, 5)), rng.standard_normal((3, 5)) + 3]
    ours = _pairs(mdl, build, lambda: [mdl.tensor(a, requires_grad=True) for a in arrays])
    theirs = _pairs(torch, build, lambda: [torch.tensor(a, requires_grad=True) for a in arrays])
    assert ours[0] == theirs[0]
    assert ours[1] == theirs[1] == list(range(ours[2]))  # every pack unpacked once


def test_a_retained_graph_unpacks_again_and_grad_of_an_intermediate_works():
    x, w = _leaf((3, 4), 1), _leaf((4, 2), 2)
    with _copying_hooks():
        hidden = (x @ w).tanh()
        hidden.retain_grad()
        loss = (hidden @ w.T).sum()
    (g_hidden,) = mdl.grad(loss, [hidden], retain_graph=True)
    loss.backward(retain_graph=True)
    loss.backward()
    np.testing.assert_allclose(g_hidden.numpy(), np.ones((3, 4)) @ w.numpy(), rtol=1e-12)
    np.testing.assert_allclose(hidden.grad.numpy(), 2 * g_hidden.numpy(), rtol=1e-12)  # two backwards
    h = np.tanh(x.numpy() @ w.numpy())
    np.testing.assert_allclose(x.grad.numpy(), 2 * (g_hidden.numpy() * (1 - h * h)) @ w.numpy().T, rtol=1e-12)


def test_the_innermost_hooks_pack_and_the_packing_pair_unpacks_outside_the_block():
    outer, inner = [], []
    x = _leaf((2, 3), 1)
    with autograd.saved_tensors_hooks(lambda t: outer.append(1) or t, lambda t: t):
        with autograd.saved_tensors_hooks(lambda t: inner.append(1) or ("inner", t),
                                          lambda p: inner.append(p[0]) or p[1]):
            loss = (x * x).sum()
    assert outer == [] and inner == [1, 1]
    loss.backward()  # the block has ended: the pair that packed still unpacks
    assert inner == [1, 1, "inner", "inner"]
    np.testing.assert_allclose(x.grad.numpy(), 2 * x.numpy())


def test_an_in_place_change_after_packing_is_still_caught():
    x = _leaf((3,), 1)
    w = _leaf((3,), 2, grad=False)
    with autograd.saved_tensors_hooks(lambda t: t, lambda t: t):
        loss = (x * w).sum()
    w += 1.0
    with pytest.raises(RuntimeError, match=r"backward through Mul.*changed in place"):
        loss.backward()


def test_unpack_that_cannot_restore_names_the_op_and_the_mismatch():
    x = _leaf((3, 4), 1)
    with autograd.saved_tensors_hooks(lambda t: t.array, lambda a: a.astype(np.float32)):
        loss = x.tanh().sum()
    with pytest.raises(RuntimeError, match=r"unpack returned shape \(3, 4\), float32 on cpu for Tanh's .*"
                                           r"packed as shape \(3, 4\), float64 on cpu"):
        loss.backward()
    with autograd.saved_tensors_hooks(lambda t: t.array, lambda a: a[:2]):
        loss = (x * x).sum()
    with pytest.raises(RuntimeError, match=r"shape \(2, 4\).*Mul's input 0.*packed as shape \(3, 4\)"):
        loss.backward()
    with autograd.saved_tensors_hooks(lambda t: t.array, lambda a: "lost"):
        loss = (x * x).sum()
    with pytest.raises(RuntimeError, match=r"unpack returned a str for Mul's input"):
        loss.backward()
    with pytest.raises(TypeError, match="pack_hook must be callable"):
        autograd.saved_tensors_hooks(None, lambda a: a)


def test_create_graph_through_a_packed_node_is_refused():
    x = _leaf((3,), 1)
    with _copying_hooks():
        y = (x * x).sum()
    with pytest.raises(RuntimeError, match="create_graph=True.*packed by saved_tensors_hooks"):
        mdl.grad(y, [x], create_graph=True)


@pytest.mark.parametrize("name,fn,inputs", __import__("minidl.op_cases", fromlist=["cases"]).cases(),
                         ids=lambda case: case if isinstance(case, str) else "")
def test_every_op_gives_the_plain_gradient_through_packed_copies(name, fn, inputs):
    """Each op of minidl.op_cases, its saved values packed as copies (the node holds nothing else)
    and unpacked for backward: the gradients are the plain run's, to within 2 units in the last place
    (a reduction over a copy at another address may take another SIMD path: einsum's sums differ in
    their last bit from one allocation to the next, so bit-for-bit equality is not the engine's to give)."""
    from minidl.tensor import Tensor
    wrt = [x for x in inputs if isinstance(x, Tensor) and x.requires_grad]
    results = []
    for hooks in (contextlib.nullcontext(), _copying_hooks()):
        mdl.manual_seed(3)  # the same random draws in both runs
        with hooks:
            outputs = fn(*inputs)
        outputs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
        rng = np.random.default_rng(1)
        vs = [Tensor(rng.standard_normal(o.shape)) for o in outputs]
        results.append(mdl.grad(outputs, wrt, grad_outputs=vs, allow_unused=True))
    for plain, packed in zip(*results):
        assert (plain is None) == (packed is None)
        if plain is not None:
            np.testing.assert_array_max_ulp(packed.numpy(), plain.numpy(), maxulp=2)


class _ExpSavingResult(autograd.Function):
    """PyTorch's style: forward saves its result, backward reads it through ctx.saved_tensors."""

    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * y


def test_a_pytorch_style_function_reading_its_saved_result_works_under_the_hooks():
    x = _leaf((3, 2), 1)
    with _copying_hooks():
        loss = (_ExpSavingResult.apply(x) + 1.0).sum()  # Add does not save the result: only the node has it
    gc.collect()
    loss.backward()
    np.testing.assert_allclose(x.grad.numpy(), np.exp(x.numpy()), rtol=1e-15)


# ---------------------------------------------------------------- what each node declares it saves
class _MaskedScale(autograd.Function):
    """y = x · m, m = [x > 0] drawn in forward and declared; a second array kept but not declared."""
    saved_inputs = ()
    saved_arrays = ("mask",)

    def forward(self, x):
        self.mask = (x > 0).astype(x.dtype)
        self.note = np.zeros(3)  # not declared: the hooks do not see it, and it stays on the node
        return x * self.mask

    def backward(self, gy):
        return gy * mdl.tensor(self.mask)


def test_a_functions_declared_arrays_are_packed_let_go_and_given_back():
    x = _leaf((3, 4), 1)
    log = []
    with _copying_hooks(log):
        y = _MaskedScale()(x)
        node = y.creator
        assert isinstance(node.mask, np.ndarray)  # still there after the call: its caller may read it
        loss = y.sum()  # the next recorded op lets it go (Sum saves nothing)
        assert node.mask is None
    assert log == [(3, 4)]  # the mask, and nothing else: no input is saved, the undeclared array unseen
    assert isinstance(node.note, np.ndarray)
    loss.backward(retain_graph=True)
    assert node.mask is None  # given back for the backward only
    loss.backward()  # and given back again
    np.testing.assert_array_equal(x.grad.numpy(), 2 * (x.numpy() > 0).astype(np.float64))


def test_only_declared_names_are_handed_out_or_put_back():
    node = _MaskedScale()
    assert node.saved_array_values() == {}  # nothing stored yet
    node.forward(np.array([1.0, -1.0]))
    assert list(node.saved_array_values()) == ["mask"]
    with pytest.raises(ValueError, match=r"_MaskedScale.set_saved_arrays: 'note' is not one of its "
                                         r"saved_arrays \('mask',\); declare it there"):
        node.set_saved_arrays({"note": None})
    node.set_saved_arrays({"mask": None})
    assert node.mask is None and node.saved_array_values() == {}


class _Census(autograd.FunctionHook):
    """Counting identity hooks (pack files the Tensor under a ticket, unpack hands it back), and the
    nodes recorded inside the block: forward ops, and the ops a recorded backward calls."""

    def __init__(self):
        self.nodes, self.tickets, self.unpacked = [], [], []
        self.hooks = autograd.saved_tensors_hooks(self.pack, self.unpack)

    def pack(self, t):
        self.tickets.append(t)
        return len(self.tickets) - 1

    def unpack(self, ticket):
        self.unpacked.append(ticket)
        return self.tickets[ticket]

    def forward_postprocess(self, function, inputs, outputs):
        first = outputs[0] if isinstance(outputs, tuple) else outputs
        if first is not None and first.creator is function:
            self.nodes.append(function)

    def __enter__(self):
        super().__enter__()
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self.hooks.__exit__(*exc)  # the packed arrays are let go here
        self.left = self.undeclared_arrays()  # before a walk releases the nodes
        return super().__exit__(*exc)

    def assert_each_unpacked_at_most_once(self):
        """Once for a node the walk ran; never for one it did not reach (a branch cut by detach)."""
        assert len(set(self.unpacked)) == len(self.unpacked)
        assert set(self.unpacked) <= set(range(len(self.tickets)))

    def undeclared_arrays(self) -> list:
        """'Class.name' for each array a recorded node holds: once the block has ended, every array a
        node declares in saved_arrays was packed and let go, so what is left was not declared."""
        return sorted({f"{type(node).__name__}.{name}" for node in self.nodes for name, value in vars(node).items()
                       if isinstance(value, np.ndarray)})


def _first_and_second_order(fn, inputs, record_hooks=None, backward_hooks=None):
    """Gradients of fn's outputs (against fixed random cotangents), then of Σ g·w (fixed random w)
    for those that depend on the inputs. ``record_hooks`` surround the forward pass,
    ``backward_hooks`` the first backward (which records the gradient ops, create_graph=True)."""
    from minidl.tensor import Tensor
    wrt = [x for x in inputs if isinstance(x, Tensor) and x.requires_grad]
    mdl.manual_seed(3)  # the same random draws in every run
    with record_hooks or contextlib.nullcontext():
        outputs = fn(*inputs)
    outputs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    rng = np.random.default_rng(1)
    vs = [Tensor(rng.standard_normal(o.shape)) for o in outputs]
    with backward_hooks or contextlib.nullcontext():
        firsts = mdl.grad(outputs, wrt, grad_outputs=vs, create_graph=record_hooks is None, allow_unused=True)
    terms = [(g * Tensor(rng.standard_normal(g.shape))).sum() for g in firsts if g is not None and g.requires_grad]
    seconds = mdl.grad(terms, wrt, allow_unused=True) if terms else []
    return [None if g is None else g.numpy() for g in list(firsts) + list(seconds)]


_CASES = __import__("minidl.op_cases", fromlist=["cases"]).cases()


@pytest.mark.parametrize("name,fn,inputs", _CASES, ids=[case[0] for case in _CASES])
def test_census_every_array_a_node_keeps_is_declared_and_round_trips(name, fn, inputs):
    """Each op of minidl.op_cases recorded under counting identity hooks, then each gradient op its
    backward records (create_graph=True) under them too: no node keeps an array under a name it
    did not declare in ``saved_arrays`` (the hooks never see such an array), no packed value is
    unpacked twice, and the gradients, first and second order, are the plain run's to the last
    bit: every declared array went through the hooks and came back for its backward."""
    plain = _first_and_second_order(fn, inputs)

    forward = _Census()
    hooked = _first_and_second_order(fn, inputs, record_hooks=forward)
    assert forward.nodes  # the case recorded its ops
    assert forward.left == []
    forward.assert_each_unpacked_at_most_once()
    assert bool(forward.unpacked) == bool(forward.tickets)

    backward = _Census()
    second = _first_and_second_order(fn, inputs, backward_hooks=backward)
    assert backward.left == []
    backward.assert_each_unpacked_at_most_once()

    assert len(second) == len(plain)  # a packed forward refuses create_graph: `hooked` is first order only
    for reference in (hooked, second):
        for p, h in zip(plain, reference):
            assert (p is None) == (h is None)
            if p is not None:
                np.testing.assert_array_equal(h, p)
