"""cupy.random on the stand-in: Generator over a bit generator whose whole state lives in a device array.

As in CuPy, ``XORWOW(seed)._state`` is a device int8 array; the stand-in keeps
NumPy's Philox state in it (counter, key, buffer...), so saving that array and
writing it back resumes the stream exactly, as it does on a GPU.
"""
from __future__ import annotations

import numpy as _np

from tests import cupy_standin as _cp

_FIELDS = 13  # uint64 words: counter[4], key[2], buffer[4], buffer_pos, has_uint32, uinteger


class BitGenerator:
    def __init__(self, seed=None):
        self._seed_seq = seed if isinstance(seed, _np.random.SeedSequence) else _np.random.SeedSequence(seed)
        self._current_device_id = _cp._current_device[0]

    def random_raw(self, size=None, output=True):
        raise NotImplementedError("Not implemented in base BitGenerator")

    def _state_size(self):
        return 0

    def _check_device(self):
        if _cp._current_device[0] != self._current_device_id:
            raise RuntimeError("This Generator state is allocated in a different device")


class XORWOW(BitGenerator):
    """The default bit generator; the stand-in draws with NumPy's Philox, its state kept on the device."""

    def __init__(self, seed=None, *, size=-1):
        super().__init__(seed)
        philox = _np.random.Philox(self._seed_seq)
        self._state = _cp._wrap(_np.zeros(_FIELDS * 8, dtype=_np.int8))
        self._store(philox)

    def _store(self, philox):
        s = philox.state
        words = [*s["state"]["counter"], *s["state"]["key"], *s["buffer"], s["buffer_pos"],
                 s["has_uint32"], s["uinteger"]]
        self._state._a.view(_np.uint64)[:] = _np.array(words, dtype=_np.uint64)

    def _load(self):
        words = self._state._a.view(_np.uint64)
        philox = _np.random.Philox()
        philox.state = {"bit_generator": "Philox",
                        "state": {"counter": words[0:4].copy(), "key": words[4:6].copy()},
                        "buffer": words[6:10].copy(), "buffer_pos": int(words[10]),
                        "has_uint32": int(words[11]), "uinteger": int(words[12])}
        return philox

    def state(self):
        self._check_device()
        return self._state.data.ptr

    def _state_size(self):
        return 1 << 20


MRG32k3a = Philox4x3210 = XORWOW


def _float_dtype(dtype):
    dtype = _np.dtype(dtype)
    if dtype.char not in "fd":
        raise TypeError(f"cupy.random only supports float32 and float64, got {dtype}")
    return dtype


class Generator:
    """cupy.random.Generator: NumPy's distributions, drawn from the bit generator's device state."""

    def __init__(self, bit_generator):
        self.bit_generator = bit_generator

    def _draw(self, method, *args, **kwargs):
        self.bit_generator._check_device()
        philox = self.bit_generator._load()
        values = getattr(_np.random.Generator(philox), method)(*args, **kwargs)
        self.bit_generator._store(philox)
        return _cp._wrap(_np.asarray(values))

    def random(self, size=None, dtype=_np.float64, out=None):
        return self._fill(out, self._draw("random", size, _float_dtype(dtype)))

    def standard_normal(self, size=None, dtype=_np.float64, out=None):
        return self._fill(out, self._draw("standard_normal", size, _float_dtype(dtype)))

    def uniform(self, low=0.0, high=1.0, size=None, dtype=_np.float64):
        return self._draw("uniform", low, high, size).astype(_float_dtype(dtype))

    def standard_exponential(self, size=None, dtype=_np.float64, method="inv", out=None):
        return self._fill(out, self._draw("standard_exponential", size, _float_dtype(dtype)))

    def integers(self, low, high=None, size=None, dtype=_np.int64, endpoint=False):
        for bound in (low, high):
            if type(bound) is _cp.ndarray:
                raise TypeError("the stand-in's integers() takes Python bounds")
        return self._draw("integers", low, high, size, dtype, endpoint)

    @staticmethod
    def _fill(out, values):
        if out is None:
            return values
        out[...] = values
        return out


def default_rng(seed=None):
    if isinstance(seed, Generator):
        return seed
    if isinstance(seed, BitGenerator):
        return Generator(seed)
    return Generator(XORWOW(seed))
