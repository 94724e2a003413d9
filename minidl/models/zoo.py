"""A tiny model zoo: pretrained weights that ship with minidl, and the recipe that made each.

    from minidl.models import zoo
    model, info = zoo.pretrained("digits-0-4-mlp")     # an MLP trained on the digits 0 to 4
    info["test_accuracy"], info["classes"]             # its held-out accuracy, the classes it knows
    body = zoo.body(model)                              # every layer but the last: the features to transfer
    x_test, y_test = zoo.held_out("digits-0-4-mlp")     # the samples it was not trained on

The chapter's fine-tuning section (§4.6): "there are model zoos with models
trained with large datasets. Industries and academics with smaller datasets can
use these pretrained models and fine-tune them for their related tasks." At the
scale of the bundled digits the zoo has one entry, the source task of the
transfer notebook (29): an MLP 64–128–64–5 trained on the digits 0–4 (721 of
them; the other 20% are its held-out split), whose hidden layers a model for
the digits 5–9 can start from.

Each entry is a safetensors file in ``minidl/models/weights/`` holding the
state dict and a description (``info``: the classes, the split, the recipe, the
held-out accuracy). :func:`train_entry` is the recipe that made it, so the file
can be made again (``write_entry``); a retrained model matches the bundled one
in accuracy, not bit for bit (the BLAS of another machine adds in another order).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

__all__ = ["ENTRIES", "Entry", "body", "build", "held_out", "pretrained", "train_entry", "write_entry"]

WEIGHTS = os.path.join(os.path.dirname(__file__), "weights")


@dataclass(frozen=True)
class Entry:
    """One zoo model: its file, its layer widths, the classes of its source task and its training recipe."""

    file: str
    widths: tuple          # input, hidden..., output
    classes: tuple         # the digits it was trained on, in the order of its outputs
    split_seed: int = 0
    test_fraction: float = 0.2
    epochs: int = 15
    batch_size: int = 32
    lr: float = 3e-3
    seed: int = 0


ENTRIES = {"digits-0-4-mlp": Entry("digits04_mlp.safetensors", (64, 128, 64, 5), (0, 1, 2, 3, 4))}


def _entry(name: str) -> Entry:
    if name not in ENTRIES:
        raise ValueError(f"zoo: no model named {name!r}; the zoo has {', '.join(sorted(ENTRIES))}")
    return ENTRIES[name]


def build(name: str):
    """A freshly initialized model of entry ``name``'s architecture (Linear → ReLU ... → Linear)."""
    from minidl import nn
    widths = _entry(name).widths
    layers = []
    for n_in, n_out in zip(widths[:-2], widths[1:-1]):
        layers += [nn.Linear(n_in, n_out), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(widths[-2], widths[-1]))


def _split(entry: Entry):
    """The entry's source data: (x_train, y_train), (x_test, y_test); pixels in [0, 1], labels 0..k−1."""
    from minidl.data import digits
    x, y = digits(flatten=True)
    keep = np.isin(y, entry.classes)
    x, y = (x[keep] / 16.0).astype(np.float32), np.searchsorted(np.array(entry.classes), y[keep])
    order = np.random.default_rng(entry.split_seed).permutation(len(y))
    cut = int(round(len(y) * (1 - entry.test_fraction)))
    return (x[order[:cut]], y[order[:cut]]), (x[order[cut:]], y[order[cut:]])


def held_out(name: str):
    """The samples of entry ``name``'s source task it was not trained on: (x, y), labels as its outputs."""
    return _split(_entry(name))[1]


def _accuracy(model, x, y) -> float:
    from minidl.autograd import no_grad
    from minidl.tensor import Tensor
    model.eval()
    with no_grad():
        return float((np.asarray(model(Tensor(x)).array).argmax(1) == y).mean())


def train_entry(name: str):
    """Train entry ``name`` by its recipe (Adam, shuffled mini-batches, seeded); returns ``(model, info)``."""
    import minidl.functional as F
    from minidl import manual_seed, optim
    from minidl.tensor import Tensor
    entry = _entry(name)
    (x, y), (x_test, y_test) = _split(entry)
    manual_seed(entry.seed)
    model = build(name)
    optimizer = optim.Adam(model.parameters(), lr=entry.lr)
    rng = np.random.default_rng(entry.seed)
    for _ in range(entry.epochs):
        order = rng.permutation(len(y))
        for start in range(0, len(y), entry.batch_size):
            index = order[start:start + entry.batch_size]
            optimizer.zero_grad()
            F.cross_entropy(model(Tensor(x[index])), Tensor(y[index])).backward()
            optimizer.step()
    info = {"name": name, "classes": list(entry.classes), "widths": list(entry.widths), "train_samples": len(y),
            "test_samples": len(y_test), "test_accuracy": _accuracy(model, x_test, y_test),
            "recipe": f"Adam lr {entry.lr:g}, {entry.epochs} epochs of batch {entry.batch_size}, seed {entry.seed}; "
                      f"the digits {entry.classes[0]}-{entry.classes[-1]}, a {1 - entry.test_fraction:.0%} split "
                      f"(permutation seed {entry.split_seed})"}
    return model, info


def write_entry(name: str, path: str | None = None) -> str:
    """Train entry ``name`` and write it where :func:`pretrained` reads it (or to ``path``); returns the path."""
    from minidl.serialization import save
    model, info = train_entry(name)
    path = path or os.path.join(WEIGHTS, _entry(name).file)
    save({"state": model.state_dict(), "info": info}, path)
    return path


def pretrained(name: str):
    """The bundled weights of entry ``name`` in a model of its architecture (eval mode): ``(model, info)``."""
    from minidl.serialization import load
    path = os.path.join(WEIGHTS, _entry(name).file)
    if not os.path.exists(path):
        raise FileNotFoundError(f"zoo: the weights of {name!r} are missing ({path}); make them with "
                                f"minidl.models.zoo.write_entry({name!r})")
    saved = load(path)
    model = build(name)
    model.load_state_dict(saved["state"])
    return model.eval(), dict(saved["info"])


def body(model):
    """Every layer of a zoo model but the last (a new Sequential sharing the layers): the features to reuse."""
    from minidl import nn
    return nn.Sequential(*list(model)[:-1])
