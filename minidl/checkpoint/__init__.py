"""Gradient checkpointing: keep a few activations, recompute the rest during backward.

The textbook's "training with limited memory": backpropagation needs every
activation of the forward pass, so memory grows with depth. Rematerialization
stores only the inputs of a few *segments* and recomputes each segment's
activations when the backward pass reaches it, at the price of one extra
forward pass. With L layers cut into k segments the activations held at
once are about k segment inputs plus one segment's L/k layers, smallest near
k = √L (the book: 100 layers, 10 segments, about 20% of the activations;
measured with ``minidl.memory.track``: 15% of the plain run's bytes)::

    y = checkpoint(block, x)                         # one block
    y = checkpoint_sequential(model, 10, x)          # a Sequential, PyTorch's semantics
    plan = balanced_segments(model, x, 10)           # boundaries by measured memory
    y = checkpoint_sequential(model, plan, x, storage_dtype="float16")

``fn`` must compute the same thing when run again: the same tensors, no
side effects but BatchNorm statistics (restored) and random draws (replayed).

The package, each module importing only those before it:

- :mod:`minidl.checkpoint.replay`: what a recomputation must replay or
  restore (the random generators' state, the stateful layers' buffers);
- :mod:`minidl.checkpoint.policy`: selective checkpointing, the ops whose
  outputs a checkpoint keeps (``checkpoint(fn, x, policy="matmul,attention")``);
- :mod:`minidl.checkpoint.nonreentrant`: ``checkpoint(fn, x, use_reentrant=False)``,
  fn's graph recorded with its saved tensors as placeholders, recomputed on unpack;
- :mod:`minidl.checkpoint.segments`: ``checkpoint``, ``checkpoint_sequential``
  and the node that recomputes a segment during backward;
- :mod:`minidl.checkpoint.offload`: saved activations in host memory
  (``save_on_cpu``) or in fewer bits (``save_as``), on saved-tensor hooks;
- :mod:`minidl.checkpoint.plan`: where to cut (``balanced_segments``,
  ``choose_segments``, ``flatten_layers``) and what 16-bit storage costs
  (``storage_report``);
- :mod:`minidl.checkpoint.schedule`: checkpointing recursively, the schedule
  of least recomputation under a memory budget (``optimal_schedule``,
  Revolve's ``binomial_schedule``);
- :mod:`minidl.checkpoint.graph`: ``LayerGraph``, a network as layers with named inputs
  (skip connections as edges);
- :mod:`minidl.checkpoint.checkmate`: Checkmate's integer program over such a graph
  (``profile_graph``, ``checkmate_schedule``), solved by SciPy's ``milp``, and its executor.
"""
from minidl.checkpoint.checkmate import (
    CheckmateSchedule,
    GraphProfile,
    checkmate_schedule,
    exhaustive_schedule,
    plain_schedule,
    profile_graph,
)
from minidl.checkpoint.graph import LayerGraph
from minidl.checkpoint.nonreentrant import checkpoint_nonreentrant
from minidl.checkpoint.offload import save_as, save_on_cpu
from minidl.checkpoint.plan import (
    SegmentPlan,
    balanced_segments,
    choose_segments,
    flatten_layers,
    profile_layers,
    sqrt_segments,
    storage_report,
)
from minidl.checkpoint.policy import resolve_policy
from minidl.checkpoint.schedule import (
    Schedule,
    binomial_schedule,
    count_forward_calls,
    optimal_schedule,
    revolve_forward_steps,
    segment_schedule,
    smallest_peak,
)
from minidl.checkpoint.segments import (
    CheckpointFunction,
    checkpoint,
    checkpoint_sequential,
    resolve_storage_dtype,
    uniform_boundaries,
)

__all__ = ["CheckpointFunction", "checkpoint", "checkpoint_sequential", "uniform_boundaries",
           "resolve_storage_dtype", "SegmentPlan", "balanced_segments", "choose_segments", "flatten_layers",
           "profile_layers", "sqrt_segments", "storage_report", "Schedule", "optimal_schedule", "smallest_peak",
           "segment_schedule", "binomial_schedule", "revolve_forward_steps", "count_forward_calls",
           "save_on_cpu", "save_as", "resolve_policy", "checkpoint_nonreentrant",
           "LayerGraph", "GraphProfile", "CheckmateSchedule", "profile_graph", "checkmate_schedule",
           "exhaustive_schedule", "plain_schedule"]
