"""Array kernels that NumPy lacks or runs slowly, written with NumPy's own whole-array calls.

Three places where the obvious NumPy line costs a real program much of its step:

- NumPy has no error function, and SciPy's runs one element at a time in float64:
  :func:`erf` is a polynomial evaluated on whole arrays, to float64 accuracy in float64 and
  a rational function, to float32 accuracy, in float32;
- ``np.add.at``, the scatter-add that adds every repeat of an index, loops over the index
  one element at a time: :func:`scatter_add` sorts the index once and adds each run of equal
  indices with one ``np.add.reduceat`` (about 5 times faster on an embedding's gradient), or,
  into at most 32 places, multiplies by the index's one-hot matrix (2–7 times faster again);
- ``x.sum(axis=-1)`` over short rows pays NumPy's pairwise-sum setup once per row:
  :func:`sum_trailing` and :func:`dot_trailing` sum short rows in one ``einsum``.

erf and scatter_add work on NumPy arrays (the sums fall back to ``x.sum`` on any other);
``minidl.backend`` picks these or CuPy's own spellings (``cupyx.scipy.special.erf``,
``cupyx.scatter_add``), so the ops never need to know which.
"""
from __future__ import annotations

import math

import numpy as np

# ---------------------------------------------------------------- the error function
# erf(x) = (2/√π) ∫₀ˣ e^(−t²) dt, odd, rising from 0 to 1; two evaluations, one per precision.
#
# float64, to its last bits (the gradient checks run in float64), on a = |x| with x's sign put back:
#   a < 0.75: the Maclaurin series, whose terms alternate and shrink fast there,
#       erf(a) = a · Σₙ cₙ a²ⁿ,   cₙ = (2/√π) (−1)ⁿ / (n! (2n + 1)),
#     15 terms (the 16th is 4·10⁻¹⁸ of the sum at a = 0.75);
#   a ≥ 0.75: erf(a) = 1 − e^(−a²) R(a), where R = e^(a²) erfc(a) is smooth and slowly varying
#     (0.61 at 0.75, 0.09 at 6). As a function of t = 1/(1 + a/2) (Numerical Recipes' variable)
#     a polynomial of degree 16 follows it to 3·10⁻¹⁵: the Chebyshev interpolant of R on
#     a ∈ [0.75, 6], computed in 50-digit arithmetic (mpmath) and written in powers of the
#     normalized v = (2t − t_lo − t_hi)/(t_hi − t_lo) ∈ [−1, 1]. Past 6, erf rounds to 1.
#
# float32, fast: one rational function of x,
#       erf(x) ≈ x · P(x²) / Q(x²),  P of degree 6 and Q of degree 5 in x²,
#   fitted to erf on [0, 3.92] (past which erf rounds to 1 in float32) by Lawson's iteration of
#   weighted least squares (error 3·10⁻⁸ in exact arithmetic); no exp and no branch, so about 25
#   whole-array passes, each in cache. Rounded in float32 it is within 6 ulps of erf (4·10⁻⁷).
#   Just past 3.92 it stays within an ulp of 1 and from 4.25 on it exceeds 1: so x is clamped
#   to ±4.3 and the result to ±1, which makes erf(±∞) = ±1 exactly. float16 and bfloat16 go
#   through float32.
_TWO_OVER_SQRT_PI = 2 / math.sqrt(math.pi)
_SERIES_LIMIT = 0.75
_SERIES = tuple(_TWO_OVER_SQRT_PI * (-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in range(15))
_TAIL_CLAMP = 6.0
_T_LO, _T_HI = 1 / (1 + _TAIL_CLAMP / 2), 1 / (1 + _SERIES_LIMIT / 2)
_TAIL = (0.2458108043840276, 0.19869989217993056, 0.05382333879871095, 0.008545561146519786,
         0.00023459019386954072, -0.00017016631372902342, -1.1849816571404503e-05, 5.4762976973764096e-06,
         2.148637360617148e-07, -2.3104637816421474e-07, 1.2365678588331646e-08, 9.180665936698489e-09,
         -1.872042088232245e-09, -1.9091630669943562e-10, 1.353576577887264e-10, -7.486898618335933e-12,
         -5.92556034537255e-12)
_RATIONAL_CLAMP = 4.3
_RATIONAL_P = (1.1283791808198325, 0.18470031992894764, 0.0542784765365682, 0.003832375346816304,
               0.0003803813409068691, 4.718097069821708e-06, -1.3337457527295982e-08)
_RATIONAL_Q = (1.0, 0.49701992529006966, 0.11377544904775948, 0.015430975240285248, 0.001305041807437193,
               6.342178875326943e-05)


def erf(x):
    """The error function of a real floating NumPy array, elementwise, in x's dtype, without SciPy.

    float64 within 2 ulps of the true value; float32 (and float16, bfloat16, computed in
    float32) within 6 float32 ulps. NaN stays NaN, ±∞ gives ±1. Whole-array NumPy calls only.
    """
    dtype = x.dtype
    if dtype.kind != "f" and not (dtype.kind == "V" and dtype.name == "bfloat16"):
        raise TypeError(f"erf: the NumPy kernel takes real floating arrays, got dtype {dtype}; complex "
                        "arguments need SciPy (pip install scipy)")
    if x.ndim == 0:  # NumPy's arithmetic on 0-d arrays returns scalars, which cannot be written in place
        return erf(x.reshape(1)).reshape(())
    if dtype == np.float64:
        return _erf_float64(x)
    y = _erf_float32(x.astype(np.float32))
    return y if dtype == np.float32 else y.astype(dtype)


def _horner(coefficients, z, like):
    """Σ cₖ zᵏ by Horner's rule on one new buffer (coefficients lowest power first)."""
    acc = np.full_like(like, coefficients[-1])
    for c in coefficients[-2::-1]:
        acc *= z
        acc += c
    return acc


def _erf_float32(x):
    clamped = np.clip(x, -_RATIONAL_CLAMP, _RATIONAL_CLAMP)  # NaN stays NaN
    square = clamped * clamped
    y = _horner(_RATIONAL_P, square, square)
    y *= clamped
    y /= _horner(_RATIONAL_Q, square, square)
    return np.clip(y, -1, 1, out=y)


def _erf_float64(x):
    a = np.abs(x)
    small = a < _SERIES_LIMIT
    if small.all():
        y = _series(a)
    elif not small.any():
        y = _tail(a)
    else:
        y = np.empty_like(a)
        y[small] = _series(a[small])
        large = ~small  # NaN counts as large, and stays NaN there
        y[large] = _tail(a[large])
    np.copysign(y, x, out=y)
    return y


def _series(a):
    """a · Σ cₙ a²ⁿ."""
    y = _horner(_SERIES, a * a, a)
    y *= a
    return y


def _tail(a):
    """1 − e^(−a²) R(t),  t = 1/(1 + a/2),  R a polynomial in the normalized v."""
    a = np.minimum(a, _TAIL_CLAMP)  # NaN stays NaN
    v = a * 0.5
    v += 1
    np.divide(2 / (_T_HI - _T_LO), v, out=v)  # the scale of v times t
    v -= (_T_HI + _T_LO) / (_T_HI - _T_LO)
    r = _horner(_TAIL, v, a)
    np.multiply(a, a, out=v)
    np.negative(v, out=v)
    np.exp(v, out=v)
    r *= v
    np.subtract(1, r, out=r)
    return r


# ---------------------------------------------------------------- scatter-add
def scatter_add(target, key, values) -> None:
    """``target[key] += values`` in place on NumPy arrays, every repeat of an index adding up
    (``np.add.at``'s meaning), with the index sorted once instead of looped over.

    The keys that gradients use take the fast path: one integer array among slices (an
    embedding's rows, ``x[:, idx]``), or one integer array per axis (a gather's places).
    Equal indices are brought together by a stable sort, each run is summed by
    ``np.add.reduceat``, and each sum is added once to its place. The value is ``np.add.at``'s
    to rounding: a run's terms are added in reduceat's order, then to the target once, where
    ``np.add.at`` adds them to the target one by one (the same inputs always give the same
    bits). Any other key (booleans, integers mixed with arrays) goes to ``np.add.at``.
    """
    plan = _rows_of(target, key)
    if plan is None or target.dtype.kind in "bO" or getattr(values, "dtype", target.dtype).kind in "bO":
        np.add.at(target, key, values)
        return
    view, axis, index = plan
    _add_rows(view, axis, index, values)


def _is_index_array(k) -> bool:
    return isinstance(k, np.ndarray) and k.dtype.kind in "iu"


def _rows_of(target, key):
    """(view of target, axis, integer index) such that ``target[key]`` is ``view`` indexed by
    ``index`` along ``axis``; None for a key outside the fast path."""
    keys = key if isinstance(key, tuple) else (key,)
    arrays = [i for i, k in enumerate(keys) if _is_index_array(k)]
    if len(keys) > target.ndim or not arrays:
        return None
    if len(arrays) == 1 and all(isinstance(k, slice) for i, k in enumerate(keys) if i != arrays[0]):
        axis = arrays[0]
        basic = tuple(slice(None) if i == axis else k for i, k in enumerate(keys))
        return target[basic], axis, keys[axis]
    if len(arrays) == len(keys) == target.ndim and target.flags.c_contiguous:
        try:
            places = np.broadcast_arrays(*[_wrapped(k, n) for k, n in zip(keys, target.shape)])
        except ValueError:
            return None  # shapes that do not broadcast: np.add.at says so
        flat = np.ravel_multi_index(places, target.shape)  # an index past an axis raises ValueError
        return target.reshape(-1), 0, flat
    return None


def _wrapped(index, size):
    """``index`` with negative entries counted from the end, as NumPy reads them; IndexError past either end."""
    if index.size == 0:
        return index
    low = index.min()
    if low < -size or index.max() >= size:
        bad = low if low < -size else index.max()
        raise IndexError(f"index {bad} is out of bounds for axis with size {size}")
    return index + size * (index < 0) if low < 0 else index


# The dtypes BLAS and einsum's own loops take (16-bit floats keep NumPy's float32 sums and loops).
_FAST_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
ONE_HOT_ROWS = 32  # at most this many places: a one-hot product (2-7× faster than sorting, measured up to n = 2048)


def _add_rows(view, axis, index, values):
    """view[(:,)*axis + (index,)] += values, repeats adding up: by a product with the index's one-hot
    matrix when there are at most ONE_HOT_ROWS places, else by sort and reduceat."""
    size = view.shape[axis]
    flat = _wrapped(index.reshape(-1), size)
    if flat.size == 0:
        return
    before, after = view.shape[:axis], view.shape[axis + 1:]
    values = np.broadcast_to(values, before + index.shape + after).reshape(before + (flat.size,) + after)
    if axis:
        view, values = np.moveaxis(view, axis, 0), np.moveaxis(values, axis, 0)
    if (size <= ONE_HOT_ROWS and view.dtype in _FAST_DTYPES and values.dtype == view.dtype
            and np.isfinite(values).all()):
        # Few places (an embedding of characters): the sums are one product E·values with the index's
        # one-hot matrix E (places × n), E[flat[j], j] = 1. Finite values only: 0·∞ would be NaN everywhere.
        one_hot = np.zeros((size, flat.size), values.dtype)
        one_hot[flat, np.arange(flat.size)] = 1
        view += (one_hot @ values.reshape(flat.size, -1)).reshape(view.shape)
        return
    order = np.argsort(flat, kind="stable")  # equal indices together, in their original order
    sorted_index = flat[order]
    starts = np.flatnonzero(np.concatenate(([True], sorted_index[1:] != sorted_index[:-1])))
    sums = np.add.reduceat(np.take(values, order, axis=0), starts, axis=0)
    view[sorted_index[starts]] += sums


# ---------------------------------------------------------------- sums over short rows
# NumPy sums each short row separately, with its pairwise summation's setup each time: over
# rows of 64 float32 values, x.sum(axis=-1) takes three times as long as einsum's one loop.
SHORT_ROW = 256  # longer rows keep NumPy's pairwise sum (error ∝ log n, where a running sum's grows ∝ n)


def sum_trailing(x, count: int, keepdims: bool = True):
    """x summed over its last ``count`` axes (keepdims by default).

    Rows of at most :data:`SHORT_ROW` values of a C-contiguous NumPy array are summed by one
    ``einsum`` (a running sum per row, rounded like a plain loop); anything else by ``x.sum``.
    """
    axes = tuple(range(-count, 0))
    row = 1
    for n in x.shape[x.ndim - count:]:
        row *= n
    if not isinstance(x, np.ndarray) or row > SHORT_ROW or not x.flags.c_contiguous or x.dtype not in _FAST_DTYPES:
        return x.sum(axis=axes, keepdims=keepdims)
    lead = x.shape[:x.ndim - count]
    sums = np.einsum("ij->i", x.reshape(-1, row))
    return sums.reshape(lead + (1,) * count if keepdims else lead)


def dot_trailing(a, b, count: int):
    """Σ a·b over the last ``count`` axes, keepdims: one einsum for short rows of C-contiguous NumPy
    arrays of one shape (no a·b temporary), else (a * b).sum."""
    axes = tuple(range(-count, 0))  # counted from the end: a and b may broadcast to more axes
    row = 1
    for n in a.shape[a.ndim - count:]:
        row *= n
    if (not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray) or a.shape != b.shape or row > SHORT_ROW
            or not a.flags.c_contiguous or not b.flags.c_contiguous or a.dtype != b.dtype
            or a.dtype not in _FAST_DTYPES):
        return (a * b).sum(axis=axes, keepdims=True)
    lead = a.shape[:a.ndim - count]
    return np.einsum("ij,ij->i", a.reshape(-1, row), b.reshape(-1, row)).reshape(lead + (1,) * count)
