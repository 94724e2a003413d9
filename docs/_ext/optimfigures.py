"""The figures of the Optimizers page: each optimizer on the ravine, each schedule's curve.

Used by ``optimdoc.py``. The trajectories are real runs of the optimizer
classes with :func:`minidl.optim.trajectories.trajectory` (which also runs
AdaHessian's ``backward(create_graph=True)``), at the learning rates of the
``minidl optimizers`` figure; the PNGs go to ``docs/_generated/optim/`` and
are rewritten only when their bytes change, so an unchanged figure does not
make Sphinx rebuild the page.
"""
from __future__ import annotations

import inspect
import io
import os
from pathlib import Path

import numpy as np
from docutils import nodes
from sphinx.util import logging

OUTPUT = Path(__file__).resolve().parent.parent / "_generated" / "optim"
RAVINE_STEPS = 200
# The ravine runs that minidl.optim.trajectories (the `minidl optimizers` figure) leaves out.
EXTRA_RAVINE_RUNS = {
    "AdamW": ("lambda p, lr: optim.AdamW(p, lr=lr)", 0.3),
    "Lookahead": ("lambda p, lr: optim.Lookahead(optim.SGD(p, lr=lr))", 0.9),
    "RangerLARS": ("lambda p, lr: optim.RangerLARS(p, lr=lr)", 0.1),
    "LBFGS": ("lambda p, lr: optim.LBFGS(p, lr=lr, max_iter=1, max_eval=10, line_search_fn='strong_wolfe')", 1.0),
}
SWA_RUN = dict(lr=1.0, start=50)  # SGD bouncing across the ravine for ever (y ← −y); averaged from step 50
SCHEDULE_STEPS = 300
# name: (example call, log scale); every schedule needs one.
SCHEDULE_EXAMPLES = {
    "constant": ("constant(0.1)", False),
    "step_decay": ("step_decay(0.1, 0.1, step_size=100)", True),
    "exponential": ("exponential(0.1, 0.99)", False),
    "polynomial": ("polynomial(0.1, total=300, power=2)", False),
    "cyclical": ("cyclical(0.01, 0.1, step_size_up=50)", False),
    "cosine": ("cosine(0.1, T_max=300)", False),
    "cosine_restarts": ("cosine_restarts(0.1, T0=50, T_mult=2)", False),
    "inverse_sqrt": ("inverse_sqrt(0.1, warmup=30)", False),
    "warmup": ("warmup(polynomial(0.1, total=300), steps=30)", False),
    "sequential": ("sequential([constant(0.1), exponential(0.1, 0.98)], milestones=[150])", False),
}
logger = logging.getLogger(__name__)


def fmt(value) -> str:
    """A default or a setting as it would be typed: 1e-8 rather than 1e-08."""
    if isinstance(value, float):
        return f"{value:g}".replace("e-0", "e-").replace("e+0", "e")
    if isinstance(value, tuple):
        return "(" + ", ".join(fmt(v) for v in value) + ")"
    return repr(value) if isinstance(value, str) else str(value)


def write_png(figure, name: str) -> str:
    """Save ``figure`` as docs/_generated/optim/<name>.png if its bytes changed; the uri for the page."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    data, path = buffer.getvalue(), OUTPUT / f"{name}.png"
    if not path.exists() or path.read_bytes() != data:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_bytes(data)
        os.replace(temporary, path)
    return f"/_generated/optim/{name}.png"


def ravine_runs():
    """name → (factory(params, lr), lr): trajectories.py's ravine runs, and the ones it leaves out."""
    from minidl import optim
    from minidl.optim.trajectories import optimizer_families
    runs = {name: (make, lrs["ravine"]) for members in optimizer_families().values()
            for name, (make, lrs) in members.items()}
    for name, (source, lr) in EXTRA_RAVINE_RUNS.items():
        runs.setdefault(name, (eval(source, {"optim": optim}), lr))  # noqa: S307 - our own table above
    return runs


def call_text(opt) -> str:
    """How an optimizer was made, from its settings: ``AdaDelta(lr=1, eps=0.01)``."""
    from minidl.optim import Optimizer
    parts = []
    group = opt.param_groups[0]
    for name, param in inspect.signature(type(opt)).parameters.items():
        value = group.get(name, getattr(opt, name, param.empty))
        if name == "params" or value is param.empty:
            continue
        if isinstance(value, Optimizer):
            parts.append(call_text(value))
        elif name == "lr" or value != param.default:
            parts.append(f"{name}={fmt(value)}")
    return f"{type(opt).__name__}({', '.join(parts)})"


def swa_run():
    """(SGD path, SWA average path, caption words): SWA averaging SGD's weights after SWA_RUN["start"] steps."""
    from minidl.optim import SGD, SWA
    from minidl.optim.trajectories import LANDSCAPES, trajectory
    function, start = LANDSCAPES["ravine"][:2]
    averages = []

    class SGDThenSWA(SGD):
        def step(self, closure=None):
            super().step(closure)
            self.steps = getattr(self, "steps", 0) + 1
            if self.steps > SWA_RUN["start"]:
                self.swa.update()
                averages.append(self.swa.averages[0][0].copy())

    def make(params):
        optimizer = SGDThenSWA(params, lr=SWA_RUN["lr"])
        optimizer.swa = SWA(params)
        return optimizer
    path = trajectory(make, function, start, RAVINE_STEPS)
    sgd = f"SGD(lr={fmt(SWA_RUN['lr'])})"
    words = [nodes.literal("SWA", "SWA"), nodes.Text(" averaging the weights of "), nodes.literal(sgd, sgd),
             nodes.Text(f" after step {SWA_RUN['start']}")]
    return {sgd: path, "SWA average": np.array(averages)}, words


def ravine_figure(cls):
    """(png uri, caption nodes) of ``cls`` on the ravine, or None when there is no way to run it."""
    from matplotlib.figure import Figure

    from minidl.optim import SWA
    from minidl.optim.trajectories import LANDSCAPES, draw_landscape, ravine, trajectory
    function, start = LANDSCAPES["ravine"][:2]
    if cls is SWA:  # SWA averages what another optimizer visits
        paths, words = swa_run()
        path, final = paths[next(iter(paths))], paths["SWA average"][-1]
    else:
        make, lr = ravine_runs().get(cls.__name__, (lambda p, lr: cls(p, lr=lr), 0.1))
        made = []
        try:
            path = trajectory(lambda p: made.append(make(p, lr)) or made[-1], function, start, RAVINE_STEPS)
        except (TypeError, ValueError, RuntimeError) as error:
            logger.warning(f"optimdoc: cannot run {cls.__name__} on the ravine ({error}); "
                           "add it to EXTRA_RAVINE_RUNS in docs/_ext/optimfigures.py")
            return None
        call = call_text(made[0])
        paths, words, final = {cls.__name__: path}, [nodes.literal(call, call)], path[-1]
    figure = Figure(figsize=(4.8, 2.4))
    ax = figure.subplots()
    draw_landscape(ax, "ravine", paths, f"{cls.__name__} on the ravine")
    if len(paths) > 1:
        ax.legend(fontsize=7, loc="lower right")
    figure.tight_layout()
    uri = write_png(figure, f"ravine-{cls.__name__.lower()}")
    steps = len(path) - 1
    loss = f"{float(ravine(*final)):.2g}".replace("e-0", "e-")
    outcome = f"final loss {loss}" if steps == RAVINE_STEPS else f"diverged after {steps} steps"
    caption = [*words, nodes.Text(f", {RAVINE_STEPS} steps from ({fmt(start[0])}, {fmt(start[1])}) on the ravine "),
               nodes.math("f = x^2/20 + y^2", "f = x^2/20 + y^2"), nodes.Text(f": {outcome}.")]
    return uri, caption


def schedule_figure(name: str, schedule, log: bool) -> str:
    """The curve of ``schedule`` over t = 0 … SCHEDULE_STEPS; the uri for the page."""
    from matplotlib.figure import Figure
    steps = list(range(SCHEDULE_STEPS + 1))
    figure = Figure(figsize=(4.8, 2.0))
    ax = figure.subplots()
    ax.plot(steps, [schedule(t) for t in steps], linewidth=1.4)
    if log:
        ax.set_yscale("log")
    ax.set_xlabel("t (steps taken)", fontsize=8)
    ax.set_ylabel("learning rate", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    figure.tight_layout()
    return write_png(figure, f"schedule-{name}")
