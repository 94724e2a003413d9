"""Run under mpiexec: a data-parallel job that trains until stopped; the test freezes one rank with SIGSTOP.

    MINIDL_COLLECTIVE_TIMEOUT=3 mpiexec -n 2 python tests/parallel/timeout_worker.py OUT

Each rank writes its process id to OUT/pid<r> and, every step, the step number to OUT/step<r>; rank 0 saves
a checkpoint (written, then renamed) to OUT/last.safetensors every step. Only the collectives' timeout can
end the job early once a rank is frozen.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import scenarios  # noqa: E402

import minidl as mdl  # noqa: E402
from minidl import parallel  # noqa: E402

out = sys.argv[1]
comm = parallel.init()
with open(os.path.join(out, f"pid{comm.rank}"), "w") as f:
    f.write(str(os.getpid()))
dp = parallel.DataParallel(scenarios.make_model(comm.rank, "float64"), comm)
opt = parallel.DistributedOptimizer(scenarios.make_optimizer("sgd", dp.parameters()), dp)
xs, ys = scenarios.make_batches(12, "float64")
lo, hi = parallel.shard_bounds(12, comm.rank, comm.size)
for step in range(1_000_000):
    loss = scenarios.loss_of(dp, xs[step % 20][lo:hi], ys[step % 20][lo:hi])
    opt.zero_grad()
    loss.backward()
    opt.step()
    if comm.rank == 0:
        mdl.save(dp.state_dict(), os.path.join(out, "last.safetensors"))
    with open(os.path.join(out, f"step{comm.rank}.tmp"), "w") as f:
        f.write(str(step))
    os.replace(os.path.join(out, f"step{comm.rank}.tmp"), os.path.join(out, f"step{comm.rank}"))
print("finished without a timeout", flush=True)
