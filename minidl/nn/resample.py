"""Resampling layers: Upsample, PixelShuffle, PixelUnshuffle (no parameters).

Each calls the function of the same meaning in :mod:`minidl.functional`
(see :mod:`minidl.ops.resample` for the index rules and the math).
"""
from __future__ import annotations

import minidl.functional as F
from minidl.nn.module import Module


class Upsample(Module):
    """Resize (N, C, L), (N, C, H, W) or (N, C, D, H, W) to ``size`` or by ``scale_factor``: F.interpolate.

    Modes 'nearest' (default), 'nearest-exact', 'linear', 'bilinear', 'trilinear' (``align_corners`` for
    the last three) and 'area'.
    """

    def __init__(self, size=None, scale_factor=None, mode="nearest", align_corners=None,
                 recompute_scale_factor=None):
        super().__init__()
        self.size, self.mode, self.align_corners = size, mode, align_corners
        self.scale_factor = float(scale_factor) if isinstance(scale_factor, (int, float)) else scale_factor
        self.recompute_scale_factor = recompute_scale_factor

    def forward(self, x):
        return F.interpolate(x, self.size, self.scale_factor, self.mode, self.align_corners,
                             self.recompute_scale_factor)

    def extra_repr(self):
        shown = f"size={self.size}" if self.scale_factor is None else f"scale_factor={self.scale_factor}"
        return f"{shown}, mode={self.mode!r}"


class PixelShuffle(Module):
    """(*, C·r², H, W) → (*, C, H·r, W·r) with r = upscale_factor (sub-pixel convolution's last step)."""

    def __init__(self, upscale_factor: int):
        super().__init__()
        self.upscale_factor = upscale_factor

    def forward(self, x):
        return F.pixel_shuffle(x, self.upscale_factor)

    def extra_repr(self):
        return f"upscale_factor={self.upscale_factor}"


class PixelUnshuffle(Module):
    """(*, C, H·r, W·r) → (*, C·r², H, W) with r = downscale_factor, the inverse of PixelShuffle."""

    def __init__(self, downscale_factor: int):
        super().__init__()
        self.downscale_factor = downscale_factor

    def forward(self, x):
        return F.pixel_unshuffle(x, self.downscale_factor)

    def extra_repr(self):
        return f"downscale_factor={self.downscale_factor}"
