"""A study of one scientific hyperparameter, with the nuisance hyperparameters re-tuned for each of its values.

    study = scientific_study(objective, scientific=("batch_size", [16, 64, 256]),
                             nuisance={"lr": LogUniform(1e-3, 1e-1), "weight_decay": LogUniform(1e-6, 1e-3)},
                             fixed={"optimizer": "adam"}, trials=8, epochs=5, seed=0)
    print(study.table())          # per value: the best score re-tuned, and the score with the nuisance held fixed
    study.best                    # the value of the scientific hyperparameter that wins when each is tuned

The guide's discipline for an experiment (Training Deep Learning Models,
§4.3): the *scientific* hyperparameter is the one whose effect is measured; the
*nuisance* ones must be optimized anew for each of its values, "to make a fair
comparison" (the learning rate "almost always needs to be re-tuned"); the
*fixed* ones are held constant, and every conclusion is caveated by them. And
§3.5: "As long as other hyperparameters (especially learning rate and
regularization) are properly re-tuned, you should be able to achieve the same
final validation performance with any batch size."

For each value the same ``trials`` nuisance configurations are drawn (one seed
for every value: common random numbers, so the values are compared on the same
draws) and each is trained; the value's score is its best trial. Beside it,
``held`` is the score of every value with the nuisance configuration that was
best for the *first* value: the comparison a study that tuned once and then
swept the scientific hyperparameter would have made.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from minidl.tune.search import random_search

__all__ = ["ScientificStudy", "scientific_study"]


@dataclass
class ScientificStudy:
    """What :func:`scientific_study` found: per scientific value, the search, its best, and the held score."""

    name: str
    values: list
    results: list                    # one SearchResult per value
    held_config: dict                # the nuisance configuration best for values[0]
    held_scores: list                # each value's score with held_config
    mode: str = "max"
    fixed: dict = field(default_factory=dict)

    @property
    def tuned_scores(self) -> list:
        return [r.best.score if r.best is not None else float("nan") for r in self.results]

    @property
    def best(self):
        """The scientific value whose re-tuned score is best."""
        scores = self.tuned_scores
        pick = max if self.mode == "max" else min
        return self.values[scores.index(pick(scores))]

    def table(self) -> str:
        lines = [f"{self.name:>12}  {'re-tuned':>9}  {'held':>9}  best nuisance configuration"]
        for value, result, held in zip(self.values, self.results, self.held_scores):
            best = result.best
            config = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in (best.config.items() if best else ()) if k != self.name and
                               k not in self.fixed)
            tuned = best.score if best else float("nan")
            lines.append(f"{value!s:>12}  {tuned:9.4f}  {held:9.4f}  {config}")
        return "\n".join(lines)


def scientific_study(objective, scientific: tuple, nuisance: dict, epochs: int, trials: int = 8,
                     fixed: dict | None = None, seed: int = 0, mode: str = "max") -> ScientificStudy:
    """Re-tune ``nuisance`` (a search space) by random search for each value of ``scientific = (name, values)``.

    ``fixed`` settings are passed to every trial unchanged. ``objective(config, epochs)`` as for every search.
    """
    if not (isinstance(scientific, tuple) and len(scientific) == 2 and isinstance(scientific[0], str)):
        raise ValueError(f"scientific_study: scientific must be (name, [values]), got {scientific!r}")
    name, values = scientific[0], list(scientific[1])
    fixed = dict(fixed or {})
    if len(values) < 2:
        raise ValueError(f"scientific_study: {name} needs at least two values to compare, got {values}")
    clash = sorted(({name} | set(fixed)) & set(nuisance) | ({name} & set(fixed)))
    if clash:
        raise ValueError(f"scientific_study: {clash} cannot be both scientific, nuisance or fixed; each "
                         "hyperparameter has one role")

    def run(value, config, epochs):
        return objective({**fixed, name: value, **config}, epochs)

    results = [random_search(lambda config, e, v=value: run(v, config, e), nuisance, trials, epochs, seed=seed,
                             mode=mode) for value in values]
    for value, result in zip(values, results):  # record the whole configuration of each trial
        for trial in result.trials:
            trial.config = {**fixed, name: value, **trial.config}
    first = results[0].best
    held_config = {k: v for k, v in first.config.items() if k in nuisance} if first else {}
    held = []
    for value, result in zip(values, results):
        same = next((t for t in result.trials if {k: t.config[k] for k in nuisance} == held_config), None)
        held.append(same.score if same is not None else float("nan"))
    return ScientificStudy(name, values, results, held_config, held, mode, fixed)
