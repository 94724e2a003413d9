"""Gradient accumulation on real MPI ranks with the gradients reduced during each backward (DataParallel with
overlap, ZeRO-2 in buckets): each backward's buckets carry its own forward's weights and the sync adds them, so
the step is one process's, the sum of each micro-batch's mean-loss gradient, even when the micro-batches split
unevenly (7 = 4 + 3 and 5 = 3 + 2 on 2 ranks; 2 + 2 + 2 + 1 and 2 + 1 + 1 + 1 on 4)."""
import os
import sys

import numpy as np
import pytest

from minidl import optim
from minidl.parallel import launch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import accumulation_worker  # noqa: E402
import mp_scenarios  # noqa: E402

REASON = launch.mpi_unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"MPI not installed: {REASON}")


@pytest.mark.parametrize("ranks", [2, 4])
def test_accumulated_steps_equal_one_process(ranks, tmp_path):
    result = launch.run(ranks, [os.path.join(HERE, "accumulation_worker.py"), str(tmp_path)], timeout=300)
    assert result.returncode == 0, f"mpiexec failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    model = mp_scenarios.make_sequential(seed=0)
    start = [p.array.copy() for p in model.parameters()]
    accumulation_worker.train(model, optim.SGD(model.parameters(), lr=0.5))
    want = [p.array for p in model.parameters()]
    assert max(np.abs(w - s).max() for w, s in zip(want, start)) > 1e-2   # the steps move the weights
    for name in ("overlap", "zero2"):
        got = np.load(tmp_path / f"{name}.npz")
        for k, w in enumerate(want):
            # float64 sums in another order: a few units in the last place, 3 SGD steps
            np.testing.assert_allclose(got[f"arr_{k}"], w, rtol=0, atol=1e-12, err_msg=f"{name} parameter {k}")
