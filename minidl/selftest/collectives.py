"""The NCCL stage: every collective minidl sends through NCCL, on real device buffers; placement on every GPU.

A communicator of one rank (``parallel.NCCLComm`` outside mpiexec) still runs
each collective through libnccl's kernels, and with one rank each has a known
result. For every dtype minidl sends, through minidl's own ``NCCLComm`` calls:

    all-reduce             the buffer, unchanged (a sum over one rank)
    broadcast              the buffer, unchanged
    all-gather             a new (1, n) array holding the buffer
    reduce-scatter         a new array of n elements holding the buffer (the one rank's chunk)
    send/recv              ``sendrecv_`` with itself (NCCL allows it inside a group): the buffer
                           lands in a zeroed one
    overlapped all-reduce  ``iallreduce_`` on NCCLComm's side stream, after a kernel the current
                           stream has just queued to fill the buffer, then ``wait()``

Each result is compared exactly with the host's copy of the input. Where NCCL cannot be
loaded the stage fails, saying why: data parallelism over GPUs needs it. (Several ranks:
``tests/parallel/test_nccl.py`` under mpiexec, run by ``benchmarks/gpu_run.sh`` where
there are two GPUs or more.)

Placement: on every visible GPU ``N``, a small model's forward, backward and
optimizer step on tensors made on ``cuda:N`` leave every result, gradient and
parameter on ``cuda:N``, with the CPU's numbers.
"""
from __future__ import annotations

import numpy as np

DTYPES = ("float16", "float32", "float64", "int8", "int32", "int64", "uint8")
COLLECTIVES = ("all-reduce", "broadcast", "all-gather", "reduce-scatter", "send/recv", "overlapped all-reduce")


def collectives(device: str) -> list[str]:
    """What NCCL got wrong on a one-rank communicator: [] when every collective of :data:`COLLECTIVES` is
    exact for every dtype of :data:`DTYPES`.

    Each collective gets a buffer of its own, with values no other buffer of the run holds, so a
    call that writes nothing cannot pass on memory the pool hands back from an earlier one."""
    from minidl import backend, parallel
    index = backend.parse_device(device)[1]
    comm = parallel.NCCLComm(device_index=index)
    cp, problems = backend.cupy_module(), []

    def overlapped(buffer):
        out = cp.zeros_like(buffer)
        out += buffer  # queued on the current stream: the side stream must wait for it
        comm.iallreduce_(out).wait()
        return out
    calls = {"all-reduce": comm.allreduce_, "broadcast": lambda b: comm.broadcast_(b, root=0),
             "all-gather": comm.allgather, "reduce-scatter": comm.reduce_scatter,
             "send/recv": lambda b: comm.sendrecv_(b, comm.rank, cp.zeros_like(b), comm.rank),
             "overlapped all-reduce": overlapped}
    with cp.cuda.Device(index):
        for number, dtype in enumerate(DTYPES):
            for offset, name in enumerate(COLLECTIVES):
                shift = number * len(COLLECTIVES) + offset  # a different sequence for every call
                host = ((np.arange(1000) * 7 + shift) % 97 - 40).astype(dtype)
                got = calls[name](cp.asarray(host))
                comm.synchronize()
                got = backend.to_numpy(got)
                want = host[None] if name == "all-gather" else host
                if got.shape != want.shape or got.dtype != want.dtype or not np.array_equal(got, want):
                    problems.append(f"NCCL {name} of {dtype}: got {got.dtype} of shape {got.shape}, wanted the "
                                    f"input ({want.dtype}, shape {want.shape}) exactly (one rank)")
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
    except RuntimeError as exc:  # data parallelism over GPUs cannot run: a failure, not a pass
        nccl = f"NCCL cannot be loaded: {exc}"[:300]
        failures.append(nccl)
    else:
        failures += collectives(stage.device)
        nccl = f"NCCL {', '.join(COLLECTIVES)} exact for {len(DTYPES)} dtypes on one rank"
        if count > 1:
            nccl += f"; {count} GPUs: several ranks are tests/parallel/test_nccl.py's (under mpiexec)"
    return {"gpus": count, "failures": failures, "nccl": nccl, "placement": done.get("placement"),
            "partial": "placement" not in done or done["placement"] != f"cuda:0..{count - 1}",
            "summary": f"{nccl}; forward, backward and step placed on each of {count} GPU(s)"
                       + (f"; {len(failures)} problem(s)" if failures else "")}
