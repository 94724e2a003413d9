"""The book's presets, the learning-rate sweep's choice, and TrainerObjective's seeded runs and divergence."""
import math

import numpy as np
import pytest

from minidl.tune import (
    LEARNING_RATES,
    PRESETS,
    WEIGHT_DECAY,
    WEIGHT_DECAYS,
    Choice,
    LogUniform,
    TrainerObjective,
    learning_rate_sweep,
    successive_halving,
)


def test_learning_rates_are_half_decades_from_1e_5_to_1():
    assert len(LEARNING_RATES) == 11
    np.testing.assert_allclose(np.log10(LEARNING_RATES), np.arange(-5.0, 0.01, 0.5), rtol=0, atol=1e-12)
    assert LEARNING_RATES[0] == 1e-5 and LEARNING_RATES[-1] == 1.0 and LEARNING_RATES[8] == 10 ** -1.0
    assert list(LEARNING_RATES) == sorted(LEARNING_RATES)


def test_weight_decay_preset_is_1e_6_to_1e_3():
    assert (WEIGHT_DECAY.low, WEIGHT_DECAY.high) == (1e-6, 1e-3) and isinstance(WEIGHT_DECAY, LogUniform)
    assert WEIGHT_DECAYS == (1e-6, 1e-5, 1e-4, 1e-3)
    np.testing.assert_allclose(WEIGHT_DECAY.grid(4), WEIGHT_DECAYS, rtol=1e-12)
    assert isinstance(PRESETS["lr"]["lr"], Choice) and PRESETS["lr"]["lr"].options == list(LEARNING_RATES)
    assert set(PRESETS["lr-wd"]) == {"lr", "weight_decay"}


def _diverges_above(limit):
    def objective(config, epochs):
        return float("nan") if config["lr"] > limit else -abs(math.log10(config["lr"]) + 3)
    return objective


def test_the_sweep_takes_the_largest_rate_that_does_not_diverge_not_the_best_scoring():
    sweep = learning_rate_sweep(_diverges_above(0.05), epochs=1)  # best score at 1e-3, divergence above 0.05
    assert sweep.chosen == 10 ** -1.5
    # smallest first, stopping at the first divergence: 1e-5 ... 10^-1.5 and then 10^-1.0 diverges
    assert [t.config["lr"] for t in sweep.result.trials] == list(LEARNING_RATES[:9])
    assert [t.status for t in sweep.result.trials] == ["ok"] * 8 + ["diverged"]
    assert len(learning_rate_sweep(_diverges_above(0.05), 1, stop_at_divergence=False).result.trials) == 11
    assert learning_rate_sweep(_diverges_above(0.0), 1).chosen is None


def test_trainer_objective_flags_a_diverging_run_and_scores_a_good_one():
    objective = TrainerObjective(optimizer="sgd", batch_size=128)
    good = objective({"lr": 0.1}, epochs=1)
    bad = objective({"lr": 30.0}, epochs=1)
    assert not good["diverged"] and good["score"] > 0.5 and good["epochs_trained"] == 1
    assert bad["diverged"] and math.isnan(bad["score"]) and bad["reason"]
    sweep = learning_rate_sweep(objective, 1, rates=[1e-2, 0.1, 30.0, 100.0])
    assert sweep.chosen == 0.1 and [t.status for t in sweep.result.trials] == ["ok", "ok", "diverged"]


def test_trainer_objective_is_seeded_and_resumes_exactly():
    objective = TrainerObjective(optimizer="sgd", batch_size=128)
    a = objective({"lr": 0.05}, 2)
    b = objective({"lr": 0.05}, 2)
    assert a["score"] == b["score"] and a["train_loss"] == b["train_loss"]  # same seed: the same run
    first = objective({"lr": 0.05}, 1, key="k")
    more = objective({"lr": 0.05}, 2, key="k")  # continues: one new epoch
    assert first["epochs_trained"] == 1 and more["epochs_trained"] == 1
    assert more["train_loss"] == a["train_loss"]  # no dropout: a continued run is the uninterrupted run


def test_trainer_objective_in_successive_halving():
    objective = TrainerObjective(optimizer="sgd", batch_size=128, metric="val_loss")
    result = successive_halving(objective, {"lr": LogUniform(1e-3, 0.3)}, n_configs=3, max_epochs=3, seed=0,
                                mode=objective.mode)
    assert result.metric == "val_loss" and result.epochs_trained == 3 + 2
    assert result.best.epochs == 3 and result.best.score == min(t.score for t in result.trials if t.epochs == 3)


def test_trainer_objective_refuses_what_it_cannot_tune():
    with pytest.raises(ValueError, match="cannot tune"):
        TrainerObjective()({"momentum": 0.9}, 1)
    with pytest.raises(ValueError, match="unknown settings"):
        TrainerObjective(colour="red")
    with pytest.raises(ValueError, match="metric"):
        TrainerObjective(metric="accuracy")


def test_a_loss_that_blows_up_without_nan_counts_as_diverged():
    out = TrainerObjective(optimizer="adam", batch_size=128)({"lr": 1.0}, 1)  # finite, but far above ln 10
    assert out["diverged"] and out["train_loss"] > 10 and "rose above" in out["reason"]


def test_a_run_that_blows_up_and_collapses_counts_as_diverged():
    # Adam at 10^-0.5: the first epoch's mean loss is far above ln 10, the second is back near it (a network
    # predicting one constant): the last epoch alone would pass, the whole run does not.
    objective = TrainerObjective(optimizer="adam", batch_size=128)
    out = objective({"lr": 10 ** -0.5}, 2)
    assert out["diverged"] and "epoch 1" in out["reason"] and out["val_accuracy"] < 0.2
    assert not objective({"lr": 1e-2}, 2)["diverged"]
