"""The model zoo: the bundled weights load into their architecture and score what their description says."""
import numpy as np
import pytest

from minidl import nn
from minidl.models import zoo


def test_the_bundled_entry_loads_and_scores_its_recorded_accuracy():
    model, info = zoo.pretrained("digits-0-4-mlp")
    assert [m.weight.shape for m in model if isinstance(m, nn.Linear)] == [(128, 64), (64, 128), (5, 64)]
    assert info["classes"] == [0, 1, 2, 3, 4] and info["train_samples"] + info["test_samples"] == 901
    x, y = zoo.held_out("digits-0-4-mlp")
    assert len(y) == info["test_samples"] and set(np.unique(y)) == {0, 1, 2, 3, 4}
    predicted = np.asarray(model(x).array).argmax(1)
    assert np.mean(predicted == y) == pytest.approx(info["test_accuracy"]) and info["test_accuracy"] > 0.97
    features = zoo.body(model)
    assert features(x[:3]).shape == (3, 64) and features[0] is model[0]   # the same layers, not copies


def test_the_recipe_makes_the_entry_again_to_its_accuracy(tmp_path):
    path = zoo.write_entry("digits-0-4-mlp", str(tmp_path / "again.safetensors"))
    _, bundled = zoo.pretrained("digits-0-4-mlp")
    import minidl as mdl
    saved = mdl.load(path)
    assert saved["info"]["test_accuracy"] >= bundled["test_accuracy"] - 0.02   # the same recipe, another machine's sums
    assert saved["info"]["recipe"] == bundled["recipe"]


def test_an_unknown_name_lists_the_zoo():
    with pytest.raises(ValueError, match="digits-0-4-mlp"):
        zoo.pretrained("resnet50")
