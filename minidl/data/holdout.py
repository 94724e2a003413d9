"""A test split that counts how often it is looked at, and says so when it is looked at again.

    test = TestSplit(x_test, y_test)
    test.evaluate(lambda x, y: accuracy(model, x, y), label="final model")   # once: fine
    test.evaluate(...)                  # again: TestSetReuseWarning, "evaluated 2 times"
    test.evaluations, test.history      # 2, [("final model", 0.95), (..., ...)]

The test split is for one measurement, made after every choice is locked
(the training chapter, §4.5.1: "The test set should only be used once, after
the model and hyperparameters are locked"). Each look that informs a choice —
picking the best of several models on it, tuning on it, stopping on it — fits
the choice to the test samples' noise, and the score it reports is optimistic:
with N models of equal true accuracy p scored on n test samples, the best
score is expected to exceed p by about σ·E[max of N standard normals], with
σ = √(p(1−p)/n) (:func:`minidl.tune.analysis.expected_max_normal`).

The split's arrays are reachable only through :meth:`TestSplit.evaluate`, so
every look is counted; ``allowed`` sets how many looks pass silently (1 by
default).
"""
from __future__ import annotations

import warnings

import numpy as np

__all__ = ["TestSetReuseWarning", "TestSplit"]


class TestSetReuseWarning(UserWarning):
    """The test split was evaluated more often than allowed: its score is no longer an unbiased estimate."""


class TestSplit:
    """The test samples ``x, y``, handed out only to :meth:`evaluate`, which counts each look.

    ``allowed`` looks pass silently; every look after them warns with
    :class:`TestSetReuseWarning`. ``name`` names the split in the warning.
    """

    __test__ = False  # a library class, not a pytest test class

    def __init__(self, x, y, name: str = "test", allowed: int = 1):
        if isinstance(allowed, bool) or not isinstance(allowed, int) or allowed < 1:
            raise ValueError(f"TestSplit: allowed must be a whole number >= 1, got {allowed!r}")
        if len(x) != len(y):
            raise ValueError(f"TestSplit: x and y must have the same number of samples, got {len(x)} and {len(y)}")
        self._x, self._y = x, y
        self.name, self.allowed = str(name), allowed
        self.history: list[tuple[str, object]] = []

    def __len__(self) -> int:
        return len(self._y)

    @property
    def evaluations(self) -> int:
        """How many times :meth:`evaluate` has run."""
        return len(self.history)

    def evaluate(self, score, label: str = ""):
        """Return ``score(x, y)`` on the test samples and count the look; warn once looks exceed ``allowed``."""
        if not callable(score):
            raise TypeError(f"TestSplit.evaluate: score must be a function score(x, y), got {type(score).__name__}")
        if self.evaluations >= self.allowed:
            earlier = ", ".join(repr(lab) if lab else "unlabelled" for lab, _ in self.history[-3:])
            warnings.warn(f"look number {self.evaluations + 1} at the {self.name} split (allowed: {self.allowed}; "
                          f"the last looks: {earlier}): a choice made on these scores fits the "
                          f"{len(self)} {self.name} samples, and the score reported is optimistic; choose on a "
                          "validation split and look at the test split once, at the end",
                          TestSetReuseWarning, stacklevel=2)
        value = score(self._x, self._y)
        self.history.append((str(label), value))
        return value

    def scores(self) -> np.ndarray:
        """The values of every evaluation so far, in order, as an array (numbers only)."""
        return np.array([value for _, value in self.history], dtype=float)
