"""After a search: edges, the optimism of a best-of-N, the registry, scientific studies, Adam's betas tuned."""
import csv
import json
import math

import numpy as np
import pytest

from minidl.tune import (
    Choice,
    LogUniform,
    SearchResult,
    Trial,
    Uniform,
    best_of_n_optimism,
    edge_warnings,
    expected_max_normal,
    read_studies,
    record_study,
    scientific_study,
)
from minidl.tune.objective import TrainerObjective, optimizer_options
from minidl.tune.space import Integer, format_dimension, parse_dimension


def _result(configs_scores, metric="val_accuracy"):
    trials = [Trial(i, config, 3, score, epochs_trained=3) for i, (config, score) in enumerate(configs_scores)]
    return SearchResult("random", trials, "max", metric)


# ---------------------------------------------------------------- optimism
def test_expected_max_of_normals_in_closed_form_and_by_simulation():
    assert expected_max_normal(1) == pytest.approx(0.0, abs=1e-9)
    assert expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-6)
    assert expected_max_normal(3) == pytest.approx(3 / (2 * math.sqrt(math.pi)), rel=1e-6)
    draws = np.random.default_rng(0).standard_normal((200_000, 10)).max(axis=1)
    assert expected_max_normal(10) == pytest.approx(draws.mean(), abs=0.01)  # the simulation's std error is 0.0013
    with pytest.raises(ValueError, match="n must be"):
        expected_max_normal(0)


def test_optimism_of_a_best_of_n_accuracy_matches_a_simulation():
    # 20 equally good models (p = 0.8), each scored on 200 validation samples: the best score's excess
    n, p, configs = 200, 0.8, 20
    best = np.random.default_rng(1).binomial(n, p, size=(20_000, configs)).max(axis=1) / n
    optimism = best_of_n_optimism(np.full(configs, p), n_val=n)
    assert optimism.noise_std == pytest.approx(math.sqrt(p * (1 - p) / n))
    assert optimism.expected == pytest.approx(best.mean() - p, rel=0.08)  # the normal approximation of a binomial
    result = _result([({"lr": 0.1}, 0.9), ({"lr": 0.2}, 0.8), ({"lr": 0.3}, float("nan"))])
    got = best_of_n_optimism(result, noise_std=0.01)
    assert got.n == 2 and got.expected == pytest.approx(0.01 / math.sqrt(math.pi))
    with pytest.raises(ValueError, match="exactly one of"):
        best_of_n_optimism([0.5], n_val=10, noise_std=0.1)


# ---------------------------------------------------------------- edges
def test_edge_warnings_name_the_hyperparameter_and_the_edge():
    space = {"lr": LogUniform(1e-4, 1.0), "dropout": Uniform(0.0, 0.5), "batch_size": Choice([16, 32, 64]),
             "optimizer": Choice(["adam", "sgd"])}
    result = _result([({"lr": 0.8, "dropout": 0.25, "batch_size": 16, "optimizer": "sgd"}, 0.95),
                      ({"lr": 1e-3, "dropout": 0.1, "batch_size": 32, "optimizer": "adam"}, 0.90)])
    warnings = edge_warnings(result, space)
    assert len(warnings) == 2
    assert warnings[0].startswith("lr: the best trial's 0.8 is at the high edge of LogUniform(0.0001, 1)")
    assert warnings[1].startswith("batch_size: the best trial's 16 is at the low edge")
    middle = _result([({"lr": 1e-2, "dropout": 0.25, "batch_size": 32}, 0.9)])
    assert edge_warnings(middle, space) == []  # log position of 1e-2 in [1e-4, 1] is 0.5


def test_a_dimension_spelled_for_the_command_line_reads_back():
    for dim in (LogUniform(1e-4, 0.1), Uniform(0, 0.5), Integer(16, 128, log=True), Choice(["adam", "sgd"]),
                Choice([16, 32])):
        assert repr(parse_dimension(format_dimension(dim))) == repr(dim)
    assert format_dimension(0.001) == "0.001" and format_dimension("adam") == "adam"


# ---------------------------------------------------------------- registry
def test_the_registry_gets_a_row_per_search_and_reads_back(tmp_path):
    path = tmp_path / "studies.csv"
    space = {"lr": LogUniform(1e-4, 1.0)}
    first = _result([({"lr": 0.9}, 0.95), ({"lr": 0.01}, 0.90)])
    record_study(path, first, study="lr", goal="a baseline", space=space, folder="runs/a", command="minidl tune",
                 n_val=100)
    record_study(path, _result([({"lr": 0.01}, 0.5)]), study="again")
    rows = read_studies(path)
    assert [r["study"] for r in rows] == ["lr", "again"]
    assert rows[0]["trials"] == "2" and rows[0]["best_score"] == "0.95" and rows[0]["goal"] == "a baseline"
    assert json.loads(rows[0]["best_config"]) == {"lr": 0.9} and "high edge" in rows[0]["edge_warnings"]
    sigma = math.sqrt(0.95 * 0.05 / 100)
    assert float(rows[0]["optimism"]) == pytest.approx(sigma / math.sqrt(math.pi), rel=1e-3)
    assert rows[1]["optimism"] == "" and rows[1]["edge_warnings"] == ""
    with open(tmp_path / "other.csv", "w", newline="") as f:
        csv.writer(f).writerow(["a", "b"])
    with pytest.raises(ValueError, match="not a study registry"):
        record_study(tmp_path / "other.csv", first, study="x")


# ---------------------------------------------------------------- scientific study
def _objective(config, epochs):
    """A made-up score whose best learning rate grows with the batch size: lr* = 1e-3 · batch / 16."""
    best = 1e-3 * config["batch_size"] / 16
    return 1.0 - (math.log10(config["lr"]) - math.log10(best)) ** 2 / 10


def test_each_scientific_value_gets_its_own_nuisance_optimum():
    study = scientific_study(_objective, ("batch_size", [16, 256]), {"lr": LogUniform(1e-4, 1e-1)}, epochs=1,
                             trials=40, fixed={"optimizer": "adam"}, seed=0)
    lrs = [r.best.config["lr"] for r in study.results]
    assert abs(math.log10(lrs[0]) - math.log10(1e-3)) < 0.15 and abs(math.log10(lrs[1]) - math.log10(1.6e-2)) < 0.15
    assert all(r.best.config["optimizer"] == "adam" for r in study.results)
    tuned, held = study.tuned_scores, study.held_scores
    assert held[0] == tuned[0] and held[1] < tuned[1] - 0.1  # lr tuned for batch 16 is far from batch 256's
    assert tuned[1] == pytest.approx(tuned[0], abs=0.01)      # re-tuned, the two batch sizes are as good
    assert "batch_size" in study.table().splitlines()[0]
    with pytest.raises(ValueError, match="one role"):
        scientific_study(_objective, ("lr", [1, 2]), {"lr": LogUniform(1e-4, 1e-1)}, epochs=1)


# ---------------------------------------------------------------- Adam's betas and epsilon
def test_beta_and_eps_settings_become_the_optimizer_s_arguments():
    assert optimizer_options({"optimizer": "adam", "beta2": 0.95}) == {"betas": (0.9, 0.95)}
    assert optimizer_options({"optimizer": "adamw", "beta1": 0.5, "eps": 1e-6}) == {"betas": (0.5, 0.999),
                                                                                      "eps": 1e-6}
    assert optimizer_options({"optimizer": "sgd"}) == {}
    with pytest.raises(ValueError, match="'sgd' has no betas"):
        optimizer_options({"optimizer": "sgd", "beta1": 0.9})


def test_a_trial_runs_with_the_tuned_betas_and_returns_its_curve():
    objective = TrainerObjective("digits", "mlp", optimizer="adam", batch_size=256)
    trainer = objective.build({"lr": 1e-3, "beta1": 0.8, "eps": 1e-5}, epochs=2)
    group = trainer.optimizer.param_groups[0]
    assert tuple(group["betas"]) == (0.8, 0.999) and group["eps"] == 1e-5
    out = objective({"lr": 1e-3, "beta2": 0.99}, epochs=2)
    assert len(out["curve"]) == 2 and out["curve"][-1] == out["score"]


def test_minidl_tune_writes_the_curves_records_the_study_and_warns_at_an_edge(tmp_path, capsys):
    from minidl.cli import main
    code = main(["tune", "--strategy", "grid", "--points", "2", "--epochs", "1", "--batch-size", "128",
                 "--param", "lr=log:1e-5:1e-2", "--out", str(tmp_path / "run"), "--study", "edge", "--goal", "g"])
    text = capsys.readouterr().out
    assert code == 0 and (tmp_path / "run" / "curves.png").stat().st_size > 1000
    # of the grid's two rates, 1e-2 wins after one epoch: the high edge of the range
    assert "warning: lr: the best trial's 0.01 is at the high edge" in text
    assert "is expected to read" in text and f"recorded the study in {tmp_path / 'studies.csv'}" in text
    (row,) = read_studies(tmp_path / "studies.csv")
    assert row["study"] == "edge" and row["trials"] == "2" and row["strategy"] == "grid"
    assert "--param lr=log:1e-05:0.01" in row["command"] and "--strategy grid" in row["command"]
