"""LoRALinear: the formula against NumPy, gradients by finite differences, merging, and bad input."""
import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from minidl import nn


def _mlp():
    mdl.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))


def test_starts_as_the_pretrained_layer_and_follows_the_formula():
    base = _mlp()[0]
    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    before = base(x).numpy()
    layer = nn.LoRALinear(base, rank=2, alpha=6)
    np.testing.assert_array_equal(layer(x).numpy(), before)          # B = 0: exactly the pretrained output
    assert layer.base is base and not base.weight.requires_grad and layer.scaling == 3.0
    rng = np.random.default_rng(1)
    layer.lora_B.array[...] = rng.standard_normal((5, 2)).astype(np.float32)
    w, b, a, bb = (t.numpy().astype(np.float64) for t in (base.weight, base.bias, layer.lora_A, layer.lora_B))
    expected = x @ w.T + b + 3.0 * (x @ a.T @ bb.T)
    np.testing.assert_allclose(layer(x).numpy(), expected, rtol=1e-5, atol=1e-5)
    # A is drawn as a Linear's weight: U(-1/sqrt(in), 1/sqrt(in))
    assert np.abs(a).max() <= 1 / np.sqrt(6) and np.abs(a).std() > 0.1


def test_gradients_reach_only_the_low_rank_factors_and_match_finite_differences():
    base = nn.Linear(4, 3).double()
    layer = nn.LoRALinear(base, rank=2, alpha=1.0)
    layer.lora_B.array[...] = np.random.default_rng(2).standard_normal((3, 2))
    x = mdl.tensor(np.random.default_rng(3).standard_normal((5, 4)))
    layer(x).sum().backward()
    assert base.weight.grad is None and base.bias.grad is None
    assert layer.lora_A.grad is not None and layer.lora_B.grad is not None
    a, b = (mdl.tensor(p.numpy(), requires_grad=True) for p in (layer.lora_A, layer.lora_B))
    fn = lambda a_, b_: F.linear(x, base.weight, base.bias) + F.linear(F.linear(x, a_), b_) * 0.5  # noqa: E731
    assert mdl.gradcheck(fn, [a, b])
    g = np.ones((5, 3))
    np.testing.assert_allclose(layer.lora_B.grad.numpy(), 0.5 * g.T @ (x.numpy() @ a.numpy().T))   # dB = s gᵀ x Aᵀ
    np.testing.assert_allclose(layer.lora_A.grad.numpy(), 0.5 * b.numpy().T @ g.T @ x.numpy())     # dA = s Bᵀ gᵀ x


def test_apply_counts_and_merge():
    model = _mlp()
    x = np.random.default_rng(4).standard_normal((7, 6)).astype(np.float32)
    keys = list(model.state_dict())
    model = nn.lora.apply_lora(model, rank=2, alpha=4)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable == ["0.lora_A", "0.lora_B", "2.lora_A", "2.lora_B"]
    assert nn.utils.count_parameters(model, trainable=True) == 2 * (6 + 5) + 2 * (5 + 3)
    for _, layer in nn.lora._lora_layers(model):
        layer.lora_B.array[...] = np.random.default_rng(5).standard_normal(layer.lora_B.shape)
    adapted = model(x).numpy()
    merged = nn.lora.merge_lora(model)
    assert all(type(m) is not nn.LoRALinear for m in merged.modules()) and list(merged.state_dict()) == keys
    np.testing.assert_allclose(merged(x).numpy(), adapted, rtol=1e-5, atol=1e-5)


def test_targets_pick_layers():
    model = nn.lora.apply_lora(_mlp(), rank=1, targets=["2"], freeze=False)
    assert type(model[0]) is nn.Linear and type(model[2]) is nn.LoRALinear and model[0].weight.requires_grad


def test_bad_input_names_the_values_and_leaves_the_model_alone():
    model = _mlp()
    with pytest.raises(ValueError, match=r"rank=4 is larger than min\(in_features, out_features\) of '2' \(5 -> 3\)"):
        nn.lora.apply_lora(model, rank=4)
    assert all(p.requires_grad for p in model.parameters()) and type(model[0]) is nn.Linear
    with pytest.raises(ValueError, match=r"rank must be an integer in \[1, min\(in_features, out_features\)\] = "
                                         r"\[1, 3\] for a Linear\(5, 3\); got 0"):
        nn.LoRALinear(model[2], rank=0)
    with pytest.raises(TypeError, match="wraps an nn.Linear, got ReLU"):
        nn.LoRALinear(model[1])
    with pytest.raises(ValueError, match=r"no nn.Linear layer matched targets=\['head'\]"):
        nn.lora.apply_lora(model, targets=["head"])
    with pytest.raises(ValueError, match="alpha must be a positive number, got -1"):
        nn.lora.apply_lora(model, alpha=-1)
    with pytest.raises(ValueError, match="no LoRALinear layer"):
        nn.lora.merge_lora(model)
    assert all(p.requires_grad for p in model.parameters())
