"""Optimizers built around another one: Lookahead and the data-parallel wrappers."""
from __future__ import annotations

from minidl.hooks import StepHooks


class WrapsOptimizer(StepHooks):
    """Mixin for optimizers built around another one (``self.optimizer``): Lookahead, the
    data-parallel wrappers. Schedules and training loops read the inner optimizer's groups
    and state through these, so one scheduler drives the wrapped optimizer too."""

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state
