"""The GPT of ``minidl gpt train`` measured against the same model in PyTorch (CPU), in one run.

Part 1, speed. One training step (forward, cross-entropy, backward, clipping,
AdamW) of the default model (4 blocks, width 128, 4 heads, context 64, batch
32: 2,048 tokens) in minidl and in PyTorch, the two timed in alternation so
that a change in the machine's load hits both alike; the best of ``--repeat``
steps each. Reported: training tokens/s of each, the ratio of step times
(minidl / PyTorch), and the fraction of this machine's GEMM peak (an n×n
float32 product measured in this run) that the step's matrix-product FLOPs
reach. Two clocks, as in bench_checkpoint.py: wall time and the process's CPU
time; with BLAS on one thread (the default, set before NumPy and PyTorch
load; ``--blas-threads 2`` for both cores) the CPU time measures the work
itself on a machine shared with other jobs.

Part 2, memory. The activation bytes a step holds for backward
(``minidl.memory.track``), with and without gradient checkpointing per block,
and the peak of all NumPy allocations during the step (tracemalloc).

Part 3, the same recipe (``--compare-steps N``, default the command's step
count; 0 skips it). minidl's recipe through the Trainer, and a plain PyTorch
loop with the same initial weights (copied), the same batches in the same
order, AdamW with the same two parameter groups, the same warmup+cosine
schedule (LambdaLR of the same function), clipping at 1.0; the validation
losses after N steps are compared (the claim: within 0.05 nats).

With ``--device cuda``: parts 1 and 2 on the GPU, minidl on CuPy beside PyTorch on
CUDA, timed with CUDA events after a warm-up in alternating rounds; memory is the
growth of each library's device pool during a step, with and without block
checkpointing for minidl. Part 3 (a CPU run of the recipe) is left out.

Writes benchmarks/results/<machine>_gpt.json (``_gpt_cuda.json`` on the GPU).

    python benchmarks/bench_gpt.py [--repeat 8] [--compare-steps 400] [--blas-threads 1] [--device cuda]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import tracemalloc

if __name__ == "__main__":  # BLAS threads are fixed when NumPy loads: decide before importing it
    _threads = sys.argv[sys.argv.index("--blas-threads") + 1] if "--blas-threads" in sys.argv else "1"
    for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_name, _threads)

import numpy as np  # noqa: E402
from common import add_device_option, device_timers, machine_name, require_device, save_results  # noqa: E402

import minidl as mdl  # noqa: E402
from minidl import optim  # noqa: E402
from minidl.memory import track  # noqa: E402
from minidl.models import GPT, GPTConfig  # noqa: E402
from minidl.models.gpt_train import DEFAULTS, build, decay_groups, lm_loss, train  # noqa: E402
from minidl.models.torch_gpt import from_minidl, torch_gpt  # noqa: E402


def config(s) -> GPTConfig:
    return GPTConfig(vocab_size=66, block_size=s["block_size"], n_layer=s["n_layer"], n_head=s["n_head"],
                     n_embd=s["n_embd"], dropout=s["dropout"])


def matmul_flops(cfg: GPTConfig, batch: int) -> float:
    """FLOPs of the matrix products of one training step (forward 1x, backward 2x).

    Per token: the Linear layers 2·(3C² + C² + 4C² + 4C²)·L plus the tied output 2·C·V, and the
    attention's two products 2·2·T·C·L (counted in full, as the causal kernels here compute them).
    """
    C, L, T, V = cfg.n_embd, cfg.n_layer, cfg.block_size, cfg.vocab_size  # noqa: N806
    per_token = 2 * 12 * C * C * L + 2 * C * V + 4 * T * C * L
    return 3 * per_token * batch * T


class Clock:
    """Wall and CPU seconds of one call."""

    def __call__(self, fn):
        w, c = time.perf_counter(), time.process_time()
        fn()
        return time.perf_counter() - w, time.process_time() - c


def minidl_step(s, checkpoint_blocks=False):
    mdl.manual_seed(0)
    model = GPT(config(s), checkpoint_blocks=checkpoint_blocks)
    opt = optim.AdamW(decay_groups(model, s["weight_decay"]), lr=s["lr"], betas=s["betas"])
    rng = np.random.default_rng(0)
    x = rng.integers(0, 66, (s["batch_size"], s["block_size"]))
    y = mdl.tensor(rng.integers(0, 66, (s["batch_size"], s["block_size"])))

    def step():
        loss = lm_loss(model(x), y)
        loss.backward()
        optim.clip_grad_norm_(model.parameters(), s["clip_norm"])
        opt.step()
        opt.zero_grad()
    return model, step, (x, y)


def torch_step(s, model_minidl):
    import torch
    model = torch_gpt(config(s))
    model.load_state_dict(from_minidl(model_minidl.state_dict()))
    decay = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    groups = [{"params": [p for n, p in model.named_parameters() if n.rsplit(".", 1)[0] in decay
                          and n.endswith("weight")], "weight_decay": s["weight_decay"]},
              {"params": [p for n, p in model.named_parameters() if not (n.rsplit(".", 1)[0] in decay
                          and n.endswith("weight"))], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=s["lr"], betas=s["betas"])
    rng = np.random.default_rng(0)
    x = torch.tensor(rng.integers(0, 66, (s["batch_size"], s["block_size"])))
    y = torch.tensor(rng.integers(0, 66, (s["batch_size"], s["block_size"])))

    def step():
        loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 66), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), s["clip_norm"])
        opt.step()
        opt.zero_grad()
    return model, opt, step


def speed(s, repeat: int) -> dict:
    import torch

    from minidl.roofline.ceilings import measure_gemm
    torch.set_num_threads(int(os.environ["OPENBLAS_NUM_THREADS"]))
    model, ours, _ = minidl_step(s)
    _, _, theirs = torch_step(s, model)
    clock = Clock()
    for fn in (ours, theirs, ours, theirs):  # warm up: first-call costs, allocator pools
        fn()
    times = {"minidl": [], "torch": []}
    for _ in range(repeat):  # alternate, so a change in the machine's load hits both
        times["minidl"].append(clock(ours))
        times["torch"].append(clock(theirs))
    tokens = s["batch_size"] * s["block_size"]
    out = {}
    for name, ts in times.items():
        wall, cpu = min(t[0] for t in ts), min(t[1] for t in ts)
        out[name] = {"step_wall_s": wall, "step_cpu_s": cpu, "tokens_per_s_wall": tokens / wall,
                     "tokens_per_s_cpu": tokens / cpu}
    peak = max(measure_gemm(1024) for _ in range(3))
    flops = matmul_flops(config(s), s["batch_size"])
    out["ratio_wall"] = out["minidl"]["step_wall_s"] / out["torch"]["step_wall_s"]
    out["ratio_cpu"] = out["minidl"]["step_cpu_s"] / out["torch"]["step_cpu_s"]
    out["gemm_peak_flops"] = peak
    out["step_matmul_flops"] = flops
    for name in ("minidl", "torch"):
        out[name]["fraction_of_gemm_peak"] = flops / out[name]["step_wall_s"] / peak
    return out


def memory(s) -> dict:
    out = {}
    for ckpt in (False, True):
        model, step, (x, y) = minidl_step(s, checkpoint_blocks=ckpt)
        step()  # gradients and optimizer state exist before the measured step
        with track() as m:
            loss = lm_loss(model(x), y)
            loss.backward()
        model.zero_grad()
        lm_loss(model(x), y).backward()  # the gradient buffers are allocated again, outside the count
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        loss = lm_loss(model(x), y)
        loss.backward()
        peak = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.stop()
        out["checkpoint" if ckpt else "plain"] = {"activation_bytes": m.peak_bytes, "step_peak_bytes": peak}
    out["activation_ratio"] = out["checkpoint"]["activation_bytes"] / out["plain"]["activation_bytes"]
    return out


def same_recipe(s, steps: int) -> dict:
    """Val loss after ``steps`` steps: minidl's recipe (Trainer) and the same recipe in a PyTorch loop."""
    import torch
    s = dict(s, steps=steps, sample_every=0)
    started = time.perf_counter()
    ours = train(s, None, show=False)
    minidl_seconds = time.perf_counter() - started
    # PyTorch: the initial weights of minidl's run (rebuilt from the same seed), the same batches.
    from minidl.train.trainer import seed_everything
    seed_everything(s["seed"])
    model_m, _, schedule, train_loader, val_loader, _ = build(s)
    model, opt, _ = torch_step(s, model_m)
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: schedule(t) / s["lr"])
    started = time.perf_counter()
    step = 0
    while step < steps:
        for x, y in train_loader:
            loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x.numpy())).reshape(-1, 66),
                                                     torch.from_numpy(y.numpy()).reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), s["clip_norm"])
            opt.step()
            opt.zero_grad()
            scheduler.step()
            step += 1
            if step == steps:
                break
    torch_seconds = time.perf_counter() - started
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in val_loader:
            total += torch.nn.functional.cross_entropy(model(torch.from_numpy(x.numpy())).reshape(-1, 66),
                                                       torch.from_numpy(y.numpy()).reshape(-1)).item() * len(y)
            count += len(y)
    theirs = total / count
    return {"steps": steps, "minidl_val_loss": ours["val_loss"], "torch_val_loss": theirs,
            "difference": ours["val_loss"] - theirs, "within_0.05": abs(ours["val_loss"] - theirs) <= 0.05,
            "minidl_seconds": minidl_seconds, "torch_seconds": torch_seconds}


def on_gpu(s, repeat: int, device: str, gemm_n: int = 4096) -> dict:
    """Parts 1 and 2 on the GPU: step times (CUDA events, alternating rounds) and device-pool peaks."""
    from minidl.roofline import timing
    from minidl.roofline.ceilings import measure_gemm
    from minidl.selftest.speed import gpt_minidl, gpt_torch, torch_peak_bytes
    cfg, model, ours = gpt_minidl(s, device)
    fns = {"minidl": ours}
    try:
        fns["torch"] = gpt_torch(s, cfg, model, device)
    except (ImportError, RuntimeError, AssertionError) as exc:  # no PyTorch, or one without CUDA
        print(f"PyTorch left out: {exc}")
    out = timing.summary(timing.alternate(fns, device_timers(device, fns), rounds=repeat, warmup=3))
    tokens, flops = s["batch_size"] * s["block_size"], matmul_flops(cfg, s["batch_size"])
    out["gemm_peak_flops"] = peak = measure_gemm(gemm_n, device)
    for name in fns:
        seconds = out[name]["best_ms"] / 1e3
        out[name].update(tokens_per_s=tokens / seconds, fraction_of_gemm_peak=flops / seconds / peak)
    for label, blocks in (("plain", False), ("checkpoint", True)):
        _, model, step = gpt_minidl(s, device, checkpoint_blocks=blocks)
        step()
        with track() as m:
            step()
        out[f"minidl_{label}_pool_peak_bytes"] = m.pool_peak_bytes - m.pool_start_bytes
    if "torch" in fns:
        out["torch_peak_bytes"] = torch_peak_bytes(fns["torch"])
    return out


def main_gpu(s, args) -> int:
    r = on_gpu(s, args.repeat, args.device)
    print(f"training step on {args.device}, {s['batch_size']}x{s['block_size']} tokens (best of {args.repeat} "
          "alternating rounds, CUDA events):")
    for name in ("minidl", "torch"):
        if name in r:
            print(f"  {name:<7} {r[name]['best_ms']:8.2f} ms ({r[name]['tokens_per_s']:10,.0f} tokens/s), "
                  f"{r[name]['fraction_of_gemm_peak']:.1%} of the GEMM peak")
    if "ratio" in r:
        print(f"  minidl / PyTorch time per step: {r['ratio']:.2f}x (median of the rounds)")
    print(f"  device memory of a step: minidl {r['minidl_plain_pool_peak_bytes'] / 2**20:.1f} MiB, "
          f"{r['minidl_checkpoint_pool_peak_bytes'] / 2**20:.1f} MiB checkpointing every block"
          + (f"; PyTorch {r['torch_peak_bytes'] / 2**20:.1f} MiB" if "torch_peak_bytes" in r else ""))
    print(f"wrote {save_results('gpt_cuda', {'settings': dict(s), 'speed': r})}  (machine {machine_name()})")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=8, help="timed steps of each framework")
    p.add_argument("--compare-steps", dest="compare_steps", type=int, default=DEFAULTS["steps"],
                   help="steps of the same-recipe comparison (0: skip it)")
    p.add_argument("--blas-threads", dest="blas_threads", default="1", help="BLAS threads (set before import)")
    add_device_option(p)
    args = p.parse_args(argv)
    require_device(args.device)
    s = dict(DEFAULTS, betas=tuple(DEFAULTS["betas"]))
    if args.device != "cpu":
        return main_gpu(s, args)
    results = {"settings": {k: v for k, v in s.items()}, "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
               "load_average": os.getloadavg()}
    r = results["speed"] = speed(s, args.repeat)
    print(f"training step, {s['batch_size']}x{s['block_size']} tokens (best of {args.repeat}, BLAS threads "
          f"{results['blas_threads']}, load average {results['load_average'][0]:.1f}):")
    for name in ("minidl", "torch"):
        x = r[name]
        print(f"  {name:<7} {x['step_wall_s'] * 1e3:7.1f} ms wall ({x['tokens_per_s_wall']:8,.0f} tokens/s), "
              f"{x['step_cpu_s'] * 1e3:7.1f} ms CPU ({x['tokens_per_s_cpu']:8,.0f} tokens/s); "
              f"{x['fraction_of_gemm_peak']:.1%} of the GEMM peak")
    print(f"  minidl / PyTorch time per step: {r['ratio_wall']:.2f}x wall, {r['ratio_cpu']:.2f}x CPU "
          f"(GEMM peak measured {r['gemm_peak_flops'] / 1e9:.1f} GFLOP/s; "
          f"{r['step_matmul_flops'] / 1e9:.2f} GFLOP of products a step)")
    m = results["memory"] = memory(s)
    print(f"activation memory of a step: {m['plain']['activation_bytes'] / 2**20:.1f} MiB plain, "
          f"{m['checkpoint']['activation_bytes'] / 2**20:.1f} MiB checkpointing every block "
          f"({m['activation_ratio']:.0%}); peak NumPy allocation during forward+backward "
          f"{m['plain']['step_peak_bytes'] / 2**20:.1f} MiB vs {m['checkpoint']['step_peak_bytes'] / 2**20:.1f} MiB")
    if args.compare_steps:
        c = results["same_recipe"] = same_recipe(s, args.compare_steps)
        print(f"same recipe, {c['steps']} steps: validation loss minidl {c['minidl_val_loss']:.4f}, PyTorch "
              f"{c['torch_val_loss']:.4f} (difference {c['difference']:+.4f} nats; within 0.05: "
              f"{'yes' if c['within_0.05'] else 'NO'}); {c['minidl_seconds']:.0f} s vs {c['torch_seconds']:.0f} s")
    print(f"wrote {save_results('gpt', results)}  (machine {machine_name()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
