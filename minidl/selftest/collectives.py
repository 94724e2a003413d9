"""The NCCL stage: every collective minidl sends through NCCL, on real device buffers; placement on every GPU.

A communicator of one rank (``parallel.NCCLComm`` outside mpiexec) still runs
each collective through libnccl's kernels: all-reduce and broadcast leave the
buffer as it was, all-gather stacks it once; for every dtype minidl sends, the
result must equal the input exactly. (Several ranks: ``tests/parallel/test_nccl.py``
under mpiexec, run by ``benchmarks/gpu_run.sh`` where there are two GPUs or more.)

Placement: on every visible GPU ``N``, a small model's forward, backward and
optimizer step on tensors made on ``cuda:N`` leave every result, gradient and
parameter on ``cuda:N``, with the CPU's numbers.
"""
from __future__ import annotations

import numpy as np

DTYPES = ("float16", "float32", "float64", "int8", "int32", "int64", "uint8")


def collectives(device: str) -> list[str]:
    """What NCCL got wrong on a one-rank communicator: [] when every collective is exact."""
    from minidl import backend, parallel
    index = backend.parse_device(device)[1]
    comm = parallel.NCCLComm(device_index=index)
    cp, problems = backend.cupy_module(), []
    for dtype in DTYPES:
        host = (np.arange(1000) % 97 - 40).astype(dtype)
        buffer = cp.asarray(host)
        comm.allreduce_(buffer)
        comm.broadcast_(buffer, root=0)
        gathered = comm.allgather(buffer)
        comm.synchronize()
        if not np.array_equal(backend.to_numpy(buffer), host):
            problems.append(f"NCCL all-reduce/broadcast of {dtype} changed the values (one rank: identity)")
        if tuple(gathered.shape) != (1,) + host.shape or not np.array_equal(backend.to_numpy(gathered)[0], host):
            problems.append(f"NCCL all-gather of {dtype}: shape {tuple(gathered.shape)} or values differ")
    return problems


def placement(device: str) -> list[str]:
    """What landed off ``device`` (or differs from the CPU) in one training step of a small model."""
    import minidl as mdl
    import minidl.functional as F
    from minidl import backend, nn, optim
    results = {}
    for where in ("cpu", device):
        mdl.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).to(where)
        opt = optim.Adam(model.parameters(), lr=0.01)
        rng = np.random.default_rng(0)
        x = mdl.tensor(rng.standard_normal((5, 6)).astype(np.float32), device=where)
        y = mdl.tensor(rng.integers(0, 3, 5), device=where)
        out = model(x)
        loss = F.cross_entropy(out, y)
        loss.backward()
        opt.step()
        seen = {"input": x, "output": out, "loss": loss, **{f"parameter {i}": p for i, p in
                                                           enumerate(model.parameters())},
                **{f"gradient {i}": p.grad for i, p in enumerate(model.parameters())}}
        results[where] = seen
    problems = [f"{device}: the {name} is on {t.device} ({backend.device_of(t.array)})"
                for name, t in results[device].items() if t.device != device or backend.device_of(t.array) != device]
    for name, t in results["cpu"].items():
        if not np.allclose(results[device][name].numpy(), t.numpy(), rtol=1e-5, atol=1e-6):
            problems.append(f"{device}: the {name} differs from the CPU's")
    return problems


def run(stage) -> dict:
    from minidl import backend
    cp = backend.cupy_module()
    count = cp.cuda.runtime.getDeviceCount()
    failures, done = [], {}
    for index in range(count):
        if stage.expired():
            break
        failures += placement(f"cuda:{index}")
        done["placement"] = f"cuda:0..{index}"
    try:
        backend.nccl()
    except RuntimeError as exc:
        nccl = f"NCCL not checked: {exc}"[:200]
    else:
        failures += collectives(stage.device)
        nccl = f"NCCL all-reduce, broadcast, all-gather exact for {len(DTYPES)} dtypes on one rank"
        if count > 1:
            nccl += f"; {count} GPUs: several ranks are tests/parallel/test_nccl.py's (under mpiexec)"
    return {"gpus": count, "failures": failures, "nccl": nccl, "placement": done.get("placement"),
            "partial": "placement" not in done or done["placement"] != f"cuda:0..{count - 1}",
            "summary": f"{nccl}; forward, backward and step placed on each of {count} GPU(s)"
                       + (f"; {len(failures)} problem(s)" if failures else "")}
