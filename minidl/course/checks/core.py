"""What a check is, and how a result is compared: located, and diagnosed by the mistakes it matches.

A :class:`Check` runs the student's code on one case at a time. Its public
cases are fixed (the ones ``minidl course check`` runs); its hidden cases are
drawn from a seed the student never sees (the ones ``minidl course grade``
adds). The check computes the expected result independently (a NumPy formula,
finite differences, a reference line by line) and hands it with the student's
result to :func:`compare`, together with what each known mistake would have
given on the same case. A mismatch is then reported where it is (which
output, which index, expected against got) and, when the result equals a
mistake's, by that mistake's name.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

# The mistakes the feedback names, in plain words (the key is what the grade's JSON lists).
MISTAKES = {
    "transposed operand": "an operand is transposed where it should not be (or not transposed where it should)",
    "missing sum over broadcast axes": "the gradient was not summed over the axes that broadcasting added or "
                                       "stretched, so it has the broadcast shape",
    "sign": "the sign is flipped: your values are the expected ones negated",
    "factor of 2": "off by a factor of 2: your values are twice (or half) the expected ones",
    "bias correction t off by one": "the bias correction uses the wrong step number (t − 1 or t + 1 instead of t)",
    "missing bias correction": "the moments are used without the bias correction 1/(1 − βᵗ)",
    "stride off by one": "one window too many or too few along an axis: an off-by-one in the stride arithmetic",
    "in-place write into a saved input": "your code wrote into an array it was given (an input, a saved value or "
                                         "the incoming gradient), which other code still reads",
    "gradient overwritten, not accumulated": "a gradient replaced the one already there instead of adding to it, "
                                             "so a value used twice gets only one use's gradient",
    "missing term": "a term of the formula is missing (a product rule with one term, a Jacobian without its "
                    "off-diagonal part)",
    "wrong axis": "the reduction runs over the wrong axis",
    "missing scale": "a constant factor of the formula (a scale, a count, a learning rate) is missing",
    "fan_in and fan_out swapped": "fan_in and fan_out are swapped",
    "missing gain": "the gain of the nonlinearity is missing",
    "uniform bound is σ, not √3·σ": "a uniform distribution U(−a, a) has σ = a/√3: the bound must be √3·σ",
    "order not topological": "a node's backward ran before every use of its output had sent its gradient",
    "missing Nesterov look-ahead": "Nesterov's step is lr·(g + μb), not lr·b",
    "ε inside the square root": "ε belongs outside the square root: √s + ε",
    "weight decay on the gradient": "AdamW decays the weights directly (w ← w − lr·λw), not through the gradient",
    "missing normalization": "the counts were not divided by their total",
    "last segment checkpointed": "the last segment should run normally: its activations are needed at once",
    "segments misplaced": "the segments do not start where the rule says",
    "chunks misrouted": "a rank sent or kept the wrong chunk at some step of the ring",
    "not averaged": "the gradients were summed over the ranks but not divided by their number",
    "averaged, not summed": "the gradient was averaged over the broadcast axes; it must be summed",
    "dilation ignored": "the kernel's taps are dilation apart: a dilated kernel spans d·(k − 1) + 1 pixels",
    "stride ignored": "the windows were placed one pixel apart, as if the stride were 1",
    "wrong factor": "the product rule gives each factor the *other* factor's value times the output's gradient",
    "input used for output": "the derivative uses the op's input where its output belongs, or the other way "
                             "round (tanh: 1 − y², exp: y, log: 1/x)",
    "missing square": "a square is missing (tanh: 1 − y², the quotient rule: a/b has derivative (ȧb − aḃ)/b²)",
    "power not lowered": "the derivative of xⁿ is n·xⁿ⁻¹: the power drops by one",
    "missing seed": "the walk starts from the output's own gradient, ∂L/∂L = 1",
    "node visited twice": "a node reached along two paths ran its backward twice",
    "receptive field ignored": "a convolution's fans count every tap of its kernel: in·∏k and out·∏k",
    "variance for standard deviation": "a variance was used where a standard deviation belongs (a gain is √2 "
                                       "for ReLU, not 2; σ = gain/√fan, not gain²/fan)",
    "only one fan": "Xavier balances both directions: Var(w) = 2/(fan_in + fan_out), not 1/fan_in",
    "rounded down": "√L is rounded to the nearest whole number, not down",
    "nothing checkpointed": "the layers ran plainly: every activation is kept and nothing is rematerialized",
    "steps off by one": "the ring takes N − 1 steps: one more adds a chunk twice, one fewer leaves chunks partial",
    "added, not copied": "the all-gather stores each chunk it receives; adding it mixes in stale values",
    "not a ring": "a ring sends 2(N − 1)/N of the array from each rank, in chunks; whole arrays cost far more",
    "updated too early": "a running average was updated before the line that must read its old value",
    "trust ratio inverted": "the trust ratio is ‖w‖ / ‖update‖, not its inverse",
    "1-D layers adapted": "LARS skips the trust ratio (and the decay) for 1-D parameters: biases, norm scales",
    "no logarithm": "a bias that makes softmax or the sigmoid give the base rates is a log-odds: log(prior)",
}


class Mismatch(AssertionError):
    """The student's result is wrong: ``message`` says where; ``mistakes`` names the known ones it matches."""

    def __init__(self, message: str, mistakes=()):
        super().__init__(message)
        self.message, self.mistakes = message, list(mistakes)


@dataclass
class Case:
    """One case of a check: its ``params`` (shapes, settings), a random generator for its data, and the
    qualified names of the task's functions (from the table of assignments, so that a check that calls
    one of them directly follows a rename there)."""

    params: dict
    rng: np.random.Generator
    hidden: bool
    functions: tuple = ()

    def __getitem__(self, key):
        return self.params[key]

    def get(self, key, default=None):
        return self.params.get(key, default)

    def function(self, suffix: str):
        """The task's function whose qualified name ends with ``suffix``, imported (the student's)."""
        for name in self.functions:
            if name.endswith(suffix):
                return resolve(name)
        raise LookupError(f"the task names no function ending in {suffix!r} (its functions: {self.functions})")


def resolve(name: str):
    """The object a qualified name such as ``minidl.autograd.walk.topological_order`` names."""
    import importlib
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            obj = getattr(obj, attribute)
        return obj
    raise LookupError(f"no module for {name!r}")


@dataclass
class Check:
    """A named check: ``run(case)`` raises Mismatch (or the student's own exception) when a case fails.

    ``public``: the cases every student sees (a list of parameter dicts). ``hidden(rng)``: the grader's
    extra cases drawn from its secret seed; ``hidden_count`` of them, declared, so that a check that
    ran fewer is caught. ``label(params)`` describes a case in the feedback.
    """

    name: str
    run: Callable
    public: list
    hidden: Callable
    hidden_count: int
    label: Callable = field(default=lambda p: ", ".join(f"{k}={v}" for k, v in p.items()))

    def cases(self, hidden_seed=None, functions=()) -> list:
        """The public cases, and with a ``hidden_seed`` the hidden ones after them."""
        functions = tuple(functions)
        out = [Case(dict(p), np.random.default_rng([index, 1]), False, functions)
               for index, p in enumerate(self.public)]
        if hidden_seed is not None:
            drawn = self.draw_hidden(np.random.default_rng([hidden_seed, _stable_hash(self.name)]))
            out += [Case(dict(p), np.random.default_rng([hidden_seed, _stable_hash(self.name), index]), True, functions)
                    for index, p in enumerate(drawn)]
        return out


    def draw_hidden(self, rng) -> list:
        """``hidden_count`` hidden cases from ``rng``, none of them a public case (drawn again until so)."""
        public = {_key(p) for p in self.public}
        drawn = list(self.hidden(rng))  # fewer than declared: the runner reports the shortfall
        for i in range(len(drawn)):
            for _ in range(50):
                if _key(drawn[i]) not in public:
                    break
                again = self.hidden(rng)
                drawn[i] = again[i] if i < len(again) else drawn[i]
        return drawn


def _key(params) -> str:
    return repr(sorted((k, repr(v)) for k, v in params.items()))


_REGISTRY: dict = {}


def check(name: str, public: list, hidden: Callable, hidden_count: int, label: Callable | None = None):
    """Decorator: register ``run(case)`` as the check ``name`` (``"a2.matmul"``)."""
    def register(run):
        if name in _REGISTRY:
            raise ValueError(f"course checks: {name!r} is registered twice")
        _REGISTRY[name] = Check(name, run, list(public), hidden, hidden_count,
                                label or (lambda p: ", ".join(f"{k}={v}" for k, v in p.items())))
        return run
    return register


def registry() -> dict:
    return _REGISTRY


def _stable_hash(text: str) -> int:
    """A hash of ``text`` that is the same in every process (Python's own is salted per process)."""
    value = 0
    for ch in text.encode():
        value = (value * 131 + ch) % (1 << 31)
    return value


# ---------------------------------------------------------------- comparing a result
def tolerance(dtype) -> tuple:
    """(rtol, atol factor) for results in ``dtype``: float32 keeps about 7 digits, float64 about 16."""
    return (2e-4, 2e-5) if np.dtype(dtype).itemsize <= 4 else (1e-7, 1e-9)


def as_array(value):
    """A Tensor, an array or a number as a NumPy array (None stays None)."""
    if value is None:
        return None
    if hasattr(value, "creator") and hasattr(value, "numpy"):  # a Tensor, on either device
        return np.asarray(value.numpy())
    return np.asarray(value)


def close(expected, got, dtype) -> bool:
    """``got`` equals ``expected`` to the tolerance of ``dtype`` (scaled by the largest finite expected entry);
    a NaN or an infinity matches only the same non-finite value (a mistake's prediction may hold them)."""
    if got is None or np.shape(got) != np.shape(expected):
        return False
    rtol, atol = tolerance(dtype)
    expected, got = np.asarray(expected, np.float64), np.asarray(got, np.float64)
    finite = np.isfinite(expected)
    scale = max(1.0, float(np.max(np.abs(expected[finite])))) if finite.any() else 1.0
    with np.errstate(invalid="ignore"):
        near = np.abs(got - expected) <= atol * scale + rtol * np.abs(expected)
    same = (np.isnan(expected) & np.isnan(got)) | (~finite & (expected == got))
    return bool(np.all(np.where(finite, near, same)))


def _sum_to_numpy(array, shape):
    lead = array.ndim - len(shape)
    if lead < 0:
        return None
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and array.shape[lead + i] != 1)
    try:
        return array.sum(axis=axes, keepdims=True).reshape(shape)
    except ValueError:
        return None


def _index(flat, shape) -> str:
    return "[" + ", ".join(map(str, np.unravel_index(flat, shape))) + "]" if shape else ""


def _fmt(x) -> str:
    return f"{float(x):.6g}"


def compare(what: str, expected, got, dtype=None, mistakes: dict | None = None, exact_dtype: bool = True):
    """Raise Mismatch unless ``got`` equals ``expected``; the message locates the wrong entry.

    ``mistakes``: name -> what that mistake gives on this case (an array, or a function of nothing
    that computes it; one that raises is skipped), as a dict or as (name, value) pairs when one
    name has several forms. The generic ones are always tried: the sign, a factor of 2, a result
    transposed, and a gradient left with its broadcast shape.
    """
    expected = np.asarray(expected)
    dtype = dtype if dtype is not None else expected.dtype
    if got is None:
        names = [n for n, v in (mistakes.items() if isinstance(mistakes, dict) else mistakes or ())
                 if not callable(v) and v is not None and np.all(np.asarray(v) == 0)]
        raise Mismatch(f"{what}: got None (no value came back; expected an array of shape {expected.shape})", names)
    got_array = as_array(got)
    if not np.issubdtype(got_array.dtype, np.number) and got_array.dtype != np.bool_:
        raise Mismatch(f"{what}: got a {type(got).__name__}, expected numbers of shape {expected.shape}")
    named = _matching(expected, got_array, dtype, mistakes or {})
    if got_array.shape != expected.shape:
        raise Mismatch(f"{what} has shape {got_array.shape}, expected {expected.shape}", named)
    if exact_dtype and np.issubdtype(expected.dtype, np.floating) and got_array.dtype != np.dtype(dtype):
        raise Mismatch(f"{what} has dtype {got_array.dtype}, expected {np.dtype(dtype)} "
                       "(keep the inputs' precision: no float64 constants or arrays in a float32 computation)")
    if close(expected, got_array, dtype):
        return
    e, g = np.asarray(expected, np.float64), np.asarray(got_array, np.float64)
    rtol, atol = tolerance(dtype)
    scale = max(1.0, float(np.max(np.abs(e)))) if e.size else 1.0
    bad = ~(np.abs(g - e) <= atol * scale + rtol * np.abs(e))
    error = np.where(np.isnan(g), np.inf, np.abs(g - e))
    worst = int(np.argmax(np.where(bad, error, -1)))
    where = _index(worst, e.shape)
    raise Mismatch(f"{what}{where} is {_fmt(g.flat[worst])}, expected {_fmt(e.flat[worst])} "
                   f"({int(bad.sum())} of {e.size} entries differ)", named)


def _matching(expected, got, dtype, mistakes: dict) -> list:
    """The names of the mistakes whose result equals ``got`` on this case."""
    found = []
    for name, predicted in (mistakes.items() if isinstance(mistakes, dict) else mistakes):
        try:
            value = predicted() if callable(predicted) else predicted
        except Exception:  # noqa: BLE001 - a mistake that cannot happen on this case
            continue
        if value is not None and close(np.asarray(value), got, dtype) and not close(expected, got, dtype) \
                and name not in found:
            found.append(name)
    if expected.size and np.any(expected != 0) and got.shape == expected.shape:
        if "sign" not in found and close(-np.asarray(expected, np.float64), got, dtype):
            found.append("sign")
        if "factor of 2" not in found and (close(2.0 * expected, got, dtype) or close(0.5 * expected, got, dtype)):
            found.append("factor of 2")
    if expected.ndim >= 2 and "transposed operand" not in found:
        swapped = np.swapaxes(got, -1, -2)
        if swapped.shape == expected.shape and close(expected, swapped, dtype) and not close(expected, got, dtype):
            found.append("transposed operand")
    if got.shape != expected.shape and "missing sum over broadcast axes" not in found:
        summed = _sum_to_numpy(np.asarray(got, np.float64), expected.shape)
        if summed is not None and close(expected, summed, dtype):
            found.append("missing sum over broadcast axes")
    return found


def unchanged(what: str, before, after):
    """Raise Mismatch (an in-place write) when the array ``after`` no longer equals its copy ``before``."""
    before, after = np.asarray(before), as_array(after)
    if before.shape == after.shape and np.array_equal(before, after, equal_nan=True):
        return
    if before.shape != after.shape:
        raise Mismatch(f"{what} changed shape from {before.shape} to {after.shape} while your code ran",
                       ["in-place write into a saved input"])
    flat = int(np.argmax((before != after).reshape(-1)))
    raise Mismatch(f"your code changed {what} in place: {what}{_index(flat, before.shape)} was "
                   f"{_fmt(before.flat[flat])} and is now {_fmt(after.flat[flat])}",
                   ["in-place write into a saved input"])


def equal(what: str, expected, got, mistakes: dict | None = None):
    """Exact comparison for integers, lists and other plain values, with the mistakes it matches."""
    if got == expected:
        return
    named = []
    for name, predicted in (mistakes.items() if isinstance(mistakes, dict) else mistakes or ()):
        try:
            value = predicted() if callable(predicted) else predicted
        except Exception:  # noqa: BLE001 - a mistake that cannot happen on this case
            continue
        if value == got and value != expected:
            named.append(name)
    raise Mismatch(f"{what} is {got!r}, expected {expected!r}", named)


def again(what: str, expected, got, dtype=None):
    """Compare the result of a second backward through the same graph: the first was right, so a difference
    now means that the first backward wrote into something it saved."""
    try:
        compare(what, expected, got, dtype)
    except Mismatch as exc:
        raise Mismatch(exc.message + " (the first backward was right: it changed a value the graph keeps)",
                       ["in-place write into a saved input"]) from None


def statistic(what: str, expected: float, got: float, mistakes: dict | None = None, rtol: float = 0.03):
    """Compare a measured statistic (a sample's standard deviation) to ``rtol``, with the mistakes it matches."""
    def near(a, b):
        return b is not None and abs(a - b) <= rtol * abs(b)
    if near(got, expected):
        return
    named = []
    for name, predicted in (mistakes or {}).items():
        value = predicted() if callable(predicted) else predicted
        if near(got, value) and not near(value, expected):
            named.append(name)
    raise Mismatch(f"{what} is {_fmt(got)}, expected {_fmt(expected)} (within {rtol:.0%})", named)
