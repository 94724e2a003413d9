"""Elastic restarts: a run of N ranks on layout A, checkpointed, resumes on M ranks on layout B and ends where
the uninterrupted one-process run ends, for N, M ∈ {1, 2, 4} and A, B among one process, data parallelism,
ZeRO 1, 2, 3, tensor and pipeline parallelism.

tests/parallel/elastic_worker.py trains the sources (3 of 6 Adam steps, stopped inside the first epoch, so
the loader's position is part of what resumes) and the cells (a source's checkpoint loaded into a fresh
run of layout B, trained to step 6). The Trainer's checkpoints are consolidated (minidl.parallel.whole_state:
the whole weights and each parameter's Adam state in its own shape, at one process's optimizer positions),
so nothing in them depends on the layout that wrote them.

The walk: every one of the 13 sources resumes in one process; on 2 ranks and on 4 ranks each of the 6
parallel layouts resumes 3 sources, taken in turn around the list, so that every source resumes on both 2
and 4 ranks (a few cells per MPI job: one mpiexec per world size starts the sources of every layout, one
per world size resumes every cell). 13 + 18 + 18 = 49 cells.

The tolerance, 1e-9 on float64 weights of order 0.3: data and tensor parallelism sum the ranks' parts in
another order than one process (measured: at most 1.1e-16 apart after the 6 steps); a resume that lost the
Adam moments (bias correction restarting), the step or the loader's position moves weights by about
lr = 0.01.
"""
import os
import sys

import numpy as np
import pytest

from minidl.parallel import launch

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "elastic_worker.py")
sys.path.insert(0, HERE)
import elastic_worker as worker  # noqa: E402

REASON = launch.mpi_unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"MPI not installed: {REASON}")
PARALLEL = ("dp", "zero1", "zero2", "zero3", "tp", "pp")
SOURCES = ["1-one"] + [f"{n}-{layout}" for n in (2, 4) for layout in PARALLEL]


# ZeRO-3 resumed on 4 ranks once raised, in a fresh process, "a tensor it saved for backward was changed
# in place": a weight gathered again in backward took a new buffer whose id a freed buffer stamped after the
# forward had used (minidl.tensor keeps versions by buffer id). The units now keep each weight's version
# across release and gather (FlatShard.release and gather, minidl.tensor.keep_version); this walk is its test.
TARGETS = {2: PARALLEL, 4: PARALLEL}


def _cells(ranks: int) -> dict:
    """Layout B → the 3 sources it resumes on ``ranks`` ranks, taken in turn around SOURCES."""
    offset = 0 if ranks == 2 else 7
    return {layout: [SOURCES[(offset + 3 * i + j) % len(SOURCES)] for j in range(3)]
            for i, layout in enumerate(TARGETS[ranks])}


def _job(ranks, args):
    job = launch.run(ranks, [WORKER, *args], timeout=400)
    assert job.returncode == 0, f"mpiexec failed:\n{job.stdout[-2000:]}\n{job.stderr[-4000:]}"


@pytest.fixture(scope="module")
def walked(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("elastic"))
    worker.straight(out)
    world = worker.parallel.init()
    worker.start(out, ["one"], world)
    for n in (2, 4):
        _job(n, [out, "start", ",".join(PARALLEL)])
    worker.resume(out, "one", SOURCES, world)
    for m in (2, 4):
        _job(m, [out, "resume", "/".join(f"{b}:{','.join(s)}" for b, s in _cells(m).items())])
    return out


def test_every_source_resumes_on_one_two_and_four_ranks():
    for m in (2, 4):
        covered = {s for sources in _cells(m).values() for s in sources}
        assert covered == set(SOURCES), m


@pytest.mark.parametrize("cell", [f"{s}-1-one" for s in SOURCES]
                         + [f"{s}-{m}-{b}" for m in (2, 4) for b, sources in _cells(m).items() for s in sources])
def test_a_resumed_run_ends_where_one_process_ends(walked, cell):
    want = np.load(os.path.join(walked, "straight.npz"))
    got = np.load(os.path.join(walked, f"cell-{cell}.npz"))
    assert int(got["steps"]) == int(want["steps"]) == worker.STEPS
    assert sorted(got.files) == sorted(want.files)
    for key in want.files:
        np.testing.assert_allclose(got[key], want[key], rtol=0, atol=1e-9, err_msg=f"{cell}: {key}")


def test_the_half_run_is_not_the_whole_run(walked):
    """The check has teeth: the sources' weights (step 3) are far from the end (step 6), and a restart that
    forgets Adam's moments ends far off too."""
    import minidl as mdl
    want = np.load(os.path.join(walked, "straight.npz"))
    half = mdl.load(os.path.join(walked, "src-1-one", "last.safetensors"))["model"]
    assert max(float(np.abs(np.asarray(half[k]) - want[k]).max()) for k in half) > 1e-3
    trainer, _ = worker.trainer_for("one", worker.parallel.init())
    trainer.load_checkpoint(os.path.join(walked, "src-1-one", "last.safetensors"))
    trainer.optimizer.state.clear()        # what a resume that lost the moments would do
    trainer.fit(2, max_steps=worker.STEPS)
    forgot = trainer.model.state_dict()
    assert max(float(np.abs(np.asarray(forgot[k].array if hasattr(forgot[k], "array") else forgot[k]) - want[k]).max())
               for k in want.files if k != "steps") > 1e-4
