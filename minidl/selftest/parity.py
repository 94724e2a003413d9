"""The device against the CPU: every op case, every optimizer, a Trainer run with a resume, mixed precision.

The same comparisons run in CI on the CuPy stand-in (tests/test_device_parity*.py
call the functions of this module), so a GPU run checks exactly what every CI
run checks, with the device's own arithmetic:

    values, first and second derivatives of every op case (minidl.op_cases)
        along fixed random directions, against the CPU's;
    every optimizer's update through its fused kernel, four steps, against the CPU's;
    Trainer.fit on the device, stopped, saved, loaded into a fresh Trainer and
        finished: bit for bit the run that never stopped (float32, and float16
        with a GradScaler);
    bfloat16 autocast on the device, against the float32 run.
"""
from __future__ import annotations

import functools
import os
import tempfile

import numpy as np

# Cases that draw random numbers: each device has its own generator, so the two runs differ by design.
RANDOM_CASES = ("dropout",)

# Each optimizer with hyperparameters that make every term of its update matter.
OPTIMIZERS = {
    "SGD": dict(lr=0.1, weight_decay=1e-2), "SGDM": dict(lr=0.1, beta=0.9), "NAG": dict(lr=0.1, momentum=0.9),
    "AdaGrad": dict(lr=0.1), "RMSProp": dict(lr=0.01), "AdaDelta": dict(lr=1.0), "Adam": dict(lr=0.01),
    "AdamW": dict(lr=0.01, weight_decay=0.1), "AMSGrad": dict(lr=0.01), "NAdam": dict(lr=0.01),
    "RAdam": dict(lr=0.01), "LAMB": dict(lr=0.01), "LARS": dict(lr=0.1), "NovoGrad": dict(lr=0.01),
    "Ranger": dict(lr=0.01), "RangerLARS": dict(lr=0.01), "AdaHessian": dict(lr=0.1),
    "SwitchOptimizer": dict(lr=0.01, switch_at=2),
}
# Their trust ratio takes a norm, or (SwitchOptimizer's Adam phase) SWATS's dot products: plain CuPy calls.
UNFUSED = ("LAMB", "LARS", "RangerLARS", "NovoGrad", "SwitchOptimizer")


# ---------------------------------------------------------------- op cases
def on_device(value, device):
    """A Tensor or NumPy array copied to ``device`` (a Tensor keeps requires_grad); anything else as is."""
    import minidl as mdl
    from minidl import backend
    if isinstance(value, mdl.Tensor):
        return mdl.tensor(value.array, requires_grad=value.requires_grad, device=device)
    if isinstance(value, np.ndarray):
        return backend.to_device(value, device)
    return value


def case_on(fn, device):
    """``fn`` with the arrays and Tensors it closes over (targets, masks, weights) moved to ``device``."""
    import minidl as mdl
    if isinstance(fn, functools.partial):
        return functools.partial(case_on(fn.func, device), *[on_device(a, device) for a in fn.args],
                                 **{k: on_device(v, device) for k, v in fn.keywords.items()})
    for cell in getattr(fn, "__closure__", None) or ():
        value = cell.cell_contents
        if isinstance(value, (mdl.Tensor, np.ndarray)):
            cell.cell_contents = on_device(value, device)
        elif callable(value) and getattr(value, "__module__", None) == "minidl.op_cases":
            case_on(value, device)
    if getattr(fn, "__defaults__", None):
        fn.__defaults__ = tuple(on_device(v, device) for v in fn.__defaults__)
    if getattr(fn, "__kwdefaults__", None):
        fn.__kwdefaults__ = {k: on_device(v, device) for k, v in fn.__kwdefaults__.items()}
    return fn


def run_case(fn, inputs, seed=1, devices: set | None = None):
    """Outputs, and the first and second derivatives along fixed random directions, as NumPy arrays.

    ``devices``, when given, receives the device of every output and derivative.
    """
    import minidl as mdl
    outputs = fn(*inputs)
    outputs = [outputs] if isinstance(outputs, mdl.Tensor) else list(outputs)
    wrt = [x for x in inputs if isinstance(x, mdl.Tensor) and x.requires_grad]
    rng = np.random.default_rng(seed)
    vs = [mdl.tensor(rng.standard_normal(o.shape).astype(o.dtype), device=o.device) for o in outputs]
    differentiable = [(o, v) for o, v in zip(outputs, vs) if o.requires_grad]
    values = [o.numpy() for o in outputs]
    if not differentiable:
        return values, [], []
    grads = mdl.grad([o for o, _ in differentiable], wrt, grad_outputs=[v for _, v in differentiable],
                     create_graph=True, allow_unused=True)
    live = [g for g in grads if g is not None and g.requires_grad]
    second = []
    if live:
        us = [mdl.tensor(rng.standard_normal(g.shape).astype(g.dtype), device=g.device) for g in live]
        second = mdl.grad(live, wrt, grad_outputs=us, allow_unused=True)
    if devices is not None:
        devices.update(t.device for t in [*outputs, *grads, *second] if t is not None)
    as_numpy = lambda gs: [None if g is None else g.numpy() for g in gs]  # noqa: E731
    return values, as_numpy(grads), as_numpy(second)


def compare_case(index: int, device: str = "cuda", rtol: float = 1e-9, atol: float = 1e-12) -> list[str]:
    """What differs between the CPU and ``device`` for op case ``index``: [] when they agree.

    Fresh cases for each device: a case may keep state (a fixed mask, a closed-over array).
    The cases are float64, so the tolerance is tight; random cases compare shapes and dtypes only.
    """
    from minidl.op_cases import cases
    name, fn, inputs = cases()[index]
    cpu = run_case(fn, inputs)
    _, fn, inputs = cases()[index]
    seen = set()
    other = run_case(case_on(fn, device), [on_device(x, device) for x in inputs], devices=seen)
    from minidl import backend
    problems = [f"{name}: a result landed on {d}, not on {device}" for d in sorted(seen)
                if backend.parse_device(d) != backend.parse_device(device)]
    for part, (a, b) in zip(("values", "gradients", "second derivatives"), zip(cpu, other)):
        if len(a) != len(b):
            problems.append(f"{name}: {part} differ in number ({len(a)} on the CPU, {len(b)} on {device})")
            continue
        for x, y in zip(a, b):
            if (x is None) != (y is None):
                problems.append(f"{name}: {part}: None on one device only")
            elif x is None:
                continue
            elif x.shape != y.shape or x.dtype != y.dtype:
                problems.append(f"{name}: {part}: {x.shape} {x.dtype} on the CPU, {y.shape} {y.dtype} on {device}")
            elif not any(r in name for r in RANDOM_CASES) and not np.allclose(y, x, rtol=rtol, atol=atol):
                worst = float(np.max(np.abs(y - x) / (atol + rtol * np.abs(x))))
                problems.append(f"{name}: {part} differ ({worst:.3g}x the tolerance)")
    return problems


# ---------------------------------------------------------------- optimizers
def optimizer_steps(name: str, device: str, steps: int = 4) -> list[np.ndarray]:
    """The parameters after ``steps`` updates of optimizer ``name`` on ``device``, from fixed data."""
    import minidl as mdl
    from minidl import optim
    rng = np.random.default_rng(0)
    params = [mdl.tensor(rng.standard_normal(shape).astype(np.float32), requires_grad=True, device=device)
              for shape in ((5, 3), (3,), (2, 2, 2))]
    opt = getattr(optim, name)(params, **OPTIMIZERS[name])
    rng = np.random.default_rng(1)
    for _ in range(steps):
        if name == "AdaHessian":  # needs a graph to take Hessian-vector products through
            opt.zero_grad()
            loss = sum(((p * p * p).sum() for p in params), mdl.tensor(np.float32(0), device=device))
            loss.backward(create_graph=True)
        else:
            for p in params:
                p.grad = mdl.tensor(rng.standard_normal(p.shape).astype(np.float32), device=device)
        opt.step()
    return [p.numpy() for p in params]


def compare_optimizer(name: str, device: str = "cuda") -> list[str]:
    """What differs between the CPU's and the fused device update of ``name``; [] when they agree.

    float32 updates through a fused kernel round differently from NumPy's line by line: rtol 2e-5.
    """
    from minidl.optim import kernels
    kernels._kernels.clear()
    cpu, other = optimizer_steps(name, "cpu"), optimizer_steps(name, device)
    problems = [f"{name}: parameter {i} differs by up to {float(np.max(np.abs(b - a))):.3g}"
                for i, (a, b) in enumerate(zip(cpu, other)) if not np.allclose(b, a, rtol=2e-5, atol=2e-6)]
    fused = [entry for entry in kernels._kernels.values() if entry is not False]
    if name not in UNFUSED and not (fused and all(entry[3] for entry in fused)):
        problems.append(f"{name}: no fused kernel ran")
    return problems


# ---------------------------------------------------------------- a training run and its resume
def _trainer(device, amp=None, seed=0):
    import minidl as mdl
    from minidl import nn, optim
    from minidl.data import DataLoader
    from minidl.train import Trainer
    rng = np.random.default_rng(0)
    x = rng.standard_normal((96, 12)).astype(np.float32)
    y = x[:, :4].argmax(axis=1).astype(np.int64)
    mdl.manual_seed(seed)
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 4))
    loader = DataLoader((x, y), batch_size=16, shuffle=True, seed=0)
    return Trainer(model, optim.Adam(model.parameters(), lr=1e-2, weight_decay=1e-3), loader,
                   device=device, progress=False, max_grad_norm=1.0,
                   log_every=4, seed=seed, amp=amp)


def _weights(trainer):
    import minidl as mdl
    from minidl import backend
    return {k: backend.to_numpy(v.array if isinstance(v, mdl.Tensor) else v)
            for k, v in trainer.model.state_dict().items()}


def compare_resume(device: str = "cuda", amp: str | None = None) -> list[str]:
    """A run stopped after 7 steps, saved, loaded into a fresh Trainer and finished equals the run
    that never stopped, bit for bit (weights, moments, GPU dropout masks, loader order, the scale)."""
    straight = _trainer(device, amp)
    straight.fit(epochs=2)
    first = _trainer(device, amp)
    first.fit(epochs=2, max_steps=7)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "run.ckpt")
        first.save_checkpoint(path)
        resumed = _trainer(device, amp, seed=1)
        resumed.load_checkpoint(path)
    resumed.fit(epochs=2)
    label = f"resume ({amp or 'float32'})"
    problems = [f"{label}: {k} differs from the run that never stopped"
                for k, v in _weights(straight).items() if not np.array_equal(_weights(resumed)[k], v)]
    if amp == "fp16" and resumed.scaler.state_dict() != straight.scaler.state_dict():
        problems.append(f"{label}: the GradScaler's state differs")
    return problems


def compare_bf16(device: str = "cuda") -> list[str]:
    """bfloat16 autocast on ``device`` trains as float32 does: training losses within 0.05 nats.

    CuPy has no bfloat16 arrays: there minidl must refuse ``amp="bf16"`` with a TypeError that
    says so and names float16 (the refusal is what is checked).
    """
    from minidl import backend
    if backend.parse_device(device)[0] == "cuda" and not hasattr(backend.cupy_module(), "bfloat16"):
        try:
            _trainer(device, "bf16").fit(epochs=1)
        except TypeError as exc:
            return [] if "bfloat16" in str(exc) and "float16" in str(exc) else [f"bfloat16: unclear refusal: {exc}"]
        return ["bfloat16: CuPy has no bfloat16, yet amp='bf16' ran without a word"]
    bf16, fp32 = _trainer(device, "bf16"), _trainer(device)
    bf16.fit(epochs=3)
    fp32.fit(epochs=3)
    a, b = bf16.history[-1]["train_loss"], fp32.history[-1]["train_loss"]
    return [] if abs(a - b) <= 0.05 else [f"bfloat16: training loss {a:.4f}, float32's {b:.4f}"]


# ---------------------------------------------------------------- the stage
def run(stage) -> dict:
    """Every comparison above on ``stage.device``, as far as the stage's time allows.

    The training runs and the optimizers first, the op cases last: on a GPU's first run each
    op case compiles CuPy kernels of its own, and when time runs out it is the op cases that
    are cut short (``pytest -m cuda`` in benchmarks/gpu_run.sh runs them all again).
    """
    from minidl.op_cases import cases
    device, failures, counts, complete = stage.device, [], {}, True
    runs = (("resume float32", compare_resume, (None,)), ("resume float16", compare_resume, ("fp16",)),
            ("bfloat16", compare_bf16, ()))
    names = [c[0] for c in cases()]
    groups = (("training runs", [(label, check, (device, *extra)) for label, check, extra in runs]),
              ("optimizers", [(name, compare_optimizer, (name, device)) for name in OPTIMIZERS]),
              ("op cases", [(name, compare_case, (index, device)) for index, name in enumerate(names)]))
    for group, checks in groups:
        done = 0
        for label, check, args in checks:
            if stage.expired():
                break
            failures += _guard(label, check, *args)
            done += 1
        counts[group] = f"{done}/{len(checks)}"
        complete = complete and done == len(checks)
    return {"counts": counts, "failures": failures, "partial": not complete,
            "summary": f"{counts['op cases']} op cases, {counts['optimizers']} optimizers, "
                       f"{counts['training runs']} training runs on {device}"
                       + (f", {len(failures)} differ" if failures else ", all as on the CPU")}


def _guard(label, check, *args) -> list[str]:
    """The problems ``check`` reports, or the exception it raised as one (a raising check is a failure)."""
    try:
        return check(*args)
    except Exception as exc:  # noqa: BLE001 - one broken op must not hide the others
        return [f"{label}: {type(exc).__name__}: {exc}"[:500]]
