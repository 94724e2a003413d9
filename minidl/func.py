"""Function transforms, as in ``torch.func``: jvp, vjp, grad, jacfwd, jacrev, hessian, hvp.

Each takes a function of Tensors and gives a derivative of it:

- ``jvp(f, primals, tangents)`` → ``(f(x), J v)``: forward mode, one sweep
  in which every op's tangent rule carries v along (:class:`ForwardMode`);
- ``vjp(f, *primals)`` → ``(f(x), u ↦ Jᵀ u)``: reverse mode, the backward walk;
- ``jacfwd(f)(x)``: the Jacobian a column at a time, one jvp per input
  element (n sweeps for n inputs);
- ``jacrev(f)(x)``: the Jacobian a row at a time, one backward per output
  element (m walks for m outputs, after one recorded forward);
- ``hessian(f)(x) = jacfwd(jacrev(f))(x)``: forward over reverse;
- ``hvp(f, x, v)`` → ``(f(x), H v)``: one jvp of the gradient, no Hessian built.

So the cost of a Jacobian shows the chapter's point: a function of many
inputs and one output (a loss) costs one backward in reverse mode and n
sweeps in forward mode; a function of one input and many outputs the other
way round. Outputs keep ``torch.func``'s shapes: a Jacobian of an output of
shape (m...) with respect to an input of shape (n...) has shape (m..., n...).

The transforms compose (``jacfwd(jacrev(f))``, ``jacrev(jacfwd(f))``,
``jacfwd(jacfwd(f))``) because backward and every tangent rule are written
with Tensor ops, which the levels outside see and differentiate.
"""
from __future__ import annotations

from minidl.autograd import ForwardMode, enable_grad, is_grad_enabled, share_tangents
from minidl.autograd import grad as _reverse
from minidl.ops.shape import reshape, stack
from minidl.tensor import Tensor

__all__ = ["jvp", "vjp", "grad", "jacfwd", "jacrev", "hessian", "hvp"]


def _as_tuple(out, what: str) -> tuple:
    outs = (out,) if isinstance(out, Tensor) else tuple(out) if isinstance(out, (tuple, list)) else None
    if outs is None or not all(isinstance(o, Tensor) for o in outs):
        raise TypeError(f"minidl.func: {what} must be a Tensor or a tuple of Tensors, got {type(out).__name__}")
    return outs


def _zeros(like: Tensor) -> Tensor:
    return Tensor(like.xp.zeros(like.shape, like.dtype))


def _one_hot(like: Tensor, k: int) -> Tensor:
    seed = like.xp.zeros(like.shape, like.dtype)
    seed.reshape(-1)[k] = 1
    return Tensor(seed)


def _argnums(argnums, count: int, name: str) -> tuple:
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    if not nums or any(not isinstance(i, int) or not -count <= i < count for i in nums):
        raise ValueError(f"minidl.func.{name}: argnums={argnums!r} does not name arguments of a call with "
                         f"{count} argument{'s' if count != 1 else ''}; give positions from 0 to {count - 1}")
    return tuple(i % count for i in nums)


def _forward(func, args, tangents: dict):
    """func(*args) with tangents[i] attached to args[i]: (outputs as returned, their tangents, zeros for none)."""
    with ForwardMode() as level:
        for i, dx in tangents.items():
            if not isinstance(args[i], Tensor) or not isinstance(dx, Tensor):
                raise TypeError(f"minidl.func.jvp: primal and tangent {i} must be Tensors, got "
                                f"{type(args[i]).__name__} and {type(dx).__name__}")
            if level.tangent(args[i]) is not None:
                raise ValueError(f"minidl.func.jvp: primal {i} is the same Tensor as an earlier primal; "
                                 "pass distinct Tensors (x.clone())")
            level.attach(args[i], dx)
        out = func(*args)
        outs = _as_tuple(out, "the function's output")
        douts = tuple(level.tangent(o) for o in outs)
    return out, tuple(_zeros(o) if d is None else d for o, d in zip(outs, douts))


def jvp(func, primals, tangents):
    """``(func(*primals), J v)``: the Jacobian-vector product in one forward sweep (forward mode).

    ``primals`` and ``tangents`` are tuples of Tensors of matching shapes (v is
    the tangents). The second result has the structure of the output (a
    Tensor, or a tuple of them). No graph is recorded for it unless a primal
    requires grad (then J v can itself be differentiated).
    """
    primals, tangents = tuple(primals), tuple(tangents)
    if len(primals) != len(tangents):
        raise ValueError(f"minidl.func.jvp: {len(primals)} primals but {len(tangents)} tangents; give one "
                         "tangent per primal")
    out, douts = _forward(func, primals, dict(enumerate(tangents)))
    return out, douts[0] if isinstance(out, Tensor) else douts


def _tracked(args, nums):
    """args with those at ``nums`` ready for reverse mode, and whether the result must stay differentiable.

    An argument already in a recorded graph is used as it is (its gradient is then
    recorded too, for an outer reverse level); any other gets a Tensor of its own that
    requires grad, carrying the argument's tangents at the active forward levels.
    """
    args, keep = list(args), False
    for i in nums:
        x = args[i]
        if not isinstance(x, Tensor):
            raise TypeError(f"minidl.func: argument {i} must be a Tensor, got {type(x).__name__}")
        if x.requires_grad and is_grad_enabled():
            keep = True
            continue
        tracked = Tensor(x.array, requires_grad=True)
        share_tangents(x, tracked)
        args[i] = tracked
    return args, keep


def _pullback(outs, wrt, cotangents, keep):
    """Jᵀ u for each of ``wrt`` (zeros where an input is not used), by one backward walk."""
    used = [(o, u) for o, u in zip(outs, cotangents) if o.requires_grad]
    if not used:
        return [_zeros(x) for x in wrt]
    gs = _reverse([o for o, _ in used], wrt, grad_outputs=[u for _, u in used], retain_graph=True,
                  create_graph=keep, allow_unused=True)
    return [_zeros(x) if g is None else g for x, g in zip(wrt, gs)]


def vjp(func, *primals):
    """``(func(*primals), vjp_fn)``: ``vjp_fn(u)`` is Jᵀ u, one Tensor per primal (reverse mode).

    ``u`` has the output's structure (a Tensor, or a tuple of them); ``vjp_fn``
    may be called many times (the graph is kept).
    """
    args, keep = _tracked(primals, range(len(primals)))
    with enable_grad():
        out = func(*args)
    outs = _as_tuple(out, "the function's output")

    def vjp_fn(cotangents):
        us = _as_tuple(cotangents, "vjp_fn's cotangents")
        if [tuple(u.shape) for u in us] != [tuple(o.shape) for o in outs]:
            raise ValueError(f"minidl.func.vjp: cotangents of shapes {[tuple(u.shape) for u in us]} for outputs "
                             f"of shapes {[tuple(o.shape) for o in outs]}; give one per output, of its shape")
        return tuple(_pullback(outs, args, us, keep))
    return out, vjp_fn


def grad(func, argnums=0):
    """A function computing the gradient of ``func`` (one-element output) with respect to ``argnums``.

    As ``torch.func.grad``: one Tensor for an integer ``argnums``, a tuple for a tuple.
    """
    def gradient(*args):
        nums = _argnums(argnums, len(args), "grad")
        tracked, keep = _tracked(args, nums)
        with enable_grad():
            out = func(*tracked)
        if not isinstance(out, Tensor) or out.array.size != 1:
            shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
            raise ValueError(f"minidl.func.grad: the function must return a one-element Tensor, got {shape}; "
                             "use jacrev for a Jacobian")
        gs = _pullback((out,), [tracked[i] for i in nums], (Tensor(out.xp.ones(out.shape, out.dtype)),), keep)
        return gs[0] if isinstance(argnums, int) else tuple(gs)
    return gradient


def _arrange(per_output, single_output: bool, single_input: bool):
    """torch.func's nesting: [output][input] → Tensor, tuple per input, tuple per output, or both."""
    rows = [blocks[0] if single_input else tuple(blocks) for blocks in per_output]
    return rows[0] if single_output else tuple(rows)


def jacrev(func, argnums=0):
    """A function computing the Jacobian of ``func`` by reverse mode: one backward per output element.

    For an output of shape (m...) and an input of shape (n...) the block has
    shape (m..., n...); with several outputs or a tuple ``argnums`` the
    blocks come in tuples, as ``torch.func.jacrev`` gives them.
    """
    def jacobian(*args):
        nums = _argnums(argnums, len(args), "jacrev")
        tracked, keep = _tracked(args, nums)
        wrt = [tracked[i] for i in nums]
        with enable_grad():
            out = func(*tracked)
        outs = _as_tuple(out, "the function's output")
        per_output = []
        for o in outs:
            rows = [_pullback((o,), wrt, (_one_hot(o, k),), keep) for k in range(o.array.size)]
            if o.ndim == 0:  # a scalar output: the one gradient is the block (no stacking to differentiate)
                per_output.append(rows[0])
            else:
                per_output.append([reshape(stack([r[j] for r in rows]), tuple(o.shape) + tuple(x.shape))
                                   for j, x in enumerate(wrt)])
        return _arrange(per_output, isinstance(out, Tensor), isinstance(argnums, int))
    return jacobian


def jacfwd(func, argnums=0):
    """A function computing the Jacobian of ``func`` by forward mode: one jvp per input element.

    Same shapes as :func:`jacrev`; the columns come from forward sweeps, so no
    graph is recorded unless an input requires grad.
    """
    def jacobian(*args):
        nums = _argnums(argnums, len(args), "jacfwd")
        blocks, out = [], None
        for i in nums:
            x = args[i]
            if not isinstance(x, Tensor):
                raise TypeError(f"minidl.func.jacfwd: argument {i} must be a Tensor, got {type(x).__name__}")
            columns = []
            for k in range(x.array.size):
                out, douts = _forward(func, args, {i: _one_hot(x, k)})
                columns.append(douts)
            outs = _as_tuple(out, "the function's output")
            blocks.append([reshape(stack([c[j] for c in columns], axis=-1), tuple(o.shape) + tuple(x.shape))
                           for j, o in enumerate(outs)])
        per_output = [[block[j] for block in blocks] for j in range(len(blocks[0]))]
        return _arrange(per_output, isinstance(out, Tensor), isinstance(argnums, int))
    return jacobian


def hessian(func, argnums=0):
    """A function computing the Hessian of ``func`` (one-element output): ``jacfwd(jacrev(func))``.

    Forward over reverse, as ``torch.func.hessian``: the reverse pass gives the
    gradient, and forward mode differentiates that whole pass, backward ops
    included, one input direction at a time.
    """
    return jacfwd(jacrev(func, argnums), argnums)


def hvp(func, inputs, v):
    """``(func(*inputs), H v)``, the Hessian-vector product without building H (forward over reverse).

    As ``torch.autograd.functional.hvp``: ``inputs`` and ``v`` are a Tensor or
    matching tuples of Tensors; ``func`` returns a one-element Tensor. One
    jvp of the gradient: the cost of about two gradients, whatever the size of H.
    """
    single = isinstance(inputs, Tensor)
    inputs = (inputs,) if single else tuple(inputs)
    v = (v,) if isinstance(v, Tensor) else tuple(v)
    values = []

    def gradient(*xs):
        tracked, keep = _tracked(xs, range(len(xs)))
        with enable_grad():
            out = func(*tracked)
        if not isinstance(out, Tensor) or out.array.size != 1:
            raise ValueError("minidl.func.hvp: the function must return a one-element Tensor")
        values.append(out)
        return tuple(_pullback((out,), tracked, (Tensor(out.xp.ones(out.shape, out.dtype)),), keep))

    _, products = jvp(gradient, inputs, v)
    products = products if isinstance(products, tuple) else (products,)
    value = Tensor(values[0].array)
    return value, products[0] if single else products
