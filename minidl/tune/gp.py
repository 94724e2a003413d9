"""Bayesian optimization with a Gaussian-process surrogate and expected improvement, in NumPy.

    from minidl.tune import GaussianProcess, expected_improvement, gp_search
    result = gp_search(objective, space, n_trials=20, epochs=2, seed=0)

**The surrogate.** A Gaussian process with kernel ``k`` says that the scores
``y`` of the configurations ``X`` seen so far (each encoded in the unit cube,
:func:`encode`) and the score ``f(x)`` of a new one are jointly Gaussian. With
``K = k(X, X) + σ_n² I`` and its Cholesky factor ``K = L Lᵀ``, the posterior at ``x`` is
(Rasmussen & Williams 2006, eq. 2.25-2.26, algorithm 2.1)::

    μ(x)  = k(x, X) α,               α = K⁻¹ y = Lᵀ \\ (L \\ y)
    σ²(x) = k(x, x) − vᵀ v,          v = L \\ k(X, x)

The kernel is Matérn 5/2 (default) or the RBF, of the distance ``r = ‖x − x'‖/ℓ``::

    Matérn 5/2:  k(r) = s² (1 + √5 r + 5r²/3) exp(−√5 r)        RBF:  k(r) = s² exp(−r²/2)

Its length scale ``ℓ``, amplitude ``s²`` and noise ``σ_n²`` maximize the log marginal
likelihood over a small grid (the scores are standardized first, so one grid fits every metric)::

    log p(y | X) = −½ yᵀ α − Σ_i log L_ii − (n/2) log 2π

**The acquisition.** Expected improvement over the best score ``f*`` so far (maximizing),
with ``Z = (μ − f* − ξ)/σ`` and Φ, φ the standard normal CDF and density (Jones et al. 1998)::

    EI(x) = (μ − f* − ξ) Φ(Z) + σ φ(Z)              (0 where σ = 0 and μ ≤ f* + ξ)

is large where the mean is high (exploitation) or the uncertainty is (exploration);
``ξ ≥ 0`` asks for a margin. The next configuration is the one of ``candidates``
random draws from the space with the largest EI. A diverged trial enters the
surrogate with the worst finished score, so its region looks bad without dragging the
scale of the others.
"""
from __future__ import annotations

import math

import numpy as np

from minidl.tune.results import SearchResult
from minidl.tune.search import TrialRunner, _positive_int, metric_name
from minidl.tune.space import Choice, Dimension, Integer, LogUniform, Uniform, sample

__all__ = ["GaussianProcess", "decode", "encode", "expected_improvement", "gp_search", "matern52", "rbf"]

_LOG_2PI = math.log(2.0 * math.pi)


# ---------------------------------------------------------------- encoding a configuration
def _unit(dim, value) -> list:
    if isinstance(dim, Choice):
        return [1.0 if value == o else 0.0 for o in dim.options]
    if dim.log:
        return [math.log(value / dim.low) / math.log(dim.high / dim.low)]
    return [(value - dim.low) / (dim.high - dim.low)]


def encode(space: dict, config: dict) -> np.ndarray:
    """``config`` as a point of the unit cube: each range's value scaled to [0, 1] (by its logarithm for a log
    range), a Choice as one 0/1 column per option; constants are left out."""
    out = []
    for name, dim in space.items():
        if isinstance(dim, Dimension):
            if not isinstance(dim, (Choice, Uniform, LogUniform, Integer)):
                raise TypeError(f"encode: cannot place a {type(dim).__name__} ({name!r}) in the unit cube")
            out += _unit(dim, config[name])
    return np.asarray(out, dtype=np.float64)


def decode(space: dict, point) -> dict:
    """The configuration of a unit-cube ``point`` (the inverse of :func:`encode`, an Integer rounded, a Choice the
    option of the largest column)."""
    point, config, i = np.asarray(point, dtype=np.float64), {}, 0
    for name, dim in space.items():
        if not isinstance(dim, Dimension):
            config[name] = dim
            continue
        if isinstance(dim, Choice):
            config[name] = dim.options[int(np.argmax(point[i:i + len(dim.options)]))]
            i += len(dim.options)
            continue
        u = float(np.clip(point[i], 0.0, 1.0))
        value = dim.low * (dim.high / dim.low) ** u if dim.log else dim.low + u * (dim.high - dim.low)
        config[name] = int(np.clip(round(value), dim.low, dim.high)) if isinstance(dim, Integer) else float(value)
        i += 1
    return config


# ---------------------------------------------------------------- kernels
def _distance(a, b, length_scale):
    a, b = np.atleast_2d(a) / length_scale, np.atleast_2d(b) / length_scale
    sq = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T
    return np.sqrt(np.maximum(sq, 0.0))


def matern52(a, b, length_scale: float = 1.0, amplitude: float = 1.0) -> np.ndarray:
    """Matérn 5/2: ``s² (1 + √5 r + 5r²/3) exp(−√5 r)``, ``r = ‖a − b‖/ℓ``, for every row pair."""
    r = math.sqrt(5.0) * _distance(a, b, length_scale)
    return amplitude * (1.0 + r + r * r / 3.0) * np.exp(-r)


def rbf(a, b, length_scale: float = 1.0, amplitude: float = 1.0) -> np.ndarray:
    """Squared exponential: ``s² exp(−r²/2)``, ``r = ‖a − b‖/ℓ``, for every row pair."""
    r = _distance(a, b, length_scale)
    return amplitude * np.exp(-0.5 * r * r)


KERNELS = {"matern52": matern52, "rbf": rbf}


# ---------------------------------------------------------------- the surrogate
class GaussianProcess:
    """A zero-mean GP on standardized targets (see the module docstring for the equations).

    ``fit(X, y)`` picks the length scale, amplitude and noise of the grids that maximize the log marginal
    likelihood, unless they are given (then only the Cholesky factor is computed); ``predict(X)`` returns
    the posterior mean and variance in the units of ``y``.
    """

    LENGTH_SCALES = tuple(np.geomspace(0.03, 3.0, 15))
    AMPLITUDES = (0.5, 1.0, 2.0)  # the scores are standardized: a variance near 1
    NOISES = (1e-6, 1e-4, 1e-2, 1e-1)

    def __init__(self, kernel: str = "matern52", length_scale: float | None = None,
                 amplitude: float | None = None, noise: float | None = None, normalize: bool = True):
        if kernel not in KERNELS:
            raise ValueError(f"GaussianProcess: kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
        for name, value in (("length_scale", length_scale), ("amplitude", amplitude), ("noise", noise)):
            if value is not None and not value > 0:
                raise ValueError(f"GaussianProcess: {name} must be > 0, got {value!r}")
        self.kernel, self.normalize = kernel, bool(normalize)
        self.length_scale, self.amplitude, self.noise = length_scale, amplitude, noise

    @staticmethod
    def _factor(unit_kernel, z, amplitude, noise):
        """Cholesky factor, α and log marginal likelihood of ``K = amplitude · unit_kernel + noise · I``."""
        K = amplitude * unit_kernel + noise * np.eye(len(z))
        try:
            L = np.linalg.cholesky(K)
        except np.linalg.LinAlgError:
            return None
        alpha = np.linalg.solve(L.T, np.linalg.solve(L, z))
        lml = -0.5 * z @ alpha - np.log(np.diag(L)).sum() - 0.5 * len(z) * _LOG_2PI
        return L, alpha, float(lml)

    def fit(self, X, y) -> GaussianProcess:
        X, y = np.atleast_2d(np.asarray(X, dtype=np.float64)), np.asarray(y, dtype=np.float64).ravel()
        if len(X) != len(y) or len(y) == 0:
            raise ValueError(f"GaussianProcess.fit: X has {len(X)} rows and y {len(y)} values; give one score "
                             "per row, at least one")
        if not np.isfinite(y).all() or not np.isfinite(X).all():
            raise ValueError("GaussianProcess.fit: X and y must be finite (replace a diverged trial's score first)")
        self.mean_, self.scale_ = (float(y.mean()), float(y.std()) or 1.0) if self.normalize else (0.0, 1.0)
        z = (y - self.mean_) / self.scale_
        best = None
        for ls in [self.length_scale] if self.length_scale else self.LENGTH_SCALES:
            unit = KERNELS[self.kernel](X, X, ls, 1.0)  # the amplitude only scales it
            for a in [self.amplitude] if self.amplitude else self.AMPLITUDES:
                for n in [self.noise] if self.noise else self.NOISES:
                    out = self._factor(unit, z, a, n)
                    if out is not None and (best is None or out[2] > best[0][2]):
                        best = (out, (ls, a, n))
        if best is None:
            raise ValueError("GaussianProcess.fit: the kernel matrix is not positive definite for any setting; "
                             "are there duplicate rows with a zero noise?")
        (self.L_, self.alpha_, self.log_marginal_likelihood_), (ls, a, n) = best
        self.length_scale_, self.amplitude_, self.noise_ = ls, a, n
        self.X_ = X
        return self

    def predict(self, X):
        """Posterior mean and variance of the (noise-free) function at each row of ``X``, in ``y``'s units."""
        if not hasattr(self, "L_"):
            raise ValueError("GaussianProcess.predict: call fit(X, y) first")
        X = np.atleast_2d(np.asarray(X, dtype=np.float64))
        kernel = KERNELS[self.kernel]
        Ks = kernel(self.X_, X, self.length_scale_, self.amplitude_)
        v = np.linalg.solve(self.L_, Ks)
        mean = Ks.T @ self.alpha_
        var = np.maximum(self.amplitude_ - (v * v).sum(0), 0.0)  # k(x, x) = s² for a stationary kernel
        return self.mean_ + self.scale_ * mean, self.scale_ ** 2 * var


def _normal_cdf(z):
    from math import erf
    return 0.5 * (1.0 + np.vectorize(erf)(np.asarray(z) / math.sqrt(2.0)))


def expected_improvement(mean, std, best: float, xi: float = 0.0) -> np.ndarray:
    """``EI = (μ − f* − ξ) Φ(Z) + σ φ(Z)``, ``Z = (μ − f* − ξ)/σ``, for maximization; ``max(μ − f* − ξ, 0)``
    where ``σ = 0``."""
    mean, std = np.asarray(mean, dtype=np.float64), np.asarray(std, dtype=np.float64)
    gain = mean - best - xi
    safe = np.where(std > 0, std, 1.0)
    z = gain / safe
    ei = gain * _normal_cdf(z) + safe * np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return np.where(std > 0, np.maximum(ei, 0.0), np.maximum(gain, 0.0))


def gp_search(objective, space: dict, n_trials: int, epochs: int, n_initial: int = 5, candidates: int = 1000,
              kernel: str = "matern52", xi: float = 0.01, seed: int = 0, mode: str = "max",
              metric: str | None = None, on_trial=None) -> SearchResult:
    """GP-EI: ``n_initial`` random configurations, then each next one the candidate of largest expected
    improvement under a GP fitted to every trial so far; ``epochs`` epochs each.

    ``xi`` is in the units of the standardized scores (a margin of ``xi`` standard deviations of the scores
    seen). Each trial's ``info`` records ``ei`` (None for the random ones).
    """
    n_trials, epochs = _positive_int(n_trials, "n_trials"), _positive_int(epochs, "epochs")
    n_initial, candidates = _positive_int(n_initial, "n_initial"), _positive_int(candidates, "candidates")
    if not any(isinstance(dim, Dimension) for dim in space.values()):
        raise ValueError("gp_search: the space has no range to search (every entry is a constant)")
    rng = np.random.default_rng(seed)
    runner = TrialRunner(objective, mode, on_trial)
    sign = 1.0 if mode == "max" else -1.0
    for i in range(n_trials):
        done = [t for t in runner.trials if t.status == "ok"]
        if i < n_initial or not done:
            config, ei = sample(space, rng), None
        else:
            worst = min(sign * t.score for t in done)
            y = np.array([sign * t.score if t.status == "ok" else worst for t in runner.trials])
            X = np.stack([encode(space, t.config) for t in runner.trials])
            gp = GaussianProcess(kernel).fit(X, y)
            pool = [sample(space, rng) for _ in range(candidates)]
            mean, var = gp.predict(np.stack([encode(space, c) for c in pool]))
            # xi in standardized units, so one default suits accuracies and losses alike
            scores = expected_improvement(mean, np.sqrt(var), float(y.max()), xi * gp.scale_)
            k = int(np.argmax(scores))
            config, ei = pool[k], float(scores[k])
        runner.run(config, epochs, key=("gp", i), info_from_strategy={"ei": ei})
        runner.release(("gp", i))
    return runner.result("gp", metric_name(objective, metric))
