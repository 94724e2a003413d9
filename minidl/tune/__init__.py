"""Hyperparameter search: spaces, strategies over a budget in epochs, the book's presets.

    from minidl.tune import LogUniform, Uniform, TrainerObjective, hyperband, random_search
    space = {"lr": LogUniform(1e-3, 1.0), "weight_decay": LogUniform(1e-6, 1e-3)}
    objective = TrainerObjective(data="digits", model="mlp", optimizer="sgd", batch_size=64)
    result = hyperband(objective, space, max_epochs=9, eta=3, seed=0)
    print(result.table()); result.best.config
    result.to_csv("trials.csv"); result.plot("scores.png", space)

Strategies: :func:`grid_search`, :func:`random_search`, :func:`successive_halving`,
:func:`hyperband`, and :func:`tpe_search` (Bayesian optimization by Optuna's
TPE, when Optuna is installed: ``pip install minidl[tune]``); beyond them, in NumPy:
:func:`evolution_search` (regularized evolution), :func:`pbt_search` (population-based
training), :func:`gp_search` (a Gaussian process with expected improvement), and
:class:`ArchitectureObjective` (MLP depth and widths as hyperparameters, with their cost). Presets: the
learning-rate sweep 10^-5.0 ... 10^0.0 taking the largest rate that does not
diverge (:func:`learning_rate_sweep`), weight decay 10^-6 ... 10^-3.
After a search: :func:`edge_warnings` (the best trial at an edge of the space),
:func:`best_of_n_optimism` (how much of the best score the noise alone
explains), :func:`plot_top_curves`; :func:`record_study` adds the search to the
registry ``studies.csv``; :func:`scientific_study` re-tunes the nuisance
hyperparameters for each value of a scientific one.
The command line: ``minidl tune`` (see docs/tuning.md).
"""
from minidl.tune.analysis import (
    Optimism,
    best_of_n_optimism,
    edge_position,
    edge_warnings,
    expected_max_normal,
    plot_top_curves,
)
from minidl.tune.evolution import crossover, evolution_search, mutate
from minidl.tune.gp import GaussianProcess, expected_improvement, gp_search
from minidl.tune.nas import ArchitectureObjective, hidden_widths, mlp_cost
from minidl.tune.objective import TUNABLE, TrainerObjective
from minidl.tune.pbt import exploit, explore, hyperparameter_schedule, pbt_search
from minidl.tune.presets import (
    LEARNING_RATES,
    PRESETS,
    WEIGHT_DECAY,
    WEIGHT_DECAYS,
    LearningRateSweep,
    largest_stable,
    learning_rate_sweep,
)
from minidl.tune.registry import STUDY_FIELDS, read_studies, record_study
from minidl.tune.results import SearchResult, Trial
from minidl.tune.search import (
    grid_search,
    halving_rungs,
    hyperband,
    hyperband_brackets,
    random_search,
    successive_halving,
    tpe_search,
)
from minidl.tune.space import Choice, Dimension, Integer, LogUniform, Uniform, grid, parse_dimension, sample
from minidl.tune.study import ScientificStudy, scientific_study

__all__ = [
    "LEARNING_RATES", "PRESETS", "TUNABLE", "WEIGHT_DECAY", "WEIGHT_DECAYS", "Choice", "Dimension", "Integer",
    "LearningRateSweep", "LogUniform", "SearchResult", "TrainerObjective", "Trial", "Uniform", "grid",
    "grid_search", "halving_rungs", "hyperband", "hyperband_brackets", "largest_stable", "learning_rate_sweep",
    "parse_dimension", "random_search", "sample", "successive_halving", "tpe_search",
    "Optimism", "STUDY_FIELDS", "ScientificStudy", "best_of_n_optimism", "edge_position", "edge_warnings",
    "expected_max_normal", "plot_top_curves", "read_studies", "record_study", "scientific_study",
    "ArchitectureObjective", "GaussianProcess", "crossover", "evolution_search", "expected_improvement", "exploit",
    "explore", "gp_search", "hidden_widths", "hyperparameter_schedule", "mlp_cost", "mutate", "pbt_search",
]
