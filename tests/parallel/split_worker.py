"""Run under mpiexec: the filter-wise and spatial checks; each rank saves what it computed.

    mpiexec -n 4 python tests/parallel/split_worker.py OUT_DIR

Writes OUT_DIR/rank<r>.npz (``<check>/<name>`` arrays) and OUT_DIR/rank<r>.json (the bytes each
communicator counted); test_split_mpi.py compares them with one process and with the cost model.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import split_scenarios as S  # noqa: E402

from minidl import optim, parallel  # noqa: E402
from minidl.parallel.filter_parallel import FilterParallel, FilterParallelOptimizer, filter_parallel  # noqa: E402
from minidl.parallel.spatial import SpatialParallel  # noqa: E402
from minidl.train import Trainer  # noqa: E402

SCHEMES = {
    "filter_gathered": lambda m, comm: FilterParallel(filter_parallel(m, comm, pair=False)),
    "filter_paired": lambda m, comm: FilterParallel(filter_parallel(m, comm, pair=True)),
    "spatial": lambda m, comm: SpatialParallel(m, comm),
}
MODELS = {"cnn": (S.cnn, S.cnn_batch), "odd": (S.odd_cnn, S.odd_batch)}


def one_step(world, arrays, traffic):
    """Forward and backward of one batch: the output, the input's gradient, this rank's parameters' gradients."""
    for model_name, (make, batch) in MODELS.items():
        for scheme, wrap in SCHEMES.items():
            if model_name == "odd" and scheme != "spatial" and world.size == 4:
                continue  # the odd CNN's 4 filters would leave one per rank: the cnn covers 4 ranks
            model = wrap(make(), world)
            world.reset_traffic()
            out, gx = S.forward_backward(model, *batch())
            key = f"{model_name}/{scheme}"
            traffic[key] = dict(world.traffic)
            arrays[f"{key}/out"], arrays[f"{key}/input_grad"] = out, gx
            for name, p in model.named_parameters():
                arrays[f"{key}/grad/{name}"] = p.grad.numpy()


def trained(world, arrays):
    """STEPS Trainer steps of SGD: filter-wise (with a global-norm clip) and spatial; the whole weights after."""
    for scheme in ("filter_paired", "spatial"):
        model = SCHEMES[scheme](S.cnn(), world)
        opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        if scheme.startswith("filter"):
            opt = FilterParallelOptimizer(opt, model.module)
        clip = S.CLIP if scheme.startswith("filter") else None
        trainer = Trainer(model, opt, S.train_batches(), metrics=None, progress=False, max_grad_norm=clip)
        trainer.fit(1)
        for name, value in model.consolidated_state_dict().items():
            arrays[f"train/{scheme}/{name}"] = np.asarray(value)
        arrays[f"train/{scheme}/loss"] = np.asarray(trainer.steps["loss"], dtype=np.float64)
        if scheme.startswith("filter"):
            resumed(world, scheme, model.consolidated_state_dict(), opt.consolidated_state_dict(), arrays)


def resumed(world, scheme, state, opt_state, arrays):
    """A fresh split model and optimizer loaded from the whole state, gathered whole again (the round trip
    of a checkpoint), and the momentum buffers (SGD's "b") of the whole optimizer state, by position."""
    model = SCHEMES[scheme](S.cnn(), world)
    opt = FilterParallelOptimizer(optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model.module)
    model.check_state_dict(state)
    opt.check_state_dict(opt_state)
    model.load_state_dict(state)
    opt.load_state_dict(opt_state)
    for name, value in model.consolidated_state_dict().items():
        arrays[f"resumed/{scheme}/{name}"] = np.asarray(value)
    for position, entry in opt.consolidated_state_dict()["state"].items():
        arrays[f"resumed/{scheme}/momentum/{position}"] = np.asarray(entry["b"])


def main(out):
    world = parallel.init()
    arrays, traffic = {}, {}
    one_step(world, arrays, traffic)
    trained(world, arrays)
    np.savez(os.path.join(out, f"rank{world.rank}.npz"), **arrays)
    with open(os.path.join(out, f"rank{world.rank}.json"), "w") as f:
        json.dump(traffic, f)


if __name__ == "__main__":
    main(sys.argv[1])
