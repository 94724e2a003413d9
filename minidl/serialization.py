"""Saving and loading state without pickle: ``mdl.save`` / ``mdl.load``.

Files are safetensors: a JSON header naming each array's dtype, shape and
byte range, then the raw bytes. Loading reads numbers, never code, so a file
from anywhere is safe to open. Anything that is not an array (step counts,
learning rates, RNG states, nested dicts of optimizer state) travels in the
header's metadata as JSON, with each array replaced by a reference to its
tensor entry; a flat ``{name: array}`` state dict is therefore an ordinary
safetensors file that other tools read too.

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

Writing goes to a temporary file in the same folder (``.tmp-XXXXXXXX<name>``,
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
is the file and whose message says what; nothing from the file is ever executed.
"""
from __future__ import annotations

import contextlib
import errno as errno_codes
import json
import math
import os
import re
import secrets
import stat
import struct
import time

import numpy as np

from minidl import backend
from minidl.tensor import Tensor

try:
    import fcntl
except ImportError:  # Windows: no advisory locks, but an open file cannot be removed there either
    fcntl = None

_STRUCTURE_KEY = "minidl.structure"
_TENSOR, _TUPLE, _ITEMS = "__tensor__", "__tuple__", "__dict_items__"
_MARKERS = (_TENSOR, _TUPLE, _ITEMS)

MAX_HEADER_BYTES = 16 * 2**20   # the JSON header of a safetensors file (safetensors itself allows 100 MB)
MAX_TENSORS = 100_000           # arrays in one file
MAX_JSON_VALUES = 2_000_000     # values in the structure JSON: about a second and 200 MB to decode
MAX_DEPTH = 100                 # nesting of dicts, lists and tuples


def _over_limit(message: str, limit: int, then: str) -> ValueError:
    return ValueError(f"{message}, over the limit of {limit:,}; {then}")


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
    raise TypeError(f"save: cannot store a {type(value).__name__} at {where}; "
                    "only arrays, Tensors, numbers, strings, None, lists, tuples and dicts are saved (no pickle)")


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
    raise TypeError(f"save: cannot store the dictionary key {k!r} ({type(k).__name__}) at {where}; "
                    "keys may be strings, numbers, bools, None or tuples of those")


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


def _safetensors_header(tensors: dict, metadata: dict) -> bytes:
    """The 8-byte length and the JSON header of a safetensors file holding ``tensors`` in order.

    The format: a little-endian u64 N, N bytes of JSON (``{name: {"dtype",
    "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}``,
    padded with spaces to a multiple of 8), then the arrays' bytes back to back.
    """
    header, offset = {}, 0
    for name, array in tensors.items():
        code = _dtype_code(array.dtype)
        if code is None:
            raise TypeError(f"save: cannot store the {array.dtype} array {name!r}; safetensors holds "
                            f"{', '.join(str(d) for d in _DTYPE_CODES)} and bfloat16 (from ml_dtypes)")
        header[name] = {"dtype": code, "shape": list(array.shape), "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    if len(text) > MAX_HEADER_BYTES:
        raise _over_limit(f"save: the safetensors header would be {len(text):,} bytes", MAX_HEADER_BYTES,
                          "load refuses such files; store long lists of numbers as NumPy arrays, or save "
                          "in several files")
    return struct.pack("<Q", len(text)) + text


def save(obj, path) -> None:
    """Write a state dict (or any nesting of dicts, lists, tuples, arrays, numbers, strings) to ``path``.

    Raises TypeError for a value that cannot be stored without pickle and
    ValueError for one over the limits :func:`load` enforces; the file at
    ``path`` is then left as it was.
    """
    if callable(getattr(obj, "state_dict", None)):  # a whole Module or Optimizer: PyTorch would pickle it
        raise TypeError(f"save: got a whole {type(obj).__name__} object; minidl saves state dicts, not pickled "
                        f"objects: mdl.save(obj.state_dict(), path), then obj.load_state_dict(mdl.load(path))")
    tensors: dict[str, np.ndarray] = {}
    structure = json.dumps(_encode(obj, "", tensors))
    if len(tensors) > MAX_TENSORS:
        raise _over_limit(f"save: the value holds {len(tensors):,} arrays", MAX_TENSORS,
                          "load refuses such files; save the state in several files")
    if _count_json_values(structure) > MAX_JSON_VALUES:
        raise _over_limit(f"save: the value holds about {_count_json_values(structure):,} numbers, strings "
                          "and containers besides arrays", MAX_JSON_VALUES,
                          "load refuses such files; store long lists of numbers as NumPy arrays")
    tensors = {name: a if a.dtype.byteorder != ">" else a.astype(a.dtype.newbyteorder("<"))
               for name, a in tensors.items()}
    head = _safetensors_header(tensors, {_STRUCTURE_KEY: structure})

    def write(tmp):
        with open(tmp, "wb") as f:
            f.write(head)
            for array in tensors.values():
                f.write(array.reshape(-1).view(np.uint8).data)

    atomic_write(path, write)


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
    """The metadata and the header of the safetensors file at ``path``, and where its array bytes start.

    Only what reading the file would cost is checked here; ``safe_open`` checks the rest.
    """
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"load: no file at {path}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(_not_regular(path))
    with _open_regular(path) as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise ValueError(f"load: {path} is not a complete safetensors file ({info.st_size} bytes); "
                             "it may be truncated or of another format. Nothing was executed.")
        (header_bytes,) = struct.unpack("<Q", prefix)
        if header_bytes > info.st_size - 8:
            raise ValueError(f"load: {path} is not a complete safetensors file (its first 8 bytes announce a "
                             f"header of {header_bytes:,} bytes, the file has {info.st_size:,}); it may be "
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


def load(path, device="cpu", *, map_location=None, weights_only=True):
    """Read what :func:`save` wrote (or any safetensors file) with arrays on ``device``.

    PyTorch's keywords are accepted: ``map_location`` (a device name or ``mdl.device``) is
    ``device``; ``weights_only=True`` is what minidl always does, and ``weights_only=False``
    is refused: minidl's files hold arrays and plain values, never pickled objects.

    Every failure to read the file is a :class:`LoadError` (an ``OSError`` and a
    ``ValueError``) carrying ``path``: no file (:class:`MissingFileError`, a
    ``FileNotFoundError`` too), a path the system cannot open (a symlink loop,
    no permission), anything that is not a complete, undamaged safetensors
    file within the limits (see the module docstring), and a bfloat16 (BF16)
    array without the ml_dtypes package (the message says how to install it).
    Loading a BF16 array onto a GPU raises TypeError (CuPy has no bfloat16).
    The file is only read, never executed.
    """
    if not weights_only:
        raise ValueError("load: weights_only=False asks to unpickle objects, which minidl never does (a pickle "
                         "can run code); its files hold arrays and plain values: drop the argument")
    if map_location is not None:
        if callable(map_location) or isinstance(map_location, dict):
            raise TypeError("load: map_location must name one device ('cpu', 'cuda', 'cuda:1' or mdl.device); "
                            f"got {type(map_location).__name__}, a mapping minidl does not support")
        device = map_location
    path = os.fspath(path)
    try:
        return _load(path, device)
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


def _load(path: str, device):
    from safetensors import SafetensorError, safe_open

    metadata, header, data_start = _read_header(path)
    structure = metadata.get(_STRUCTURE_KEY)
    if structure is not None and _count_json_values(structure) > MAX_JSON_VALUES:
        raise _over_limit(f"load: {path} has a minidl header of about {_count_json_values(structure):,} "
                          "JSON values", MAX_JSON_VALUES, "it was not decoded. Nothing was executed.")
    bfloat16 = {name: entry for name, entry in header.items()
                if name != "__metadata__" and isinstance(entry, dict) and entry.get("dtype") == _BF16}
    if bfloat16:
        name = next(iter(bfloat16))
        dtype = _bfloat16(path, name)
        if backend.parse_device(device)[0] != "cpu":
            raise TypeError(f"load: {path} holds the bfloat16 array {name!r}, and CuPy has no bfloat16 arrays; "
                            f"load it on the CPU (device='cpu') and cast it to float16 or float32 for {device!r}")
    try:
        with (safe_open(path, framework="np") as f,  # opening it checks every entry's dtype, shape and offsets
              _open_regular(path) if bfloat16 else contextlib.nullcontext() as raw):
            tensors = {k: backend.to_device(_read_bfloat16(raw, header[k], data_start, dtype) if k in bfloat16
                                            else f.get_tensor(k), device) for k in f.keys()}
    except (SafetensorError, OSError, ValueError, TypeError, OverflowError) as exc:
        raise ValueError(f"load: {path} is not a complete safetensors file ({_clip(str(exc))}); "
                         "it may be truncated or of another format. Nothing was executed.") from None
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
