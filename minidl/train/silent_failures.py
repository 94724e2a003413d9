"""Detectors for the silent failures: bugs with which a network still trains, only worse.

    check_augmentation(model, x, y, augment)              # labels changed by the augmentation
    check_next_token_targets(x, y)                          # the autoregressive off-by-one, in the data
    check_next_token_leak(model, x, y, vocab_size)          # ... or anywhere: the model can see its target
    check_loss_gradient(model, x, y, loss_fn)               # the loss clipped instead of the gradient
    check_capacity(make_model, [16, 64, 256], x, y)         # training error that rises with capacity

"When you misconfigure a neural network, it often trains just fine, but its
performance is silently degraded" (Training Deep Learning Models, §1.2, which
lists the first three); the chapter's fourth (§4.5.2): "The training error
should decrease by adding more layers and units to the topology; otherwise,
this may indicate a bug." Each detector measures the symptom the bug leaves
and returns a :class:`~minidl.train.diagnostics.CheckResult` (PASS/FAIL, the
number measured, the rule, what it means), as the checks of ``minidl
diagnose`` do; the command runs those that apply to its run.

- **Augmentation that changes the label.** Trained through a label-preserving
  transform (a small shift of a digit), a model does as well on clean held-out
  data as without it; trained through one that changes what a sample is (a 6
  turned upside down is a 9 labelled 6) or a pipeline that mixes up labels, it
  learns wrong labels for the classes concerned. Two short runs from the same
  weights and batches, without and with the augmentation, are compared class by
  class on clean held-out data: a class that loses more than ``max_drop`` is flagged.
- **The autoregressive off-by-one.** Next-token targets are the inputs shifted
  by one (``y[:, t] = x[:, t + 1]``). Fed the target itself — windows built
  without the shift, a causal mask one position too wide — the model copies:
  its next-token accuracy approaches 1 within a few dozen steps and its loss
  falls far below anything text allows (a tied output layer even starts below
  ln V). The data check compares the windows with their shift; the model check
  trains ``steps`` steps and looks at the accuracy on held-out windows.
- **Clipping the loss instead of the gradient.** ``min(ℓᵢ, c)`` has zero
  derivative above c, so those examples do not train the model at all. The
  check takes the gradient of the loss *as the training loop computes it* with
  respect to the model's outputs and counts the examples whose row is exactly
  zero; a real loss leaves none.
- **Training error that rises with capacity.** Each model of the family is
  trained the same number of steps; the final training losses must not rise
  from one size to the next (beyond ``tolerance``). A wrong initialization
  scale (weights whose variance does not shrink with the fan-in), a learning
  rate that suits only the small model, or a layer that is not connected all
  show here.
"""
from __future__ import annotations

import math

import numpy as np

from minidl import backend
from minidl.autograd import no_grad
from minidl.tensor import Tensor
from minidl.train.diagnostics import CheckResult, PreservedModel, adam_for, cross_entropy_loss, model_inputs

__all__ = ["check_augmentation", "check_capacity", "check_loss_gradient", "check_next_token_leak",
           "check_next_token_targets"]


def _numpy(a):
    return np.asarray(backend.to_numpy(a.array if isinstance(a, Tensor) else a))


def _predict(model, x, batch: int = 512) -> np.ndarray:
    with PreservedModel(model), no_grad():
        model.eval()
        out = [_numpy(model(model_inputs(model, x[i:i + batch]))) for i in range(0, len(x), batch)]
    return np.concatenate(out).argmax(axis=-1)


def _train(model, x, y, steps, lr, loss_fn, seed, batch_size=64):
    """``steps`` Adam steps on batches drawn from (x, y); the model stays trained (callers preserve it)."""
    rng = np.random.default_rng(seed)
    optimizer = adam_for(model, lr)
    model.train()
    losses = []
    for _ in range(steps):
        index = rng.integers(0, len(x), size=min(batch_size, len(x)))
        xt, yt = model_inputs(model, x[index], y[index])
        optimizer.zero_grad()
        loss = loss_fn(model(xt), yt)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.item()))
    return losses


# ---------------------------------------------------------------- augmentation that changes the label
def check_augmentation(model, x, y, train_data, transform=None, pipeline=None, steps: int = 300,
                       max_drop: float = 0.15, lr: float = 1e-3, seed: int = 0, loss_fn=None) -> CheckResult:
    """Train twice from the model's weights, on ``train_data`` as it is and through the augmentation; flag the
    classes whose accuracy on the clean held-out ``(x, y)`` falls by more than ``max_drop`` with it.

    Give the augmentation as ``transform(x)`` (the inputs changed, the labels kept: a ``minidl.data``
    transform) or as ``pipeline(x, y)`` returning the augmented ``(x, y)`` (an augmentation step that
    may touch the labels). Both runs see the same batches in the same order for ``steps`` Adam steps;
    only the augmentation differs. A transform that keeps every label costs the clean data little or
    nothing; one that turns samples of a class into another (a 6 turned upside down, a mirrored 2)
    or a pipeline that mixes up labels teaches those classes wrong labels, and their clean accuracy
    falls. ``result.per_class``: ``{class: (accuracy trained without, with the augmentation)}``;
    the model is left as it was.
    """
    if (transform is None) == (pipeline is None):
        raise ValueError("check_augmentation: give exactly one of transform(x) and pipeline(x, y)")
    x, y = _numpy(x), _numpy(y)
    x_train, y_train = _numpy(train_data[0]), _numpy(train_data[1])
    loss_fn = loss_fn or cross_entropy_loss
    order = np.random.default_rng(seed).integers(0, len(x_train), size=(steps, min(64, len(x_train))))
    accuracy = {}
    with PreservedModel(model) as kept:
        for run in ("clean", "augmented"):
            model.load_state_dict(kept.state)
            model.train()
            optimizer = adam_for(model, lr)
            for index in order:
                xb, yb = x_train[index], y_train[index]
                if run == "augmented":
                    xb, yb = pipeline(xb, yb) if pipeline is not None else (transform(xb), yb)
                xt, yt = model_inputs(model, _numpy(xb), _numpy(yb))
                optimizer.zero_grad()
                loss_fn(model(xt), yt).backward()
                optimizer.step()
            accuracy[run] = _predict(model, x) == y
    per_class = {int(c): (float(accuracy["clean"][y == c].mean()), float(accuracy["augmented"][y == c].mean()))
                 for c in np.unique(y)}
    drops = {c: a - b for c, (a, b) in per_class.items()}
    worst = sorted(drops, key=drops.get, reverse=True)
    flagged = [c for c in worst if drops[c] > max_drop]
    clean, augmented = accuracy["clean"].mean(), accuracy["augmented"].mean()
    ok = not flagged
    message = (f"held-out accuracy {clean:.1%} trained without the augmentation, {augmented:.1%} with it; no class "
               f"loses more than {max_drop:.0%}" if ok else
               f"held-out accuracy {clean:.1%} trained without the augmentation, {augmented:.1%} with it; classes "
               f"{', '.join(f'{c} ({per_class[c][0]:.0%} → {per_class[c][1]:.0%})' for c in flagged[:5])} lose "
               "the most: the augmentation changes what those samples are, or their labels; look at augmented "
               "samples with their labels (show_batch), and drop the transform for those classes")
    result = CheckResult("augmentation keeps the labels", ok, drops[worst[0]],
                         f"no class loses more than {max_drop:.0%} of its held-out accuracy", message,
                         measured=f"largest drop of a class's held-out accuracy when trained {steps} steps with the "
                                  "augmentation")
    result.per_class = per_class
    return result


# ---------------------------------------------------------------- the autoregressive off-by-one
def check_next_token_targets(x, y) -> CheckResult:
    """Are next-token windows' targets their inputs shifted by one (``y[:, t] == x[:, t + 1]``)?

    ``result.shifted`` is the share of positions where the target is the next input, ``result.copied``
    where it is the input itself.
    """
    x, y = _numpy(x), _numpy(y)
    if x.shape != y.shape or x.ndim != 2 or x.shape[1] < 2:
        raise ValueError(f"check_next_token_targets: expected inputs and targets of the same shape (windows, "
                         f"tokens) with at least 2 tokens, got {x.shape} and {y.shape}")
    shifted = float(np.mean(y[:, :-1] == x[:, 1:]))
    copied = float(np.mean(y == x))
    ok = shifted == 1.0
    message = ("every target is the next input token" if ok else
               f"only {shifted:.1%} of the targets are the next input token, and {copied:.1%} are the input token "
               "itself: the windows are not shifted by one (an off-by-one in building them); "
               "the model will learn to copy, not to predict")
    result = CheckResult("next-token targets are shifted by one", ok, shifted, "100% of the positions", message,
                         measured="share of positions where y[:, t] equals x[:, t + 1]")
    result.shifted, result.copied = shifted, copied
    return result


def check_next_token_leak(model, x, y, vocab_size: int, steps: int = 40, lr: float = 3e-3,
                          max_accuracy: float = 0.9, init_fraction: float = 0.5, seed: int = 0,
                          loss_fn=None) -> CheckResult:
    """Can the model see its target? Fail if the loss at initialization is below ``init_fraction``·ln V, or if
    after ``steps`` Adam steps on the first 3/4 of the windows its next-token accuracy on the last 1/4 exceeds
    ``max_accuracy`` (no model of real text gets there in a few steps; a copying model does).

    ``model(x)`` gives (windows, tokens, V) logits; the loss is the cross-entropy over every position.
    ``result.initial_loss``, ``result.accuracy``.
    """
    x, y = _numpy(x), _numpy(y)
    if len(x) < 4:
        raise ValueError(f"check_next_token_leak: need at least 4 windows (3/4 to train, 1/4 to check), got {len(x)}")

    def sequence_loss(logits, target):
        return (loss_fn or cross_entropy_loss)(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))

    cut = 3 * len(x) // 4
    with PreservedModel(model):
        with no_grad():
            model.eval()
            xt, yt = model_inputs(model, x[:cut], y[:cut])
            initial = float(sequence_loss(model(xt), yt).item())
        _train(model, x[:cut], y[:cut], steps, lr, sequence_loss, seed, batch_size=16)
        accuracy = float(np.mean(_predict(model, x[cut:]) == y[cut:]))
    chance = math.log(vocab_size)
    at_init, copies = initial < init_fraction * chance, accuracy > max_accuracy
    ok = not (at_init or copies)
    message = (f"loss {initial:.3g} at initialization (ln V = {chance:.3g}); next-token accuracy {accuracy:.1%} on "
               f"held-out windows after {steps} steps" if ok else
               f"loss {initial:.3g} at initialization against ln V = {chance:.3g}, next-token accuracy {accuracy:.1%} "
               f"after only {steps} steps: the model sees the token it must predict (targets not shifted, a "
               "causal mask one position too wide, the target fed as an input)")
    result = CheckResult("the model cannot see its target", ok, accuracy,
                         f"accuracy <= {max_accuracy:.0%} after {steps} steps and a first loss >= "
                         f"{init_fraction:g}·ln V", message,
                         measured=f"next-token accuracy on held-out windows after {steps} steps")
    result.initial_loss, result.accuracy = initial, accuracy
    return result


# ---------------------------------------------------------------- the loss clipped instead of the gradient
def check_loss_gradient(model, x, y, loss_fn, max_zero_share: float = 0.01) -> CheckResult:
    """The share of examples whose gradient of ``loss_fn(model(x), y)`` w.r.t. their output row is exactly zero.

    ``loss_fn`` is the loss as the training loop computes it (clipping included). Fail above ``max_zero_share``.
    """
    with PreservedModel(model):
        model.eval()
        xt, yt = model_inputs(model, x, y)
        with no_grad():
            output = model(xt)
        leaf = Tensor(output.array, requires_grad=True)
        loss_fn(leaf, yt).backward()
        grad = _numpy(leaf.grad).reshape(len(leaf.array), -1)
    zero = float(np.mean(np.all(grad == 0, axis=1)))
    ok = zero <= max_zero_share
    message = (f"every example but {zero:.1%} moves the model" if ok else
               f"{zero:.1%} of the examples get no gradient at all: the loss is clipped (min(ℓ, c)) or masked, "
               "so those examples are ignored, not tempered; clip the gradient's norm instead "
               "(clip_grad_norm_, PercentileClipping)")
    result = CheckResult("every example gets a gradient", ok, zero, f"at most {max_zero_share:.0%} with none",
                         message, measured=f"share of the {len(grad)} examples whose output gradient is exactly 0")
    result.zero_share = zero
    return result


# ---------------------------------------------------------------- training error against capacity
def check_capacity(make_model, sizes, x, y, steps: int = 200, lr: float = 1e-3, loss_fn=None, seed: int = 0,
                   tolerance: float = 0.1) -> CheckResult:
    """Train ``make_model(size)`` for each size the same ``steps`` Adam steps (seeded alike); the final training
    loss must not rise from one size to the next by more than ``tolerance`` (relative) plus 1e-3.

    ``result.losses``: ``{size: final training loss on all of (x, y)}``.
    """
    from minidl.train.trainer import seed_everything

    sizes = list(sizes)
    if len(sizes) < 2:
        raise ValueError(f"check_capacity: give at least two sizes to compare, got {sizes}")
    x, y = _numpy(x), _numpy(y)
    loss_fn = loss_fn or cross_entropy_loss
    losses = {}
    for size in sizes:
        seed_everything(seed)
        model = make_model(size)
        _train(model, x, y, steps, lr, loss_fn, seed)
        with no_grad():
            model.eval()
            xt, yt = model_inputs(model, x, y)
            losses[size] = float(loss_fn(model(xt), yt).item())
    rises = [(a, b) for a, b in zip(sizes, sizes[1:])
             if not math.isfinite(losses[b]) or losses[b] > losses[a] * (1 + tolerance) + 1e-3]
    ok = not rises
    shown = ", ".join(f"{s}: {losses[s]:.3g}" for s in sizes)
    message = (f"the training loss falls (or holds) as the model grows ({shown})" if ok else
               f"the training loss rises with capacity ({shown}), from size {rises[0][0]} to {rises[0][1]}: a bigger "
               "model should fit at least as well; look for an initialization whose scale grows with the width, "
               "a learning rate tuned for the small model only, or a part of the model that does not train")
    result = CheckResult("training error falls with capacity", ok, losses[sizes[-1]],
                         f"no rise above {tolerance:.0%} from one size to the next", message,
                         measured=f"training loss of the largest model after {steps} steps")
    result.losses = losses
    return result
