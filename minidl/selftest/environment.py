"""The environment stage: what this machine is, read once, each item on its own (a missing one is noted).

GPU name, memory and compute capability of every visible GPU, the driver's and
the runtime's CUDA versions, CuPy, NVRTC and NCCL versions, NumPy, and whether
PyTorch with CUDA is importable (the speed stage's reference, never required).
"""
from __future__ import annotations

import platform

import numpy as np


def _cuda_version(number: int) -> str:
    """CUDA's integer versions (12080) as text (12.8)."""
    return f"{number // 1000}.{number % 1000 // 10}"


def _read(info: dict, key: str, read) -> None:
    try:
        info[key] = read()
    except Exception as exc:  # noqa: BLE001 - one unreadable item is noted, not a failure
        info[key] = f"unavailable ({type(exc).__name__}: {exc})"[:200]


def gpus(cp) -> list[dict]:
    """Name, memory (GiB) and compute capability of every visible GPU."""
    out = []
    for index in range(cp.cuda.runtime.getDeviceCount()):
        props = cp.cuda.runtime.getDeviceProperties(index)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        out.append({"index": index, "name": name, "memory_gib": round(props["totalGlobalMem"] / 2**30, 1),
                    "compute_capability": f"{props['major']}.{props['minor']}",
                    "multiprocessors": props.get("multiProcessorCount")})
    return out


def torch_cuda(imports: dict | None = None) -> dict:
    """PyTorch's version and whether it sees a GPU (never raises; PyTorch is optional). ``imports``: the
    run's :func:`~minidl.selftest.stage_timeout.import_up_front` record, whose failure is not retried here
    (under a stage's alarm)."""
    why = (imports or {}).get("failed", {}).get("torch")
    if why is not None:
        return {"available": False, "why": "PyTorch is not installed" if why.startswith("ModuleNotFoundError")
                else f"PyTorch cannot be imported ({why})"}
    try:
        import torch
    except ImportError:
        return {"available": False, "why": "PyTorch is not installed"}
    ok = bool(torch.cuda.is_available())
    return {"available": ok, "version": torch.__version__, "cuda": torch.version.cuda,
            **({} if ok else {"why": "PyTorch has no usable CUDA here"})}


def run(stage) -> dict:
    from minidl import __version__, backend
    cp = backend.cupy_module()
    info = {"minidl": __version__, "python": platform.python_version(), "numpy": np.__version__,
            "platform": platform.platform(), "cupy": getattr(cp, "__version__", "?")}
    _read(info, "gpus", lambda: gpus(cp))
    _read(info, "driver_cuda", lambda: _cuda_version(cp.cuda.runtime.driverGetVersion()))
    _read(info, "runtime_cuda", lambda: _cuda_version(cp.cuda.runtime.runtimeGetVersion()))
    _read(info, "nvrtc", lambda: ".".join(map(str, _nvrtc(cp).getVersion())))
    _read(info, "nccl", lambda: _nccl_version(backend))
    info["torch"] = torch_cuda(stage.results.get("imports"))
    stage.results["environment"] = info
    listed = info["gpus"] if isinstance(info["gpus"], list) else []
    gpu = f"{listed[0]['name']} ({listed[0]['memory_gib']} GiB)" if listed else "GPU ?"
    if len(listed) > 1:
        gpu += f" and {len(listed) - 1} more"
    nccl = "absent" if str(info["nccl"]).startswith("unavailable") else info["nccl"]
    torch_text = (f"PyTorch {info['torch']['version']} with CUDA" if info["torch"]["available"]
                  else f"no PyTorch reference ({info['torch']['why']})")
    return {"info": info, "summary": f"{gpu}, driver CUDA {info['driver_cuda']}, CuPy {info['cupy']}, "
                                     f"NVRTC {info['nvrtc']}, NCCL {nccl}; {torch_text}"}


def _nvrtc(cp):
    nvrtc = getattr(cp.cuda, "nvrtc", None)
    if nvrtc is None:
        raise RuntimeError("this CuPy has no cupy.cuda.nvrtc")
    return nvrtc


def _nccl_version(backend) -> str:
    number = backend.nccl().get_version()  # 23203 = 2.32.3
    return f"{number // 10000}.{number % 10000 // 100}.{number % 100}"

