"""Channel dropout layers: Dropout1d and Dropout2d.

Training: each channel of each example is zeroed whole with probability p,
the kept ones scaled by 1/(1 − p); evaluation (``model.eval()``): the
identity. Neighbouring positions of a feature map are strongly correlated,
so zeroing single elements (:class:`~minidl.nn.Dropout`) hardly regularizes a
convolutional network; zeroing whole channels does (Tompson et al. 2015).
"""
from __future__ import annotations

import minidl.functional as F
from minidl.nn.layers import Dropout


class Dropout1d(Dropout):
    """Channel dropout of (N, C, L) or unbatched (C, L) inputs: one keep/drop draw per (n, c).

    Draws from the seeded generator; ``p=1`` zeroes everything while training.
    """

    def forward(self, x):
        if self.training and self.p == 1:  # F.dropout1d refuses p=1 (no 1/(1−p) scale)
            return F.dropout1d(x, 0.0, False) * 0.0
        return F.dropout1d(x, self.p, self.training)


class Dropout2d(Dropout):
    """Channel dropout of (N, C, H, W) inputs: one keep/drop draw per (n, c), shared by all H·W positions.

    A 3-D input is read as (N, C, L), as PyTorch does today. Draws from the seeded generator;
    ``p=1`` zeroes everything while training.
    """

    def forward(self, x):
        if self.training and self.p == 1:
            return F.dropout2d(x, 0.0, False) * 0.0
        return F.dropout2d(x, self.p, self.training)
