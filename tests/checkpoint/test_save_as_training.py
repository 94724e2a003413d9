"""Training with activations stored in 16 bits (checkpoint.save_as): the accuracy and the memory, measured."""
import contextlib

import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from minidl import data, memory, nn, optim
from minidl.checkpoint import save_as


def _digits():
    x, y = data.digits()
    x = (x / 16.0).reshape(len(x), -1).astype(np.float32)
    (x_train, y_train), _, (x_test, y_test) = data.train_val_test_split(x, y, ratios=(0.6, 0.1, 0.3),
                                                                        stratify=True, seed=0)
    return x_train, y_train, x_test, y_test


def _train(storage, epochs=4):
    """The digits MLP trained from one seed on the same batches; activations saved as ``storage``."""
    x_train, y_train, x_test, y_test = _digits()
    mdl.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 128), nn.Tanh(), nn.Linear(128, 10))
    opt = optim.Adam(model.parameters(), lr=3e-3)
    order = np.random.default_rng(0)
    peak = 0
    for _ in range(epochs):
        perm = order.permutation(len(x_train))
        for i in range(0, len(perm), 64):
            batch = perm[i:i + 64]
            with memory.track() as m:
                with save_as(storage) if storage else contextlib.nullcontext():
                    loss = F.cross_entropy(model(mdl.tensor(x_train[batch])), mdl.tensor(y_train[batch]))
            peak = max(peak, m.peak_bytes)
            opt.zero_grad()
            loss.backward()
            opt.step()
    with mdl.no_grad():
        accuracy = float((model(mdl.tensor(x_test)).numpy().argmax(1) == y_test).mean())
    return accuracy, peak, len(y_test)


@pytest.mark.parametrize("storage", ["float16", "bfloat16"])
def test_training_with_16_bit_activations_keeps_the_accuracy_and_halves_their_memory(storage):
    acc32, peak32, n = _train(None)
    acc16, peak16, _ = _train(storage)
    assert acc32 > 0.9
    # The same seed, batches and updates; only what backward reads is rounded (2⁻¹¹ or 2⁻⁸ relative).
    # Allowed: 2 points, within 3 standard errors √(a(1 − a)/n) of the test set (about 0.8 points each).
    assert abs(acc16 - acc32) <= min(0.02, 3 * np.sqrt(acc32 * (1 - acc32) / n))
    # The graph's saved floats at half the width; the tracker counts what the hooks keep (a buffer two nodes
    # save stored twice), so at most 60 % of the float32 graph's peak.
    assert peak16 <= 0.6 * peak32
