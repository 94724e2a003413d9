"""nn.MoE: routing, capacity, dropped tokens and the auxiliary loss against a hand-written loop over tokens;
gradients by finite differences in float64; bad input."""
import math

import numpy as np
import pytest

import minidl as mdl
from minidl import nn


def _layer(k, capacity_factor, groups=1, experts=4, seed=0):
    mdl.manual_seed(seed)
    return nn.MoE(6, 5, 3, num_experts=experts, k=k, capacity_factor=capacity_factor, groups=groups,
                  dtype=np.float64)


def _numbers(layer):
    router = layer.router.weight.numpy()
    experts = [(e.fc1.weight.numpy(), e.fc1.bias.numpy(), e.fc2.weight.numpy(), e.fc2.bias.numpy())
               for e in layer.experts]
    return router, experts


def reference(x, router, experts, k, capacity_factor, groups):
    """The layer written as a loop over tokens, one group at a time (Switch / GShard, as the docstring says)."""
    tokens, E = len(x), len(experts)
    logits = x @ router.T
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    per_group = tokens // groups
    capacity = math.ceil(capacity_factor * per_group * k / E)
    y = np.zeros((tokens, experts[0][2].shape[0]))
    dropped, aux = 0, 0.0
    for g in range(groups):
        group = range(g * per_group, (g + 1) * per_group)
        choices = {t: sorted(range(E), key=lambda i: (-p[t, i], i))[:k] for t in group}
        queued = [0] * E
        for j in range(k):                      # every first choice of the group, then every second one
            for t in group:
                e = choices[t][j]
                if queued[e] < capacity:
                    gate = p[t, e] if k == 1 else p[t, e] / sum(p[t, c] for c in choices[t])
                    w1, b1, w2, b2 = experts[e]
                    y[t] += gate * (np.maximum(x[t] @ w1.T + b1, 0) @ w2.T + b2)
                else:
                    dropped += 1
                queued[e] += 1
        f = np.array([np.mean([choices[t][0] == i for t in group]) for i in range(E)])
        aux += E * np.sum(f * p[list(group)].mean(0)) / groups
    return y, dropped, aux


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("capacity_factor,groups", [(4.0, 1), (0.75, 1), (0.75, 2), (1.0, 3)])
def test_forward_dropped_tokens_and_aux_loss_equal_the_loop_over_tokens(k, capacity_factor, groups):
    layer = _layer(k, capacity_factor, groups)
    x = np.random.default_rng(1).normal(size=(12, 6))
    y = layer(mdl.tensor(x))
    want, dropped, aux = reference(x, *_numbers(layer), k, capacity_factor, groups)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-12, atol=1e-12)
    assert layer.dropped_tokens == dropped
    assert (dropped > 0) == (capacity_factor < 1.5)  # the cases cover both: nothing dropped, and drops
    np.testing.assert_allclose(layer.aux_loss.item(), aux, rtol=1e-12)


def test_leading_axes_are_tokens_and_a_dropped_token_gets_zero():
    layer = _layer(1, 1.0)
    with mdl.no_grad():
        layer.router.weight.array[...] = 0.0  # uniform probabilities: every token's first choice is expert 0
    x = np.random.default_rng(2).normal(size=(2, 4, 6))
    y = layer(mdl.tensor(x)).numpy().reshape(8, 3)
    capacity = math.ceil(1.0 * 8 * 1 / 4)  # 2: the first two tokens fit
    assert layer.routing.capacity == capacity and layer.dropped_tokens == 8 - capacity
    w1, b1, w2, b2 = _numbers(layer)[1][0]
    rows = x.reshape(8, 6)[:capacity]
    np.testing.assert_allclose(y[:capacity], 0.25 * (np.maximum(rows @ w1.T + b1, 0) @ w2.T + b2), rtol=1e-12)
    np.testing.assert_array_equal(y[capacity:], 0.0)
    # f = (1, 0, 0, 0), P = (1/4, ...): aux = E · 1 · 1/4 = 1, Switch's value for a uniform router
    np.testing.assert_allclose(layer.aux_loss.item(), 1.0, rtol=1e-12)


def _numeric_gradient(loss, array, eps=1e-6):
    grad = np.zeros_like(array)
    for i in np.ndindex(array.shape):
        keep = array[i]
        array[i] = keep + eps
        up = loss()
        array[i] = keep - eps
        down = loss()
        array[i] = keep
        grad[i] = (up - down) / (2 * eps)
    return grad


@pytest.mark.parametrize("k", [1, 2])
def test_gradients_of_input_router_and_experts_match_finite_differences(k):
    layer = _layer(k, 0.75, groups=2)
    rng = np.random.default_rng(3)
    x = mdl.tensor(rng.normal(size=(8, 6)), requires_grad=True)
    weights = mdl.tensor(rng.normal(size=(8, 3)))

    def loss_of(inp):
        return (layer(inp) * weights).sum() + 0.7 * layer.aux_loss

    loss_of(x).backward()
    routing = layer.routing
    assert layer.dropped_tokens > 0  # the dropped pairs' zero gates are part of what is checked
    assert mdl.gradcheck(loss_of, (x,))

    def loss():
        with mdl.no_grad():
            value = loss_of(x.detach()).item()
        np.testing.assert_array_equal(layer.routing.experts, routing.experts)  # routing fixed under eps
        np.testing.assert_array_equal(layer.routing.kept, routing.kept)
        return value

    busy = int(np.bincount(routing.experts[routing.kept], minlength=4).argmax())
    for p in (layer.router.weight, layer.experts[busy].fc1.weight, layer.experts[busy].fc2.bias):
        np.testing.assert_allclose(p.grad.numpy(), _numeric_gradient(loss, p.array), rtol=1e-6, atol=1e-8)


def test_an_expert_that_receives_no_token_gets_no_gradient():
    layer = _layer(1, 1.0)
    with mdl.no_grad():
        layer.router.weight.array[...] = 0.0
    layer(mdl.tensor(np.random.default_rng(4).normal(size=(8, 6)))).sum().backward()
    assert layer.experts[0].fc1.weight.grad is not None
    assert all(layer.experts[e].fc1.weight.grad is None for e in (1, 2, 3))


def test_bad_arguments_and_inputs_are_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"MoE: k must be 1 \(Switch\) or 2 \(GShard\)"):
        nn.MoE(4, 8, num_experts=4, k=3)
    with pytest.raises(ValueError, match="capacity_factor must be > 0"):
        nn.MoE(4, 8, capacity_factor=0)
    with pytest.raises(ValueError, match="num_experts must be an int >= 1"):
        nn.MoE(4, 8, num_experts=0)
    layer = nn.MoE(4, 8, groups=3)
    with pytest.raises(ValueError, match=r"input of shape \(5, 3\) has 3 features, expected 4"):
        layer(mdl.tensor(np.zeros((5, 3), np.float32)))
    with pytest.raises(ValueError, match="5 tokens do not cut into 3 equal groups"):
        layer(mdl.tensor(np.zeros((5, 4), np.float32)))


@pytest.mark.parametrize("k", [1, 2])
def test_the_layer_runs_on_either_device_with_the_cpus_numbers(device, k):
    x = np.random.default_rng(5).normal(size=(12, 6))
    results = []
    for where in ("cpu", device):
        layer = _layer(k, 0.75, groups=2).to(where)
        inp = mdl.tensor(x, device=where, requires_grad=True)
        y = layer(inp)
        (y.sum() + layer.aux_loss).backward()
        results.append((y.numpy(), inp.grad.numpy(), layer.router.weight.grad.numpy(), layer.dropped_tokens))
    (y0, gx0, gr0, d0), (y1, gx1, gr1, d1) = results
    assert d0 == d1 > 0
    for a, b in ((y0, y1), (gx0, gx1), (gr0, gr1)):
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-14)
