"""Lowering a recorded step to NumPy with ``out=``: the ops it knows, buffer reuse, and GPU chains.

The middle step of the seed text's account of ``torch.compile`` ("DL Training: An
in-depth discussion", "Static Graphs with Torch.Compile": "a 3-step process including
graph acquisition, graph lowering, and graph compilation"), shown on NumPy.
:mod:`minidl.tracing` records a step as a list of op calls on numbered values
``v<i>``. This module turns the calls of a few known kinds (elementwise
arithmetic, ReLU, products, ``Linear`` and its two gradient ops, sums and
means) into the NumPy calls their ``forward`` makes, written inline with
``out=`` into buffers that the plan allocates once, when it is built::

    v4 = np.matmul(v0, v2.T, out=b0)  # Linear: y = x Wᵀ + b
    v4 = np.add(v4, v3, out=v4)
    v9 = np.multiply(v8, np.greater(v4, 0, out=s0), out=b1)  # ReLUGrad: …

Every other op keeps calling its own ``forward`` (it allocates its result).

**Bit for bit.** A lowered line is the same NumPy call as the op's ``forward``,
on the same operands, in the same order, with only ``out=`` added: a ufunc, a
``matmul`` or a reduction writes the same values into a given array as into one
it allocates (the loops and the BLAS call do not depend on where the result
goes). A buffer is C-contiguous, so an op is lowered only where its recorded
result was C-contiguous too (what comes next then reads the same layout).
Only float32 and float64 are lowered: 16-bit floats and integers go through
:mod:`minidl.backend`'s own paths, which the op's ``forward`` keeps.

**Liveness and buffer reuse.** Each lowered result gets a buffer of its shape
and dtype, taken from a pool of free ones. A buffer is free again once the last
line that reads it has run — reads through a view included: an op that is not
lowered (a reshape, a transpose) may return a view of its input, so its result
is counted as the same memory as each of its inputs ("roots"). An op that is
not lowered may also keep its inputs for a later op that holds it (max-pooling's
scatter holds the pooling op): its inputs are live until that later op has run.
A buffer is never given to a value that leaves the step or outlives the call:
a result the step returns, a gradient the walk puts into ``.grad`` (the
optimizer reads it, and it stays there after the call), an array an op keeps
for its gradient op (``saved_arrays``) — nor to any value that may share memory
with one of those. Such a lowered op writes a new array (the same call without
``out=``). Parameters and constants are never written: only buffers are.

**GPU chains.** On CuPy, a maximal run of consecutive lowered elementwise ops
of one shape and dtype, each result read only by the next op of the run, is
one ``cupy.ElementwiseKernel`` (:func:`find_chains`, :func:`chain_kernel`): the
intermediates live in registers, one pass over memory instead of one per op.
The kernel's C is the ops' own arithmetic in the arrays' dtype, compiled with
``--fmad=false`` so that ``a * b + c`` is not contracted into a fused
multiply-add: the rounding of each op is CuPy's own (see docs/performance.md).
"""
from __future__ import annotations

import copy
from typing import NamedTuple

import numpy as np

from minidl import backend

__all__ = ["Lowering", "lower_op", "plan_memory", "Memory", "Chain", "find_chains", "chain_kernel", "FUSED_OPTIONS"]

FLOATS = (np.dtype(np.float32), np.dtype(np.float64))

# The ops a GPU chain can hold: their C expression over the operands' names (T: the chain's dtype).
# ReLU is left out: CUDA's max() drops a NaN where cupy.maximum keeps it.
ELEMENTWISE_C = {
    "Add": "{0} + {1}", "Sub": "{0} - {1}", "Mul": "{0} * {1}", "Div": "{0} / {1}", "Neg": "-{0}",
    "Exp": "exp({0})", "Tanh": "tanh({0})", "ReLUGrad": "{0} * (T)({1} > (T)0)",
}
FUSED_OPTIONS = ("--fmad=false",)  # no a*b+c contracted into one rounding: each op rounds as CuPy's own kernel


class Lowering(NamedTuple):
    """How one recorded op is written as NumPy calls.

    ``emit(xs, y, out, scratch)`` gives the lines that compute value ``y`` from the names
    ``xs`` of its inputs, into the buffer named ``out`` (None: a new array, the same calls
    without ``out=``), using the scratch buffers named ``scratch``. ``shape``/``dtype``:
    the buffer the result needs; ``scratch_specs``: (shape, dtype) of each scratch buffer.
    """

    emit: object
    shape: tuple
    dtype: object
    scratch_specs: tuple = ()
    elementwise: str | None = None  # the C expression, where the op may join a GPU chain


def _out(out) -> str:
    return f", out={out}" if out else ""


def _ufunc(name: str, y_array, n_inputs: int, c_expr: str | None = None) -> Lowering:
    """``y = xp.<name>(a[, b], out=...)``: one ufunc call, as ``a + b`` / ``-a`` / ``xp.exp(a)`` are."""
    def emit(xs, y, out, scratch, xp):
        return [f"{y} = {xp}.{name}({', '.join(xs[:n_inputs])}{_out(out)})"]
    return Lowering(emit, y_array.shape, y_array.dtype, (), c_expr)


def _lower_relu(op, xs, y):
    def emit(names, v, out, scratch, xp):
        return [f"{v} = {xp}.maximum({names[0]}, 0{_out(out)})"]  # ReLU.forward: xp.maximum(x, 0)
    return Lowering(emit, y.shape, y.dtype)


def _lower_relu_grad(op, xs, y):
    gy, x = xs

    def emit(names, v, out, scratch, xp):  # ReLUGrad.forward: gy * (x > 0), the mask a bool buffer
        mask = f"{xp}.greater({names[1]}, 0{_out(scratch[0] if out else None)})"
        return [f"{v} = {xp}.multiply({names[0]}, {mask}{_out(out)})"]
    return Lowering(emit, y.shape, y.dtype, ((x.shape, np.dtype(np.bool_)),), ELEMENTWISE_C["ReLUGrad"])


def _lower_matmul(op, xs, y):
    a, b = xs
    if a.ndim == 0 or b.ndim == 0:
        return None
    return _ufunc("matmul", y, 2)  # backend.matmul: a @ b outside 16-bit floats


def _rows(name: str, a) -> tuple:
    """``_as_rows`` of minidl.ops.linalg as text: (expression, 2-D shape)."""
    if a.ndim > 2 and a.shape[-1]:
        rows = int(np.prod(a.shape[:-1]))
        return f"{name}.reshape(-1, {a.shape[-1]})", (rows, a.shape[-1])
    return name, a.shape


def _lower_linear(op, xs, y):
    x, w = xs[0], xs[1]
    if x.ndim < 2 or w.ndim != 2:
        return None
    has_bias = len(xs) == 3
    numpy_side = backend.xp_of(x) is np
    _, rows_shape = _rows("x", x)
    few_rows = len(rows_shape) == 2 and 1 < rows_shape[0] < 64 and numpy_side
    flat = (rows_shape[0], w.shape[0])
    reshaped = x.ndim > 2 and x.shape[-1]
    scratch = (((w.shape[0], rows_shape[0]), y.dtype),) if few_rows else ()

    def emit(names, v, out, scratch_names, xp):
        rows, _ = _rows(names[0], x)
        target = v if not reshaped else v + "_rows"
        if few_rows:  # Linear.forward: ascontiguousarray((W xᵀ)ᵀ), the wide product OpenBLAS runs faster
            if out:
                lines = [f"{xp}.matmul({names[1]}, {rows}.T, out={scratch_names[0]})",
                         f"{target} = {out}", f"{xp}.copyto({target}, {scratch_names[0]}.T)  # (W xᵀ)ᵀ, C order"]
            else:
                lines = [f"{target} = {xp}.ascontiguousarray({xp}.matmul({names[1]}, {rows}.T).T)"]
        else:
            lines = [f"{target} = {xp}.matmul({rows}, {names[1]}.T{_out(out)})"]
        if reshaped:
            lines.append(f"{v} = {target}.reshape({tuple(y.shape)})")
        if has_bias:
            lines.append(f"{xp}.add({v}, {names[2]}, out={v})  # y += b")
        return lines
    return Lowering(emit, flat, y.dtype, scratch)


def _lower_linear_grad_data(op, xs, y):
    gy, w = xs
    if gy.ndim < 2 or w.ndim != 2:
        return None
    _, rows_shape = _rows("gy", gy)
    reshaped = gy.ndim > 2 and gy.shape[-1]

    def emit(names, v, out, scratch, xp):
        rows, _ = _rows(names[0], gy)
        if not reshaped:
            return [f"{v} = {xp}.matmul({rows}, {names[1]}{_out(out)})"]
        return [f"{v}_rows = {xp}.matmul({rows}, {names[1]}{_out(out)})", f"{v} = {v}_rows.reshape({tuple(y.shape)})"]
    return Lowering(emit, (rows_shape[0], w.shape[1]), y.dtype)


def _lower_linear_grad_weight(op, xs, y):
    gy, x = xs
    if gy.ndim < 1 or x.ndim < 1:
        return None
    outer = int(np.prod(gy.shape[:-1])) == 1  # one sample: LinearGradWeight multiplies, BLAS is slow at k = 1

    def emit(names, v, out, scratch, xp):
        g2 = f"{names[0]}.reshape(-1, {gy.shape[-1]})"
        x2 = f"{names[1]}.reshape(-1, {x.shape[-1]})"
        call = "multiply" if outer else "matmul"
        return [f"{v} = {xp}.{call}({g2}.T, {x2}{_out(out)})"]
    return Lowering(emit, y.shape, y.dtype)


def _lower_reduction(call: str):
    def lower(op, xs, y):
        probe = copy.copy(op)
        probe.prepare(xs[0])  # the op's own axes, from the recorded input

        def emit(names, v, out, scratch, xp):
            return [f"{v} = {xp}.{call}({names[0]}, axis={probe.axes}, keepdims={op.keepdims}{_out(out)})"]
        return Lowering(emit, y.shape, y.dtype)
    return lower


def _lower_sum_to(op, xs, y):
    x = xs[0]
    lead = x.ndim - len(op.shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(op.shape) if n == 1 and x.shape[lead + i] != 1)
    kept = tuple(1 if i in axes else n for i, n in enumerate(x.shape))

    def emit(names, v, out, scratch, xp):  # SumTo.forward: sum with keepdims, then drop the leading axes
        if not lead:
            return [f"{v} = {xp}.sum({names[0]}, axis={axes}, keepdims=True{_out(out)})"]
        return [f"{v}_kept = {xp}.sum({names[0]}, axis={axes}, keepdims=True{_out(out)})",
                f"{v} = {v}_kept.reshape({tuple(op.shape)})"]
    return Lowering(emit, kept, y.dtype)


_RULES = {
    "Add": lambda op, xs, y: _ufunc("add", y, 2, ELEMENTWISE_C["Add"]),
    "Sub": lambda op, xs, y: _ufunc("subtract", y, 2, ELEMENTWISE_C["Sub"]),
    "Mul": lambda op, xs, y: _ufunc("multiply", y, 2, ELEMENTWISE_C["Mul"]),
    "Div": lambda op, xs, y: _ufunc("divide", y, 2, ELEMENTWISE_C["Div"]),
    "Neg": lambda op, xs, y: _ufunc("negative", y, 1, ELEMENTWISE_C["Neg"]),
    "Exp": lambda op, xs, y: _ufunc("exp", y, 1, ELEMENTWISE_C["Exp"]),
    "Tanh": lambda op, xs, y: _ufunc("tanh", y, 1, ELEMENTWISE_C["Tanh"]),
    "ReLU": _lower_relu,
    "ReLUGrad": _lower_relu_grad,
    "MatMul": _lower_matmul,
    "Linear": _lower_linear,
    "LinearGradData": _lower_linear_grad_data,
    "LinearGradWeight": _lower_linear_grad_weight,
    "Sum": _lower_reduction("sum"),
    "Mean": _lower_reduction("mean"),
    "SumTo": _lower_sum_to,
}


def _plain_array(a) -> bool:
    return isinstance(a, np.ndarray) or backend.is_device_array(a)


def lower_op(op, inputs, output) -> Lowering | None:
    """The NumPy lowering of ``op`` called on the recorded arrays ``inputs`` giving ``output``, or None
    (the op keeps calling its ``forward``): an op of a kind not in the table (minidl's own classes
    only: a subclass may compute something else), another dtype than float32/float64, or a result
    that is not a C-contiguous array."""
    rule = _RULES.get(type(op).__name__)
    if rule is None or not type(op).__module__.startswith("minidl.ops."):
        return None
    arrays = list(inputs) + [output]
    if not all(_plain_array(a) for a in inputs) or not (_plain_array(output) or isinstance(output, np.generic)):
        return None  # (a NumPy scalar result, a full sum's, is lowered as the same call without out=)
    if any(a.dtype not in FLOATS for a in arrays):
        return None
    if not output.flags.c_contiguous or len({backend.is_device_array(a) for a in arrays}) != 1:
        return None
    return rule(op, list(inputs), output)


class Chain(NamedTuple):
    """Consecutive lowered elementwise ops fused into one GPU kernel: their positions in the plan, the
    external inputs (value numbers, in order of first use) and the one value it writes."""

    members: tuple
    inputs: tuple
    outputs: tuple  # the value each member computes; only the last one is written to memory

    @property
    def output(self) -> int:
        return self.outputs[-1]


def find_chains(ops: list, readers: dict, pinned_values: set) -> list:
    """Maximal runs of consecutive lowered elementwise ops, each result but the last read only by the
    next op of the run (and by nothing else: no other op, no gradient, not returned).

    ``ops``: per line of the plan, None (not an elementwise lowered op: it ends a run) or a tuple
    (position, input value numbers, output value number, shape, dtype). ``readers``: value number ->
    positions of the lines that read it; ``pinned_values``: values that leave the step.
    Runs of one op are not chains. Returns a list of :class:`Chain`.
    """
    chains, run = [], []

    def close():
        if len(run) >= 2:
            produced = {m[2] for m in run}
            inputs = []
            for m in run:
                for s in m[1]:
                    if s not in produced and s not in inputs:
                        inputs.append(s)
            chains.append(Chain(tuple(m[0] for m in run), tuple(inputs), tuple(m[2] for m in run)))
        run.clear()

    for entry in ops:
        if entry is None:
            close()
            continue
        if run:
            last = run[-1]
            joins = (entry[3] == last[3] and entry[4] == last[4] and last[2] in entry[1]
                     and set(readers.get(last[2], ())) == {entry[0]} and last[2] not in pinned_values)
            if not joins:
                close()
        run.append(entry)
    close()
    return chains


def chain_kernel(chain: Chain, kinds: dict, op_inputs: dict, name: str) -> tuple:
    """``(in_params, out_params, operation, name)`` of the ``cupy.ElementwiseKernel`` for ``chain``.

    ``kinds``: position -> op class name; ``op_inputs``: position -> its input value numbers. Each
    member becomes one C statement ``T t<k> = <its expression>;`` over the chain's inputs ``x<j>``
    and the earlier members' ``t``; the last one is written to ``y``.
    """
    names = {s: f"x{j}" for j, s in enumerate(chain.inputs)}
    lines = []
    for k, position in enumerate(chain.members):
        expr = ELEMENTWISE_C[kinds[position]].format(*(names[s] for s in op_inputs[position]))
        if k == len(chain.members) - 1:
            lines.append(f"y = {expr};")
        else:
            lines.append(f"T t{k} = {expr};")
            names[chain.outputs[k]] = f"t{k}"
    in_params = ", ".join(f"T {names[s]}" for s in chain.inputs)
    return in_params, "T y", "\n".join(lines), name


class Memory(NamedTuple):
    """What :func:`plan_memory` decided for a recorded step (positions are indices into its lines)."""

    lowerings: dict  # position -> Lowering, for each op written as NumPy calls
    out_buffer: dict  # position -> buffer number its result is written into (absent: a new array)
    scratch: dict  # position -> the buffer numbers of its scratch arrays
    buffers: list  # buffer number -> (shape, dtype, a recorded array of its device)
    chains: list  # GPU chains (empty on the CPU)
    chain_of: dict  # position -> the number of the chain it belongs to
    new_arrays: int  # results a replay allocates: the ops' own forwards' (other than views) and unbuffered ones


def _may_share(a, b) -> bool:
    """Can ``a`` be a view of ``b``'s memory? Decided on the recorded arrays: a step with one guard
    makes the same views each call (NumPy's bounds check; CuPy arrays are taken as sharing)."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return bool(np.may_share_memory(a, b))
    return _plain_array(a) and _plain_array(b)


def _replica_ends(lines) -> dict:
    """id(an op's Function) -> the last position of a line whose op holds it (a gradient op reading
    its forward op's state, as MaxPoolScatter holds its pooling op)."""
    position = {id(line[1]): p for p, line in enumerate(lines) if line[0] == "op"}
    ends = {}
    for q, line in enumerate(lines):
        if line[0] != "op":
            continue
        for value in vars(line[1]).values():
            if id(value) in position and value is not line[1]:
                ends[id(value)] = max(ends.get(id(value), q), q)
    return ends


def plan_memory(lines, arrays, returned, fuse: bool, lower: bool = True) -> Memory:
    """Lower the ops of ``lines`` (a record's lines, see :mod:`minidl.tracing`) that :func:`lower_op` knows,
    and give each lowered result a buffer from a pool, reused once its last reader has run.

    ``arrays``: value number -> the recorded array; ``returned``: the value numbers the step returns;
    ``fuse``: find GPU chains; ``lower``: False leaves every op to its ``forward``. See the module
    docstring for what is never put into a buffer.
    """
    ends = _replica_ends(lines)
    lowerings, reads, roots, pinned = {}, {}, {}, set(returned)
    new_arrays = 0
    for p, line in enumerate(lines):
        if line[0] == "grad":
            reads.setdefault(line[2], []).append(p)
            pinned.add(line[2])  # .grad: read by the optimizer, kept after the call
            continue
        if line[0] != "op":
            continue
        _, op, ins, bound, outs, saved, several = line
        for s in list(ins) + list(bound.values()):
            reads.setdefault(s, []).append(max(p, ends.get(id(op), p)))
        pinned.update(bound.values())  # arrays handed to a later op through set_saved_arrays
        pinned.update(saved.values())
        rule = None
        if lower and not several and not bound and not saved and id(op) not in ends:
            rule = lower_op(op, [arrays[s] for s in ins], arrays[outs[0]])
        if rule is not None:
            lowerings[p] = rule
            roots[outs[0]] = {outs[0]}
            if not isinstance(arrays[outs[0]], np.ndarray) and not backend.is_device_array(arrays[outs[0]]):
                pinned.add(outs[0])
        else:  # its results (and the arrays it keeps) may be views of its inputs
            read = list(ins) + list(bound.values())
            for s in list(outs) + list(saved.values()):
                roots[s] = set().union(*(roots.get(r, set()) for r in read if _may_share(arrays[s], arrays[r])))
            new_arrays += sum(not any(_may_share(arrays[s], arrays[r]) for r in read) for s in outs)
    pinned_roots = set().union(*(roots.get(s, set()) for s in pinned))

    chains, chain_of = [], {}
    if fuse:
        entries = []
        for p, line in enumerate(lines):
            rule = lowerings.get(p)
            ok = rule is not None and rule.elementwise is not None
            if ok:
                out = arrays[line[4][0]]
                ok = all(backend.is_device_array(arrays[s]) and arrays[s].dtype == out.dtype for s in line[2])
            entries.append((p, line[2], line[4][0], out.shape, out.dtype) if ok else None)
        chains = find_chains(entries, reads, pinned)
        for c, chain in enumerate(chains):
            for p in chain.members:
                chain_of[p] = c
            for s in chain.inputs:  # the kernel reads its inputs where the chain ends
                reads[s].append(chain.members[-1])

    last = {}
    for s, shared in roots.items():
        end = max(reads.get(s, ()), default=-1)
        for r in shared:
            last[r] = max(last.get(r, -1), end)
    release_at = {}  # position -> the roots whose last reader is that line
    for r, end in last.items():
        release_at.setdefault(end, []).append(r)
    free, buffers, out_buffer, scratch, holder = {}, [], {}, {}, {}

    def take(shape, dtype, like):
        key = (tuple(shape), np.dtype(dtype), type(like))
        if free.get(key):
            return free[key].pop()
        buffers.append((tuple(shape), np.dtype(dtype), like))
        return len(buffers) - 1

    def give(b):
        shape, dtype, like = buffers[b]
        free.setdefault((shape, dtype, type(like)), []).append(b)

    for p, line in enumerate(lines):
        rule = lowerings.get(p)
        if rule is not None:
            s = line[4][0]
            chain = chains[chain_of[p]] if p in chain_of else None
            fused_away = chain is not None and p != chain.members[-1]
            if s not in pinned_roots and not fused_away:
                out_buffer[p] = holder[s] = take(rule.shape, rule.dtype, arrays[s])
                if chain is None:
                    scratch[p] = [take(shape, dtype, arrays[s]) for shape, dtype in rule.scratch_specs]
                    for b in scratch[p]:
                        give(b)  # free again once this op has run
            if last.get(s, -1) <= p:  # nothing reads it after this line: free at once
                release_at.setdefault(p, []).append(s)
        for r in release_at.pop(p, ()):
            if r in holder:
                give(holder.pop(r))
    new_arrays += sum(p not in out_buffer and p not in chain_of for p in lowerings)
    new_arrays += sum(p in chain_of and p == chains[chain_of[p]].members[-1] and p not in out_buffer for p in lowerings)
    return Memory(lowerings, out_buffer, scratch, buffers, chains, chain_of, new_arrays)
