"""Strategies: the hand-computed plans of successive halving and Hyperband, the epochs they really spend,
who gets promoted, how a diverging trial is handled, and the results table/files/plot."""
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
    grid_search,
    halving_rungs,
    hyperband,
    hyperband_brackets,
    random_search,
    successive_halving,
)


class FakeObjective:
    """Score = -(log10 lr + 2)^2 (best at lr = 1e-2); NaN (diverged) above ``diverge_above``.

    With ``resumes`` it continues a key's run like TrainerObjective: it counts only the new epochs.
    """

    def __init__(self, resumes=True, diverge_above=math.inf):
        self.resumes, self.diverge_above = resumes, diverge_above
        self.done, self.calls, self.released = {}, [], []

    def __call__(self, config, epochs, key=None):
        self.calls.append((key, epochs))
        start = self.done.get(key, 0) if self.resumes else 0
        if self.resumes:
            self.done[key] = epochs
        score = float("nan") if config["lr"] > self.diverge_above else -(math.log10(config["lr"]) + 2) ** 2
        return {"score": score, "epochs_trained": epochs - start}

    def release(self, key):
        self.released.append(key)
        self.done.pop(key, None)


SPACE = {"lr": LogUniform(1e-5, 1.0)}


# ---------------------------------------------------------------- the plans, computed by hand
@pytest.mark.parametrize("args, rungs", [
    ((9, 1, 9, 3), [(9, 1), (3, 3), (1, 9)]),
    ((27, 1, 27, 3), [(27, 1), (9, 3), (3, 9), (1, 27)]),
    ((8, 1, 8, 2), [(8, 1), (4, 2), (2, 4), (1, 8)]),
    ((10, 2, 20, 3), [(10, 2), (3, 6), (1, 18)]),   # 2·3^2 = 18 <= 20 < 54
    ((14, 1, 4, 2), [(14, 1), (7, 2), (3, 4)]),
    ((2, 1, 9, 3), [(2, 1), (1, 3), (1, 9)]),       # never fewer than one configuration
    ((5, 3, 3, 3), [(5, 3)]),
])
def test_halving_rungs(args, rungs):
    assert halving_rungs(*args) == rungs


def test_hyperband_brackets_are_table_1_of_the_paper():
    # Li et al. (2018), Table 1: R = 81, eta = 3.
    assert hyperband_brackets(81, 1, 3) == [
        [(81, 1), (27, 3), (9, 9), (3, 27), (1, 81)],
        [(34, 3), (11, 9), (3, 27), (1, 81)],
        [(15, 9), (5, 27), (1, 81)],
        [(8, 27), (2, 81)],
        [(5, 81)],
    ]


@pytest.mark.parametrize("args, brackets", [
    # s_max = 2, B = 27: n = ceil(3·9/3) = 9, ceil(3·3/2) = 5, ceil(3·1/1) = 3
    ((9, 1, 3), [[(9, 1), (3, 3), (1, 9)], [(5, 3), (1, 9)], [(3, 9)]]),
    # s_max = 2, B = 12: n = ceil(3·4/3) = 4, ceil(3·2/2) = 3, 3
    ((4, 1, 2), [[(4, 1), (2, 2), (1, 4)], [(3, 2), (1, 4)], [(3, 4)]]),
    # min_epochs 2, R = 18 -> 9 units: epochs are 2·(9 // 3^(s-i))
    ((18, 2, 3), [[(9, 2), (3, 6), (1, 18)], [(5, 6), (1, 18)], [(3, 18)]]),
    # 20 epochs: 3^2 = 9 <= 20 < 27, so s_max = 2 and the rungs are floor(20 / 3^k) = 2, 6, 20
    ((20, 1, 3), [[(9, 2), (3, 6), (1, 20)], [(5, 6), (1, 20)], [(3, 20)]]),
    ((1, 1, 3), [[(1, 1)]]),
])
def test_hyperband_brackets_small(args, brackets):
    assert hyperband_brackets(*args) == brackets


@pytest.mark.parametrize("call", [lambda: halving_rungs(0, 1, 9), lambda: halving_rungs(9, 10, 9),
                                  lambda: halving_rungs(9, 1, 9, eta=1), lambda: hyperband_brackets(9, 1, 1),
                                  lambda: hyperband_brackets(3, 4)])
def test_bad_plans_are_refused(call):
    with pytest.raises(ValueError):
        call()


# ---------------------------------------------------------------- what the strategies run
def test_successive_halving_runs_its_plan_and_promotes_the_best():
    obj = FakeObjective()
    result = successive_halving(obj, SPACE, n_configs=9, max_epochs=9, eta=3, seed=0)
    assert [(t.rung, t.epochs) for t in result.trials] == [(0, 1)] * 9 + [(1, 3)] * 3 + [(2, 9)]
    first = result.trials[:9]
    best3 = sorted(first, key=lambda t: -t.score)[:3]
    assert [t.config for t in result.trials[9:12]] == [t.config for t in first if t in best3]
    assert result.trials[12].config == max(result.trials[9:12], key=lambda t: t.score).config
    # resumed: 9·1 + 3·(3-1) + 1·(9-3) = 21 epochs; a run from scratch at every rung: 9 + 9 + 9 = 27
    assert result.epochs_trained == 21
    assert successive_halving(FakeObjective(resumes=False), SPACE, 9, 9, seed=0).epochs_trained == 27
    assert result.best is result.trials[12]
    assert len(obj.released) == 9  # every configuration's run released once it is out (or done)


def test_hyperband_spends_exactly_the_planned_epochs():
    obj = FakeObjective()
    result = hyperband(obj, SPACE, max_epochs=9, eta=3, seed=1)
    counts = {}
    for t in result.trials:
        counts[(t.bracket, t.rung, t.epochs)] = counts.get((t.bracket, t.rung, t.epochs), 0) + 1
    assert counts == {(2, 0, 1): 9, (2, 1, 3): 3, (2, 2, 9): 1, (1, 0, 3): 5, (1, 1, 9): 1, (0, 0, 9): 3}
    # resumed: bracket 2: 9 + 3·2 + 6 = 21; bracket 1: 5·3 + 6 = 21; bracket 0: 3·9 = 27
    assert result.epochs_trained == 69
    # from scratch: 27 + (15 + 9) + 27
    assert hyperband(FakeObjective(resumes=False), SPACE, 9, eta=3, seed=1).epochs_trained == 78
    assert len({repr(t.config) for t in result.trials}) == 9 + 5 + 3  # fresh configurations in every bracket
    assert result.best.epochs == 9


def test_a_diverging_trial_is_kept_never_promoted_and_never_best():
    obj = FakeObjective(diverge_above=1e-3)  # only lr <= 1e-3 trains
    result = successive_halving(obj, SPACE, n_configs=9, max_epochs=9, eta=3, seed=0)
    bad = [t for t in result.trials if t.diverged]
    assert bad and all(math.isnan(t.score) and t.config["lr"] > 1e-3 for t in bad)
    assert all(t.config["lr"] <= 1e-3 for t in result.trials if t.rung > 0)
    assert result.best.config["lr"] <= 1e-3 and not result.best.diverged
    assert "diverged" in result.table().splitlines()[-1]  # diverged trials are listed last


def test_when_every_trial_diverges_nothing_is_promoted_and_there_is_no_best():
    result = successive_halving(FakeObjective(diverge_above=0.0), SPACE, 9, 9, seed=0)
    assert len(result.trials) == 9 and result.best is None


def test_a_plain_function_objective_and_a_diverged_flag():
    def objective(config, epochs):
        return {"score": config["x"], "diverged": config["x"] > 0.9}

    result = random_search(objective, {"x": Uniform(0, 1)}, n_trials=50, epochs=2, seed=3)
    assert result.epochs_trained == 100
    assert all(t.diverged == (t.config["x"] > 0.9) for t in result.trials)
    assert 0.8 < result.best.score <= 0.9


def test_random_search_is_seeded():
    a = random_search(FakeObjective(), SPACE, 5, 1, seed=4)
    b = random_search(FakeObjective(), SPACE, 5, 1, seed=4)
    c = random_search(FakeObjective(), SPACE, 5, 1, seed=5)
    assert [t.config for t in a.trials] == [t.config for t in b.trials] != [t.config for t in c.trials]
    rng = np.random.default_rng(4)
    assert a.trials[0].config["lr"] == SPACE["lr"].sample(rng)


def test_grid_search_visits_every_combination_and_min_mode():
    seen = []

    def objective(config, epochs):
        seen.append(config)
        return (config["a"] - 1) ** 2 + config["b"]

    result = grid_search(objective, {"a": Choice([0, 1, 2]), "b": Uniform(0, 1)}, epochs=1, points=3, mode="min")
    assert len(seen) == 9 and len(result.trials) == 9
    assert result.best.config == {"a": 1, "b": 0.0}


def test_results_table_files_and_plot(tmp_path):
    result = successive_halving(FakeObjective(diverge_above=0.1), {"lr": LogUniform(1e-5, 1.0),
                                                                    "opt": Choice(["adam", "sgd"])}, 9, 9, seed=2)
    result.to_csv(tmp_path / "t.csv")
    result.to_jsonl(tmp_path / "t.jsonl")
    rows = list(csv.DictReader(open(tmp_path / "t.csv")))
    lines = [json.loads(line) for line in open(tmp_path / "t.jsonl")]
    assert len(rows) == len(lines) == len(result.trials) == 13
    for row, line, t in zip(rows, lines, result.trials):
        assert float(row["lr"]) == t.config["lr"] and row["opt"] == t.config["opt"] and row["status"] == t.status
        assert line["config"] == t.config and int(row["epochs"]) == t.epochs
        assert (line["score"] is None) == t.diverged  # NaN is written as null
    fig = result.plot(tmp_path / "scores.png", {"lr": LogUniform(1e-5, 1.0), "opt": Choice(["adam", "sgd"])})
    assert (tmp_path / "scores.png").stat().st_size > 1000
    assert [ax.get_xscale() for ax in fig.axes] == ["log", "linear"]
    from tests.test_figures_not_clipped import assert_nothing_clipped
    assert_nothing_clipped(fig, "tune scores")
    renderer = fig.canvas.get_renderer()  # the legend (epochs, diverged) beside the last panel, not on its points
    assert fig.axes[-1].get_legend().get_window_extent(renderer).x0 >= fig.axes[-1].get_window_extent(renderer).x1


def test_best_compares_only_the_longest_trained():
    trials = [Trial(0, {"x": 1}, 1, 0.99), Trial(1, {"x": 2}, 9, 0.90), Trial(2, {"x": 3}, 9, 0.95),
              Trial(3, {"x": 4}, 9, float("nan"), "diverged")]
    assert SearchResult("halving", trials).best.number == 2
    assert SearchResult("halving", trials, mode="min").best.number == 1


def test_the_table_lists_best_first_in_the_order_best_is_taken_from():
    """0.99 after 1 epoch is no rival to 0.95 after 9: the table's first row is the ``best:`` line's trial."""
    trials = [Trial(0, {"x": 1}, 1, 0.99), Trial(1, {"x": 2}, 9, 0.90), Trial(2, {"x": 3}, 9, 0.95),
              Trial(3, {"x": 4}, 9, float("nan"), "diverged"), Trial(4, {"x": 5}, 9, 0.95)]
    for mode, order in (("max", [2, 4, 1, 0, 3]), ("min", [1, 2, 4, 0, 3])):
        result = SearchResult("halving", trials, mode=mode)
        rows = result.table().splitlines()[1:]
        numbers = [int(row.split()[0]) for row in rows if row.strip() and row.split()[0].isdigit()]
        assert numbers == order == [t.number for t in result.ranked()]
        assert result.best.number == numbers[0]


def test_bad_arguments():
    with pytest.raises(ValueError, match="mode"):
        random_search(FakeObjective(), SPACE, 2, 1, mode="up")
    with pytest.raises(ValueError, match="n_trials"):
        random_search(FakeObjective(), SPACE, 0, 1)
    with pytest.raises(TypeError, match="callable"):
        grid_search(3, SPACE, 1)
