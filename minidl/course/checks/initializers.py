"""Assignment 5's checks: fans and gains exactly, initializers by the statistics of a large sample.

A weight of 100,000+ entries drawn by the student's initializer must lie in
the right bounds and have the right standard deviation to within 3% (its
sampling error is about 0.2%). The mistakes are recognized by the standard
deviation they would give instead: fans swapped, the gain missing or squared,
a uniform bound set to σ.
"""
from __future__ import annotations

import math

import numpy as np

import minidl
from minidl.nn import init

from .core import Mismatch, check, compare, equal, statistic


def _weight(shape, dtype="float32"):
    return minidl.tensor(np.zeros(shape, dtype))


def _fans(shape):
    receptive = int(np.prod(shape[2:])) if len(shape) > 2 else 1
    return shape[1] * receptive, shape[0] * receptive


GAINS = {"linear": 1.0, "sigmoid": 1.0, "conv2d": 1.0, "tanh": 5 / 3, "relu": math.sqrt(2.0), "selu": 0.75}


def _gain(nonlinearity, param=None):
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else param
        return math.sqrt(2.0 / (1 + slope ** 2))
    return GAINS[nonlinearity]


@check("a5.fans", public=[dict(shape=(3, 5), gain="relu"), dict(shape=(4, 2, 3, 3), gain="tanh")],
       hidden=lambda rng: [dict(shape=(int(rng.integers(2, 9)), int(rng.integers(2, 9)), int(rng.integers(2, 6))),
                                gain="leaky_relu", param=float(rng.choice([0.1, 0.2, 0.3]))),
                           dict(shape=(int(rng.integers(5, 20)), int(rng.integers(2, 5)), 3, 2), gain="linear"),
                           dict(shape=(int(rng.integers(2, 9)), int(rng.integers(10, 20))), gain="selu")],
       hidden_count=3, label=lambda p: f"a weight of shape {p['shape']}, gain of {p['gain']}"
                                       + (f" (slope {p['param']:g})" if p.get("param") else ""))
def fans(case):
    shape = tuple(case["shape"])
    expected = _fans(shape)
    got = init._calculate_fan_in_and_fan_out(_weight(shape))
    got = tuple(int(v) for v in got) if isinstance(got, (tuple, list)) else got
    equal(f"(fan_in, fan_out) of a weight of shape {shape}", expected, got,
          {"fan_in and fan_out swapped": expected[::-1], "receptive field ignored": (shape[1], shape[0])})
    gain, param = case["gain"], case.get("param")
    slope = 0.01 if param is None else param
    call = f"calculate_gain({gain!r}" + (f", {param:g})" if param is not None else ")")
    compare(call, np.float64(_gain(gain, param)), np.float64(init.calculate_gain(gain, param)), np.float64, {
                "variance for standard deviation": _gain(gain, param) ** 2,
                "missing term": math.sqrt(2.0 / (1 + slope)) if gain == "leaky_relu" else None}, exact_dtype=False)


def _sample(case, fill):
    """Fill a large weight with the student's initializer; check it stayed in place and in its dtype."""
    t = _weight(tuple(case["shape"]), case.get("dtype", "float32"))
    buffer = t.array
    returned = fill(t)
    if returned is not t:
        raise Mismatch(f"the initializer returned {type(returned).__name__}, not the tensor it was given")
    if t.array is not buffer:
        raise Mismatch("the initializer replaced the tensor's array instead of writing into it (an optimizer "
                       "holding the old array would never see the new weights)")
    if t.dtype != np.dtype(case.get("dtype", "float32")):
        raise Mismatch(f"the weight's dtype changed to {t.dtype}")
    return t.numpy().astype(np.float64)


def _check_sample(w, std, uniform, mistakes):
    n = w.size
    if abs(w.mean()) > 6 * std / math.sqrt(n):
        raise Mismatch(f"the weights' mean is {w.mean():.4g}, expected 0 (±{6 * std / math.sqrt(n):.2g})")
    if uniform:
        bound = math.sqrt(3.0) * std
        if np.abs(w).max() > bound * (1 + 1e-5):
            raise Mismatch(f"a weight of {np.abs(w).max():.6g} lies outside the bound ±{bound:.6g}",
                           [name for name, s in mistakes.items() if s and np.abs(w).max() <= math.sqrt(3) * s * 1.001])
    statistic("the weights' standard deviation", std, float(w.std()), mistakes)


def _xavier_hidden(rng):
    return [dict(shape=(int(rng.integers(150, 300)), int(rng.integers(400, 700))), gain=1.0, kind="uniform"),
            dict(shape=(64, int(rng.integers(8, 24)), 3, 3), gain=float(rng.choice([5 / 3, 2.0])), kind="normal"),
            dict(shape=(int(rng.integers(150, 300)), int(rng.integers(400, 700))), gain=math.sqrt(2), kind="uniform",
                 dtype="float64")]


@check("a5.xavier", public=[dict(shape=(256, 512), gain=1.0, kind="uniform"), dict(shape=(300, 400), gain=1.0,
                                                                                     kind="normal")],
       hidden=_xavier_hidden, hidden_count=3,
       label=lambda p: f"xavier_{p['kind']}_ on {p['shape']}, gain {p['gain']:.3g}, {p.get('dtype', 'float32')}")
def xavier(case):
    shape, gain, uniform = tuple(case["shape"]), case["gain"], case["kind"] == "uniform"
    fan_in, fan_out = _fans(shape)
    fill = init.xavier_uniform_ if uniform else init.xavier_normal_
    w = _sample(case, lambda t: fill(t, gain=gain))
    std = gain * math.sqrt(2.0 / (fan_in + fan_out))
    _check_sample(w, std, uniform, {
        "missing gain": std / gain if gain != 1 else None,
        "only one fan": gain * math.sqrt(1.0 / fan_in),
        "uniform bound is σ, not √3·σ": std / math.sqrt(3) if uniform else None,
        "variance for standard deviation": std ** 2 if abs(std ** 2 - std) > 0.1 * std else None})


def _kaiming_hidden(rng):
    return [dict(shape=(int(rng.integers(150, 300)), int(rng.integers(400, 700))), a=0.0, mode="fan_out",
                 nonlinearity="relu", kind="normal"),
            dict(shape=(32, int(rng.integers(16, 40)), 3, 3), a=float(rng.choice([0.1, 0.2])), mode="fan_in",
                 nonlinearity="leaky_relu", kind="uniform"),
            dict(shape=(int(rng.integers(150, 300)), int(rng.integers(400, 700))), a=math.sqrt(5), mode="fan_in",
                 nonlinearity="leaky_relu", kind="uniform", dtype="float64")]


@check("a5.kaiming", public=[dict(shape=(256, 512), a=0.0, mode="fan_in", nonlinearity="relu", kind="normal"),
                             dict(shape=(256, 512), a=0.0, mode="fan_in", nonlinearity="relu", kind="uniform")],
       hidden=_kaiming_hidden, hidden_count=3,
       label=lambda p: f"kaiming_{p['kind']}_ on {p['shape']}, {p['nonlinearity']} (a={p['a']:.3g}), {p['mode']}, "
                       f"{p.get('dtype', 'float32')}")
def kaiming(case):
    shape, uniform = tuple(case["shape"]), case["kind"] == "uniform"
    fan_in, fan_out = _fans(shape)
    fan, other = (fan_in, fan_out) if case["mode"] == "fan_in" else (fan_out, fan_in)
    gain = _gain(case["nonlinearity"], case["a"])
    fill = init.kaiming_uniform_ if uniform else init.kaiming_normal_
    w = _sample(case, lambda t: fill(t, a=case["a"], mode=case["mode"], nonlinearity=case["nonlinearity"]))
    std = gain / math.sqrt(fan)
    _check_sample(w, std, uniform, {
        "fan_in and fan_out swapped": gain / math.sqrt(other),
        "missing gain": 1 / math.sqrt(fan),
        "uniform bound is σ, not √3·σ": std / math.sqrt(3) if uniform else None,
        "variance for standard deviation": gain ** 2 / fan})


def _bias_hidden(rng):
    return [dict(rule="binary", n_pos=int(rng.integers(5, 50)), n_neg=int(rng.integers(100, 900))),
            dict(rule="priors", counts=[int(c) for c in rng.integers(1, 300, int(rng.integers(3, 7)))]),
            dict(rule="regression", rows=int(rng.integers(20, 60)), outputs=int(rng.integers(2, 5)), dtype="float64")]


@check("a5.bias", public=[dict(rule="binary", n_pos=10, n_neg=990), dict(rule="priors", counts=[50, 30, 20]),
                          dict(rule="regression", rows=30, outputs=1)],
       hidden=_bias_hidden, hidden_count=3,
       label=lambda p: {"binary": lambda: f"{p['n_pos']} positives and {p['n_neg']} negatives",
                        "priors": lambda: f"class counts {p['counts']}",
                        "regression": lambda: f"{p['rows']} targets of {p['outputs']} outputs"}[p["rule"]]())
def bias(case):
    dtype = np.dtype(case.get("dtype", "float32"))
    if case["rule"] == "binary":
        n_pos, n_neg = case["n_pos"], case["n_neg"]
        b = minidl.tensor(np.zeros(1, dtype))
        init.init_bias_imbalanced_binary(b, n_pos, n_neg)
        rate = n_pos / (n_pos + n_neg)
        compare("the bias", np.array([math.log(n_pos / n_neg)]), b, dtype, {
            "no logarithm": np.array([rate]), "missing normalization": np.array([math.log(rate)])})
    elif case["rule"] == "priors":
        counts = np.array(case["counts"], np.float64)
        b = minidl.tensor(np.zeros(len(counts), dtype))
        init.init_bias_class_priors(b, counts)
        compare("the bias", np.log(counts / counts.sum()), b, dtype, {
            "missing normalization": np.log(counts), "no logarithm": counts / counts.sum()})
    else:
        rows, outputs = case["rows"], case["outputs"]
        targets = (case.rng.standard_normal((rows, outputs)) * 3 + case.rng.uniform(-5, 5, outputs))
        targets = targets.reshape(rows) if outputs == 1 else targets
        b = minidl.tensor(np.zeros(outputs, dtype))
        init.init_bias_regression(b, minidl.tensor(targets.astype(dtype)))
        expected = targets.reshape(rows, -1).mean(axis=0)
        compare("the bias", expected, b, dtype, {
            "wrong axis": lambda: np.full(outputs, targets.mean()) if outputs > 1 else None,
            "missing scale": expected * rows})
