"""The speed stage: minidl against PyTorch on the same GPU, in the same run.

Each figure is the absolute time (on a GPU it holds from machine to machine of
one model) and, where PyTorch with CUDA is importable, the ratio minidl /
PyTorch, the median of alternating rounds timed with CUDA events after a
warm-up (:mod:`minidl.roofline.timing`):

    roofline     measured peaks (float32 and float16 GEMM with CuPy, TF32 with PyTorch),
                 copy bandwidth, every op of ``minidl bench`` placed under them
    mlp          one SGD step of a 784-1024-1024-10 MLP, batch 256
    cnn          one SGD step of a two-convolution CNN on 32×32 images, batch 64
    gpt          one AdamW step of ``minidl gpt train``'s default model (2,048 tokens),
                 and its peak device memory with and without block checkpointing
    optimizer    one fused AdamW update of 100M parameters, against
                 ``torch.optim.AdamW(fused=True)`` and as a fraction of the copy bandwidth
    launch       the time per op of a tiny op (two 1-element tensors added)

``quick`` shrinks every size (a smoke run that tests the code, not the GPU).
"""
from __future__ import annotations

import time

import numpy as np

from minidl.roofline import timing


class _Sides:
    """The functions and timers of the libraries in the comparison (PyTorch only where it has CUDA)."""

    def __init__(self, device, torch_ok):
        self.device, self.torch_ok = device, torch_ok
        self.timers = {"minidl": timing.device_timer(device)}
        if torch_ok:
            self.timers["torch"] = timing.torch_timer(device)

    def compare(self, fns: dict, stage, rounds: int, number: int = 1) -> dict:
        fns = {k: v for k, v in fns.items() if k in self.timers and v is not None}
        times = timing.alternate(fns, {k: self.timers[k] for k in fns}, rounds=rounds, number=number,
                                 deadline=stage.deadline - 5)
        return timing.summary(times)


def _torch_device(device):
    import torch
    return torch.device(device)


# ---------------------------------------------------------------- GEMM peaks
def gemm_peaks(device: str, n: int, torch_ok: bool, rounds: int) -> dict:
    """FLOP/s of an n×n product: float32 and float16 with CuPy; float32, TF32 and float16 with PyTorch."""
    from minidl import backend
    xp = backend.xp_for(device)
    timer = timing.device_timer(device)
    out = {}
    for dtype in ("float32", "float16"):
        a, b = xp.ones((n, n), dtype), xp.ones((n, n), dtype)
        c = xp.empty((n, n), dtype)
        timer(lambda: xp.matmul(a, b, out=c))  # warm-up: cuBLAS's handle and heuristics
        out[f"cupy_{dtype}"] = 2 * n ** 3 / min(timer(lambda: xp.matmul(a, b, out=c)) for _ in range(rounds))
    if torch_ok:
        import torch
        ttimer = timing.torch_timer(device)
        previous = torch.backends.cuda.matmul.allow_tf32
        try:
            for label, dtype, tf32 in (("torch_float32", torch.float32, False), ("torch_tf32", torch.float32, True),
                                       ("torch_float16", torch.float16, False)):
                torch.backends.cuda.matmul.allow_tf32 = tf32
                a = torch.ones((n, n), dtype=dtype, device=_torch_device(device))
                ttimer(lambda: a @ a)
                out[label] = 2 * n ** 3 / min(ttimer(lambda: a @ a) for _ in range(rounds))
        finally:
            torch.backends.cuda.matmul.allow_tf32 = previous
    return out


def roofline(stage, sides) -> dict:
    """``minidl bench``'s suite on the device (its ops beside PyTorch's), the figures' data kept for the results."""
    from minidl.roofline import ceilings as ceilings_module
    from minidl.roofline import suite
    quick = stage.quick
    ceilings = ceilings_module.measure(stage.device, quick=True, gemm_size=256, stream_bytes=1 << 20) if quick \
        else ceilings_module.measure(stage.device)
    frameworks = ("minidl", "torch") if sides.torch_ok else ("minidl",)
    results = suite.run(stage.device, quick=quick, out_dir=None, machine="selftest", frameworks=frameworks,
                        ceilings=ceilings, figures=False, repeat=1 if quick else 3,
                        min_time=0.0 if quick else 0.005, log=None)
    stage.results["roofline"] = results
    n = 256 if quick else 8192
    peaks = gemm_peaks(stage.device, n, sides.torch_ok, 2 if quick else 5)
    key = lambda r: f"{r['op']} {r['size']} {r['phase']}"  # noqa: E731
    torch_ms = {key(r): r["seconds"] * 1e3 for r in results["rows"] if r["framework"] == "torch"}
    ops = {key(r): {"ms": r["seconds"] * 1e3, "torch_ms": torch_ms.get(key(r)), "verdict": r["verdict"],
                    "roofline_fraction": r["roofline_fraction"]}
           for r in results["rows"] if r["framework"] == "minidl"}
    return {"ceilings": results["ceilings"], "gemm_peaks_flops": peaks, "gemm_n": n, "ops": ops,
            "training_step_ms": results["training_step"]["wall_s"] * 1e3}


# ---------------------------------------------------------------- training steps
def mlp(stage, sides) -> dict:
    import minidl as mdl
    import minidl.functional as F
    widths, batch = ((784, 64, 10), 32) if stage.quick else ((784, 1024, 1024, 10), 256)
    rng = np.random.default_rng(0)
    weights = [((rng.standard_normal((o, i)) / np.sqrt(i)).astype(np.float32), np.zeros(o, np.float32))
               for i, o in zip(widths[:-1], widths[1:])]
    x = rng.standard_normal((batch, widths[0])).astype(np.float32)
    y = rng.integers(0, widths[-1], batch)
    params = [mdl.tensor(a, requires_grad=True, device=stage.device) for pair in weights for a in pair]
    xm, ym = mdl.tensor(x, device=stage.device), mdl.tensor(y, device=stage.device)

    def minidl_step():
        h = xm
        for i in range(0, len(params), 2):
            h = F.linear(h, params[i], params[i + 1])
            h = h.relu() if i < len(params) - 2 else h
        F.cross_entropy(h, ym).backward()
        with mdl.no_grad():
            for p in params:
                p -= 0.01 * p.grad
                p.grad = None
    fns = {"minidl": minidl_step, "torch": None}
    if sides.torch_ok:
        import torch
        dev = _torch_device(stage.device)
        tparams = [torch.tensor(a, requires_grad=True, device=dev) for pair in weights for a in pair]
        xt, yt = torch.tensor(x, device=dev), torch.tensor(y, device=dev)

        def torch_step():
            h = xt
            for i in range(0, len(tparams), 2):
                h = torch.nn.functional.linear(h, tparams[i], tparams[i + 1])
                h = torch.relu(h) if i < len(tparams) - 2 else h
            torch.nn.functional.cross_entropy(h, yt).backward()
            with torch.no_grad():
                for p in tparams:
                    p -= 0.01 * p.grad
                    p.grad = None
        fns["torch"] = torch_step
    flops = 6 * batch * sum(a * b for a, b in zip(widths[:-1], widths[1:]))
    return {"model": "-".join(map(str, widths)), "batch": batch, "gflop": flops / 1e9,
            **sides.compare(fns, stage, rounds=3 if stage.quick else 10)}


def cnn(stage, sides) -> dict:
    import minidl as mdl
    import minidl.functional as F
    batch, size = (4, 8) if stage.quick else (64, 32)
    rng = np.random.default_rng(0)

    def uniform(shape, fan_in):
        return (rng.uniform(-1, 1, shape) / np.sqrt(fan_in)).astype(np.float32)
    flat = 64 * (size // 4) ** 2
    weights = [uniform((32, 3, 3, 3), 27), uniform(32, 27), uniform((64, 32, 3, 3), 288), uniform(64, 288),
               uniform((10, flat), flat), uniform(10, flat)]
    x = rng.standard_normal((batch, 3, size, size)).astype(np.float32)
    y = rng.integers(0, 10, batch)
    p = [mdl.tensor(w, requires_grad=True, device=stage.device) for w in weights]
    xm, ym = mdl.tensor(x, device=stage.device), mdl.tensor(y, device=stage.device)

    def minidl_step():
        h = F.max_pool2d(F.relu(F.conv2d(xm, p[0], p[1], padding=1)), 2)
        h = F.max_pool2d(F.relu(F.conv2d(h, p[2], p[3], padding=1)), 2)
        F.cross_entropy(F.linear(h.reshape(batch, -1), p[4], p[5]), ym).backward()
        with mdl.no_grad():
            for w in p:
                w -= 0.01 * w.grad
                w.grad = None
    fns = {"minidl": minidl_step, "torch": None}
    if sides.torch_ok:
        import torch
        import torch.nn.functional as TF  # noqa: N812
        dev = _torch_device(stage.device)
        tp = [torch.tensor(w, requires_grad=True, device=dev) for w in weights]
        xt, yt = torch.tensor(x, device=dev), torch.tensor(y, device=dev)

        def torch_step():
            h = TF.max_pool2d(TF.relu(TF.conv2d(xt, tp[0], tp[1], padding=1)), 2)
            h = TF.max_pool2d(TF.relu(TF.conv2d(h, tp[2], tp[3], padding=1)), 2)
            TF.cross_entropy(TF.linear(h.reshape(batch, -1), tp[4], tp[5]), yt).backward()
            with torch.no_grad():
                for w in tp:
                    w -= 0.01 * w.grad
                    w.grad = None
        fns["torch"] = torch_step
    return {"images": f"{batch}x3x{size}x{size}", **sides.compare(fns, stage, rounds=3 if stage.quick else 10)}


def gpt_settings(quick=False):
    """``minidl gpt train``'s default settings (quick: a one-block model of width 16 on 16 tokens)."""
    from minidl.models.gpt_train import DEFAULTS
    s = dict(DEFAULTS)
    if quick:
        s.update(n_layer=1, n_head=2, n_embd=16, block_size=8, batch_size=2)
    return s


def gpt_minidl(s, device, checkpoint_blocks=False):
    """(config, model, step) of one AdamW training step of ``minidl gpt train``'s model with the settings ``s``."""
    import minidl as mdl
    from minidl import optim
    from minidl.models import GPT, GPTConfig
    from minidl.models.gpt_train import decay_groups, lm_loss
    mdl.manual_seed(0)
    cfg = GPTConfig(vocab_size=66, block_size=s["block_size"], n_layer=s["n_layer"], n_head=s["n_head"],
                    n_embd=s["n_embd"], dropout=s["dropout"])
    model = GPT(cfg, checkpoint_blocks=checkpoint_blocks).to(device)
    opt = optim.AdamW(decay_groups(model, s["weight_decay"]), lr=s["lr"], betas=s["betas"])
    rng = np.random.default_rng(0)
    x = mdl.tensor(rng.integers(0, 66, (s["batch_size"], s["block_size"])), device=device)
    y = mdl.tensor(rng.integers(0, 66, (s["batch_size"], s["block_size"])), device=device)

    def step():
        lm_loss(model(x), y).backward()
        optim.clip_grad_norm_(model.parameters(), s["clip_norm"])
        opt.step()
        opt.zero_grad()
    return cfg, model, step


def gpt_torch(s, cfg, model_minidl, device):
    """The same step in PyTorch, from the same initial weights (PyTorch imported here)."""
    import torch

    from minidl.models.torch_gpt import from_minidl, torch_gpt
    dev = _torch_device(device)
    model = torch_gpt(cfg).to(dev)
    import minidl as mdl
    from minidl import backend
    on_host = {k: backend.to_numpy(v.array if isinstance(v, mdl.Tensor) else v)
               for k, v in model_minidl.state_dict().items()}
    model.load_state_dict(from_minidl(on_host))
    opt = torch.optim.AdamW(model.parameters(), lr=s["lr"], betas=s["betas"], weight_decay=s["weight_decay"])
    rng = np.random.default_rng(0)
    x = torch.tensor(rng.integers(0, 66, (s["batch_size"], s["block_size"])), device=dev)
    y = torch.tensor(rng.integers(0, 66, (s["batch_size"], s["block_size"])), device=dev)

    def step():
        torch.nn.functional.cross_entropy(model(x).reshape(-1, 66), y.reshape(-1)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), s["clip_norm"])
        opt.step()
        opt.zero_grad()
    return step


def gpt(stage, sides) -> dict:
    """The GPT step against PyTorch's, and the peak memory of a step with and without checkpointing."""
    from minidl import memory
    s = gpt_settings(stage.quick)
    cfg, model, step = gpt_minidl(s, stage.device)
    fns = {"minidl": step, "torch": gpt_torch(s, cfg, model, stage.device) if sides.torch_ok else None}
    out = {"tokens": s["batch_size"] * s["block_size"], "layers": s["n_layer"], "width": s["n_embd"],
           **sides.compare(fns, stage, rounds=3 if stage.quick else 8)}
    for label, blocks in (("peak_bytes", False), ("peak_bytes_checkpointed", True)):
        _, _, step = gpt_minidl(s, stage.device, checkpoint_blocks=blocks)
        step()
        with memory.track() as tracker:
            step()
        out[label] = (tracker.pool_peak_bytes - tracker.pool_start_bytes
                      if tracker.pool_peak_bytes is not None else tracker.peak_bytes)
    if sides.torch_ok:
        out["torch_peak_bytes"] = torch_peak_bytes(fns["torch"])
    return out


def torch_peak_bytes(step) -> int:
    """The device memory PyTorch's caching allocator holds at most during one ``step()``, beyond before."""
    import torch
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - start


# ---------------------------------------------------------------- one optimizer update, tiny ops
def optimizer_update(stage, sides) -> dict:
    """One fused AdamW update of one parameter of 100M float32 elements (quick: 1M)."""
    import minidl as mdl
    from minidl import optim
    n = 1 << 20 if stage.quick else 100_000_000
    w = mdl.zeros(n, device=stage.device, requires_grad=True)
    w.grad = mdl.ones(n, device=stage.device)
    opt = optim.AdamW([w], lr=1e-3, weight_decay=0.01)
    fns = {"minidl": opt.step, "torch": None}
    if sides.torch_ok:
        import torch
        tw = torch.zeros(n, device=_torch_device(stage.device), requires_grad=True)
        tw.grad = torch.ones_like(tw)
        fns["torch"] = torch.optim.AdamW([tw], lr=1e-3, weight_decay=0.01, fused=True).step
    out = {"parameters": n, **sides.compare(fns, stage, rounds=3 if stage.quick else 10)}
    moved = 7 * 4 * n  # reads w, g, m, v; writes w, m, v
    out["bytes_per_s"] = moved / (out["minidl"]["best_ms"] / 1e3)
    del w, opt, fns
    return out


def launch(stage, sides) -> dict:
    """Time per op of ``a + b`` on 1-element tensors (no gradient): the per-op overhead."""
    import minidl as mdl
    a, b = mdl.ones(1, device=stage.device), mdl.ones(1, device=stage.device)
    number = 50 if stage.quick else 2000
    fns = {"minidl": lambda: a + b, "torch": None}
    if sides.torch_ok:
        import torch
        ta = torch.ones(1, device=_torch_device(stage.device))
        fns["torch"] = lambda: ta + ta
    out = sides.compare(fns, stage, rounds=3 if stage.quick else 5, number=number)
    return {"us_per_op": out["minidl"]["best_ms"] * 1e3, **out}


def run(stage) -> dict:
    torch_ok = bool(stage.results.get("environment", {}).get("torch", {}).get("available"))
    if "environment" not in stage.results:  # (PyTorch was imported, or failed to, before any stage's alarm)
        from minidl.selftest.environment import torch_cuda
        torch_ok = torch_cuda(stage.results.get("imports"))["available"]
    sides = _Sides(stage.device, torch_ok)
    figures, failures = {}, []
    # the roofline last: the longest part, and the only one that cannot stop at the deadline by itself
    parts = (("mlp", mlp), ("cnn", cnn), ("gpt", gpt), ("optimizer", optimizer_update), ("launch", launch),
             ("roofline", roofline))
    from minidl.selftest.stage_timeout import StageTimeout
    for name, measure in parts:
        if stage.expired(3):
            break
        started = time.perf_counter()
        try:
            figures[name] = measure(stage, sides)
        except StageTimeout:  # the stage's alarm: keep what was measured before
            failures.append(f"{name}: stopped by the stage's time limit")
            break
        except Exception as exc:  # noqa: BLE001 - one broken measurement must not hide the others
            failures.append(f"{name}: {type(exc).__name__}: {exc}"[:1000])
            continue
        figures[name]["seconds"] = time.perf_counter() - started
    if "roofline" in figures and "optimizer" in figures:  # the update as a fraction of the copy bandwidth
        copy = figures["roofline"]["ceilings"]["copy_bandwidth"]
        figures["optimizer"]["fraction_of_copy_bandwidth"] = figures["optimizer"]["bytes_per_s"] / copy
    ratios = {k: v["ratio"] for k, v in figures.items() if isinstance(v, dict) and "ratio" in v}
    shown = ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items())
    steps = ", ".join(f"{k} {figures[k]['minidl']['best_ms']:.3g} ms" for k in ("mlp", "cnn", "gpt")
                      if k in figures)
    return {"figures": figures, "torch": torch_ok, "failures": failures,
            "partial": len(figures) + len(failures) < len(parts),
            "summary": (f"minidl/PyTorch {shown}" if ratios else "no PyTorch with CUDA: minidl's times only")
                       + (f"; steps {steps}" if steps else "")}
