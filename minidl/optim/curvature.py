"""Curvature of the loss and the gradient noise scale.

- Sharp versus flat minima: a minimum where the loss curves steeply (large
  Hessian eigenvalues, large trace) tends to generalize worse than a wide,
  flat one. ``top_hessian_eigenvalue`` (power iteration) and
  ``hessian_trace`` (Hutchinson's estimator) measure it without ever forming
  the Hessian: both need only Hessian-vector products, and

      Hv = ∂/∂w (∇L(w) · v)

  is one more backward pass through the graph of the gradient (autograd's
  ``create_graph=True``), at about the cost of a second gradient.
- How large a batch is worth it: the gradient noise scale (McCandlish et al.
  2018) B_simple = tr(Σ)/‖G‖², with G the true gradient and Σ the covariance
  of one example's gradient. Batches much smaller than B_simple are noise
  dominated (a larger batch helps almost linearly); much larger ones waste
  computation.

Losses are minidl Tensors built with the graph (not under ``no_grad``);
parameters are Tensors with ``requires_grad=True``.
"""
from __future__ import annotations

import numpy as np

from minidl import backend
from minidl.autograd import grad
from minidl.tensor import Tensor


def _as_list(params):
    single = isinstance(params, Tensor)
    params = [params] if single else list(params)
    if not params:
        raise ValueError("curvature: got an empty parameter list")
    return params, single


def _gradient_graph(loss, params):
    if not isinstance(loss, Tensor) or loss.array.size != 1:
        raise ValueError("curvature: expected the loss as a one-element Tensor built with its graph")
    if not loss.requires_grad:
        raise RuntimeError("curvature: the loss has no graph; compute it outside no_grad from "
                           "parameters with requires_grad=True")
    return grad(loss, params, create_graph=True, retain_graph=True, allow_unused=True)


def _hvp(grads, params, vectors):
    """H·v for the gradient graph ``grads``; vectors are arrays shaped like params. Returns arrays."""
    live = [i for i, g in enumerate(grads) if g is not None and g.requires_grad]
    if not live:  # the loss is at most linear in the parameters: H = 0
        return [p.xp.zeros(p.shape, p.dtype) for p in params]
    hv = grad([grads[i] for i in live], params, grad_outputs=[Tensor(vectors[i]) for i in live],
              retain_graph=True, allow_unused=True)
    return [p.xp.zeros(p.shape, p.dtype) if h is None else h.array for p, h in zip(params, hv)]


def hessian_vector_product(loss, params, vectors):
    """H·v, the Hessian of ``loss`` with respect to ``params`` times ``vectors``.

    ``params`` is a Tensor or a list of Tensors and ``vectors`` has the same
    structure (arrays or Tensors). Returns Tensors of the same structure. The
    loss's graph is kept, so the function may be called again on it.
    """
    params, single = _as_list(params)
    vectors = [vectors] if single else list(vectors)
    arrays = []
    for p, v in zip(params, vectors):
        v = v.array if isinstance(v, Tensor) else v
        v = backend.to_device(v if hasattr(v, "dtype") else np.asarray(v), p.device)
        if v.shape != p.shape:
            raise ValueError(f"hessian_vector_product: vector of shape {v.shape} for a parameter of shape {p.shape}")
        arrays.append(v.astype(p.dtype, copy=False))
    result = [Tensor(h) for h in _hvp(_gradient_graph(loss, params), params, arrays)]
    return result[0] if single else result


def _dot(xs, ys) -> float:
    return float(sum(float((x.astype(np.float64) * y.astype(np.float64)).sum()) for x, y in zip(xs, ys)))


def hessian_trace(loss, params, samples: int = 64, seed: int = 0) -> float:
    """Hutchinson's estimate of tr(H): the mean of zᵀHz over Rademacher vectors z (E[zzᵀ] = I).

    Its standard error falls as 1/√samples; for a diagonal H every sample is exact.
    """
    params, _ = _as_list(params)
    grads = _gradient_graph(loss, params)
    rng = np.random.default_rng(seed)
    total = 0.0
    for _ in range(int(samples)):
        zs = [backend.to_device((rng.integers(0, 2, p.shape) * 2 - 1).astype(p.dtype), p.device) for p in params]
        total += _dot(zs, _hvp(grads, params, zs))
    return total / int(samples)


def top_hessian_eigenvalue(loss, params, iters: int = 100, tol: float = 1e-6, seed: int = 0) -> float:
    """The Hessian's eigenvalue of largest magnitude, by power iteration: v ← Hv/‖Hv‖.

    λ = vᵀHv (the Rayleigh quotient) is returned once it changes by less than
    ``tol`` relative, or after ``iters`` products. The sharpness of a minimum.
    """
    params, _ = _as_list(params)
    grads = _gradient_graph(loss, params)
    rng = np.random.default_rng(seed)
    v = [backend.to_device(rng.standard_normal(p.shape).astype(p.dtype), p.device) for p in params]
    length = _dot(v, v) ** 0.5
    v = [x / length for x in v]
    eigenvalue = 0.0
    for _ in range(int(iters)):
        hv = _hvp(grads, params, v)
        new = _dot(v, hv)
        length = _dot(hv, hv) ** 0.5
        if length == 0:
            return 0.0
        v = [h / length for h in hv]
        if abs(new - eigenvalue) <= tol * max(abs(new), 1e-30):
            return new
        eigenvalue = new
    return eigenvalue


def _batch_size(batch) -> int:
    first = batch[0] if isinstance(batch, (tuple, list)) else batch
    return len(first)


def gradient_noise_scale(loss_fn, params, batches, batch_size: int | None = None) -> float:
    """The simple noise scale B = tr(Σ)/‖G‖², estimated from gradients of several equal-size batches.

    ``loss_fn(batch)`` returns the mean loss of one batch; ``batches`` is an
    iterable of at least two batches (their size B is read from ``len(batch[0])``
    for (x, y) pairs, else ``len(batch)``, unless ``batch_size`` is given).
    With G_b the batch gradients and Ḡ their mean over n batches:

        tr(Σ) ≈ B · Σ_b ‖G_b − Ḡ‖² / (n − 1)        a batch mean's covariance is Σ/B
        ‖G‖²  ≈ ‖Ḡ‖² − tr(Σ)/(n·B)                  remove the noise in ‖Ḡ‖² (unbiased)

    The book's reading: batches much smaller than B are dominated by gradient
    noise, so doubling them nearly halves the steps; much beyond B it buys little.
    """
    params, _ = _as_list(params)
    flat, size = [], batch_size
    for batch in batches:
        size = size or _batch_size(batch)
        gs = grad(loss_fn(batch), params, allow_unused=True)
        flat.append(np.concatenate([np.zeros(p.numel()) if g is None else backend.to_numpy(g.array).astype(np.float64)
                                    .reshape(-1) for p, g in zip(params, gs)]))
    n = len(flat)
    if n < 2:
        raise ValueError(f"gradient_noise_scale: needs at least 2 batches to see the noise, got {n}")
    stacked = np.stack(flat)
    mean = stacked.mean(axis=0)
    trace_sigma = size * ((stacked - mean) ** 2).sum() / (n - 1)
    norm2 = float(mean @ mean) - trace_sigma / (n * size)
    if norm2 <= 0:  # the noise swamps the mean gradient: B is at least as large as the data seen
        return float("inf")
    return float(trace_sigma / norm2)
