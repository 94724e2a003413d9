"""Distilling an ensemble: the averaged soft targets at a temperature."""
import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from minidl import nn
from minidl.train import DistillationLoss, distillation_loss, ensemble_soft_targets


def _softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_soft_targets_are_the_average_of_softened_probabilities():
    rng = np.random.default_rng(0)
    members = [rng.standard_normal((4, 5)) * 3 for _ in range(3)]
    expected = np.mean([_softmax(z / 2.0) for z in members], axis=0)
    np.testing.assert_allclose(np.exp(ensemble_soft_targets(members, 2.0).numpy()), expected, rtol=1e-12)
    np.testing.assert_allclose(np.exp(ensemble_soft_targets(members[0], 2.0).numpy()), _softmax(members[0] / 2))


def test_distillation_from_an_ensemble_matches_the_formula():
    rng = np.random.default_rng(1)
    z_s = rng.standard_normal((6, 4))
    members = [rng.standard_normal((6, 4)) for _ in range(2)]
    y = rng.integers(0, 4, 6)
    T, alpha = 3.0, 0.7
    p_bar = np.mean([_softmax(z / T) for z in members], axis=0)
    log_q = np.log(_softmax(z_s / T))
    kl = np.sum(p_bar * (np.log(p_bar) - log_q)) / 6
    ce = -np.mean(np.log(_softmax(z_s))[np.arange(6), y])
    loss = distillation_loss(mdl.tensor(z_s), [mdl.tensor(z) for z in members], y, T, alpha)
    assert loss.item() == pytest.approx(alpha * T * T * kl + (1 - alpha) * ce, rel=1e-10)
    single = distillation_loss(mdl.tensor(z_s), [mdl.tensor(members[0])], y, T, alpha)
    assert single.item() == pytest.approx(distillation_loss(mdl.tensor(z_s), mdl.tensor(members[0]), y, T,
                                                            alpha).item(), rel=1e-12)


def test_distillation_loss_runs_every_teacher():
    mdl.manual_seed(0)
    teachers = [nn.Linear(3, 4) for _ in range(3)]
    student = nn.Linear(3, 4)
    x = mdl.tensor(np.random.default_rng(2).standard_normal((5, 3)).astype(np.float32))
    y = np.array([0, 1, 2, 3, 0])
    loss_fn = DistillationLoss(teachers, student, temperature=2.0, alpha=0.5)
    loss = loss_fn(student(x), y)
    with mdl.no_grad():
        expected = distillation_loss(student(x), [t(x) for t in teachers], y, 2.0, 0.5)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    loss.backward()
    assert student.weight.grad is not None and all(t.weight.grad is None for t in teachers)
    with pytest.raises(ValueError, match=r"teacher logits \(5, 3\) must have the same shape"):
        distillation_loss(F.relu(mdl.tensor(np.zeros((5, 4)))), [np.zeros((5, 4)), np.zeros((5, 3))], y)
