"""The traced step: ``minidl.compile(step)`` records one training step's ops and replays them on arrays.

A define-by-run engine pays, on every op call, for what makes it flexible: a
Tensor per result, a node per op, the backward walk's sort and bookkeeping.
For a small model that overhead is most of the step. The remedy is the one
the seed text "DL Training: An in-depth discussion" gives for ``torch.compile``
(section "Using PyTorch Lightning for simplified training", "Static Graphs
with Torch.Compile"): "Under the hood, this is a 3-step process including graph
acquisition, graph lowering, and graph compilation" — capture the graph once,
lower it to plain array code, and run that code from then on. Here:

- **Graph acquisition.** The first call runs the step eagerly under a
  :class:`~minidl.autograd.FunctionHook` that writes down every op call (the
  forward's, and those the backward walk makes: backward formulas are Tensor
  ops, so they are seen too), each gradient the walk adds into a leaf's
  ``.grad`` (the hook's ``accumulate_preprocess``) and each optimizer step.
  Each op's Function is copied before its forward runs, with its constructor's
  parameters (an axis, a stride).
- **Lowering.** Every array of the step becomes a numbered value ``v<i>``:
  the step's Tensor arguments, the outputs of ops, the arrays an op's forward
  keeps for backward (its declared ``saved_arrays``), the leaves read live
  (parameters), and constants. An op whose constructor holds an array made
  by an earlier op (a gradient op given the forward's statistics) is given
  the new value through :meth:`Function.set_saved_arrays` before its forward.
  Ops of a known kind (elementwise arithmetic, ReLU, products, ``Linear``,
  sums) are then written as the NumPy calls their ``forward`` makes, with
  ``out=`` into buffers allocated once and reused once their last reader has
  run (:mod:`minidl.tracing_lower`: the liveness analysis, what is never put
  into a buffer, and the GPU's fused chains).
- **Compilation.** The list of lines is Python code over those values
  (``compiled.code``); later calls with the same guard (the arguments'
  shapes, dtypes, devices and memory order) run it: each line is one
  op's ``forward`` on raw arrays, or its NumPy calls inline, with no
  Tensor, no node and no walk in between.

Because the replay makes the very NumPy calls the eager step made (an op's
``forward``, or the same calls written out with ``out=``), on the same arrays
in the same order, its results equal the eager step's bit for bit.
Random ops (dropout) draw from the generator when their forward runs, so the
replay draws the same numbers as the eager step would with the same seed.

**Verification by a second recording.** An array that no op made and that is
not an argument — a tensor made inside the step or inside a backward with raw
array code — is a constant of the plan. To tell a true constant (a tensor of
ones, a causal mask) from a value computed from the batch outside any op
(which the replay would freeze), the second call with a given guard records
again and the two records are compared: the same ops with the same
parameters, and each constant equal in both (or the same tensor, read live).
A difference raises an error naming the op, and the plan is built only then:
calls one and two run eagerly.

What the replay does not do: run the step's Python code (prints, counters, a
learning-rate scheduler called inside it happen only on recording calls),
record a graph (its results need no gradient), or follow Python decisions
made on tensor values — ``.item()``, ``bool()``, ``.numpy()`` inside the
step are refused while recording, as are ops with a data-dependent shape
(``x[mask]``).
"""
from __future__ import annotations

import builtins
import copy
import functools

import numpy as np

from minidl import backend, hooks
from minidl.autograd.function import Function
from minidl.autograd.function_hooks import FunctionHook
from minidl.tensor import Tensor, _clock
from minidl.tracing_lower import FUSED_OPTIONS, chain_kernel, plan_memory

__all__ = ["compile", "CompiledStep", "Plan", "TraceError"]


class TraceError(RuntimeError):
    """A step that a traced replay cannot reproduce (a host read, a data-dependent shape, a value
    computed from the batch outside any op)."""


def _is_array(value) -> bool:
    return isinstance(value, np.ndarray) or backend.is_device_array(value)


class _Record(FunctionHook):
    """One eager call's ops, accumulations and optimizer steps, in order (graph acquisition)."""

    def __init__(self, args):
        # ("op", copy, input numbers, bound arrays, output numbers, saved arrays' numbers, several outputs),
        # ("grad", leaf, gradient's number, .grad was empty) or ("step", optimizer), in call order
        self.lines = []
        self.slot_of = {}  # id(array) -> value number
        self.kept = []  # every array seen, kept alive so that an id is never reused while recording
        self.constants = []  # value number -> ("const", array) | ("live", tensor) | None (made by the step)
        self.paused = 0  # > 0 inside an optimizer's step: its own arithmetic is replayed by calling it
        self.clock = _clock[0]  # the in-place clock: it moves only inside optimizer steps
        self.replicas = {}  # id(a recorded Function) -> (it, the copy the plan calls)
        self.backward_of = None  # the node whose backward runs now (to name it in an error)
        self.made_in = {}  # value number of a constant -> the node whose backward made it
        # id(leaf) -> [leaf, a copy of .grad before the first accumulation (or None), copies of each gradient
        # added]: what .grad must hold at the next optimizer step, unless something outside ops changed it
        self.delivered = {}
        self.args = []
        for a in args:
            self.args.append(self.new_value(a.array) if isinstance(a, Tensor) else None)

    def new_value(self, array, origin=None) -> int:
        slot = len(self.constants)
        self.constants.append(origin)
        self.slot_of[id(array)] = slot
        self.kept.append(array)
        return slot

    def ref(self, t: Tensor, op: str) -> int:
        """The value number of a Tensor an op reads: known, or a new constant / live leaf."""
        slot = self.slot_of.get(id(t.array))
        if slot is not None:
            return slot
        if self.backward_of is not None:
            array = t.array
            if array.size > 1 and not bool((array == array.reshape(-1)[0]).all()):
                # not a filled constant (zeros, ones): computed from the node's values with raw array code
                raise TraceError(f"compile: the backward of {self.backward_of} builds an array of shape "
                                 f"{array.shape} from values with raw array code rather than ops, which a "
                                 "replay would freeze; this op can't be traced yet: run this step eagerly")
            self.made_in[len(self.constants)] = self.backward_of
        return self.new_value(t.array, ("live", t) if t.creator is None else ("const", t.array))

    # ------------------------------------------------------------ the hook's methods
    def check_clock(self):
        if _clock[0] != self.clock:
            raise TraceError("compile: the step changed a tensor in place outside an op and an optimizer step "
                             "(x += ..., an item assignment, an in-place method), which a replay cannot repeat; "
                             "write it as out-of-place ops (x = x + ...), or run this step eagerly")

    def forward_preprocess(self, function, inputs):
        if self.paused:
            return
        self.check_clock()
        self.pending = copy.copy(function)  # the op with its constructor's parameters, before forward
        for name, value in vars(self.pending).items():
            if isinstance(value, Function) and id(value) in self.replicas:
                # a gradient op reading its forward op's state (MaxPoolScatter's pool): the replay's copy
                setattr(self.pending, name, self.replicas[id(value)][1])

    def forward_postprocess(self, function, inputs, outputs):
        if self.paused or outputs is None:
            return
        replica, op = self.pending, type(function).__name__
        bound = {}
        for name, value in vars(replica).items():
            if isinstance(value, tuple) and any(_is_array(v) and id(v) in self.slot_of for v in value):
                raise TraceError(f"compile: {op} keeps a tuple {name!r} holding arrays of the step (an index "
                                 "by several tensors); index by one tensor, or run this step eagerly")
            if _is_array(value) and id(value) in self.slot_of:
                bound[name] = self.slot_of[id(value)]
        self.replicas[id(function)] = (function, replica)  # the original kept: its id stays unique
        if op.startswith("GetItem") and any(x.dtype == np.bool_ for x in inputs[1:]):
            raise TraceError(f"compile: {op} indexes by a boolean mask: its output's shape depends on the "
                             "mask's values, which a replay cannot follow; use where() instead")
        ins = tuple(self.ref(x, op) for x in inputs)
        outs = outputs if type(outputs) is tuple else (outputs,)
        out_slots = tuple(self.new_value(y.array) for y in outs)
        saved_slots = {name: self.new_value(a) for name, a in function.saved_array_values().items()
                       if id(a) not in self.slot_of and name not in bound}
        self.lines.append(("op", replica, ins, bound, out_slots, saved_slots, type(outputs) is tuple))

    def backward_preprocess(self, function, grad_outputs):
        self.backward_of = type(function).__name__

    def backward_postprocess(self, function, grad_outputs, grad_inputs):
        self.backward_of = None

    def accumulate_preprocess(self, tensor, grad):
        if self.paused:
            return
        if tensor.creator is not None:
            raise TraceError("compile: a tensor in the step calls retain_grad(); a replay fills the leaves' "
                             ".grad only: drop retain_grad() or run this step eagerly")
        self.lines.append(("grad", tensor, self.ref(grad, "backward"), tensor.grad is None))
        entry = self.delivered.get(id(tensor))
        if entry is None:
            entry = self.delivered[id(tensor)] = [tensor, None if tensor.grad is None else tensor.grad.array.copy(), []]
        entry[2].append(grad.array.copy())

    def check_grads(self, where: str):
        """Raise if a .grad the walk filled was changed since, outside ops (clip_grad_norm_ scaling it in
        place, an assignment to .grad): the replay would not repeat that change."""
        for leaf, old, added in self.delivered.values():
            expected = old
            for g in added:  # summed in the walk's order, as _accumulate_leaf sums
                expected = g if expected is None else expected + g
            if leaf.grad is None and where == "at the end of the step":
                continue  # zero_grad() after the update: the replay ends with it too
            if leaf.grad is None or not _same_value(leaf.grad.array, expected):
                raise TraceError(f"compile: the .grad of a tensor of shape {tuple(leaf.shape)} changed {where} "
                                 "after backward, outside ops (clip_grad_norm_, a scaling or an assignment of "
                                 ".grad), which a replay would not repeat; run this step eagerly, or move "
                                 "that change out of the step")
        self.delivered = {}

    def host_read(self, tensor, how):
        if self.paused:
            return
        raise TraceError(f"compile: the step reads a tensor's value into Python ({how} on a tensor of shape "
                         f"{tuple(tensor.shape)}), so what it does next may depend on the batch, which a "
                         "replay cannot follow; return the tensor from the step and read it outside")

    def optimizer_pre(self, optimizer, args, kwargs):
        if not self.paused:
            self.check_grads(f"before {type(optimizer).__name__}.step()")
            if args[1:] or kwargs:
                raise TraceError(f"compile: {type(optimizer).__name__}.step() got arguments (a closure?); "
                                 "call step() with none inside a traced step")
            self.lines.append(("step", optimizer))
        self.paused += 1

    def optimizer_post(self, optimizer, args, kwargs):
        self.paused -= 1
        self.clock = _clock[0]

    def run(self, step, args, kwargs):
        """Call ``step`` eagerly under this record; return its result and its value numbers."""
        pre = hooks.register_optimizer_step_pre_hook(self.optimizer_pre)
        post = hooks.register_optimizer_step_post_hook(self.optimizer_post)
        try:
            with self:
                result = step(*args, **kwargs)
        finally:
            pre.remove()
            post.remove()
        self.check_clock()
        self.check_grads("at the end of the step")
        leaves = {id(line[1]): line[1] for line in self.lines if line[0] == "grad"}
        self.grad_none_at_end = {i: leaf.grad is None for i, leaf in leaves.items()}
        self.result = result
        return result

    def grad_flags(self) -> tuple:
        """For each accumulation, whether .grad was empty before it (a fresh gradient, or a sum)."""
        return tuple(line[3] for line in self.lines if line[0] == "grad")

    def leaves(self) -> list:
        """The tensors whose .grad the step filled, in the order of their first gradient."""
        return list({id(line[1]): line[1] for line in self.lines if line[0] == "grad"}.values())

    def returned(self):
        """The step's result as value numbers: one, a tuple/list of them, or None."""
        def number(t):
            if not isinstance(t, Tensor):
                raise TraceError(f"compile: the step returned a {type(t).__name__}; return Tensors (a loss, "
                                 "a tuple of them) or None")
            return self.ref(t, "return")
        r = self.result
        if r is None:
            return None
        if isinstance(r, (tuple, list)):
            return tuple(number(t) for t in r)
        return number(r)


def _described(op) -> str:
    """``Name(parameter=value, ...): the first line of its docstring`` for the plan's comments."""
    def plain(v):
        return v is None or isinstance(v, (bool, int, float, str)) or (
            isinstance(v, tuple) and len(v) <= 6 and all(plain(x) for x in v))
    parts = [f"{name}={value!r}" for name, value in vars(op).items()
             if not name.startswith("_") and name not in ("saved_inputs", "saved_indices") and plain(value)]
    shown = ""
    for part in parts:
        if len(shown) + len(part) > 60:
            shown += ", …"
            break
        shown = f"{shown}, {part}" if shown else part
    doc = (type(op).__doc__ or "").strip().splitlines()
    head = f"{type(op).__name__}({shown})" if shown else type(op).__name__
    return head + (f": {doc[0][:60]}" if doc else "")


def _same_value(a, b) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(backend.xp_of(a).array_equal(a, b, equal_nan=True))


def _check_agree(first: _Record, second: _Record):
    """Raise TraceError unless two records of one guard made the same ops on the same constants."""
    if len(first.lines) != len(second.lines):
        raise TraceError(f"compile: two calls with the same input shapes made {len(first.lines)} and "
                         f"{len(second.lines)} ops, accumulations and optimizer steps: the step's Python code "
                         "takes another path from call to call, which a replay cannot follow")
    for a, b in zip(first.lines, second.lines):
        name = type(a[1]).__name__ if a[0] != "grad" else "a leaf's gradient"
        if a[0] != b[0] or type(a[1]) is not type(b[1]) or a[2:] != b[2:] and a[0] != "op":
            raise TraceError(f"compile: the step's ops changed between two calls with the same input shapes "
                             f"(at {name}); a replay cannot follow a step whose Python code changes path")
        if a[0] != "op":
            continue
        if a[2:5] != b[2:5] or a[6] != b[6] or a[5].keys() != b[5].keys():
            raise TraceError(f"compile: {name} read other values in two calls with the same input shapes")
        for name_, value in vars(a[1]).items():  # constructor parameters and arrays
            other = vars(b[1]).get(name_)
            if name_ in a[3] or _is_array(value) and _is_array(other) and (value is other or _same_value(value, other)):
                continue
            if _is_array(value) or _is_array(other):
                raise TraceError(f"compile: {name} keeps an array {name_!r} computed from the batch outside any op "
                                 "(it differs between two calls), which a replay would freeze; make it an input "
                                 "of the op, or run this step eagerly")
            if not _plain_equal(value, other):
                raise TraceError(f"compile: {name}'s parameter {name_!r} changed between two calls with the same "
                                 f"input shapes ({value!r} then {other!r}); a replay would keep the first")
    for i, (a, b) in enumerate(zip(first.constants, second.constants)):
        if a is None or b is None:
            if a is not b:
                raise TraceError(f"compile: value v{i} is made by an op in one call and not in the other")
            continue
        if a[0] == "live" and b[0] == "live" and a[1] is b[1]:
            continue
        va = a[1].array if a[0] == "live" else a[1]
        vb = b[1].array if b[0] == "live" else b[1]
        if not _same_value(va, vb):
            user = next((type(line[1]).__name__ for line in first.lines if line[0] == "op" and i in line[2]),
                        "a gradient accumulation")
            maker = f"the backward of {first.made_in[i]}" if i in first.made_in else "the step"
            raise TraceError(f"compile: {user} reads a tensor that {maker} made outside any op (v{i}, shape "
                             f"{va.shape}) and whose "
                             "values differ between two calls: it is computed from the batch or the parameters "
                             "with raw array code, which a replay would freeze; compute it with ops, or run "
                             "this step eagerly")


def _plain_equal(a, b) -> bool:
    if isinstance(a, Function) or isinstance(b, Function):  # an earlier op of the plan (its copy)
        return type(a) is type(b)
    if isinstance(a, Tensor) or isinstance(b, Tensor):  # a tensor kept for its version check (an index)
        return isinstance(a, Tensor) and isinstance(b, Tensor) and a.shape == b.shape and a.dtype == b.dtype
    try:
        return bool(a == b) if not isinstance(a, (list, tuple)) else len(a) == len(b) and all(
            _plain_equal(x, y) for x, y in zip(a, b))
    except (TypeError, ValueError):
        return a is b


class Plan:
    """A recorded step lowered to lines of Python over raw arrays (see the module docstring)."""

    def __init__(self, record: _Record, lower: bool = True):
        self.n_values = len(record.constants)
        self.args = record.args
        self.ops, self.leaves, self.optimizers, self.lives = [], [], [], []
        self.values = [None] * self.n_values
        for i, origin in enumerate(record.constants):
            if origin is not None and origin[0] == "const":
                self.values[i] = origin[1]
            elif origin is not None:
                self.lives.append((i, origin[1], origin[1].shape, origin[1].dtype))
        self.returned = record.returned()
        returned = () if self.returned is None else (
            self.returned if isinstance(self.returned, tuple) else (self.returned,))
        on_device = any(backend.is_device_array(a) for a in record.kept)
        self.memory = plan_memory(record.lines, record.kept, returned, fuse=on_device, lower=lower)
        self.kernels = [self._kernel(record, c, chain) for c, chain in enumerate(self.memory.chains)]
        lines = []
        leaf_number, fresh = {}, set()
        for position, line in enumerate(record.lines):
            if line[0] == "op":
                _, replica, ins, bound, outs, saved, several = line
                k = len(self.ops)
                self.ops.append(replica)
                if position in self.memory.lowerings:
                    lines += self._lowered(position, line, record)
                    continue
                if bound:
                    given = ", ".join(f"{n!r}: v{s}" for n, s in bound.items())
                    lines.append(f"ops[{k}].set_saved_arrays({{{given}}})")
                args = ", ".join(f"v{s}" for s in ins)
                targets = ", ".join(f"v{s}" for s in outs) + ("," if several and len(outs) == 1 else "")
                lines.append(f"{targets} = ops[{k}].forward({args})  # {_described(replica)}")
                for name, s in saved.items():
                    lines.append(f"v{s} = ops[{k}].{name}")
            elif line[0] == "grad":
                _, leaf, g, was_none = line
                if id(leaf) not in leaf_number:
                    leaf_number[id(leaf)] = len(self.leaves)
                    self.leaves.append(leaf)
                j = leaf_number[id(leaf)]
                if was_none:  # the first gradient becomes .grad, as in the walk (each call's op makes a new array)
                    lines.append(f"g{j} = v{g}")
                    fresh.add(j)
                elif j in fresh:
                    lines.append(f"g{j} = g{j} + v{g}")
                else:  # .grad held a gradient when this step began: add to it, as the walk does
                    lines.append(f"g{j} = leaves[{j}].grad.array + v{g}")
                    fresh.add(j)
                lines.append(f"leaves[{j}].grad = Tensor(g{j})")
            else:
                self.optimizers.append(line[1])
                lines.append(f"optimizers[{len(self.optimizers) - 1}].step()")
        for j, leaf in enumerate(self.leaves):
            if record.grad_none_at_end.get(id(leaf)):
                lines.append(f"leaves[{j}].grad = None  # the step ended with zero_grad()")
        self.body = lines
        self.code = self._source()
        namespace = {"Tensor": Tensor, "np": np}
        if on_device:
            namespace["cp"] = backend.cupy_module()
        namespace.update({f"k{c}": kernel for c, kernel in enumerate(self.kernels)})
        self.buffers = [backend.xp_of(like).empty(shape, dtype) for shape, dtype, like in self.memory.buffers]
        exec(builtins.compile(self.code, "<minidl traced step>", "exec"), namespace)  # noqa: S102 (our own lines)
        self.function = namespace["traced_step"]
        first_constant = len([s for s in self.args if s is not None])
        constants = self.parameters[first_constant:len(self.parameters) - len(self.lives)]
        self.constant_values = [self.values[i] for i in constants]

    def _lowered(self, position, line, record) -> list:
        """The NumPy lines of a lowered op (see :mod:`minidl.tracing_lower`), or its chain's kernel call."""
        _, replica, ins, _, outs, _, _ = line
        memory, comment = self.memory, f"  # {_described(replica)}"
        out = memory.out_buffer.get(position)
        out = None if out is None else f"b{out}"  # None: a new array (a result that leaves the step)
        y = record.kept[outs[0]]
        if position in memory.chain_of:
            c = memory.chain_of[position]
            chain = memory.chains[c]
            if position != chain.members[-1]:  # computed inside the chain's kernel, never stored
                operands = ", ".join(f"v{s}" for s in ins)
                return [f"# v{outs[0]} = {type(replica).__name__} of {operands}, in k{c}{comment}"]
            target = out or f"cp.empty({tuple(y.shape)}, {str(y.dtype)!r})"
            args = ", ".join(f"v{s}" for s in chain.inputs)
            kinds = " → ".join(type(record.lines[p][1]).__name__ for p in chain.members)
            return [f"v{outs[0]} = k{c}({args}, {target})  # one GPU kernel: {kinds}"]
        xp = "cp" if backend.is_device_array(y) else "np"
        scratch = [f"b{b}" for b in memory.scratch.get(position, ())]
        emitted = memory.lowerings[position].emit([f"v{s}" for s in ins], f"v{outs[0]}", out, scratch, xp)
        return [emitted[0] + comment] + emitted[1:]

    def _kernel(self, record, c, chain):
        """The ``cupy.ElementwiseKernel`` of GPU chain number ``c``."""
        kinds = {p: type(record.lines[p][1]).__name__ for p in chain.members}
        op_inputs = {p: record.lines[p][2] for p in chain.members}
        definition = chain_kernel(chain, kinds, op_inputs, f"minidl_traced_chain{c}")
        return backend.cupy_module().ElementwiseKernel(*definition, options=FUSED_OPTIONS)

    def _source(self) -> str:
        # the function's parameters: the step's arguments, then the constants, then the live tensors'
        # arrays, in the order of self.parameters (one positional list per call: nothing else to build)
        self.parameters = [s for s in self.args if s is not None]
        self.parameters += [i for i, v in enumerate(self.values) if v is not None and i not in self.parameters]
        self.parameters += [i for i, *_ in self.lives]
        names = [f"v{s}" for s in self.parameters] + [f"b{b}" for b in range(len(self.memory.buffers))]
        header = ["def traced_step(ops, leaves, optimizers, " + ", ".join(names) + "):"]
        ret = self.returned
        if ret is None:
            tail = "    return None"
        elif isinstance(ret, tuple):
            tail = "    return (" + ", ".join(f"v{s}" for s in ret) + ("," if len(ret) == 1 else "") + ")"
        else:
            tail = f"    return v{ret}"
        return "\n".join(header + ["    " + line for line in self.body] + [tail]) + "\n"

    def holds(self) -> bool:
        """Do the live tensors (parameters, buffers) still have their recorded shapes and dtypes?"""
        return all(t.array.shape == shape and t.array.dtype == dtype for _, t, shape, dtype in self.lives)

    def run(self, args):
        """The plan on the arrays of ``args`` (Tensors where the recording had Tensors)."""
        values = [self.ops, self.leaves, self.optimizers]
        values += [a.array for a, s in zip(args, self.args) if s is not None]
        values += self.constant_values
        values += [t.array for _, t, _, _ in self.lives]
        values += self.buffers
        result = self.function(*values)
        if result is None:
            return None
        if isinstance(result, tuple):
            return tuple(Tensor(r) for r in result)
        return Tensor(result)


def _guard(args, kwargs):
    """What must not change for a plan to hold: each argument's shape, dtype and device (a Tensor),
    or its value (anything else)."""
    def key(a):
        if isinstance(a, Tensor):
            array = a.array
            # the device: the array's type (NumPy or CuPy) and, on a GPU, its device; the layout (C order
            # or not): a lowered op writes a C-ordered buffer where NumPy follows its inputs' order
            return (array.shape, array.dtype, type(array), getattr(array, "device", None),
                    bool(array.flags.c_contiguous))
        if _is_array(a):
            raise TypeError("compile: pass the step's arrays as Tensors (mdl.tensor(array)); a raw array "
                            f"of shape {a.shape} would be a constant of the plan")
        try:
            hash(a)
        except TypeError:
            raise TypeError(f"compile: an argument of type {type(a).__name__} can't be part of the guard (it is not "
                            "hashable); pass Tensors and plain values (numbers, strings, tuples)") from None
        return ("value", a)
    for name, v in kwargs.items():
        if isinstance(v, Tensor):
            raise TypeError(f"compile: pass the step's tensors positionally (got {name}= a Tensor of shape "
                            f"{tuple(v.shape)}); keyword arguments are for settings")
    return tuple(key(a) for a in args) + tuple((name, key(v)) for name, v in sorted(kwargs.items()))


class CompiledStep:
    """``step`` recorded and replayed (see :func:`compile`)."""

    def __init__(self, step, lower: bool = True):
        self.step, self.lower = step, lower
        self.plans = {}  # guard -> Plan
        self.first = {}  # guard -> the first record, waiting for a second to agree with it
        self.recordings = 0  # how many calls ran eagerly (for tests and curious readers)
        functools.update_wrapper(self, step)

    def __call__(self, *args, **kwargs):
        key = _guard(args, kwargs)
        plan = self.plans.get(key)
        # a plan holds while the leaves' .grad are set or None as when it was recorded (a step that
        # calls zero_grad() itself, or one that accumulates over calls) and the parameters keep their shapes
        if plan is not None and tuple(leaf.grad is None for leaf in plan.leaves) == plan.entry and plan.holds():
            return plan.run(args)
        first = self.first.get(key)
        entry = None if first is None else tuple(leaf.grad is None for leaf in first.leaves())
        record = _Record(args)
        self.recordings += 1
        result = record.run(self.step, args, kwargs)
        if first is not None and first.grad_flags() != record.grad_flags():
            self.first[key] = record  # .grad was empty in one call and full in the other: start again from this one
        elif first is not None and entry is not None:
            del self.first[key]
            _check_agree(first, record)
            plan = Plan(record, self.lower)
            plan.entry = entry
            self.plans[key] = plan
        else:
            self.first[key] = record
        return result

    def plan(self) -> str:
        """The most recent plan's code (readable NumPy-level Python); '' before one is built."""
        return self.code

    @property
    def code(self) -> str:
        if not self.plans:
            return ""
        return list(self.plans.values())[-1].code


def compile(step, *, lower: bool = True):  # noqa: A001 (PyTorch's name: torch.compile)
    """``step`` traced: recorded on its first calls, then replayed on raw arrays (``torch.compile``'s habit).

    ``step`` is a function of Tensors that runs a forward pass, ``loss.backward()`` and
    optionally ``optimizer.zero_grad()`` / ``optimizer.step()``, and returns Tensors (the loss)
    or None. Use it as a decorator::

        @mdl.compile
        def train_step(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss

    The first two calls with given argument shapes, dtypes and devices (the guard) run
    eagerly and are recorded; they must agree (see :mod:`minidl.tracing`). Later calls
    with that guard replay the plan — ``print(train_step.code)`` shows it — and return
    Tensors that need no gradient; the leaves' ``.grad`` and the optimizer's state change
    as the eager step would change them, with the same values bit for bit. A call with
    another guard records anew. This is the seed's "graph acquisition, lowering and
    compilation": acquisition by recording, lowering to a list of array calls,
    compilation to one Python function.

    ``lower=False`` keeps every op's own ``forward`` in the plan (each allocating its result)
    instead of the inline NumPy calls with ``out=`` into reused buffers of
    :mod:`minidl.tracing_lower`: the same values, for comparing the two.
    """
    if not callable(step):
        raise TypeError(f"compile: expected a function (the training step), got {type(step).__name__}")
    if not isinstance(lower, bool):
        raise TypeError(f"compile: lower must be True or False, got {lower!r}")
    return CompiledStep(step, lower)
