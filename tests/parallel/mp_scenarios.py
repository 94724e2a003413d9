"""Models and training runs shared by mp_worker.py (split over ranks) and the tests (one process).

The plain runs use nothing from minidl.parallel; the split runs build the same
models after the same seed, so their parameters start equal to the plain ones.
Every run trains STEPS Adam steps in float64 on fixed batches.
"""
from __future__ import annotations

import numpy as np

import minidl as mdl
import minidl.functional as F
from minidl import nn, optim
from minidl.models.gpt import GPT, GPTConfig

STEPS = 4
LR = 0.01
GPT_CONFIG = GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=4, n_embd=16)


class PlainMLPNet(nn.Module):
    """x → Linear(6, 8) → [Linear(8, 16) → GELU → Linear(16, 8)] → Linear(8, 3)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(6, 8)
        self.fc, self.proj = nn.Linear(8, 16), nn.Linear(16, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.proj(F.gelu(self.fc(self.inp(x)))))


class ParallelMLPNet(nn.Module):
    """The same network with the middle MLP split over ``comm`` (ParallelMLP, built from the seed)."""

    def __init__(self, comm):
        super().__init__()
        from minidl.parallel.tensor_parallel import ParallelMLP
        self.inp = nn.Linear(6, 8)
        self.mlp = ParallelMLP(8, 16, comm)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.mlp(self.inp(x)))


# The plain network's parameter names, as the split one's consolidated state dict has them.
MLP_NAMES = {"fc.weight": "mlp.fc.weight", "fc.bias": "mlp.fc.bias", "proj.weight": "mlp.proj.weight",
             "proj.bias": "mlp.proj.bias"}


def mlp_batches():
    rng = np.random.default_rng(11)
    return rng.normal(size=(STEPS, 10, 6)), rng.integers(0, 3, size=(STEPS, 10))


def gpt_batches():
    rng = np.random.default_rng(12)
    tokens = rng.integers(0, GPT_CONFIG.vocab_size, size=(STEPS, 3, GPT_CONFIG.block_size + 1))
    return tokens[:, :, :-1], tokens[:, :, 1:]


def make_mlp(comm=None):
    mdl.manual_seed(0)
    model = PlainMLPNet() if comm is None else ParallelMLPNet(comm)
    return model.to(dtype=np.float64)


def make_gpt(comm=None):
    mdl.manual_seed(0)
    model = GPT(GPT_CONFIG).to(dtype=np.float64)
    if comm is not None:
        from minidl.models.gpt import tensor_parallel
        tensor_parallel(model, comm)
    return model


def train(model, kind: str, opt=None):
    """STEPS Adam steps of ``model`` on the fixed batches of ``kind`` ('mlp' or 'gpt'); returns the losses."""
    opt = opt if opt is not None else optim.Adam(model.parameters(), lr=LR)
    xs, ys = mlp_batches() if kind == "mlp" else gpt_batches()
    losses = []
    for x, y in zip(xs, ys):
        opt.zero_grad()
        out = model(x if kind == "gpt" else mdl.tensor(x))
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), mdl.tensor(y.reshape(-1)))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def gpt_loss(model):
    """The loss of ``model`` (a GPT) on the first of the GPT batches."""
    xs, ys = gpt_batches()
    out = model(xs[0])
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), mdl.tensor(ys[0].reshape(-1)))


def reference(kind: str) -> tuple[dict, list]:
    """The plain single-process run: final state dict (the split model's names) and the losses."""
    model = make_mlp() if kind == "mlp" else make_gpt()
    losses = train(model, kind)
    state = dict(model.state_dict())
    if kind == "mlp":
        state = {MLP_NAMES.get(k, k): v for k, v in state.items()}
    return state, losses


# ---------------------------------------------------------------- ZeRO stages 2 and 3
ZERO_RUNS = {
    # name: (stage, optimizer, global batch)
    "zero2_adam": (2, "adam", 12),
    "zero3_adam": (3, "adam", 12),
    "zero3_sgd": (3, "sgd", 12),
    "zero3_adam_uneven": (3, "adam", 11),   # 6 + 5 on 2 ranks, 3 + 3 + 3 + 2 on 4: weighted by sample counts
    "zero2_adam_clip": (2, "adam", 12),     # clipped to a global norm of 0.05 (every step clips: ‖g‖ ≈ 0.3)
    # the layer-wise optimizers: each parameter's norm added over the pieces the ranks hold
    "zero2_lamb": (2, "lamb", 12),          # one unit of all four parameters, cut across the ranks
    "zero3_lars": (3, "lars", 12),          # the second unit holds a weight and a bias (1-D: no adaptation)
    "zero3_novograd": (3, "novograd", 11),  # one v per parameter of each unit
    # AdaHessian: z for the whole parameters, Hz all-reduced with the gradients' weights, D cut into the shards
    "zero2_adahessian": (2, "adahessian", 11),
    "zero3_adahessian": (3, "adahessian", 12),  # each unit whole from its forward until the step's sync
    # SWATS: pᵀp and pᵀg over the whole group, each rank's pieces then one all-reduce of the 2 sums per
    # Adam step; the criterion switches to SGD at step SWITCH_AT, so the last step is SGD's at the rate Λ
    "zero2_switch": (2, "switch", 12),
    "zero3_switch": (3, "switch", 12),
}
# the per-layer norms each step all-reduces (one vector of the unit's parameters per norm): w and g for
# LARS, w and u for LAMB, g for NovoGrad
NORMS_PER_STEP = {"adam": 0, "sgd": 0, "lars": 2, "lamb": 2, "novograd": 1, "switch": 0, "adahessian": 0}
# SWATS on these batches: γ = 0.487, 0.404, 0.473, ... and |Λ − γ| = 0.042 at step 2, 0.019 at step 3,
# so with tol = 0.03 (far from both) it switches after step 3, and step 4 is SGD with momentum
SWITCH_TOL, SWITCH_AT = 0.03, 3
CLIP = 0.05


def make_sequential(seed: int = 0):
    """Three Linear layers of 78, 70 and 15 parameters (163 in all): the shards of 15 and of 163 are padded."""
    mdl.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 13, bias=False), nn.Tanh(), nn.Linear(13, 5), nn.Tanh(),
                         nn.Linear(5, 3, bias=False)).to(dtype=np.float64)


def make_optimizer(kind: str, params):
    """Adam, SGD with momentum, a layer-wise optimizer with weight decay (large enough steps to move
    the weights by more than 1e-2 in STEPS steps), or SWATS (Adam, then SGD from step SWITCH_AT + 1)."""
    if kind == "lamb":
        return optim.LAMB(params, lr=LR, weight_decay=0.01)
    if kind == "lars":
        return optim.LARS(params, lr=0.5, momentum=0.9, trust_coefficient=0.02, weight_decay=0.01)
    if kind == "novograd":
        return optim.NovoGrad(params, lr=0.05, weight_decay=0.01)
    if kind == "adahessian":  # its z generator seeded by mdl.manual_seed (make_sequential)
        return optim.AdaHessian(params, lr=0.05, weight_decay=0.01)
    if kind == "switch":
        return optim.SwitchOptimizer(params, lr=LR, tol=SWITCH_TOL)
    return optim.Adam(params, lr=LR) if kind == "adam" else optim.SGD(params, lr=0.1, momentum=0.9)


def sequential_batches(batch: int):
    rng = np.random.default_rng(13)
    return rng.normal(size=(STEPS, batch, 6)), rng.integers(0, 3, size=(STEPS, batch))


def train_sequential(model, opt, batch: int, comm=None, after_backward=None, clip=None, create_graph=False):
    """STEPS steps on the fixed batches; with ``comm``, each rank takes its slice of every batch;
    ``clip(max_norm)`` clips the gradients (after ``after_backward``) and returns the norm before;
    ``create_graph``: the backward records its graph (AdaHessian)."""
    from minidl.parallel import shard
    xs, ys = sequential_batches(batch)
    norms = []
    for x, y in zip(xs, ys):
        if comm is not None:
            x, y = shard(x, comm.rank, comm.size), shard(y, comm.rank, comm.size)
        opt.zero_grad()
        F.cross_entropy(model(mdl.tensor(x)), mdl.tensor(y)).backward(create_graph=create_graph)
        if after_backward is not None:
            after_backward()
        if clip is not None:
            norms.append(float(clip(CLIP)))
        opt.step()
    return norms


def zero_reference(name: str, with_state: bool = False):
    """The plain single-process run of a ZeRO scenario: the final parameters (and the optimizer's state_dict)."""
    _, kind, batch = ZERO_RUNS[name]
    model = make_sequential()
    clip = (lambda max_norm: nn.utils.clip_grad_norm_(model.parameters(), max_norm)) if name.endswith("clip") else None
    opt = make_optimizer(kind, model.parameters())
    train_sequential(model, opt, batch, clip=clip, create_graph=kind == "adahessian")
    params = [p.array.copy() for p in model.parameters()]
    return (params, opt.state_dict()) if with_state else params


# ---------------------------------------------------------------- pipelines
PIPELINE_RUNS = {
    # name: (schedule, micro-batches); the global batch is 12
    "pipe_gpipe": ("gpipe", 4),
    "pipe_1f1b": ("1f1b", 4),
    "pipe_1f1b_few": ("1f1b", 2),     # fewer micro-batches than 4 stages: the warm-up is cut short
}


def make_stack(seed: int = 0):
    """Eight layers (four Linear, three Tanh, an Identity): 2 or 4 stages of equal length, each with weights."""
    mdl.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(),
                         nn.Linear(8, 3), nn.Identity()).to(dtype=np.float64)


def cross_entropy(out, y):
    return F.cross_entropy(out, mdl.tensor(y))


def pipeline_reference() -> tuple[dict, list]:
    """The plain run: the final state dict and the losses of 4 Adam steps on batches of 12."""
    model = make_stack()
    opt = optim.Adam(model.parameters(), lr=LR)
    xs, ys = sequential_batches(12)
    losses = []
    for x, y in zip(xs, ys):
        opt.zero_grad()
        loss = cross_entropy(model(mdl.tensor(x)), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return dict(model.state_dict()), losses
