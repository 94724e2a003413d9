"""The architecture search: widths from a configuration, parameters and FLOPs by hand and against the built
model, and a search whose trials carry their cost."""
import numpy as np
import pytest

from minidl import nn
from minidl.tune import ArchitectureObjective, Choice, Integer, evolution_search, hidden_widths, mlp_cost


def test_hidden_widths():
    assert hidden_widths({"depth": 3, "width": 32}) == (32, 32, 32)
    assert hidden_widths({"depth": 3, "width": 32, "width_2": 8}) == (32, 8, 32)
    assert hidden_widths({"depth": 1, "width": 16, "width_3": 4}) == (16,)   # a layer beyond depth is ignored
    assert hidden_widths({"depth": 0, "width": 16}) == ()
    with pytest.raises(ValueError, match="depth"):
        hidden_widths({"depth": 1.5, "width": 8})
    with pytest.raises(ValueError, match="width_1"):
        hidden_widths({"depth": 1, "width": 8, "width_1": 0})


def test_cost_by_hand():
    # 64 → 16 → 10: weights 1024 + 160, biases 16 + 10; FLOPs 2·(1024 + 160)
    assert mlp_cost(64, (16,), 10) == {"params": 1210, "flops": 2368}
    assert mlp_cost(64, (), 10) == {"params": 650, "flops": 1280}


def test_the_built_model_has_the_widths_and_the_counted_parameters():
    objective = ArchitectureObjective(data="digits", optimizer="adam", lr=3e-3, batch_size=128)
    config = {"depth": 2, "width": 16, "width_2": 4}
    model = objective.model_for(objective.settings_for(config))
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert [tuple(m.weight.shape) for m in linears] == [(16, 64), (4, 16), (10, 4)]
    counted = sum(int(np.prod(p.shape)) for p in model.parameters())
    assert counted == mlp_cost(64, (16, 4), 10)["params"]


def test_a_search_reports_each_trials_cost():
    objective = ArchitectureObjective(data="digits", optimizer="adam", lr=3e-3, batch_size=128)
    space = {"depth": Integer(1, 3), "width": Choice([8, 16, 32]), "lr": 3e-3}
    result = evolution_search(objective, space, n_trials=6, epochs=1, population_size=3, sample_size=2, seed=0)
    for t in result.trials:
        hidden = hidden_widths(t.config)
        assert t.info["hidden"] == list(hidden)
        assert (t.info["params"], t.info["flops"]) == tuple(mlp_cost(64, hidden, 10).values())
    table = result.table(info=("params", "flops"))
    assert table.splitlines()[0].split()[-2:] == ["params", "flops"]
    assert str(result.best.info["params"]) in table.splitlines()[1]
    assert "params" not in result.table()   # the default table is unchanged


def test_only_mlps_are_searched():
    with pytest.raises(ValueError, match="searches MLPs"):
        ArchitectureObjective(model="cnn")
