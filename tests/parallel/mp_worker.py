"""Run under mpiexec: every model-parallel check, in one job; each rank saves what it computed.

    mpiexec -n 4 python tests/parallel/mp_worker.py OUT_DIR [--only groups p2p ...]

Writes OUT_DIR/rank<r>.npz (``<check>/<name>`` arrays) and OUT_DIR/rank<r>.json
(``<check>``: facts). test_model_parallel.py compares them with values computed
without minidl.parallel. One launch runs every check: on 2 cores starting
ranks costs more than the checks themselves.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mp_scenarios  # noqa: E402
import numpy as np  # noqa: E402

from minidl import parallel  # noqa: E402
from minidl.parallel.tensor_parallel import consolidated_state_dict, tensor_parallel_layers  # noqa: E402

CHECKS = {}


def check(fn):
    CHECKS[fn.__name__] = fn
    return fn


def mesh_for(world):
    """The 2-D mesh of the tests: data × tensor = 1 × 2 on 2 ranks, 2 × 2 on 4."""
    return parallel.Mesh(world, data=world.size // 2, tensor=2)


def rank_values(rank, dtype="float64"):
    """What rank r contributes to a collective: (r + 1) · [1, 2, 3, 4, 5]."""
    return (rank + 1) * np.arange(1, 6, dtype=dtype)


@check
def groups(world):
    """Every axis's group: its size and rank, and the results of its collectives."""
    mesh = mesh_for(world)
    arrays, facts = {}, {"coordinates": mesh.coordinates, "members": mesh.members}
    for name in mesh.sizes:
        group = mesh.group(name)
        facts[name] = {"rank": group.rank, "size": group.size, "backend": group.name}
        arrays[f"{name}/allreduce"] = group.allreduce_(rank_values(world.rank))
        arrays[f"{name}/allgather"] = group.allgather(rank_values(world.rank, "float32"))
        arrays[f"{name}/broadcast"] = group.broadcast_(rank_values(world.rank), root=group.size - 1)
        facts[name]["gathered"] = group.gather_object(world.rank, root=group.size - 1)
    return arrays, facts


def message(source, shape, dtype):
    """The message rank ``source`` sends: 10·source + 0, 1, 2, ... in ``shape`` and ``dtype``."""
    return (10 * source + np.arange(int(np.prod(shape)))).reshape(shape).astype(dtype)


P2P_MESSAGES = [((5,), "float64"), ((2, 3), "float16"), ((4,), "int32"), ((3, 2), "float32")]


@check
def p2p(world):
    """A ring on the world (r → r+1), then one message inside each tensor group (its rank 0 → its rank 1)."""
    arrays = {}
    right, left = (world.rank + 1) % world.size, (world.rank - 1) % world.size
    for index, (shape, dtype) in enumerate(P2P_MESSAGES):
        got = np.zeros(shape, dtype)
        if world.rank % 2 == 0:  # even ranks send first, odd ranks receive first: no two ranks wait on each other
            world.send(message(world.rank, shape, dtype), right)
            world.recv_(got, left)
        else:
            world.recv_(got, left)
            world.send(message(world.rank, shape, dtype), right)
        arrays[f"ring/{index}"] = got
    tensor = mesh_for(world).group("tensor")
    if tensor.rank == 0:
        tensor.send(message(world.rank, (3,), "float64"), 1)
    else:
        arrays["group"] = tensor.recv_(np.zeros(3), 0)
    return arrays, {}



RING_LENGTHS = (12, 7, 3)  # divides by 2 and 4 ranks; does not; fewer elements than 4 ranks (empty chunks)


def ring_values(rank, n):
    """What rank r hands the ring all-reduce: n float64 values drawn from seed 100·r + n."""
    return np.random.default_rng(100 * rank + n).standard_normal(n)


@check
def ring(world):
    """The hand-written ring all-reduce on the world and inside each tensor group; the bytes the world's sent."""
    from minidl.parallel.ring import ring_allreduce_
    arrays, facts = {}, {}
    for n in RING_LENGTHS:
        world.reset_traffic()
        arrays[f"world/{n}"] = ring_allreduce_(world, ring_values(world.rank, n))
        facts[f"sent/{n}"] = world.traffic.get("send", 0)
        arrays[f"tensor/{n}"] = ring_allreduce_(mesh_for(world).group("tensor"), ring_values(world.rank, n))
    return arrays, facts

def _tensor_parallel_run(world, kind):
    """Train the split model (the whole world is the tensor group); save the gathered whole parameters."""
    model = mp_scenarios.make_mlp(world) if kind == "mlp" else mp_scenarios.make_gpt(world)
    local = {name: p.array.copy() for name, p in model.named_parameters()}
    world.reset_traffic()
    losses = mp_scenarios.train(model, kind)
    traffic = dict(world.traffic)
    state = consolidated_state_dict(model)
    arrays = {f"full/{k}": v for k, v in state.items()}
    arrays.update({f"initial/{k}": v for k, v in local.items()})
    facts = {"losses": losses, "split_layers": [name for name, _ in tensor_parallel_layers(model)], "traffic": traffic,
             "local_shapes": {name: list(p.shape) for name, p in model.named_parameters()}}
    return arrays, facts


@check
def tensor_mlp(world):
    return _tensor_parallel_run(world, "mlp")


@check
def tensor_gpt(world):
    return _tensor_parallel_run(world, "gpt")


@check
def tensor_gpt_clip(world):
    """One backward of the split GPT, its gradients clipped to the unsplit model's global norm; the whole
    clipped gradients (gathered as a state dict) and the norm before clipping."""
    from minidl.parallel.tensor_parallel import clip_grad_norm_
    model = mp_scenarios.make_gpt(world)
    mp_scenarios.gpt_loss(model).backward()
    norm = clip_grad_norm_(model, mp_scenarios.CLIP)
    for p in model.parameters():
        p.array[...] = p.grad.array
    return {k: v for k, v in consolidated_state_dict(model).items()}, {"norm": norm}


def _zero_run(world, name):
    """A ZeRO stage 2 or 3 run from a different start on every rank; the whole weights after it, the memory
    this rank held when the step's gradients were reduced, and the payloads of the training steps."""
    stage, kind, batch = mp_scenarios.ZERO_RUNS[name]
    model = mp_scenarios.make_sequential(seed=world.rank)  # the start-up broadcast must make them equal
    sharded = parallel.ShardedDataParallel(model, world, stage=stage)
    opt = parallel.DistributedOptimizer(mp_scenarios.make_optimizer(kind, sharded.parameters()), sharded)
    world.reset_traffic()
    memory = []
    def reduced():
        opt.synchronize()
        memory.append(sharded.memory_report(opt))

    norms = mp_scenarios.train_sequential(sharded, opt, batch, world, after_backward=reduced,
                                          clip=sharded.clip_grad_norm_ if name.endswith("clip") else None,
                                          create_graph=kind == "adahessian")
    traffic = dict(world.traffic)
    sharded.gather_parameters()
    arrays = {str(i): p.array.copy() for i, p in enumerate(model.parameters())}
    # the optimizer state one process keeps, gathered from the shards; loaded back, this rank's state again
    state = opt.consolidated_state_dict()
    arrays.update({f"state/{pos}/{key}": np.asarray(value) for pos, entry in state["state"].items()
                   for key, value in entry.items()})
    mine = opt.state_dict()["state"]
    opt.load_state_dict(state)
    again = opt.state_dict()["state"]
    reloaded = sorted(again) == sorted(mine) and all(
        sorted(again[u]) == sorted(mine[u]) and all(np.array_equal(np.asarray(again[u][k]), np.asarray(mine[u][k]))
                                                    for k in mine[u]) for u in mine)
    facts = {"memory": memory[-1], "traffic": traffic, "norms": norms, "reloaded": bool(reloaded)}
    if kind == "switch":  # SWATS's estimate as this rank holds it, and as the consolidated state keeps it
        facts.update(switch=opt.state_dict()["switch"], consolidated_switch=state["switch"],
                     lr=[g["lr"] for g in state["param_groups"]])
    return arrays, facts


for _name in mp_scenarios.ZERO_RUNS:
    CHECKS[_name] = (lambda name: lambda world: _zero_run(world, name))(_name)


def _pipeline_run(world, name):
    """Every rank builds the same model and keeps its stage; 4 Adam steps; the stage's weights by global name."""
    kind, micro = mp_scenarios.PIPELINE_RUNS[name]
    pipe = parallel.Pipeline(mp_scenarios.make_stack(), world, micro, schedule=kind)
    opt = mp_scenarios.optim.Adam(pipe.parameters(), lr=mp_scenarios.LR)
    xs, ys = mp_scenarios.sequential_batches(12)
    losses, traffic = [], []
    for x, y in zip(xs, ys):
        world.reset_traffic()
        opt.zero_grad()
        losses.append(pipe.train_step(x, y, mp_scenarios.cross_entropy))
        opt.step()
        traffic.append(dict(world.traffic))
    first = pipe.boundaries[world.rank]
    arrays = {}
    for key, value in pipe.stage.state_dict().items():
        index, rest = key.split(".", 1)
        arrays[f"{first + int(index)}.{rest}"] = value
    facts = {"losses": losses, "traffic": traffic, "ops": [[op, k] for op, k, _, _ in pipe.timeline],
             "peak_in_flight": pipe.peak_in_flight, "boundaries": pipe.boundaries}
    return arrays, facts


for _name in mp_scenarios.PIPELINE_RUNS:
    CHECKS[_name] = (lambda name: lambda world: _pipeline_run(world, name))(_name)


@check
def hybrid_data_tensor(world):
    """Mesh(data=2, tensor=2): the GPT split over each tensor group, DataParallel over each data group
    (each data group member its slice of every batch: 2 + 1 of 3 sequences)."""
    if world.size != 4:
        return {}, {"ran": False}
    mesh = parallel.Mesh(world, data=2, tensor=2)
    model = mp_scenarios.make_gpt(mesh.group("tensor"))
    dp = parallel.DataParallel(model, mesh.group("data"))
    opt = parallel.DistributedOptimizer(mp_scenarios.optim.Adam(dp.parameters(), lr=mp_scenarios.LR), dp)
    xs, ys = mp_scenarios.gpt_batches()
    d = mesh.coordinate("data")
    for x, y in zip(xs, ys):
        x, y = parallel.shard(x, d, 2), parallel.shard(y, d, 2)
        opt.zero_grad()
        out = dp(x)
        mp_scenarios.F.cross_entropy(out.reshape(-1, out.shape[-1]), mp_scenarios.mdl.tensor(y.reshape(-1))).backward()
        opt.step()
    state = consolidated_state_dict(model)
    return {k: v for k, v in state.items()}, {"ran": True, "samples": dp.last_sync["samples"]}


@check
def hybrid_data_pipeline(world):
    """Mesh(data=2, pipe=2): a 2-stage 1F1B pipeline in each pipe group, its stage data-parallel over the
    data group (6 of the 12 samples each, 3 micro-batches)."""
    if world.size != 4:
        return {}, {"ran": False}
    mesh = parallel.Mesh(world, data=2, pipe=2)
    pipe = parallel.Pipeline(mp_scenarios.make_stack(), mesh.group("pipe"), 3, schedule="1f1b")
    dp = parallel.DataParallel(pipe.stage, mesh.group("data"))
    opt = mp_scenarios.optim.Adam(dp.parameters(), lr=mp_scenarios.LR)
    xs, ys = mp_scenarios.sequential_batches(12)
    d = mesh.coordinate("data")
    for x, y in zip(xs, ys):
        x, y = parallel.shard(x, d, 2), parallel.shard(y, d, 2)
        opt.zero_grad()
        pipe.train_step(x, y, mp_scenarios.cross_entropy)
        dp.sync_gradients(num_samples=len(x))
        opt.step()
    first = pipe.boundaries[mesh.coordinate("pipe")]
    arrays = {}
    for key, value in pipe.stage.state_dict().items():
        index, rest = key.split(".", 1)
        arrays[f"{first + int(index)}.{rest}"] = value
    return arrays, {"ran": True}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--only", nargs="*")
    args = parser.parse_args()
    world = parallel.init()
    arrays, facts = {}, {"world": {"rank": world.rank, "size": world.size, "backend": world.name}}
    for name in args.only or CHECKS:
        got, facts[name] = CHECKS[name](world)
        arrays.update({f"{name}/{key}": value for key, value in got.items()})
    np.savez(os.path.join(args.out, f"rank{world.rank}.npz"), **arrays)
    with open(os.path.join(args.out, f"rank{world.rank}.json"), "w") as f:
        json.dump(facts, f)


if __name__ == "__main__":
    main()
