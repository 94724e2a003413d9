"""Pure 16-bit training: weights, gradients and optimizer state in float16/bfloat16, with updates that are not lost.

    model = model.to(mdl.bfloat16)                                   # no float32 master copy
    opt = optim.LowPrecisionOptimizer(optim.SGD(model.parameters(), lr=1e-3), rounding="stochastic")
    ...loss.backward(); opt.step()...                                 # or rounding="kahan"

Why plain 16-bit weights stop learning (notebook 10): near w = 1 the
neighbouring bfloat16 values are 2⁻⁷ apart, so an update lr·g smaller in size than half
that gap rounds back to w, every step, and the weight never moves. Mixed
precision answers with a float32 master copy (4 more bytes a weight). Two
cures keep the weights in 16 bits instead (Zamirai et al. 2020, "Revisiting
BFloat16 Training"; Gupta et al. 2015 for stochastic rounding):

**Stochastic rounding.** x lies between two neighbouring 16-bit values
lo ≤ x < hi; round up with probability proportional to proximity, to x̃:

    x̃ = hi  with probability p = (x − lo) / (hi − lo),   lo  otherwise
    E[x̃] = lo + p·(hi − lo) = x                       (unbiased)
    Var[x̃] = p(1 − p)(hi − lo)² ≤ (hi − lo)² / 4

An update of a tenth of the gap moves the weight by a whole gap one time in
ten: on average the weight moves as in float32, with noise of at most half
a gap per step.

**Kahan-compensated update.** Keep a 16-bit buffer c of what rounding
threw away and feed it back into the next update (Kahan 1965's summation,
with w the running sum, Δ = the optimizer's step, and round to the nearest 16-bit value):

    y = Δ − c          the step plus what the last rounding lost (c holds minus the loss)
    t = round(w + y)     the new 16-bit weight
    c = round((t − w) − y)   what this rounding lost: (t − w) is the step taken, y the step wanted
    w = t

The arithmetic of each line is float32 (what a GPU's registers hold); what
is stored is 16 bits: w, c, the gradient and the optimizer's state. The
optimizer's own equations are unchanged: :class:`LowPrecisionOptimizer`
hands them float32 copies of w, g and the state, takes the step Δ = w' − w
they make, writes the state back rounded to nearest and the weight by the
chosen rounding.
"""
from __future__ import annotations

import numpy as np

from minidl import backend
from minidl.autograd import enable_grad, no_grad
from minidl.optim.optimizer import Optimizer
from minidl.optim.saved_state import host_copy, on_device
from minidl.optim.wrapper import WrapsOptimizer
from minidl.tensor import mark_changed

__all__ = ["LowPrecisionOptimizer", "kahan_update", "rounding_neighbours", "stochastic_round"]

_ROUNDINGS = ("stochastic", "kahan", "nearest")


def _check_low(owner: str, dtype) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype.itemsize != 2 or not backend.is_floating(dtype):
        raise TypeError(f"{owner}: expected a 16-bit float dtype (float16 or bfloat16), got {dtype}")
    return dtype


def _wide(x):
    """x as the float type its arithmetic runs in: float64 stays float64, everything else float32."""
    return x if x.dtype == np.float64 else x.astype(np.float32)


def rounding_neighbours(x, dtype) -> tuple:
    """(lo, hi): the neighbouring ``dtype`` values around x with abs(lo) ≤ abs(x) < abs(hi) (signs as x's).

    Found on the bit pattern: a non-negative 16-bit float's bits, read as an
    unsigned integer, grow with its value, so the next value up is bits + 1.
    """
    dtype = _check_low("rounding_neighbours", dtype)
    xp = backend.xp_of(x)
    magnitude = xp.abs(_wide(x))
    with np.errstate(over="ignore"):             # beyond dtype's range: inf, as round-to-nearest gives
        nearest = magnitude.astype(dtype)
    bits = nearest.view(xp.uint16)
    lo_bits = bits - (nearest.astype(magnitude.dtype) > magnitude).astype(xp.uint16)  # nearest above x: one down
    sign = xp.signbit(x).astype(xp.uint16) << 15
    return (lo_bits | sign).view(dtype), ((lo_bits + 1) | sign).view(dtype)


def stochastic_round(x, dtype, rng=None):
    """SR(x): x rounded to one of its two neighbouring ``dtype`` values, up with probability (x − lo)/(hi − lo).

    Unbiased (E[SR(x)] = x) with variance at most (hi − lo)²/4. Values that
    ``dtype`` holds exactly come back unchanged; inf, NaN and values beyond
    ``dtype``'s range become what round-to-nearest makes of them.
    ``rng``: a generator (``backend.rng(device)``, seeded by ``mdl.manual_seed``, by default).
    """
    dtype = _check_low("stochastic_round", dtype)
    xp = backend.xp_of(x)
    x = _wide(x)
    lo, hi = rounding_neighbours(x, dtype)
    lo_w, hi_w = lo.astype(x.dtype), hi.astype(x.dtype)
    with np.errstate(invalid="ignore"):          # at inf or NaN the gap is not a number; nearest is kept below
        p_up = (x - lo_w) / (hi_w - lo_w)        # both differences exact (Sterbenz): only the quotient rounds
    rng = backend.rng(backend.device_of(x)) if rng is None else rng
    u = rng.random(x.shape, dtype=np.float32 if x.dtype == np.float32 else np.float64)
    out = xp.where(u < p_up, hi, lo)
    with np.errstate(over="ignore"):
        nearest = x.astype(dtype)
    return xp.where(xp.isfinite(nearest), out, nearest)


def kahan_update(w, delta, c) -> None:
    """w ← w + Δ with Kahan compensation, in place on the 16-bit arrays w and c (Δ in float32).

        y = Δ − c;   t = round(w + y);   c = round((t − w) − y);   w = t
    """
    y = _wide(delta) - _wide(c)
    w_wide = _wide(w)
    t = (w_wide + y).astype(w.dtype)
    c[...] = ((_wide(t) - w_wide) - y).astype(c.dtype)
    w[...] = t


class LowPrecisionOptimizer(WrapsOptimizer, Optimizer):
    """``LowPrecisionOptimizer(optimizer, rounding="stochastic")``: any optimizer, on 16-bit parameters.

    Every parameter must be float16 or bfloat16 (``model.to(mdl.bfloat16)``).
    Per parameter and step: the inner optimizer's ``update`` runs on float32
    copies of w, g and its state (its equations unchanged); its state is
    stored back in w's dtype (rounded to nearest: it is not a running sum of
    tiny steps); the step Δ = w' − w reaches the weight by ``rounding``:

    - ``"stochastic"``: w ← SR(w + Δ)  (see :func:`stochastic_round`);
    - ``"kahan"``: w, c ← :func:`kahan_update` (a 16-bit buffer c per parameter, in the state dict);
    - ``"nearest"``: w ← round(w + Δ), what plain 16-bit training does (small steps are lost).
    """

    def __init__(self, optimizer: Optimizer, rounding: str = "stochastic"):  # noqa: D107 - no super().__init__
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"LowPrecisionOptimizer: expected an inner optimizer (e.g. SGD(params)), "
                            f"got {type(optimizer).__name__}")
        if rounding not in _ROUNDINGS:
            raise ValueError(f"LowPrecisionOptimizer: rounding must be one of {_ROUNDINGS}, got {rounding!r}")
        for pos, p, _ in optimizer.parameters():
            if p.dtype.itemsize != 2 or not backend.is_floating(p.dtype):
                raise TypeError(f"LowPrecisionOptimizer: parameter {pos} (shape {p.shape}) is {p.dtype}; pure 16-bit "
                                "training needs float16 or bfloat16 parameters: model.to(mdl.bfloat16) first")
        self.optimizer, self.rounding, self.defaults = optimizer, rounding, optimizer.defaults
        self.compensation = {pos: p.xp.zeros_like(p.array) for pos, p, _ in optimizer.parameters()} \
            if rounding == "kahan" else {}

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        inner = self.optimizer
        changed = []
        for pos, p, group in inner.parameters():
            if p.grad is None or not p.requires_grad:
                continue
            with no_grad(), backend.using(p.device):
                self._update(pos, p, group, inner.state.setdefault(pos, {}))
            changed.append(p)
        mark_changed(*changed)
        return loss

    def _update(self, pos, p, group, state):
        w16 = p.array
        wide = {k: _wide(v) for k, v in state.items() if _is_float_array(v)}
        working = {**state, **wide}
        w = _wide(w16)
        self.optimizer.update_parameter(p, w, _wide(p.grad.array), working, group)
        for k, v in working.items():             # the state is stored in 16 bits
            state[k] = v.astype(w16.dtype) if _is_float_array(v) else v
        if self.rounding == "stochastic":
            w16[...] = stochastic_round(w, w16.dtype)
        elif self.rounding == "kahan":
            kahan_update(w16, w - _wide(w16), self.compensation[pos])
        else:
            w16[...] = w.astype(w16.dtype)

    def state_dict(self):
        return {"inner": self.optimizer.state_dict(), "rounding": self.rounding,
                "compensation": {pos: host_copy(c) for pos, c in self.compensation.items()}}

    def load_state_dict(self, state_dict):
        if state_dict.get("rounding") != self.rounding:
            raise ValueError(f"LowPrecisionOptimizer.load_state_dict: the state was saved with rounding="
                             f"{state_dict.get('rounding')!r}, this optimizer rounds {self.rounding!r}")
        params = {pos: p for pos, p, _ in self.optimizer.parameters()}
        saved = {int(pos): c for pos, c in state_dict["compensation"].items()}
        for pos, c in saved.items():
            if pos not in params or tuple(c.shape) != params[pos].shape or c.dtype != params[pos].dtype:
                raise ValueError(f"LowPrecisionOptimizer.load_state_dict: compensation buffer {pos} has shape "
                                 f"{tuple(c.shape)} and dtype {c.dtype}; the parameter is "
                                 f"{params[pos].shape if pos in params else 'missing'}")
        self.optimizer.load_state_dict(state_dict["inner"])
        self.compensation = {pos: on_device(c, params[pos].device) for pos, c in saved.items()}

    def __repr__(self):
        return f"LowPrecisionOptimizer(rounding={self.rounding!r}, {self.optimizer!r})"


def _is_float_array(value) -> bool:
    return hasattr(value, "dtype") and getattr(value, "ndim", 0) > 0 and backend.is_floating(value.dtype)
