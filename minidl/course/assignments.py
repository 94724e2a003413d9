"""The table of assignments: every task, the functions it cuts out of minidl, its points and checks.

This is the one place that names engine functions. Each :class:`Task` lists the
functions the student writes by qualified name (as ``import`` resolves them:
``minidl.ops.linalg.MatMul.backward``); the generator (:mod:`minidl.course.make`)
finds each one in its file and replaces the body after the docstring by
``raise NotImplementedError("Task 2.2: ...")``. A task also names the tasks whose
code its checks run through (``depends_on``: a student does them first) and the
checks that grade it, by their names in :mod:`minidl.course.checks`. When the
engine renames a function, the change is one line here.

The chapter sections are those of the training chapter minidl follows
(docs/course.md gives the schedule).
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ASSIGNMENTS", "Assignment", "Task", "find", "task"]


@dataclass(frozen=True)
class Task:
    """One task: ``id`` "2.3", the ``functions`` the student writes, ``points``, ``depends_on`` and ``checks``."""

    id: str
    title: str
    functions: tuple
    points: int
    checks: tuple
    depends_on: tuple = ()

    def message(self, function: str) -> str:
        """What the hole of ``function`` raises: the task, what to write, and how to check it."""
        return f"Task {self.id}: write {function} ({self.title}); then run: python -m minidl course check {self.id}"


@dataclass(frozen=True)
class Assignment:
    """``name`` (for ``minidl course make NAME``), its ``tasks``, its notebook and the chapter section it goes with."""

    number: int
    name: str
    title: str
    section: str
    notebook: str
    tasks: tuple

    @property
    def max_points(self) -> int:
        return sum(t.points for t in self.tasks)

    def task(self, task_id: str) -> Task:
        for t in self.tasks:
            if t.id == task_id:
                return t
        raise KeyError(f"assignment {self.name} has no task {task_id!r}; its tasks: "
                       f"{', '.join(t.id for t in self.tasks)}")


_OPS, _OPTIM, _INIT = "minidl.ops", "minidl.optim", "minidl.nn.init"

ASSIGNMENTS = (
    Assignment(1, "scalar-autograd", "A scalar autograd engine", "Backpropagation: the chain rule on a graph",
               "A1_scalar_autograd.ipynb", (
                   Task("1.1", "the sum and the product of two Values, each with its local backward",
                        ("minidl.course.scalar.Value.__add__", "minidl.course.scalar.Value.__mul__"), 10,
                        ("a1.add_mul",)),
                   Task("1.2", "the nonlinearities: a power, exp, tanh and relu",
                        ("minidl.course.scalar.Value.__pow__", "minidl.course.scalar.Value.exp",
                         "minidl.course.scalar.Value.tanh", "minidl.course.scalar.Value.relu"), 10,
                        ("a1.nonlinear",)),
                   Task("1.3", "the backward walk: a topological order, then each node's backward in reverse",
                        ("minidl.course.scalar.Value.backward",), 10, ("a1.walk",)),
               )),
    Assignment(2, "op-backwards", "Op backwards", "Backpropagation through matrices: the gradients of the ops",
               "A2_op_backwards.ipynb", (
                   Task("2.1", "sum_to: a gradient summed back over the axes broadcasting added or stretched",
                        (f"{_OPS}.shape.SumTo.forward",), 10, ("a2.sum_to",)),
                   Task("2.2", "the matrix product's backward, with vectors and broadcast batches",
                        (f"{_OPS}.linalg.MatMul.backward",), 15, ("a2.matmul",), ("2.1",)),
                   Task("2.3", "softmax's and cross-entropy's gradients",
                        (f"{_OPS}.activation.SoftmaxGrad.forward", f"{_OPS}.loss.CrossEntropyGrad.forward"), 15,
                        ("a2.softmax", "a2.cross_entropy"), ("2.1",)),
                   Task("2.4", "conv2d: the output size and col2im, the backward of the windows",
                        (f"{_OPS}.conv.output_size", f"{_OPS}.conv.col2im_array"), 15,
                        ("a2.output_size", "a2.col2im"), ("2.1", "2.2")),
                   Task("2.5", "layer normalization's backward",
                        (f"{_OPS}.norm.NormalizeGrad.forward",), 15, ("a2.normalize",), ("2.1",)),
                   Task("2.6", "attention's backward: dQ, dK, dV through the softmax",
                        (f"{_OPS}.attention.AttentionGrad.forward",), 15, ("a2.attention",), ("2.1",)),
               )),
    Assignment(3, "backward-walk", "The backward walk and gradients of gradients",
               "Backpropagation: the reverse sweep, and second derivatives", "A3_backward_walk.ipynb", (
                   Task("3.1", "the topological order of the graph's nodes",
                        ("minidl.autograd.walk.topological_order",), 10, ("a3.order",)),
                   Task("3.2", "gradients summed over every use, and accumulated into a leaf's .grad",
                        ("minidl.autograd.walk._add_pending", "minidl.autograd.walk._accumulate_leaf"), 10,
                        ("a3.accumulate",), ("3.1",)),
                   Task("3.3", "a backward written in differentiable ops: tanh's second derivative",
                        (f"{_OPS}.activation.TanhGrad.backward",), 10, ("a3.double_backward",), ("3.1", "3.2")),
               )),
    Assignment(4, "optimizers", "The optimizers as their equations", "The optimizer family, from SGD to LAMB",
               "A4_optimizers.ipynb", (
                   Task("4.1", "SGD with momentum and Nesterov's look-ahead",
                        (f"{_OPTIM}.sgd.sgd_update",), 10, ("a4.sgd",)),
                   Task("4.2", "AdaGrad and RMSProp", (f"{_OPTIM}.adaptive.adagrad_update",
                                                       f"{_OPTIM}.adaptive.rmsprop_update"), 10,
                        ("a4.adagrad", "a4.rmsprop")),
                   Task("4.3", "AdaDelta", (f"{_OPTIM}.adaptive.adadelta_update",), 10, ("a4.adadelta",)),
                   Task("4.4", "Adam with bias correction, and AdamW's decoupled decay",
                        (f"{_OPTIM}.adam.adam_update", f"{_OPTIM}.regularization.decay_weights_"), 15,
                        ("a4.adam", "a4.adamw")),
                   Task("4.5", "LARS and LAMB: the trust ratio", (f"{_OPTIM}.layerwise.lars_update",
                                                                  f"{_OPTIM}.layerwise.lamb_update"), 15,
                        ("a4.lars", "a4.lamb")),
               )),
    Assignment(5, "initializers", "Initializers and their bias rules", "Weight and bias initialization",
               "A5_initializers.ipynb", (
                   Task("5.1", "fan in, fan out and the gains of the nonlinearities",
                        (f"{_INIT}._calculate_fan_in_and_fan_out", f"{_INIT}.calculate_gain"), 10, ("a5.fans",)),
                   Task("5.2", "Xavier (Glorot) initialization", (f"{_INIT}.xavier_uniform_",
                                                                   f"{_INIT}.xavier_normal_"), 10,
                        ("a5.xavier",), ("5.1",)),
                   Task("5.3", "Kaiming (He) initialization", (f"{_INIT}.kaiming_uniform_",
                                                                f"{_INIT}.kaiming_normal_"), 10,
                        ("a5.kaiming",), ("5.1",)),
                   Task("5.4", "the bias rules: imbalanced classes, class priors, regression",
                        (f"{_INIT}.init_bias_imbalanced_binary", f"{_INIT}.init_bias_class_priors",
                         f"{_INIT}.init_bias_regression"), 10, ("a5.bias",)),
               )),
    Assignment(6, "checkpointing", "Gradient checkpointing", "Training with limited memory",
               "A6_checkpointing.ipynb", (
                   Task("6.1", "where the segments start: uniform segments and the √L rule",
                        ("minidl.checkpoint.segments.uniform_boundaries", "minidl.checkpoint.plan.sqrt_segments"),
                        10, ("a6.boundaries",)),
                   Task("6.2", "the memory model: the peak of a segmented backward, and its extra time",
                        ("minidl.checkpoint.plan.SegmentPlan.peak_bytes",
                         "minidl.checkpoint.plan.SegmentPlan.slowdown"), 10, ("a6.model",)),
                   Task("6.3", "checkpoint_sequential: every segment but the last rematerialized",
                        ("minidl.checkpoint.segments.checkpoint_sequential",), 15, ("a6.sequential",), ("6.1",)),
               )),
    Assignment(7, "data-parallel", "Data parallelism: a ring all-reduce", "Data parallelism",
               "A7_data_parallel.ipynb", (
                   Task("7.1", "the ring all-reduce: a reduce-scatter, then an all-gather, on sendrecv_",
                        ("minidl.parallel.ring.ring_allreduce_",), 20, ("a7.allreduce",)),
                   Task("7.2", "gradients averaged over the ranks, equal to one process's",
                        ("minidl.course.data_parallel.average_gradients_",), 10, ("a7.average",), ("7.1",)),
               )),
    Assignment(8, "forward-mode", "Forward mode: tangent rules", "Automatic differentiation, forward and reverse",
               "A8_forward_mode.ipynb", (
                   Task("8.1", "the product and quotient rules", (f"{_OPS}.elementwise.Mul.jvp",
                                                                  f"{_OPS}.elementwise.Div.jvp"), 10,
                        ("a8.product",)),
                   Task("8.2", "the chain rule through exp, log and tanh",
                        (f"{_OPS}.elementwise.Exp.jvp", f"{_OPS}.elementwise.Log.jvp", f"{_OPS}.activation.Tanh.jvp"),
                        10, ("a8.chain",)),
                   Task("8.3", "the matrix product's tangent", (f"{_OPS}.linalg.MatMul.jvp",), 10, ("a8.matmul",)),
                   Task("8.4", "softmax's tangent", (f"{_OPS}.activation.Softmax.jvp",), 10, ("a8.softmax",)),
               )),
)


def find(name: str) -> Assignment:
    """The assignment called ``name`` (its name, like 'op-backwards', or its number, like '2')."""
    for a in ASSIGNMENTS:
        if name in (a.name, str(a.number)):
            return a
    raise KeyError(f"no assignment {name!r}; the assignments: "
                   + ", ".join(f"{a.number} {a.name}" for a in ASSIGNMENTS))


def task(task_id: str) -> Task:
    """The task ``task_id`` ('2.3') of whichever assignment holds it."""
    number = task_id.split(".")[0]
    return find(number).task(task_id)
