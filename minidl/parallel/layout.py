"""A run's layout: the world cut into data × pipeline × tensor groups, and the wrappers nested for it.

    world = parallel.init()
    groups = parallel.layout(world, data=True, pipeline=2, tensor=2)   # the shape checked; a collective
    model = tensor_parallel(build_model(), groups.tensor)              # the model splits its own layers
    model, opt, loader = parallel.prepare(model, optim.AdamW, loader, groups, params=decay_groups,
                                          layers=pipeline_layers, micro_batches=4, lr=3e-4)
    Trainer(model, opt, loader, ...).fit(epochs)                        # the one loop, for every layout

:func:`layout` lays the world out as :class:`~minidl.parallel.mesh.Mesh` does, row-major with the
tensor axis fastest (its ranks all-reduce in every block: neighbours, one machine) and the data axis
slowest (it all-reduces once a step); an axis of size 1 gets no group (but data parallelism, when
asked, has the world of one as its group). :func:`prepare` nests the
wrappers, each answering the protocol of :mod:`minidl.parallel.protocol` for its own split:

    model      [Pipeline(layers(model), pipeline group)]            the stages (each holds its layers)
               → DataParallel(·, data group) | ShardedDataParallel   the replicas (ZeRO-2/3: sharded)
               → TensorParallel(·)                                  without a pipeline: whole checkpoints
    optimizer  optimizer_class over params(model)                   (a stage's: Pipeline.stage_groups;
               | ZeroRedundancyOptimizer(…)                          ZeRO-1: this rank's chunks of them)
               → DistributedOptimizer(·)                            the replicas' all-reduce
               → TensorParallelOptimizer(·)                         the split layers' norm and state
               → PipelineOptimizer(·)                               the stages' norm, tied sums, state
    loader     shard_loader(loader, data group)                     each replica its slice of a batch

ZeRO shards over the data axis alone (its stage 1 the optimizer state of flat chunks of each parameter
group, its stages 2 and 3 flat vectors of a whole model): with a pipeline or tensor axis it is refused.
"""
from __future__ import annotations

from dataclasses import dataclass

from minidl.parallel.comm import Communicator
from minidl.parallel.data_parallel import DataParallel, DistributedOptimizer
from minidl.parallel.mesh import Mesh
from minidl.parallel.pipeline import Pipeline, PipelineOptimizer
from minidl.parallel.sampler import shard_loader
from minidl.parallel.sharded import ShardedDataParallel
from minidl.parallel.tensor_parallel import TensorParallel, TensorParallelOptimizer
from minidl.parallel.zero import ZeroRedundancyOptimizer

__all__ = ["Layout", "layout", "prepare"]


@dataclass
class Layout:
    """The groups of one rank: ``data``, ``pipeline`` and ``tensor`` communicators (None for an axis of
    size 1) and the ``world`` they were cut from."""

    world: object
    data: object = None
    pipeline: object = None
    tensor: object = None

    def size(self, axis: str) -> int:
        group = getattr(self, axis)
        return 1 if group is None else group.size

    @property
    def is_root(self) -> bool:
        """Rank 0 of every group this rank belongs to: the one that speaks and writes files."""
        return all(g is None or g.rank == 0 for g in (self.data, self.pipeline, self.tensor))

    @property
    def is_parallel(self) -> bool:
        return any(g is not None for g in (self.data, self.pipeline, self.tensor))


_NAMES = {"data": "data parallelism", "pipeline": "pipeline=", "tensor": "tensor="}


def layout(world, *, data: bool = False, pipeline: int | None = None, tensor: int | None = None,
           names: dict | None = None, launch: str = "python train.py") -> Layout:
    """The groups of this rank for a run of ``pipeline`` stages of ``tensor`` ranks each (None: 1), ``data``:
    as many such copies as the world holds, each on its slice of every batch.

    The world must hold exactly pipeline·tensor ranks, or a multiple of it with ``data``; otherwise a
    ValueError says so before any communicator is made. ``names`` spell the axes in the message as the
    caller's user asks for them (a command's flags: ``{"data": "--data-parallel", "pipeline":
    "--pipeline-parallel", "tensor": "--tensor-parallel"}``), ``launch`` how a job of it is started.
    A collective (the groups are :meth:`~minidl.parallel.comm.Communicator.split` from ``world``);
    an axis that spans the whole world is ``world`` itself.
    """
    names = {**_NAMES, **(names or {})}
    m, t = int(pipeline or 1), int(tensor or 1)
    n = m * t
    asked = " ".join(_spell(names[axis], size) for axis, size in (("pipeline", pipeline), ("tensor", tensor))
                     if size is not None)
    if data:
        asked = f"{asked} {names['data']}".strip()
    if data and world.size % n:
        groups = f"pipelines of {m} stages" + (f" of {t} ranks" if t > 1 else "") if m > 1 else f"tensor groups of {t}"
        raise ValueError(f"{asked} needs a world of a multiple of {n} ranks (data groups × {groups}), got "
                         f"{world.size}")
    if not data and world.size != n:
        one = "slice of a stage" if m > 1 and t > 1 else "stage" if m > 1 else "slice"
        raise ValueError(f"{asked} needs a world of {n} ranks (one per {one}: mpiexec -n {n} {launch} {asked} ...), "
                         f"got {world.size}; with {names['data']} a multiple of {n}")
    sizes = {"data": world.size // n if data else 1, "pipeline": m, "tensor": t}
    wide = [axis for axis, size in sizes.items() if size > 1]
    if not wide:  # a world of one: data parallelism over it, if asked, is one process's step
        return Layout(world, data=world if data else None)
    if len(wide) == 1:  # one axis spans the world: the world is its group
        return Layout(world, **{wide[0]: world})
    mesh = Mesh(world, **{axis: sizes[axis] for axis in wide})
    return Layout(world, **{axis: mesh.group(axis) for axis in wide})


def _spell(name: str, size) -> str:
    return f"{name}{size}" if name.endswith("=") else f"{name} {size}"


def prepare(model, optimizer_class, loader=None, groups: Layout | None = None, *, params=None, zero: int = 0,
            layers=None, boundaries=None, micro_batches: int | None = None, schedule: str = "1f1b", **options):
    """``(model, optimizer, loader)`` wrapped for ``groups`` (a :class:`Layout`; a Communicator stands for
    data parallelism over it; None: one process, nothing wrapped), nested as the module docstring draws.

    Args:
        model: the whole model, built the same way on every rank (seeded), already split over
            ``groups.tensor`` where there is one (the model knows which of its layers split how:
            :func:`minidl.models.gpt.tensor_parallel`).
        optimizer_class, options: the optimizer and its hyperparameters (``lr``, ``betas``...).
        loader: the training loader over the whole data set, with the global batch size (None: none).
        params: ``params(model)``, the parameters or groups one process's optimizer takes (default all).
        zero: the ZeRO stage over the data axis: 1 (optimizer state), 2 (gradients), 3 (parameters).
        layers: ``layers(model)``, the model as an ``nn.Sequential`` to cut into pipeline stages (default
            the model itself); ``boundaries``, ``micro_batches`` (default: the stages) and ``schedule`` as
            :class:`~minidl.parallel.pipeline.Pipeline` takes them.

    A plain model and optimizer need none of this: without groups the optimizer is
    ``optimizer_class(params(model), **options)`` and the model and loader are returned as they are.
    """
    if isinstance(groups, Communicator):
        groups = Layout(groups, data=groups)
    groups = groups if groups is not None else Layout(None)
    if zero not in (0, 1, 2, 3) or isinstance(zero, bool):
        raise ValueError(f"prepare: zero must be a ZeRO stage 0, 1, 2 or 3, got {zero!r}")
    if zero and groups.data is None:
        raise ValueError(f"prepare: ZeRO stage {zero} shards across data-parallel ranks; give a layout with a data "
                         "group (or zero=0)")
    if zero and (groups.pipeline is not None or groups.tensor is not None):
        raise ValueError(f"prepare: ZeRO stage {zero} shards whole models over the data axis; a pipeline or tensor "
                         "split cuts the model already (its stages or slices are each one rank's): use zero=0")
    if zero >= 2 and params is not None:
        raise ValueError(f"prepare: ZeRO stage {zero} optimizes flat shards of the whole model, so it takes no "
                         "parameter groups (params); use zero=1, which keeps them (a flat vector per group)")
    whole_params = params(model) if params is not None else list(model.parameters())
    if groups.pipeline is not None:
        pipe = Pipeline(layers(model) if layers is not None else model, groups.pipeline,
                                 micro_batches or groups.pipeline.size, schedule, boundaries=boundaries, whole=model)
        net = DataParallel(pipe, groups.data) if groups.data is not None else pipe
        opt = optimizer_class(pipe.stage_groups(whole_params), **options)
        if groups.data is not None:
            opt = DistributedOptimizer(opt, net)
        if groups.tensor is not None:
            opt = TensorParallelOptimizer(opt, pipe)
        opt = PipelineOptimizer(opt, pipe, whole_params)
    else:
        net = model
        if zero >= 2:  # the optimizer updates this rank's shard of the flat parameters
            net = ShardedDataParallel(model, groups.data, stage=zero)
            whole_params = net.parameters()
        elif groups.data is not None:
            net = DataParallel(model, groups.data)
        if zero == 1:  # each rank keeps the state of its chunk of each group's flat vector
            opt = ZeroRedundancyOptimizer(whole_params, optimizer_class, groups.data, **options)
        else:
            opt = optimizer_class(whole_params, **options)
        if groups.data is not None:
            opt = DistributedOptimizer(opt, net)
        if groups.tensor is not None:
            net = TensorParallel(net)
            opt = TensorParallelOptimizer(opt, net)
    if loader is not None and groups.data is not None:
        loader = shard_loader(loader, groups.data)
    return net, opt, loader
