"""Basic layers: Linear, Flatten, Unflatten, activations as modules, Dropout, Embedding, Residual.

Constructor signatures, weight layouts and default initializations are
PyTorch's, so code and state dicts carry over. Every parameter is float32
unless ``dtype`` is given; ``device`` puts it on a GPU from the start.
"""
from __future__ import annotations

import math

import numpy as np

import minidl.functional as F
from minidl import backend
from minidl.nn import init
from minidl.nn.module import Module, Parameter
from minidl.tensor import Tensor


def empty_parameter(shape, device=None, dtype=None) -> Parameter:
    """An uninitialized (zero-filled) float32 Parameter of ``shape``; layers then initialize it."""
    xp = backend.xp_for(device or "cpu")
    return Parameter(xp.zeros(shape, dtype=np.dtype(dtype or np.float32)))


def check_dtype(layer: str, dtype) -> None:
    if dtype is not None and np.dtype(dtype).kind != "f":
        raise TypeError(f"{layer}: parameters must be floating point, got dtype={dtype}")


def fan_in_uniform_(param, fan_in: int) -> None:
    """PyTorch's default for Linear/Conv/RNN parameters: U(−1/√fan_in, 1/√fan_in).

    For a weight this is exactly kaiming_uniform_(a=√5): gain √(2/(1+5)) = 1/√3,
    bound = √3 · gain / √fan_in = 1/√fan_in.
    """
    bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
    init.uniform_(param, -bound, bound)


class Linear(Module):
    """y = x Wᵀ + b, weight (out_features, in_features), bias (out_features,).

    Default initialization (PyTorch's): weight by kaiming_uniform_(a=√5), i.e.
    U(−1/√in_features, 1/√in_features); bias from the same U(−1/√in, 1/√in).
    For ReLU networks call ``nn.init.kaiming_normal_(layer.weight, nonlinearity='relu')``.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None):
        super().__init__()
        if in_features <= 0 or out_features <= 0:
            raise ValueError(f"Linear: in_features and out_features must be positive, "
                             f"got {in_features}, {out_features}")
        check_dtype("Linear", dtype)
        self.in_features, self.out_features = in_features, out_features
        self.weight = empty_parameter((out_features, in_features), device, dtype)
        if bias:
            self.bias = empty_parameter((out_features,), device, dtype)
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in_uniform_(self.bias, self.in_features)

    def forward(self, x):
        if x.shape[-1] != self.in_features:
            raise ValueError(f"Linear({self.in_features}, {self.out_features}): input of shape {x.shape} has "
                             f"{x.shape[-1]} features in its last axis, expected {self.in_features}")
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Flatten(Module):
    """Collapse axes start_dim..end_dim into one: (N, C, H, W) → (N, C·H·W) by default."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x):
        start, end = self.start_dim % x.ndim, self.end_dim % x.ndim
        if start > end:
            raise ValueError(f"Flatten: start_dim {self.start_dim} comes after end_dim {self.end_dim} "
                             f"for an input of shape {x.shape}")
        shape = x.shape[:start] + (-1,) + x.shape[end + 1:]
        if 0 in x.shape:
            shape = x.shape[:start] + (int(np.prod(x.shape[start:end + 1])),) + x.shape[end + 1:]
        return F.reshape(x, shape)

    def extra_repr(self):
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Unflatten(Module):
    """Split dim ``dim`` into ``unflattened_size``: (N, 12) → (N, 3, 4) with ``Unflatten(1, (3, 4))``.

    The inverse of Flatten; one size may be -1 (the rest).
    """

    def __init__(self, dim: int, unflattened_size):
        super().__init__()
        self.dim, self.unflattened_size = dim, tuple(unflattened_size)

    def forward(self, x):
        return F.unflatten(x, self.dim, self.unflattened_size)

    def extra_repr(self):
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"


# ---------------------------------------------------------------- activations (no parameters)
class ReLU(Module):
    """y = max(x, 0). ``inplace=True`` writes into x as in PyTorch (refused where x needs a gradient)."""

    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = inplace

    def forward(self, x):
        return F.relu(x, self.inplace)

    def extra_repr(self):
        return "inplace=True" if self.inplace else ""


class LeakyReLU(Module):
    """y = x for x > 0, negative_slope · x otherwise."""

    def __init__(self, negative_slope: float = 0.01, inplace: bool = False):
        super().__init__()
        self.negative_slope, self.inplace = negative_slope, inplace

    def forward(self, x):
        return F.leaky_relu(x, self.negative_slope, self.inplace)

    def extra_repr(self):
        return f"negative_slope={self.negative_slope}"


class ELU(Module):
    """y = x for x > 0, α(eˣ − 1) otherwise."""

    def __init__(self, alpha: float = 1.0, inplace: bool = False):
        super().__init__()
        self.alpha, self.inplace = alpha, inplace

    def forward(self, x):
        return F.elu(x, self.alpha, self.inplace)

    def extra_repr(self):
        return f"alpha={self.alpha}"


class GELU(Module):
    """y = x Φ(x), exact (``approximate='none'``) or with the tanh approximation."""

    def __init__(self, approximate: str = "none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x, self.approximate)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"


class Tanh(Module):
    """y = tanh x."""

    def forward(self, x):
        return F.tanh(x)


class Sigmoid(Module):
    """y = 1 / (1 + e⁻ˣ)."""

    def forward(self, x):
        return F.sigmoid(x)


class Softmax(Module):
    """y = softmax(x) along ``dim``; dim=None (PyTorch's default) is the last axis for inputs of
    at most 2 axes, which is PyTorch's implicit choice there, and refused for more."""

    def __init__(self, dim: int | None = None):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return F.softmax(x, self.dim)

    def extra_repr(self):
        return f"dim={self.dim}"


# ---------------------------------------------------------------- regularization and lookup
class Dropout(Module):
    """Training: zero each element with probability p and scale the rest by 1/(1−p) (inverted dropout).

    Evaluation (``model.eval()``): the identity. Draws from the seeded generator.
    """

    def __init__(self, p: float = 0.5, inplace: bool = False):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout: p is a probability in [0, 1], got {p}")
        self.p, self.inplace = p, inplace

    def forward(self, x):
        if self.training and self.p == 1:  # everything dropped (F.dropout refuses p=1: no 1/(1−p) scale)
            return x * 0.0
        return F.dropout(x, self.p, self.training)

    def extra_repr(self):
        return f"p={self.p}, inplace={self.inplace}"


class Embedding(Module):
    """A lookup table: y = weight[idx], weight (num_embeddings, embedding_dim).

    Default initialization (PyTorch's): weight ~ N(0, 1); the row ``padding_idx``
    (if given) starts at zero and receives no gradient.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 device=None, dtype=None):
        super().__init__()
        if num_embeddings <= 0 or embedding_dim <= 0:
            raise ValueError(f"Embedding: sizes must be positive, got {num_embeddings}, {embedding_dim}")
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(f"Embedding: padding_idx {padding_idx} is outside the table of "
                                 f"{num_embeddings} rows")
            padding_idx %= num_embeddings
        check_dtype("Embedding", dtype)
        self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
        self.weight = empty_parameter((num_embeddings, embedding_dim), device, dtype)
        self.reset_parameters()

    def reset_parameters(self):
        init.normal_(self.weight)
        if self.padding_idx is not None:
            self.weight.array[self.padding_idx] = 0

    def forward(self, idx):
        out = F.embedding(idx, self.weight)
        if self.padding_idx is None:
            return out
        # Padding positions output the padding row as a constant, so that row gets no gradient.
        idx = backend.to_device(idx.array if isinstance(idx, Tensor) else np.asarray(idx), self.weight.device)
        keep = (idx != self.padding_idx)[..., None].astype(out.dtype)
        padding_row = self.weight.array[self.padding_idx] * (1 - keep)
        return out * Tensor(keep) + Tensor(padding_row)

    def extra_repr(self):
        text = f"{self.num_embeddings}, {self.embedding_dim}"
        return text if self.padding_idx is None else text + f", padding_idx={self.padding_idx}"


class Residual(Module):
    """y = body(x) + shortcut(x) (shortcut = identity when None): a block with its skip connection.

    The block is one unit: gradient checkpointing and any tool that cuts a
    model into segments must keep body and shortcut together, because the sum
    needs x from the block's input. ``checkpoint_atomic = True`` says so.
    """

    checkpoint_atomic = True

    def __init__(self, body: Module, shortcut: Module | None = None):
        super().__init__()
        if not isinstance(body, Module) or (shortcut is not None and not isinstance(shortcut, Module)):
            raise TypeError("Residual(body, shortcut=None): body and shortcut must be Modules")
        self.body = body
        self.shortcut = shortcut

    def forward(self, x):
        skip = x if self.shortcut is None else self.shortcut(x)
        out = self.body(x)
        if out.shape != skip.shape:
            raise ValueError(f"Residual: body output {out.shape} and shortcut output {skip.shape} differ; "
                             "give a shortcut that maps the input to the body's output shape "
                             "(e.g. a 1x1 convolution or a Linear)")
        return out + skip
