"""Assignment 4 (the optimizers): wrong update equations as students write them."""
from tests.course.mistakes import Mistake

OPTIM = "minidl.optim"
SGD = f"{OPTIM}.sgd.sgd_update"
ADAGRAD, RMSPROP, ADADELTA = (f"{OPTIM}.adaptive.adagrad_update", f"{OPTIM}.adaptive.rmsprop_update",
                              f"{OPTIM}.adaptive.adadelta_update")
ADAM, DECAY = f"{OPTIM}.adam.adam_update", f"{OPTIM}.regularization.decay_weights_"
LARS, LAMB = f"{OPTIM}.layerwise.lars_update", f"{OPTIM}.layerwise.lamb_update"

_SGD = """
xp = xp_of(w)
tmp = xp.empty_like(w) if tmp is None else tmp
{decay}
if momentum:
    b *= momentum
    b += xp.multiply(g, 1 - dampening, out=tmp) if dampening else g
    direction = {nesterov}
else:
    direction = g
w {sign}= xp.multiply(direction, lr, out=tmp)
"""


def _sgd(decay="g = l2_gradient(g, w, weight_decay)", nesterov="g + momentum * b if nesterov else b", sign="-"):
    return _SGD.format(decay=decay, nesterov=nesterov, sign=sign)


_RMSPROP = """
xp = xp_of(w)
g = l2_gradient(g, w, weight_decay)
s *= rho
s += {square}
if g_avg is not None:
    g_avg *= rho
    g_avg += (1 - rho) * g
    denom = {root_centered}
else:
    denom = {root}
r = g / denom
if momentum:
    b *= momentum
    b += r
    r = b
w -= lr * r
"""

_ADADELTA = """
xp = xp_of(w)
g = l2_gradient(g, w, weight_decay)
v *= rho
v += (1 - rho) * g * g
{body}
w {sign}= lr * delta
"""

_ADAM = """
xp = xp_of(w)
if decoupled:
    decay_weights_(w, lr, weight_decay)
else:
    g = l2_gradient(g, w, weight_decay)
m *= beta1
m += (1 - beta1) * g
v *= beta2
v += (1 - beta2) * g * g
if v_max is not None:
    v = xp.maximum(v_max, v, out=v_max)
{hats}
step = lr * m_hat / (xp.sqrt(v_hat) + eps)
w -= step
return step
"""

_LARS = """
xp = xp_of(w)
if adapt is False{adapt_1d}:
    local, decay = 1.0, 0.0
else:
    w_norm, g_norm = norm(w), norm(g)
    local = trust_coefficient * {ratio}
    local = xp.where((w_norm > 0) & (g_norm > 0), local, 1)
    decay = weight_decay
b *= momentum
b += lr * local * (g + decay * w)
w -= b
"""

_LAMB = """
xp = xp_of(w)
adam_moments(g, m, v, beta1=beta1, beta2=beta2, tmp=xp.empty_like(w))
m_hat, v_hat = bias_corrected(m, beta1, t), bias_corrected(v, beta2, t)
r = m_hat / (xp.sqrt(v_hat) + eps)
u = r + weight_decay * w if weight_decay else r
trust = {trust}
w -= lr * trust * u
"""

MISTAKES = [
    Mistake("4.1", "Nesterov's step taken from b alone", {SGD: _sgd(nesterov="b")}, ("missing Nesterov look-ahead",),
            public_passes=True),
    Mistake("4.1", "weight decay added into the gradient in place", {SGD: _sgd(decay="g += weight_decay * w")},
            ("in-place write into a saved input",), public_passes=True),
    Mistake("4.1", "the step taken uphill", {SGD: _sgd(sign="+")}, ("sign",)),
    Mistake("4.2", "AdaGrad with ε under the root", {ADAGRAD: """
g = l2_gradient(g, w, weight_decay)
s += g * g
w -= lr * g / xp_of(w).sqrt(s + eps)
"""}, ("ε inside the square root",)),
    Mistake("4.2", "RMSProp with ε under the root", {RMSPROP: _RMSPROP.format(
        square="(1 - rho) * g * g", root_centered="xp.sqrt(s - g_avg ** 2 + eps)", root="xp.sqrt(s + eps)")},
        ("ε inside the square root",)),
    Mistake("4.2", "RMSProp's average without 1 − ρ", {RMSPROP: _RMSPROP.format(
        square="g * g", root_centered="xp.sqrt(s - g_avg ** 2) + eps", root="xp.sqrt(s) + eps")}, ("missing scale",)),
    Mistake("4.3", "E[Δw²] updated with g before Δw is taken", {ADADELTA: _ADADELTA.format(body="""
u *= rho
u += (1 - rho) * g * g
delta = xp.sqrt(u + eps) / xp.sqrt(v + eps) * g""", sign="-")}, ("updated too early",)),
    Mistake("4.3", "no ε in the numerator: AdaDelta never starts", {ADADELTA: _ADADELTA.format(body="""
delta = xp.sqrt(u) / xp.sqrt(v + eps) * g
u *= rho
u += (1 - rho) * delta * delta""", sign="-")}, ("missing term",)),
    Mistake("4.3", "Δw added", {ADADELTA: _ADADELTA.format(body="""
delta = xp.sqrt(u + eps) / xp.sqrt(v + eps) * g
u *= rho
u += (1 - rho) * delta * delta""", sign="+")}, ("sign",)),
    Mistake("4.4", "the corrections with t + 1", {ADAM: _ADAM.format(
        hats="m_hat = m / (1 - beta1 ** (t + 1))\nv_hat = v / (1 - beta2 ** (t + 1))")},
        ("bias correction t off by one",)),
    Mistake("4.4", "no bias correction", {ADAM: _ADAM.format(hats="m_hat, v_hat = m, v")},
            ("missing bias correction",)),
    Mistake("4.4", "decoupled decay without the learning rate", {DECAY: """
if weight_decay:
    w *= 1.0 - weight_decay
return w
"""}, ("missing scale",)),
    Mistake("4.5", "LARS's trust ratio upside down", {LARS: _LARS.format(
        adapt_1d="", ratio="trust_ratio(g_norm + weight_decay * w_norm, w_norm)")}, ("trust ratio inverted",)),
    Mistake("4.5", "LARS's ratio without β‖w‖ below", {LARS: _LARS.format(
        adapt_1d="", ratio="trust_ratio(w_norm, g_norm)")}, ("missing term",), public_passes=True),
    Mistake("4.5", "LARS adapts biases too", {LARS: _LARS.format(
        adapt_1d=" and False", ratio="trust_ratio(w_norm, g_norm + weight_decay * w_norm)")},
        ("1-D layers adapted",), public_passes=True),
    Mistake("4.5", "LAMB's trust ratio from the Adam direction alone",
            {LAMB: _LAMB.format(trust="trust_ratio(norm(w), norm(r))")}, ("missing term",), public_passes=True),
    Mistake("4.5", "LAMB's trust ratio upside down", {LAMB: _LAMB.format(trust="trust_ratio(norm(u), norm(w))")},
            ("trust ratio inverted",)),
]
