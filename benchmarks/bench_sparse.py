"""A pruned Linear layer run dense against the same layer run from its CSR nonzeros: the density where CSR wins.

One layer of 1024 → 1024 (float32, batch 64), pruned by magnitude to each sparsity, forward +
backward: the dense product of the masked weight (``F.linear``: BLAS's GEMM) against
``minidl.ops.sparse.csr_linear``, with SciPy's compiled CSR product where SciPy is installed and
without it (a gather, a scale and one ``reduceat`` per product, in NumPy), timed in alternating
rounds at one BLAS thread on this thread's CPU clock, the best round each; and SciPy's forward
product alone (``scipy.sparse.csr_matrix @ x.T``).

    python benchmarks/bench_sparse.py [--sparsities 0.5,0.8,0.9,0.95,0.98,0.99,0.995,0.999] [--save]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from common import best_time, save_results

import minidl as mdl
import minidl.functional as F
from minidl import backend
from minidl.ops.sparse import CSRStructure, csr_linear

WIDTH, BATCH = 1024, 64


def pruned_weight(sparsity: float, seed: int = 0) -> np.ndarray:
    w = np.random.default_rng(seed).standard_normal((WIDTH, WIDTH)).astype(np.float32)
    w[np.abs(w) < np.quantile(np.abs(w), sparsity)] = 0
    return w


def steps(sparsity: float):
    """(dense step, CSR step, SciPy forward or None) for one sparsity: forward + backward each."""
    w = pruned_weight(sparsity)
    x = mdl.tensor(np.random.default_rng(1).standard_normal((BATCH, WIDTH), dtype=np.float32), requires_grad=True)
    dense = mdl.tensor(w, requires_grad=True)
    structure, values = CSRStructure.from_dense(w)
    v = mdl.tensor(values, requires_grad=True)

    def dense_step():
        x.grad = dense.grad = None
        F.linear(x, dense).sum().backward()

    def csr_step():
        x.grad = v.grad = None
        csr_linear(x, v, structure).sum().backward()

    scipy_forward = None
    try:
        from scipy import sparse
        matrix, xt = sparse.csr_matrix(w), np.ascontiguousarray(x.array.T)
        scipy_forward = lambda: matrix @ xt  # noqa: E731
    except ImportError:
        pass
    return dense_step, csr_step, scipy_forward, structure.density


def numpy_only(step):
    """``step`` with SciPy hidden from minidl: the CSR product by NumPy's gather and reduceat."""
    def run():
        saved = backend._optional.get("scipy.sparse")
        backend._optional["scipy.sparse"] = False
        try:
            step()
        finally:
            backend._optional.pop("scipy.sparse")
            if saved is not None:
                backend._optional["scipy.sparse"] = saved
    return run


def measure(sparsities, repeat: int = 3) -> list[dict]:
    rows = []
    for sparsity in sparsities:
        dense_step, csr_step, scipy_forward, density = steps(sparsity)
        steps_by_name = {"dense": dense_step, "csr": csr_step, "csr_numpy": numpy_only(csr_step)}
        best = dict.fromkeys(steps_by_name, float("inf"))
        for _ in range(repeat):
            for name, step in steps_by_name.items():
                best[name] = min(best[name], best_time(step, repeat=1, warmup=1, clock=time.thread_time))
        row = {"sparsity": sparsity, "density": density, "dense_ms": 1e3 * best["dense"], "csr_ms": 1e3 * best["csr"],
               "csr_numpy_ms": 1e3 * best["csr_numpy"], "ratio": best["csr"] / best["dense"],
               "ratio_numpy": best["csr_numpy"] / best["dense"]}
        if scipy_forward is not None:
            row["scipy_forward_ms"] = 1e3 * best_time(scipy_forward, repeat=repeat, clock=time.thread_time)
        rows.append(row)
        print(f"sparsity {sparsity:6.3f}: dense {row['dense_ms']:7.2f} ms  csr {row['csr_ms']:7.2f} ms "
              f"(/ dense {row['ratio']:.2f})  csr without SciPy {row['csr_numpy_ms']:7.2f} ms "
              f"(/ dense {row['ratio_numpy']:.2f})", flush=True)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sparsities", default="0.5,0.8,0.9,0.95,0.98,0.99,0.995,0.999")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--save", action="store_true")
    args = parser.parse_args(argv)
    mdl.set_num_threads(1)  # every library computes in this thread: its CPU time is the clock
    rows = measure([float(v) for v in args.sparsities.split(",")], args.repeat)
    for key, name in (("ratio", "CSR"), ("ratio_numpy", "CSR without SciPy")):
        wins = [r["sparsity"] for r in rows if r[key] < 1]
        print(f"{name} faster from sparsity {min(wins)}" if wins else f"{name}: dense faster at every sparsity")
    if args.save:
        print(save_results("sparse", {"rows": rows, "width": WIDTH, "batch": BATCH}))


if __name__ == "__main__":
    main()
