"""Read MNIST-format IDX files from disk (gzipped or not). No network access.

The IDX format (LeCun et al., the MNIST distribution) is a header and raw
big-endian data:

    bytes 0-1   0x00 0x00
    byte  2     data type: 0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32,
                0x0D float32, 0x0E float64
    byte  3     number of dimensions d
    4*d bytes   the size of each dimension, big-endian uint32
    then        prod(sizes) values of the data type, big-endian, row-major

    images = load_idx("train-images-idx3-ubyte.gz")   # uint8 (60000, 28, 28)
    x, y = mnist("~/data/mnist")                       # float32 0..255, int64

Fashion-MNIST and KMNIST use the same file names and format.
"""
from __future__ import annotations

import gzip
import os
import zlib

import numpy as np

IDX_DTYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}

_GZIP_MAGIC = b"\x1f\x8b"


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        raw = f.read()
    # Decide by content, not by name: a ".gz" that is not gzipped (or a
    # gzipped file without the suffix) is still read correctly.
    if raw[:2] != _GZIP_MAGIC:
        return raw
    try:
        return gzip.decompress(raw)
    except (EOFError, OSError, zlib.error) as exc:
        raise ValueError(f"load_idx: {path} looks gzipped but cannot be decompressed ({exc}); "
                         "the file is probably truncated or damaged: download it again") from exc


def parse_idx(raw: bytes, name: str = "<bytes>") -> np.ndarray:
    """Decode the bytes of an (uncompressed) IDX file into a native-endian array."""
    if len(raw) < 4:
        raise ValueError(f"load_idx: {name} is {len(raw)} bytes long, too short for an IDX header "
                         "(4 bytes); the file is truncated or not an IDX file")
    if raw[0] != 0 or raw[1] != 0 or raw[2] not in IDX_DTYPES:
        raise ValueError(
            f"load_idx: {name} is not an IDX file: its magic number is {raw[:4].hex(' ')}, but an IDX "
            "file starts with 00 00, a type byte (08 uint8, 09 int8, 0b int16, 0c int32, 0d float32, "
            "0e float64) and the number of dimensions")
    dtype = IDX_DTYPES[raw[2]]
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"load_idx: {name} is truncated: its header announces {ndim} dimensions "
                         f"({header} header bytes) but the file has {len(raw)} bytes")
    shape = tuple(int(s) for s in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    actual = len(raw) - header
    if actual < expected:
        raise ValueError(f"load_idx: {name} is truncated: shape {shape} of {dtype.name} needs {expected} "
                         f"data bytes, the file has {actual}; download it again")
    if actual > expected:
        raise ValueError(f"load_idx: {name} has {actual - expected} bytes after the data announced by "
                         f"its header (shape {shape}, {dtype.name}); it is not a valid IDX file")
    data = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return data.astype(dtype.newbyteorder("="))  # native byte order, and a writable copy


def load_idx(path) -> np.ndarray:
    """Read an IDX file (gzipped or not) into a NumPy array of its own dtype and shape.

    Raises ``FileNotFoundError`` for a missing path and ``ValueError`` naming
    the problem for a truncated, damaged or foreign file.
    """
    path = os.fspath(os.path.expanduser(path))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"load_idx: no file at {path}")
    return parse_idx(_read_bytes(path), name=path)


MNIST_FILES = {
    True: ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    False: ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def _find(root: str, stem: str):
    # The official names, with or without .gz, and the "train-images.idx3-ubyte"
    # spelling some mirrors use.
    dotted = stem.replace("-idx", ".idx")
    for name in (stem, stem + ".gz", dotted, dotted + ".gz"):
        candidate = os.path.join(root, name)
        if os.path.isfile(candidate):
            return candidate
    return None


def mnist(root, train: bool = True):
    """Load MNIST (or Fashion-MNIST) from the IDX files in directory ``root``.

    ``train=True`` reads ``train-images-idx3-ubyte`` and ``train-labels-idx1-ubyte``
    (60,000 samples); ``train=False`` reads ``t10k-images-idx3-ubyte`` and
    ``t10k-labels-idx1-ubyte`` (10,000). Each may be gzipped (``.gz``).

    Returns ``(images, labels)``: float32 ``(N, 28, 28)`` with values 0..255
    (scale or standardize them yourself) and int64 ``(N,)``.
    Nothing is downloaded: when files are missing, ``FileNotFoundError`` says
    which files to put where.
    """
    root = os.path.abspath(os.path.expanduser(os.fspath(root)))
    stems = MNIST_FILES[bool(train)]
    found = {stem: _find(root, stem) for stem in stems}
    missing = [stem for stem, path in found.items() if path is None]
    if missing:
        where = "the directory " + root + (" (which does not exist)" if not os.path.isdir(root) else "")
        lines = "\n".join(f"  {os.path.join(root, stem)}.gz   (or uncompressed: {stem})" for stem in missing)
        raise FileNotFoundError(
            f"mnist: missing {len(missing)} of the {'training' if train else 'test'} files in {where}. "
            f"Put these files there:\n{lines}\n"
            "They are the original MNIST (or Fashion-MNIST) IDX files; minidl never downloads data.")
    images = load_idx(found[stems[0]])
    labels = load_idx(found[stems[1]])
    if images.ndim != 3:
        raise ValueError(f"mnist: {found[stems[0]]} should hold images (N, rows, cols), got shape {images.shape}")
    if labels.ndim != 1 or len(labels) != len(images):
        raise ValueError(f"mnist: {found[stems[1]]} holds labels of shape {labels.shape}, but "
                         f"{found[stems[0]]} holds {len(images)} images; the two files do not belong together")
    return images.astype(np.float32), labels.astype(np.int64)
