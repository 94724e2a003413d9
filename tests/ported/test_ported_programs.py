"""Two programs of PyTorch's tutorial "Learning PyTorch with Examples" (polynomial_custom_function.py and
polynomial_nn.py, BSD-licensed, kept here as they are but for the line `import torch`, now `import minidl as
torch`), run as they are, and checked against PyTorch running the same text with `import torch`."""
import contextlib
import io
import re
import runpy
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).parent
IMPORT = "import minidl as torch\n"


def run(name: str, library: str, folder: Path):
    """Run the program with `import <library> as torch`: (its globals, the losses it printed)."""
    text = (HERE / name).read_text()
    assert text.count(IMPORT) == 1  # the one line that differs from the original
    path = HERE / name
    if library == "torch":
        pytest.importorskip("torch")
        path = folder / name  # the original text, for PyTorch's run
        path.write_text(text.replace(IMPORT, "import torch\n"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        scope = runpy.run_path(str(path), run_name="__main__")
    losses = [float(m.group(1)) for m in re.finditer(r"^\d+ (\S+)$", out.getvalue(), re.MULTILINE)]
    return scope, losses


def test_the_custom_function_program_gives_pytorchs_losses_and_weights(tmp_path):
    """Deterministic start (a, b, c, d given), so both runs take the same 2,000 float32 steps: they agree
    to float32 rounding (seen: 4e-7 relative after 2,000 steps; 1e-4 leaves room for other BLAS sums)."""
    ours, our_losses = run("polynomial_custom_function.py", "minidl", tmp_path)
    theirs, their_losses = run("polynomial_custom_function.py", "torch", tmp_path)
    assert len(our_losses) == 20
    np.testing.assert_allclose(our_losses, their_losses, rtol=1e-4)
    for name in "abcd":
        np.testing.assert_allclose(ours[name].item(), theirs[name].item(), rtol=1e-4, atol=1e-8)


def test_the_nn_program_trains_and_its_loss_and_gradients_equal_pytorchs_at_its_weights(tmp_path):
    """The program starts from a random Linear: the two runs start apart. It must still train (its printed
    loss falls), and at the weights it ends with, PyTorch's loss and gradients equal minidl's (float32)."""
    torch = pytest.importorskip("torch")
    ours, losses = run("polynomial_nn.py", "minidl", tmp_path)
    assert len(losses) == 20 and losses[-1] < losses[0]
    layer = ours["linear_layer"]
    assert ours["xx"].dtype == np.float32  # float32 ** int64 stays float32, as in PyTorch
    model = torch.nn.Sequential(torch.nn.Linear(3, 1), torch.nn.Flatten(0, 1))
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor(layer.weight.numpy()))
        model[0].bias.copy_(torch.tensor(layer.bias.numpy()))
    loss = torch.nn.MSELoss(reduction="sum")(model(torch.tensor(ours["xx"].numpy())), torch.tensor(ours["y"].numpy()))
    loss.backward()
    ours["model"].zero_grad()
    our_loss = ours["loss_fn"](ours["model"](ours["xx"]), ours["y"])
    our_loss.backward()
    np.testing.assert_allclose(our_loss.item(), loss.item(), rtol=1e-5)
    # dL/dW = Σ_n 2 r_n xx_n is a sum of 2,000 terms that nearly cancel near the optimum: float32 sums
    # in another order differ by a few ulps of the terms' magnitudes, so that is the tolerance's scale.
    xx = ours["xx"].numpy().astype(np.float64)
    residual = (xx @ layer.weight.numpy()[0].astype(np.float64) + layer.bias.numpy()[0]) - ours["y"].numpy()
    magnitude = 2 * np.abs(residual) @ np.abs(np.column_stack([xx, np.ones(len(xx))]))
    got = np.append(layer.weight.grad.numpy()[0], layer.bias.grad.numpy())
    want = np.append(model[0].weight.grad.numpy()[0], model[0].bias.grad.numpy())
    assert np.all(np.abs(got - want) <= 1e-5 * magnitude), (got, want, magnitude)
