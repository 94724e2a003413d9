"""``minidl gpt train --device cuda`` on the CuPy stand-in (the GPU where there is one): the same run as on
the CPU, its model on the device."""
import pytest

from minidl.models.gpt_train import DEFAULTS, train

SETTINGS = ["--steps", "4", "--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
            "--batch-size", "4", "--eval-every", "2", "--warmup", "1", "--quiet"]


def test_the_run_on_cuda_is_the_cpu_run(standin_or_gpu):
    s = dict(DEFAULTS, steps=4, n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4, eval_every=2,
             warmup=1)
    on_gpu, on_cpu = train(s, None, show=False, device="cuda"), train(s, None, show=False)
    assert all(p.device.startswith("cuda") for p in on_gpu["trainer"].model.parameters())
    # float32 on both; a GPU's reductions add in another order: a few ulps per step
    assert on_gpu["val_loss"] == pytest.approx(on_cpu["val_loss"], rel=1e-4)


def test_the_command_takes_device_cuda(standin_or_gpu, tmp_path, capsys):
    from minidl.cli import main
    assert main(["gpt", "train", *SETTINGS, "--device", "cuda", "--out", str(tmp_path / "run")]) == 0
    printed = capsys.readouterr().out
    assert "on cuda" in printed and "validation loss" in printed
    assert (tmp_path / "run" / "gpt.safetensors").exists()
