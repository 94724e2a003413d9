"""minidl.nn.prune: magnitude masks (hand-computed and against torch.nn.utils.prune), masks kept through training."""
import numpy as np
import pytest

import minidl as mdl
from minidl import nn, optim
from minidl.data import DataLoader, gaussian_blobs
from minidl.nn.prune import Pruning, global_magnitude_masks, layerwise_magnitude_masks, sparsity_schedule
from minidl.train import Trainer

# Two small "layers" whose magnitudes make global and layer-wise pruning disagree.
W1 = np.array([[0.1, -0.5], [0.3, 0.05]])
W2 = np.array([[1.0, -2.0, 0.4, 3.0]])


def test_global_threshold_by_hand():
    # 8 weights, sparsity 0.5 -> the 4 smallest |w| of all: 0.05, 0.1, 0.3, 0.4.
    m1, m2 = global_magnitude_masks([W1, W2], 0.5)
    np.testing.assert_array_equal(m1, [[False, True], [False, False]])
    np.testing.assert_array_equal(m2, [[True, True, False, True]])


def test_layerwise_threshold_by_hand():
    # Each layer loses half of its own weights: 0.05 and 0.1 of W1; 0.4 and 1.0 of W2.
    m1, m2 = layerwise_magnitude_masks([W1, W2], 0.5)
    np.testing.assert_array_equal(m1, [[False, True], [True, False]])
    np.testing.assert_array_equal(m2, [[False, True, False, True]])


def test_pruned_weights_are_pruned_first_and_stay_pruned():
    # W1[0, 1] = -0.5 was pruned before; a global sparsity of 0.25 (2 of 8) adds only the smallest, 0.05.
    old = [np.array([[True, False], [True, True]]), np.ones(W2.shape, bool)]
    m1, m2 = global_magnitude_masks([W1, W2], 0.25, masks=old)
    np.testing.assert_array_equal(m1, [[True, False], [True, False]])
    assert m2.all()
    m1, m2 = layerwise_magnitude_masks([W1, W2], 0.5, masks=old)
    np.testing.assert_array_equal(m1, [[True, False], [True, False]])  # -0.5 and 0.05


@pytest.mark.parametrize("sparsity", [0.0, 0.3, 0.7, 1.0])
def test_against_torch_prune(sparsity):
    torch = pytest.importorskip("torch")
    from torch.nn.utils import prune as tprune
    rng = np.random.default_rng(0)
    shapes = [(6, 5), (4, 6), (3, 4)]
    arrays = [rng.standard_normal(s) * (i + 1) for i, s in enumerate(shapes)]  # layers of different scales
    layers = [torch.nn.Linear(s[1], s[0]) for s in shapes]
    for layer, a in zip(layers, arrays):
        with torch.no_grad():
            layer.weight.copy_(torch.tensor(a, dtype=torch.float32))
    tprune.global_unstructured([(layer, "weight") for layer in layers], tprune.L1Unstructured, amount=sparsity)
    for ours, layer in zip(global_magnitude_masks(arrays, sparsity), layers):
        np.testing.assert_array_equal(ours, layer.weight_mask.numpy().astype(bool))
    for ours, a in zip(layerwise_magnitude_masks(arrays, sparsity), arrays):
        layer = torch.nn.Linear(a.shape[1], a.shape[0])
        with torch.no_grad():
            layer.weight.copy_(torch.tensor(a, dtype=torch.float32))
        tprune.l1_unstructured(layer, "weight", amount=sparsity)
        np.testing.assert_array_equal(ours, layer.weight_mask.numpy().astype(bool))


def test_global_concentrates_zeros_in_the_layer_of_small_weights():
    rng = np.random.default_rng(1)
    small, large = rng.standard_normal((20, 20)) * 0.1, rng.standard_normal((20, 20))
    g_small, g_large = global_magnitude_masks([small, large], 0.5)
    l_small, l_large = layerwise_magnitude_masks([small, large], 0.5)
    assert (~g_small).sum() > 300 and (~g_large).sum() < 100
    assert (~l_small).sum() == (~l_large).sum() == 200


def test_sparsity_schedule():
    np.testing.assert_allclose(sparsity_schedule(0.9, 3), [0.9 * (1 - 8 / 27), 0.9 * (1 - 1 / 27), 0.9])
    np.testing.assert_allclose(sparsity_schedule(0.8, 4, kind="linear"), [0.2, 0.4, 0.6, 0.8])
    np.testing.assert_allclose(sparsity_schedule(0.9, 2, initial=0.5), [0.9 - 0.4 / 8, 0.9])
    with pytest.raises(ValueError, match="rounds"):
        sparsity_schedule(0.9, 0)
    with pytest.raises(ValueError, match="sparsity"):
        sparsity_schedule(1.5, 3)
    with pytest.raises(ValueError, match="kind"):
        sparsity_schedule(0.5, 3, kind="exp")


def _model(seed=0):
    mdl.manual_seed(seed)
    return nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 3)).to(dtype=np.float64)


def _batch(seed=0):
    x, y = gaussian_blobs(n=64, centers=3, seed=seed)
    return mdl.tensor(x.astype(np.float64)), mdl.tensor(y)


def _train(model, opt, steps, x, y):
    for _ in range(steps):
        opt.zero_grad()
        mdl.functional.cross_entropy(model(x), y).backward()
        opt.step()


def test_pruning_zeroes_and_reports():
    model = _model()
    pruning = Pruning(model)
    assert list(pruning.params) == ["0.weight", "2.weight"]  # weights only, no biases
    w = {n: p.numpy().copy() for n, p in pruning.params.items()}
    pruning.prune(0.5, scope="layer")
    for n, p in pruning.params.items():
        expected = layerwise_magnitude_masks([w[n]], 0.5)[0]
        np.testing.assert_array_equal(p.numpy(), np.where(expected, w[n], 0.0))
    rows = pruning.report()
    assert [r["name"] for r in rows] == ["0.weight", "2.weight", "total"]
    assert [r["zeros"] for r in rows] == [16, 24, 40] and rows[-1]["size"] == 80
    assert pruning.sparsity() == 0.5
    text = pruning.format_report()
    assert "0.weight" in text and "50.0%" in text


OPTIMIZERS = {
    "sgd-momentum": lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9),
    "sgd-nesterov-wd": lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-2),
    "adam-wd": lambda ps: optim.Adam(ps, lr=0.01, weight_decay=1e-2),
    "adamw": lambda ps: optim.AdamW(ps, lr=0.01, weight_decay=0.1),
    "rmsprop": lambda ps: optim.RMSProp(ps, lr=0.01),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_masks_stay_zero_through_training(name):
    x, y = _batch()
    model = _model()
    opt = OPTIMIZERS[name](model.parameters())
    _train(model, opt, 5, x, y)  # momentum / moment state built up before pruning
    pruning = Pruning(model)
    pruning.attach(opt)
    pruning.prune(0.6, scope="global")
    masks = {n: m.copy() for n, m in pruning.masks.items()}
    before = {n: p.numpy().copy() for n, p in pruning.params.items()}
    _train(model, opt, 10, x, y)
    for n, p in pruning.params.items():
        assert (p.numpy()[~masks[n]] == 0).all(), n
        assert (p.numpy()[masks[n]] != before[n][masks[n]]).any(), n  # the kept weights do train
    assert pruning.sparsity() == pytest.approx(0.6)


def test_without_the_hook_momentum_would_revive_pruned_weights():
    # The reason for masking the weights after every step: a zero gradient alone does not stop them.
    x, y = _batch()
    model = _model()
    opt = optim.Adam(model.parameters(), lr=0.01)
    _train(model, opt, 5, x, y)
    pruning = Pruning(model).prune(0.6)
    for _ in range(3):
        opt.zero_grad()
        mdl.functional.cross_entropy(model(x), y).backward()
        pruning.mask_grads_()  # gradients masked, weights not
        opt.step()
    revived = sum(int((p.numpy()[~pruning.masks[n]] != 0).sum()) for n, p in pruning.params.items())
    assert revived > 0


def _pruned_nonzero(pruning, masks):
    return sum(int((p.numpy()[~masks[n]] != 0).sum()) for n, p in pruning.params.items())


def test_mask_grads_and_remove_restores_the_step():
    x, y = _batch()
    model = _model()
    opt = optim.SGD(model.parameters(), lr=0.1)
    pruning = Pruning(model).prune(0.5)
    masks = {n: m.copy() for n, m in pruning.masks.items()}
    handle = pruning.attach(opt)
    mdl.functional.cross_entropy(model(x), y).backward()
    pruning.mask_grads_()
    for n, p in pruning.params.items():
        assert (p.grad.numpy()[~pruning.masks[n]] == 0).all()
        assert (p.grad.numpy()[pruning.masks[n]] != 0).any()
    second, third = pruning.attach(opt), pruning.attach(opt)  # attached three times: each one masks alone
    _train(model, opt, 2, x, y)
    assert _pruned_nonzero(pruning, masks) == 0
    handle.remove()
    second.remove()  # the handles come off in any order
    _train(model, opt, 2, x, y)
    assert _pruned_nonzero(pruning, masks) == 0  # the third attachment still masks
    third.remove()
    _train(model, opt, 2, x, y)  # the optimizer's own step again: the pruned weights get gradients
    assert _pruned_nonzero(pruning, masks) > 0


def test_attach_refuses_what_has_no_step_hooks():
    pruning = Pruning(_model())
    with pytest.raises(TypeError, match="Pruning.attach: expected a minidl optimizer"):
        pruning.attach(object())


def test_iterative_pruning_under_the_trainer():
    x, y = gaussian_blobs(n=120, centers=3, seed=0)
    model = _model()
    opt = optim.Adam(model.parameters(), lr=0.01, weight_decay=1e-3)
    loader = DataLoader((x.astype(np.float64), y), batch_size=32, shuffle=True, seed=0)
    trainer = Trainer(model, opt, loader, progress=False, seed=0)
    trainer.fit(epochs=2)
    pruning = Pruning(model)
    pruning.attach(opt)
    for round_, sparsity in enumerate(sparsity_schedule(0.8, 3), start=1):
        pruning.prune(sparsity)
        masks = {n: m.copy() for n, m in pruning.masks.items()}
        trainer.fit(epochs=2 + 2 * round_)
        for n, p in pruning.params.items():
            assert (p.numpy()[~masks[n]] == 0).all()
        assert pruning.sparsity() == pytest.approx(round(sparsity * 80) / 80)
    assert pruning.sparsity() == pytest.approx(0.8)


def test_bad_arguments():
    model = _model()
    with pytest.raises(KeyError, match="no parameter"):
        Pruning(model, names=["3.weight"])
    with pytest.raises(ValueError, match="nothing to prune"):
        Pruning(nn.Sequential(nn.ReLU()))
    pruning = Pruning(model, names=["0.weight", "0.bias"])
    with pytest.raises(ValueError, match="scope"):
        pruning.prune(0.5, scope="row")
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        pruning.prune(1.2)
    pruning.prune(0.5)
    assert pruning.report()[-1]["zeros"] == 24


def test_pruning_on_device(device):
    """The masks live on the weights' device; the same masks as on the CPU; zeros kept under the Trainer."""
    from minidl import backend
    x, y = gaussian_blobs(n=64, centers=3, seed=0)
    model = _model().to(dtype=np.float32)
    cpu_masks = Pruning(_model().to(dtype=np.float32)).prune(0.5).masks
    model.to(device)
    opt = optim.Adam(model.parameters(), lr=0.01, weight_decay=1e-2)
    pruning = Pruning(model)
    pruning.attach(opt)
    pruning.prune(0.5)
    for n, mask in pruning.masks.items():
        assert backend.xp_of(mask) is model[0].weight.xp
        np.testing.assert_array_equal(backend.to_numpy(mask), cpu_masks[n])
    Trainer(model, opt, DataLoader((x.astype(np.float32), y), batch_size=16), device=device, progress=False).fit(2)
    for n, p in pruning.params.items():
        assert (backend.to_numpy(p.array)[~cpu_masks[n]] == 0).all()
    assert pruning.sparsity() == 0.5


def _blobs_trainer(model, opt):
    x, y = gaussian_blobs(n=120, centers=3, seed=0)
    loader = DataLoader((x.astype(np.float64), y), batch_size=32, shuffle=True, seed=0)
    return Trainer(model, opt, loader, progress=False, seed=0)


def test_the_masks_are_in_the_state_dict_with_pytorchs_spelling():
    model = _model()
    pruning = Pruning(model).prune(0.5)
    state = model.state_dict()
    masks = {k: v for k, v in state.items() if k.endswith("_mask")}
    assert sorted(masks) == sorted(f"{n}_mask" for n in pruning.params)   # "0.weight" -> "0.weight_mask"
    for n, p in pruning.params.items():
        assert masks[f"{n}_mask"].dtype == np.bool_
        np.testing.assert_array_equal(masks[f"{n}_mask"], p.numpy() != 0)
    fresh = _model()
    with pytest.raises(ValueError, match="unexpected keys"):   # strict, as PyTorch: the masks need their buffers
        fresh.load_state_dict(state)
    again = Pruning.for_state_dict(fresh, state)
    fresh.load_state_dict(state)
    assert sorted(again.params) == sorted(pruning.params)
    for n in pruning.params:
        np.testing.assert_array_equal(again.masks[n], pruning.masks[n])


def test_a_resumed_pruned_run_keeps_its_sparsity(tmp_path):
    model = _model()
    opt = optim.Adam(model.parameters(), lr=0.01)
    trainer = _blobs_trainer(model, opt)
    trainer.fit(epochs=1)
    pruning = Pruning(model).prune(0.5)
    pruning.attach(opt)
    trainer.fit(epochs=2)
    trainer.save_checkpoint(tmp_path / "last.safetensors")
    assert pruning.sparsity() == pytest.approx(0.5)

    resumed_model = _model()
    resumed_opt = optim.Adam(resumed_model.parameters(), lr=0.01)
    resumed = Pruning(resumed_model)          # as the script that resumes builds it: masks all True
    resumed.attach(resumed_opt)
    trainer = _blobs_trainer(resumed_model, resumed_opt)
    trainer.load_checkpoint(tmp_path / "last.safetensors")
    assert resumed.sparsity() == pytest.approx(0.5)
    trainer.fit(epochs=3)                     # one epoch after the resume
    assert resumed.sparsity() == pytest.approx(0.5)
    for n in pruning.params:
        np.testing.assert_array_equal(resumed.masks[n], pruning.masks[n])
        assert (resumed.params[n].numpy()[~pruning.masks[n]] == 0).all()


def test_minidl_train_resume_keeps_a_pruned_checkpoints_sparsity(tmp_path, capsys):
    from minidl.cli import main
    from minidl.train.classifiers import build_model
    assert main(["train", "--data", "spirals", "--epochs", "1", "--quiet", "--out", str(tmp_path / "dense")]) == 0
    state = mdl.load(tmp_path / "dense" / "last.safetensors")
    model = build_model("mlp", (2,), 2)
    model.load_state_dict(state["model"])
    pruning = Pruning(model).prune(0.5)       # prune the trained weights, then fine-tune with --resume
    state["model"] = model.state_dict()
    (tmp_path / "pruned").mkdir()
    mdl.save(state, tmp_path / "pruned" / "last.safetensors")
    capsys.readouterr()
    assert main(["train", "--resume", str(tmp_path / "pruned" / "last.safetensors"), "--epochs", "2",
                 "--quiet"]) == 0
    weights = mdl.load(tmp_path / "pruned" / "model.safetensors")
    zeros = sum(int((weights[n] == 0).sum()) for n in pruning.params)
    size = sum(weights[n].size for n in pruning.params)
    assert zeros / size == pytest.approx(0.5, abs=0.5 / size)
    for n in pruning.params:
        np.testing.assert_array_equal(weights[f"{n}_mask"], pruning.masks[n])
        assert (weights[n][~pruning.masks[n]] == 0).all()
    assert main(["predict", str(tmp_path / "pruned"), "--out", str(tmp_path / "p")]) == 0   # loads the masks
    assert "accuracy" in capsys.readouterr().out
