"""Regularized evolution: each mutation by its formula, crossover, the tournament, aging, seeding."""
import math

import numpy as np
import pytest

from minidl.tune import Choice, Integer, LogUniform, Uniform, crossover, evolution_search, mutate


def test_mutations_by_their_formulas():
    scale = 0.1
    dim, value = LogUniform(1e-4, 1.0), 1e-2
    rng, ref = np.random.default_rng(3), np.random.default_rng(3)
    step = ref.normal(0.0, scale * math.log(1e4))
    assert mutate(dim, value, rng, scale) == pytest.approx(value * math.exp(step), rel=1e-12)
    dim, value = Uniform(0.0, 0.5), 0.2
    rng, ref = np.random.default_rng(4), np.random.default_rng(4)
    assert mutate(dim, value, rng, scale) == pytest.approx(value + ref.normal(0.0, scale * 0.5), rel=1e-12)


def test_mutations_stay_in_range_and_move():
    rng = np.random.default_rng(0)
    for dim, value in [(LogUniform(1e-3, 1.0), 0.9), (Uniform(0.0, 1.0), 0.99), (Integer(1, 4), 4),
                       (Integer(8, 256, log=True), 8), (Choice(["a", "b", "c"]), "b")]:
        for _ in range(200):
            moved = mutate(dim, value, rng, scale=0.3)
            if isinstance(dim, Choice):
                assert moved in ("a", "c")
            else:
                assert dim.low <= moved <= dim.high
            if isinstance(dim, Integer):
                assert isinstance(moved, int) and moved != value
    # a large step clips at the ends, in log space too
    assert mutate(LogUniform(1e-3, 1.0), 0.9, np.random.default_rng(1), scale=50.0) in (1e-3, 1.0)
    with pytest.raises(TypeError, match="mutate"):
        mutate(object(), 1, rng)


def test_crossover_takes_each_value_from_a_parent():
    space = {"a": Uniform(0, 1), "b": Uniform(0, 1), "c": Choice([1, 2]), "k": 7}
    first, second = {"a": 0.1, "b": 0.2, "c": 1, "k": 7}, {"a": 0.9, "b": 0.8, "c": 2, "k": 7}
    seen = set()
    rng = np.random.default_rng(0)
    for _ in range(50):
        child = crossover(first, second, space, rng)
        assert child["k"] == 7 and all(child[n] in (first[n], second[n]) for n in "abc")
        seen.add(tuple(child[n] == first[n] for n in "abc"))
    assert len(seen) == 8  # every mix occurs


def quadratic(config, epochs):
    """Best at lr = 1e-2 and momentum = 0.9; diverges above lr = 0.5."""
    if config["lr"] > 0.5:
        return float("nan")
    return -(math.log10(config["lr"]) + 2) ** 2 - (config["momentum"] - 0.9) ** 2


SPACE = {"lr": LogUniform(1e-5, 1.0), "momentum": Uniform(0.0, 0.99), "batch_size": 64}


def test_tournament_over_the_whole_population_takes_the_best_of_the_last_members():
    """With sample_size = population_size the parent is the best of the ``population_size`` latest trials
    (aging: older ones have left), and the child differs from it in exactly one hyperparameter."""
    p = 5
    result = evolution_search(quadratic, SPACE, n_trials=30, epochs=1, population_size=p, sample_size=p, seed=1)
    trials = result.trials
    assert all(t.info["parents"] == [] for t in trials[:p])
    for i in range(p, len(trials)):
        alive = [t for t in trials[i - p:i] if t.status == "ok"]
        best = max(alive, key=lambda t: (t.score, t.number))
        assert trials[i].info["parents"] == [best.number]
        changed = [n for n in ("lr", "momentum") if trials[i].config[n] != best.config[n]]
        assert len(changed) == 1 and trials[i].config["batch_size"] == 64


def test_aging_lets_a_parent_come_only_from_the_population():
    p = 4
    result = evolution_search(quadratic, SPACE, n_trials=40, epochs=1, population_size=p, sample_size=2, seed=2,
                              crossover_rate=0.5)
    diverged = {t.number for t in result.trials if t.status == "diverged"}
    for i, t in enumerate(result.trials[p:], start=p):
        assert t.info["parents"] and all(i - p <= j < i for j in t.info["parents"])
    assert any(len(t.info["parents"]) == 2 for t in result.trials)   # crossover happened
    # a diverged trial wins a tournament only against diverged ones: with sample_size 2 and at most one
    # diverged among them it never does
    for t in result.trials[p:]:
        window = {u.number for u in result.trials[t.number - p:t.number]}
        if len(window & diverged) <= 1:
            assert not set(t.info["parents"]) & diverged


def test_evolution_improves_on_its_random_start_and_is_seeded():
    one = evolution_search(quadratic, SPACE, n_trials=40, epochs=1, population_size=8, sample_size=3, seed=0)
    two = evolution_search(quadratic, SPACE, n_trials=40, epochs=1, population_size=8, sample_size=3, seed=0)
    assert [t.config for t in one.trials] == [t.config for t in two.trials]
    start = max(t.score for t in one.trials[:8] if t.status == "ok")
    assert one.best.score > start and one.strategy == "evolution"


@pytest.mark.parametrize("kwargs, match", [
    ({"sample_size": 9, "population_size": 4}, "sample_size"),
    ({"crossover_rate": 1.5}, "crossover_rate"),
    ({"mutation_scale": 0.0}, "mutation_scale"),
])
def test_bad_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        evolution_search(quadratic, SPACE, n_trials=5, epochs=1, **kwargs)


def test_a_space_of_constants_is_refused():
    with pytest.raises(ValueError, match="no range"):
        evolution_search(quadratic, {"lr": 0.1, "momentum": 0.9}, n_trials=5, epochs=1)
