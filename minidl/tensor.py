"""Tensor: an array, its gradient, and the node that made it.

A Tensor wraps a NumPy or CuPy array (``.array``). When it takes part in a
computation that needs gradients, the op that produced it is remembered in
``.creator`` (a :class:`minidl.autograd.Function`), and ``backward()`` walks
those nodes in reverse to fill ``.grad`` of the leaves.

The arithmetic operators (``+ - * / ** @``), the NumPy-style methods
(``sum``, ``reshape``, ``relu``...) and indexing are attached to this class by
:mod:`minidl.ops` when minidl is imported: ops are the layer above, and this
module must not import it.
"""
from __future__ import annotations

import math
import operator

import numpy as np

from minidl import backend

_FLOAT_KINDS = "fc"  # dtypes that can carry gradients: floating and complex, and bfloat16 (below)
_DEFAULT_FLOAT = np.float32

# ---------------------------------------------------------------- in-place changes
# The mutation clock counts the in-place changes made through minidl. Each recorded op keeps
# the clock's value (its stamp); a backward that reads a saved tensor first checks that the
# tensor's buffer did not change after the stamp. Versions belong to buffers, not Tensors,
# so a change is seen through every view of the same memory (reshape, slices, detach), as
# PyTorch's views share their base's version counter.
_clock = [0]
_changed: dict = {}  # id of the array that owns a buffer -> clock value at its last change
_PRUNE_AT = 1 << 16  # entries kept before the oldest are forgotten


def _owner(array):
    """The object that owns ``array``'s memory: the end of its ``.base`` chain."""
    base = getattr(array, "base", None)
    while base is not None:
        array, base = base, getattr(base, "base", None)
    return array


def mark_changed(*tensors: "Tensor"):
    """Record that ``tensors`` were changed in place (an optimizer step, a load, a broadcast).

    A backward through an op that saved one of them, recorded before this call, then raises
    instead of computing a gradient from the new values. Ops and ``Tensor`` methods that
    change values in place call this; code that writes into ``t.array[...]`` directly should too.
    """
    _clock[0] += 1
    now = _clock[0]
    for t in tensors:
        _changed[id(_owner(t.array))] = now
    if len(_changed) > _PRUNE_AT:
        _forget_oldest()


def _forget_oldest():
    """Bound the table: drop the older half (a graph kept across that many changes is not checked)."""
    cut = sorted(_changed.values())[len(_changed) // 2]
    for key in [k for k, v in _changed.items() if v < cut]:
        del _changed[key]


def keep_version(t: "Tensor", version: int) -> None:
    """Give ``t``'s buffer the version ``version`` (from :func:`version_of`): for code that puts a
    tensor's unchanged values into a new buffer (ZeRO-3 gathers a freed weight again), so that the
    stamp of a freed buffer whose id the new one happens to reuse does not read as a change."""
    key = id(_owner(t.array))
    if version:
        _changed[key] = version
    else:
        _changed.pop(key, None)


def version_of(t: "Tensor") -> int:
    """The clock value at the last in-place change of ``t``'s buffer (0: none recorded).

    An id can be reused once its array is freed, so a fresh tensor may report an older
    value; that value is never newer than an op recorded on the tensor, so checks hold.
    """
    return _changed.get(id(_owner(t.array)), 0)


def _axis(dim, ndim: int, op: str) -> int:
    """``dim`` as a non-negative axis of an ``ndim``-axis tensor; IndexError when out of range, as PyTorch."""
    if not -ndim <= dim < ndim:
        raise IndexError(f"{op}: dimension {dim} is out of range for a tensor with {ndim} dimensions"
                         + (f" (expected {-ndim} to {ndim - 1})" if ndim else ""))
    return dim % ndim


# ---------------------------------------------------------------- index keys
def index_key(key):
    """``(key, select, index_tensors)`` for ``x[key]``, in PyTorch's order of indexing.

    Tensors in the key become their arrays and lists become arrays; ``index_tensors``
    are the integer and boolean Tensors of the key (an op that keeps them for backward
    checks their versions). ``select`` is None, or a basic key applied first: PyTorch
    applies integers before index arrays, so in ``x[1, :, idx]`` the integer only
    removes its axis and ``idx``'s axis stays where it is (shape (3, 2) for x of shape
    (2, 3, 4) and two indices). NumPy counts the integer as an index array too, and
    arrays separated by a slice move to the front (shape (2, 3)); minidl follows PyTorch.
    """
    if not isinstance(key, tuple):
        if isinstance(key, Tensor):
            return key._data, None, (key,)
        if isinstance(key, list):
            return np.asarray(key), None, ()
        return key, None, ()
    entries, tensors = [], []
    has_integer = has_array = False
    for k in key:
        if isinstance(k, Tensor):
            tensors.append(k)
            k = k._data
        elif isinstance(k, list):
            k = np.asarray(k)
        if isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_)):
            has_integer = True
        elif getattr(k, "ndim", 0):
            has_array = True
        entries.append(k)
    key = tuple(entries)
    if not (has_integer and has_array):
        return key, None, tuple(tensors)
    select, rest = [], []  # the integers (and slices for every other axis), then the rest
    for k in key:
        if isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_)):
            select.append(k)
        elif k is None or isinstance(k, (bool, np.bool_)):  # a new axis: no axis of x consumed
            rest.append(k)
        elif k is Ellipsis:
            select.append(k)
            rest.append(k)
        else:  # a slice or an index array: a boolean mask spans one axis per dimension
            select.extend([slice(None)] * (k.ndim if getattr(k, "dtype", None) == np.bool_ else 1))
            rest.append(k)
    return tuple(rest), tuple(select), tuple(tensors)


class Tensor:
    """An n-dimensional array that can record how it was computed.

    ``array`` is the raw array (NumPy or CuPy; ``data`` is PyTorch's detached view,
    a Tensor); ``grad`` is a Tensor of the same
    shape after ``backward()`` (or None); ``creator`` is the Function that
    produced this tensor, None for a leaf.
    """

    __slots__ = ("_data", "_grad", "_grad_owned", "requires_grad", "creator",
                 "output_index", "name", "retains_grad", "_hooks", "__weakref__")
    __array_priority__ = 1000  # ndarray + Tensor calls Tensor.__radd__

    def __init__(self, data, requires_grad: bool = False, name: str | None = None):
        if requires_grad and data.dtype.kind not in _FLOAT_KINDS and not backend.is_bfloat16(data.dtype):
            raise TypeError(
                f"only floating-point tensors can require gradients, got dtype {data.dtype}; "
                "convert first, e.g. mdl.tensor(x, dtype='float32', requires_grad=True)")
        self._data = data  # the slot itself: a new tensor is no in-place change
        self._grad = None
        self._grad_owned = False  # True once .grad's buffer is ours to add into in place
        self.requires_grad = requires_grad
        self.creator = None
        self.output_index = 0
        self.name = name
        self.retains_grad = False
        self._hooks = None  # gradient hooks (register_hook), None while there are none

    # ------------------------------------------------------------ values
    def _set_data(self, array):
        self._data = array
        mark_changed(self)

    # attrgetter, not a def: reading .array is on the hot path of every op
    array = property(operator.attrgetter("_data"), _set_data, doc="""The raw array (NumPy or CuPy), Chainer's name.

    minidl's own code reads and writes a tensor's values through ``.array``. Assigning to it
    (``t.array = a``, ``t.array -= u``) counts as an in-place change (see :func:`mark_changed`);
    writing into the array (``t.array[...] = a``) is not seen: use ``t.copy_(a)``, or call
    ``mark_changed(t)`` after the write.""")

    def _get_detached(self) -> "Tensor":
        return Tensor(self._data)

    def _set_from(self, value):
        self._set_data(value._data if isinstance(value, Tensor) else value)

    data = property(_get_detached, _set_from, doc="""PyTorch's ``.data``: a Tensor on the same storage, detached.

    Reading gives a new Tensor that shares this tensor's array, with ``requires_grad=False``
    and no creator, so ``p.data.add_(g, alpha=-lr)`` or ``p.data.copy_(w)`` change ``p``'s
    values in place and ``torch.max(out.data, 1)`` sees plain values. Assigning
    (``t.data = other``, a Tensor or an array) makes ``other``'s array this tensor's
    storage, as PyTorch's ``set_data`` does, and counts as an in-place change. The raw
    array is :attr:`array`; :meth:`numpy` is the host copy.

    One difference: minidl keeps versions per buffer, so a change made through ``.data``
    to a tensor that a recorded op saved is seen by that op's backward, which refuses to
    run (PyTorch would use the changed values without a word).""")

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

    def requires_grad_(self, requires_grad: bool = True) -> "Tensor":
        """Set ``requires_grad`` in place and return self: ``w = (mdl.randn(3) * 0.01).requires_grad_()``."""
        if requires_grad and not backend.is_floating(self._data.dtype):
            raise TypeError(f"requires_grad_(): only floating-point tensors can require gradients, got "
                            f"dtype {self.dtype}; convert first, e.g. t.astype('float32').requires_grad_()")
        if not requires_grad and self.creator is not None:
            raise RuntimeError("requires_grad_(False) on a tensor computed by an op: it is part of a graph; "
                               "use t.detach() for a copy cut from the graph")
        self.requires_grad = bool(requires_grad)
        return self

    def retain_grad(self):
        """Keep ``.grad`` on this non-leaf tensor during backward (for inspection).

        As in PyTorch, ``.grad`` gets the gradient after every hook of :meth:`register_hook`.
        """
        self.retains_grad = True
        return self

    @property
    def grad_fn(self):
        """The node that made this tensor (PyTorch's name for :attr:`creator`); None for a leaf."""
        return self.creator

    def register_hook(self, hook) -> "HookHandle":
        """Call ``hook(grad)`` with this tensor's gradient each time backward computes it.

        The gradient is the total over every use of the tensor; a hook that returns a
        Tensor (or array) replaces it for everything after: the next hooks, ``.grad``
        and the backward of the op that made the tensor. Hooks run in the order they were
        registered, as in PyTorch; ``handle.remove()`` takes one off.
        """
        if not self.requires_grad:
            raise RuntimeError(f"register_hook: this tensor (shape {self.shape}) does not require grad, so no "
                               "gradient will ever reach the hook; set requires_grad=True first")
        if not callable(hook):
            raise TypeError(f"register_hook: expected a function of the gradient, got {type(hook).__name__}")
        self._hooks = (self._hooks or ()) + (hook,)
        return HookHandle(self, hook)

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
        return Tensor(self.array)

    def clone(self) -> "Tensor":
        """A copy with its own memory; gradients flow back through it (an identity Cast)."""
        from minidl.autograd import Cast  # same layer; late import avoids a cycle
        return Cast(self.dtype)(self)

    def zero_grad(self):
        self.grad = None

    # ------------------------------------------------------------ in-place changes (not recorded)
    def copy_(self, src) -> "Tensor":
        """Copy ``src`` (a Tensor, array or number, broadcast to this shape) into this tensor."""
        self._check_inplace("copy_", src)
        array = src.array if isinstance(src, Tensor) else src
        if hasattr(array, "dtype"):
            array = backend.to_device(array, self.device)
        try:
            self._data[...] = array
        except ValueError:
            raise ValueError(f"copy_: cannot copy a value of shape {np.shape(array)} into a tensor of "
                             f"shape {self.shape}; the shapes must broadcast") from None
        mark_changed(self)
        return self

    def __setitem__(self, key, value):
        """``x[key] = value`` in place (value broadcast to ``x[key]``'s shape), as PyTorch.

        Allowed where the other in-place changes are (see :meth:`_check_inplace`); indexing
        follows PyTorch's order, as ``x[key]`` does (:func:`index_key`).
        """
        self._check_inplace("item assignment (x[key] = value)", value)
        key, select, _ = index_key(key)
        target = self._data if select is None else self._data[select]  # a view: writes reach x
        array = value.array if isinstance(value, Tensor) else value
        if hasattr(array, "dtype"):
            array = backend.to_device(array, self.device)
        try:
            target[key] = array
        except ValueError:
            raise ValueError(f"item assignment: a value of shape {np.shape(array)} can't be written into "
                             f"x[key] of shape {target[key].shape} (x has shape {self.shape}); the value "
                             "must broadcast to the indexed shape") from None
        mark_changed(self)

    def fill_(self, value) -> "Tensor":
        """Set every element to ``value``."""
        self._check_inplace("fill_")
        self._data.fill(value)
        mark_changed(self)
        return self

    def zero_(self) -> "Tensor":
        """Set every element to 0."""
        return self.fill_(0)

    # The augmented assignments change this tensor's own array, as PyTorch's do: the
    # textbook's ``p -= lr * p.grad`` under no_grad updates the parameter itself (without
    # them Python would bind ``p`` to a new tensor and the model would not change).
    def __iadd__(self, other) -> "Tensor":
        return self._update("+=", other, lambda a, b: a.__iadd__(b))

    def __isub__(self, other) -> "Tensor":
        return self._update("-=", other, lambda a, b: a.__isub__(b))

    def __imul__(self, other) -> "Tensor":
        return self._update("*=", other, lambda a, b: a.__imul__(b))

    def __itruediv__(self, other) -> "Tensor":
        return self._update("/=", other, lambda a, b: a.__itruediv__(b))

    def __ipow__(self, other) -> "Tensor":
        return self._update("**=", other, lambda a, b: a.__ipow__(b))

    def add_(self, other, alpha=1) -> "Tensor":
        """self ← self + alpha·other, in place."""
        return self._update("add_", other, lambda a, b: a.__iadd__(b if alpha == 1 else alpha * b))

    def sub_(self, other, alpha=1) -> "Tensor":
        return self._update("sub_", other, lambda a, b: a.__isub__(b if alpha == 1 else alpha * b))

    def mul_(self, other) -> "Tensor":
        return self._update("mul_", other, lambda a, b: a.__imul__(b))

    def div_(self, other) -> "Tensor":
        return self._update("div_", other, lambda a, b: a.__itruediv__(b))

    def pow_(self, other) -> "Tensor":
        return self._update("pow_", other, lambda a, b: a.__ipow__(b))

    def _update(self, name, other, apply):
        self._check_inplace(name, other)
        other = other.array if isinstance(other, Tensor) else other
        try:
            apply(self._data, other)
        except ValueError:
            raise ValueError(f"{name}: an operand of shape {np.shape(other)} does not broadcast to the "
                             f"tensor's shape {self.shape} (an in-place result keeps the tensor's shape)") from None
        except TypeError:  # NumPy's casting rule (and PyTorch's): the result must fit the tensor's dtype
            got = other.dtype if hasattr(other, "dtype") else type(other).__name__
            raise TypeError(f"{name}: the result of a {self.dtype} tensor and a {got} operand can't be stored "
                            f"in place in the {self.dtype} tensor; convert first (x = x.float()) or compute "
                            "out of place") from None
        mark_changed(self)
        return self

    def _check_inplace(self, name, other=None):
        """In-place changes are not recorded in the graph: refuse them where PyTorch would record one.

        PyTorch's rules: under no_grad anything may change in place; otherwise a leaf that
        requires grad may not (its gradient would describe values it no longer holds), and a
        change to a tensor of the graph, or by a value that requires grad, is recorded as an op,
        which minidl does not do: it refuses and names the out-of-place form.
        """
        from minidl import autograd  # same layer; imported late to avoid a cycle
        if not autograd.is_grad_enabled():
            return
        if self.requires_grad and self.creator is None:
            raise RuntimeError(
                f"{name}: in-place change of a leaf that requires grad (shape {self.shape}) while gradients "
                "are recorded; update parameters inside `with mdl.no_grad():`, as an optimizer does, or "
                "compute a new tensor out of place (x = x + y)")
        if self.requires_grad or (isinstance(other, Tensor) and other.requires_grad):
            whose = "of a tensor in a graph that requires grad" if self.requires_grad else \
                "by a value that requires grad"
            raise RuntimeError(
                f"{name}: in-place change {whose} (shape {self.shape}); minidl does not record in-place "
                "changes for backward: compute a new tensor out of place (x = x + y, "
                "x = mdl.where(mask, v, x)) or make the change inside `with mdl.no_grad():`")

    # ------------------------------------------------------------ array facts
    @property
    def shape(self) -> tuple:
        return self._data.shape

    @property
    def ndim(self) -> int:
        return self._data.ndim

    def size(self, dim: int | None = None):
        """The shape as a tuple, or the length of axis ``dim`` (PyTorch's ``size()``; NumPy's
        element count is :meth:`numel`)."""
        if dim is None:
            return self._data.shape
        return self._data.shape[_axis(dim, self.ndim, "size")]

    def numel(self) -> int:
        """The number of elements (the product of the shape)."""
        return self._data.size

    def dim(self) -> int:
        """The number of axes, as ``ndim``."""
        return self._data.ndim

    def is_floating_point(self) -> bool:
        """Whether the dtype is a floating-point one (float16/32/64, bfloat16), as PyTorch's:
        complex and integer dtypes answer False."""
        return self._data.dtype.kind == "f" or backend.is_bfloat16(self._data.dtype)

    @property
    def dtype(self):
        return self._data.dtype

    @property
    def device(self) -> "backend.device":
        """Where the data lives: a :class:`minidl.backend.device` (a str, ``'cpu'`` or ``'cuda:N'``,
        with PyTorch's ``.type`` and ``.index``)."""
        return backend.device_object(backend.device_of(self._data))

    @property
    def xp(self):
        """numpy or cupy, whichever holds this tensor's data."""
        return backend.xp_of(self._data)

    def __len__(self) -> int:
        return len(self.array)

    def numpy(self) -> np.ndarray:
        """The values as a NumPy array (copied from the GPU when needed)."""
        from minidl.autograd import announce_host_read  # same layer; imported late to avoid a cycle
        announce_host_read(self, "numpy()")
        return backend.to_numpy(self.array)

    def item(self):
        """The value of a one-element tensor as a Python number."""
        if self.array.size != 1:
            raise ValueError(f"item(): tensor has {self.array.size} elements (shape {self.shape}); "
                             "only one-element tensors convert to a Python number")
        from minidl.autograd import announce_host_read  # same layer; imported late to avoid a cycle
        announce_host_read(self, "item()")
        if backend._deferred:  # a host read: GPU range checks made since the last one report now
            backend.raise_deferred()
        return self.array.item()

    def tolist(self):
        return self.numpy().tolist()

    def to(self, *args, device=None, dtype=None, non_blocking=False, copy=False) -> "Tensor":
        """This tensor on another device and/or with another dtype; itself when nothing changes
        (unless ``copy``).

        As PyTorch: ``x.to('cuda')``, ``x.to(mdl.float64)``, ``x.to('cuda', mdl.float16)``,
        ``x.to(other)`` (other's device and dtype). Gradients flow back through both changes.
        ``non_blocking`` is accepted for ported code and changes nothing: copies are synchronous.
        A string is always a device, as in PyTorch (an unknown one raises, listing the valid ones);
        dtypes are given as dtypes (``mdl.float64``, ``np.float64``).
        """
        for arg in args:
            if isinstance(arg, Tensor):
                device, dtype = arg.device, arg.dtype
            elif isinstance(arg, str):
                device = arg
            elif arg is not None:
                dtype = arg
        out = self if dtype is None else self._converted(dtype)
        if device is not None and backend.parse_device(device) != backend.parse_device(out.device):
            from minidl.autograd import ToDevice  # same layer; late import avoids a cycle
            out = ToDevice(device)(out)
        return self.clone() if copy and out is self else out

    def cpu(self) -> "Tensor":
        return self.to("cpu")

    def cuda(self, index: int = 0) -> "Tensor":
        return self.to(f"cuda:{index}")

    def astype(self, dtype) -> "Tensor":
        """A copy converted to ``dtype``; gradients flow back converted to the source dtype."""
        from minidl.autograd import Cast
        if not backend.is_floating(np.dtype(dtype)):  # an integer or bool copy carries no gradient
            return Tensor(self.array.astype(dtype))
        return Cast(dtype)(self)

    def _converted(self, dtype) -> "Tensor":
        """Itself when already of ``dtype`` (as PyTorch's ``x.float()``), else a converted copy."""
        return self if self._data.dtype == np.dtype(dtype) else self.astype(dtype)

    def double(self) -> "Tensor":
        """As float64 (itself if it already is), as gradient checks want."""
        return self._converted(np.float64)

    def float(self) -> "Tensor":  # noqa: A003 - PyTorch's name
        """As float32 (itself if it already is)."""
        return self._converted(np.float32)

    def half(self) -> "Tensor":
        """As float16 (itself if it already is)."""
        return self._converted(np.float16)

    def long(self) -> "Tensor":
        """As int64 (itself if it already is); an integer tensor carries no gradient."""
        return self._converted(np.int64)

    def int(self) -> "Tensor":  # noqa: A003
        """As int32 (itself if it already is)."""
        return self._converted(np.int32)

    def bool(self) -> "Tensor":  # noqa: A003
        """As bool (itself if it already is): True where nonzero."""
        return self._converted(np.bool_)

    def type(self, dtype=None):  # noqa: A003
        """With ``dtype``: as :meth:`to` (itself if nothing changes). Without: the dtype's name, e.g.
        'float32' (PyTorch returns 'torch.FloatTensor'; minidl has no tensor types, only dtypes)."""
        if dtype is None:
            return str(self._data.dtype)
        return self._converted(dtype)

    # ------------------------------------------------------------ comparisons (no gradient)
    def _compare(self, other, op):
        other = other.array if isinstance(other, Tensor) else other
        return Tensor(op(self.array, other))

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
        if self.array.size != 1:
            raise ValueError(f"the truth value of a tensor of shape {self.shape} is ambiguous; "
                             "use t.any() or t.all()")
        from minidl.autograd import announce_host_read  # same layer; imported late to avoid a cycle
        announce_host_read(self, "bool()")
        if backend._deferred:
            backend.raise_deferred()
        return bool(self.array)

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __index__(self):
        """A one-element integer tensor as a Python int, so it can index or bound a slice (``x[:n]``)."""
        if self._data.dtype.kind not in "iu" or self._data.size != 1:
            raise TypeError(f"only integer tensors of a single element can be used as an index, got a "
                            f"{self.dtype} tensor of shape {self.shape}")
        return operator.index(self.item())

    def __format__(self, spec: str) -> str:
        """``f"{loss:.4f}"``: a one-element tensor formats as its number; a larger one only without a spec."""
        if self._data.size == 1 and self._data.ndim == 0:
            return format(self.item(), spec)
        if spec:
            raise TypeError(f"unsupported format string {spec!r} for a tensor of shape {self.shape}; format "
                            "t.item() for a single value, or t.tolist() element by element")
        return str(self)

    # PyTorch's method names for the comparisons (x.eq(y) is x == y) and a few facts
    eq, ne, lt, le, gt, ge = __eq__, __ne__, __lt__, __le__, __gt__, __ge__

    def nelement(self) -> int:
        """The number of elements (PyTorch's older name for :meth:`numel`)."""
        return self._data.size

    def ndimension(self) -> int:
        return self._data.ndim

    def element_size(self) -> int:
        """Bytes per element."""
        return self._data.dtype.itemsize

    def is_contiguous(self) -> bool:
        """True when the elements lie in memory in row-major order, with no gaps."""
        return bool(self._data.flags.c_contiguous)

    def type_as(self, other: "Tensor") -> "Tensor":
        """This tensor converted to ``other``'s dtype (itself when it already has it)."""
        return self._converted(other.dtype)

    # ------------------------------------------------------------ new tensors like this one
    def new_zeros(self, *size, dtype=None, device=None, requires_grad=False) -> "Tensor":
        """Zeros of ``size``, with this tensor's dtype and device unless given (PyTorch's ``new_zeros``)."""
        return self._new(zeros, size, dtype, device, requires_grad)

    def new_ones(self, *size, dtype=None, device=None, requires_grad=False) -> "Tensor":
        return self._new(ones, size, dtype, device, requires_grad)

    def new_empty(self, *size, dtype=None, device=None, requires_grad=False) -> "Tensor":
        return self._new(empty, size, dtype, device, requires_grad)

    def new_full(self, size, fill_value, dtype=None, device=None, requires_grad=False) -> "Tensor":
        return full(size, fill_value, dtype=dtype or self.dtype, device=device or self.device,
                    requires_grad=requires_grad)

    def new_tensor(self, data, dtype=None, device=None, requires_grad=False) -> "Tensor":
        """A copy of ``data`` with this tensor's dtype and device unless given."""
        return tensor(data, dtype=dtype or self.dtype, device=device or self.device, requires_grad=requires_grad)

    def _new(self, factory, size, dtype, device, requires_grad):
        return factory(*size, dtype=dtype or self.dtype, device=device or self.device, requires_grad=requires_grad)

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


class HookHandle:
    """What :meth:`Tensor.register_hook` returns: ``remove()`` takes that hook off the tensor."""

    def __init__(self, tensor: Tensor, hook):
        self._tensor, self._hook = tensor, hook

    def remove(self) -> None:
        hooks = list(self._tensor._hooks or ())
        if self._hook in hooks:
            hooks.remove(self._hook)
        self._tensor._hooks = tuple(hooks) or None


class Parameter(Tensor):
    """A Tensor that is a trainable parameter of a Module (``requires_grad=True`` by default).

    ``minidl.nn.Parameter``; defined here, beside Tensor, so that the tools below
    ``nn`` (the memory tracker) can tell parameters from activations.

    ``Parameter(t)`` shares ``t``'s array; ``Parameter(array)`` wraps the array itself.
    """

    def __init__(self, data=None, requires_grad: bool = True):
        if data is None:
            data = np.zeros((0,), np.float32)
        if isinstance(data, Tensor):
            data = data.array
        elif not hasattr(data, "dtype"):
            data = np.asarray(data, dtype=np.float32)
        super().__init__(data, requires_grad=requires_grad)

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()


# ---------------------------------------------------------------- factories
def _dtype_for(data, dtype):
    """PyTorch's choice: Python floats become float32, arrays keep their dtype."""
    if dtype is not None:
        return np.dtype(dtype)
    if hasattr(data, "dtype"):
        return None
    kind = np.asarray(data).dtype.kind
    return np.dtype(_DEFAULT_FLOAT) if kind == "f" else None


def is_tensor(obj) -> bool:
    """Whether ``obj`` is a Tensor (a Parameter included), as ``torch.is_tensor``."""
    return isinstance(obj, Tensor)


def _require_tensor(op: str, input) -> "Tensor":
    if not isinstance(input, Tensor):
        raise TypeError(f"{op}(): expected a Tensor, got {type(input).__name__}; "
                        "wrap it first with mdl.tensor(...)")
    return input


def numel(input: Tensor) -> int:
    """The number of elements of ``input`` (``torch.numel``)."""
    return _require_tensor("numel", input).numel()


def is_floating_point(input: Tensor) -> bool:
    """Whether ``input``'s dtype is floating-point (``torch.is_floating_point``)."""
    return _require_tensor("is_floating_point", input).is_floating_point()


def clone(input: Tensor) -> Tensor:
    """A copy of ``input`` with its own memory; gradients flow back through it (``torch.clone``)."""
    return _require_tensor("clone", input).clone()


def tensor(data, requires_grad: bool = False, device=None, dtype=None) -> Tensor:
    """A new leaf tensor holding a copy of ``data`` on ``device``.

    Python floats become float32; NumPy/CuPy arrays keep their dtype unless
    ``dtype`` is given. ``device`` defaults to where ``data`` already is.
    """
    if isinstance(data, Tensor):
        data = data.array
    if device is None:
        device = backend.device_of(data)
    xp = backend.xp_for(device)
    array = backend.to_device(data, device) if hasattr(data, "dtype") else data
    with backend.using(device):  # the copy is made on the current GPU: make it device's
        array = xp.array(array, dtype=_dtype_for(data, dtype), copy=True)
    return Tensor(array, requires_grad=requires_grad)


def as_tensor(value, like: Tensor | None = None) -> Tensor:
    """``value`` as a Tensor without copying; Python scalars take ``like``'s dtype family."""
    if isinstance(value, Tensor):
        return value
    if like is not None and isinstance(value, (int, float, bool)):
        dtype = like._data.dtype
        if dtype.kind == "f" and type(like._data) is np.ndarray and type(value) is not bool:
            # The common `x * 0.5` on the CPU: a NumPy scalar of x's own float dtype gives the
            # same result as the weak Python scalar, at a tenth of the cost of a 0-d array.
            return Tensor(dtype.type(value))
        dtype = np.result_type(dtype, value)  # NumPy 2: Python scalars are weak
        return Tensor(like.xp.asarray(value, dtype=dtype))
    if isinstance(value, (int, float, bool, complex, list, tuple)):
        array = np.asarray(value, dtype=_dtype_for(value, None))
    elif hasattr(value, "dtype") and hasattr(value, "shape"):  # NumPy/CuPy arrays and NumPy scalars
        array = value
    else:
        raise _operand_error(value, like)
    if getattr(array.dtype, "kind", None) not in tuple("biufc"):  # strings, objects, dates, other libraries
        raise _operand_error(value, like)
    return Tensor(array)


def _operand_error(value, like):
    shown = repr(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    module = type(value).__module__
    kind = type(value).__qualname__ if module == "builtins" else f"{module.split('.')[0]}.{type(value).__qualname__}"
    got = f"{'an' if kind[0] in 'aeiouAEIOU' else 'a'} {kind} ({shown})"
    if like is None:
        return TypeError(f"expected a Tensor, a NumPy/CuPy array or a number as an operand, got {got}")
    return TypeError(f"a tensor of shape {like.shape} ({like.dtype}) can't be combined with {got}: the "
                     "other operand of +, -, *, /, ** and the like must be a Tensor, an array or a number")


def _make(fill, shape, dtype, device, requires_grad):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    xp = backend.xp_for(device)
    with backend.using(device):
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
    """start, start + step, … below ``stop``. As torch.arange: integer arguments give int64,
    any float argument gives float32 (each value start + i·step computed in float64, then rounded once)."""
    xp = backend.xp_for(device)
    if stop is None:
        start, stop = 0, start
    if dtype is None:
        if any(np.result_type(v).kind == "f" for v in (start, stop, step)):
            if step == 0:
                raise ValueError("arange: step must not be zero")
            count = max(math.ceil((float(stop) - float(start)) / float(step)), 0)
            values = float(start) + xp.arange(count, dtype=np.float64) * float(step)
            return Tensor(values.astype(_DEFAULT_FLOAT))
        dtype = np.int64
    return Tensor(xp.arange(start, stop, step, dtype=dtype))


def zeros_like(t: Tensor, dtype=None, requires_grad=False) -> Tensor:
    return Tensor(t.xp.zeros(t.shape, dtype or t.dtype), requires_grad=requires_grad)


def ones_like(t: Tensor, dtype=None, requires_grad=False) -> Tensor:
    return Tensor(t.xp.ones(t.shape, dtype or t.dtype), requires_grad=requires_grad)


def randn_like(t: Tensor, requires_grad=False) -> Tensor:
    return randn(*t.shape, dtype=t.dtype, device=t.device, requires_grad=requires_grad)


def rand_like(t: Tensor, requires_grad=False) -> Tensor:
    return rand(*t.shape, dtype=t.dtype, device=t.device, requires_grad=requires_grad)


def full_like(t: Tensor, fill_value, dtype=None, requires_grad=False) -> Tensor:
    """A tensor of ``t``'s shape, device and dtype (unless given) filled with ``fill_value``."""
    return Tensor(t.xp.full(t.shape, fill_value, dtype or t.dtype), requires_grad=requires_grad)


def empty(*shape, dtype=None, device="cpu", requires_grad=False) -> Tensor:
    """A tensor whose values are whatever was in the memory it got: fill it before reading."""
    return _make(lambda xp, s, d: xp.empty(s, d), shape, dtype, device, requires_grad)


def empty_like(t: Tensor, dtype=None, requires_grad=False) -> Tensor:
    """:func:`empty` with ``t``'s shape, device and dtype (unless given)."""
    return Tensor(t.xp.empty(t.shape, dtype or t.dtype), requires_grad=requires_grad)


def eye(n: int, m: int | None = None, dtype=None, device="cpu", requires_grad=False) -> Tensor:
    """The n×m identity matrix (n×n when ``m`` is None): ones on the diagonal."""
    matrix = backend.xp_for(device).eye(n, m, dtype=np.dtype(dtype or _DEFAULT_FLOAT))
    return Tensor(matrix, requires_grad=requires_grad)


def linspace(start, end, steps: int, dtype=None, device="cpu", requires_grad=False) -> Tensor:
    """``steps`` evenly spaced values from ``start`` to ``end``, both included (float32 by default).

    Computed in float64 and rounded once to ``dtype`` (integer dtypes truncate, as PyTorch).
    """
    steps = _count("linspace", steps)
    values = backend.xp_for(device).linspace(float(start), float(end), steps, dtype=np.float64)
    return Tensor(values.astype(np.dtype(dtype or _DEFAULT_FLOAT)), requires_grad=requires_grad)


def logspace(start, end, steps: int, base: float = 10.0, dtype=None, device="cpu", requires_grad=False) -> Tensor:
    """``steps`` values base^t for t evenly spaced from ``start`` to ``end`` (float32 by default)."""
    steps = _count("logspace", steps)
    exponents = backend.xp_for(device).linspace(float(start), float(end), steps, dtype=np.float64)
    return Tensor((float(base) ** exponents).astype(np.dtype(dtype or _DEFAULT_FLOAT)), requires_grad=requires_grad)


def _count(op, steps):
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
        raise ValueError(f"{op}: steps must be a non-negative int, got {steps!r}")
    return int(steps)


def randint(low, high=None, size=None, dtype=None, device="cpu") -> Tensor:
    """Integers drawn uniformly from [low, high) by minidl's seeded generator (int64 by default).

    As torch.randint: ``randint(high, size)`` or ``randint(low, high, size)``, ``size`` a tuple.
    """
    if size is None and isinstance(high, (tuple, list)):  # randint(high, size)
        low, high, size = 0, low, high
    elif high is None:  # randint(high, size=...)
        low, high = 0, low
    if size is None:
        raise TypeError("randint: size is required, e.g. mdl.randint(0, 10, (3, 4))")
    size = (size,) if isinstance(size, (int, np.integer)) else tuple(size)
    if not int(low) < int(high):
        raise ValueError(f"randint: expected low < high, got low={low}, high={high}")
    values = backend.rng(device).integers(int(low), int(high), size=size, dtype=np.int64)
    return Tensor(values if dtype is None else values.astype(dtype))


def from_numpy(array: np.ndarray) -> Tensor:
    """A tensor that shares ``array``'s memory, as torch.from_numpy: a write to one shows in the other."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"from_numpy: expected a NumPy array, got {type(array).__name__}; "
                        "use mdl.tensor(data) for lists, numbers and CuPy arrays")
    if array.dtype.kind not in "biufc":
        raise TypeError(f"from_numpy: arrays of dtype {array.dtype} can't become tensors; "
                        "expected bool, integer, floating or complex values")
    return Tensor(array)
