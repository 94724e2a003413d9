"""Low-rank adaptation (LoRA): fine-tune a frozen layer through a small trainable product B A.

    model = nn.lora.apply_lora(pretrained, rank=4, alpha=8)   # every Linear wrapped, everything else frozen
    optimizer = optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    ...train...
    model = nn.lora.merge_lora(model)                         # plain Linear layers again, W' = W + (α/r) B A

Hu et al. (2021). A pretrained weight W (out × in) stays frozen; the layer
learns an update of rank r through two small matrices:

    y = x Wᵀ + b + (α/r) · x Aᵀ Bᵀ          A: (r, in),  B: (out, r)

A starts random (PyTorch's Linear initialization, as the PEFT library) and
B at zero, so the wrapped model computes exactly what the pretrained one did
until B learns. The update holds r·(in + out) numbers instead of in·out, and
the optimizer keeps state only for those: with Adam, two more copies of a few
percent of the weights instead of two copies of all of them. α/r scales the
update so that changing r does not change how far a step moves it (α is
usually set once, e.g. to 2r). After training, the product is folded into
the weight, W' = W + (α/r) B A, and inference costs what the original did.
"""
from __future__ import annotations

import math

import minidl.functional as F
from minidl.autograd import no_grad
from minidl.nn import init
from minidl.nn.layers import Linear, empty_parameter
from minidl.nn.module import Module
from minidl.nn.utils import replace_module

__all__ = ["LoRALinear", "apply_lora", "merge_lora"]


class LoRALinear(Module):
    """A frozen ``Linear`` plus a trainable rank-``rank`` update: y = x Wᵀ + b + (α/r) x Aᵀ Bᵀ.

    ``base``: the pretrained Linear (kept, frozen). ``alpha`` defaults to
    ``rank`` (a scaling of 1). ``lora_A`` (r, in) is drawn as a Linear's
    weight is; ``lora_B`` (out, r) starts at zero.
    """

    def __init__(self, base: Linear, rank: int = 4, alpha: float | None = None):
        super().__init__()
        if not isinstance(base, Linear):
            raise TypeError(f"LoRALinear wraps an nn.Linear, got {type(base).__name__}")
        out_features, in_features = base.weight.shape
        if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= min(in_features, out_features):
            raise ValueError(f"LoRALinear: rank must be an integer in [1, min(in_features, out_features)] = "
                             f"[1, {min(in_features, out_features)}] for a Linear({in_features}, {out_features}); "
                             f"got {rank!r} (a rank that large is no cheaper than the layer itself)")
        alpha = float(rank if alpha is None else alpha)
        if not alpha > 0:
            raise ValueError(f"LoRALinear: alpha must be positive, got {alpha!r}")
        self.base = base
        base.requires_grad_(False)
        self.rank, self.alpha, self.scaling = rank, alpha, alpha / rank
        device, dtype = base.weight.device, base.weight.dtype
        self.lora_A = empty_parameter((rank, in_features), device, dtype)
        self.lora_B = empty_parameter((out_features, rank), device, dtype)
        init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        init.zeros_(self.lora_B)

    def forward(self, x):
        return self.base(x) + F.linear(F.linear(x, self.lora_A), self.lora_B) * self.scaling

    def merged(self) -> Linear:
        """A plain Linear with W' = W + (α/r) B A and the same bias (a new layer; this one is unchanged)."""
        layer = Linear(self.base.in_features, self.base.out_features, bias=self.base.bias is not None)
        with no_grad():
            weight = getattr(self.base, "dequantized_weight", lambda: self.base.weight.array)()  # a 4-bit base too
            layer.weight.array[...] = weight + self.scaling * (self.lora_B.array @ self.lora_A.array)
            if self.base.bias is not None:
                layer.bias.array[...] = self.base.bias.array
        return layer

    def extra_repr(self):
        return f"rank={self.rank}, alpha={self.alpha:g}"


def _lora_layers(model):
    return [(name, m) for name, m in model.named_modules() if isinstance(m, LoRALinear)]


def _set(model, name: str, new):
    """Replace the submodule at dotted ``name`` (the model itself for "")."""
    if name == "":
        return new
    replace_module(model, name, new)
    return model


def apply_lora(model, rank: int = 4, alpha: float | None = None, targets=None, freeze: bool = True):
    """Wrap Linear layers of ``model`` in :class:`LoRALinear`, in place; returns the model.

    ``targets``: ``None`` for every Linear, or names (as ``named_modules()``
    gives them; a name matches itself and everything under it). With
    ``freeze=True`` every other parameter is frozen too, so only the LoRA
    matrices train; unfreeze a new head afterwards (``nn.utils.unfreeze``) to
    train it fully. Every rank is checked before any layer is changed.
    """
    if alpha is not None and not (isinstance(alpha, (int, float)) and alpha > 0):
        raise ValueError(f"apply_lora: alpha must be a positive number, got {alpha!r}")
    chosen = []
    for name, module in model.named_modules():
        if type(module) is not Linear:
            continue
        if targets is None or any(name == t or name.startswith(t + ".") for t in targets):
            chosen.append((name, module))
    if not chosen:
        raise ValueError(f"apply_lora: no nn.Linear layer matched targets={targets!r}; the model's Linear layers "
                         f"are {[n for n, m in model.named_modules() if type(m) is Linear]}")
    too_large = [(n, m.in_features, m.out_features) for n, m in chosen
                 if isinstance(rank, int) and rank > min(m.in_features, m.out_features)]
    if too_large:
        raise ValueError(f"apply_lora: rank={rank} is larger than min(in_features, out_features) of "
                         + ", ".join(f"{n!r} ({i} -> {o})" for n, i, o in too_large)
                         + "; use a smaller rank or leave those layers out with targets=")
    wrapped = [(name, LoRALinear(module, rank, alpha)) for name, module in chosen]   # validates all first
    if freeze:
        model.requires_grad_(False)
    for name, layer in wrapped:
        layer.lora_A.requires_grad_(True)
        layer.lora_B.requires_grad_(True)
        model = _set(model, name, layer)
    return model


def merge_lora(model):
    """Fold every :class:`LoRALinear` of ``model`` into a plain Linear (W + (α/r) B A), in place; returns it."""
    layers = _lora_layers(model)
    if not layers:
        raise ValueError("merge_lora: the model has no LoRALinear layer (wrap layers with apply_lora first)")
    for name, layer in layers:
        model = _set(model, name, layer.merged())
    return model
