"""Saving and loading state: ``mdl.save`` / ``mdl.load``, as ``torch.save`` / ``torch.load``.

Files are safetensors: a JSON header naming each array's dtype, shape and
byte range, then the raw bytes. ``f`` is a path or a binary file object.
State (arrays, step counts, learning rates, RNG states, nested dicts of
optimizer state) is stored without pickle: anything that is not an array
travels in the header's metadata as JSON, with each array replaced by a
reference to its tensor entry, so loading it reads numbers, never code, and a
flat ``{name: array}`` state dict is an ordinary safetensors file that other
tools read too. Any other object (a whole Module) is pickled as ``torch.save``
does, its arrays kept apart as tensor entries; loading it runs code from the
file, so :func:`load` refuses it unless given ``weights_only=False``.

Every array's CRC-32 is recorded in the metadata (``minidl.crc32``) and checked
on load, so bytes damaged in place (a disk, a copy) are a :class:`LoadError`
naming the tensor; files without checksums (from other libraries) load unchecked.

Arrays keep their dtype, bit for bit. bfloat16, which NumPy lacks, comes from
the optional ml_dtypes package (``pip install 'minidl[bf16]'``): it is stored
as safetensors' ``BF16`` and loads back as ``ml_dtypes.bfloat16``; without
ml_dtypes, loading a file that holds one raises a :class:`LoadError` naming
the file, the array and the package to install.

JSON has string keys and one kind of list, so three one-key objects mark what
it lacks, and ``load`` gives back exactly what ``save`` was given:

- ``{"__tensor__": "name"}``: the array stored under that name;
- ``{"__tuple__": [...]}``: a tuple (Adam's ``betas`` stay a tuple);
- ``{"__dict_items__": [[key, value], ...]}``: a dict with a key that is not a
  string (an optimizer's state is keyed by parameter position: ``{0: {...}}``),
  or whose string keys include one of these three marker names.

Every other dict is a plain JSON object. Keys may be strings, ints, floats,
bools, None and tuples of those.

Writing to a path goes to a temporary file in the same folder (``.tmp-XXXXXXXX<name>``,
created with the permissions the user's umask gives any new file) that is then
renamed over the target, so a crash leaves either the old file or the new
one, never half of one. A temporary left by a killed save of the same file is
removed by the next successful save.

Loading opens regular files only (a named pipe or a device is refused before
it is opened, so nothing blocks) and bounds what a header may cost: at most
``MAX_HEADER_BYTES`` of header, ``MAX_TENSORS`` arrays, ``MAX_JSON_VALUES``
JSON values and ``MAX_DEPTH`` levels of nesting. ``save`` refuses what
``load`` would refuse. Anything wrong with a file (missing, unopenable,
truncated, damaged, foreign, over a limit, needing ml_dtypes) raises a
:class:`LoadError`, both an ``OSError`` and a ``ValueError``, whose ``path``
is the file and whose message says what; nothing from the file is executed unless
``weights_only=False`` asks to unpickle it.
"""
from __future__ import annotations

import contextlib
import errno as errno_codes
import io
import json
import math
import os
import pickle
import re
import secrets
import stat
import struct
import time
import warnings
import zlib

import numpy as np

from minidl import backend
from minidl.tensor import Tensor

try:
    import fcntl
except ImportError:  # Windows: no advisory locks, but an open file cannot be removed there either
    fcntl = None

_STRUCTURE_KEY = "minidl.structure"
_CHECKSUM_KEY = "minidl.crc32"      # {tensor name: CRC-32 of its bytes as 8 hex digits}
_PICKLE_KEY = "minidl.pickle"       # the name of the uint8 tensor holding a pickle (whole objects)
_PICKLE_TYPE_KEY = "minidl.pickle.type"
_TENSOR, _TUPLE, _ITEMS = "__tensor__", "__tuple__", "__dict_items__"
_MARKERS = (_TENSOR, _TUPLE, _ITEMS)

MAX_HEADER_BYTES = 16 * 2**20   # the JSON header of a safetensors file (safetensors itself allows 100 MB)
MAX_TENSORS = 100_000           # arrays in one file
MAX_JSON_VALUES = 2_000_000     # values in the structure JSON: about a second and 200 MB to decode
MAX_DEPTH = 100                 # nesting of dicts, lists and tuples


def _over_limit(message: str, limit: int, then: str) -> ValueError:
    return ValueError(f"{message}, over the limit of {limit:,}; {then}")


class _NotPlain(TypeError):
    """A value the plain format cannot hold (a Module, an object, a frozenset key): it is pickled instead."""


def _encode(value, key, tensors, depth=0):
    """A JSON-able copy of ``value`` with arrays moved into ``tensors``; ``depth`` counts JSON levels."""
    where = key or "the top level"
    if depth > MAX_DEPTH:
        raise ValueError(f"save: the value is nested more than {MAX_DEPTH} levels deep at {where} "
                         "(a dict or list that contains itself?)")
    if isinstance(value, Tensor):
        value = value.array
    if isinstance(value, np.ndarray) or hasattr(value, "__array_namespace__") or backend.is_device_array(value):
        array = backend.to_numpy(value)
        name = _unique_name(key or "tensor", tensors)
        tensors[name] = np.ascontiguousarray(array).reshape(array.shape)  # ascontiguousarray makes 0-d 1-d
        return {_TENSOR: name}
    if isinstance(value, dict):
        keys = [_encode_key(k, where, depth + 3) for k in value]
        if all(isinstance(k, str) for k in keys) and not any(m in value for m in _MARKERS):
            return {k: _encode(v, f"{key}.{k}" if key else k, tensors, depth + 1) for k, v in value.items()}
        # {"__dict_items__": [[key, value], ...]}: each value sits three JSON levels down
        return {_ITEMS: [[k, _encode(v, f"{key}.{_key_text(k)}" if key else _key_text(k), tensors, depth + 3)]
                         for k, v in zip(keys, value.values())]}
    if isinstance(value, tuple):
        return {_TUPLE: [_encode(v, f"{key}.{i}" if key else str(i), tensors, depth + 2)
                         for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, f"{key}.{i}" if key else str(i), tensors, depth + 1) for i, v in enumerate(value)]
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise _NotPlain(f"save: cannot store a {type(value).__name__} at {where} without pickle")


def _encode_key(k, where, depth):
    """A dict key as JSON: strings, numbers, bools and None as they are, tuples marked."""
    if isinstance(k, np.generic):
        k = k.item()
    if k is None or isinstance(k, (str, bool, int, float)):
        return k
    if isinstance(k, tuple):
        if depth > MAX_DEPTH:
            raise ValueError(f"save: a dictionary key at {where} is nested more than {MAX_DEPTH} levels deep")
        return {_TUPLE: [_encode_key(v, where, depth + 2) for v in k]}
    raise _NotPlain(f"save: cannot store the dictionary key {short_repr(k)} ({type(k).__name__}) at {where} "
                    "without pickle")


def _key_text(k) -> str:
    if isinstance(k, dict):  # an encoded tuple key
        return "(" + ",".join(_key_text(v) for v in k[_TUPLE]) + ")"
    return str(k)


def _unique_name(name: str, tensors: dict) -> str:
    """``name``, or ``name~1``, ``name~2``... when two paths spell the same name ({"a.b": x, "a": {"b": y}})."""
    if name not in tensors and name != "__metadata__":
        return name
    n = 1
    while f"{name}~{n}" in tensors:
        n += 1
    return f"{name}~{n}"


class _Damaged(ValueError):
    """A structure that :func:`save` cannot have written."""


def _decode(value, tensors, depth=0):
    if depth > MAX_DEPTH:
        raise _Damaged(f"nested more than {MAX_DEPTH} levels deep")
    if isinstance(value, list):
        return [_decode(v, tensors, depth + 1) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        (marker, inner), = value.items()
        if marker == _TENSOR:
            if not isinstance(inner, str) or inner not in tensors:
                raise _Damaged(f"a tensor reference {short_repr(inner)} names no tensor of the file")
            return tensors[inner]
        if marker == _TUPLE:
            if not isinstance(inner, list):
                raise _Damaged(f"a tuple marker holds {short_repr(inner)}, not a list")
            return tuple(_decode(v, tensors, depth + 2) for v in inner)
        if marker == _ITEMS:
            return _decode_items(inner, tensors, depth)
    return {k: _decode(v, tensors, depth + 1) for k, v in value.items()}


def _decode_items(items, tensors, depth):
    if not isinstance(items, list) or not all(isinstance(kv, list) and len(kv) == 2 for kv in items):
        raise _Damaged(f"a dict-items marker holds {short_repr(items)}, not a list of [key, value] pairs")
    out = {}
    for k, v in items:
        key = _decode_key(k, depth + 3)
        if key in out:
            raise _Damaged(f"the key {short_repr(key)} appears twice in one dict")
        out[key] = _decode(v, tensors, depth + 3)
    return out


def _decode_key(k, depth):
    if k is None or isinstance(k, (str, bool, int, float)):
        return k
    if isinstance(k, dict) and len(k) == 1 and isinstance(k.get(_TUPLE), list):
        if depth > MAX_DEPTH:
            raise _Damaged(f"nested more than {MAX_DEPTH} levels deep")
        return tuple(_decode_key(v, depth + 2) for v in k[_TUPLE])
    raise _Damaged(f"a dict key {short_repr(k)} is not a string, number, bool, None or tuple")


# ---------------------------------------------------------------- helpers of the modules that write or check state
def short_repr(value, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters (then "..."): a damaged value named in an error message."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."



def is_number(value) -> bool:
    """Is ``value`` a real number: a Python or NumPy int or float, not a bool?"""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def plain(value, *, strict: bool = False, other=None):
    """A plain Python copy of one value, for JSON and CSV: a NumPy scalar becomes the number or bool it holds,
    a tuple or a set a list.

    ``strict``: a NaN or infinite float becomes None (strict JSON has no NaN). ``other``: a function for a
    value of any other type (``str``, as ``json.dump``'s ``default=``, which must not return what it got);
    without it such a value is returned as it is.
    """
    if isinstance(value, np.generic):
        value = value.item()
    elif isinstance(value, (tuple, set)):
        return list(value)
    elif other is not None and not isinstance(value, (int, float, str, bool, type(None), list, dict)):
        return other(value)
    if strict and isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _count_json_values(text: str) -> int:
    """An upper bound on the values in a JSON text, counted without parsing it."""
    return text.count(",") + text.count("[") + text.count("{") + 1


_TEMPORARY_LETTERS = "abcdefghijklmnopqrstuvwxyz0123456789_"


def _temporary_pattern(name: str):
    """The names :func:`atomic_write` gives temporaries of ``name``: ``.tmp-`` + 8 letters + ``name``."""
    return re.compile(r"\.tmp-[a-z0-9_]{8}" + re.escape(name) + r"\Z")


def _create_temporary(folder: str, name: str):
    """A new, empty, locked temporary beside the target: (its path, its open descriptor or None).

    ``os.open`` with mode 0o666 lets the umask decide the permissions, as for
    any new file (``tempfile.mkstemp`` would make it 0600). The lock marks it
    as in use, so a concurrent save never removes it as stale.
    """
    while True:
        tmp = os.path.join(folder, ".tmp-" + "".join(secrets.choice(_TEMPORARY_LETTERS) for _ in range(8)) + name)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        except FileExistsError:
            continue
        if fcntl is None:  # Windows renames no open file: close it at once
            os.close(fd)
            return tmp, None
        fcntl.flock(fd, fcntl.LOCK_EX)
        return tmp, fd


def _in_use(path: str) -> bool:
    """Does a running save hold ``path`` (see :func:`_create_temporary`)?"""
    if fcntl is None:
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def _remove_stale_temporaries(folder: str, name: str, started: float) -> None:
    """Remove temporaries of ``name`` that a killed save left: older than this save, held by no one."""
    pattern = _temporary_pattern(name)
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        if not pattern.match(entry.name):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
            if stat.S_ISREG(info.st_mode) and info.st_mtime < started and not _in_use(entry.path):
                os.remove(entry.path)
        except OSError:  # gone already, or not ours to remove
            continue


def _flush_to_disk(path: str) -> None:
    """fsync ``path``, so that the rename below can never expose a file whose bytes are still in memory."""
    fd = os.open(path, os.O_RDWR | getattr(os, "O_BINARY", 0))  # Windows commits only writable handles
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path, write_to):
    """Call ``write_to(temporary_path)``, then rename the result over ``path``.

    A write that fails (an ``OSError``, such as a full disk's ENOSPC) leaves
    ``path`` as it was, removes the temporary, and is raised with ``path`` as
    its ``filename`` when the operating system named no file.

    The temporary is created in the target's folder with the permissions the
    umask gives a new file. After the rename, temporaries of the same target
    that an earlier, killed save left behind are removed (only names this
    function creates, only ones older than this save and locked by no process).
    """
    path = os.fspath(path)
    folder, name = os.path.split(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    started = time.time()
    tmp, fd = _create_temporary(folder, name)
    try:
        write_to(tmp)
        _flush_to_disk(tmp)
        os.replace(tmp, path)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.remove(tmp)
        if isinstance(exc, OSError) and exc.errno is not None and exc.filename is None:
            # a failed write (a full disk) names no file: name the one being written, for the user's message
            raise type(exc)(exc.errno, exc.strerror or os.strerror(exc.errno), path) from None
        raise
    finally:
        if fd is not None:
            os.close(fd)
    _remove_stale_temporaries(folder, name, started)


_DTYPE_CODES = {np.dtype(t): code for t, code in (
    (np.float64, "F64"), (np.float32, "F32"), (np.float16, "F16"), (np.int64, "I64"), (np.uint64, "U64"),
    (np.int32, "I32"), (np.uint32, "U32"), (np.int16, "I16"), (np.uint16, "U16"), (np.int8, "I8"),
    (np.uint8, "U8"), (np.bool_, "BOOL"), (np.complex64, "C64"))}
_BF16 = "BF16"  # bfloat16, which NumPy lacks: the ml_dtypes package provides it (see _bfloat16)


def _dtype_code(dtype) -> str | None:
    """The safetensors code of ``dtype`` (any byte order), or None when safetensors has none for it."""
    if backend.is_bfloat16(dtype):
        return _BF16
    return _DTYPE_CODES.get(dtype.newbyteorder("="))


def _bfloat16(path: str, name: str):
    """ml_dtypes' bfloat16, to read the BF16 array ``name`` of ``path``; an ImportError that says how to get it."""
    return backend.bfloat16(f"load: {path} holds the bfloat16 (BF16) array {name!r}; reading it", ImportError,
                            ". Nothing was read.")


_CODE_DTYPES = {code: dtype.newbyteorder("<") for dtype, code in _DTYPE_CODES.items()}


def _checksum(array) -> str:
    """The CRC-32 of ``array``'s bytes as the file holds them (little-endian), as 8 hex digits.

    CRC-32 (zlib's, about 1 GB/s) finds every burst of damage up to 32 bits and any other with
    probability 1 - 2⁻³²; it guards against disks and copies, not against someone who edits the file.
    """
    array = np.ascontiguousarray(array)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return f"{zlib.crc32(array.reshape(-1).view(np.uint8)):08x}"


def _safetensors_header(tensors: dict, metadata: dict) -> bytes:
    """The 8-byte length and the JSON header of a safetensors file holding ``tensors`` in order.

    The format: a little-endian u64 N, N bytes of JSON (``{name: {"dtype",
    "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}``,
    padded with spaces to a multiple of 8), then the arrays' bytes back to back.
    The metadata gets the CRC-32 of every array (``minidl.crc32``), which :func:`load` checks.
    """
    header, offset = {}, 0
    for name, array in tensors.items():
        code = _dtype_code(array.dtype)
        if code is None:
            raise TypeError(f"save: cannot store the {array.dtype} array {name!r}; safetensors holds "
                            f"{', '.join(str(d) for d in _DTYPE_CODES)} and bfloat16 (from ml_dtypes)")
        header[name] = {"dtype": code, "shape": list(array.shape), "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    metadata = {**metadata, _CHECKSUM_KEY: json.dumps({name: _checksum(a) for name, a in tensors.items()},
                                                      separators=(",", ":"))}
    header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    if len(text) > MAX_HEADER_BYTES:
        raise _over_limit(f"save: the safetensors header would be {len(text):,} bytes", MAX_HEADER_BYTES,
                          "load refuses such files; store long lists of numbers as NumPy arrays, or save "
                          "in several files")
    return struct.pack("<Q", len(text)) + text


# ---------------------------------------------------------------- whole objects (pickle), as torch.save
class _ArrayPickler(pickle.Pickler):
    """A pickler that moves every NumPy/CuPy array safetensors can hold out of the pickle, into ``tensors``.

    PyTorch's ``torch.save`` does the same with its storages (``persistent_id``): the pickle keeps
    the objects' structure, the arrays stay raw bytes with their checksums. An array met twice is
    stored once (views of one buffer are stored apart, unlike PyTorch's shared storages).
    """

    def __init__(self, file, tensors: dict):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.tensors = tensors
        self.stored = {}  # id(array) -> (name, array): the array kept alive so that its id stays its own

    def persistent_id(self, obj):
        if not (isinstance(obj, np.ndarray) or backend.is_device_array(obj)):
            return None
        array = backend.to_numpy(obj)
        if _dtype_code(array.dtype) is None:  # object, string or complex128 arrays: pickled as they are
            return None
        if id(obj) not in self.stored:
            name = f"pickled.{len(self.stored)}"
            self.stored[id(obj)] = (name, obj)
            little = array if array.dtype.byteorder != ">" else array.astype(array.dtype.newbyteorder("<"))
            self.tensors[name] = np.ascontiguousarray(little).reshape(array.shape)
        return ("array", self.stored[id(obj)][0])


class _ArrayUnpickler(pickle.Unpickler):
    """The pickle of :class:`_ArrayPickler` read back with its arrays taken from ``tensors``."""

    def __init__(self, file, tensors: dict):
        super().__init__(file)
        self.tensors = tensors

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 2 and pid[0] == "array" and pid[1] in self.tensors):
            raise pickle.UnpicklingError(f"a reference {short_repr(pid)} names no array of the file")
        return self.tensors[pid[1]]


def _pickled(obj, tensors: dict) -> dict:
    """Pickle ``obj`` with its arrays moved into ``tensors``; the metadata that says so."""
    buffer = io.BytesIO()
    try:
        _ArrayPickler(buffer, tensors).dump(obj)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        raise TypeError(f"save: cannot store the {type(obj).__name__}: it holds something pickle refuses "
                        f"({_clip(str(exc))}); save its state_dict() instead, or what it holds in arrays, "
                        "numbers, strings, lists, tuples and dicts") from None
    name = "__pickle__"
    tensors[name] = np.frombuffer(buffer.getbuffer(), np.uint8)
    return {_PICKLE_KEY: name, _PICKLE_TYPE_KEY: f"{type(obj).__module__}.{type(obj).__qualname__}"}


def _contents(obj) -> tuple[dict, dict]:
    """The arrays and the metadata of the file that stores ``obj``.

    State dicts and any nesting of arrays, numbers, strings, None, lists, tuples and dicts
    are stored without pickle (the structure as JSON in the metadata); anything else (a whole
    Module, an object of the user's) is pickled as ``torch.save`` does, arrays apart.
    """
    tensors: dict[str, np.ndarray] = {}
    try:
        structure = json.dumps(_encode(obj, "", tensors))
    except _NotPlain:
        tensors = {}
        metadata = _pickled(obj, tensors)
    else:
        if _count_json_values(structure) > MAX_JSON_VALUES:
            raise _over_limit(f"save: the value holds about {_count_json_values(structure):,} numbers, strings "
                              "and containers besides arrays", MAX_JSON_VALUES,
                              "load refuses such files; store long lists of numbers as NumPy arrays")
        metadata = {_STRUCTURE_KEY: structure}
    if len(tensors) > MAX_TENSORS:
        raise _over_limit(f"save: the value holds {len(tensors):,} arrays", MAX_TENSORS,
                          "load refuses such files; save the state in several files")
    tensors = {name: a if a.dtype.byteorder != ">" else a.astype(a.dtype.newbyteorder("<"))
               for name, a in tensors.items()}
    return tensors, metadata


def _is_file_object(f, mode: str) -> bool:
    return callable(getattr(f, mode, None)) and not isinstance(f, (str, bytes, os.PathLike))


def save(obj, f) -> None:
    """Write ``obj`` to ``f``, a path or a binary file object (``open(path, "wb")``, ``io.BytesIO()``).

    A state dict (or any nesting of dicts, lists, tuples, arrays, Tensors, numbers, strings,
    None) is stored without pickle; any other object (a whole Module, as ``torch.save(model, f)``)
    is pickled with its arrays kept as raw bytes, and :func:`load` gives it back only with
    ``weights_only=False``. Either way the file is safetensors, and its metadata holds the CRC-32
    of every array, which :func:`load` checks.

    A path is written atomically (a temporary, then a rename); a file object is written at its
    position, as ``torch.save`` does. Raises TypeError for a value that cannot be stored (an
    object pickle refuses) and ValueError for one over the limits :func:`load` enforces; the file
    at a path is then left as it was.
    """
    writer = _is_file_object(f, "write")
    if not writer and not isinstance(f, (str, bytes, os.PathLike)):
        raise TypeError(f"save: f must be a path or a binary file object opened for writing "
                        f"(open(path, 'wb')); got a {type(f).__name__}")
    if isinstance(f, io.TextIOBase):
        raise TypeError(f"save: the file {getattr(f, 'name', '')!r} is open in text mode; open it in binary "
                        "mode: open(path, 'wb')")
    tensors, metadata = _contents(obj)
    head = _safetensors_header(tensors, metadata)

    def write_all(stream):
        stream.write(head)
        for array in tensors.values():
            stream.write(array.reshape(-1).view(np.uint8).data)

    if writer:
        write_all(f)
        return

    def write(tmp):
        with open(tmp, "wb") as stream:
            write_all(stream)

    atomic_write(f, write)


def _not_regular(path: str) -> str:
    return f"load: {path} is not a regular file (a folder, a pipe or a device); it was not read"


def _open_regular(path: str):
    """``path`` opened for reading in binary, or a ValueError when it is not a regular file."""
    # O_NONBLOCK: should a pipe take the file's place after a check, opening it still returns at once.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError(_not_regular(path))
    return open(fd, "rb")


def _read_header(path: str) -> tuple[dict, dict, int]:
    """The metadata and the header of the safetensors file at ``path``, and where its array bytes start."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"load: no file at {path}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(_not_regular(path))
    with _open_regular(path) as f:
        return _parse_header(f, info.st_size, path)


def _parse_header(f, size: int, path: str) -> tuple[dict, dict, int]:
    """The metadata and the header read from the binary stream ``f`` of ``size`` bytes, at its start.

    Only what reading the file would cost is checked here; ``safe_open`` (or ``deserialize``) checks the rest.
    """
    prefix = f.read(8)
    if len(prefix) < 8:
        raise ValueError(f"load: {path} is not a complete safetensors file ({size} bytes); "
                         "it may be truncated or of another format. Nothing was executed.")
    (header_bytes,) = struct.unpack("<Q", prefix)
    if header_bytes > size - 8:
        raise ValueError(f"load: {path} is not a complete safetensors file (its first 8 bytes announce a "
                         f"header of {header_bytes:,} bytes, the file has {size:,}); it may be "
                         "truncated or of another format. Nothing was executed.")
    if header_bytes > MAX_HEADER_BYTES:
        raise _over_limit(f"load: {path} has a safetensors header of {header_bytes:,} bytes",
                          MAX_HEADER_BYTES, "it was not read. Nothing was executed.")
    raw = f.read(header_bytes)
    try:
        header = json.loads(raw)
    except RecursionError:
        raise ValueError(f"load: {path} has a damaged safetensors header (nested too deeply). "
                         "Nothing was executed.") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"load: {path} has a damaged safetensors header ({_clip(str(exc))}). "
                         "Nothing was executed.") from None
    if not isinstance(header, dict):
        raise ValueError(f"load: {path} has a damaged safetensors header (not a JSON object)")
    arrays = len(header) - ("__metadata__" in header)
    if arrays > MAX_TENSORS:
        raise _over_limit(f"load: {path} holds {arrays:,} arrays", MAX_TENSORS,
                          "it was not read. Nothing was executed.")
    metadata = header.get("__metadata__") or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError(f"load: {path} has a damaged safetensors header (its metadata is not text)")
    return metadata, header, 8 + header_bytes


def _read_bfloat16(file, entry: dict, data_start: int, dtype):
    """The BF16 array of header ``entry``, its bytes read from the open ``file`` as they are.

    Read here rather than by ``safe_open``, whose NumPy reader maps BF16 to a dtype by name
    differently across safetensors versions. ``safe_open`` has checked the entry: its offsets are
    in bounds and span as many bytes as its shape holds.
    """
    begin, end = entry["data_offsets"]
    file.seek(data_start + begin)
    raw = bytearray(file.read(end - begin))  # a bytearray: the array is writable, as get_tensor's are
    if len(raw) != end - begin:
        raise OSError(f"the file ended {end - begin - len(raw)} bytes early")
    return np.frombuffer(raw, dtype=dtype).reshape(entry["shape"])  # the file's little-endian words


class LoadError(OSError, ValueError):
    """A file :func:`load` cannot read: missing, unreadable, damaged, over a limit, or needing a package.

    Both an ``OSError`` and a ``ValueError``, so either ``except`` catches it; ``path`` is the
    file, and the message (one line) names it and says what is wrong.
    """

    def __init__(self, message: str, path: str):
        super().__init__(message)
        self.path = path


class MissingFileError(LoadError, FileNotFoundError):
    """No file at the path given to :func:`load` (a ``FileNotFoundError`` too)."""


def load(f, device="cpu", *, map_location=None, weights_only=True):
    """Read what :func:`save` wrote (or any safetensors file) from ``f``, with arrays on ``device``.

    ``f`` is a path or a binary file object (``open(path, "rb")``, ``io.BytesIO``), read from its
    position. PyTorch's keywords are accepted: ``map_location`` (a device name or ``mdl.device``)
    is ``device``. A file holding a pickled object (a whole Module saved with :func:`save`) is
    refused unless ``weights_only=False``, as ``torch.load`` does since PyTorch 2.6: unpickling can
    run any code the file holds, so give ``weights_only=False`` only for files you trust (a
    warning says so each time one is unpickled). State dicts never need it.

    Every array's bytes are checked against the CRC-32 that :func:`save` wrote in the metadata;
    files without checksums (safetensors written by other libraries) load unchecked.

    Every failure to read the file is a :class:`LoadError` (an ``OSError`` and a
    ``ValueError``) carrying ``path``: no file (:class:`MissingFileError`, a
    ``FileNotFoundError`` too), a path the system cannot open (a symlink loop,
    no permission), anything that is not a complete, undamaged safetensors
    file within the limits (see the module docstring), an array whose bytes fail their
    checksum (the message names it), a pickled object without ``weights_only=False``, and a
    bfloat16 (BF16) array without the ml_dtypes package (the message says how to install it).
    Loading a BF16 array onto a GPU raises TypeError (CuPy has no bfloat16).
    """
    if map_location is not None:
        if callable(map_location) or isinstance(map_location, dict):
            raise TypeError("load: map_location must name one device ('cpu', 'cuda', 'cuda:1' or mdl.device); "
                            f"got {type(map_location).__name__}, a mapping minidl does not support")
        device = map_location
    reader = _is_file_object(f, "read")
    if not reader and not isinstance(f, (str, bytes, os.PathLike)):
        raise TypeError(f"load: f must be a path or a binary file object opened for reading "
                        f"(open(path, 'rb')); got a {type(f).__name__}")
    path = _file_name(f) if reader else os.fspath(f)
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    try:
        metadata, tensors = _read_file(f, path, device) if reader else _read_path(path, device)
        return _rebuild(metadata, tensors, path, weights_only)
    except LoadError:
        raise
    except FileNotFoundError as exc:
        raise MissingFileError(str(exc) if str(exc).startswith("load:") else f"load: no file at {path}",
                               path) from None
    except ImportError as exc:  # a BF16 array without ml_dtypes
        raise LoadError(str(exc), path) from None
    except ValueError as exc:
        raise LoadError(str(exc), path) from None
    except OSError as exc:  # a symlink loop, no permission, a name too long, a folder on the way that is a file
        code = errno_codes.errorcode.get(exc.errno, "") if exc.errno else ""
        raise LoadError(f"load: cannot open {path}: {exc.strerror or exc}"
                        + (f" (errno {exc.errno}, {code})" if code else ""), path) from None


def _file_name(f) -> str:
    name = getattr(f, "name", None)
    return name if isinstance(name, str) else f"the {type(f).__name__} file object"


def _check_bfloat16(header: dict, path: str, device):
    """ml_dtypes' bfloat16 when the file holds BF16 arrays (refused on a GPU), else None."""
    name = next((name for name, entry in header.items()
                 if name != "__metadata__" and isinstance(entry, dict) and entry.get("dtype") == _BF16), None)
    if name is None:
        return None
    dtype = _bfloat16(path, name)
    if backend.parse_device(device)[0] != "cpu":
        raise TypeError(f"load: {path} holds the bfloat16 array {name!r}, and CuPy has no bfloat16 arrays; "
                        f"load it on the CPU (device='cpu') and cast it to float16 or float32 for {device!r}")
    return dtype


def _incomplete(path: str, exc) -> ValueError:
    return ValueError(f"load: {path} is not a complete safetensors file ({_clip(str(exc))}); "
                      "it may be truncated or of another format. Nothing was executed.")


def _read_path(path: str, device) -> tuple[dict, dict]:
    """The metadata and the checked arrays (on ``device``) of the safetensors file at ``path``."""
    from safetensors import SafetensorError, safe_open

    metadata, header, data_start = _read_header(path)
    _check_structure_size(metadata, path)
    bfloat16 = _check_bfloat16(header, path, device)
    try:
        with (safe_open(path, framework="np") as f,  # opening it checks every entry's dtype, shape and offsets
              _open_regular(path) if bfloat16 is not None else contextlib.nullcontext() as raw):
            arrays = {k: _read_bfloat16(raw, header[k], data_start, bfloat16)
                      if header[k].get("dtype") == _BF16 else f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError, ValueError, TypeError, OverflowError) as exc:
        raise _incomplete(path, exc) from None
    _verify_checksums(metadata, arrays, path)
    return metadata, {k: backend.to_device(a, device) for k, a in arrays.items()}


def _read_file(f, path: str, device) -> tuple[dict, dict]:
    """The metadata and the checked arrays (on ``device``) of the safetensors bytes read from ``f``."""
    from safetensors import SafetensorError, deserialize

    data = f.read()
    if isinstance(data, str):
        raise TypeError(f"load: {path} is open in text mode; open it in binary mode: open(path, 'rb')")
    metadata, header, _ = _parse_header(io.BytesIO(data), len(data), path)
    _check_structure_size(metadata, path)
    bfloat16 = _check_bfloat16(header, path, device)
    try:
        entries = deserialize(bytes(data))  # checks every entry's dtype, shape and offsets
    except (SafetensorError, OSError, ValueError, TypeError, OverflowError) as exc:
        raise _incomplete(path, exc) from None
    arrays = {}
    for name, entry in entries:
        dtype = bfloat16 if entry["dtype"] == _BF16 else _CODE_DTYPES.get(entry["dtype"])
        if dtype is None:
            raise ValueError(f"load: {path} holds the array {name!r} of safetensors dtype {entry['dtype']}, "
                             f"which minidl does not read (it reads {', '.join(_CODE_DTYPES)} and BF16)")
        arrays[name] = np.frombuffer(entry["data"], dtype=dtype).reshape(entry["shape"])
    _verify_checksums(metadata, arrays, path)
    return metadata, {k: backend.to_device(a, device) for k, a in arrays.items()}


def _check_structure_size(metadata: dict, path: str) -> None:
    structure = metadata.get(_STRUCTURE_KEY)
    if structure is not None and _count_json_values(structure) > MAX_JSON_VALUES:
        raise _over_limit(f"load: {path} has a minidl header of about {_count_json_values(structure):,} "
                          "JSON values", MAX_JSON_VALUES, "it was not decoded. Nothing was executed.")


def _verify_checksums(metadata: dict, arrays: dict, path: str) -> None:
    """Compare each array's bytes with the CRC-32 :func:`save` recorded; a file without them passes."""
    text = metadata.get(_CHECKSUM_KEY)
    if text is None:
        return  # a safetensors file from another library: nothing to check against
    try:
        sums = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"load: {path} has damaged checksums in its header ({_clip(str(exc))}). "
                         "Nothing was executed.") from None
    if not isinstance(sums, dict) or set(sums) != set(arrays):
        raise ValueError(f"load: {path} has damaged checksums in its header (they do not list the file's "
                         "arrays). Nothing was executed.")
    for name, array in arrays.items():
        actual = _checksum(array)
        if actual != sums[name]:
            raise ValueError(f"load: {path} is damaged: the bytes of the tensor {name!r} do not match the "
                             f"checksum saved with them (CRC-32 {actual}, saved {short_repr(sums[name])}); "
                             "the file changed after it was written (a disk, copy or transfer fault). Use "
                             "another copy or an earlier checkpoint; nothing was loaded.")


def _rebuild(metadata: dict, tensors: dict, path: str, weights_only: bool):
    """What :func:`save` was given, from the file's metadata and its arrays."""
    pickled = metadata.get(_PICKLE_KEY)
    if pickled is not None:
        return _unpickle(metadata, tensors, pickled, path, weights_only)
    structure = metadata.get(_STRUCTURE_KEY)
    if structure is None:
        return tensors  # a plain safetensors file from elsewhere: a flat dict of arrays
    try:
        return _decode(json.loads(structure), tensors)
    except RecursionError:
        raise ValueError(f"load: {path} has a damaged minidl header (nested more than {MAX_DEPTH} levels "
                         "deep). Nothing was executed.") from None
    except ValueError as exc:
        raise ValueError(f"load: {path} has a damaged minidl header ({_clip(str(exc))}). "
                         "Nothing was executed.") from None


def _unpickle(metadata: dict, tensors: dict, name: str, path: str, weights_only: bool):
    kind = short_repr(metadata.get(_PICKLE_TYPE_KEY, "object"))
    if weights_only:
        raise LoadError(f"load: {path} holds a pickled Python object ({kind}, saved whole by mdl.save), and "
                        "unpickling can run any code the file holds, so weights_only=True refuses it. If you "
                        "trust where the file came from: mdl.load(f, weights_only=False); better, save and "
                        "load model.state_dict(), which needs no pickle. Nothing was executed.", path)
    payload = tensors.pop(name, None)
    if payload is None or payload.dtype != np.uint8 or payload.ndim != 1:
        raise ValueError(f"load: {path} has a damaged minidl header (its pickle {short_repr(name)} is not a "
                         "byte array of the file). Nothing was executed.")
    warnings.warn(f"load: unpickling {kind} from {path} with weights_only=False: a pickle can run any code "
                  "it holds; load only files you trust", UserWarning, stacklevel=4)
    try:
        return _ArrayUnpickler(io.BytesIO(backend.to_numpy(payload).tobytes()), tensors).load()
    except Exception as exc:  # noqa: BLE001 - any failure of the user's classes to rebuild is a LoadError
        raise ValueError(f"load: {path}: the pickled {kind} could not be rebuilt "
                         f"({type(exc).__name__}: {_clip(str(exc))})") from None
