"""The training loop: ``Trainer`` and ``fit``.

    trainer = Trainer(model, optim.Adam(model.parameters(), lr=1e-3), train_loader, val_loader,
                      scheduler=schedules.cosine_restarts(1e-3, T0=1000), max_grad_norm=1.0,
                      callbacks=[EarlyStopping(patience=5)], seed=0)
    history = trainer.fit(epochs=20)        # a list of records, one per validation
    trainer.evaluate(test_loader)           # {"loss": ..., "accuracy": ..., "f1": ...}

One optimizer step, the textbook's loop with its safety checks::

    for each of k micro-batches (gradient accumulation, k = accumulation_steps):
        x, y   = batch moved to the model's device
        loss   = loss_fn(model(x), y)            (label smoothing passed to the loss)
        stop if loss is NaN or infinite          (before any update: the weights stay good)
        (loss / k).backward()                    gradients add up over the k micro-batches
    clip the gradients (global norm or value)    optional
    optimizer.step(); optimizer.zero_grad(); scheduler.step()

Dividing each micro-batch loss by k makes k micro-batches of b samples give
the gradient of one batch of k*b samples (for a loss that is a mean), at the
memory cost of b. Validation runs every ``eval_every`` steps and at the end of
every epoch; each validation appends a record to ``trainer.history`` and
calls the callbacks. ``trainer.save_checkpoint`` / ``load_checkpoint`` store
and restore the whole run, so a resumed run continues exactly.

Synchronization budget on a GPU: a training step (forward, loss, backward,
clipping, optimizer step, schedule) makes no device-to-host synchronization.
The losses, accuracy counts and gradient norms stay on the device and are
read back together, in one copy, once every ``log_every`` optimizer steps
(and before a validation, a checkpoint and the end of ``fit``); the NaN/inf
check, the per-step curves and ``on_step_end`` happen at that read. On the
CPU a read is free, so each loss is checked before its update, as above.
tests/train/test_device_sync_budget.py holds an MLP and a CNN to this.
"""
from __future__ import annotations

import functools
import inspect
import math
import os
import time

import numpy as np

from minidl import amp as mixed
from minidl import backend
from minidl.autograd import no_grad
from minidl.parallel.protocol import ParallelModule, ParallelOptimizer
from minidl.serialization import is_number, short_repr
from minidl.tensor import Tensor
from minidl.train import run_state
from minidl.train.callbacks import Callback, ModelCheckpoint
from minidl.train.loop_helpers import (
    NON_FINITE_HINT,
    NonFiniteLossError,
    TrainingInterrupted,
    as_scheduler,
    batch_to_tensors,
    check_positive_int,
    default_loss,
    fresh_running,
    is_classification,
    metric_functions,
    needs_create_graph,
    non_finite_error,
    progress_bar,
    seed_everything,
)

__all__ = ["NonFiniteLossError", "Trainer", "TrainingInterrupted", "fit", "seed_everything"]

class Trainer:
    """Train ``model`` with ``optimizer`` on ``train_loader``; validate on ``val_loader``.

    Args:
        model: a Module. Moved to ``device`` when one is given; batches (Tensors
            from the loader, or arrays) are moved to the model's device. A parallel
            scheme's wrapper (a :class:`~minidl.parallel.protocol.ParallelModule`, also
            inside a plain wrapper's ``module``) is driven through the protocol of
            :mod:`minidl.parallel.protocol`: each record's training loss and accuracy
            are summed over its replicas first, so they are the global batch's, as one
            process logs them (a collective at every record; the per-step curve stays
            this rank's); a pipeline runs each batch through its own ``train_step``
            (micro-batches from stage to stage) and validates through ``eval_step``
            (the loss only: its outputs are on its last stage).
        optimizer: anything with ``step()``, ``zero_grad()`` and ``param_groups``
            (``state_dict()``/``load_state_dict()`` for checkpoints). A
            :class:`~minidl.parallel.protocol.ParallelOptimizer` synchronizes the
            gradients before clipping and clips to the whole model's norm.
        train_loader, val_loader: iterables of ``(x, y)`` batches; a
            ``DataLoader`` also resumes mid-epoch from a checkpoint.
        loss_fn: ``loss_fn(outputs, targets)`` returning a scalar Tensor;
            cross-entropy by default.
        metrics: names from ``minidl.train.metrics.METRICS`` ("accuracy",
            "precision", "recall", "f1") or ``{name: fn(y_true, scores)}``;
            computed on validation data. Used only for integer targets.
        scheduler: an ``optim.ScheduleLR`` or ``optim.lr_scheduler`` scheduler, or a schedule ``f(t) -> lr``
            (wrapped in one); stepped after every optimizer step. A scheduler whose
            ``step`` needs a metric (``ReduceLROnPlateau``) is stepped instead at
            every validation, with the record's ``scheduler_monitor`` value.
        scheduler_monitor: the history key given to such a scheduler ("val_loss").
        max_grad_norm, max_grad_value: gradient clipping by global norm, or by value.
        accumulation_steps: micro-batches per optimizer step.
        label_smoothing: passed to the loss (``loss_fn(out, y, label_smoothing=...)``)
            in training; validation loss is computed without it, so it stays the
            plain cross-entropy and comparable between runs.
        eval_every: validate every this many optimizer steps (and at every epoch end).
        callbacks: ``Callback`` objects (early stopping, checkpoints, loggers).
        seed: seeds every random source now (see :func:`seed_everything`).
        progress: show a tqdm progress bar with ``mean train_loss``, the last validation metric (with the
            epoch it was measured after) and lr.
            The bar's loss is the running mean over the samples seen since the last record (the epoch
            so far, unless ``eval_every`` records more often); when the epoch ends it equals the
            ``train_loss`` of the record that ``history`` and ``metrics.jsonl`` get. The loss of each
            single step is in ``trainer.steps["loss"]`` (the faint curve of ``curves.png``).
        create_graph: backward with ``create_graph=True`` (AdaHessian needs it;
            None: on for AdaHessian, off otherwise).
        amp: mixed precision, "fp16" (autocast to float16 with a ``GradScaler``;
            a step the scaler skips for inf/NaN gradients is not a divergence) or
            "bf16" (autocast to bfloat16, no scaler needed); None: float32.
            ``trainer.scaler`` is the scaler (checkpointed with the run).
        log_every: on a GPU, read the losses back every this many optimizer
            steps (one synchronization each time; see the module docstring).
    """

    def __init__(self, model, optimizer, train_loader, val_loader=None, *, loss_fn=None,
                 metrics=("accuracy",), scheduler=None, device=None, max_grad_norm=None,
                 max_grad_value=None, accumulation_steps: int = 1, label_smoothing: float = 0.0,
                 eval_every: int | None = None, callbacks=(), seed: int | None = None,
                 progress: bool = True, create_graph: bool | None = None, amp: str | None = None,
                 log_every: int = 10, scheduler_monitor: str = "val_loss"):
        if amp not in (None, "fp16", "bf16"):
            raise ValueError(f"Trainer: amp must be None, 'fp16' or 'bf16', got {amp!r}")
        if seed is not None:
            seed_everything(seed)
        check_positive_int(accumulation_steps, "accumulation_steps")
        check_positive_int(log_every, "log_every")
        if eval_every is not None:
            check_positive_int(eval_every, "eval_every")
        for name, value in (("max_grad_norm", max_grad_norm), ("max_grad_value", max_grad_value)):
            if value is not None and not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"Trainer: {name} must be a positive number or None, got {value!r}")
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"Trainer: label_smoothing must be in [0, 1), got {label_smoothing}")
        for name in ("step", "zero_grad"):
            if not callable(getattr(optimizer, name, None)):
                raise TypeError(f"Trainer: optimizer must have {name}(), got {type(optimizer).__name__}")
        bad = [c for c in callbacks if not isinstance(c, Callback)]
        if bad:
            raise TypeError(f"Trainer: callbacks must be Callback instances, got {type(bad[0]).__name__}")
        if device is not None:
            model.to(device)
        self.model, self.optimizer = model, optimizer
        self.train_loader, self.val_loader = train_loader, val_loader
        self.loss_fn = loss_fn if loss_fn is not None else default_loss
        self.metrics = metric_functions(metrics)
        self.scheduler = as_scheduler(scheduler, optimizer)
        self.scheduler_monitor = scheduler_monitor
        self._metric_scheduler = _takes_metric(self.scheduler)
        if self._metric_scheduler and scheduler_monitor.startswith("val_") and val_loader is None:
            raise ValueError(f"Trainer: {type(self.scheduler).__name__} steps on {scheduler_monitor!r}, "
                             "which needs a val_loader (or pass scheduler_monitor='train_loss')")
        self.max_grad_norm, self.max_grad_value = max_grad_norm, max_grad_value
        self.accumulation_steps, self.label_smoothing = int(accumulation_steps), float(label_smoothing)
        self.eval_every, self.callbacks, self.progress = eval_every, list(callbacks), progress
        self.create_graph = needs_create_graph(optimizer) if create_graph is None else bool(create_graph)
        # Position and records of the run; all of it goes into a checkpoint.
        self.step = 0            # optimizer steps taken
        self.epoch = 0           # epochs completed
        self._batches_in_epoch = 0  # micro-batches of the current epoch trained on
        self.history: list[dict] = []                       # one record per validation
        self.steps = {"step": [], "loss": [], "lr": []}     # one entry per optimizer step (for curves)
        self._running = fresh_running()                    # sums since the last record
        self._elapsed = 0.0
        self._clock = None       # perf_counter() at the (virtual) start of the run, while fit runs
        self.stop_training = False
        self.completed = False
        self.extra = None        # anything JSON-like the caller wants in every checkpoint (run settings)
        self.last_checkpoint = None  # (path, step) of the last checkpoint written or resumed from (Ctrl-C says it)
        self.amp = amp           # mixed precision: the forward under autocast, the fp16 loss scaled
        self.scaler = mixed.GradScaler(enabled=amp == "fp16")
        self.log_every = int(log_every)
        self._unread = []        # steps whose numbers are still on the GPU: (step, lr, micro-batches, norm)
        self._micro = []         # this step's micro-batches so far: (loss, samples, correct or None)
        self._bind_protocol(model, optimizer)

    def _bind_protocol(self, model, optimizer) -> None:
        """The methods of minidl.parallel.protocol this loop calls, looked up once (None: the plain step)."""
        wrapper = model
        while wrapper is not None and not isinstance(wrapper, ParallelModule):
            wrapper = getattr(wrapper, "module", None)  # a plain wrapper around a parallel one
        parallel_opt = optimizer if isinstance(optimizer, ParallelOptimizer) else None
        self._synchronize = parallel_opt.synchronize if parallel_opt is not None else None
        self._global_clip = parallel_opt.clip_grad_norm_ if parallel_opt is not None else None
        self._probe = optimizer.probe if parallel_opt is None and callable(getattr(optimizer, "probe", None)) \
            else None  # AdaHessian's Hessian probe (a wrapper probes inside synchronize)
        self._sum_over_replicas = wrapper.sum_over_replicas if wrapper is not None else None
        own = wrapper is not None and wrapper.runs_own_step
        self._train_step = wrapper.train_step if own else None
        self._eval_step = wrapper.eval_step if own else None
        if own and self.create_graph:
            raise ValueError(f"Trainer: {type(optimizer).__name__} differentiates the gradients again (create_graph), "
                             f"which needs one graph through the whole model; {type(wrapper).__name__} runs "
                             "backward stage by stage and keeps no graph of the gradients; use an optimizer "
                             "of first derivatives (AdamW, SGD...)")
        self._train_loss = functools.partial(self._loss, smoothing=self.label_smoothing)
        self._val_loss = functools.partial(self._loss, smoothing=0.0)
        device = next((p.device for p in model.parameters()), "cpu")
        self._autocast = functools.partial(mixed.autocast, device.partition(":")[0], dtype=self.amp) \
            if self.amp is not None else None

    # ------------------------------------------------------------ the loop
    @property
    def device(self) -> str:
        for p in self.model.parameters():
            return p.device
        return "cpu"

    @property
    def lr(self) -> float:
        groups = getattr(self.optimizer, "param_groups", None)
        return float(groups[0]["lr"]) if groups else float("nan")

    def fit(self, epochs: int, max_steps: int | None = None) -> list[dict]:
        """Train until ``epochs`` epochs are complete (counting those of a resumed run).

        ``max_steps`` stops after that many optimizer steps in all (mid-epoch
        if need be; the run can be resumed from a checkpoint). Returns ``history``.
        """
        with backend.using(self.device):  # CuPy runs kernels on the current GPU: the model's (cuda:1 too)
            return self._fit(epochs, max_steps)

    def _fit(self, epochs: int, max_steps: int | None) -> list[dict]:
        check_positive_int(epochs, "epochs", allow_zero=True)
        if max_steps is not None:
            check_positive_int(max_steps, "max_steps", allow_zero=True)
        self.stop_training, self.completed = False, False
        if callable(getattr(self.train_loader, "load_state_dict", None)):
            # Continue from the loader's own position (mid-epoch after a stop or a resume).
            self.train_loader.load_state_dict(self.train_loader.state_dict())
        start = time.perf_counter() - self._elapsed
        self._clock = start
        self._call("on_train_begin")
        if self._epoch_batches_done():  # resumed from a checkpoint taken after an epoch's last step
            self._end_epoch()
        try:
            while self.epoch < epochs and not self.stop_training:
                self._call("on_epoch_begin", self.epoch)
                if not self._run_epoch(epochs, max_steps):
                    break
                self._end_epoch()
                if max_steps is not None and self.step >= max_steps:
                    break
        except KeyboardInterrupt:
            # Ctrl-C may land mid-step (gradients half accumulated), so nothing is saved here: the last
            # checkpoint is a step boundary, and the message says where it is.
            self._clock = None
            path, step = self.last_checkpoint or (None, None)
            raise TrainingInterrupted(self.step, path, step) from None
        self._read_back()
        self.completed = self.epoch >= epochs
        self._elapsed = time.perf_counter() - start
        self._clock = None
        # Checkpoints first: "last" must hold the weights the run ended with, before
        # EarlyStopping's on_train_end puts the best ones back.
        ordered = sorted(self.callbacks, key=lambda c: not isinstance(c, ModelCheckpoint))
        for cb in ordered:
            cb.on_train_end(self)
        return self.history

    def _run_epoch(self, epochs: int, max_steps: int | None) -> bool:
        """One pass over the training loader; False when the run was stopped mid-epoch."""
        self.model.train()
        bar = self._progress_bar(epochs)
        k, pending = self.accumulation_steps, 0
        try:
            for batch in self.train_loader:
                self._micro_batch(batch, k)
                pending += 1
                if bar is not None:
                    bar.update(1)
                if pending == k:
                    self._optimizer_step(pending)
                    pending = 0
                    if bar is not None and self.step % 5 == 0:
                        bar.set_postfix_str(self._postfix(), refresh=False)
                    if self.stop_training or (max_steps is not None and self.step >= max_steps):
                        return self._epoch_batches_done()
            if pending:  # an epoch that does not divide into k micro-batches ends with a shorter step
                self._optimizer_step(pending)
            return not self.stop_training
        finally:
            if bar is not None:
                bar.set_postfix_str(self._postfix(), refresh=False)
                bar.close()

    def _epoch_batches_done(self) -> bool:
        """Has every batch of the current epoch been trained on (its end not yet processed)?"""
        try:
            n = len(self.train_loader)
        except TypeError:
            return False
        return n > 0 and self._batches_in_epoch >= n

    def _end_epoch(self) -> None:
        self.epoch += 1
        self._batches_in_epoch = 0
        if not self.history or self.history[-1]["step"] != self.step:
            self._record(epoch=float(self.epoch))
        self._call("on_epoch_end", self.epoch - 1, self.history[-1])

    def _micro_batch(self, batch, k: int) -> None:
        x, y = self._to_device(batch)
        if self._train_step is not None:  # a pipeline: forward and backward inside, micro-batch by micro-batch
            scale = self.scaler.get_scale() * (1.0 / k) if (k > 1 or self.scaler.is_enabled()) else 1.0
            value = self._train_step(x, y, self._train_loss, loss_scale=scale, autocast=self._autocast)
            if isinstance(value, float) and not math.isfinite(value):  # on the host: stop before the update
                self._stop_non_finite("loss", value)
            self._batches_in_epoch += 1
            self._micro.append((value, len(y), None))
            return
        with mixed.autocast(self.device.partition(":")[0], dtype=self.amp, enabled=self.amp is not None):
            out = self.model(x)
            loss = self._loss(out, y, smoothing=self.label_smoothing)
        if loss.xp is np:  # a free read on the host: stop before the update, weights intact
            value = float(loss.item())
            if not math.isfinite(value):
                self._stop_non_finite("loss", value)
        else:  # on a GPU the value stays there until the next log read
            value = loss.array
        self.scaler.scale(loss * (1.0 / k) if k > 1 else loss).backward(create_graph=self.create_graph)
        self._batches_in_epoch += 1
        correct = (out.array.argmax(axis=1) == y.array).sum() if is_classification(y, out) else None
        if correct is not None and isinstance(value, float):  # on the host: a number now, as the loss
            correct = int(correct)
        self._micro.append((value, len(y), correct))

    def _optimizer_step(self, micro_batches: int) -> None:
        if self._synchronize is not None:  # parallel: one gradient for the batch first, so clipping sees it
            self._synchronize()
        elif self._probe is not None:
            # AdaHessian: D from the gradients' graph now, before a rescale, the scaler's unscale or a clip
            # replaces them with new arrays (as PyTorch's in-place changes leave its graph unaware of them;
            # data parallelism probes inside synchronize, before the all-reduce)
            self._probe([p for g in self._param_groups() for p in g["params"]
                         if p.grad is not None and p.requires_grad])
        params = [p for g in self._param_groups() for p in g["params"] if p.grad is not None]
        if micro_batches < self.accumulation_steps:
            # Gradients were scaled by 1/k; a shorter last group of m micro-batches needs k/m more.
            scale = self.accumulation_steps / micro_batches
            for p in params:
                p.grad = Tensor(p.grad.array * scale)
        self.scaler.unscale_(self.optimizer)  # the true gradients, for clipping (nothing without a scaler)
        self._call("on_before_optimizer_step", params)
        if self.max_grad_value is not None:
            from minidl.optim import clip_grad_value_
            clip_grad_value_(params, self.max_grad_value)
        norm = None
        if self.max_grad_norm is not None:
            if self._global_clip is not None:  # parallel: the whole gradient's norm, its pieces perhaps elsewhere
                norm = self._global_clip(self.max_grad_norm)
            else:
                from minidl.optim import clip_grad_norm_
                norm = clip_grad_norm_(params, self.max_grad_norm).array
            if isinstance(norm, float) or backend.xp_of(norm) is np:
                norm = float(norm)
                if not math.isfinite(norm) and not self.scaler.is_enabled():  # with a scaler: a skipped step
                    self._stop_non_finite("gradient norm", norm)
        lr = self.lr
        self.scaler.step(self.optimizer)  # optimizer.step(), unless the scaler found inf/NaN gradients
        self.scaler.update()
        self.optimizer.zero_grad()
        if self.scheduler is not None and not self._metric_scheduler:
            self.scheduler.step()
        self.step += 1
        self._unread.append((self.step, lr, self._micro, norm))
        self._micro = []
        on_host = all(isinstance(v, float) for v, _, _ in self._unread[-1][2])
        if on_host or self.step % self.log_every == 0:
            self._read_back()
        if self.eval_every is not None and self.step % self.eval_every == 0:
            self._record()

    def _read_back(self) -> None:
        """Bring the numbers of the unread steps to the host (one copy), check them, log them in order."""
        if not self._unread:
            return
        unread, self._unread = self._unread, []
        arrays = [v for _, _, micro, norm in unread for m in micro for v in (m[0], m[2])
                  if v is not None and not isinstance(v, (float, int))]
        arrays += [norm for _, _, _, norm in unread if norm is not None and not isinstance(norm, float)]
        values = iter([float(v) for v in backend.fetch(*arrays)] if arrays else [])
        host = lambda v: v if v is None or isinstance(v, (float, int)) else next(values)  # noqa: E731
        steps = [(step, lr, [(host(loss), n, host(correct)) for loss, n, correct in micro], norm)
                 for step, lr, micro, norm in unread]
        steps = [(step, lr, micro, host(norm)) for step, lr, micro, norm in steps]
        r = self._running
        for step, lr, micro, norm in steps:
            for value, n, correct in micro:
                if not math.isfinite(value):
                    self._stop_non_finite_late("loss", value, step)
                r["loss"] += value * n
                r["count"] += n
                r["batch_loss"] += value
                r["batches"] += 1
                if correct is not None:
                    r["correct"] += int(correct)
                    r["classified"] += n
            if norm is not None and not math.isfinite(norm) and not self.scaler.is_enabled():
                self._stop_non_finite_late("gradient norm", norm, step)
            step_loss = r["batch_loss"] / max(r["batches"], 1)
            r["batch_loss"], r["batches"] = 0.0, 0
            self.steps["step"].append(step)
            self.steps["loss"].append(step_loss)
            self.steps["lr"].append(lr)
            self._call("on_step_end", step, {"step": step, "loss": step_loss, "lr": lr})

    def _stop_non_finite_late(self, what: str, value: float, step: int):
        """A NaN/inf found at a GPU log read: the updates after it were applied; say so, and stop."""
        self.optimizer.zero_grad()
        self.model.zero_grad()
        raise NonFiniteLossError(
            f"training stopped: the {what} is {value} at step {step} (epoch {self.epoch + 1}), learning rate "
            f"{self.lr:g}, found at the GPU log read after step {self.step} (log_every={self.log_every}): the "
            f"weights hold the updates up to step {self.step}; resume from a checkpoint taken before step {step}. "
            + NON_FINITE_HINT, step=step, loss=value)

    def _stop_non_finite(self, what: str, value: float):
        """Drop the partial gradients (the weights stay those of the last good step) and stop."""
        self.optimizer.zero_grad()
        self.model.zero_grad()
        best = next((cb for cb in self.callbacks if isinstance(cb, ModelCheckpoint) and cb.best_step is not None),
                    None)
        raise non_finite_error(what, value, self.step + 1, self.epoch, self.lr, best)

    # ------------------------------------------------------------ records and validation
    def validate(self) -> dict:
        """Validate now, as an ``eval_every`` step does: append a history record, call ``on_evaluate``.

        For a run that stops between validations (``fit(max_steps=...)``) and must still log and
        checkpoint where it ended. Returns the record.
        """
        if self._clock is not None:  # inside fit (a callback asking for a validation)
            return self._record()
        self._clock = time.perf_counter() - self._elapsed  # the record's time counts the fits so far
        try:
            return self._record()
        finally:
            self._clock = None

    def _record(self, epoch: float | None = None) -> dict:
        """Close the running training averages, validate, append a history record, call on_evaluate."""
        self._read_back()
        r = self._running
        epoch = self._epoch_progress() if epoch is None else epoch
        record = {"step": self.step, "epoch": round(epoch, 4)}
        loss, count, correct, classified = self._over_replicas([r["loss"], r["count"], r["correct"],
                                                                r["classified"]])
        if count:
            record["train_loss"] = loss / count
        if classified:
            record["train_accuracy"] = correct / classified
        record["lr"] = self._last_lr()
        if self.scaler.is_enabled():  # the loss scale and the steps skipped so far
            record["amp_scale"], record["skipped_steps"] = self.scaler.get_scale(), self.scaler.skipped_steps
        if self.val_loader is not None:
            for name, value in self.evaluate(self.val_loader).items():
                record[f"val_{name}"] = value
        record["time"] = round(time.perf_counter() - self._clock, 3)
        self._running = fresh_running()
        self.history.append(record)
        if self._metric_scheduler:  # ReduceLROnPlateau: step(metric) once per validation
            if self.scheduler_monitor not in record:
                raise ValueError(f"Trainer: scheduler_monitor {self.scheduler_monitor!r} is not in the record "
                                 f"(it has {sorted(record)})")
            self.scheduler.step(record[self.scheduler_monitor])
        self._call("on_evaluate", record)
        return record

    def _over_replicas(self, sums: list) -> list:
        """``sums`` added over the replicas of a data-parallel model (see the class docstring), else as they are."""
        if self._sum_over_replicas is None:
            return sums
        return [float(v) for v in self._sum_over_replicas(np.array(sums, dtype=np.float64))]

    def _epoch_progress(self) -> float:
        """Completed epochs plus the fraction of the current one (from the loader's position)."""
        state = getattr(self.train_loader, "state_dict", None)
        try:
            n = len(self.train_loader)
        except TypeError:
            return float(self.epoch)
        if state is None or n == 0:
            return float(self.epoch)
        return self.epoch + min(state()["batch"], n) / n

    def evaluate(self, loader) -> dict:
        """Mean loss and every metric over ``loader`` in eval mode, without gradients.

        The loss is the plain loss (no label smoothing). Metrics need integer
        targets and 2-D outputs (class scores); otherwise only the loss is returned.
        """
        was_training = self.model.training
        self.model.eval()
        total, count, outputs, targets, losses = 0.0, 0, [], [], []
        try:
            with no_grad():
                for batch in loader:
                    x, y = self._to_device(batch)
                    count += len(y)
                    if self._eval_step is not None:  # a pipeline: the loss from its last stage, shared
                        losses.append((np.asarray(self._eval_step(x, y, self._val_loss)), len(y)))
                        continue
                    out = self.model(x)
                    losses.append((self._val_loss(out, y).array, len(y)))  # read once, at the end
                    if self.metrics and is_classification(y, out):
                        outputs.append(backend.to_numpy(out.array))
                        targets.append(backend.to_numpy(y.array))
        finally:
            self.model.train(was_training)
        if count == 0:
            raise ValueError("Trainer.evaluate: the loader yielded no samples")
        for value, n in zip(backend.fetch(*[v for v, _ in losses]), [n for _, n in losses]):
            total += float(value) * n
        result = {"loss": total / count}
        if outputs:
            scores, labels = np.concatenate(outputs), np.concatenate(targets)
            for name, fn in self.metrics.items():
                result[name] = float(fn(labels, scores))
        return result

    def predict(self, loader) -> np.ndarray:
        """The model's outputs for every batch of ``loader`` (eval mode, NumPy, concatenated)."""
        if self._eval_step is not None:
            raise ValueError(f"Trainer.predict: {type(self.model).__name__} runs its own steps, and its outputs "
                             "exist on its last stage only; save the run and predict with the whole model in "
                             "one process (the checkpoint holds its whole weights)")
        was_training = self.model.training
        self.model.eval()
        try:
            with no_grad():
                outs = [backend.to_numpy(self.model(self._to_device(b)[0]).array) for b in loader]
        finally:
            self.model.train(was_training)
        return np.concatenate(outs)

    # ------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """The loop's own state: counters, records, running sums and every callback's state.

        The per-step curves are arrays, so a long run's checkpoint header stays small.
        """
        self._read_back()
        return {"step": self.step, "epoch": self.epoch, "batches_in_epoch": self._batches_in_epoch,
                "history": [dict(r) for r in self.history],
                "steps": {"step": np.asarray(self.steps["step"], dtype=np.int64),
                          "loss": np.asarray(self.steps["loss"], dtype=np.float64),
                          "lr": np.asarray(self.steps["lr"], dtype=np.float64)},
                "running": dict(self._running),
                "elapsed": self._elapsed if self._clock is None else time.perf_counter() - self._clock,
                "callbacks": [cb.state_dict() for cb in self.callbacks], "scaler": self.scaler.state_dict()}

    def check_state_dict(self, state) -> None:
        """Raise ValueError saying what is wrong when ``load_state_dict(state)`` would fail; change nothing."""
        self._checked_state(state)

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned; all or nothing.

        Everything is checked first; callbacks that cannot be checked ahead (a
        custom ``load_state_dict`` without its own ``check_state_dict``) are
        loaded first and put back from a snapshot if one of them fails.
        """
        values = self._checked_state(state)
        pairs = list(zip(self.callbacks, values["callbacks"]))
        done = []
        try:
            for cb, cb_state in pairs:
                if run_state.own_check(cb) is None:
                    done.append((cb, cb.state_dict()))  # before the load: a failing load may change it half-way
                    cb.load_state_dict(cb_state)
        except BaseException:
            for cb, snapshot in reversed(done):
                cb.load_state_dict(snapshot)
            raise
        for cb, cb_state in pairs:
            if run_state.own_check(cb) is not None:
                cb.load_state_dict(cb_state)
        self.step, self.epoch, self._batches_in_epoch = values["step"], values["epoch"], values["batches_in_epoch"]
        self.history, self.steps = values["history"], values["steps"]
        self._running, self._elapsed = values["running"], values["elapsed"]
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])

    def _checked_state(self, state) -> dict:
        owner = "Trainer.load_state_dict"

        def fail(message):
            raise ValueError(f"{owner}: {message}")

        if not isinstance(state, dict):
            fail(f"expected the dict Trainer.state_dict() returns, got {type(state).__name__}")
        required = {"step", "epoch", "history", "steps", "running"}
        allowed = required | {"batches_in_epoch", "elapsed", "callbacks", "scaler"}
        if not required <= set(state) <= allowed:
            fail(f"the state has the keys {sorted(map(str, state))}: missing {sorted(required - set(state))}, "
                 f"unexpected {sorted(map(str, set(state) - allowed))}")
        out = {}
        for key in ("step", "epoch", "batches_in_epoch"):
            out[key] = _count(state.get(key, 0), key, fail)
        history = state["history"]
        if not isinstance(history, list) or not all(isinstance(r, dict) for r in history):
            fail("history must be a list of records (dicts)")
        for i, record in enumerate(history):
            if not all(isinstance(k, str) and is_number(v) for k, v in record.items()) or "step" not in record:
                fail(f"history record {i} must map names to numbers and hold a step, got {short_repr(record)}")
            _count(record["step"], f"history record {i}'s step", fail)
        out["history"] = [dict(r) for r in history]
        steps = state["steps"]
        if not isinstance(steps, dict) or set(steps) != {"step", "loss", "lr"}:
            fail(f"steps must be a dict of the curves 'step', 'loss' and 'lr', got {short_repr(steps)}")
        out["steps"] = {k: _numbers(v, f"steps[{k!r}]", fail) for k, v in steps.items()}
        if len({len(v) for v in out["steps"].values()}) != 1:
            fail("the curves in steps must have one entry per step each (their lengths differ)")
        if not all(isinstance(t, int) for t in out["steps"]["step"]):
            fail("steps['step'] must hold whole step numbers")
        running = state["running"]
        defaults = fresh_running()
        if not isinstance(running, dict) or not set(running) <= set(defaults) or not all(
                is_number(v) and math.isfinite(v) for v in running.values()):
            fail(f"running must map {sorted(defaults)} to finite numbers, got {short_repr(running)}")
        out["running"] = {**defaults, **running}
        elapsed = state.get("elapsed", 0.0)
        if not (is_number(elapsed) and math.isfinite(elapsed) and elapsed >= 0):
            fail(f"elapsed must be a number of seconds ≥ 0, got {short_repr(elapsed)}")
        out["elapsed"] = float(elapsed)
        saved = state.get("callbacks", [])
        if not isinstance(saved, list) or len(saved) != len(self.callbacks):
            count = len(saved) if isinstance(saved, list) else short_repr(saved)
            fail(f"the checkpoint has {count} callback states but this trainer has {len(self.callbacks)} "
                 "callbacks; resume with the same callbacks")
        for i, (cb, cb_state) in enumerate(zip(self.callbacks, saved)):
            check = run_state.own_check(cb)
            if check is not None:
                try:
                    check(cb_state, trainer=self)
                except ValueError as exc:
                    fail(f"callback {i} ({type(cb).__name__}): {exc}")
        out["callbacks"] = saved
        return out

    def save_checkpoint(self, path, extra=None, write: bool = True) -> None:
        """Write model, optimizer, schedule, loader position, RNG states and this loop's state atomically.

        In a sharded run (ZeRO) the state is gathered from every rank, so every rank calls this;
        ``write=False`` takes part without writing (ranks other than 0).
        """
        run_state.save_checkpoint(path, self.model, self.optimizer, self.scheduler, self.train_loader,
                                  self.state_dict(), extra=self.extra if extra is None else extra, write=write)
        if write:
            self.last_checkpoint = (os.fspath(path), self.step)

    def load_checkpoint(self, path) -> dict:
        """Restore everything :meth:`save_checkpoint` wrote; the next ``fit`` continues the run exactly.

        All or nothing: a damaged or mismatched part raises ``CheckpointError``
        naming it, and model, optimizer, schedule, loader, random states and
        this loop are left as they were.
        """
        restored = run_state.load_checkpoint(path, self.model, self.optimizer, self.scheduler, self.train_loader,
                                             trainer=self)
        self.last_checkpoint = (os.fspath(path), self.step)
        return restored

    # ------------------------------------------------------------ helpers
    def _param_groups(self):
        groups = getattr(self.optimizer, "param_groups", None)
        if groups is None:
            return [{"params": list(self.model.parameters())}]
        return groups

    def _loss(self, out, y, smoothing: float):
        if smoothing:
            return self.loss_fn(out, y, label_smoothing=smoothing)
        return self.loss_fn(out, y)

    def _to_device(self, batch):
        return batch_to_tensors(batch, self.device, self._param_dtype())

    def _param_dtype(self):
        for p in self.model.parameters():
            return p.dtype
        return None

    def _progress_bar(self, epochs: int):
        return progress_bar(self.train_loader, self.epoch, epochs) if self.progress else None

    def _postfix(self) -> str:
        parts = []
        r = self._running
        if r["count"]:  # the same running mean the next record logs as train_loss
            parts.append(f"mean train_loss={r['loss'] / r['count']:.4f}")
        if self.history:
            last = self.history[-1]
            metric = next((k for k in last if k.startswith("val_") and k != "val_loss"), "val_loss")
            if metric in last:  # from the last validation: say when it was (the bar is an epoch further on)
                parts.append(f"{metric} after epoch {last['epoch']:g}={last[metric]:.4f}")
        parts.append(f"lr={self._last_lr():.3g}")
        if self.scaler.is_enabled():
            parts.append(f"scale={self.scaler.get_scale():g}, skipped={self.scaler.skipped_steps}")
        return ", ".join(parts)

    def _last_lr(self) -> float:
        """The learning rate of the last step taken (the schedule has already moved on to the next)."""
        return self.steps["lr"][-1] if self.steps["lr"] else self.lr

    def _call(self, hook: str, *args) -> None:
        for cb in self.callbacks:
            getattr(cb, hook)(self, *args)


def _takes_metric(scheduler) -> bool:
    """Does ``scheduler.step`` need an argument (the metric of ReduceLROnPlateau's ``step(metrics)``)?"""
    if scheduler is None:
        return False
    try:
        parameters = inspect.signature(scheduler.step).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in parameters)


def _count(value, name: str, fail) -> int:
    if not (isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) and 0 <= value < 2**63):
        fail(f"{name} must be a whole number from 0 to 2**63 - 1, got {short_repr(value)}")
    return int(value)


def _numbers(values, name: str, fail) -> list:
    """A curve as a list of Python numbers, from a 1-D array or a list of numbers."""
    if hasattr(values, "dtype") and hasattr(values, "shape"):
        if len(values.shape) != 1 or np.dtype(values.dtype).kind not in "iuf":
            fail(f"{name} must be a 1-D array of numbers, got shape {tuple(values.shape)} and dtype {values.dtype}")
        return backend.to_numpy(values).tolist()
    if not isinstance(values, list) or not all(is_number(v) for v in values):
        fail(f"{name} must be a list of numbers, got {short_repr(values)}")
    return list(values)


def fit(model, optimizer, train_loader, val_loader=None, epochs: int = 1, **options) -> Trainer:
    """Build a :class:`Trainer` with ``options``, train for ``epochs`` and return the trainer."""
    max_steps = options.pop("max_steps", None)
    trainer = Trainer(model, optimizer, train_loader, val_loader, **options)
    trainer.fit(epochs, max_steps=max_steps)
    return trainer


