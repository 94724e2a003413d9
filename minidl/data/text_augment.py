"""Text augmentation by synonyms: each sentence again, with some of its words replaced by a synonym.

    augment = SynonymReplacement(p=0.5, rng=0)           # the bundled table, SYNONYMS
    augment("Good my lord, speak.")                     # e.g. "Fine my lord, talk."
    copies = augment_sentences(lines, k=3, rng=0)         # every line, then 3 augmented copies of each

The training chapter's augmentation for language (§4.5.1): "sentences can be
duplicated to augment the dataset using the synonyms of some of the words in
the sentences." A word is a run of letters and apostrophes; a word found in
the table (in lower case) is replaced with probability ``p`` by one of its
synonyms drawn uniformly, written with the word's capitalization (all lower,
Capitalized or UPPER). Everything else — punctuation, spaces, line breaks,
words without synonyms — is kept as it is, so the copies have the same
length in words and the same shape as the original.

The bundled table, :data:`SYNONYMS`, holds common words of the bundled
Shakespeare (``minidl.data.text.shakespeare``) with synonyms of the same part
of speech and register; pass your own ``{word: [synonyms]}`` for other text.
A synonym table is a source of bugs of its own (a word with two senses, a
replacement that breaks the grammar): read some augmented sentences before
training on them.
"""
from __future__ import annotations

import re

import numpy as np

__all__ = ["SYNONYMS", "SynonymReplacement", "augment_sentences"]

SYNONYMS = {
    "good": ["fine", "worthy", "kind"], "great": ["mighty", "grand"], "noble": ["worthy", "honourable"],
    "speak": ["talk", "say"], "look": ["gaze", "behold"], "tell": ["say", "relate"], "see": ["behold", "view"],
    "come": ["approach"], "go": ["depart", "leave"], "love": ["adore", "cherish"], "night": ["evening", "dark"],
    "death": ["dying", "demise"], "heart": ["soul", "breast"], "man": ["fellow"], "men": ["fellows"],
    "lord": ["master", "liege"], "king": ["sovereign", "monarch"], "father": ["sire"],
    "think": ["deem", "judge"], "know": ["ken", "understand"], "hear": ["listen"], "give": ["grant", "yield"],
    "take": ["seize", "grasp"], "make": ["create"], "sweet": ["dear", "gentle"], "fair": ["lovely", "bright"],
    "dear": ["beloved", "precious"], "honest": ["truthful", "upright"], "true": ["faithful", "loyal"],
    "poor": ["wretched", "needy"], "brave": ["bold", "valiant"], "fear": ["dread", "terror"],
    "friend": ["comrade", "ally"], "friends": ["comrades", "allies"], "world": ["earth"],
    "eyes": ["orbs"], "blood": ["gore"], "soul": ["spirit"], "mind": ["thought", "wit"],
}
WORD = re.compile(r"[A-Za-z']+")


def _with_case(word: str, like: str) -> str:
    if like.isupper() and len(like) > 1:
        return word.upper()
    if like[:1].isupper():
        return word[:1].upper() + word[1:]
    return word


class SynonymReplacement:
    """Replace each word of the table with probability ``p`` by one of its synonyms (see the module docstring).

    ``table`` maps a lower-case word to its synonyms (default :data:`SYNONYMS`);
    ``rng`` an int seed or a ``numpy.random.Generator``. ``replaced`` counts the
    words replaced by the last call, ``candidates`` those that could have been.
    """

    def __init__(self, table: dict | None = None, p: float = 0.3, rng=None):
        table = SYNONYMS if table is None else table
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"SynonymReplacement: p must be a probability in [0, 1], got {p!r}")
        bad = [w for w, options in table.items() if not isinstance(w, str) or not options
               or not all(isinstance(o, str) and o for o in options)]
        if bad:
            raise ValueError(f"SynonymReplacement: every table entry needs a word and a non-empty list of synonyms; "
                             f"bad entries: {bad[:5]}")
        self.table = {w.lower(): list(options) for w, options in table.items()}
        self.p = float(p)
        self.rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        self.replaced = self.candidates = 0

    def __call__(self, text: str) -> str:
        if not isinstance(text, str):
            raise TypeError(f"SynonymReplacement: expected a string, got {type(text).__name__}")
        self.replaced = self.candidates = 0

        def swap(match):
            word = match.group(0)
            options = self.table.get(word.lower())
            if options is None:
                return word
            self.candidates += 1
            if self.rng.random() >= self.p:
                return word
            self.replaced += 1
            return _with_case(options[int(self.rng.integers(len(options)))], word)

        return WORD.sub(swap, text)


def augment_sentences(sentences, k: int, table: dict | None = None, p: float = 0.3, rng=None,
                      keep_original: bool = True) -> list:
    """Every sentence (when ``keep_original``), then ``k`` synonym-augmented copies of each, in that order."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"augment_sentences: k must be a whole number >= 0, got {k!r}")
    augment = SynonymReplacement(table, p, rng)
    sentences = list(sentences)
    return (sentences if keep_original else []) + [augment(s) for _ in range(k) for s in sentences]
