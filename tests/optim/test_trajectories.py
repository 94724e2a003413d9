"""The trajectory figure of `minidl optimizers`."""
import numpy as np

from minidl import optim
from minidl.optim import trajectories


def test_gradient_descent_on_the_ravine_is_the_closed_form():
    """∇f = (x/10, 2y): each step multiplies x by (1 − lr/10) and y by (1 − 2·lr)."""
    path = trajectories.trajectory(lambda p: optim.SGD(p, lr=0.3), trajectories.ravine, (-9.0, 2.0), steps=15)
    k = np.arange(16)
    np.testing.assert_allclose(path[:, 0], -9.0 * (1 - 0.03) ** k, rtol=1e-12)
    np.testing.assert_allclose(path[:, 1], 2.0 * (1 - 0.6) ** k, rtol=1e-12, atol=1e-15)


def test_momentum_beats_sgd_along_the_ravine():
    """The book's figure, with each method at its best constant setting for curvatures μ = 0.1, L = 2:
    gradient descent lr = 2/(L + μ) contracts by (κ − 1)/(κ + 1) per step, heavy-ball momentum
    (lr = 4/(√L + √μ)², momentum = ((√κ − 1)/(√κ + 1))²) by (√κ − 1)/(√κ + 1), κ = L/μ = 20."""
    mu, L = 0.1, 2.0
    sgd = trajectories.trajectory(lambda p: optim.SGD(p, lr=2 / (L + mu)), trajectories.ravine, (-9.0, 2.0), 60)
    heavy = trajectories.trajectory(lambda p: optim.SGD(p, lr=4 / (L ** 0.5 + mu ** 0.5) ** 2, momentum=(
        (20 ** 0.5 - 1) / (20 ** 0.5 + 1)) ** 2), trajectories.ravine, (-9.0, 2.0), 60)
    assert trajectories.ravine(*heavy[-1]) < 1e-10 * trajectories.ravine(*sgd[-1])


def test_divergence_stops_the_path():
    path = trajectories.trajectory(lambda p: optim.SGD(p, lr=2.0), trajectories.ravine, (-9.0, 2.0), 200)
    assert len(path) < 201 and np.all(np.isfinite(path))


def test_optimizers_command_writes_the_grid(tmp_path):
    out = trajectories.optimizers_command(str(tmp_path / "grid.png"), steps=15)
    assert out.endswith("grid.png")
    assert open(out, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert not [f for f in tmp_path.iterdir() if f.name != "grid.png"]  # no temporary file left
