"""Helpers shared by the autograd tests."""
import numpy as np

import minidl as mdl


def f64(data, requires_grad=True):
    """A float64 tensor (gradients are checked in float64), requiring its gradient unless told."""
    return mdl.tensor(np.asarray(data, dtype=np.float64), requires_grad=requires_grad)
