"""Einstein summation: ``einsum("ij,jk->ik", a, b)`` and every product, trace or contraction it spells.

Each operand's subscripts name its dims; the output keeps the letters after
``->`` and sums over all the others:

    y[out] = Σ_{letters not in out} Π_k x_k[subs_k]

y is linear in each operand, so each gradient is again an einsum: of dy
(with the output's letters) and the other operands, producing x_k's letters:

    y = einsum("ij,jk->ik", A, B):   dA = einsum("ik,jk->ij", dy, B),   dB = einsum("ij,ik->jk", A, dy)

Two cases complete the rule. A letter of x_k found nowhere else (summed
inside x_k alone, as j in "ij->i") comes back through a ones vector of its
length: dx = einsum("i,j->ij", dy, 1). A letter repeated in x_k (a diagonal,
as in the trace "ii->") is written back to the diagonal through the identity
matrix: dx = einsum(",i,ij->ij", dy, 1, I). Because the backward is an einsum,
every higher derivative is one too.

Supported: any number of operands, implicit output (no ``->``: the letters
used once, in alphabetical order, uppercase first), repeated letters in an
operand (diagonals), ``...`` (broadcast dims, aligned from the right), and
size-1 dims broadcast against the same letter elsewhere. Not supported:
PyTorch's sublist form ``einsum(a, [0, 1], b, [1, 2])`` and a letter repeated
in the output; both raise a clear error.
"""
from __future__ import annotations

import string

import numpy as np

from minidl.autograd import Function, tangent_sum
from minidl.backend import xp_of
from minidl.ops.shape import broadcast_to
from minidl.tensor import Tensor, as_tensor

# einsum is a function of several tensors, not a Tensor method (as in PyTorch).
TENSOR_METHODS = ()


class Einsum(Function):
    """y[out] = Σ (Π_k x_k[subs_k]);  dx_k = Σ dy[out] Π_{j≠k} x_j[subs_j]  (each an einsum).

    The sums run over the letters absent from the left side. ``subs`` hold
    letters only (``...`` already spelled out); every letter of every
    operand has one size.
    """

    def __init__(self, subs, out):
        self.subs, self.out = tuple(subs), out

    def forward(self, *xs):
        self.sizes = {c: n for sub, x in zip(self.subs, xs) for c, n in zip(sub, x.shape)}
        xp = xp_of(xs[0])
        extra = {"optimize": True} if xp is np and len(xs) > 1 else {}  # BLAS through tensordot
        return xp.einsum(",".join(self.subs) + "->" + self.out, *xs, **extra)

    def backward(self, gy):
        used = set("".join(self.subs) + self.out)
        fresh = [c for c in string.ascii_letters if c not in used]
        xp = gy.xp
        grads = []
        for k, x in enumerate(self.inputs):
            if not x.requires_grad:
                grads.append(None)
                continue
            operands = [gy] + [xj for j, xj in enumerate(self.inputs) if j != k]
            subs = [self.out] + [s for j, s in enumerate(self.subs) if j != k]
            present, target, spare = set("".join(subs)), [], list(fresh)
            for c in self.subs[k]:
                if c in target:  # a repeat: a new letter, tied to c on the diagonal by the identity
                    if not spare:
                        raise ValueError(f"einsum: no free letter left for the gradient of {self.subs[k]!r}")
                    new = spare.pop()
                    operands.append(Tensor(xp.eye(self.sizes[c], dtype=gy.dtype)))
                    subs.append(c + new)
                    target.append(new)
                    continue
                if c not in present:  # summed inside x_k alone: broadcast back by a ones vector
                    operands.append(Tensor(xp.ones(self.sizes[c], dtype=gy.dtype)))
                    subs.append(c)
                    present.add(c)
                target.append(c)
            grads.append(Einsum(subs, "".join(target))(*operands))
        return tuple(grads)

    def jvp(self, *dxs):
        """dy = Σ_k einsum of the same subscripts with x_k replaced by dx_k (y is linear in each)."""
        terms = [Einsum(self.subs, self.out)(*[dx if j == k else x for j, x in enumerate(self.inputs)])
                 for k, dx in enumerate(dxs) if dx is not None]
        return tangent_sum(*terms)


def einsum(equation, *operands) -> Tensor:
    """Einstein summation, PyTorch's ``einsum(equation, *operands)`` (operands also as one list).

    ``einsum("bij,bjk->bik", a, b)`` is a batched matmul, ``einsum("ii", a)`` a
    trace, ``einsum("i,j->ij", u, v)`` an outer product; every operand gets
    its gradient (see the module's docstring for what is supported).
    """
    if not isinstance(equation, str):
        raise TypeError("einsum: the first argument must be the equation string, e.g. einsum('ij,jk->ik', a, b); "
                        "the sublist form einsum(a, [0, 1], b, [1, 2]) is not supported")
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not operands:
        raise ValueError(f"einsum: equation {equation!r} needs at least one operand")
    tensors = [as_tensor(x) for x in operands]
    subs, out, sizes = _parse(equation, [t.shape for t in tensors])
    for i, (sub, t) in enumerate(zip(subs, tensors)):
        full = tuple(sizes[c] for c in sub)
        if t.shape != full:  # a size-1 dim against a longer one: broadcast first (its gradient sums back)
            tensors[i] = broadcast_to(t, full)
    return Einsum(subs, out)(*tensors)


def _error(equation, why):
    return ValueError(f"einsum: equation {equation!r} {why}")


def _parse(equation, shapes):
    """The subscripts with ``...`` spelled out as letters, the output, and each letter's size."""
    eq = equation.replace(" ", "")
    if eq.count("->") > 1:
        raise _error(equation, "has more than one '->'")
    lhs, arrow, out = eq.partition("->")
    subs = lhs.split(",")
    if len(subs) != len(shapes):
        raise _error(equation, f"names {len(subs)} operand(s) but {len(shapes)} were given")
    for part in subs + [out]:
        rest = part.replace("...", "", 1)
        if any(c not in string.ascii_letters for c in rest):
            raise _error(equation, f"has {part!r}: subscripts are letters a-z, A-Z and one '...' per operand")
    used = set(c for c in eq if c in string.ascii_letters)
    ellipsis_dims = []
    for sub, shape in zip(subs, shapes):
        explicit = len(sub.replace("...", ""))
        dims = len(shape) - explicit
        if dims < 0 or ("..." not in sub and dims):
            raise _error(equation, f"gives {sub!r} to an operand of shape {tuple(shape)} ({len(shape)} dims)")
        ellipsis_dims.append(dims if "..." in sub else 0)
    spare = [c for c in string.ascii_letters if c not in used]
    width = max(ellipsis_dims, default=0)
    if width > len(spare):
        raise _error(equation, "uses too many letters to spell out '...'")
    ell = "".join(spare[:width])
    subs = [s.replace("...", ell[width - d:]) for s, d in zip(subs, ellipsis_dims)]
    if arrow:
        out = out.replace("...", ell)
    else:
        counts = {c: "".join(subs).count(c) for c in set("".join(subs))}
        out = ell + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ell))
    if len(set(out)) != len(out):
        raise _error(equation, f"repeats a letter in the output {out!r}")
    missing = [c for c in out if c not in "".join(subs)]
    if missing:
        raise _error(equation, f"has output letter(s) {missing} that no operand has")
    sizes = {}
    for sub, shape in zip(subs, shapes):
        for c, n in zip(sub, shape):
            m = sizes.get(c)
            if m is None or m == 1:
                sizes[c] = n
            elif n != m and (n != 1 or sub.count(c) > 1):
                raise _error(equation, f"gives letter {c!r} sizes {m} and {n} (operand shapes "
                                       f"{[tuple(s) for s in shapes]}); sizes must match or be 1")
        for c in set(sub):
            if len({n for cc, n in zip(sub, shape) if cc == c}) > 1:
                raise _error(equation, f"repeats letter {c!r} in {sub!r} over dims of different sizes {tuple(shape)}")
    return subs, out, sizes


