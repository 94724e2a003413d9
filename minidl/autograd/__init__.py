"""Automatic differentiation: ops that record a graph as they run, and the walks through it.

A :class:`Function` is one op (``forward`` on arrays, ``backward`` and ``jvp``
on Tensors); calling it records a node when gradients are wanted, and
:func:`backward` (``loss.backward()``) walks the nodes from the loss back to
the leaves. Each concept has its module, and each module imports only the
ones above it in this list:

=================  ==============================================================
``modes``          grad modes: ``no_grad``, ``enable_grad``, ``set_grad_enabled``
``function_hooks`` ``FunctionHook``: code run around every op call, node backward and walk
``anomaly``        ``detect_anomaly``: the first NaN or Inf, named by the line that made its op
``forward_mode``   ``ForwardMode``: tangents riding the forward pass (J v)
``saved``          ``saved_tensors_hooks``: pack what each node declares it saves
``function``       ``Function``: one op, and the node of the graph it records
``conversions``    ``ToDevice`` and ``Cast``: the ops the Tensor class itself needs
``walk``           the backward walk: ``backward``, ``grad``
=================  ==============================================================

Everything is importable from here (``from minidl.autograd import Function``).
"""
from minidl.autograd.anomaly import AnomalyError, detect_anomaly
from minidl.autograd.conversions import Cast, ToDevice
from minidl.autograd.forward_mode import (
    ForwardMode,
    MissingTangentRule,
    forward_levels,
    share_tangents,
    tangent_sum,
)
from minidl.autograd.function import AccumulateGrad, Function, FunctionCtx
from minidl.autograd.function_hooks import FunctionHook, announce_host_read
from minidl.autograd.modes import enable_grad, inference_mode, is_grad_enabled, no_grad, set_grad_enabled
from minidl.autograd.saved import SavedEdge, saved_tensors_hooks
from minidl.autograd.walk import backward, grad, topological_order

__all__ = [
    "AccumulateGrad", "AnomalyError", "Cast", "ForwardMode", "Function", "FunctionCtx", "FunctionHook",
    "MissingTangentRule", "SavedEdge", "ToDevice", "announce_host_read", "backward", "detect_anomaly", "enable_grad",
    "forward_levels", "grad", "inference_mode", "is_grad_enabled", "no_grad", "saved_tensors_hooks",
    "set_grad_enabled", "share_tangents", "tangent_sum", "topological_order",
]
