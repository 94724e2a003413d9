"""Every optimizer on 2-D test functions: the figure of `minidl optimizers`.

Three landscapes show three difficulties:

- a ravine, f = x²/20 + y²: an elongated quadratic, twenty times steeper
  across than along (the book's SGD-versus-SGDM figure). Plain SGD zig-zags
  between the walls; momentum and per-coordinate rates go down the valley.
- Rosenbrock's banana, f = (1 − x)² + 100(y − x²)²: a curved, flat-bottomed
  valley with its minimum at (1, 1).
- a saddle, f = x² − y² + y⁴/4: the start sits almost on the ridge
  (y ≈ 0); optimizers must notice the tiny slope towards either minimum at
  y = ±√2 and escape.

Each trajectory is a real run of the optimizer class on a (1, 2) parameter
tensor with minidl's autograd.
"""
from __future__ import annotations

import numpy as np

from minidl.autograd import no_grad
from minidl.tensor import Tensor


def ravine(x, y):
    return x * x / 20 + y * y


def rosenbrock(x, y):
    return (1 - x) ** 2 + 100 * (y - x * x) ** 2


def saddle(x, y):
    return x * x - y * y + y ** 4 / 4


# name: (function, start, (x range, y range), the minimum(s) to mark)
LANDSCAPES = {
    "ravine": (ravine, (-9.0, 2.0), ((-10, 3), (-3, 3)), [(0.0, 0.0)]),
    "rosenbrock": (rosenbrock, (-1.2, 1.0), ((-2, 2), (-1, 3)), [(1.0, 1.0)]),
    "saddle": (saddle, (-1.5, 0.01), ((-2, 2), (-2.5, 2.5)), [(0.0, 2 ** 0.5), (0.0, -(2 ** 0.5))]),
}


def optimizer_families():
    """Four panels of optimizers: name → (factory(params, lr), lr per landscape)."""
    from minidl import optim
    return {
        "gradient descent and momentum": {
            "SGD": (lambda p, lr: optim.SGD(p, lr=lr), dict(ravine=0.9, rosenbrock=3e-3, saddle=0.05)),
            "SGDM": (lambda p, lr: optim.SGDM(p, lr=lr, beta=0.9), dict(ravine=0.5, rosenbrock=0.03, saddle=0.1)),
            "NAG": (lambda p, lr: optim.NAG(p, lr=lr), dict(ravine=0.05, rosenbrock=1e-3, saddle=0.02)),
        },
        "per-coordinate rates": {
            "AdaGrad": (lambda p, lr: optim.AdaGrad(p, lr=lr), dict(ravine=2.0, rosenbrock=1.0, saddle=0.3)),
            "RMSProp": (lambda p, lr: optim.RMSProp(p, lr=lr), dict(ravine=0.1, rosenbrock=0.1, saddle=0.03)),
            "AdaDelta": (lambda p, lr: optim.AdaDelta(p, lr=lr, eps=1e-2),
                         dict(ravine=1.0, rosenbrock=0.1, saddle=0.3)),
        },
        "Adam family": {
            "Adam": (lambda p, lr: optim.Adam(p, lr=lr), dict(ravine=0.3, rosenbrock=0.3, saddle=0.1)),
            "AMSGrad": (lambda p, lr: optim.AMSGrad(p, lr=lr), dict(ravine=0.3, rosenbrock=0.3, saddle=0.1)),
            "NAdam": (lambda p, lr: optim.NAdam(p, lr=lr), dict(ravine=0.3, rosenbrock=0.1, saddle=0.1)),
            "RAdam": (lambda p, lr: optim.RAdam(p, lr=lr), dict(ravine=1.0, rosenbrock=1e-3, saddle=0.1)),
        },
        "layer-wise, averaged, second order": {
            "LARS": (lambda p, lr: optim.LARS(p, lr=lr, trust_coefficient=0.1),
                     dict(ravine=0.5, rosenbrock=0.1, saddle=0.1)),
            "LAMB": (lambda p, lr: optim.LAMB(p, lr=lr), dict(ravine=0.1, rosenbrock=0.1, saddle=0.03)),
            "NovoGrad": (lambda p, lr: optim.NovoGrad(p, lr=lr), dict(ravine=0.1, rosenbrock=0.1, saddle=0.03)),
            "Ranger": (lambda p, lr: optim.Ranger(p, lr=lr), dict(ravine=1.0, rosenbrock=1e-3, saddle=0.3)),
            "AdaHessian": (lambda p, lr: optim.AdaHessian(p, lr=lr, seed=0),
                           dict(ravine=0.1, rosenbrock=1.0, saddle=0.3)),
        },
    }


def trajectory(make_optimizer, function, start, steps: int = 200) -> np.ndarray:
    """The points (steps + 1, 2) visited by ``make_optimizer([w])`` minimizing ``function(x, y)`` from ``start``."""
    from minidl.optim.adahessian import AdaHessian
    from minidl.optim.lbfgs import LBFGS
    w = Tensor(np.array([start], dtype=np.float64), requires_grad=True)
    optimizer = make_optimizer([w])
    second_order = isinstance(optimizer, AdaHessian)
    points = [w.array[0].copy()]

    def closure():
        optimizer.zero_grad()
        loss = function(w[0, 0], w[0, 1])
        loss.backward(create_graph=second_order)
        return loss
    for _ in range(steps):
        if isinstance(optimizer, LBFGS):  # it evaluates the function as often as its line search needs
            optimizer.step(closure)
        else:
            closure()
            optimizer.step()
        with no_grad():
            if not np.all(np.isfinite(w.array)) or np.abs(w.array).max() > 1e3:
                break  # diverged: stop drawing
        points.append(w.array[0].copy())
    return np.array(points)


# Paths in one panel often share stretches; different dashes and widths (the first drawn widest)
# keep each one visible where it runs under another.
PATH_STYLES = [dict(linestyle="-", linewidth=2.6), dict(linestyle="--", linewidth=2.0),
               dict(linestyle=":", linewidth=2.2), dict(linestyle="-.", linewidth=1.4),
               dict(linestyle=(0, (5, 1, 1, 1, 1, 1)), linewidth=1.1)]


def draw_landscape(ax, name: str, paths: dict, title: str | None = None):
    """Contours of a landscape, the start, the minima, and each named path (its end marked)."""
    function, start, (xr, yr), minima = LANDSCAPES[name]
    xs, ys = np.meshgrid(np.linspace(*xr, 160), np.linspace(*yr, 160))
    zs = function(xs, ys)
    levels = np.quantile(zs, np.linspace(0.01, 0.95, 14))
    ax.contour(xs, ys, zs, levels=np.unique(levels), colors="0.82", linewidths=0.6)
    for i, (label, path) in enumerate(paths.items()):
        style = PATH_STYLES[i % len(PATH_STYLES)]
        line, = ax.plot(path[:, 0], path[:, 1], color=f"C{i}", alpha=0.85, label=label, **style)
        ax.plot(path[-1, 0], path[-1, 1], marker="o", markersize=5, color=line.get_color(),
                markeredgecolor="black", markeredgewidth=0.5, zorder=4)
    ax.plot(*start, "ko", markersize=5, zorder=5)
    for m in minima:
        ax.plot(*m, "r*", markersize=11, zorder=5)
    ax.set_xlim(*xr)
    ax.set_ylim(*yr)
    ax.set_xlabel("x", fontsize=8, labelpad=1)
    ax.set_ylabel("y", fontsize=8, labelpad=1)
    ax.set_title(title or name, fontsize=9)
    ax.tick_params(labelsize=7)


def all_trajectories(steps: int = 200, progress: bool = False) -> dict:
    """{(landscape, family): {optimizer name: path}} for every optimizer on every landscape.

    ``progress``: a progress bar over the runs (a few seconds in all).
    """
    families = optimizer_families()
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(LANDSCAPES) * sum(len(m) for m in families.values()), unit="run",
                   desc="optimizers", dynamic_ncols=True)
    result = {}
    try:
        for family, members in families.items():
            for name, (function, start, _, _) in LANDSCAPES.items():
                result[name, family] = {}
                for label, (make, lrs) in members.items():
                    if bar is not None:
                        bar.set_postfix_str(f"{label} on {name}", refresh=False)
                    result[name, family][label] = trajectory(lambda p, make=make, lr=lrs[name]: make(p, lr),
                                                             function, start, steps)
                    if bar is not None:
                        bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return result


def draw_all(figure, paths: dict):
    """The grid on a matplotlib figure: rows are landscapes, columns families of optimizers."""
    families = list(optimizer_families())
    axes = figure.subplots(len(LANDSCAPES), len(families), squeeze=False)
    for row, name in enumerate(LANDSCAPES):
        for col, family in enumerate(families):
            draw_landscape(axes[row][col], name, paths[name, family], f"{name}: {family}")
    for col in range(len(families)):  # the same optimizers in every row: one legend under each column
        handles, labels = axes[-1][col].get_legend_handles_labels()
        axes[-1][col].legend(handles, labels, fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.2),
                             ncol=min(len(labels), 3), frameon=False, handlelength=3)
    return axes


def optimizers_command(out_path: str = "optimizers.png", steps: int = 200, progress: bool = False) -> str:
    """Draw every optimizer on the ravine, Rosenbrock and saddle landscapes as one PNG grid.

    Rows are landscapes, columns families of optimizers; ``steps`` optimizer
    steps per trajectory. The file is written to a temporary name, then
    renamed. Returns ``out_path``.
    """
    from matplotlib.figure import Figure

    from minidl.optim.lr_finder import save_figure
    figure = Figure(figsize=(4 * len(optimizer_families()), 3.3 * len(LANDSCAPES) + 0.9), layout="constrained")
    draw_all(figure, all_trajectories(steps, progress=progress))
    figure.suptitle(f"{steps} steps of each optimizer (start: black dot; end: colored dot; minimum: red star)")
    return save_figure(figure, out_path, dpi=80)
