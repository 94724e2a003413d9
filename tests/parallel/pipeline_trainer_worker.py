"""A GPT run with early stopping, driven by the Trainer: in one process, or under mpiexec on a pipeline.

    mpiexec -n 2 python tests/parallel/pipeline_trainer_worker.py OUT      # 2 stages
    mpiexec -n 4 python tests/parallel/pipeline_trainer_worker.py OUT      # 2 replicas of 2 stages

The layout's rank 0 writes OUT.npz (the whole weights the run ends with, after EarlyStopping put back
its best ones) and OUT.json (the history, where the callback stopped and what it kept).
test_pipeline_trainer.py runs :func:`run` in one process and compares.
"""
import json
import sys

import numpy as np

from minidl.models.gpt_train import DEFAULTS, build_run, lm_loss
from minidl.train import EarlyStopping
from minidl.train.callbacks import Callback
from minidl.train.run_state import consolidated_state

# A tiny GPT, every step validated. min_delta = 1 nat: no validation after the first improves on it by that
# much, so the callback stops the run at step 1 + patience and puts back the weights of step 1, the same
# decision on every layout (a decision near a threshold could flip with the last bits of a loss).
SETTINGS = dict(DEFAULTS, steps=8, n_layer=2, n_head=2, n_embd=16, block_size=16, batch_size=8, eval_every=1,
                clip_norm=0.05, warmup=1, min_lr=3e-3, val_windows=64)
PATIENCE = 2


def run(groups=None):
    """(trainer, the EarlyStopping callback, the whole weights after the run) of the run on ``groups``."""
    built, _ = build_run(SETTINGS, groups, micro_batches=2)
    stop = EarlyStopping(patience=PATIENCE, min_delta=1.0)
    trainer = built.trainer(loss_fn=lm_loss, metrics=None, eval_every=1, callbacks=[stop, Callback()], progress=False)
    trainer.fit(100, max_steps=SETTINGS["steps"])
    return trainer, stop, consolidated_state(trainer.model)  # a collective on a layout: every rank joins


def main(out: str) -> None:
    from minidl import parallel
    world = parallel.init()
    groups = parallel.layout(world, data=world.size > 2, pipeline=2)
    trainer, stop, weights = run(groups)
    if world.rank == 0:
        np.savez(out + ".npz", **{k: np.asarray(v) for k, v in weights.items()})
        with open(out + ".json", "w") as f:
            json.dump({"history": trainer.history, "step": trainer.step, "stopped_step": stop.stopped_step,
                       "best_step": stop.best_step, "replicas": groups.size("data")}, f)


if __name__ == "__main__":
    main(sys.argv[1])
