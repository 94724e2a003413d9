"""Run under mpiexec: minidl.distributed's collectives; each rank writes what it got to OUT/rank<r>.json.

    mpiexec -n 2 python collectives_worker.py OUT
"""
import json
import os
import sys

import numpy as np

import minidl as torch
import minidl.distributed as dist

out = sys.argv[1]
dist.init_process_group(backend="gloo")
rank, size = dist.get_rank(), dist.get_world_size()
base = np.arange(6, dtype=np.float64).reshape(2, 3) + 10 * rank  # rank r holds [[0..2],[3..5]] + 10 r
results = {"rank": rank, "size": size, "initialized": dist.is_initialized()}
for op in ("SUM", "AVG", "PRODUCT", "MIN", "MAX"):
    t = torch.tensor(base.copy())
    dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
    results[op] = t.numpy().tolist()
column = torch.tensor(base.copy())[:, 1]  # a non-contiguous view: reduced through a copy, written back
dist.all_reduce(column)
results["column"] = column.numpy().tolist()
b = torch.tensor(base.copy())
dist.broadcast(b, src=size - 1)
results["broadcast"] = b.numpy().tolist()
dist.barrier()
dist.destroy_process_group()
results["initialized_after"] = dist.is_initialized()
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump(results, f)
