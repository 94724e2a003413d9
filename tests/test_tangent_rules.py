"""The tangent rules (``jvp``) of the ops outside the elementwise, math, reduction, linear-algebra
and scan families, each checked on its own node, without a forward-mode engine.

For every op case of minidl.op_cases, each recorded node whose Function lives in one of
the modules below gets random tangents ẋ for its inputs that require a gradient, and its
``jvp`` gives ẏ. Two references check ẏ:

- central differences of the node's forward along ẋ: (f(x + hẋ) − f(x − hẋ)) / 2h with
  h = 1e-6 in float64, whose error is about h²·f‴ (1e-12) plus ε/h (1e-10) times the
  values' scale; the tolerance is 1e-6 of that scale;
- the backward, by the adjoint identity ⟨u, J ẋ⟩ = ⟨Jᵀ u, ẋ⟩ for a random cotangent u:
  both sides are sums of the same products, so they agree to rounding, a few ulps of
  the sum of the products' magnitudes Σ|u · J ẋ| + Σ|Jᵀ u · ẋ|. The tolerance is 64 ulps
  of it (the largest difference measured over these cases is 0.4 ulp): a rule, or a
  backward, off by a factor 1 + 1e-9 (4.5 million ulps) fails here, and the differences
  cannot see it.

Linearity in the tangents checks that a None (zero) tangent is handled: the jvp with
all the tangents equals the sum of the jvps with one tangent each.
"""
import copy

import numpy as np
import pytest

import minidl as mdl
from minidl import backend
from minidl.autograd import Function, FunctionHook
from minidl.op_cases import cases
from minidl.ops.quantize import FakeQuantize
from minidl.tensor import Tensor

MODULES = ("minidl.ops.shape", "minidl.ops.rearrange", "minidl.ops.indexing", "minidl.ops.scatter_reduce",
           "minidl.ops.conv", "minidl.ops.fft_conv", "minidl.ops.sparse", "minidl.ops.pool", "minidl.ops.norm",
           "minidl.ops.loss", "minidl.ops.attention",
           "minidl.ops.distance", "minidl.ops.quantize", "minidl.ops.regularization", "minidl.ops.distributed",
           "minidl.nn.recurrent", "minidl.checkpoint.segments", "minidl.parallel.data_parallel",
           "minidl.parallel.buckets", "minidl.parallel.sharded")
STEP = 1e-6
FD_TOLERANCE = 1e-6  # of max(1, the largest difference quotient): see the module docstring
ADJOINT_ULPS = 64
EPS = np.finfo(np.float64).eps


class _Recorder(FunctionHook):
    """Each recorded op call of one case: the node, the random state before its forward, its outputs."""

    def __init__(self):
        self.calls = []

    def forward_preprocess(self, function, inputs):
        self.calls.append([function, backend.get_rng_state(), None])

    def forward_postprocess(self, function, inputs, outputs):
        for call in reversed(self.calls):
            if call[0] is function:
                call[2] = outputs  # kept alive, so that function.output(i) answers
                break


def _run(fn, inputs):
    """The case's outputs and its recorded nodes of the modules above, as [node, rng state, outputs, alone]:
    ``alone`` when the node is the whole case (then the state is the case's, else the node's own)."""
    recorder, start = _Recorder(), backend.get_rng_state()
    with recorder:
        outputs = fn(*inputs)
    recorded = [call for call in recorder.calls if call[0].inputs and call[2] is not None]
    if len(recorded) == 1 and all(a is b for a, b in zip(_tuple(recorded[0][2]), _tuple(outputs))):
        recorded[0] += [True]  # the case is this one node: differences rerun it whole, from the case's start
        recorded[0][1] = start
    else:
        recorded = [call + [False] for call in recorded]
    mine = [call for call in recorded if type(call[0]).__module__ in MODULES]
    return outputs, mine


def _tuple(values):
    return values if isinstance(values, tuple) else (values,)


def _forward_along(node, state, alone, fn, inputs, tangents, t):
    """The node's outputs (arrays) at x + t·ẋ.

    A gradient op reads what its parent's forward saved (the softmax, x̂): its case recomputes
    that from the inputs on every call, so such a case is perturbed as a whole; any other node
    runs its own forward on a copy, under the random state its recorded call drew from.
    Fake quantization's straight-through rule is checked against the clip it stands for
    (the op cases keep x a grid step away from the clip's bounds).
    """
    if alone and len(node.inputs) == len(inputs) and all(a is b for a, b in zip(node.inputs, inputs)):
        moved = [x if d is None else Tensor(x.array + t * d.array) for x, d in zip(inputs, tangents)]
        backend.set_rng_state(state)
        with mdl.no_grad():
            return tuple(y.array for y in _tuple(fn(*moved)))
    arrays = [x.array if d is None else x.array + t * d.array for x, d in zip(node.inputs, tangents)]
    if isinstance(node, FakeQuantize):  # the straight-through rule is the derivative of the clip it stands for
        return (np.clip(arrays[0], node.scale * (node.q_min - node.zero_point),
                        node.scale * (node.q_max - node.zero_point)),)
    backend.set_rng_state(state)
    return _tuple(copy.copy(node).forward(*arrays))


def _tangents(node, rng):
    """A random tangent for each input that requires a gradient, 0 where the input is infinite
    (a −inf border is a constant: its tangent is 0, and differences cannot see past it)."""
    return [Tensor(np.where(np.isfinite(x.array), rng.standard_normal(x.shape), 0.0)) if x.requires_grad else None
            for x in node.inputs]


def _jvp(node, tangents):
    dys = _tuple(node.jvp(*tangents))
    outputs = [ref() for ref in node.outputs]
    assert len(dys) == len(outputs), f"{type(node).__name__}.jvp gave {len(dys)} tangents for {len(outputs)} outputs"
    return [np.zeros(y.shape) if dy is None else dy.numpy() for dy, y in zip(dys, outputs)]


def _check_node(name, node, state, alone, fn, inputs, seed):
    rng = np.random.default_rng(seed)
    kind = type(node).__name__
    tangents = _tangents(node, rng)
    assert any(d is not None for d in tangents)
    dys = _jvp(node, tangents)
    for dy, y in zip(dys, node.outputs):
        assert dy.shape == y().shape, f"{name}: {kind}.jvp gave shape {dy.shape} for an output of {y().shape}"

    # 1. central differences along the tangents
    plus = _forward_along(node, state, alone, fn, inputs, tangents, STEP)
    minus = _forward_along(node, state, alone, fn, inputs, tangents, -STEP)
    for k, (dy, a, b) in enumerate(zip(dys, plus, minus)):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        with np.errstate(invalid="ignore"):  # an infinite constant (a −inf border) does not move: 0
            fd = np.where(a == b, 0.0, (a - b) / (2 * STEP))
        scale = max(1.0, float(np.abs(fd).max(initial=0)))
        error = float(np.abs(dy - fd).max(initial=0))
        assert error <= FD_TOLERANCE * scale, f"{name}: {kind}.jvp output {k} differs from central " \
                                              f"differences by {error:.3g} (scale {scale:.3g})"

    # 2. the adjoint identity with the backward
    us = [rng.standard_normal(dy.shape) for dy in dys]
    with mdl.no_grad():
        grads = _tuple(node.backward(*[Tensor(u) for u in us]))
    forward_products = [u * dy for u, dy in zip(us, dys)]
    backward_products = [g.numpy() * d.numpy() for g, d in zip(grads, tangents) if g is not None and d is not None]
    left = sum(float(p.sum()) for p in forward_products)
    right = sum(float(p.sum()) for p in backward_products)
    magnitude = sum(float(np.abs(p).sum()) for p in forward_products + backward_products)
    assert abs(left - right) <= ADJOINT_ULPS * EPS * magnitude, \
        f"{name}: {kind}: <u, J v> = {left!r} but <J^T u, v> = {right!r} (magnitude {magnitude:.3g})"

    # 3. linear in the tangents: a None tangent is a zero tangent
    live = [i for i, d in enumerate(tangents) if d is not None]
    if len(live) > 1:
        parts = [_jvp(node, [d if i == j else None for j, d in enumerate(tangents)]) for i in live]
        for k, dy in enumerate(dys):
            np.testing.assert_allclose(sum(p[k] for p in parts), dy, rtol=1e-12, atol=1e-12 * max(1, np.abs(dy).max()))


def _cases_with_nodes():
    """The op cases that record at least one node of the modules above, and those nodes' classes."""
    found, classes = [], set()
    for case in cases():
        outputs, mine = _run(case[1], case[2])
        if mine:
            found.append(case)
            classes |= {type(call[0]) for call in mine}
    return found, classes


CASES, CLASSES_RUN = _cases_with_nodes()


@pytest.mark.parametrize("name,fn,inputs", CASES, ids=[c[0] for c in CASES])
def test_tangent_rule_against_differences_and_backward(name, fn, inputs):
    outputs, mine = _run(fn, inputs)
    for i, (node, state, _, alone) in enumerate(mine):
        _check_node(name, node, state, alone, fn, inputs, seed=i)


def _function_classes(base):
    for cls in base.__subclasses__():
        yield cls
        yield from _function_classes(cls)


def test_every_function_of_these_modules_has_a_tangent_rule():
    """Each Function class defined in the modules above defines jvp itself (not inherited)."""
    import importlib
    for module in MODULES:
        importlib.import_module(module)
    classes = {cls for cls in _function_classes(Function) if cls.__module__ in MODULES}
    assert len(classes) >= 40
    missing = sorted(cls.__qualname__ for cls in classes if "jvp" not in vars(cls))
    assert not missing, f"Functions without a tangent rule: {missing}"


def test_every_op_function_of_these_modules_is_checked_by_a_case():
    """Each such Function of minidl.ops is a recorded node of some op case, so the test above checks its jvp.
    An op with no backward (ClassTargets: class indices in, no gradient out) is never recorded, as
    in tests/test_op_cases.py's census; the test just below checks that it is only that one."""
    ops = {cls for cls in _function_classes(Function) if cls.__module__ in MODULES
           and cls.__module__.startswith("minidl.ops.") and "backward" in vars(cls)}
    not_run = sorted(cls.__qualname__ for cls in ops - CLASSES_RUN)
    assert not not_run, f"ops whose tangent rule no op case checks: {not_run}"


def test_the_ops_without_a_backward_are_the_non_differentiable_ones():
    """Left out of the census above: exactly the ops whose inputs never carry a gradient."""
    ops = {cls.__qualname__ for cls in _function_classes(Function) if cls.__module__ in MODULES
           and cls.__module__.startswith("minidl.ops.") and "backward" not in vars(cls)}
    assert ops == {"ClassTargets"}


# ---------------------------------------------------------------- the Functions outside minidl.ops
def _check_case(name, fn, inputs):
    outputs, mine = _run(fn, inputs)
    assert mine, f"{name}: no node of the modules above was recorded"
    for i, (node, state, _, alone) in enumerate(mine):
        _check_node(name, node, state, alone, fn, inputs, seed=i)
    return {type(call[0]) for call in mine}


def _leaf(rng, *shape):
    return Tensor(rng.standard_normal(shape), requires_grad=True)


def test_recurrent_layers_unbind_and_chunk():
    """An LSTM in float64 records _Unbind (the time steps) and _Chunk (the gates)."""
    from minidl import nn
    from minidl.nn.recurrent import _Chunk, _Unbind
    rng = np.random.default_rng(0)
    lstm = nn.LSTM(3, 2, dtype=np.float64)
    seen = _check_case("unbind", lambda x: _Unbind()(x), [_leaf(rng, 4, 2, 3)])
    seen |= _check_case("chunk", lambda x: _Chunk(4)(x), [_leaf(rng, 2, 8)])
    assert seen == {_Unbind, _Chunk}
    recorder = _Recorder()
    with recorder:
        lstm(_leaf(rng, 4, 2, 3))
    assert {_Unbind, _Chunk} <= {type(call[0]) for call in recorder.calls}  # the ones the layer uses


def test_checkpoint_tangent_is_the_segments_jacobian_times_the_tangent():
    """Through a checkpointed segment with two outputs, a parameter it captures and dropout inside
    (the same mask in forward, recomputation and the differences)."""
    import minidl.functional as F
    from minidl.checkpoint import CheckpointFunction, checkpoint
    rng = np.random.default_rng(1)

    def fn(x, w):
        def segment(a):
            return F.tanh(a @ w), F.dropout(a, 0.3) * a.sum()
        return checkpoint(segment, x)

    assert _check_case("checkpoint", fn, [_leaf(rng, 3, 4), _leaf(rng, 4, 2)]) == {CheckpointFunction}


def test_checkpoint_tangent_of_an_input_the_outputs_do_not_use_is_zero():
    from minidl.checkpoint import checkpoint
    rng = np.random.default_rng(2)
    x, unused = _leaf(rng, 3), _leaf(rng, 2)
    y = checkpoint(lambda a, b: a * 2.0, x, unused)
    assert np.array_equal(y.creator.jvp(None, Tensor(np.ones(2))).numpy(), np.zeros(3))


class _Step:
    """What BackwardStarts tells when the backward reaches it (the overlap's start)."""
    opened = 0

    def open(self):
        self.opened += 1


class _Unit:
    """A stage-3 unit that has no gradient to hand to its shard."""

    def __init__(self, size):
        self.size = size

    def reduce_gradients(self, weight):
        return np.zeros(self.size)

    def release(self):
        pass


class _Owner:
    gradient_weight = 1.0


def test_data_parallel_boundaries_pass_the_tangent_through():
    from minidl.parallel.buckets import BackwardStarts
    from minidl.parallel.sharded import _UnitBoundary
    rng = np.random.default_rng(3)
    step = _Step()
    seen = _check_case("backward_starts", lambda x: BackwardStarts(step)(x) * 1.0, [_leaf(rng, 3, 2)])
    seen |= _check_case("unit_boundary", lambda x, shard: _UnitBoundary(_Unit(5), _Owner())(x, shard),
                        [_leaf(rng, 3, 2), _leaf(rng, 5)])
    assert seen == {BackwardStarts, _UnitBoundary} and step.opened == 1  # the adjoint check ran its backward


# ---------------------------------------------------------------- the rules differentiate again
# The ops whose tangent depends on the input's value (the others' tangent is the op itself applied
# to ẋ, whose own gradient is checked as an op): their rules must be differentiable Tensor code,
# with respect to x and to ẋ, so that forward over reverse gives Hessians.
NONLINEAR = ("Conv2dStride1", "ScatterReduce", "Normalize", "NormalizeGrad", "CrossEntropy", "CrossEntropyGrad",
             "BinaryCrossEntropy", "ScaledDotProductAttention", "AttentionGrad", "LayerNormAffine",
             "LayerNormWeightGrad")


def _first_case_of_each(names):
    found = {}
    for name, fn, inputs in CASES:
        for k, call in enumerate(_run(fn, inputs)[1]):
            kind = type(call[0]).__name__
            if kind in names and kind not in found and (kind != "ScatterReduce" or "prod" in name):
                found[kind] = (name, fn, inputs, k)
    return [found[kind] + (kind,) for kind in names]


@pytest.mark.parametrize("name,fn,inputs,k,kind", _first_case_of_each(NONLINEAR), ids=NONLINEAR)
def test_tangent_rule_is_differentiable(name, fn, inputs, k, kind):
    """gradcheck of (case inputs, tangents) ↦ the node's jvp: second derivatives through the rule."""
    outputs, mine = _run(fn, inputs)
    node = mine[k][0]
    rng = np.random.default_rng(7)
    positions = [i for i, x in enumerate(node.inputs) if x.requires_grad]
    tangents = [Tensor(rng.standard_normal(node.inputs[i].shape), requires_grad=True) for i in positions]

    def rule(*args):
        again = _run(fn, args[:len(inputs)])[1][k][0]  # the same node, recorded anew from these inputs
        dxs = [None] * len(again.inputs)
        for i, dx in zip(positions, args[len(inputs):]):
            dxs[i] = dx
        return _tuple(again.jvp(*dxs))

    assert mdl.gradcheck(rule, list(inputs) + tangents)


def test_checkpoint_tangent_rule_is_differentiable():
    """Under grad mode the segment's rule records its graph (create_graph), so it differentiates again."""
    import minidl.functional as F
    from minidl.checkpoint import checkpoint
    rng = np.random.default_rng(4)

    def rule(x, w, dx, dw):
        y = checkpoint(lambda a: F.tanh(a @ w) * a.sum(), x)
        return y.creator.jvp(dx, dw)

    assert mdl.gradcheck(rule, [_leaf(rng, 3, 4), _leaf(rng, 4, 2), _leaf(rng, 3, 4), _leaf(rng, 4, 2)])


# ---------------------------------------------------------------- on the GPU
# (not dropout: the GPU's random stream is not the CPU's, so the masks differ)
ON_DEVICE = ("layer_norm", "batch_norm", "conv2d", "conv1d", "max_pool2d", "cross_entropy", "scatter_reduce_prod",
             "scaled_dot_product_attention_float_mask", "pad_reflect", "concatenate", "scatter", "normalize_grad",
             "col2im")


@pytest.mark.parametrize("name", ON_DEVICE)
def test_tangent_rules_give_the_same_numbers_on_the_gpu(name, standin_or_gpu):
    """The rules run on CuPy arrays (the stand-in's strict rules where there is no GPU) and agree with NumPy's."""
    fn, inputs = next((c[1], c[2]) for c in cases() if c[0] == name)
    on_device = [Tensor(x.array, requires_grad=x.requires_grad).to(standin_or_gpu) for x in inputs]
    for (node, *_), (cpu_node, *_) in zip(_run(fn, on_device)[1], _run(fn, inputs)[1], strict=True):
        rng = np.random.default_rng(0)
        tangents = _tangents(cpu_node, rng)
        dys = _tuple(node.jvp(*[None if d is None else d.to(standin_or_gpu) for d in tangents]))
        expected = _jvp(cpu_node, tangents)
        for dy, e in zip(dys, expected):
            assert str(dy.device).startswith("cuda"), f"{name}: {type(node).__name__}.jvp left the GPU"
            np.testing.assert_allclose(dy.numpy(), e, rtol=1e-12, atol=1e-12)
