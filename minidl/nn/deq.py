"""Deep equilibrium layer: the output is a fixed point z* = f(z*, x), differentiated implicitly.

Bai, Kolter and Koltun, "Deep Equilibrium Models" (NeurIPS 2019). A weight-tied
layer f applied again and again, z_{k+1} = f(z_k, x), converges (when f is a
contraction in z) to its equilibrium z* = f(z*, x): an "infinitely deep"
network of one layer. Two things make it cheap in memory:

**Forward**: z* is found by a root solver on g(z) = f(z, x) − z with no graph
recorded (Anderson acceleration by default, plain iteration as an option);
the iterations leave nothing behind.

**Backward**: by the implicit function theorem, z* = f(z*, x) gives
dz* = (∂f/∂z) dz* + (∂f/∂x) dx, so for a loss L with u = ∂L/∂z*

    dL/dx = gᵀ ∂f/∂x,   dL/dθ = gᵀ ∂f/∂θ,   where   g = (∂f/∂z)ᵀ g + u            (1)

at z*: g is itself a fixed point, of a linear map that needs only
vector–Jacobian products y ↦ (∂f/∂z)ᵀ y, which one graph of f at z* gives.
The same solver finds g. The layer records one application of f at z* (its
activations: one layer's memory, whatever the number of iterations), and a
hook on its output replaces the incoming gradient u by the solution g of (1)
before the engine backpropagates it through that application to x and θ.

``DEQ(f, solver="anderson", max_iter=50, tol=1e-6)``: ``f(z, x)`` a Module or
function returning a tensor of z's shape. ``forward(x, z0=None)`` starts from
zeros of x's shape unless ``z0`` is given. ``forward_info`` and
``backward_info`` hold the last solve's iterations and relative residual
‖f(z) − z‖ / ‖f(z)‖.
"""
from __future__ import annotations

import numpy as np

from minidl import autograd
from minidl.autograd import no_grad
from minidl.nn.module import Module
from minidl.tensor import Tensor

__all__ = ["DEQ", "anderson", "fixed_point_iteration", "SOLVERS"]


def _relative_residual(fz, z, xp) -> float:
    return float(xp.linalg.norm(fz - z)) / (float(xp.linalg.norm(fz)) + 1e-30)


def fixed_point_iteration(g, z0, max_iter: int = 50, tol: float = 1e-6):
    """z ← g(z) until ‖g(z) − z‖ / ‖g(z)‖ < tol or max_iter calls: (z, {'iterations', 'residual'}).

    ``g`` maps an array to an array of the same shape; converges when g is a contraction.
    """
    xp, z, residual, k = _xp(z0), z0, np.inf, 0
    for k in range(1, max_iter + 1):
        gz = g(z)
        residual = _relative_residual(gz, z, xp)
        z = gz
        if residual < tol:
            break
    return z, {"iterations": k, "residual": residual}


def anderson(g, z0, max_iter: int = 50, tol: float = 1e-6, memory: int = 5, beta: float = 1.0,
             lam: float = 1e-10):
    """Anderson acceleration of z ← g(z) (Walker and Ni, 2011): (z, {'iterations', 'residual'}).

    With the last m iterates x_i, their images g_i = g(x_i) and residuals f_i = g_i − x_i,
    the weights α minimize ‖Σ α_i f_i‖ subject to Σ α_i = 1, from the bordered system

        [ 0   1ᵀ        ] [ν]   [1]
        [ 1   F Fᵀ + λI ] [α] = [0]      (λ relative: ``lam`` times the mean ‖f_i‖²),

    and the next iterate is β Σ α_i g_i + (1 − β) Σ α_i x_i. One g call per iteration;
    m = 1 is plain (damped) iteration.
    """
    xp = _xp(z0)
    shape, dtype = z0.shape, z0.dtype
    xs, gs = [z0.reshape(-1)], [g(z0).reshape(-1)]
    calls = 1
    residual = _relative_residual(gs[0], xs[0], xp)
    z = gs[0]
    while residual >= tol and calls < max_iter:
        m = len(xs)
        X, G = xp.stack(xs), xp.stack(gs)
        F = G - X
        H = xp.zeros((m + 1, m + 1), dtype=np.float64)
        H[0, 1:] = H[1:, 0] = 1
        gram = xp.asarray(F @ F.T, dtype=np.float64)
        H[1:, 1:] = gram + lam * (float(xp.trace(gram)) / m + 1e-300) * xp.eye(m)  # λ relative to the residuals
        rhs = xp.zeros(m + 1, dtype=np.float64)
        rhs[0] = 1
        alpha = xp.linalg.solve(H, rhs)[1:].astype(dtype)
        z = beta * (alpha @ G) + (1 - beta) * (alpha @ X)
        gz = g(z.reshape(shape)).reshape(-1)
        calls += 1
        residual = _relative_residual(gz, z, xp)
        xs, gs = (xs + [z])[-memory:], (gs + [gz])[-memory:]
        z = gz
    return z.reshape(shape), {"iterations": calls, "residual": residual}


SOLVERS = {"anderson": anderson, "iteration": fixed_point_iteration}


def _xp(array):
    return Tensor(array).xp


class DEQ(Module):
    """z* = f(z*, x) by a fixed-point solver; gradients by the implicit function theorem (module docstring)."""

    def __init__(self, f, solver: str = "anderson", max_iter: int = 50, tol: float = 1e-6,
                 backward_max_iter: int | None = None, backward_tol: float | None = None):
        super().__init__()
        if not callable(f):
            raise TypeError(f"DEQ: f must be a Module or function f(z, x), got {type(f).__name__}")
        if solver not in SOLVERS:
            raise ValueError(f"DEQ: solver must be one of {sorted(SOLVERS)}, got {solver!r}")
        for name, value in (("max_iter", max_iter), ("backward_max_iter", backward_max_iter)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"DEQ: {name} must be a positive integer, got {value!r}")
        if isinstance(f, Module):
            self.f = f
        else:
            self._function = f
        self.solver, self.max_iter, self.tol = solver, max_iter, tol
        self.backward_max_iter = max_iter if backward_max_iter is None else backward_max_iter
        self.backward_tol = tol if backward_tol is None else backward_tol
        self.forward_info = self.backward_info = None

    def _f(self, z, x):
        return self.f(z, x) if "f" in self._modules else self._function(z, x)

    def forward(self, x, z0=None):
        if z0 is None:
            z0 = Tensor(x.xp.zeros(x.shape, x.dtype))
        elif not isinstance(z0, Tensor):
            raise TypeError(f"DEQ: z0 must be a Tensor or None, got {type(z0).__name__}")
        solve = SOLVERS[self.solver]

        def step(z):
            out = self._f(Tensor(z), x)
            if out.shape != z.shape:
                raise ValueError(f"DEQ: f(z, x) returned shape {out.shape} for z of shape {z.shape}; f must "
                                 "map z to its own shape (give z0 of the state's shape if it is not x's)")
            return out.array

        with no_grad():
            z_star, self.forward_info = solve(step, z0.array, self.max_iter, self.tol)
        if not autograd.is_grad_enabled():
            return Tensor(z_star)
        # One application of f at z*, recorded: its graph reaches x and θ, and gives the products (∂f/∂z)ᵀ y.
        z_leaf = Tensor(z_star, requires_grad=True)
        z = self._f(z_leaf, x)
        if z.requires_grad:
            z.register_hook(self._implicit_gradient(z, z_leaf))
        return z

    def _implicit_gradient(self, z, z_leaf):
        """The hook on the output: u ↦ g, the solution of g = (∂f/∂z)ᵀ g + u (equation 1)."""
        solve = SOLVERS[self.solver]
        inside = []  # non-empty while the products below walk the graph from z, which calls this hook again

        def hook(u):
            if inside:
                return None  # a product's own seed: passed on unchanged
            u_array = u.array if isinstance(u, Tensor) else u

            def adjoint_step(y):
                inside.append(True)
                try:
                    vjp, = autograd.grad([z], [z_leaf], grad_outputs=[Tensor(y)], retain_graph=True)
                finally:
                    inside.pop()
                return vjp.array + u_array
            g, self.backward_info = solve(adjoint_step, u_array, self.backward_max_iter, self.backward_tol)
            return Tensor(g)
        return hook

    def extra_repr(self) -> str:
        return f"solver={self.solver!r}, max_iter={self.max_iter}, tol={self.tol}"
