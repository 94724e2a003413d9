"""Elastic restarts: a run checkpointed on one layout and resumed on another. In one process, or under mpiexec.

    python tests/parallel/elastic_worker.py OUT start one                  # one process: the source "1/one"
    mpiexec -n N python tests/parallel/elastic_worker.py OUT start dp,zero1,...   # sources "N/dp", ...
    mpiexec -n M python tests/parallel/elastic_worker.py OUT resume B:N-A,N-A/B:N-A   # cells N-A → M-B

The model: x → Linear(6, 8) → GELU → MLP(8 → 16 → 8) → Linear(8, 3), float64, Adam, on 32 fixed samples in
shuffled batches of 8 (4 steps an epoch). A source trains HALF = 3 steps on its layout (it stops inside the
first epoch, so the loader's position matters) and writes the Trainer's consolidated checkpoint
OUT/src-N-A/last.safetensors; a cell loads a source's checkpoint into a fresh run on layout B of M ranks,
trains to STEPS = 6, and rank 0 writes the whole weights it ends with to OUT/cell-N-A-M-B.npz.

Layouts (each a call of minidl.parallel.prepare): ``one`` (no wrapper), ``dp`` (DataParallel), ``zero1``,
``zero2``, ``zero3`` (ZeRO over the data axis), ``tp`` (the middle MLP split over every rank, Megatron's
ParallelMLP), ``pp`` (the four layers cut into one stage per rank, 1F1B in 2 micro-batches).
"""
import os
import sys

import numpy as np

import minidl as mdl
import minidl.functional as F
from minidl import nn, optim, parallel
from minidl.data import DataLoader
from minidl.train import Trainer
from minidl.train.run_state import consolidated_state

HALF, STEPS, BATCH, LR = 3, 6, 8, 0.01
LAYOUTS = ("one", "dp", "zero1", "zero2", "zero3", "tp", "pp")


class MLPBlock(nn.Module):
    """fc → GELU → proj, named as minidl.parallel.ParallelMLP names its split layers."""

    def __init__(self, width, hidden):
        super().__init__()
        self.fc, self.proj = nn.Linear(width, hidden), nn.Linear(hidden, width)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x)))


def data():
    rng = np.random.default_rng(3)
    return rng.normal(size=(32, 6)), rng.integers(0, 3, size=32)


def trainer_for(layout, world):
    """A fresh run of ``layout`` on ``world``: (trainer, whether this rank writes files)."""
    mdl.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.GELU(), MLPBlock(8, 16), nn.Linear(8, 3)).to(dtype=np.float64)
    options = {}
    if layout == "one":
        groups = None
    elif layout in ("dp", "zero1", "zero2", "zero3"):
        groups = parallel.layout(world, data=True)
        options["zero"] = 0 if layout == "dp" else int(layout[-1])
    elif layout == "tp":
        groups = parallel.layout(world, tensor=world.size)
        block = model[2]
        model = nn.Sequential(model[0], model[1], parallel.ParallelMLP.from_layers(block.fc, block.proj, groups.tensor),
                              model[3])
    elif layout == "pp":
        groups = parallel.layout(world, pipeline=world.size)
        options["micro_batches"] = 2
    else:
        raise ValueError(f"elastic_worker: unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
    loader = DataLoader(data(), batch_size=BATCH, shuffle=True, seed=5)
    net, opt, loader = parallel.prepare(model, optim.Adam, loader, groups, lr=LR, **options)
    root = groups is None or groups.is_root
    return Trainer(net, opt, loader, loss_fn=F.cross_entropy, metrics=None, progress=False), root


def barrier(world):
    world.allgather_object(None)


def start(out, layouts, world):
    for layout in layouts:
        trainer, root = trainer_for(layout, world)
        trainer.fit(2, max_steps=HALF)
        folder = os.path.join(out, f"src-{world.size}-{layout}")
        if world.rank == 0:
            os.makedirs(folder, exist_ok=True)
        barrier(world)
        trainer.save_checkpoint(os.path.join(folder, "last.safetensors"), write=world.rank == 0)
        barrier(world)


def resume(out, layout, sources, world):
    for source in sources:  # "N-A"
        trainer, root = trainer_for(layout, world)
        trainer.load_checkpoint(os.path.join(out, f"src-{source}", "last.safetensors"))
        assert trainer.step == HALF, (source, trainer.step)
        try:
            trainer.fit(2, max_steps=STEPS)
        except Exception as exc:  # name the cell: the worker runs many
            raise RuntimeError(f"cell {source} → {world.size}-{layout}, rank {world.rank}: {exc}") from exc
        weights = consolidated_state(trainer.model)  # a collective on a layout
        if world.rank == 0:
            np.savez(os.path.join(out, f"cell-{source}-{world.size}-{layout}.npz"),
                     **{k: np.asarray(v) for k, v in weights.items()}, steps=trainer.step)
        barrier(world)


def straight(out):
    """The uninterrupted one-process run of STEPS steps: OUT/straight.npz."""
    trainer, _ = trainer_for("one", parallel.init())
    trainer.fit(2, max_steps=STEPS)
    np.savez(os.path.join(out, "straight.npz"), **{k: np.asarray(v) for k, v in trainer.model.state_dict().items()},
             steps=trainer.step)


def main(argv):
    out, phase = argv[0], argv[1]
    world = parallel.init()
    if phase == "start":
        start(out, argv[2].split(","), world)
    elif phase == "resume":  # "dp:1-one,4-pp/tp:2-zero3": layout B, then the sources it resumes
        for cells in argv[2].split("/"):
            layout, sources = cells.split(":")
            resume(out, layout, sources.split(","), world)
    elif phase == "straight":
        straight(out)
    else:
        raise ValueError(f"elastic_worker: unknown phase {phase!r}; choose start, resume or straight")


if __name__ == "__main__":
    main(sys.argv[1:])
