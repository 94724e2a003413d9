"""Data parallelism: one model per process, each on its slice of every batch, kept identical.

    # run with: mpiexec -n 4 python train.py        (see docs/data_parallel.md)
    from minidl import parallel
    comm = parallel.init()                          # MPI on CPUs, NCCL on GPUs, a world of 1 otherwise
    model = parallel.DataParallel(model.to(comm.device), comm)   # rank 0's weights everywhere
    loader = parallel.shard_loader(loader, comm)    # rank r gets its slice of every global batch
    for x, y in loader:
        loss = F.cross_entropy(model(mdl.tensor(x)), y)
        opt.zero_grad(); loss.backward()
        model.sync_gradients()                      # all-reduce: every rank holds the global gradient
        opt.step()

The same script runs unchanged on one laptop (``python train.py``: a world of
one) and on many GPU machines (``mpiexec -n 64 ...``). The communication is
done by existing engines, MPI (mpi4py) and NCCL (CuPy), never by minidl.

- :mod:`minidl.parallel.world`: ``init`` (join the job), ``get_world``, ``is_root``
- :mod:`minidl.parallel.comm`: the communicators (``LocalComm``, ``MPIComm``, ``NCCLComm``): collectives,
  groups (``split``) and point-to-point ``send``/``recv_``
- :mod:`minidl.parallel.mesh`: ``Mesh(data=2, tensor=2)``, the world on a grid with one group per axis
- :mod:`minidl.parallel.tensor_parallel`: Megatron-LM's column- and row-parallel layers, the parallel MLP
  and attention (the GPT splits with :func:`minidl.models.gpt.tensor_parallel`)
- :mod:`minidl.parallel.data_parallel`: ``DataParallel`` and ``DistributedOptimizer``
- :mod:`minidl.parallel.distributed_data_parallel`: ``DistributedDataParallel``, PyTorch's DDP (the
  all-reduce at the end of backward); ``minidl.distributed`` has ``init_process_group`` and the rest
- :mod:`minidl.parallel.sampler`: sharding a batch, a dataset, a loader
- :mod:`minidl.parallel.pipeline`: a Sequential cut into stages, micro-batches, GPipe and 1F1B schedules
- :mod:`minidl.parallel.zero`: ZeRO stage 1 (optimizer state sharded across ranks)
- :mod:`minidl.parallel.sharded`: ZeRO stages 2 and 3 (gradients, then parameters, sharded too)
- :mod:`minidl.parallel.ring`: the ring all-reduce written out on point-to-point calls (what the engines do)
- :mod:`minidl.parallel.protocol`: what the Trainer calls on every scheme's model and optimizer wrappers
- :mod:`minidl.parallel.whole_state`: split ↔ whole state for every kind of split (checkpoints, resumes)
- :mod:`minidl.parallel.layout`: ``layout`` (the world as data × pipeline × tensor groups) and
  ``prepare`` (the wrappers nested for it)
- :mod:`minidl.parallel.filter_parallel`: a Conv2d's filters (or input channels) split over the ranks
- :mod:`minidl.parallel.spatial`: images cut into strips of rows over the ranks, with a halo exchange
- :mod:`minidl.parallel.cost_model`: the ring all-reduce cost model and scaling predictions
- :mod:`minidl.parallel.planner`: ``plan(model, batch, machine)``, every layout predicted and ranked
- :mod:`minidl.parallel.expert`: expert parallelism, a mixture of experts' experts over the ranks (all-to-all)
- :mod:`minidl.parallel.launch`: finding ``mpiexec`` and building its command line
- :mod:`minidl.parallel.parameter_server`: ``ParameterServer`` (servers and workers; synchronous, or bounded staleness)
- :mod:`minidl.parallel.local_sgd`: ``LocalSGD`` (each rank steps alone; the weights averaged every H steps)
"""
from __future__ import annotations

from minidl.parallel.comm import Communicator, LocalComm, MPIComm, NCCLComm, nccl_available
from minidl.parallel.data_parallel import DataParallel, DistributedOptimizer, prepare_data_parallel
from minidl.parallel.distributed_data_parallel import DistributedDataParallel
from minidl.parallel.expert import ExpertParallel, ExpertParallelMoE, ExpertParallelOptimizer, expert_parallel
from minidl.parallel.layout import Layout, layout, prepare
from minidl.parallel.local_sgd import LocalSGD, LocalSGDOptimizer
from minidl.parallel.mesh import Mesh
from minidl.parallel.parameter_server import ParameterServer, ParameterServerOptimizer
from minidl.parallel.pipeline import Pipeline, PipelineOptimizer
from minidl.parallel.planner import Machine, ModelSpec, plan
from minidl.parallel.protocol import ParallelModule, ParallelOptimizer
from minidl.parallel.ring import ring_allreduce_
from minidl.parallel.sampler import ShardedDataset, shard, shard_bounds, shard_loader
from minidl.parallel.sharded import ShardedDataParallel
from minidl.parallel.tensor_parallel import (
    ColumnParallelLinear,
    ParallelCausalSelfAttention,
    ParallelMLP,
    RowParallelLinear,
    TensorParallel,
    TensorParallelOptimizer,
)
from minidl.parallel.whole_state import consolidated_state_dict
from minidl.parallel.world import get_world, init, is_root
from minidl.parallel.zero import ZeroRedundancyOptimizer

__all__ = [
    "LocalSGD", "LocalSGDOptimizer", "ParameterServer", "ParameterServerOptimizer",
    "Machine", "ModelSpec", "plan",
    "ColumnParallelLinear", "Communicator", "DataParallel", "DistributedDataParallel", "DistributedOptimizer",
    "Layout", "LocalComm", "MPIComm", "Mesh", "NCCLComm", "ParallelCausalSelfAttention", "ParallelMLP",
    "ParallelModule", "ParallelOptimizer",
    "Pipeline", "PipelineOptimizer", "RowParallelLinear", "ShardedDataParallel", "ShardedDataset", "TensorParallel",
    "TensorParallelOptimizer", "ZeroRedundancyOptimizer", "consolidated_state_dict", "get_world", "init", "is_root",
    "layout", "nccl_available", "prepare", "prepare_data_parallel", "ring_allreduce_", "shard", "shard_bounds",
    "shard_loader",
    "ExpertParallel", "ExpertParallelMoE", "ExpertParallelOptimizer", "expert_parallel",
]

# ---------------------------------------------------------------- filter-wise and spatial parallelism
from minidl.parallel.filter_parallel import (  # noqa: E402
    FilterParallel,
    FilterParallelConv2d,
    FilterParallelOptimizer,
    InputChannelParallelConv2d,
)
from minidl.parallel.spatial import SpatialConv2d, SpatialParallel  # noqa: E402

__all__ = __all__ + ["FilterParallel", "FilterParallelConv2d", "FilterParallelOptimizer",
                     "InputChannelParallelConv2d", "SpatialConv2d", "SpatialParallel"]
