"""Bayesian optimization through Optuna's TPE, with the same objective as every other strategy."""
import math
import sys

import pytest

from minidl.tune import Choice, Integer, LogUniform, TrainerObjective, Uniform, random_search, tpe_search


def _objective(config, epochs):
    if config["lr"] > 0.3:
        return float("nan")  # diverges
    return -(math.log10(config["lr"]) + 2) ** 2 - (config["width"] - 40) ** 2 / 400 - (config["opt"] != "adam")


SPACE = {"lr": LogUniform(1e-5, 1.0), "width": Integer(8, 128, log=True), "opt": Choice(["adam", "sgd"]),
         "schedule": "cosine"}


def test_tpe_samples_the_space_is_seeded_and_beats_random_on_the_same_budget():
    pytest.importorskip("optuna")
    a = tpe_search(_objective, SPACE, n_trials=40, epochs=1, seed=0)
    b = tpe_search(_objective, SPACE, n_trials=40, epochs=1, seed=0)
    assert [t.config for t in a.trials] == [t.config for t in b.trials]  # seeded
    for t in a.trials:
        assert 1e-5 <= t.config["lr"] <= 1.0 and 8 <= t.config["width"] <= 128
        assert isinstance(t.config["width"], int) and t.config["opt"] in ("adam", "sgd")
        assert t.config["schedule"] == "cosine"  # constants pass through
    assert any(t.diverged for t in a.trials) and not a.best.diverged
    # diverged trials are told as infeasible, so TPE learns to avoid lr > 0.3 (30% of log-space): told as
    # merely failed they would be ignored, and TPE kept proposing there (18 of 35 proposals did).
    assert sum(t.diverged for t in a.trials[5:]) <= 6
    # the model learns: its last 20 proposals score better than its first 20, and better than random's
    late = [t.score for t in a.trials[20:] if not t.diverged]
    early = [t.score for t in a.trials[:20] if not t.diverged]
    assert sum(late) / len(late) > sum(early) / len(early)
    rand = random_search(_objective, SPACE, 40, 1, seed=0)
    assert a.best.score > rand.best.score


def test_tpe_minimizes_in_min_mode():
    pytest.importorskip("optuna")
    result = tpe_search(lambda c, e: (c["x"] - 0.3) ** 2, {"x": Uniform(0, 1)}, 30, 1, seed=1, mode="min")
    assert abs(result.best.config["x"] - 0.3) < 0.05


def test_tpe_with_the_trainer_objective():
    pytest.importorskip("optuna")
    objective = TrainerObjective(optimizer="sgd", batch_size=128)
    result = tpe_search(objective, {"lr": LogUniform(1e-3, 100.0)}, n_trials=3, epochs=1, seed=0,
                        n_startup_trials=2)
    assert len(result.trials) == 3 and result.epochs_trained <= 3
    assert all(t.diverged == (t.config["lr"] > 3) for t in result.trials if t.config["lr"] > 3 or
               t.config["lr"] < 0.3)


def test_tpe_without_optuna_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)
    with pytest.raises(ImportError, match=r"minidl\[tune\]"):
        tpe_search(_objective, SPACE, 2, 1)
