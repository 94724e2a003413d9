"""Tensor: an array, its gradient, and the node that made it.

A Tensor wraps a NumPy or CuPy array (``.data``). When it takes part in a
computation that needs gradients, the op that produced it is remembered in
``.creator`` (a :class:`minidl.autograd.Function`), and ``backward()`` walks
those nodes in reverse to fill ``.grad`` of the leaves.

The arithmetic operators (``+ - * / ** @``), the NumPy-style methods
(``sum``, ``reshape``, ``relu``...) and indexing are attached to this class by
:mod:`minidl.ops` when minidl is imported: ops are the layer above, and this
module must not import it.
"""
from __future__ import annotations

import numpy as np

from minidl import backend

_FLOAT_KINDS = "fc"  # dtypes that can carry gradients: floating and complex
_DEFAULT_FLOAT = np.float32


class Tensor:
    """An n-dimensional array that can record how it was computed.

    ``data`` is the raw array (NumPy or CuPy); ``grad`` is a Tensor of the same
    shape after ``backward()`` (or None); ``creator`` is the Function that
    produced this tensor, None for a leaf.
    """

    __slots__ = ("data", "_grad", "_grad_owned", "requires_grad", "creator",
                 "output_index", "name", "retains_grad", "__weakref__")
    __array_priority__ = 1000  # ndarray + Tensor calls Tensor.__radd__

    def __init__(self, data, requires_grad: bool = False, name: str | None = None):
        if requires_grad and data.dtype.kind not in _FLOAT_KINDS:
            raise TypeError(
                f"only floating-point tensors can require gradients, got dtype {data.dtype}; "
                "convert first, e.g. mdl.tensor(x, dtype='float32', requires_grad=True)")
        self.data = data
        self._grad = None
        self._grad_owned = False  # True once .grad's buffer is ours to add into in place
        self.requires_grad = requires_grad
        self.creator = None
        self.output_index = 0
        self.name = name
        self.retains_grad = False

    # ------------------------------------------------------------ gradient
    @property
    def grad(self):
        """The accumulated gradient (a Tensor), or None before any backward."""
        return self._grad

    @grad.setter
    def grad(self, value):
        if value is not None and not isinstance(value, Tensor):
            value = Tensor(value)
        self._grad = value
        self._grad_owned = False

    @property
    def is_leaf(self) -> bool:
        return self.creator is None

    def retain_grad(self):
        """Keep ``.grad`` on this non-leaf tensor during backward (for inspection)."""
        self.retains_grad = True
        return self

    def backward(self, grad=None, retain_graph: bool | None = None, create_graph: bool = False):
        """Accumulate d(self)/d(leaf) into every leaf's ``.grad``.

        ``grad`` is the upstream gradient; it may be omitted only for a tensor
        with one element (a loss), where it is 1. ``retain_graph`` keeps the
        graph for a second backward; ``create_graph`` records the backward
        pass itself so that the gradients can be differentiated again (and
        then keeps the graph unless ``retain_graph=False``).
        """
        if retain_graph is None:
            retain_graph = create_graph
        from minidl.autograd import backward  # same layer; imported late to avoid a cycle
        backward([self], None if grad is None else [grad], retain_graph, create_graph)

    def detach(self) -> "Tensor":
        """The same data, cut from the graph (shares memory)."""
        return Tensor(self.data)

    def zero_grad(self):
        self.grad = None

    # ------------------------------------------------------------ array facts
    @property
    def shape(self) -> tuple:
        return self.data.shape

    @property
    def ndim(self) -> int:
        return self.data.ndim

    @property
    def size(self) -> int:
        return self.data.size

    @property
    def dtype(self):
        return self.data.dtype

    @property
    def device(self) -> str:
        return backend.device_of(self.data)

    @property
    def xp(self):
        """numpy or cupy, whichever holds this tensor's data."""
        return backend.xp_of(self.data)

    def __len__(self) -> int:
        return len(self.data)

    def numpy(self) -> np.ndarray:
        """The values as a NumPy array (copied from the GPU when needed)."""
        return backend.to_numpy(self.data)

    def item(self):
        """The value of a one-element tensor as a Python number."""
        if self.data.size != 1:
            raise ValueError(f"item(): tensor has {self.data.size} elements (shape {self.shape}); "
                             "only one-element tensors convert to a Python number")
        return self.data.item()

    def tolist(self):
        return self.numpy().tolist()

    def to(self, device) -> "Tensor":
        """A copy on ``device`` ('cpu', 'cuda', 'cuda:N'); gradients flow back through it."""
        from minidl.autograd import ToDevice  # same layer; late import avoids a cycle
        if backend.parse_device(device) == backend.parse_device(self.device):
            return self
        return ToDevice(device)(self)

    def cpu(self) -> "Tensor":
        return self.to("cpu")

    def cuda(self, index: int = 0) -> "Tensor":
        return self.to(f"cuda:{index}")

    def astype(self, dtype) -> "Tensor":
        """A copy converted to ``dtype``; gradients flow back converted to the source dtype."""
        from minidl.autograd import Cast
        if np.dtype(dtype).kind not in _FLOAT_KINDS:  # an integer or bool copy carries no gradient
            return Tensor(self.data.astype(dtype))
        return Cast(dtype)(self)

    def double(self) -> "Tensor":
        """float64 copy, as gradient checks want."""
        return self.astype(np.float64)

    # ------------------------------------------------------------ comparisons (no gradient)
    def _compare(self, other, op):
        other = other.data if isinstance(other, Tensor) else other
        return Tensor(op(self.data, other))

    def __eq__(self, other):
        return self._compare(other, lambda a, b: a == b)

    def __ne__(self, other):
        return self._compare(other, lambda a, b: a != b)

    def __lt__(self, other):
        return self._compare(other, lambda a, b: a < b)

    def __le__(self, other):
        return self._compare(other, lambda a, b: a <= b)

    def __gt__(self, other):
        return self._compare(other, lambda a, b: a > b)

    def __ge__(self, other):
        return self._compare(other, lambda a, b: a >= b)

    __hash__ = object.__hash__  # tensors are identities (dict keys), not values

    def __bool__(self):
        if self.data.size != 1:
            raise ValueError(f"the truth value of a tensor of shape {self.shape} is ambiguous; "
                             "use .any() or .all() on .data")
        return bool(self.data)

    def __float__(self):
        return float(self.item())

    def __repr__(self) -> str:
        body = np.array2string(self.numpy(), separator=", ", prefix="tensor(")
        extras = []
        if self.dtype != _DEFAULT_FLOAT:
            extras.append(f"dtype={self.dtype}")
        if self.device != "cpu":
            extras.append(f"device='{self.device}'")
        if self.creator is not None:
            extras.append(f"grad_fn={type(self.creator).__name__}")
        elif self.requires_grad:
            extras.append("requires_grad=True")
        return "tensor(" + ", ".join([body] + extras) + ")"


# ---------------------------------------------------------------- factories
def _dtype_for(data, dtype):
    """PyTorch's choice: Python floats become float32, arrays keep their dtype."""
    if dtype is not None:
        return np.dtype(dtype)
    if hasattr(data, "dtype"):
        return None
    kind = np.asarray(data).dtype.kind
    return np.dtype(_DEFAULT_FLOAT) if kind == "f" else None


def tensor(data, requires_grad: bool = False, device=None, dtype=None) -> Tensor:
    """A new leaf tensor holding a copy of ``data`` on ``device``.

    Python floats become float32; NumPy/CuPy arrays keep their dtype unless
    ``dtype`` is given. ``device`` defaults to where ``data`` already is.
    """
    if isinstance(data, Tensor):
        data = data.data
    if device is None:
        device = backend.device_of(data)
    xp = backend.xp_for(device)
    array = backend.to_device(data, device) if hasattr(data, "dtype") else data
    array = xp.array(array, dtype=_dtype_for(data, dtype), copy=True)
    return Tensor(array, requires_grad=requires_grad)


def as_tensor(value, like: Tensor | None = None) -> Tensor:
    """``value`` as a Tensor without copying; Python scalars take ``like``'s dtype family."""
    if isinstance(value, Tensor):
        return value
    if like is not None and isinstance(value, (int, float, bool)):
        dtype = like.data.dtype
        if dtype.kind == "f" and type(like.data) is np.ndarray and type(value) is not bool:
            # The common `x * 0.5` on the CPU: a NumPy scalar of x's own float dtype gives the
            # same result as the weak Python scalar, at a tenth of the cost of a 0-d array.
            return Tensor(dtype.type(value))
        dtype = np.result_type(dtype, value)  # NumPy 2: Python scalars are weak
        return Tensor(like.xp.asarray(value, dtype=dtype))
    if isinstance(value, (int, float, bool, list, tuple)):
        return Tensor(np.asarray(value, dtype=_dtype_for(value, None)))
    return Tensor(value)


def _make(fill, shape, dtype, device, requires_grad):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    xp = backend.xp_for(device)
    return Tensor(fill(xp, shape, np.dtype(dtype or _DEFAULT_FLOAT)), requires_grad=requires_grad)


def zeros(*shape, dtype=None, device="cpu", requires_grad=False) -> Tensor:
    return _make(lambda xp, s, d: xp.zeros(s, d), shape, dtype, device, requires_grad)


def ones(*shape, dtype=None, device="cpu", requires_grad=False) -> Tensor:
    return _make(lambda xp, s, d: xp.ones(s, d), shape, dtype, device, requires_grad)


def full(shape, value, dtype=None, device="cpu", requires_grad=False) -> Tensor:
    return _make(lambda xp, s, d: xp.full(s, value, d), (shape,), dtype, device, requires_grad)


def randn(*shape, dtype=None, device="cpu", requires_grad=False) -> Tensor:
    """Standard normal samples from minidl's seeded generator (see manual_seed)."""
    return _make(lambda xp, s, d: _drawn(backend.rng(device).standard_normal, s, d),
                 shape, dtype, device, requires_grad)


def rand(*shape, dtype=None, device="cpu", requires_grad=False) -> Tensor:
    """Uniform samples on [0, 1) from minidl's seeded generator."""
    def draw(xp, s, d):
        u = _drawn(backend.rng(device).random, s, d)
        # a float32 draw just below 1 can round up to 1 in float16: keep the interval half-open
        return u if d in (np.float32, np.float64) else xp.minimum(u, np.nextafter(d.type(1), d.type(0)))
    return _make(draw, shape, dtype, device, requires_grad)


def _drawn(sample, shape, dtype):
    """Generators draw float32 or float64 only; other dtypes (float16) are drawn as float32 and cast."""
    if dtype in (np.float32, np.float64):
        return sample(shape, dtype=dtype)
    return sample(shape, dtype=np.float32).astype(dtype)


def arange(start, stop=None, step=1, dtype=None, device="cpu") -> Tensor:
    xp = backend.xp_for(device)
    if stop is None:
        start, stop = 0, start
    return Tensor(xp.arange(start, stop, step, dtype=dtype))


def zeros_like(t: Tensor, dtype=None, requires_grad=False) -> Tensor:
    return Tensor(t.xp.zeros(t.shape, dtype or t.dtype), requires_grad=requires_grad)


def ones_like(t: Tensor, dtype=None, requires_grad=False) -> Tensor:
    return Tensor(t.xp.ones(t.shape, dtype or t.dtype), requires_grad=requires_grad)


def randn_like(t: Tensor, requires_grad=False) -> Tensor:
    return randn(*t.shape, dtype=t.dtype, device=t.device, requires_grad=requires_grad)


def rand_like(t: Tensor, requires_grad=False) -> Tensor:
    return rand(*t.shape, dtype=t.dtype, device=t.device, requires_grad=requires_grad)
