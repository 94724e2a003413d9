"""Training on "cuda" (the CuPy stand-in without a GPU): checkpoints hold device state, and a resume is
bit-exact (weights, optimizer moments, GPU dropout masks, loader order)."""
import numpy as np
import pytest

import minidl as mdl
from minidl import backend, nn, optim
from minidl.data import DataLoader
from minidl.train import Trainer


def _data(n=96, features=12, classes=4, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, features)).astype(np.float32)
    return x, (x[:, :classes].argmax(axis=1)).astype(np.int64)


def _mlp(seed):
    mdl.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 4))


def _trainer(seed, steps_seed=0):
    x, y = _data()
    model = _mlp(seed)
    loader = DataLoader((x, y), batch_size=16, shuffle=True, seed=steps_seed)
    return Trainer(model, optim.Adam(model.parameters(), lr=1e-2, weight_decay=1e-3), loader,
                   device="cuda", progress=False, max_grad_norm=1.0, log_every=4, seed=seed)


def _weights(trainer):
    state = trainer.model.state_dict()
    return {k: backend.to_numpy(v.array if isinstance(v, mdl.Tensor) else v) for k, v in state.items()}


def test_save_and_load_a_state_dict_of_device_arrays(standin_or_gpu, tmp_path):
    model = nn.Linear(3, 2).to("cuda")
    state = {**model.state_dict(), "extra": {"moment": mdl.randn(4, device="cuda").array, "step": 3}}
    mdl.save(state, tmp_path / "w.safetensors")
    loaded = mdl.load(tmp_path / "w.safetensors")
    for name in ("weight", "bias"):
        value = state[name]
        np.testing.assert_array_equal(loaded[name], backend.to_numpy(value.array if isinstance(value, mdl.Tensor)
                                                                    else value))
    np.testing.assert_array_equal(loaded["extra"]["moment"], backend.to_numpy(state["extra"]["moment"]))
    assert loaded["extra"]["step"] == 3
    fresh = nn.Linear(3, 2).to("cuda")
    fresh.load_state_dict({k: loaded[k] for k in ("weight", "bias")})
    assert fresh.weight.device.startswith("cuda")
    np.testing.assert_array_equal(fresh.weight.numpy(), model.weight.numpy())


def test_resume_on_cuda_is_bit_exact(standin_or_gpu, tmp_path):
    straight = _trainer(seed=0)
    straight.fit(epochs=2)

    first = _trainer(seed=0)
    first.fit(epochs=2, max_steps=7)  # stops mid-epoch, between log reads
    first.save_checkpoint(tmp_path / "run.ckpt")
    saved = mdl.load(tmp_path / "run.ckpt")
    assert "minidl_cuda" in str(saved.keys()) or any("minidl_cuda" in str(k) for k in _keys(saved))

    resumed = _trainer(seed=123, steps_seed=5)  # different weights, seed and order until loaded
    mdl.randn(10, device="cuda")  # and the GPU generator moved on
    resumed.load_checkpoint(tmp_path / "run.ckpt")
    resumed.fit(epochs=2)

    for name, value in _weights(straight).items():
        np.testing.assert_array_equal(_weights(resumed)[name], value, err_msg=name)
    assert resumed.steps["loss"] == straight.steps["loss"]
    assert [r["train_loss"] for r in resumed.history] == [r["train_loss"] for r in straight.history]


def _keys(value):
    if isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _keys(v)


def test_gpu_random_state_round_trips_through_set_and_get(standin_or_gpu):
    mdl.manual_seed(3)
    mdl.rand(5, device="cuda")
    states = backend.get_gpu_rng_states()
    assert list(states) == [0] and states[0].dtype == np.int8
    expected = mdl.rand(5, device="cuda").numpy()
    mdl.rand(7, device="cuda")
    backend.set_gpu_rng_states(states)
    np.testing.assert_array_equal(mdl.rand(5, device="cuda").numpy(), expected)
    with pytest.raises(ValueError, match="int8"):
        backend.set_gpu_rng_states({0: np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match="bytes"):
        backend.set_gpu_rng_states({0: np.zeros(3, np.int8)})


def test_the_train_command_saves_and_resumes_on_cuda(standin_or_gpu, tmp_path, capsys):
    """``minidl train --device cuda``: checkpoints of device state, and a resume that continues exactly."""
    from minidl.cli import main
    common = ["train", "--quiet", "--device", "cuda", "--schedule", "constant", "--dropout", "0.2",
              "--batch-size", "128", "--clip-norm", "1.0"]
    assert main([*common, "--epochs", "2", "--out", str(tmp_path / "straight")]) == 0
    assert main([*common, "--epochs", "1", "--out", str(tmp_path / "split")]) == 0
    assert main(["train", "--quiet", "--device", "cuda", "--epochs", "2",
                 "--resume", str(tmp_path / "split" / "last.safetensors")]) == 0
    assert "resuming at step" in capsys.readouterr().out
    a = mdl.load(tmp_path / "straight" / "model.safetensors")
    b = mdl.load(tmp_path / "split" / "model.safetensors")
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def _record_devices(monkeypatch):
    """The device of the model's first parameter at each Trainer.fit of the command: where it really trained."""
    from minidl.train.trainer import Trainer as TrainerClass
    seen, fit = [], TrainerClass.fit

    def spy(self, *args, **kwargs):
        seen.append(backend.device_of(next(iter(self.model.parameters())).array))
        return fit(self, *args, **kwargs)

    monkeypatch.setattr(TrainerClass, "fit", spy)
    return seen


_SPIRALS = ["train", "--quiet", "--data", "spirals", "--lr", "0.01", "--schedule", "constant", "--dropout", "0.2",
            "--batch-size", "128"]


def test_a_resumed_run_keeps_the_device_of_its_checkpoint(standin_or_gpu, tmp_path, capsys, monkeypatch):
    """``--resume`` without ``--device`` goes on on "cuda": the same weights as the run that never stopped there."""
    from minidl.cli import main
    assert main([*_SPIRALS, "--device", "cuda", "--epochs", "2", "--out", str(tmp_path / "straight")]) == 0
    assert main([*_SPIRALS, "--device", "cuda", "--epochs", "1", "--out", str(tmp_path / "split")]) == 0
    devices = _record_devices(monkeypatch)
    assert main(["train", "--quiet", "--epochs", "2", "--resume", str(tmp_path / "split" / "last.safetensors")]) == 0
    assert "resuming at step" in capsys.readouterr().out
    assert [d.split(":")[0] for d in devices] == ["cuda"]
    assert mdl.load(tmp_path / "split" / "last.safetensors")["extra"]["settings"]["device"] == "cuda"
    a = mdl.load(tmp_path / "straight" / "model.safetensors")
    b = mdl.load(tmp_path / "split" / "model.safetensors")
    for name in a:  # GPU dropout masks come from the GPU generator: a CPU continuation would differ
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.parametrize("how", ["--device cpu given again", "a checkpoint from before the device was kept"])
def test_a_device_given_again_or_never_stored_resumes_on_the_cpu(standin_or_gpu, tmp_path, monkeypatch, how):
    from minidl.cli import main
    assert main([*_SPIRALS, "--device", "cuda", "--epochs", "1", "--out", str(tmp_path / "run")]) == 0
    path = tmp_path / "run" / "last.safetensors"
    argv = ["train", "--quiet", "--epochs", "2", "--resume", str(path)]
    if how.startswith("--device"):
        argv += ["--device", "cpu"]
    else:
        state = mdl.load(path)
        del state["extra"]["settings"]["device"]
        mdl.save(state, path)
    devices = _record_devices(monkeypatch)
    assert main(argv) == 0
    assert devices == ["cpu"]
    assert mdl.load(path)["extra"]["settings"]["device"] == "cpu"  # and the next resume stays there
