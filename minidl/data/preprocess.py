"""Standardization: zero mean and unit variance per feature, with statistics of the training split.

    scaler = Standardizer().fit(x_train)          # the training split ONLY
    x_train = scaler.transform(x_train)
    x_val, x_test = scaler.transform(x_val), scaler.transform(x_test)   # same mean and std
    mdl.save(scaler.state_dict(), "scaler.safetensors")                 # ship it with the model

The text's warning: the mean and standard deviation are part of the model.
Compute them on the training split only and apply them unchanged to
validation, test and deployment data. Fitting on all the data leaks
information about the test set into training; refitting on the test or
deployment data changes the input the model sees (a batch of one would even
have zero variance), so the trained weights no longer match their input.

    z = (x - mean) / scale,    scale = std, or 1 where std == 0
    x = z * scale + mean        (inverse_transform)

A feature with zero variance in the training split (a pixel that is always
blank, say) keeps scale 1: it becomes exactly ``x - mean`` (0 on the training
data) instead of a division by zero.
"""
from __future__ import annotations

import numpy as np


class Standardizer:
    """Per-feature standardization ``z = (x - mean) / scale``.

    Args:
        axis: the axes reduced when fitting (the sample axis and any axis that
            shares statistics). ``0`` (default): one mean/std per feature of
            ``(N, ...)`` data; ``(0, 2, 3)``: one per channel of ``(N, C, H, W)`` images;
            ``None``: a single mean/std for all values.
        eps: a standard deviation at or below ``eps * max(1, |mean|)`` counts as
            zero (constant feature, scale 1).

    Outputs are float32 unless the input is float64 (then float64).
    """

    def __init__(self, axis=0, eps: float = 1e-7):
        self.axis = axis
        self.eps = float(eps)
        self.mean = None   # float64 arrays with the reduced axes kept (size 1), so they broadcast
        self.scale = None
        self.constant = None  # True where the feature had zero variance
        self.reduced_axes = None  # the axes of the fitted data that the statistics are shared over

    # ------------------------------------------------------------------ fitting
    def _axes(self, ndim: int) -> tuple:
        if self.axis is None:
            return tuple(range(ndim))
        axes = (self.axis,) if np.isscalar(self.axis) else tuple(self.axis)
        for a in axes:
            if not -ndim <= int(a) < ndim:
                raise ValueError(f"Standardizer: axis {a} is out of range for data with {ndim} dimensions")
        return tuple(sorted({int(a) % ndim for a in axes}))

    def fit(self, x) -> "Standardizer":
        """Compute mean and scale from ``x`` (the training split)."""
        x = np.asarray(x)
        if x.ndim == 0 or x.size == 0:
            raise ValueError(f"Standardizer.fit: need a non-empty array of samples, got shape {x.shape}")
        if not (np.issubdtype(x.dtype, np.number) or x.dtype == np.bool_):
            raise TypeError(f"Standardizer.fit: need numbers, got dtype {x.dtype}")
        x64 = x.astype(np.float64)
        if not np.all(np.isfinite(x64)):
            raise ValueError("Standardizer.fit: the data contain NaN or infinity; clean or impute them first")
        axes = self._axes(x.ndim)
        self.reduced_axes = axes
        self.mean = x64.mean(axis=axes, keepdims=True)
        std = x64.std(axis=axes, keepdims=True)
        self.constant = std <= self.eps * np.maximum(1.0, np.abs(self.mean))
        self.scale = np.where(self.constant, 1.0, std)
        return self

    def _check(self, x, name: str):
        if self.mean is None:
            raise RuntimeError(f"Standardizer.{name}: not fitted; call fit(x_train) on the training split first")
        x = np.asarray(x)
        ok = x.ndim == self.mean.ndim and all(
            i in self.reduced_axes or d == m for i, (d, m) in enumerate(zip(x.shape, self.mean.shape)))
        if not ok:
            expected = tuple("N" if i in self.reduced_axes else m for i, m in enumerate(self.mean.shape))
            raise ValueError(f"Standardizer.{name}: got shape {x.shape}, but it was fitted on data of "
                             f"shape {expected} (N: any size)")
        dtype = np.float64 if x.dtype == np.float64 else np.float32
        return x, dtype

    def transform(self, x) -> np.ndarray:
        """``(x - mean) / scale`` with the fitted statistics (never refits)."""
        x, dtype = self._check(x, "transform")
        return ((x - self.mean.astype(dtype)) / self.scale.astype(dtype)).astype(dtype, copy=False)

    def fit_transform(self, x) -> np.ndarray:
        return self.fit(x).transform(x)

    def inverse_transform(self, z) -> np.ndarray:
        """``z * scale + mean``: back to the original units."""
        z, dtype = self._check(z, "inverse_transform")
        return (z * self.scale.astype(dtype) + self.mean.astype(dtype)).astype(dtype, copy=False)

    # ------------------------------------------------------------------ saving
    def state_dict(self) -> dict:
        """Arrays only, so ``mdl.save`` can store them with the model.

        ``mean``, ``scale`` (float64, reduced axes kept with size 1),
        ``constant`` (uint8, 1 for zero-variance features) and ``axes`` (int64,
        the reduced axes).
        """
        if self.mean is None:
            raise RuntimeError("Standardizer.state_dict: not fitted; call fit(x_train) first")
        return {"mean": self.mean.copy(), "scale": self.scale.copy(),
                "constant": self.constant.astype(np.uint8),
                "axes": np.asarray(self.reduced_axes, dtype=np.int64)}

    def load_state_dict(self, state: dict) -> "Standardizer":
        missing = [k for k in ("mean", "scale") if k not in state]
        if missing:
            raise ValueError(f"Standardizer.load_state_dict: missing {missing}; expected the keys "
                             "of Standardizer.state_dict() ('mean', 'scale', 'constant')")
        mean = np.asarray(state["mean"], dtype=np.float64)
        scale = np.asarray(state["scale"], dtype=np.float64)
        if mean.shape != scale.shape:
            raise ValueError(f"Standardizer.load_state_dict: mean {mean.shape} and scale {scale.shape} "
                             "must have the same shape")
        if not np.all(scale > 0):
            raise ValueError("Standardizer.load_state_dict: every scale must be positive")
        constant = state.get("constant")
        constant = (np.asarray(constant).astype(bool) if constant is not None
                    else np.zeros(mean.shape, dtype=bool))
        axes = state.get("axes")
        axes = (tuple(int(a) for a in np.asarray(axes).ravel()) if axes is not None
                else tuple(i for i, m in enumerate(mean.shape) if m == 1))
        if any(not 0 <= a < mean.ndim or mean.shape[a] != 1 for a in axes):
            raise ValueError(f"Standardizer.load_state_dict: axes {axes} do not match mean of shape {mean.shape}")
        self.mean, self.scale, self.constant = mean, scale, constant
        self.axis = self.reduced_axes = axes
        return self

    def __repr__(self) -> str:
        if self.mean is None:
            return f"Standardizer(axis={self.axis}, not fitted)"
        return (f"Standardizer(axis={self.axis}, features={self.mean.size}, "
                f"constant={int(self.constant.sum())})")
