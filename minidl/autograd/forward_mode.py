"""Forward mode: tangents ride along the forward pass, so one sweep gives J v.

Each op's tangent rule (``Function.jvp``) turns its inputs' tangents into its
outputs' tangents as the forward pass goes; :mod:`minidl.func` (``jvp``,
``jacfwd``) is built on :class:`ForwardMode`, a
:class:`~minidl.autograd.FunctionHook`.
"""
from __future__ import annotations

import weakref

from minidl import backend
from minidl.autograd import function_hooks
from minidl.autograd.function_hooks import FunctionHook
from minidl.tensor import Tensor, version_of


class MissingTangentRule(NotImplementedError):
    """Forward mode reached an op that has no tangent rule (``jvp``); ``op`` is its class name."""

    def __init__(self, op: str):
        self.op = op
        super().__init__(f"{op} has no tangent rule (jvp), so forward mode cannot go through it; define "
                         f"{op}.jvp(*dxs) (see minidl.autograd.Function), or use reverse mode "
                         "(mdl.func.jacrev, mdl.grad)")


def require_floating(x, role: str, where: str) -> None:
    """Refuse a ``role`` ("primal", "tangent") that is not a floating-point (or complex) Tensor.

    An integer input has no tangent space: its tangent would be truncated to integers and every
    derivative through it would come out zero, a silent wrong number. ``torch.func`` refuses
    such inputs too (ValueError: "Expected primal to be floating point or complex").
    """
    if not backend.is_floating(x.dtype):
        raise ValueError(f"{where}: the {role} has dtype {x.dtype}, and derivatives are taken only with respect "
                         f"to floating-point or complex tensors (as torch.func requires); convert it first, "
                         f"e.g. x.astype('float64') or x.float()")


class ForwardMode(FunctionHook):
    """One level of forward-mode differentiation: tangents ride along the forward pass.

    Inside ``with ForwardMode() as level:``, ``level.attach(x, dx)`` gives the
    Tensor ``x`` the tangent ``dx`` (the dual number x + dx·ε). Every op then
    called on a Tensor that carries a tangent runs its ``forward`` as usual,
    then its tangent rule ``jvp`` on its inputs' tangents, and its outputs
    carry the result: ``level.tangent(y)`` is J v for the whole computation
    so far (None means zero). Nothing is kept for a backward pass: a tangent
    lives as long as its Tensor, so one sweep costs about two forward passes
    and the memory of one.

    It is a :class:`FunctionHook`, so with no level active the op call's hot
    path pays nothing beyond its one check for hooks. Levels nest
    (``jacfwd(jacfwd(f))``, ``jacfwd(jacrev(f))``), each with its own
    tangents: a level runs an op's tangent rule with itself and every level
    inside it switched off, and the levels outside it on, so they see the
    rule's ops and differentiate them in turn. Other hooks entered inside a
    level do not see its rules' ops.
    """

    def __init__(self):
        self.tangents = {}  # id(x) -> (weak reference to x, x's version when attached, tangent)

    def attach(self, x: Tensor, dx):
        """Give ``x`` the tangent ``dx`` (a Tensor of x's shape) at this level; None removes it."""
        key, table = id(x), self.tangents
        if dx is None:
            table.pop(key, None)
            return
        require_floating(x, "primal", "forward mode")
        require_floating(dx, "tangent", "forward mode")
        if tuple(dx.shape) != tuple(x.shape):
            raise ValueError(f"forward mode: a tangent of shape {tuple(dx.shape)} for a tensor of shape "
                             f"{tuple(x.shape)}; a tangent must have its primal's shape")

        def forget(ref):  # x was freed: its id may go to another tensor
            if table.get(key, (None,))[0] is ref:
                del table[key]
        table[key] = (weakref.ref(x, forget), version_of(x), dx)

    def tangent(self, x: Tensor):
        """``x``'s tangent at this level; None when it has none (a zero tangent)."""
        entry = self.tangents.get(id(x))
        if entry is None or entry[0]() is not x:
            return None
        if version_of(x) > entry[1]:
            raise RuntimeError(f"forward mode: a tensor of shape {tuple(x.shape)} that carries a tangent was "
                               "changed in place, so its tangent no longer describes it; change a copy "
                               "(t.clone()) instead")
        return entry[2]

    def forward_postprocess(self, fn, inputs, outputs):
        # Hooks close innermost first, but an inner level's rule must see the outer levels' tangents of
        # the outputs (the y in exp's ẏ = ẋ·y is differentiated by the outer level): so the outermost
        # level, which closes last, runs every level's rule, outermost first.
        levels = forward_levels()
        if levels and levels[0] is self:
            for level in levels:
                level._propagate(fn, inputs, outputs)

    def _propagate(self, fn, inputs, outputs):
        """Run ``fn``'s tangent rule on this level's tangents of ``inputs``; attach the results to ``outputs``."""
        if outputs is None or not self.tangents:
            return
        dxs = [self.tangent(x) for x in inputs]
        if all(dx is None for dx in dxs):
            return
        outs = outputs if type(outputs) is tuple else (outputs,)
        if fn.outputs is None:  # not recorded: what the rule reads is held as a record would hold it
            fn.hold(inputs, outs)
        with function_hooks.outside(self):  # the levels outside this one see the rule's ops
            dys = fn.jvp(*dxs)
        dys = dys if type(dys) is tuple else (dys,)
        op = type(fn).__name__
        if len(dys) != len(outs):
            raise RuntimeError(f"{op}.jvp returned {len(dys)} tangents for {len(outs)} outputs: "
                               "return one per output (None for a zero tangent)")
        for y, dy in zip(outs, dys):
            if dy is not None and tuple(dy.shape) != tuple(y.shape):
                raise RuntimeError(f"{op}.jvp returned a tangent of shape {tuple(dy.shape)} for an output of "
                                   f"shape {tuple(y.shape)}; a tangent has its output's shape (broadcast it)")
            self.attach(y, dy)


def forward_levels() -> list:
    """The active forward-mode levels, outermost first."""
    return [hook for hook in function_hooks.active if isinstance(hook, ForwardMode)]


def share_tangents(source: Tensor, target: Tensor):
    """Give ``target`` (a new Tensor holding ``source``'s values) ``source``'s tangent at every active level."""
    for level in forward_levels():
        level.attach(target, level.tangent(source))


def tangent_sum(*terms):
    """The sum of the tangent terms that are not None; None (a zero tangent) when every one is."""
    total = None
    for term in terms:
        if term is not None:
            total = term if total is None else total + term
    return total
