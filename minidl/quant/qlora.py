"""QLoRA: low-rank adapters trained on top of a frozen 4-bit base (Dettmers et al. 2023).

    model = quant.apply_qlora(pretrained, rank=4, alpha=8, kind="nf4", double_quant=True)
    optimizer = optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    ...train...                             # only lora_A, lora_B train; the 4-bit codes never change

Each chosen ``nn.Linear`` becomes a :class:`~minidl.nn.lora.LoRALinear`
whose base is a :class:`~minidl.quant.int4.Linear4bit`:

    y = x Ŵᵀ + b + (α/r) · x Aᵀ Bᵀ,     Ŵ = dequantize(4-bit codes), rebuilt in each forward

The base is stored in about 4.1 bits a weight instead of 32; the gradient
reaches the adapters (dA, dB) and, through Ŵ, the input (dx = g Ŵ + (α/r) g B A),
so stacked QLoRA layers train together. Nothing of Ŵ is kept between steps.
"""
from __future__ import annotations

from minidl.nn.lora import LoRALinear, apply_lora
from minidl.quant.int4 import Linear4bit

__all__ = ["apply_qlora"]


def apply_qlora(model, rank: int = 4, alpha: float | None = None, targets=None, kind: str = "nf4",
                block_size: int = 64, double_quant: bool = True):
    """Wrap Linear layers in LoRA (:func:`minidl.nn.lora.apply_lora`, in place: every other parameter frozen)
    and store each wrapped layer's frozen weight in 4 bits (:class:`Linear4bit`); returns the model."""
    model = apply_lora(model, rank, alpha, targets, freeze=True)
    for _, layer in model.named_modules():
        if isinstance(layer, LoRALinear) and not isinstance(layer.base, Linear4bit):
            layer.base = Linear4bit.from_linear(layer.base, kind, block_size, double_quant).requires_grad_(False)
    return model
