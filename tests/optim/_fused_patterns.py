"""Every optimizer's fused update, in every pattern of zero and non-zero hyperparameters it can produce.

The fused GPU kernel of an update depends on the update function, on which
hyperparameters are zero (a Python ``if weight_decay:`` is resolved while
tracing), on which optional state exists (``v_max`` for AMSGrad, ``b`` with
momentum...) and on flags (``nesterov``, ``decoupled``), exactly as
``kernels._cache_key`` says. Rather than list those patterns by hand, this
module builds every optimizer of ``minidl.optim`` with every combination of
zero and non-zero constructor hyperparameters the constructor accepts, runs a
few steps on the CPU, and records each ``run_update`` call: what it records is
what the GPU would compile, and a new optimizer or hyperparameter is covered
without editing a list.
"""
import contextlib
import functools
import inspect
import itertools
import numbers

import numpy as np

import minidl as mdl
from minidl import optim
from minidl.optim import kernels

STEPS = 8  # past RAdam's rectification threshold (t > 5) and the default Lookahead/Ranger k (5, 6)
NON_ZERO = 0.1  # a hyperparameter whose default is zero is also tried at this value


def _choices(default):
    """The values tried for one constructor argument."""
    if default is inspect.Parameter.empty:  # a required hyperparameter such as SGD's lr
        return [0.0, NON_ZERO]
    if isinstance(default, (bool, np.bool_)):
        return [False, True]
    if isinstance(default, numbers.Real):
        return [type(default)(0), default if default else NON_ZERO]
    if isinstance(default, tuple) and all(isinstance(x, numbers.Real) for x in default):
        return list(itertools.product(*[[0.0, x if x else NON_ZERO] for x in default]))
    return [default]  # None (a seed), strings: kept as they are


def _optimizer_classes():
    classes = [getattr(optim, name) for name in optim.__all__]
    # LBFGS steps with a closure and works on the whole parameter vector in plain xp calls: no fused kernel
    return [c for c in classes if inspect.isclass(c) and issubclass(c, optim.Optimizer)
            and c not in (optim.Optimizer, optim.LBFGS)]


def _loss(params):
    return sum(((p * p * p) * 0.1 + p * p).sum() for p in params)


@contextlib.contextmanager
def _recording(calls):
    original = kernels._run_chunked

    def record(fn, args):
        calls.append((fn, dict(args)))
        return original(fn, args)

    kernels._run_chunked = record
    try:
        yield
    finally:
        kernels._run_chunked = original


def _param():
    return mdl.tensor(np.array([0.5, -1.0, 2.0], np.float32), requires_grad=True)


def _drive(cls, hyper):
    """Run ``cls`` built with ``hyper`` for a few steps (False when the constructor rejects ``hyper``)."""
    params = [_param()]
    first = list(inspect.signature(cls.__init__).parameters)[1]
    try:
        if first == "optimizer":  # Lookahead wraps an inner optimizer
            opt = cls(optim.SGD(params, lr=NON_ZERO), **hyper)
        else:
            opt = cls(params, **hyper)
    except (ValueError, TypeError):
        return False
    create_graph = isinstance(opt, optim.AdaHessian)
    for _ in range(STEPS):
        opt.zero_grad()
        _loss(params).backward(create_graph=create_graph)
        opt.step()
    return True


@functools.lru_cache(maxsize=None)
def fused_patterns():
    """``{cache key: (optimizer names, fn, args)}``: each distinct fused call any optimizer makes."""
    calls_by_owner = []
    with np.errstate(all="ignore"):
        for cls in _optimizer_classes():
            signature = inspect.signature(cls.__init__)
            names = list(signature.parameters)[2:]  # after self and params/optimizer
            grid = [_choices(signature.parameters[n].default) for n in names]
            for values in itertools.product(*grid):
                hyper = dict(zip(names, values))
                calls = []
                with _recording(calls):
                    _drive(cls, hyper)
                calls_by_owner += [(cls.__name__, fn, args) for fn, args in calls]
        calls = []
        with _recording(calls):  # SWA is no Optimizer: it averages weights on request
            for n in range(2):
                swa = optim.SWA([_param()])
                for _ in range(n + 1):
                    swa.update()
        calls_by_owner += [("SWA", fn, args) for fn, args in calls]
    patterns = {}
    for owner, fn, args in calls_by_owner:
        args = kernels._without_scratch(args)
        key = kernels._cache_key(fn, args)
        owners, _, _ = patterns.setdefault(key, (set(), fn, args))
        owners.add(owner)
    return patterns
