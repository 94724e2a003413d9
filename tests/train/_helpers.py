"""A callback shared by the resume tests: a run "killed" at a step, its checkpoint written there."""
from minidl.train import Callback


class StopAt(Callback):
    """Write a checkpoint to ``path`` and stop after optimizer step ``step`` (-1: never stop)."""

    def __init__(self, step, path):
        self.at, self.path = step, path

    def on_step_end(self, trainer, step, logs):
        if step == self.at:
            trainer.save_checkpoint(self.path)
            trainer.stop_training = True
