"""cupy.lib.stride_tricks on the stand-in."""
import types as _types

import numpy as _np

from tests import cupy_standin as _cp

stride_tricks = _types.SimpleNamespace(
    as_strided=_cp._function("as_strided", _np.lib.stride_tricks.as_strided),
    sliding_window_view=_cp._function("sliding_window_view", _np.lib.stride_tricks.sliding_window_view),
)
