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
# DDP with no_sync: the first backward keeps this rank's gradient, the second averages the accumulated sums
import minidl.functional as F  # noqa: E402
from minidl import nn  # noqa: E402
from minidl.parallel import DistributedDataParallel  # noqa: E402

torch.manual_seed(100 + rank)  # different weights on each rank: DDP broadcasts rank 0's
ddp = DistributedDataParallel(nn.Linear(3, 2).double())
plain = nn.Linear(3, 2).double()
plain.load_state_dict(ddp.module.state_dict())  # rank 0's weights, a copy outside DDP
rng = np.random.default_rng(rank)
batches = [(rng.normal(size=(4, 3)), rng.normal(size=(4, 2))) for _ in range(2)]
with ddp.no_sync():
    F.mse_loss(ddp(torch.tensor(batches[0][0])), torch.tensor(batches[0][1])).backward()
results["after_no_sync"] = [p.grad.numpy().tolist() for p in ddp.parameters()]
F.mse_loss(ddp(torch.tensor(batches[1][0])), torch.tensor(batches[1][1])).backward()
results["after_sync"] = [p.grad.numpy().tolist() for p in ddp.parameters()]
for x, y in batches:
    F.mse_loss(plain(torch.tensor(x)), torch.tensor(y)).backward()
    if "plain_first" not in results:
        results["plain_first"] = [p.grad.numpy().tolist() for p in plain.parameters()]
results["plain_both"] = [p.grad.numpy().tolist() for p in plain.parameters()]
results["weights"] = [p.numpy().tolist() for p in ddp.parameters()]

dist.barrier()
dist.destroy_process_group()
results["initialized_after"] = dist.is_initialized()
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump(results, f)
