"""minidl.train.distill: the distillation loss and its gradient against a NumPy hand computation and torch."""
import numpy as np
import pytest

import minidl as mdl
from minidl import nn, optim
from minidl.data import DataLoader, gaussian_blobs
from minidl.train import DistillationLoss, Trainer, distillation_loss


def _softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _by_hand(z_s, z_t, y, T, alpha):
    """Loss and d loss / d z_s, written out from the formula."""
    n, c = z_s.shape
    p_t, p_s = _softmax(z_t / T), _softmax(z_s / T)
    kl = (p_t * (np.log(p_t) - np.log(p_s))).sum() / n
    q = _softmax(z_s)
    ce = -np.log(q[np.arange(n), y]).mean()
    loss = alpha * T**2 * kl + (1 - alpha) * ce
    onehot = np.eye(c)[y]
    grad = alpha * T**2 * (p_s - p_t) / (T * n) + (1 - alpha) * (q - onehot) / n
    return loss, grad


@pytest.mark.parametrize("T, alpha", [(1.0, 0.5), (4.0, 0.9), (2.5, 0.0), (3.0, 1.0)])
def test_loss_and_gradient_by_hand(T, alpha):
    rng = np.random.default_rng(0)
    z_s, z_t, y = rng.standard_normal((6, 5)) * 2, rng.standard_normal((6, 5)) * 3, rng.integers(0, 5, 6)
    s = mdl.tensor(z_s, requires_grad=True)
    t = mdl.tensor(z_t, requires_grad=True)
    loss = distillation_loss(s, t, mdl.tensor(y), temperature=T, alpha=alpha)
    loss.backward()
    expected, grad = _by_hand(z_s, z_t, y, T, alpha)
    np.testing.assert_allclose(loss.item(), expected, rtol=1e-12)
    np.testing.assert_allclose(s.grad.numpy(), grad, rtol=1e-10, atol=1e-14)
    assert t.grad is None  # the teacher is a constant


def test_against_torch_and_arrays_as_teacher():
    torch = pytest.importorskip("torch")
    tF = torch.nn.functional
    rng = np.random.default_rng(1)
    z_s, z_t, y = rng.standard_normal((8, 4)), rng.standard_normal((8, 4)), rng.integers(0, 4, 8)
    T, alpha = 3.0, 0.7
    s = mdl.tensor(z_s, requires_grad=True)
    loss = distillation_loss(s, z_t, mdl.tensor(y), temperature=T, alpha=alpha, label_smoothing=0.1)
    loss.backward()
    ts = torch.tensor(z_s, requires_grad=True)
    ref = alpha * T * T * tF.kl_div(tF.log_softmax(ts / T, 1), tF.log_softmax(torch.tensor(z_t) / T, 1),
                                    reduction="batchmean", log_target=True) \
        + (1 - alpha) * tF.cross_entropy(ts, torch.tensor(y), label_smoothing=0.1)
    ref.backward()
    np.testing.assert_allclose(loss.item(), ref.item(), rtol=1e-12)
    np.testing.assert_allclose(s.grad.numpy(), ts.grad.numpy(), rtol=1e-10)


def test_float32_stays_float32_and_gradcheck():
    rng = np.random.default_rng(2)
    s = mdl.tensor(rng.standard_normal((4, 3)).astype(np.float32), requires_grad=True)
    loss = distillation_loss(s, rng.standard_normal((4, 3)), mdl.tensor(np.array([0, 1, 2, 0])))
    assert loss.dtype == np.float32
    s64 = mdl.tensor(rng.standard_normal((4, 3)), requires_grad=True)
    t64 = rng.standard_normal((4, 3))
    y = mdl.tensor(np.array([0, 1, 2, 1]))
    assert mdl.gradcheck(lambda z: distillation_loss(z, t64, y, temperature=2.0, alpha=0.6), (s64,))


def test_bad_arguments():
    s, y = mdl.tensor(np.zeros((2, 3))), mdl.tensor(np.array([0, 1]))
    with pytest.raises(ValueError, match="temperature"):
        distillation_loss(s, np.zeros((2, 3)), y, temperature=0)
    with pytest.raises(ValueError, match="alpha"):
        distillation_loss(s, np.zeros((2, 3)), y, alpha=1.5)
    with pytest.raises(ValueError, match="same shape"):
        distillation_loss(s, np.zeros((2, 4)), y)


def _net(hidden, seed):
    mdl.manual_seed(seed)
    return nn.Sequential(nn.Linear(2, hidden), nn.Tanh(), nn.Linear(hidden, 3)).to(dtype=np.float64)


def test_distillation_loss_as_the_trainers_loss_fn():
    x, y = gaussian_blobs(n=64, centers=3, seed=0)
    x = x.astype(np.float64)
    teacher, student = _net(32, 1), _net(4, 2)
    teacher.train()  # the loss puts it in eval mode for its forward and back afterwards
    twin = _net(4, 2)
    loss_fn = DistillationLoss(teacher, student, temperature=2.0, alpha=0.8)
    trainer = Trainer(student, optim.SGD(student.parameters(), lr=0.1),
                      DataLoader((x, y), batch_size=64), DataLoader((x, y), batch_size=64),
                      loss_fn=loss_fn, progress=False)
    trainer.fit(epochs=1)
    assert teacher.training
    # The same step by hand, on a copy of the student.
    opt = optim.SGD(twin.parameters(), lr=0.1)
    xt, yt = mdl.tensor(x), mdl.tensor(y)
    with mdl.no_grad():
        z_t = teacher(xt)
    distillation_loss(twin(xt), z_t, yt, temperature=2.0, alpha=0.8).backward()
    opt.step()
    for a, b in zip(student.parameters(), twin.parameters()):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12)
    # Validation (eval mode) reports the plain cross-entropy of the student.
    student.eval()
    expected = mdl.functional.cross_entropy(student(xt), yt).item()
    assert trainer.history[-1]["val_loss"] == pytest.approx(expected, rel=1e-12)
    loss_fn(student(xt), yt)  # in eval mode: plain CE, and the remembered input is dropped
    assert loss_fn._input is None
    loss_fn.remove()
    student.train()
    student(xt)
    assert loss_fn._input is None
