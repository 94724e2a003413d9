"""L-BFGS: a quasi-Newton method that keeps the last m curvature pairs instead of a Hessian.

Notation of Nocedal & Wright, *Numerical Optimization* (2nd ed.), chapters 3 and 7. At
iterate x_k with gradient ∇f_k the step is x_{k+1} = x_k + α_k p_k, with the direction

    p_k = −H_k ∇f_k                                           (7.18)

where H_k, the inverse-Hessian approximation, is never formed: it is applied to ∇f_k by the
**two-loop recursion** (Algorithm 7.4) from the stored pairs

    s_i = x_{i+1} − x_i,   y_i = ∇f_{i+1} − ∇f_i,   ρ_i = 1 / (y_iᵀ s_i)

    q ← ∇f_k
    for i = k−1, …, k−m:   α_i ← ρ_i s_iᵀ q;   q ← q − α_i y_i
    r ← H_k⁰ q,            H_k⁰ = γ_k I,   γ_k = s_{k−1}ᵀ y_{k−1} / y_{k−1}ᵀ y_{k−1}      (7.20)
    for i = k−m, …, k−1:   β ← ρ_i y_iᵀ r;  r ← r + s_i (α_i − β)
    p_k = −r

A pair is kept only when y_iᵀ s_i > 10⁻¹⁰ (the curvature condition, which keeps H_k positive
definite); the oldest is dropped beyond ``history_size`` pairs.

The step length α_k is ``lr`` (the first iteration: min(1, 1/‖∇f_0‖₁)·lr), or, with
``line_search_fn="strong_wolfe"``, a point satisfying the strong Wolfe conditions

    f(x + α p) ≤ f(x) + c₁ α ∇fᵀp,     |∇f(x + α p)ᵀ p| ≤ c₂ |∇fᵀp|      (3.7)

found by bracketing and zooming (Algorithms 3.5 and 3.6), each trial the minimizer of the
cubic through two points' values and slopes (3.59). The algorithm, its stopping tests
(``tolerance_grad`` on max|∇f|, ``tolerance_change`` on the step and on the loss) and its
counts (``max_iter`` iterations and ``max_eval`` evaluations per ``step(closure)``) are
PyTorch's ``torch.optim.LBFGS`` (itself minFunc's), so a ported program follows the same
iterates.
"""
from __future__ import annotations

import math
import numbers

from minidl.autograd import enable_grad, no_grad
from minidl.optim.optimizer import Optimizer
from minidl.optim.saved_state import checked_state, on_device
from minidl.tensor import mark_changed

# ---------------------------------------------------------------- the update equations


def two_loop_direction(grad, s_history, y_history, rho_history, gamma):
    """p = −H ∇f by the two-loop recursion (Nocedal & Wright, Algorithm 7.4), H⁰ = γ I (7.20)."""
    q = grad.copy()
    alphas = [0.0] * len(s_history)
    for i in reversed(range(len(s_history))):
        alphas[i] = rho_history[i] * float(s_history[i] @ q)
        q -= alphas[i] * y_history[i]
    r = gamma * q
    for i in range(len(s_history)):
        beta = rho_history[i] * float(y_history[i] @ r)
        r += (alphas[i] - beta) * s_history[i]
    return -r


def cubic_minimizer(a1, f1, g1, a2, f2, g2, bounds=None):
    """The minimizer of the cubic through (a1, f1) and (a2, f2) with slopes g1, g2, clipped to ``bounds``.

    Nocedal & Wright (3.59): d₁ = g₁ + g₂ − 3 (f₁ − f₂)/(a₁ − a₂),  d₂ = √(d₁² − g₁g₂),
    a = a₂ − (a₂ − a₁)(g₂ + d₂ − d₁)/(g₂ − g₁ + 2d₂) (written from the farther point). Without
    a real minimizer (d₁² < g₁g₂) the middle of the bounds.
    """
    low, high = bounds if bounds is not None else (min(a1, a2), max(a1, a2))
    d1 = g1 + g2 - 3 * (f1 - f2) / (a1 - a2)
    d2_square = d1 * d1 - g1 * g2
    if d2_square < 0:
        return (low + high) / 2.0
    d2 = math.sqrt(d2_square)
    if a1 <= a2:
        a = a2 - (a2 - a1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
    else:
        a = a1 - (a1 - a2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2))
    return min(max(a, low), high)


def strong_wolfe_search(phi, alpha, f0, g0, slope0, p, c1=1e-4, c2=0.9, tolerance_change=1e-9, max_evals=25):
    """A step α along ``p`` meeting the strong Wolfe conditions (3.7): (f, ∇f, α, evaluations).

    ``phi(α)`` returns (f(x + α p), ∇f(x + α p)); ``slope0 = ∇f(x)ᵀp < 0``. The bracketing phase
    (Nocedal & Wright, Algorithm 3.5) grows α by cubic extrapolation until an interval
    [α_lo, α_hi] must hold an acceptable point; the zoom phase (Algorithm 3.6) shrinks it by
    cubic interpolation, a trial too close to an end moved to 10% of the interval inside it.
    """
    p_size = float(abs(p).max())
    f, g = phi(alpha)
    evals, slope = 1, float(g @ p)
    a_prev, f_prev, g_prev, slope_prev = 0.0, f0, g0, slope0
    done = False
    tries = 0
    while tries < max_evals:  # bracketing
        if f > f0 + c1 * alpha * slope0 or (tries > 1 and f >= f_prev):
            bracket = [[a_prev, f_prev, g_prev, slope_prev], [alpha, f, g, slope]]
            break
        if abs(slope) <= -c2 * slope0:
            bracket, done = [[alpha, f, g, slope]], True
            break
        if slope >= 0:
            bracket = [[a_prev, f_prev, g_prev, slope_prev], [alpha, f, g, slope]]
            break
        grown = cubic_minimizer(a_prev, f_prev, slope_prev, alpha, f, slope,
                                bounds=(alpha + 0.01 * (alpha - a_prev), alpha * 10))
        a_prev, f_prev, g_prev, slope_prev = alpha, f, g, slope
        alpha = grown
        f, g = phi(alpha)
        evals, slope, tries = evals + 1, float(g @ p), tries + 1
    if tries == max_evals:
        bracket = [[0.0, f0, g0, slope0], [alpha, f, g, slope]]

    lo, hi = (0, 1) if bracket[0][1] <= bracket[-1][1] else (1, 0)
    insufficient = False
    while not done and tries < max_evals:  # zoom
        (a_a, f_a, _, s_a), (a_b, f_b, _, s_b) = bracket
        if abs(a_b - a_a) * p_size < tolerance_change:
            break
        alpha = cubic_minimizer(a_a, f_a, s_a, a_b, f_b, s_b)
        top, bottom = max(a_a, a_b), min(a_a, a_b)
        margin = 0.1 * (top - bottom)
        if min(top - alpha, alpha - bottom) < margin:  # too close to an end of the interval
            if insufficient or alpha >= top or alpha <= bottom:
                alpha = top - margin if abs(alpha - top) < abs(alpha - bottom) else bottom + margin
                insufficient = False
            else:
                insufficient = True
        else:
            insufficient = False
        f, g = phi(alpha)
        evals, slope, tries = evals + 1, float(g @ p), tries + 1
        if f > f0 + c1 * alpha * slope0 or f >= bracket[lo][1]:
            bracket[hi] = [alpha, f, g, slope]  # sufficient decrease fails: a new high end
            lo, hi = (0, 1) if bracket[0][1] <= bracket[1][1] else (1, 0)
        else:
            if abs(slope) <= -c2 * slope0:
                done = True
            elif slope * (bracket[hi][0] - bracket[lo][0]) >= 0:
                bracket[hi] = bracket[lo]  # the old low end becomes the high end
            bracket[lo] = [alpha, f, g, slope]
    alpha, f, g, _ = bracket[lo]
    return f, g, alpha, evals


# ---------------------------------------------------------------- the optimizer
class LBFGS(Optimizer):
    """LBFGS (Liu & Nocedal 1989; Nocedal & Wright 2006, chapter 7), as ``torch.optim.LBFGS``; the
    equations are in the module's text.

    ``step(closure)`` runs up to ``max_iter`` iterations (``max_eval`` evaluations of the
    closure, default ``max_iter * 5 // 4``); the closure zeroes the gradients, computes the
    loss, calls ``backward`` and returns the loss. One parameter group only (the parameters
    are one long vector x); the state (the pairs s, y, ρ; the last direction and step) is the
    optimizer's, kept under the first parameter's position. It costs
    ``(2 · history_size + 3)`` copies of the parameters.

    Args:
        lr: the step length scale (default 1).
        max_iter: iterations per ``step`` (default 20).
        max_eval: closure evaluations per ``step`` (default ``max_iter * 5 // 4``).
        tolerance_grad: stop when max|∇f| ≤ this (default 1e-7).
        tolerance_change: stop when the step or the change of the loss is below this (default 1e-9).
        history_size: the number m of pairs kept (default 100).
        line_search_fn: None (a fixed step ``lr``) or ``"strong_wolfe"``.
    """

    def __init__(self, params, lr: float = 1, max_iter: int = 20, max_eval: int | None = None,
                 tolerance_grad: float = 1e-7, tolerance_change: float = 1e-9, history_size: int = 100,
                 line_search_fn: str | None = None):
        if max_eval is None and isinstance(max_iter, numbers.Integral):
            max_eval = max_iter * 5 // 4
        defaults = dict(lr=lr, max_iter=max_iter, max_eval=max_eval, tolerance_grad=tolerance_grad,
                        tolerance_change=tolerance_change, history_size=history_size,
                        line_search_fn=line_search_fn)
        super().__init__(params, defaults)
        if len(self.param_groups) != 1:
            raise ValueError(f"LBFGS: one parameter group only (the parameters are one vector), got "
                             f"{len(self.param_groups)}; pass the parameters as one list")
        self._params = self.param_groups[0]["params"]

    def check_group(self, group: dict):
        super().check_group(group)
        for name in ("max_iter", "max_eval", "history_size"):
            value = group[name]
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"LBFGS: {name} must be a whole number ≥ 1, got {name}={value!r}")
        for name in ("tolerance_grad", "tolerance_change"):
            value = group[name]
            if not isinstance(value, numbers.Real) or not value >= 0:
                raise ValueError(f"LBFGS: {name} must be a number ≥ 0, got {name}={value!r}")
        if group["line_search_fn"] not in (None, "strong_wolfe"):
            raise ValueError(f"LBFGS: line_search_fn must be None or 'strong_wolfe', got "
                             f"{group['line_search_fn']!r}")

    # ------------------------------------------------------------ checkpoints
    # The state is the whole vector's, not a parameter's: vectors of the total size, lists of them.
    _COUNTS, _NUMBERS, _VECTORS, _HISTORIES = ("func_evals", "n_iter"), ("t", "H_diag", "prev_loss"), \
        ("d", "prev_flat_grad"), ("old_dirs", "old_stps")

    def check_state_dict(self, state_dict) -> None:
        """Raise ValueError saying what is wrong when ``load_state_dict(state_dict)`` would fail; change nothing."""
        self._checked(state_dict)

    def load_state_dict(self, state_dict: dict):
        """Restore the hyperparameters and the history saved by ``state_dict()``; all checked first."""
        groups, state = self._checked(state_dict)
        device = self._params[0].device
        self.param_groups[0].update(groups[0])
        self.state = {0: {k: [on_device(a, device) for a in v] if k in self._HISTORIES else on_device(v, device)
                          for k, v in state.items()}} if state else {}

    def _checked(self, state_dict):
        if not (isinstance(state_dict, dict) and isinstance(state_dict.get("state"), dict)):
            checked_state(self, state_dict)  # raises, naming what is wrong
        groups, _ = checked_state(self, {**state_dict, "state": {}})  # the groups, checked as every optimizer's
        saved = state_dict["state"]
        if not saved:
            return groups, {}
        size = sum(p.numel() for p in self._params)
        where = "LBFGS.load_state_dict: the state"
        if set(saved) - {0, "0"} or not isinstance(next(iter(saved.values())), dict):
            raise ValueError(f"{where} must be {{0: {{...}}}} as LBFGS.state_dict() returns, got keys {list(saved)}")
        state = next(iter(saved.values()))
        known = set(self._COUNTS + self._NUMBERS + self._VECTORS + self._HISTORIES + ("ro",))
        if set(state) - known or not set(self._COUNTS) <= set(state):
            raise ValueError(f"{where} has the keys {sorted(state)}; expected {sorted(self._COUNTS)} and some of "
                             f"{sorted(known - set(self._COUNTS))}")

        def vector(name, value):
            if not (hasattr(value, "shape") and tuple(value.shape) == (size,)):
                raise ValueError(f"{where}: {name} must be a vector of the parameters' total size {size}, "
                                 f"got {getattr(value, 'shape', type(value).__name__)}")

        for name in self._VECTORS:
            if name in state:
                vector(name, state[name])
        lengths = {len(state.get(name, ())) for name in self._HISTORIES + ("ro",)}
        if len(lengths) != 1 or lengths.pop() > self.param_groups[0]["history_size"]:
            raise ValueError(f"{where}: old_dirs, old_stps and ro must be lists of one length, at most "
                             f"history_size={self.param_groups[0]['history_size']}")
        for name in self._HISTORIES:
            for i, value in enumerate(state.get(name, ())):
                vector(f"{name}[{i}]", value)
        for name in self._NUMBERS + self._COUNTS:
            if name in state and not (isinstance(state[name], numbers.Real) and math.isfinite(state[name])):
                raise ValueError(f"{where}: {name} must be a finite number, got {state[name]!r}")
        return groups, state

    # ------------------------------------------------------------ x as one vector
    def _flat_grad(self):
        xp = self._params[0].xp
        return xp.concatenate([p.xp.zeros(p.numel(), p.dtype) if p.grad is None else p.grad.array.reshape(-1)
                               for p in self._params])

    def _move(self, alpha, p):
        """x ← x + α p, parameter by parameter (in place)."""
        offset = 0
        for w in self._params:
            n = w.numel()
            w.array += alpha * p[offset:offset + n].reshape(w.shape)
            offset += n
        mark_changed(*self._params)

    def _evaluate(self, closure) -> float:
        with enable_grad():
            return float(closure())

    def step(self, closure=None):
        """Run up to ``max_iter`` L-BFGS iterations on the loss that ``closure`` computes; return its first value."""
        if closure is None or not callable(closure):
            raise TypeError("LBFGS.step needs a closure that recomputes the loss: "
                            "def closure(): opt.zero_grad(); loss = ...; loss.backward(); return loss")
        with no_grad():
            return self._iterate(closure)

    def _iterate(self, closure):
        group = self.param_groups[0]
        lr, max_iter, max_eval = group["lr"], group["max_iter"], group["max_eval"]
        tolerance_grad, tolerance_change = group["tolerance_grad"], group["tolerance_change"]
        state = self.state.setdefault(0, {})
        state.setdefault("func_evals", 0)
        state.setdefault("n_iter", 0)

        with enable_grad():
            first_loss = closure()
        loss = float(first_loss)
        evals = 1
        state["func_evals"] += 1
        grad = self._flat_grad()
        if float(abs(grad).max()) <= tolerance_grad:
            return first_loss

        p, alpha = state.get("d"), state.get("t")
        s_history, y_history = state.get("old_stps"), state.get("old_dirs")
        rho_history, gamma = state.get("ro"), state.get("H_diag")
        prev_grad, prev_loss = state.get("prev_flat_grad"), state.get("prev_loss")
        done_here = 0
        while done_here < max_iter:
            done_here += 1
            state["n_iter"] += 1
            if state["n_iter"] == 1:  # steepest descent until there is a pair
                p, s_history, y_history, rho_history, gamma = -grad, [], [], [], 1.0
            else:
                y, s = grad - prev_grad, alpha * p
                ys = float(y @ s)
                if ys > 1e-10:  # the curvature condition yᵀs > 0: keep the pair
                    if len(s_history) == group["history_size"]:
                        s_history.pop(0), y_history.pop(0), rho_history.pop(0)
                    s_history.append(s), y_history.append(y), rho_history.append(1.0 / ys)
                    gamma = ys / float(y @ y)  # (7.20)
                p = two_loop_direction(grad, s_history, y_history, rho_history, gamma)
            prev_grad, prev_loss = grad.copy(), loss

            alpha = min(1.0, 1.0 / float(abs(grad).sum())) * lr if state["n_iter"] == 1 else lr
            slope = float(grad @ p)
            if slope > -tolerance_change:  # not a descent direction any more
                break

            used = 0
            if group["line_search_fn"] == "strong_wolfe":
                start = [w.array.copy() for w in self._params]

                def phi(a):
                    self._move(a, p)
                    value, g = self._evaluate(closure), self._flat_grad()
                    for w, saved in zip(self._params, start):
                        w.array[...] = saved
                    mark_changed(*self._params)
                    return value, g

                loss, grad, alpha, used = strong_wolfe_search(phi, alpha, loss, grad, slope, p,
                                                              tolerance_change=1e-9, max_evals=max_eval - evals)
                self._move(alpha, p)
                small_grad = float(abs(grad).max()) <= tolerance_grad
            else:
                self._move(alpha, p)
                small_grad = False
                if done_here != max_iter:  # the last iteration's loss is the next step's first
                    loss, grad, used = self._evaluate(closure), self._flat_grad(), 1
                    small_grad = float(abs(grad).max()) <= tolerance_grad
            evals += used
            state["func_evals"] += used

            if done_here == max_iter or evals >= max_eval or small_grad:
                break
            if float(abs(alpha * p).max()) <= tolerance_change or abs(loss - prev_loss) < tolerance_change:
                break  # no progress

        state.update(d=p, t=alpha, old_dirs=y_history, old_stps=s_history, ro=rho_history, H_diag=gamma,
                     prev_flat_grad=prev_grad, prev_loss=prev_loss)
        return first_loss
