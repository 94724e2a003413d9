"""Magnitude pruning: zero the smallest weights, and keep them zero while the network trains on.

    pruning = nn.prune.Pruning(model)                 # every weight matrix / conv kernel (ndim >= 2)
    pruning.attach(optimizer)                         # pruned weights stay zero through every later step
    for sparsity in nn.prune.sparsity_schedule(0.9, rounds=4):   # prune, then fine-tune, 4 times
        pruning.prune(sparsity, scope="global")
        trainer.fit(epochs=trainer.epoch + 2)
    print(pruning.format_report())                    # zeros per layer, and overall

Unstructured magnitude pruning (Han et al., 2015) ranks individual weights
by |w| and sets the smallest to zero. ``scope="global"`` ranks every pruned
weight of the model together, against one threshold, so layers with many
small weights lose more of them; ``scope="layer"`` prunes the same fraction
of every layer, each against its own threshold. ``sparsity`` is the fraction
of zeros wanted in all (not the fraction of what is left, as PyTorch's
``amount``); a weight pruned once stays pruned, so an iterative schedule of
growing sparsities removes weights a round at a time.

How the zeros are kept: :meth:`Pruning.attach` wraps the optimizer's
``step``, so that each step (1) multiplies the gradients by the masks first
and (2) multiplies the weights by the masks after. (2) is the guarantee: an
update can move a weight whose gradient is zero (SGD's momentum buffer,
Adam's m from before the pruning, a schedule of decay), and only masking the
weight itself after the update keeps it at exactly zero for every optimizer.
(1) keeps the pruned weights' gradients out of the optimizer's state from
then on, so that momentum and Adam's moments of those weights decay to zero
instead of being fed. The mask is not applied in the forward pass (PyTorch's
``torch.nn.utils.prune`` reparametrizes ``weight = weight_orig * mask``); the
stored weight *is* zero, so the state dict, ``model(x)`` and any exported
copy are sparse as they are, with no renamed parameters.

The masks travel with the model. Each is a boolean buffer of the layer that
owns the weight, named after it with ``_mask`` (PyTorch's spelling): pruning
``fc.weight`` registers ``fc.weight_mask`` (True = kept). So
``model.state_dict()``, every Trainer checkpoint and ``model.safetensors``
hold them, and a resumed run keeps its sparsity: build the model, call
``Pruning(model)`` (or :meth:`Pruning.for_state_dict`, which finds the pruned
names in a saved state) and attach it again, then load; the loaded masks are
the ones it applies. A state dict with masks loads into a model only where
they are registered (``load_state_dict`` is strict), as in PyTorch. The weight
keeps its own name (``fc.weight``; PyTorch renames it ``fc.weight_orig``).
"""
from __future__ import annotations

import numpy as np

from minidl.tensor import Tensor

__all__ = ["Pruning", "global_magnitude_masks", "layerwise_magnitude_masks", "sparsity_schedule"]


def _check_sparsity(owner: str, sparsity) -> float:
    if isinstance(sparsity, bool) or not isinstance(sparsity, (int, float, np.floating)) \
            or not 0.0 <= float(sparsity) <= 1.0:
        raise ValueError(f"{owner}: sparsity is the fraction of weights set to zero, a number in [0, 1]; "
                         f"got {sparsity!r}")
    return float(sparsity)


def _scores(weights, masks):
    """|w| where the weight is alive; -1 (below every magnitude) where it is already pruned."""
    out = []
    for i, w in enumerate(weights):
        score = abs(w).astype(np.float64)
        if masks is not None:
            score[~masks[i]] = -1.0
        out.append(score)
    return out


def _smallest(score_flat, k: int, xp):
    """Boolean mask over ``score_flat``, True at the ``k`` smallest scores (ties: the first in order)."""
    keep = xp.ones(score_flat.shape, dtype=bool)
    if k > 0:
        order = xp.argsort(score_flat, kind="stable")
        keep[order[:k]] = False
    return keep


def global_magnitude_masks(weights, sparsity: float, masks=None) -> list:
    """Masks (True = kept) pruning the ``round(sparsity · N)`` smallest |w| of all ``weights`` together.

    ``weights``: arrays (NumPy or CuPy); N counts all their entries. One threshold for every
    layer. ``masks``: the current masks; weights already pruned are pruned first (they count
    towards the sparsity and stay pruned). Ties are broken by position (layer order, then C order).
    """
    sparsity = _check_sparsity("global_magnitude_masks", sparsity)
    weights = [w.array if isinstance(w, Tensor) else w for w in weights]
    if not weights:
        return []
    from minidl.backend import xp_of
    xp = xp_of(weights[0])
    scores = _scores(weights, masks)
    flat = xp.concatenate([s.ravel() for s in scores])
    keep = _smallest(flat, int(round(sparsity * flat.size)), xp)
    out, start = [], 0
    for w in weights:
        out.append(keep[start:start + w.size].reshape(w.shape))
        start += w.size
    return out


def layerwise_magnitude_masks(weights, sparsity: float, masks=None) -> list:
    """Masks (True = kept) pruning the ``round(sparsity · n_l)`` smallest |w| of each layer on its own.

    Each layer gets its own threshold and the same fraction of zeros. ``masks`` as in
    :func:`global_magnitude_masks`.
    """
    sparsity = _check_sparsity("layerwise_magnitude_masks", sparsity)
    weights = [w.array if isinstance(w, Tensor) else w for w in weights]
    from minidl.backend import xp_of
    out = []
    for i, w in enumerate(weights):
        score = _scores([w], None if masks is None else [masks[i]])[0]
        keep = _smallest(score.ravel(), int(round(sparsity * w.size)), xp_of(w))
        out.append(keep.reshape(w.shape))
    return out


def sparsity_schedule(final: float, rounds: int, initial: float = 0.0, kind: str = "cubic") -> list:
    """The target sparsity after each of ``rounds`` prune-then-fine-tune rounds, ending at ``final``.

    ``kind="cubic"`` (Zhu and Gupta, 2017): s_r = s_f + (s_i − s_f)·(1 − r/R)³, which prunes
    much early, while many redundant weights remain, and little at the end. ``"linear"``: equal steps.
    """
    final = _check_sparsity("sparsity_schedule", final)
    initial = _check_sparsity("sparsity_schedule", initial)
    if isinstance(rounds, bool) or not isinstance(rounds, (int, np.integer)) or rounds < 1:
        raise ValueError(f"sparsity_schedule: rounds must be a positive integer, got {rounds!r}")
    if kind not in ("cubic", "linear"):
        raise ValueError(f"sparsity_schedule: kind must be 'cubic' or 'linear', got {kind!r}")
    power = 3 if kind == "cubic" else 1
    return [final + (initial - final) * (1 - r / rounds) ** power for r in range(1, rounds + 1)]


class Pruning:
    """Pruning masks over some weights of ``model``; see the module docstring.

    Args:
        model: a Module.
        names: the parameter names to prune (as in ``model.named_parameters()``); default every
            parameter with two or more dimensions (Linear weights, conv kernels), not biases or
            norm scales, which are few and matter much.

    ``masks`` maps each name to its boolean mask (True = kept) on the weight's device: the
    array of the buffer ``<name>_mask`` that the constructor registers on the weight's layer,
    all True (replacing the mask of an earlier Pruning of the same weight, which then no
    longer acts on the model). Loading a state dict fills them (a resumed run's masks).
    """

    MASK_SUFFIX = "_mask"

    def __init__(self, model, names=None):
        params = dict(model.named_parameters())
        if names is None:
            names = [n for n, p in params.items() if p.ndim >= 2]
        names = list(names)
        missing = [n for n in names if n not in params]
        if missing:
            raise KeyError(f"Pruning: the model has no parameter {missing[0]!r}; it has {sorted(params)}")
        if not names:
            raise ValueError("Pruning: nothing to prune (the model has no parameter with 2 or more dimensions; "
                             "pass names=[...])")
        self.model = model
        self.params = {n: params[n] for n in names}
        modules = dict(model.named_modules())
        self._buffers = {}
        for n, p in self.params.items():
            owner, _, leaf = n.rpartition(".")
            module, key = modules[owner], leaf + self.MASK_SUFFIX
            module.register_buffer(key, Tensor(p.xp.ones(p.shape, dtype=bool)))  # afresh: nothing pruned yet
            self._buffers[n] = module._buffers[key]
        self._handles = []

    @classmethod
    def for_state_dict(cls, model, state) -> "Pruning | None":
        """A Pruning over the weights of ``model`` that ``state`` holds masks for (``<name>_mask``), or None.

        Call it before ``model.load_state_dict(state)``: it registers the mask buffers
        that the load fills. Names of ``state`` that are not parameters of ``model`` are ignored.
        """
        params = dict(model.named_parameters())
        names = [k[:-len(cls.MASK_SUFFIX)] for k in state if isinstance(k, str) and k.endswith(cls.MASK_SUFFIX)
                 and k[:-len(cls.MASK_SUFFIX)] in params]
        return cls(model, names) if names else None

    @property
    def masks(self) -> dict:
        """Name → the boolean mask array (True = kept), read from the model's ``<name>_mask`` buffers."""
        return {n: b.array for n, b in self._buffers.items()}

    # ------------------------------------------------------------ pruning
    def prune(self, sparsity: float, scope: str = "global") -> "Pruning":
        """Zero the smallest weights so that a fraction ``sparsity`` of all pruned weights is zero.

        ``scope``: "global" (one threshold for all) or "layer" (the fraction in every layer).
        Weights pruned before stay pruned. Returns self.
        """
        if scope not in ("global", "layer"):
            raise ValueError(f"Pruning.prune: scope must be 'global' or 'layer', got {scope!r}")
        names = list(self.params)
        weights = [self.params[n].array for n in names]
        current = [self.masks[n] for n in names]
        fn = global_magnitude_masks if scope == "global" else layerwise_magnitude_masks
        for n, mask in zip(names, fn(weights, sparsity, masks=current)):
            self._buffers[n].array[...] = mask
        self.apply_()
        return self

    def apply_(self) -> None:
        """Set every pruned weight to zero, in place."""
        for n, p in self.params.items():
            p.array *= self.masks[n].astype(p.dtype)

    def mask_grads_(self) -> None:
        """Zero the gradients of the pruned weights (new gradient Tensors; the old buffers may be shared)."""
        for n, p in self.params.items():
            if p.grad is not None:
                p.grad = Tensor(p.grad.array * self.masks[n].astype(p.grad.dtype))

    def attach(self, optimizer):
        """Make every ``optimizer.step()`` mask the gradients before and the weights after the update.

        Works under the Trainer (and its GradScaler) since they call ``optimizer.step()``: the
        masks ride on the optimizer's step hooks (``register_step_pre_hook``). Returns a handle
        whose ``remove()`` takes them off.
        """
        if not hasattr(optimizer, "register_step_pre_hook"):
            raise TypeError(f"Pruning.attach: expected a minidl optimizer (with step hooks), "
                            f"got {type(optimizer).__name__}")
        handle = _StepHandle(optimizer.register_step_pre_hook(lambda opt, args, kwargs: self.mask_grads_()),
                             optimizer.register_step_post_hook(lambda opt, args, kwargs: self.apply_()))
        self._handles.append(handle)
        return handle

    # ------------------------------------------------------------ reports
    def report(self) -> list[dict]:
        """One row per pruned weight: name, shape, size, zeros, sparsity; and a last row "total"."""
        rows, zeros, size = [], 0, 0
        for n, p in self.params.items():
            z = int((p.array == 0).sum())
            rows.append({"name": n, "shape": tuple(p.shape), "size": int(p.array.size), "zeros": z,
                         "sparsity": z / max(int(p.array.size), 1)})
            zeros, size = zeros + z, size + int(p.array.size)
        rows.append({"name": "total", "shape": (), "size": size, "zeros": zeros, "sparsity": zeros / max(size, 1)})
        return rows

    def sparsity(self) -> float:
        """The fraction of the pruned weights that is zero now."""
        return self.report()[-1]["sparsity"]

    def format_report(self) -> str:
        """:meth:`report` as a text table."""
        rows = self.report()
        width = max(len(r["name"]) for r in rows)
        lines = [f"{'weight':<{width}}  {'shape':>14}  {'size':>8}  {'zeros':>8}  sparsity"]
        for r in rows:
            shape = "x".join(map(str, r["shape"])) if r["shape"] else ""
            lines.append(f"{r['name']:<{width}}  {shape:>14}  {r['size']:>8}  {r['zeros']:>8}  {r['sparsity']:8.1%}")
        return "\n".join(lines)


class _StepHandle:
    """What :meth:`Pruning.attach` returns: ``remove()`` takes its two step hooks off."""

    def __init__(self, pre, post):
        self.pre, self.post = pre, post

    def remove(self) -> None:
        self.pre.remove()
        self.post.remove()
