"""The study registry: one row per search in ``studies.csv``, so that no search goes unrecorded.

    record_study("runs/studies.csv", result, study="lr-wd on digits", goal="a baseline for the MLP",
                 space=space, folder="runs/tune-...", command="minidl tune ...", n_val=180)
    read_studies("runs/studies.csv")          # [{"date": ..., "study": ..., "best_score": ..., ...}, ...]

"Untracked experiments might as well not exist" (Training Deep Learning
Models, §7.4): the guide's spreadsheet holds, for each set of experiments, the
study's name and configuration, a short description of its goal, the number
of trials, the best validation performance, and what is needed to reproduce
it. ``minidl tune`` adds a row here after every search (``runs/studies.csv``
beside its run folders, or ``--registry``), with what the search itself can tell:
the best configuration, the optimism expected of a best-of-N
(:func:`minidl.tune.analysis.best_of_n_optimism`) and the edges the best trial
sits at (:func:`minidl.tune.analysis.edge_warnings`). The file is rewritten
whole on each record (a temporary file, then a rename), so it is never half written.
"""
from __future__ import annotations

import csv
import json
import os
import time

from minidl.serialization import atomic_write, plain

__all__ = ["STUDY_FIELDS", "read_studies", "record_study"]

STUDY_FIELDS = ("date", "study", "goal", "strategy", "metric", "trials", "diverged", "epochs_trained", "best_score",
                "best_config", "best_epochs", "optimism", "edge_warnings", "folder", "command")


def read_studies(path) -> list:
    """The rows of a registry (an empty list when the file does not exist yet)."""
    if not os.path.exists(path):
        return []
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is not None and tuple(reader.fieldnames) != STUDY_FIELDS:
            raise ValueError(f"{path} is not a study registry: its columns are {reader.fieldnames}, expected "
                             f"{list(STUDY_FIELDS)}; give another --registry path")
        return list(reader)


def record_study(path, result, *, study: str, goal: str = "", space: dict | None = None, folder: str = "",
                 command: str = "", n_val: int | None = None) -> dict:
    """Append one row for the search ``result`` to the registry at ``path``; returns the row.

    ``space`` (the search space) lets the row list the edges the best trial sits at;
    ``n_val`` (the validation samples behind an accuracy) lets it give the best-of-N optimism.
    """
    from minidl.tune.analysis import best_of_n_optimism, edge_warnings

    if not isinstance(study, str) or not study.strip():
        raise ValueError(f"record_study: study must name the study, got {study!r}")
    best = result.best
    optimism = ""
    if best is not None and n_val is not None and result.metric in ("val_accuracy", "accuracy", "score") \
            and 0.0 <= best.score <= 1.0:
        optimism = f"{best_of_n_optimism(result, n_val=n_val).expected:.4g}"
    row = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "study": study.strip(), "goal": goal,
           "strategy": result.strategy, "metric": result.metric, "trials": len(result.trials),
           "diverged": sum(t.status != "ok" for t in result.trials), "epochs_trained": result.epochs_trained,
           "best_score": "" if best is None else f"{best.score:.6g}",
           "best_config": "" if best is None else json.dumps({k: plain(v, strict=True)
                                                              for k, v in best.config.items()}, sort_keys=True),
           "best_epochs": "" if best is None else best.epochs, "optimism": optimism,
           "edge_warnings": " | ".join(edge_warnings(result, space)) if space else "",
           "folder": str(folder), "command": command}
    rows = read_studies(path) + [{k: str(v) for k, v in row.items()}]

    def write(tmp):
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=STUDY_FIELDS)
            writer.writeheader()
            writer.writerows(rows)

    atomic_write(path, write)
    return row
