"""What a model costs to serve: its weights, its activations for one sample, and its latency.

    report = inference_report(model, x[:1])
    print(format_inference_report(report))
    # weights: 9,610 parameters, 37.5 KiB (float32) | activations at batch 1: 1.2 KiB in all, 512 B the largest
    # latency at batch 1: 0.041 ms median, 0.052 ms at the 90th percentile (200 runs)

The chapter asks that "the constraints of the serving hardware, such as memory
size, should be included in the design process" (§4.5.2); the systems text
sizes a model for deployment by its weights, the activations of one request
and its latency. Measured here with the model's own forward hooks, in eval
mode under ``no_grad`` (nothing kept for a backward pass):

- **weights**: every parameter and buffer (running statistics included), in
  bytes of their dtype;
- **activations at batch 1**: the output of every leaf module for one sample;
  ``activation_bytes`` is their sum (what a runtime that keeps every output
  would hold), ``largest_activation_bytes`` the largest one, and
  ``peak_pair_bytes`` the largest input + output of one leaf (what a runtime
  that frees each output as soon as the next layer has read it must hold at once);
- **latency**: the wall-clock time of one forward pass at batch 1, after
  ``warmup`` passes, over ``repeats`` passes: median and 90th percentile.
"""
from __future__ import annotations

import time

import numpy as np

from minidl import backend
from minidl.autograd import no_grad
from minidl.tensor import Tensor

__all__ = ["format_inference_report", "inference_report"]


def _nbytes(t) -> int:
    data = t.array if isinstance(t, Tensor) else t
    return int(data.size * data.dtype.itemsize)


def inference_report(model, sample, repeats: int = 50, warmup: int = 3) -> dict:
    """Weights, activations and latency of ``model`` on one sample, given with its batch axis (``x[:1]``).

    Returns ``parameters``, ``weight_bytes``, ``activation_bytes``, ``largest_activation_bytes``,
    ``peak_pair_bytes``, ``layers``, ``latency_ms``, ``latency_p90_ms`` and ``repeats`` (module docstring).
    """
    data = sample.array if isinstance(sample, Tensor) else np.asarray(backend.to_numpy(sample))
    if data.ndim == 0 or data.shape[0] != 1:
        raise ValueError(f"inference_report: expected one sample with its batch axis (x[:1]), got shape {data.shape}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"inference_report: repeats must be a whole number >= 1, got {repeats!r}")
    parameters = list(model.parameters())
    device = parameters[0].device if parameters else "cpu"
    x = Tensor(backend.to_device(data, device))
    weight_bytes = sum(_nbytes(p) for p in parameters) + sum(_nbytes(b) for _, b in model.named_buffers())
    leaves = [m for name, m in model.named_modules() if name and not any(True for _ in m.children())] or [model]
    outputs, pairs = [], []

    def hook(module, inputs, output):
        size = _nbytes(output) if isinstance(output, Tensor) else 0
        outputs.append(size)
        pairs.append(size + sum(_nbytes(i) for i in inputs if isinstance(i, Tensor)))

    handles = [m.register_forward_hook(hook) for m in leaves]
    training = model.training
    model.eval()
    try:
        with no_grad():
            model(x)
            for h in handles:
                h.remove()
            handles = []
            for _ in range(warmup):
                model(x)
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                model(x)
                if device != "cpu":  # a GPU returns before its kernels finish: wait for them
                    from minidl import cuda
                    cuda.synchronize(device)
                times.append(time.perf_counter() - start)
    finally:
        for h in handles:
            h.remove()
        model.train(training)
    times = np.array(times) * 1e3
    return {"parameters": sum(p.numel() for p in parameters), "weight_bytes": weight_bytes,
            "activation_bytes": int(sum(outputs)), "largest_activation_bytes": int(max(outputs, default=0)),
            "peak_pair_bytes": int(max(pairs, default=0)), "layers": len(leaves),
            "latency_ms": float(np.median(times)), "latency_p90_ms": float(np.percentile(times, 90)),
            "repeats": repeats}


def format_inference_report(report: dict) -> str:
    """The report of :func:`inference_report` in three lines."""
    from minidl.memory import format_bytes
    return (f"weights: {report['parameters']:,} parameters, {format_bytes(report['weight_bytes'])}\n"
            f"activations at batch 1: {format_bytes(report['activation_bytes'])} over {report['layers']} layers, "
            f"{format_bytes(report['largest_activation_bytes'])} the largest, "
            f"{format_bytes(report['peak_pair_bytes'])} for one layer's input and output\n"
            f"latency at batch 1: {report['latency_ms']:.3g} ms median, {report['latency_p90_ms']:.3g} ms at the "
            f"90th percentile ({report['repeats']} runs)")
