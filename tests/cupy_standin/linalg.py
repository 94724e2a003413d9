"""cupy.linalg on the stand-in (NumPy's linalg, under CuPy's rules)."""
import numpy as _np

from tests import cupy_standin as _cp
from tests.cupy_standin import names as _names

for _name in _names.LINALG_NAMES:
    _value = getattr(_np.linalg, _name)
    globals()[_name] = _value if isinstance(_value, type) else _cp._function(_name, _value)
del _name, _value
