"""Run under mpiexec: all-to-all and expert parallelism, in one job; each rank saves what it computed.

    mpiexec -n 4 python tests/parallel/moe_worker.py OUT_DIR

Writes OUT_DIR/rank<r>.npz (``<check>/<name>`` arrays) and OUT_DIR/rank<r>.json (``<check>``: facts).
test_expert_parallel_mpi.py compares them with values computed by hand or by one process training the
plain model (the helpers below, shared by both sides, use nothing from minidl.parallel).
"""
import argparse
import json
import os
import sys

import numpy as np

import minidl as mdl
import minidl.functional as F
from minidl import nn, optim

STEPS, BATCH, ALPHA, LR, CLIP = 3, 16, 0.1, 0.01, 0.2  # CLIP below the first gradient norm (0.35)
# no token dropped (capacity 4·8·k/4 ≥ every expert's load) and dropped tokens (capacity ⌈0.5·T_r·k/4⌉)
CASES = {"top1": {"k": 1, "capacity_factor": 4.0}, "top2": {"k": 2, "capacity_factor": 4.0},
         "top1_drops": {"k": 1, "capacity_factor": 0.5}, "top2_drops": {"k": 2, "capacity_factor": 0.5}}
IN, HIDDEN, OUT, EXPERTS = 8, 5, 4, 4


def make_net(case: str, groups: int = 1) -> nn.Sequential:
    """Linear(6, 8) → MoE(8 → 4, 4 experts) → Linear(4, 3), float64, from seed 0."""
    mdl.manual_seed(0)
    return nn.Sequential(nn.Linear(6, IN), nn.MoE(IN, HIDDEN, OUT, num_experts=EXPERTS, groups=groups, **CASES[case]),
                         nn.Linear(OUT, 3)).to(dtype=np.float64)


def batches():
    rng = np.random.default_rng(5)
    return rng.normal(size=(STEPS, BATCH, 6)), rng.integers(0, 3, size=(STEPS, BATCH))


def loss_fn_for(model):
    """Cross-entropy plus ALPHA times the MoE layer's auxiliary loss of the last forward."""
    layer = model[1] if isinstance(model, nn.Sequential) else model.module[1]
    return lambda out, y: F.cross_entropy(out, y) + ALPHA * layer.aux_loss


def rank_rows(source, dest, shape, dtype):
    """The row rank ``source`` sends rank ``dest``: 100·source + 10·dest + 0, 1, 2, ..."""
    return (100 * source + 10 * dest + np.arange(int(np.prod(shape)))).reshape(shape).astype(dtype)


def v_counts(source, ranks):
    """How many rows rank ``source`` sends each rank in the all_to_all_v check (zeros included)."""
    return [(source + dest) % 3 for dest in range(ranks)]


CHECKS = {}


def check(fn):
    CHECKS[fn.__name__] = fn
    return fn


@check
def exchange(world):
    """all_to_all of three dtypes, all_to_all_v with counts 0, 1, 2; their traffic."""
    from minidl.parallel.expert import all_to_all_v
    arrays, n, r = {}, world.size, world.rank
    world.reset_traffic()
    for dtype in ("float16", "float64", "int32"):
        send = np.stack([rank_rows(r, d, (2, 3), dtype) for d in range(n)])
        arrays[f"block/{dtype}"] = world.all_to_all(send)
    counts = v_counts(r, n)
    send = np.concatenate([np.repeat(rank_rows(r, d, (1, 2), "float32"), c, axis=0) for d, c in enumerate(counts)])
    arrays["v/rows"], recv_counts = world.all_to_all_v(send, counts)
    traffic = dict(world.traffic)
    # the differentiable form: the backward sends each row's gradient home
    x = mdl.tensor(send.astype(np.float64), requires_grad=True)
    y = all_to_all_v(x, world, counts, recv_counts)
    (y * mdl.tensor(np.arange(y.shape[0] * 2, dtype=np.float64).reshape(-1, 2) + 1000 * r)).sum().backward()
    arrays["v/grad"] = x.grad.numpy()
    return arrays, {"recv_counts": recv_counts, "traffic": traffic}


def _first_step(world, case):
    from minidl.parallel.expert import ExpertParallelOptimizer, expert_parallel
    model = expert_parallel(make_net(case), world)
    opt = ExpertParallelOptimizer(optim.SGD(model.parameters(), lr=LR), model)
    world.reset_traffic()
    xs, ys = batches()
    rows = slice(world.rank * BATCH // world.size, (world.rank + 1) * BATCH // world.size)
    out = model(mdl.tensor(xs[0][rows]))
    loss = loss_fn_for(model)(out, ys[0][rows])
    layer = model.module[1]
    facts = {"dropped_here": layer.dropped_tokens, "exchange": layer.last_exchange, "aux": layer.aux_loss.item(),
             "loss": loss.item()}
    loss.backward()
    opt.synchronize()
    facts["dropped_all"] = model.dropped_tokens
    facts["traffic"] = dict(world.traffic)
    arrays = {"out": out.numpy()}
    arrays.update({f"grad/{name}": p.grad.numpy() for name, p in model.named_parameters() if p.grad is not None})
    facts["without_grad"] = [name for name, p in model.named_parameters() if p.grad is None]
    return arrays, facts


def _trained(world, case):
    """STEPS Adam steps through the Trainer (clipping to the global norm CLIP), then the whole states."""
    from minidl.parallel.expert import ExpertParallelOptimizer, expert_parallel
    from minidl.train import Trainer
    model = expert_parallel(make_net(case), world)
    opt = ExpertParallelOptimizer(optim.Adam(model.parameters(), lr=LR), model)
    xs, ys = batches()
    rows = slice(world.rank * BATCH // world.size, (world.rank + 1) * BATCH // world.size)
    loader = [(x[rows], y[rows]) for x, y in zip(xs, ys)]
    trainer = Trainer(model, opt, loader, loss_fn=loss_fn_for(model), max_grad_norm=CLIP, progress=False,
                      metrics=())
    trainer.fit(epochs=1)
    state = model.consolidated_state_dict()
    opt_state = opt.consolidated_state_dict()
    arrays = {f"state/{k}": np.asarray(v) for k, v in state.items()}
    for pos, entry in opt_state["state"].items():
        arrays.update({f"opt/{pos}/{k}": np.asarray(v) for k, v in entry.items() if hasattr(v, "shape")})
    return arrays, {"keys": list(state), "opt_positions": sorted(opt_state["state"]),
                    "train_loss": trainer.history[-1]["train_loss"]}


for _case in CASES:
    CHECKS[f"step_{_case}"] = lambda world, c=_case: _first_step(world, c)
CHECKS["trained_top2"] = lambda world: _trained(world, "top2")
CHECKS["trained_top1_drops"] = lambda world: _trained(world, "top1_drops")


def main():
    from minidl import parallel
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    args = parser.parse_args()
    world = parallel.init()
    arrays, facts = {}, {}
    for name, fn in CHECKS.items():
        got, facts[name] = fn(world)
        arrays.update({f"{name}/{key}": value for key, value in got.items()})
    np.savez(os.path.join(args.out, f"rank{world.rank}.npz"), **arrays)
    with open(os.path.join(args.out, f"rank{world.rank}.json"), "w") as f:
        json.dump(facts, f)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
