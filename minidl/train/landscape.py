"""The loss around a trained model: slices, the line between two solutions, sharpness.

    slice1 = loss_landscape(model, loss_fn, (x, y), directions=1)           # L(θ + α·d) over α
    slice2 = loss_landscape(model, loss_fn, (x, y), directions=2, steps=21) # L(θ + α·d₁ + β·d₂)
    line = interpolate(model_a, model_b, alphas, loss_fn, (x, y))           # L((1 − α)θ_a + α·θ_b)
    rows = sharpness({"batch 16": m16, "batch 512": m512}, loss_fn, (x, y)) # trace and λ_max side by side
    sharp = rescale_relu_layers(model, "0", "2", alpha=10.0)                # same function, other Hessian

- Filter-normalized directions (Li, Xu, Taylor, Studer & Goldstein 2018,
  "Visualizing the Loss Landscape of Neural Nets"): a random Gaussian
  direction d, each filter dᵢ (a row of a weight: the weights of one output
  unit or channel) rescaled to the norm of the weight's filter,
  dᵢ ← dᵢ/‖dᵢ‖·‖θᵢ‖; one-dimensional parameters (biases, norm scales) get 0.
  The scale of a slice then means the same for every layer and every model,
  which is what makes two slices comparable.
- Sharpness: the Hessian's trace (Hutchinson) and its top eigenvalue (power
  iteration), from :mod:`minidl.optim.curvature`.
- Why sharpness alone cannot decide generalization (Dinh, Pascanu, Bengio &
  Bengio 2017, "Sharp Minima Can Generalize For Deep Nets"): ReLU is
  positively homogeneous, relu(αz) = α·relu(z) for α > 0, so multiplying one
  layer's weights and bias by α and the next layer's weights by 1/α computes
  the same function, with the same loss everywhere on the data, while the
  Hessian's blocks scale by 1/α² and α²: a flat minimum becomes as sharp as
  one likes. :func:`rescale_relu_layers` does it.

Every function leaves the models as it found them (weights and train/eval mode).
"""
from __future__ import annotations

import copy

import numpy as np

from minidl import backend
from minidl.autograd import no_grad
from minidl.optim.curvature import hessian_trace, top_hessian_eigenvalue
from minidl.tensor import Tensor


class _Kept:
    """Restore a model's parameters and mode on exit (the functions below move the weights)."""

    def __init__(self, model):
        self.model = model

    def __enter__(self):
        self.params = [p.array.copy() for p in self.model.parameters()]
        self.training = self.model.training
        self.model.eval()
        return self

    def __exit__(self, *exc):
        for p, kept in zip(self.model.parameters(), self.params):
            p.array[...] = kept
        self.model.train(self.training)


def _check_model(owner, model):
    if not (hasattr(model, "parameters") and callable(model)):
        raise TypeError(f"{owner}: expected a Module (something with parameters() that can be called), "
                        f"got {type(model).__name__}")
    params = list(model.parameters())
    if not params:
        raise ValueError(f"{owner}: the model has no parameters")
    return params


def _loss_of(model, loss_fn, batch) -> float:
    x, y = batch
    params = list(model.parameters())
    x = Tensor(backend.to_device(np.asarray(backend.to_numpy(x)), params[0].device))
    y = Tensor(backend.to_device(np.asarray(backend.to_numpy(y)), params[0].device))
    with no_grad():
        return float(loss_fn(model(x), y).item())


def filter_normalized_direction(model, seed: int = 0, ignore_1d: bool = True) -> list:
    """A random direction (one array per parameter), filter-normalized as Li et al. (2018).

    For a weight θ of shape (out, ...), dᵢ ~ N(0, I) for each output row i, then
    dᵢ ← dᵢ · ‖θᵢ‖/‖dᵢ‖. One-dimensional parameters get zeros (``ignore_1d``) or are
    normalized as one filter.
    """
    rng = np.random.default_rng(seed)
    directions = []
    for p in _check_model("filter_normalized_direction", model):
        w = backend.to_numpy(p.array).astype(np.float64)
        d = rng.standard_normal(w.shape)
        if w.ndim <= 1:
            if ignore_1d:
                d = np.zeros_like(w)
            else:
                d *= np.linalg.norm(w) / max(np.linalg.norm(d), 1e-30)
        else:
            rows, rows_w = d.reshape(len(d), -1), w.reshape(len(w), -1)
            scale = np.linalg.norm(rows_w, axis=1) / np.maximum(np.linalg.norm(rows, axis=1), 1e-30)
            d = (rows * scale[:, None]).reshape(w.shape)
        directions.append(d.astype(p.dtype))
    return directions


class Landscape:
    """A slice of the loss: ``alphas`` (and ``betas`` in 2-D), ``losses`` ((len(alphas),) or
    (len(alphas), len(betas)): losses[i, j] at θ + αᵢd₁ + βⱼd₂), and the ``directions`` used."""

    def __init__(self, alphas, betas, losses, directions):
        self.alphas, self.betas, self.losses, self.directions = alphas, betas, losses, directions

    def plot(self, ax=None, label=None):
        """A line (1-D) or filled contours (2-D) on ``ax`` (a new figure when None); returns the axes."""
        import matplotlib.pyplot as plt
        if ax is None:
            ax = plt.subplots(figsize=(4.5, 3.5))[1]
        if self.betas is None:
            ax.plot(self.alphas, self.losses, label=label)
            ax.set_xlabel("α (filter-normalized direction)")
            ax.set_ylabel("loss")
        else:
            grid = ax.contourf(self.alphas, self.betas, self.losses.T, levels=20, cmap="viridis")
            ax.figure.colorbar(grid, ax=ax, label="loss")
            ax.set_xlabel("α")
            ax.set_ylabel("β")
        return ax


def loss_landscape(model, loss_fn, batch, directions: int = 1, span=(-1.0, 1.0), steps: int = 25,
                   seed: int = 0, direction_vectors=None) -> Landscape:
    """The loss on ``batch = (x, y)`` along 1 or 2 filter-normalized random directions from the model's weights.

    ``span`` is the range of α (and β); ``steps`` points per axis. ``direction_vectors``
    (a list of 1 or 2 lists of arrays) replaces the random directions, e.g. to slice two
    models along the same ones. The model is evaluated in eval mode and restored.
    """
    params = _check_model("loss_landscape", model)
    if directions not in (1, 2):
        raise ValueError(f"loss_landscape: directions must be 1 or 2, got {directions!r}")
    if not (isinstance(steps, int) and steps >= 2):
        raise ValueError(f"loss_landscape: steps must be an integer >= 2, got {steps!r}")
    if direction_vectors is None:
        direction_vectors = [filter_normalized_direction(model, seed + k) for k in range(directions)]
    if len(direction_vectors) != directions or any(
            [tuple(a.shape) for a in d] != [tuple(p.shape) for p in params] for d in direction_vectors):
        raise ValueError(f"loss_landscape: direction_vectors must hold {directions} list(s) of arrays shaped like "
                         "the model's parameters, in the order of model.parameters()")
    alphas = np.linspace(span[0], span[1], steps)
    betas = alphas.copy() if directions == 2 else None
    losses = np.empty((steps,) if directions == 1 else (steps, steps))
    with _Kept(model) as kept:
        for index in np.ndindex(losses.shape):
            coefficients = [alphas[index[0]]] + ([betas[index[1]]] if directions == 2 else [])
            for k, (p, origin) in enumerate(zip(params, kept.params)):
                moved = backend.to_numpy(origin).astype(np.float64) + sum(c * backend.to_numpy(d[k]).astype(np.float64)
                                                        for c, d in zip(coefficients, direction_vectors))
                p.array[...] = backend.to_device(moved.astype(p.dtype), p.device)
            losses[index] = _loss_of(model, loss_fn, batch)
    return Landscape(alphas, betas, losses, direction_vectors)


def interpolate(model_a, model_b, alphas, loss_fn, batch) -> np.ndarray:
    """The loss on ``batch`` at θ(α) = (1 − α)·θ_a + α·θ_b for each α: the straight line between two solutions.

    The models must have the same architecture; floating-point buffers (BatchNorm's
    running statistics) are interpolated too. A bump above both ends is the barrier
    between the two minima. Evaluated on ``model_a``, which is restored afterwards.
    """
    params_a, params_b = _check_model("interpolate", model_a), _check_model("interpolate", model_b)
    shapes_a, shapes_b = [tuple(p.shape) for p in params_a], [tuple(p.shape) for p in params_b]
    if shapes_a != shapes_b:
        raise ValueError(f"interpolate: the two models' parameters differ in shape ({shapes_a} against "
                         f"{shapes_b}); interpolate between two models of the same architecture")
    buffers_a = [b for b in model_a.buffers() if np.issubdtype(b.dtype, np.floating)]
    buffers_b = [b for b in model_b.buffers() if np.issubdtype(b.dtype, np.floating)]
    tensors_a, tensors_b = params_a + buffers_a, params_b + buffers_b
    origins = [t.array.copy() for t in tensors_a]
    losses = []
    try:
        with _Kept(model_a):
            for alpha in np.asarray(alphas, dtype=np.float64).reshape(-1):
                for ta, tb, origin in zip(tensors_a, tensors_b, origins):
                    mixed = ((1 - alpha) * backend.to_numpy(origin).astype(np.float64)
                             + alpha * backend.to_numpy(tb.array).astype(np.float64))
                    ta.array[...] = backend.to_device(mixed.astype(ta.dtype), ta.device)
                losses.append(_loss_of(model_a, loss_fn, batch))
    finally:
        for t, origin in zip(tensors_a, origins):
            t.array[...] = origin
    return np.array(losses)


def sharpness(models, loss_fn, batch, samples: int = 32, iters: int = 50, seed: int = 0) -> list[dict]:
    """For each named model, ``{"name", "loss", "trace", "top_eigenvalue"}`` of the loss on ``batch``.

    ``models`` is a dict {name: model} (or one model). The trace is Hutchinson's
    estimate with ``samples`` Rademacher vectors, the top eigenvalue power
    iteration with at most ``iters`` products (:mod:`minidl.optim.curvature`).
    Models are evaluated in eval mode and restored.
    """
    models = models if isinstance(models, dict) else {"model": models}
    rows = []
    for name, model in models.items():
        params = _check_model("sharpness", model)
        x, y = batch
        x = Tensor(backend.to_device(np.asarray(backend.to_numpy(x)), params[0].device))
        y = Tensor(backend.to_device(np.asarray(backend.to_numpy(y)), params[0].device))
        with _Kept(model):
            loss = loss_fn(model(x), y)
            rows.append({"name": name, "loss": float(loss.item()),
                         "trace": hessian_trace(loss, params, samples=samples, seed=seed),
                         "top_eigenvalue": top_hessian_eigenvalue(loss, params, iters=iters, seed=seed)})
    return rows


def rescale_relu_layers(model, first: str, second: str, alpha: float, inplace: bool = False):
    """Multiply layer ``first``'s weight and bias by α and layer ``second``'s weight by 1/α (α > 0).

    When only a ReLU (or another positively homogeneous map) lies between the two
    layers, the network computes exactly the same function, so its loss is the
    same on every input; the Hessian of the loss with respect to the first layer's
    parameters is divided by α² and that of the second multiplied by α²
    (Dinh et al. 2017). ``first``/``second`` are names from ``model.named_modules()``.
    Returns the rescaled model (a deep copy unless ``inplace``).
    """
    if not (isinstance(alpha, (int, float)) and alpha > 0):
        raise ValueError(f"rescale_relu_layers: alpha must be a positive number (ReLU is homogeneous only for "
                         f"α > 0), got {alpha!r}")
    weighted = [n for n, m in model.named_modules() if getattr(m, "weight", None) is not None]
    for name in (first, second):
        if name not in weighted:
            raise ValueError(f"rescale_relu_layers: {name!r} is not a layer with a weight in this model; "
                             f"its layers with weights are {weighted}")
    target = model if inplace else copy.deepcopy(model)
    modules = dict(target.named_modules())
    with no_grad():
        modules[first].weight.array[...] *= alpha
        if getattr(modules[first], "bias", None) is not None:
            modules[first].bias.array[...] *= alpha
        modules[second].weight.array[...] *= 1.0 / alpha
    return target
