"""cupy.fft on the stand-in (NumPy's fft, under CuPy's rules: device arrays in and out)."""
import numpy as _np

from tests import cupy_standin as _cp
from tests.cupy_standin import names as _names

for _name in _names.FFT_NAMES:
    globals()[_name] = _cp._function(_name, getattr(_np.fft, _name))
del _name
