"""Counting a model's arithmetic: the FLOPs, MACs and compulsory bytes of every op it runs, by module.

    from minidl.roofline.flops import FlopCounter, count_flops

    counts = count_flops(model, x)                         # one forward
    counts = count_flops(model, x, loss_fn=lambda out: F.cross_entropy(out, y))   # forward + backward
    print(counts.table())                                  # by module and phase
    counts.total_flops, counts.macs, counts.intensity

    with FlopCounter(model) as fc:                         # any code: PyTorch's FlopCounterMode habit
        loss_fn(model(x), y).backward()
    fc.get_total_flops()

What is counted is what minidl runs: a :class:`~minidl.autograd.FunctionHook` sees every op call,
those of the forward and those each node's backward makes (a Linear's backward is a
``LinearGradData`` and a ``LinearGradWeight`` op; a convolution's, a convolution of dy and an im2col
product). Each call is priced from its arrays' shapes, by the conventions of
:mod:`minidl.roofline.opcosts`:

- **GEMM FLOPs**: the multiply–adds of products, 2 per MAC: ``MatMul`` (n×k)·(k×m) is 2nmk,
  ``Linear`` 2·B·I·O, ``Conv2dStride1`` 2·N·O·OH·OW·C·KH·KW, attention's two products
  2·B·H·L·S·(D + Dv) and its gradient's four. ``macs`` is half of them. These are the FLOPs
  PyTorch's ``torch.utils.flop_counter.FlopCounterMode`` counts (it counts products only).
- **other FLOPs**: one per element of the larger of the op's floating inputs and outputs
  (an add, a ReLU, a sum), more for ops that do more per element (softmax 5, layer norm's
  standardization 7 forward and 13 backward, as in opcosts), the bias of a Linear or convolution
  one per output; ops that only move data (reshape, transpose, indexing, concatenation,
  im2col, padding, casts) count none.
- **bytes**: compulsory traffic, every input array read once and every output written once;
  views (reshape, transpose, broadcast) move nothing. Temporaries inside an op are not
  counted, and a chain of elementwise ops is priced as separate passes, as minidl runs it
  unfused: the figure is the traffic of this engine's schedule, not of a fused one.

Optimizer steps work on raw arrays outside the graph and are not seen (:func:`minidl.roofline.
opcosts.adam_step` prices one). Backward ops are charged to the module whose forward made the
node they belong to, in the phase ``backward``.

The scaling estimate :func:`transformer_training_flops` (6·N·T, Kaplan et al. 2020, "Scaling
Laws for Neural Language Models", section 2.1) is here too, so a measured count can be set
beside it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from minidl import autograd, hooks

# Ops that only move or relabel data: no arithmetic.
MOVES_DATA = frozenset({
    "Reshape", "Transpose", "BroadcastTo", "GetItem", "Contiguous", "Concatenate", "Split", "Stack",
    "Pad", "ToDevice", "Cast", "Im2Col", "ChannelsLast", "Flip", "Roll", "Repeat", "RepeatInterleave",
    "Triangle", "Diagonal", "Unfold", "Gather", "Scatter", "ClassTargets", "MaxPoolGather", "Where",
    "CopyToGroup",
})
VIEWS = frozenset({"Reshape", "Transpose", "BroadcastTo"})  # no bytes either: a view of the input
# FLOPs per element for ops that do more than one operation per element (opcosts' counts)
PER_ELEMENT = {"Softmax": 5, "LogSoftmax": 5, "SoftmaxGrad": 4, "LogSoftmaxGrad": 4, "Normalize": 7,
               "NormalizeGrad": 13, "GELU": 8, "GELUGrad": 10, "CrossEntropy": 6, "CrossEntropyGrad": 3,
               "LayerNormAffine": 9, "LayerNormWeightGrad": 2}  # Normalize's 7, then · γ + β; Σ dy · x̂


@dataclass
class OpCount:
    """What one (module, phase, op) row ran: calls, GEMM FLOPs, other FLOPs, compulsory bytes."""

    module: str
    phase: str
    op: str
    calls: int = 0
    gemm_flops: float = 0.0
    other_flops: float = 0.0
    bytes: float = 0.0

    @property
    def flops(self) -> float:
        return self.gemm_flops + self.other_flops


def _floating(arrays):
    return [a for a in arrays if a is not None and np.dtype(a.dtype).kind in "fc"]


def _attention_gemm(q, k, v) -> float:
    """Attention's two products: S = Q Kᵀ (2·L·S·D per head) and O = P V (2·L·S·Dv)."""
    batch_heads = math.prod(q.shape[:-2])
    length, keys = q.shape[-2], k.shape[-2]
    return 2.0 * batch_heads * length * keys * (q.shape[-1] + v.shape[-1])


def op_flops(name: str, inputs, outputs) -> tuple[float, float]:
    """(GEMM FLOPs, other FLOPs) of one call of op ``name`` on these arrays (see the module docstring)."""
    if name == "MatMul":
        a, out = inputs[0], outputs[0]
        return 2.0 * out.size * a.shape[-1], 0.0
    if name == "Linear":  # x (…, I), W (O, I), b
        x, out = inputs[0], outputs[0]
        return 2.0 * out.size * x.shape[-1], float(out.size if len(inputs) == 3 else 0)
    if name == "LinearGradData":  # dx = dy W: dx (…, I), W (O, I)
        weight, out = inputs[1], outputs[0]
        return 2.0 * out.size * weight.shape[0], 0.0
    if name == "LinearGradWeight":  # dW = dyᵀ x: (O, I) summed over the rows of x
        x, out = inputs[1], outputs[0]
        return 2.0 * out.size * (x.size // x.shape[-1]), 0.0
    if name == "Conv2dStride1":  # y (N, O, OH, OW) from W (O, C, KH, KW)
        weight, out = inputs[1], outputs[0]
        return 2.0 * out.size * math.prod(weight.shape[1:]), float(out.size if len(inputs) == 3 else 0)
    if name in ("ScaledDotProductAttention", "TiledAttention"):
        q, k, v = inputs[:3]
        return _attention_gemm(q, k, v), 5.0 * math.prod(q.shape[:-1]) * k.shape[-2]
    if name in ("AttentionGrad", "TiledAttentionGrad"):  # dV, dP, dQ, dK: twice the forward's products
        q, k, v = inputs[1:4]
        return 2.0 * _attention_gemm(q, k, v), 4.0 * math.prod(q.shape[:-1]) * k.shape[-2]
    if name in MOVES_DATA:
        return 0.0, 0.0
    sizes = [a.size for a in _floating(list(inputs) + list(outputs))]
    return 0.0, float(PER_ELEMENT.get(name, 1) * max(sizes, default=0))


def op_bytes(name: str, inputs, outputs) -> float:
    """Compulsory traffic of one call: every input read once, every output written once; views none."""
    if name in VIEWS:
        return 0.0
    return float(sum(a.nbytes for a in list(inputs) + list(outputs) if a is not None))


class FlopCounts:
    """The rows a count made, and their totals (see the module docstring for the conventions)."""

    def __init__(self, rows: dict):
        self.rows: list[OpCount] = list(rows.values())

    def _sum(self, field: str, phase: str | None = None) -> float:
        return float(sum(getattr(r, field) for r in self.rows if phase is None or r.phase == phase))

    @property
    def total_flops(self) -> float:
        return self._sum("flops")

    @property
    def gemm_flops(self) -> float:
        return self._sum("gemm_flops")

    @property
    def macs(self) -> float:
        """Multiply–accumulates of the products: half their FLOPs."""
        return self.gemm_flops / 2

    @property
    def bytes(self) -> float:
        return self._sum("bytes")

    @property
    def intensity(self) -> float:
        """FLOPs per compulsory byte over everything counted."""
        return self.total_flops / self.bytes if self.bytes else math.nan

    def phase(self, phase: str) -> "FlopCounts":
        """Only the rows of ``phase`` ("forward" or "backward")."""
        kept = FlopCounts({})
        kept.rows = [r for r in self.rows if r.phase == phase]
        return kept

    def by_module(self) -> dict[str, float]:
        """{module name: FLOPs}, forward and backward together; "" is code outside any module."""
        out: dict[str, float] = {}
        for r in self.rows:
            out[r.module] = out.get(r.module, 0.0) + r.flops
        return out

    def by_op(self) -> dict[str, float]:
        """{op name: FLOPs}."""
        out: dict[str, float] = {}
        for r in self.rows:
            out[r.op] = out.get(r.op, 0.0) + r.flops
        return out

    def table(self, top: int | None = None) -> str:
        """Module, phase, calls, GFLOPs (GEMM and other), MB and intensity, largest first, then the total."""
        merged: dict[tuple[str, str], OpCount] = {}
        for r in self.rows:
            row = merged.setdefault((r.module, r.phase), OpCount(r.module, r.phase, ""))
            row.calls += r.calls
            row.gemm_flops += r.gemm_flops
            row.other_flops += r.other_flops
            row.bytes += r.bytes
        ordered = sorted(merged.values(), key=lambda r: -r.flops)[:top]
        width = max([len(r.module or "(no module)") for r in ordered] + [6])
        lines = [f"{'module':<{width}} {'phase':<8} {'ops':>5} {'GEMM MFLOP':>11} {'other MFLOP':>11} "
                 f"{'MB':>9} {'FLOP/B':>7}"]
        for r in ordered:
            intensity = f"{r.flops / r.bytes:>7.2f}" if r.bytes else f"{'-':>7}"
            lines.append(f"{r.module or '(no module)':<{width}} {r.phase:<8} {r.calls:>5} "
                         f"{r.gemm_flops / 1e6:>11.3f} {r.other_flops / 1e6:>11.3f} {r.bytes / 1e6:>9.3f} "
                         f"{intensity}")
        lines.append(f"total: {self.total_flops / 1e6:.3f} MFLOP ({self.macs / 1e6:.3f} M MACs in products), "
                     f"{self.bytes / 1e6:.3f} MB, {self.intensity:.2f} FLOP/byte")
        return "\n".join(lines)


class FlopCounter(autograd.FunctionHook):
    """Count the FLOPs and bytes of every op run inside the ``with`` block (PyTorch: FlopCounterMode).

    ``model``: name rows by its submodules (``named_modules``); without it every row's module is "".
    After the block, ``counts`` is the :class:`FlopCounts`; ``get_total_flops()`` answers as PyTorch's does.
    """

    def __init__(self, model=None):
        self._names = {} if model is None else {id(m): name for name, m in model.named_modules()}
        self._rows: dict[tuple[str, str, str], OpCount] = {}
        self._modules: list[str] = []  # the module calls in progress, innermost last
        self._owner: dict[int, tuple] = {}  # id(node) -> (node, module name): backward ops' owner
        self._backward: list[str] = []  # owners of the node backwards in progress
        self._handles = []
        self.counts: FlopCounts | None = None

    def __enter__(self):
        self._handles = [hooks.register_module_forward_pre_hook(self._module_starts),
                         hooks.register_module_forward_hook(self._module_ends)]
        return super().__enter__()

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._owner.clear()  # the nodes were kept alive only to be named
        self.counts = FlopCounts(self._rows)
        return super().__exit__(*exc)

    def _module_starts(self, module, inputs):
        name = self._names.get(id(module))
        self._modules.append(name if name is not None else (self._modules[-1] if self._modules else ""))

    def _module_ends(self, module, inputs, output):
        self._modules.pop()

    def forward_postprocess(self, function, inputs, outputs):
        if outputs is None:  # the op raised
            return
        outs = outputs if isinstance(outputs, tuple) else (outputs,)
        arrays_in = [t.array for t in inputs if t is not None]
        arrays_out = [t.array for t in outs if t is not None]
        if self._backward:
            module, phase = self._backward[-1], "backward"
        else:
            module, phase = (self._modules[-1] if self._modules else ""), "forward"
            self._owner[id(function)] = (function, module)
        name = type(function).__name__
        gemm, other = op_flops(name, arrays_in, arrays_out)
        row = self._rows.get((module, phase, name))
        if row is None:
            row = self._rows[(module, phase, name)] = OpCount(module, phase, name)
        row.calls += 1
        row.gemm_flops += gemm
        row.other_flops += other
        row.bytes += op_bytes(name, arrays_in, arrays_out)

    def backward_preprocess(self, function, grad_outputs):
        owner = self._owner.get(id(function))
        self._backward.append(owner[1] if owner is not None else "")

    def backward_postprocess(self, function, grad_outputs, grad_inputs):
        self._backward.pop()

    def get_total_flops(self) -> int:
        """Every FLOP counted so far (PyTorch's name)."""
        return int(FlopCounts(self._rows).total_flops)


def count_flops(model, *inputs, loss_fn=None) -> FlopCounts:
    """Count one call of ``model(*inputs)``, and its backward when ``loss_fn(output)`` gives a loss to differentiate.

    The model's gradients are left as they were before the call (the backward accumulates into
    ``.grad``, so they are saved and put back), and its training mode is not changed.
    """
    params = list(model.parameters()) if loss_fn is not None else []
    saved = [p.grad for p in params]
    with FlopCounter(model) as counter:
        out = model(*inputs)
        if loss_fn is not None:
            loss_fn(out).backward()
    for p, grad in zip(params, saved):
        p.grad = grad
    return counter.counts


def transformer_training_flops(parameters: float, tokens: float) -> float:
    """C ≈ 6·N·T: a forward pass costs 2N FLOPs per token (each weight one multiply–add), the backward 4N
    (Kaplan et al. 2020, section 2.1; embeddings and attention's L·d term left out, as there)."""
    return 6.0 * parameters * tokens
