"""The textbook's debugging list, as functions (and as ``minidl diagnose``).

Before a long run, check that the model and the pipeline can learn at all:

1. Initial loss: with K balanced classes and a fresh model that has no
   preference, every class gets probability 1/K and the cross-entropy is
   -ln(1/K) = ln K (2.30 for 10 classes). Far above: the last layer's
   weights are too large (confident wrong guesses); far below: the labels leak
   into the input or the classes are not balanced.
2. Overfit two samples: any network worth training drives the loss on two
   samples to almost zero within a few hundred steps. If it cannot, the
   gradient does not reach the weights (a detached tensor, a frozen layer, a
   wrong sign) or the loss is wired wrongly.
3. Real data beats zeroed inputs: train once on the real inputs and once on
   all-zero inputs. If both reach the same validation loss, the model ignores
   its input (a pipeline bug: inputs and labels shuffled apart, the wrong
   tensor fed in) and learns only the class frequencies. The same against
   random inputs (noise with the data's per-feature mean and spread), which
   separates "the input is ignored" from "zeros are a bad input for this model".
4. Per-layer statistics: the mean and standard deviation of each layer's
   output, the fraction of ReLU units that are zero for every sample ("dead"),
   and ``||g|| / ||w||`` for each weight. Activations that shrink or grow
   layer after layer, or ratios far below 1e-6, point at initialization;
   mostly dead ReLUs at a learning rate that was too high or a bad bias.
5. Dropout with BatchNorm: dropout changes the variance of a layer's input
   between training and test, so BatchNorm's running statistics, collected
   with dropout on, do not match at test time (the "variance shift"). Use one
   or the other, or put dropout after the last BatchNorm only.

Every check leaves the model as it found it (weights, gradients, mode).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from minidl import backend, nn
from minidl.autograd import no_grad
from minidl.tensor import Tensor


@dataclass
class CheckResult:
    """One check: ``passed`` is True, False, or None for a warning-only finding (or a skipped check).

    ``value`` is the number measured, ``measured`` says what it is ("loss on the
    2 samples after 150 steps"), ``expected`` the condition for passing.
    """

    name: str
    passed: bool | None
    value: float | None
    expected: str
    message: str
    measured: str = ""

    def __str__(self):
        tag = {True: "PASS", False: "FAIL", None: "WARN"}[self.passed]
        if self.value is None:
            found = self.measured
        else:
            found = f"{self.measured} = {self.value:.4g}" if self.measured else f"{self.value:.4g}"
        rule = f"; passes when {self.expected}" if self.expected else ""
        return f"[{tag}] {self.name}: {found}{rule}\n       {self.message}"


# ---------------------------------------------------------------- helpers
def _device(model) -> str:
    for p in model.parameters():
        return p.device
    return "cpu"


def _dtype(model):
    for p in model.parameters():
        return p.dtype
    return np.float32


def model_inputs(model, x, y=None):
    """``x`` (and ``y``) as Tensors on the model's device, floating inputs in the model's dtype."""
    device = _device(model)
    x = x.array if isinstance(x, Tensor) else np.asarray(x) if not hasattr(x, "dtype") else x
    x = backend.to_device(x, device)
    if x.dtype.kind == "f":
        x = x.astype(_dtype(model), copy=False)
    if y is None:
        return Tensor(x)
    y = y.array if isinstance(y, Tensor) else np.asarray(y) if not hasattr(y, "dtype") else y
    return Tensor(x), Tensor(backend.to_device(y, device))


def cross_entropy_loss(logits, target):
    from minidl.ops.loss import cross_entropy
    return cross_entropy(logits, target)


class PreservedModel:
    """Context: the model's weights, gradients and train/eval mode are the same afterwards (every check, here
    and in :mod:`minidl.train.silent_failures`, runs inside one)."""

    def __init__(self, model):
        self.model = model

    def __enter__(self):
        self.state = self.model.state_dict()
        self.mode = self.model.training
        self.grads = [(p, p.grad) for p in self.model.parameters()]
        return self

    def __exit__(self, *exc):
        self.model.load_state_dict(self.state)
        self.model.train(self.mode)
        for p, g in self.grads:
            p.grad = g
        return False


def adam_for(model, lr):
    """The Adam every check trains with."""
    from minidl.optim import Adam
    return Adam(model.parameters(), lr=lr)


# ---------------------------------------------------------------- 1. initial loss
def check_initial_loss(model, x, y, num_classes: int | None = None, loss_fn=None,
                       tolerance: float = 0.25) -> CheckResult:
    """Is the loss of the untrained model close to ln K? (relative ``tolerance``)."""
    loss_fn = loss_fn or cross_entropy_loss
    with PreservedModel(model), no_grad():
        model.eval()
        xt, yt = model_inputs(model, x, y)
        logits = model(xt)
        loss = float(loss_fn(logits, yt).item())
        k = int(num_classes or logits.shape[1])
    expected = math.log(k)
    ok = abs(loss - expected) <= tolerance * expected
    if ok:
        message = "the untrained model spreads its probability evenly over the classes"
    elif loss > expected:
        message = ("the untrained model is confidently wrong: scale down the last layer's initial weights "
                   "(small normal or the default), and set its bias to zero or to the log class priors")
    else:
        message = ("the loss starts below ln K: the classes are imbalanced (compare with the entropy of the "
                   "class frequencies) or the labels leak into the inputs")
    return CheckResult("initial loss ≈ ln K", ok, loss, f"within {tolerance:.0%} of ln {k} = {expected:.4g}", message,
                       measured=f"cross-entropy of the untrained model on {len(y)} samples")


# ---------------------------------------------------------------- 2. overfit two samples
def overfit_small_batch(model, x, y, n: int = 2, steps: int = 200, lr: float = 1e-2, loss_fn=None,
                        target: float = 0.05, optimizer_fn=None) -> CheckResult:
    """Train on ``n`` samples for ``steps`` steps (Adam, eval mode: no dropout noise); pass if loss < target.

    The samples are taken from different classes when the labels allow it.
    ``result.value`` is the final loss; ``result.losses`` the whole curve.
    """
    loss_fn = loss_fn or cross_entropy_loss
    x, y = np.asarray(backend.to_numpy(x)), np.asarray(backend.to_numpy(y))
    index = _distinct_class_indices(y, n)
    with PreservedModel(model):
        model.eval()  # regularization off: this checks capacity and the gradient path only
        xt, yt = model_inputs(model, x[index], y[index])
        optimizer = optimizer_fn(model) if optimizer_fn else adam_for(model, lr)
        losses = []
        for _ in range(steps):
            optimizer.zero_grad()
            loss = loss_fn(model(xt), yt)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.item()))
        with no_grad():
            final = float(loss_fn(model(xt), yt).item())
    losses.append(final)
    ok = math.isfinite(final) and final < target
    message = (f"the loss on {n} samples fell from {losses[0]:.3g} to {final:.3g}" if ok else
               f"the loss on {n} samples only went from {losses[0]:.3g} to {final:.3g}: the gradient does not "
               "reach the weights (a detached tensor, a frozen layer), the loss is wired wrongly, or the "
               "model is far too small")
    result = CheckResult(f"overfit {n} samples", ok, final, f"below {target:g}", message,
                         measured=f"loss on the {n} samples after {steps} steps of Adam")
    result.losses = losses
    return result


def _distinct_class_indices(y, n):
    if len(y) < n:
        raise ValueError(f"overfit_small_batch: need at least {n} samples, got {len(y)}")
    chosen, seen = [], set()
    if y.ndim == 1 and y.dtype.kind in "iu":
        for i, label in enumerate(y.tolist()):
            if label not in seen:
                seen.add(label)
                chosen.append(i)
            if len(chosen) == n:
                return np.array(chosen)
    rest = [i for i in range(len(y)) if i not in chosen]
    return np.array(chosen + rest[:n - len(chosen)])


# ---------------------------------------------------------------- 3. real versus zeroed or random inputs
def _baseline_inputs(kind, x, rng):
    """The inputs of the baseline run: all zeros, or noise with each feature's mean and std (no information)."""
    if kind == "zeroed":
        return lambda batch: batch * 0.0
    mean, std = x.mean(axis=0), x.std(axis=0)
    return lambda batch: (mean + std * rng.standard_normal(batch.shape)).astype(batch.dtype)


def _compare_with_baseline(kind, model, x, y, x_val, y_val, steps, batch_size, lr, loss_fn, seed, margin):
    loss_fn = loss_fn or cross_entropy_loss
    x, y = np.asarray(backend.to_numpy(x)), np.asarray(backend.to_numpy(y))
    x_val, y_val = np.asarray(backend.to_numpy(x_val)), np.asarray(backend.to_numpy(y_val))
    order_rng = np.random.default_rng(seed)
    batches = [order_rng.integers(0, len(x), size=min(batch_size, len(x))) for _ in range(steps)]
    baseline = _baseline_inputs(kind, x, np.random.default_rng(seed + 1))
    val_losses = {}
    with PreservedModel(model) as kept:
        for run in ("real", kind):
            model.load_state_dict(kept.state)
            model.train()
            optimizer = adam_for(model, lr)
            change = baseline if run == kind else (lambda batch: batch)
            for index in batches:
                xt, yt = model_inputs(model, change(x[index]), y[index])
                optimizer.zero_grad()
                loss_fn(model(xt), yt).backward()
                optimizer.step()
            model.eval()
            with no_grad():
                xv, yv = model_inputs(model, change(x_val), y_val)
                val_losses[run] = float(loss_fn(model(xv), yv).item())
    real, other = val_losses["real"], val_losses[kind]
    inputs = "all-zero" if kind == "zeroed" else "random"
    ok = math.isfinite(real) and real < other * (1.0 - margin)
    message = (f"validation loss {real:.3g} on real inputs against {other:.3g} on {kind} inputs" if ok else
               f"validation loss {real:.3g} on real inputs is no better than {other:.3g} on {kind} inputs: the "
               "model ignores its input (check that inputs and labels stay paired, and that the right tensor "
               "is fed to the model)")
    result = CheckResult(f"real data beats {kind} inputs", ok, real,
                         f"below {other * (1 - margin):.4g}, {margin:.0%} under the {other:.4g} reached on "
                         f"{inputs} inputs", message,
                         measured=f"validation loss after {steps} steps on the real inputs")
    result.real = real
    setattr(result, kind, other)
    return result


def compare_with_zeroed_inputs(model, x, y, x_val, y_val, steps: int = 150, batch_size: int = 64,
                               lr: float = 1e-3, loss_fn=None, seed: int = 0, margin: float = 0.05) -> CheckResult:
    """Train from the same initial weights on real and on all-zero inputs; real must reach a lower validation loss.

    Both runs see the same batches in the same order; only the inputs differ.
    Pass when the real-data validation loss is below the zeroed one by more
    than ``margin`` (relative). ``result.real`` and ``result.zeroed`` hold both losses.
    """
    return _compare_with_baseline("zeroed", model, x, y, x_val, y_val, steps, batch_size, lr, loss_fn, seed, margin)


def compare_with_random_inputs(model, x, y, x_val, y_val, steps: int = 150, batch_size: int = 64,
                               lr: float = 1e-3, loss_fn=None, seed: int = 0, margin: float = 0.05) -> CheckResult:
    """As :func:`compare_with_zeroed_inputs`, with random inputs in place of zeros.

    The baseline inputs are Gaussian noise with each input feature's mean and
    standard deviation over ``x``: they have the data's scale, so a model whose
    layers only work at that scale still trains, but they carry no information
    about the labels. The zeroed baseline cannot tell "the model ignores its input"
    from "zero is an input the model handles badly"; this one can.
    ``result.real`` and ``result.random`` hold both losses.
    """
    return _compare_with_baseline("random", model, x, y, x_val, y_val, steps, batch_size, lr, loss_fn, seed, margin)


# ---------------------------------------------------------------- 4. per-layer statistics
def layer_statistics(model, x, y, loss_fn=None) -> list[dict]:
    """One forward and backward pass on ``(x, y)``; a row of statistics per leaf layer.

    Each row: ``layer`` (dotted name), ``type``, ``shape`` (output), ``mean`` and
    ``std`` of the output, ``dead`` (ReLU layers: fraction of units that are 0
    for every sample of the batch), ``grad_ratio`` (``||g|| / ||w||`` of the
    layer's weight, or None), ``grad_std`` (std of that gradient).
    The model's gradients and mode are restored afterwards.
    """
    loss_fn = loss_fn or cross_entropy_loss
    rows, handles = [], []

    def hook_for(name, module):
        def hook(mod, inputs, output):
            out = backend.to_numpy(output.array).astype(np.float64)
            row = {"layer": name, "type": type(mod).__name__, "shape": tuple(out.shape),
                   "mean": float(out.mean()), "std": float(out.std()), "dead": None,
                   "grad_ratio": None, "grad_std": None, "module": mod}
            if isinstance(mod, nn.ReLU) and out.ndim >= 2:
                row["dead"] = float(np.mean(np.all(out <= 0, axis=0)))
            rows.append(row)
        return hook

    leaves = [(name, m) for name, m in model.named_modules() if name and not any(True for _ in m.children())]
    if not leaves:
        leaves = [("model", model)]
    with PreservedModel(model):
        for p in model.parameters():
            p.grad = None
        for name, module in leaves:
            handles.append(module.register_forward_hook(hook_for(name, module)))
        try:
            model.train()
            xt, yt = model_inputs(model, x, y)
            loss_fn(model(xt), yt).backward()
        finally:
            for h in handles:
                h.remove()
        for row in rows:
            weight = row["module"]._parameters.get("weight")
            if weight is not None and weight.grad is not None:
                w = backend.to_numpy(weight.array).astype(np.float64)
                g = backend.to_numpy(weight.grad.array).astype(np.float64)
                w_norm = np.linalg.norm(w)
                row["grad_ratio"] = float(np.linalg.norm(g) / w_norm) if w_norm > 0 else math.inf
                row["grad_std"] = float(g.std())
    for row in rows:
        del row["module"]
    return rows


def format_statistics(rows: list[dict]) -> str:
    """The rows of :func:`layer_statistics` as an aligned text table."""
    header = ("layer", "type", "output", "mean", "std", "dead ReLU", "||g||/||w||")
    table = [header]
    for r in rows:
        table.append((r["layer"], r["type"], "x".join(map(str, r["shape"])), f"{r['mean']:+.3f}",
                      f"{r['std']:.3f}", "" if r["dead"] is None else f"{r['dead']:.0%}",
                      "" if r["grad_ratio"] is None else f"{r['grad_ratio']:.2e}"))
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if i < 3 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
             for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def statistics_warnings(rows: list[dict]) -> list[str]:
    """Plain-language findings from the statistics table (empty when nothing looks wrong)."""
    found = []
    for r in rows:
        if r["dead"] is not None and r["dead"] > 0.5:
            found.append(f"{r['layer']}: {r['dead']:.0%} of the ReLU units are dead on this batch "
                         "(a learning rate too high, or large negative biases)")
        if r["std"] < 1e-3 and r["type"] not in ("Dropout",):
            found.append(f"{r['layer']}: output std {r['std']:.1e} -- the signal has vanished "
                         "(weights initialized too small? use Xavier for tanh, Kaiming for ReLU)")
        if r["std"] > 1e3:
            found.append(f"{r['layer']}: output std {r['std']:.1e} -- the signal explodes (weights too large)")
        if r["grad_ratio"] is not None and r["grad_ratio"] < 1e-7:
            found.append(f"{r['layer']}: ||g||/||w|| = {r['grad_ratio']:.1e} -- the gradient vanishes here")
    return found


# ---------------------------------------------------------------- 5. dropout with batch norm
def check_dropout_batchnorm(model, warn: bool = True) -> CheckResult:
    """Warn (``warnings.warn`` and a WARN result) when the model has both Dropout and BatchNorm layers."""
    kinds = {type(m) for m in model.modules()}
    has_dropout = any(issubclass(k, nn.Dropout) for k in kinds)
    has_bn = any(issubclass(k, (nn.BatchNorm1d, nn.BatchNorm2d)) for k in kinds)
    if has_dropout and has_bn:
        message = ("the model uses Dropout and BatchNorm together: dropout changes the variance of BatchNorm's "
                   "input between training and evaluation, so its running statistics do not fit at test time "
                   "(variance shift). Use one of the two, or put dropout only after the last BatchNorm.")
        if warn:
            warnings.warn(message, UserWarning, stacklevel=2)
        return CheckResult("dropout with batch norm", None, None, "the model has at most one of the two", message,
                           measured="the model has both Dropout and BatchNorm layers")
    found = "Dropout" if has_dropout else "BatchNorm" if has_bn else "neither Dropout nor BatchNorm"
    return CheckResult("dropout with batch norm", True, None, "the model has at most one of the two",
                       "the model does not combine Dropout with BatchNorm",
                       measured=f"the model has {found}" + (" only" if has_dropout or has_bn else ""))


# ---------------------------------------------------------------- trained weights
def check_trained_model(model, x_val, y_val, num_classes: int | None = None, loss_fn=None) -> CheckResult:
    """Does a trained model do better than chance on held-out data? (loss below ln K, accuracy above 1/K)

    The check that replaces "initial loss ≈ ln K" for trained weights: a trained
    model *should* be far from the uniform guess.
    """
    loss_fn = loss_fn or cross_entropy_loss
    with PreservedModel(model), no_grad():
        model.eval()
        xt, yt = model_inputs(model, x_val, y_val)
        logits = model(xt)
        loss = float(loss_fn(logits, yt).item())
        k = int(num_classes or logits.shape[1])
        accuracy = float((backend.to_numpy(logits.array).argmax(axis=1) == backend.to_numpy(yt.array)).mean())
    chance = math.log(k)
    ok = math.isfinite(loss) and loss < chance and accuracy > 1.0 / k
    message = (f"validation accuracy {accuracy:.1%} (chance: {1 / k:.1%}); the weights have learned" if ok else
               f"validation accuracy {accuracy:.1%} against {1 / k:.1%} by chance: the weights do no better than "
               "guessing (not trained, trained on other data, or loaded into a different architecture)")
    return CheckResult("trained model beats chance", ok, loss, f"below ln {k} = {chance:.4g} (the uniform guess)",
                       message, measured=f"validation loss on {len(y_val)} samples")


def skipped(name: str, reason: str) -> CheckResult:
    """A check that does not apply (shown as WARN, not counted as a failure)."""
    return CheckResult(name, None, None, "", reason, measured="skipped")


# ---------------------------------------------------------------- all of it
def diagnose(model, x, y, x_val=None, y_val=None, num_classes: int | None = None, overfit_steps: int = 200,
             baseline_steps: int = 150, stats_batch: int = 256, seed: int = 0, fresh_model=None,
             trained: bool = False) -> dict:
    """Run every check; returns ``{"checks": [CheckResult...], "statistics": rows, "warnings": [...]}``.

    ``x_val, y_val`` enable the comparisons with zeroed and with random inputs. The model is left unchanged.

    ``trained=True`` says ``model`` holds trained weights: the checks meant for a
    freshly initialized model (initial loss, overfitting two samples, real versus
    zeroed and random inputs) then run on ``fresh_model`` (a new model of the same
    architecture) when one is given, and are skipped otherwise; the trained model
    gets the checks that apply to it (better than chance on validation data,
    dropout with batch norm, per-layer statistics).
    """
    x, y = np.asarray(backend.to_numpy(x)), np.asarray(backend.to_numpy(y))
    checks = [check_dropout_batchnorm(model, warn=False)]
    init_model = fresh_model if trained else model
    init_names = ["initial loss ≈ ln K", "overfit 2 samples"]
    if x_val is not None and y_val is not None:
        init_names += ["real data beats zeroed inputs", "real data beats random inputs"]
    if init_model is None:
        checks += [skipped(n, "this check is for a freshly initialized model; the loaded weights are trained")
                   for n in init_names]
    else:
        suffix = " (fresh model, same architecture)" if trained else ""
        init_checks = [check_initial_loss(init_model, x[:stats_batch * 4], y[:stats_batch * 4], num_classes),
                       overfit_small_batch(init_model, x, y, steps=overfit_steps)]
        if x_val is not None and y_val is not None:
            init_checks += [compare(init_model, x, y, x_val, y_val, steps=baseline_steps, seed=seed)
                            for compare in (compare_with_zeroed_inputs, compare_with_random_inputs)]
        for c in init_checks:
            c.name += suffix
        checks += init_checks
    if trained and x_val is not None and y_val is not None:
        checks.append(check_trained_model(model, x_val, y_val, num_classes))
    rows = layer_statistics(model, x[:stats_batch], y[:stats_batch])
    return {"checks": checks, "statistics": rows, "warnings": statistics_warnings(rows)}


def format_report(report: dict) -> str:
    """The result of :func:`diagnose` as text: the checks, the statistics table, the warnings."""
    parts = [str(c) for c in report["checks"]]
    parts.append("\nper-layer statistics (one training-mode batch):\n" + format_statistics(report["statistics"]))
    if report["warnings"]:
        parts.append("\n".join("warning: " + w for w in report["warnings"]))
    return "\n".join(parts)
