"""The exception a stage's alarm raises; the stages that stop early on it import it from here."""
from __future__ import annotations

__all__ = ["StageTimeout"]


class StageTimeout(BaseException):
    """Raised inside a stage when its time is up (a BaseException: the stage's own handlers let it pass)."""
