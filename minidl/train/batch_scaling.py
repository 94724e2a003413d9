"""Batch-size scaling: how many steps to a target loss at each batch size, and the critical batch size.

    study = batch_size_study(lambda: nn.Linear(8, 1), x, y, batch_sizes=[1, 2, 4, ..., 1024],
                             target_loss=0.6, lrs=[0.4 * 2 ** -k for k in range(8)])
    print(study.table());  study.plot("scaling.png")

The chapter's table (McCandlish et al. 2018, "An empirical model of large-batch
training"): with the learning rate tuned at each batch size B, the steps S and
the examples E = S·B needed to reach a given loss trade off as

    (S / S_min − 1) (E / E_min − 1) = 1,   i.e.   S = S_min (1 + B_crit / B)

    region               batch size         doubling B
    perfect scaling      B ≪ B_crit         halves the steps; same examples (the extra data is not wasted)
    diminishing returns  B ≈ B_crit         cuts the steps by less than half; more examples
    stagnation           B ≫ B_crit         barely cuts the steps (S → S_min); the examples double

The critical batch size is predicted, before any of these runs, by the gradient
noise scale B_simple = tr(Σ)/‖G‖² (``minidl.optim.curvature.gradient_noise_scale``)
measured at weights that have reached the target loss. How steep the curve is at
B is the *scaling efficiency* −d ln S / d ln B, which the model gives as
B_crit / (B + B_crit): 1 in the perfect-scaling region, 0 in stagnation; its
value between neighbouring measured batch sizes places each one in a region.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

import minidl as mdl
from minidl import backend
from minidl.autograd import no_grad
from minidl.optim import SGD
from minidl.optim.curvature import gradient_noise_scale

__all__ = ["BatchScalingStudy", "REGIONS", "batch_size_study", "classify_regions", "fit_steps_model",
           "noise_scale_at", "plot_batch_scaling", "scaling_efficiency", "steps_to_target"]

REGIONS = ("perfect scaling", "diminishing returns", "stagnation")


# ---------------------------------------------------------------- the logic, on numbers
def steps_to_target(losses, target: float, steps=None) -> int | None:
    """The first step at which the loss is at or below ``target``; None if it never is.

    ``losses[i]`` is the loss measured after ``steps[i]`` optimizer steps
    (default ``steps = 0, 1, 2, ...``: the first value is the loss before training).
    A NaN or infinite loss never counts as reaching the target.
    """
    losses = np.asarray(losses, dtype=np.float64).reshape(-1)
    steps = np.arange(len(losses)) if steps is None else np.asarray(steps).reshape(-1)
    if len(steps) != len(losses):
        raise ValueError(f"steps_to_target: {len(losses)} losses but {len(steps)} steps")
    if len(steps) > 1 and np.any(np.diff(steps) <= 0):
        raise ValueError("steps_to_target: steps must increase")
    reached = np.flatnonzero(np.isfinite(losses) & (losses <= target))
    return int(steps[reached[0]]) if len(reached) else None


def _measured(batch_sizes, steps, owner):
    b = np.asarray(batch_sizes, dtype=np.float64).reshape(-1)
    s = np.asarray([np.nan if v is None else v for v in steps], dtype=np.float64).reshape(-1)
    if len(b) != len(s):
        raise ValueError(f"{owner}: {len(b)} batch sizes but {len(s)} step counts")
    if np.any(b <= 0) or np.any(np.diff(b) <= 0):
        raise ValueError(f"{owner}: batch sizes must be positive and increasing, got {list(batch_sizes)}")
    return b, s


def fit_steps_model(batch_sizes, steps) -> tuple[float, float]:
    """Fit S = S_min (1 + B_crit / B) = a + b/B by least squares in relative error: returns (S_min, B_crit).

    Minimizes Σ_i ((S_i − a − b/B_i) / S_i)² (linear in a, b; relative, so the few steps of
    large batches count as much as the many of small ones); S_min = a, B_crit = b/a.
    Batch sizes whose run did not reach the target (``None`` steps) are left out.
    """
    b, s = _measured(batch_sizes, steps, "fit_steps_model")
    keep = np.isfinite(s)
    if keep.sum() < 2:
        raise ValueError("fit_steps_model: needs at least two batch sizes that reached the target")
    design = np.stack([np.ones(keep.sum()), 1.0 / b[keep]], axis=1) / s[keep, None]
    (s_min, slope), *_ = np.linalg.lstsq(design, np.ones(keep.sum()), rcond=None)
    return float(s_min), float(slope / s_min) if s_min > 0 else math.inf


def scaling_efficiency(batch_sizes, steps) -> list:
    """−d ln S / d ln B at each batch size, from its measured neighbours (None where it cannot be told).

    Between neighbours i and i+1: e = ln(S_i / S_{i+1}) / ln(B_{i+1} / B_i) (1: doubling B
    halves the steps; 0: no fewer steps). Each batch size gets the mean of the values
    on its two sides (one side at the ends of the range).
    """
    b, s = _measured(batch_sizes, steps, "scaling_efficiency")
    between = [math.log(s[i] / s[i + 1]) / math.log(b[i + 1] / b[i])
               if np.isfinite(s[i]) and np.isfinite(s[i + 1]) else None for i in range(len(b) - 1)]
    out = []
    for i in range(len(b)):
        sides = [e for e in (between[i - 1] if i > 0 else None, between[i] if i < len(between) else None)
                 if e is not None]
        out.append(float(np.mean(sides)) if sides and np.isfinite(s[i]) else None)
    return out


def classify_regions(batch_sizes, steps, perfect: float = 0.8, stagnant: float = 0.2) -> list:
    """The region of each batch size from its scaling efficiency e (see :func:`scaling_efficiency`).

    e ≥ ``perfect``: "perfect scaling"; e ≤ ``stagnant``: "stagnation"; between:
    "diminishing returns"; None where e is unknown. Under S = S_min (1 + B_crit/B),
    e = B_crit/(B + B_crit), so the defaults put the borders at B_crit/4 and 4·B_crit.
    """
    if not 0 <= stagnant < perfect <= 1:
        raise ValueError(f"classify_regions: needs 0 <= stagnant < perfect <= 1, got {stagnant}, {perfect}")
    regions = []
    for e in scaling_efficiency(batch_sizes, steps):
        if e is None:
            regions.append(None)
        else:
            regions.append(REGIONS[0] if e >= perfect else REGIONS[2] if e <= stagnant else REGIONS[1])
    return regions


# ---------------------------------------------------------------- the runs
def noise_scale_at(model, loss_fn, x, y, batch_size: int = 32, batches: int = 64, seed: int = 0) -> float:
    """The gradient noise scale B_simple of ``model`` on (x, y), from ``batches`` random batches.

    Each batch is ``batch_size`` samples drawn without replacement within a batch;
    the estimate is :func:`minidl.optim.curvature.gradient_noise_scale`.
    """
    rng = np.random.default_rng(seed)
    chosen = [rng.choice(len(x), size=batch_size, replace=False) for _ in range(batches)]
    params = list(model.parameters())
    return gradient_noise_scale(lambda b: loss_fn(model(mdl.tensor(x[b])), mdl.tensor(y[b])), params, chosen,
                                batch_size=batch_size)


def _full_loss(model, loss_fn, x, y) -> float:
    with no_grad():
        return float(backend.to_numpy(loss_fn(model(mdl.tensor(x)), mdl.tensor(y)).array))


def _run(model_fn, loss_fn, x, y, batch_size, lr, target, max_steps, seed, momentum, before_step=None):
    """SGD at one (batch size, lr) until the full-data loss reaches target: (steps or None, weights).

    ``before_step(model)`` is called before every step (to measure along the path)."""
    mdl.manual_seed(seed)
    model = model_fn()
    opt = SGD(model.parameters(), lr=lr, momentum=momentum)
    rng = np.random.default_rng(seed)
    loss = start = _full_loss(model, loss_fn, x, y)
    order, at = rng.permutation(len(x)), 0
    for step in range(1, max_steps + 1):
        if at + batch_size > len(x):  # a new epoch: reshuffle (a batch never spans two epochs)
            order, at = rng.permutation(len(x)), 0
        idx = order[at:at + batch_size]
        at += batch_size
        if before_step is not None:
            before_step(model)
        loss_fn(model(mdl.tensor(x[idx])), mdl.tensor(y[idx])).backward()
        opt.step()
        opt.zero_grad()
        loss = _full_loss(model, loss_fn, x, y)
        if loss <= target:
            return step, model
        if not math.isfinite(loss) or loss > 1e3 * max(start, 1e-12):  # diverged: no point going on
            return None, model
    return None, model


@dataclass
class BatchScalingStudy:
    """What :func:`batch_size_study` measured; ``table()`` and ``plot()`` show it."""

    batch_sizes: list
    steps: list            # steps to the target at the best learning rate (None: not reached)
    lrs: list              # that best learning rate
    target_loss: float
    noise_scale: float     # the predicted critical batch size: B_simple averaged along the path
    noise_scale_at_target: float = field(default=math.nan)  # B_simple at the weights that reached the target
    noise_path: list = field(default_factory=list)          # B_simple before each step of that path
    s_min: float = field(default=math.nan)     # the fit S = S_min (1 + B_crit/B)
    b_crit: float = field(default=math.nan)
    efficiency: list = field(default_factory=list)
    regions: list = field(default_factory=list)
    all_runs: dict = field(default_factory=dict)  # (batch size, lr) -> steps, or None: not reached/not better

    def rows(self) -> list:
        return [{"batch_size": b, "lr": lr, "steps": s, "examples": None if s is None else s * b,
                 "efficiency": e, "region": r}
                for b, s, lr, e, r in zip(self.batch_sizes, self.steps, self.lrs, self.efficiency, self.regions)]

    def table(self) -> str:
        lines = [f"target loss {self.target_loss:g}; predicted critical batch (mean B_simple on the path) = "
                 f"{self.noise_scale:.1f} (B_simple at the target {self.noise_scale_at_target:.1f}); "
                 f"fit S = {self.s_min:.1f} (1 + {self.b_crit:.1f}/B)",
                 f"{'batch':>6} {'lr':>9} {'steps':>7} {'examples':>9} {'efficiency':>10}  region"]
        for r in self.rows():
            steps = "-" if r["steps"] is None else str(r["steps"])
            examples = "-" if r["examples"] is None else str(r["examples"])
            eff = "-" if r["efficiency"] is None else f"{r['efficiency']:.2f}"
            lr = "-" if r["lr"] is None else f"{r['lr']:.3g}"
            lines.append(f"{r['batch_size']:>6} {lr:>9} {steps:>7} {examples:>9} {eff:>10}  {r['region'] or '-'}")
        return "\n".join(lines)

    def plot(self, path=None, ax=None):
        return plot_batch_scaling(self, path=path, ax=ax)


def batch_size_study(model_fn, x, y, batch_sizes, target_loss: float, lrs, loss_fn=None, max_steps: int = 20000,
                     momentum: float = 0.0, noise_batch_size: int = 32, noise_batches: int = 64,
                     seed: int = 0) -> BatchScalingStudy:
    """Steps of SGD to ``target_loss`` (on all of x, y) at each batch size, each at its best lr from ``lrs``.

    The predicted critical batch size (``study.noise_scale``) is the gradient noise scale
    B_simple averaged over the steps of the largest batch size's run to the target (the
    path closest to noise-free descent): if each of the S_min steps of that path costs
    B_simple(w_t) examples when batches are small, E_min/S_min is that mean (McCandlish et
    al. 2018, appendix on a noise scale that changes during training). B_simple at the
    target itself is ``noise_scale_at_target``; it grows as the gradient shrinks.

    ``model_fn()`` builds a fresh model (seeded the same for every run); ``loss_fn``
    is mean-squared error by default. The loss on the whole data is measured after
    every step. The rates are tried from the largest down, each run stopped once it
    can no longer beat the best so far (``all_runs`` holds None for those). The fit of
    S = S_min (1 + B_crit/B) and the regions come from the measured steps.
    """
    from minidl.functional import mse_loss
    loss_fn = loss_fn or mse_loss
    batch_sizes = [int(b) for b in batch_sizes]
    if any(b < 1 or b > len(x) for b in batch_sizes) or sorted(set(batch_sizes)) != batch_sizes:
        raise ValueError(f"batch_size_study: batch sizes must increase and lie in 1..{len(x)}, got {batch_sizes}")
    if not lrs:
        raise ValueError("batch_size_study: give at least one learning rate")
    steps, best_lrs, all_runs, reached = [], [], {}, None
    for b in batch_sizes:
        best, best_lr, best_model = None, None, None
        for lr in sorted(lrs, reverse=True):  # large rates first: they diverge or finish fast
            budget = max_steps if best is None else best - 1  # a run only matters if it beats the best
            s, model = _run(model_fn, loss_fn, x, y, b, float(lr), target_loss, budget, seed, momentum) \
                if budget > 0 else (None, None)
            all_runs[(b, float(lr))] = s
            if s is not None and (best is None or s < best):
                best, best_lr, best_model = s, float(lr), model
        steps.append(best)
        best_lrs.append(best_lr)
        if best_model is not None:
            reached = (b, best_lr, best, best_model)
    if reached is None:
        raise ValueError(f"batch_size_study: no run reached the target loss {target_loss} in {max_steps} steps")
    # The prediction: B_simple along the path of the largest batch (nearly the noise-free path), averaged
    # over its steps: E_min / S_min when every step of that path would cost B_simple examples at small B.
    b, lr, s, model = reached
    path = []
    _run(model_fn, loss_fn, x, y, b, lr, target_loss, s, seed, momentum, before_step=lambda m: path.append(
        noise_scale_at(m, loss_fn, x, y, noise_batch_size, noise_batches, seed)))
    at_target = noise_scale_at(model, loss_fn, x, y, noise_batch_size, noise_batches, seed)
    study = BatchScalingStudy(batch_sizes, steps, best_lrs, float(target_loss), float(np.mean(path)),
                              noise_scale_at_target=at_target, noise_path=path, all_runs=all_runs)
    if sum(s is not None for s in steps) >= 2:
        study.s_min, study.b_crit = fit_steps_model(batch_sizes, steps)
    study.efficiency = scaling_efficiency(batch_sizes, steps)
    study.regions = classify_regions(batch_sizes, steps)
    return study


# ---------------------------------------------------------------- the plot
_COLORS = {REGIONS[0]: "tab:green", REGIONS[1]: "tab:orange", REGIONS[2]: "tab:red", None: "tab:gray"}


def plot_batch_scaling(study: BatchScalingStudy, path=None, ax=None):
    """Steps to the target against batch size (log-log), points coloured by region, with the fit
    S_min (1 + B_crit/B), its two asymptotes and the predicted critical batch size B_simple.

    Saves to ``path`` when given; returns the matplotlib Figure.
    """
    import matplotlib
    if ax is None and path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig = ax.figure if ax is not None else plt.subplots(figsize=(6.4, 4.4))[0]
    ax = ax if ax is not None else fig.axes[0]
    b = np.asarray(study.batch_sizes, dtype=np.float64)
    for region in (*REGIONS, None):
        pts = [(bi, s) for bi, s, r in zip(study.batch_sizes, study.steps, study.regions) if r == region and s]
        if pts:
            ax.plot(*zip(*pts), "o", color=_COLORS[region], label=region or "edge of the range", zorder=3)
    if np.isfinite(study.s_min) and np.isfinite(study.b_crit):
        grid = np.geomspace(b.min(), b.max(), 200)
        ax.plot(grid, study.s_min * (1 + study.b_crit / grid), "k-", lw=1,
                label="fit $S_{min}(1 + B_{crit}/B)$")
        ideal = grid[study.s_min * study.b_crit / grid >= study.s_min / 2]
        ax.plot(ideal, study.s_min * study.b_crit / ideal, "k:", lw=0.8, label="perfect scaling $\\propto 1/B$")
        ax.axhline(study.s_min, color="k", ls="--", lw=0.8, label=f"$S_{{min}}$ = {study.s_min:.0f}")
        if b.min() <= study.b_crit <= b.max():
            ax.axvline(study.b_crit, color="k", ls="-.", lw=0.8,
                       label=f"measured $B_{{crit}}$ (fit) = {study.b_crit:.0f}")
    if math.isfinite(study.noise_scale):
        ax.axvline(study.noise_scale, color="tab:blue", lw=1.5,
                   label=f"predicted: mean $B_{{simple}}$ = {study.noise_scale:.0f}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size B")
    ax.set_ylabel(f"steps to loss {study.target_loss:.4g}")
    ax.set_title("Batch-size scaling: steps to a target loss")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    if path is not None:
        from minidl.serialization import atomic_write
        atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=120, bbox_inches="tight"))
    return fig
