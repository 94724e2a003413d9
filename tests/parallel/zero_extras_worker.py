"""Run under mpiexec: loss scaling, early stopping and histograms of ZeRO-1/2/3 runs; each rank saves what it saw.

    mpiexec -n 2 python tests/parallel/zero_extras_worker.py OUT_DIR

Writes OUT_DIR/rank<r>.npz: for each stage S in 1, 2, 3, ``amp<S>/<i>`` (parameter i after a Trainer
run with fp16 loss scaling whose first step overflows), ``early<S>/<i>`` (after a run that early
stopping ended and restored), ``histogram<S>/<name>`` (the weights and gradients a TensorBoard
histogram of the sharded model reads, gathered), and ``facts<S>/<name>`` (the scaler's state, the
step a rank-1 overflow was skipped at, ...). The same functions build the one-process references.
"""
import os
import sys

import numpy as np

import minidl as mdl
from minidl import nn, optim, parallel
from minidl.amp import GradScaler
from minidl.data import DataLoader
from minidl.ops.loss import cross_entropy
from minidl.tensor import Tensor
from minidl.train import Trainer
from minidl.train.callbacks import EarlyStopping
from minidl.train.tensorboard import histogram_values

FEATURES, CLASSES, SAMPLES, BATCH = 8, 4, 64, 16
AMP_SCALE, AMP_BACKOFF, AMP_LR, AMP_CLIP = 2.0 ** 40, 2.0 ** -24, 0.1, 0.5


def make_data(seed: int = 3):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(SAMPLES, FEATURES)).astype(np.float32)
    return x, (x[:, :CLASSES] * rng.normal(size=CLASSES)).argmax(axis=1)  # a learnable rule, with noise below


def make_model(seed: int = 0):
    mdl.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, CLASSES))


def wrap(model, optimizer_class, stage: int, comm, **options):
    """``(model, optimizer)``: the plain pair without ``comm``; with it, data parallel with ZeRO ``stage``."""
    if comm is None:
        return model, optimizer_class(model.parameters(), **options)
    if stage == 1:
        net = parallel.DataParallel(model, comm)
        return net, parallel.DistributedOptimizer(
            parallel.ZeroRedundancyOptimizer(net.parameters(), optimizer_class, comm, **options), net)
    net = parallel.ShardedDataParallel(model, comm, stage=stage)
    return net, parallel.DistributedOptimizer(optimizer_class(net.parameters(), **options), net)


def loader(x, y, comm, shuffle=False):
    data = DataLoader((x, y), batch_size=BATCH, shuffle=shuffle, seed=1)
    return data if comm is None else parallel.shard_loader(data, comm)


def whole_weights(model, net):
    if hasattr(net, "gather_parameters"):
        net.gather_parameters()
    return [mdl.backend.to_numpy(p.array).copy() for p in model.parameters()]


def amp_run(stage: int, comm=None):
    """fp16 with loss scaling and clipping, 4 steps of SGD; the scale starts so high that step 1 overflows
    (and is skipped), then backs off to 2¹⁶ at once."""
    x, y = make_data()
    model = make_model()
    net, opt = wrap(model, optim.SGD, stage, comm, lr=AMP_LR)
    trainer = Trainer(net, opt, loader(x, y, comm), amp="fp16", max_grad_norm=AMP_CLIP, progress=False)
    trainer.scaler.update(new_scale=AMP_SCALE)
    trainer.scaler.set_backoff_factor(AMP_BACKOFF)
    trainer.fit(epochs=1)
    facts = {"scale": trainer.scaler.get_scale(), "skipped_steps": trainer.scaler.skipped_steps,
             "steps": trainer.step}
    return whole_weights(model, net), facts


def overflow_on_one_rank(stage: int, comm):
    """One step in which only rank 1 finds an inf in its part of the gradient: every rank must skip it."""
    x, y = make_data()
    model = make_model()
    net, opt = wrap(model, optim.SGD, stage, comm, lr=AMP_LR)
    before = whole_weights(model, net)
    scaler = GradScaler(init_scale=2.0 ** 8)
    xb, yb = parallel.shard(x[:BATCH], comm.rank, comm.size), parallel.shard(y[:BATCH], comm.rank, comm.size)
    scaler.scale(cross_entropy(net(mdl.tensor(xb)), mdl.tensor(yb))).backward()
    opt.synchronize()
    if comm.rank == 1:  # a part of the gradient only this rank unscales (ZeRO-1: a parameter it owns)
        p = opt.param_groups[0]["params"][0]
        g = mdl.backend.to_numpy(p.grad.array).copy()
        g.reshape(-1)[0] = np.inf
        p.grad = Tensor(g)
    scaler.step(opt)
    scaler.update()
    after = whole_weights(model, net)
    unchanged = all(np.array_equal(a, b) for a, b in zip(before, after))
    return {"rank1_overflow_scale": scaler.get_scale(), "rank1_overflow_skipped": scaler.skipped_steps,
            "rank1_overflow_unchanged": float(unchanged)}


def early_run(stage: int, comm=None, restore: bool = True):
    """Adam with a rate high enough that the validation loss soon rises: early stopping ends the run and
    puts the best weights back (``restore``). Returns the weights, the best step and the stop step."""
    x, y = make_data()
    model = make_model()
    net, opt = wrap(model, optim.Adam, stage, comm, lr=0.05)
    stopper = EarlyStopping(monitor="val_loss", patience=2, restore_best=restore)
    xv, yv = make_data(seed=4)
    trainer = Trainer(net, opt, loader(x, y, comm, shuffle=True), DataLoader((xv[:32], yv[:32]), batch_size=32),
                      callbacks=[stopper], eval_every=2, progress=False, metrics=())
    trainer.fit(epochs=10)
    return whole_weights(model, net), {"best_step": stopper.best_step, "stopped_step": stopper.stopped_step,
                                       "steps": trainer.step}


def histogram_run(stage: int, comm=None):
    """Two steps of Adam, then the weights and probe-batch gradients a histogram of the model reads."""
    x, y = make_data()
    model = make_model()
    net, opt = wrap(model, optim.Adam, stage, comm, lr=0.01)
    trainer = Trainer(net, opt, loader(x, y, comm), progress=False)
    trainer.fit(epochs=1, max_steps=2)
    values = histogram_values(trainer, (x[:BATCH], y[:BATCH]), ("weights", "gradients"))
    return {name: array for name, array in values}


def main():
    out = sys.argv[1]
    comm = parallel.init()
    arrays = {}
    for stage in (1, 2, 3):
        weights, facts = amp_run(stage, comm)
        arrays.update({f"amp{stage}/{i}": w for i, w in enumerate(weights)})
        facts.update(overflow_on_one_rank(stage, comm))
        weights, early = early_run(stage, comm)
        arrays.update({f"early{stage}/{i}": w for i, w in enumerate(weights)})
        facts.update({f"early_{k}": v for k, v in early.items()})
        arrays.update({f"facts{stage}/{k}": np.asarray(v, np.float64) for k, v in facts.items()
                       if v is not None})
        arrays.update({f"histogram{stage}/{k}": v for k, v in histogram_run(stage, comm).items()})
    np.savez(os.path.join(out, f"rank{comm.rank}.npz"), **arrays)


if __name__ == "__main__":
    main()
