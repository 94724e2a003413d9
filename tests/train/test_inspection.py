"""show_batch draws the loader's samples unchanged; worst_predictions ranks by the cross-entropy NumPy computes."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import minidl as mdl  # noqa: E402
from minidl import nn  # noqa: E402
from minidl.data import DataLoader  # noqa: E402
from minidl.train.inspection import plot_mispredictions, show_batch, worst_predictions  # noqa: E402


def test_show_batch_draws_the_first_batch_as_the_model_receives_it():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(20, 1, 5, 5)).astype(np.float32)
    y = np.arange(20) % 4
    figure = show_batch(DataLoader((x, y), batch_size=8, transform=lambda xb, rng: xb * 2 - 1), n=6, columns=3)
    drawn = [ax.get_images()[0].get_array() for ax in figure.axes if ax.get_images()]
    assert len(drawn) == 6
    for k, image in enumerate(drawn):
        np.testing.assert_array_equal(np.asarray(image), x[k, 0] * 2 - 1)   # after the transform
    assert [ax.get_title() for ax in figure.axes][:6] == [str(v) for v in y[:6]]
    plt.close(figure)
    flat = show_batch([(x.reshape(20, 25), y)], n=2, class_names=list("abcd"))
    np.testing.assert_array_equal(np.asarray(flat.axes[1].get_images()[0].get_array()), x[1, 0])
    assert flat.axes[1].get_title() == "b"
    plt.close(flat)
    with pytest.raises(ValueError, match="not square images"):
        show_batch([(np.zeros((2, 7)), np.zeros(2))])


def test_worst_predictions_by_numpy_and_the_gallery():
    rng = np.random.default_rng(1)
    mdl.manual_seed(0)
    model = nn.Linear(16, 3)
    x = rng.normal(size=(30, 16)).astype(np.float32)
    y = rng.integers(0, 3, 30)
    logits = x @ model.weight.numpy().T + model.bias.numpy()
    log_p = logits - logits.max(1, keepdims=True)
    log_p -= np.log(np.exp(log_p).sum(1, keepdims=True))
    losses = -log_p[np.arange(30), y]
    worst = worst_predictions(model, x, y, k=5, batch_size=7)
    np.testing.assert_array_equal(worst["index"], np.argsort(-losses)[:5])
    np.testing.assert_allclose(worst["loss"], np.sort(losses)[::-1][:5], rtol=1e-5)
    np.testing.assert_array_equal(worst["predicted"], logits.argmax(1)[worst["index"]])
    np.testing.assert_array_equal(worst["true"], y[worst["index"]])
    np.testing.assert_allclose(worst["confidence"], np.exp(log_p.max(1))[worst["index"]], rtol=1e-5)
    assert model.training
    figure = plot_mispredictions(model, x, y, k=4)
    first = worst["index"][0]
    np.testing.assert_array_equal(np.asarray(figure.axes[0].get_images()[0].get_array()), x[first].reshape(4, 4))
    assert figure.axes[0].get_title().startswith(f"{y[first]}→{logits.argmax(1)[first]}")
    plt.close(figure)


def test_worst_predictions_on_the_device_match_the_cpu(device):
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(12, 16)).astype(np.float32), rng.integers(0, 3, 12)
    mdl.manual_seed(0)
    model = nn.Linear(16, 3)
    cpu = worst_predictions(model, x, y, k=4)
    moved = worst_predictions(model.to(device), x, y, k=4)
    np.testing.assert_array_equal(moved["index"], cpu["index"])
    np.testing.assert_allclose(moved["loss"], cpu["loss"], rtol=1e-5)
