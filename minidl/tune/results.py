"""The results of a search: one :class:`Trial` per evaluation, a table (CSV/JSONL) and a plot.

    result.best                 # the best finished trial (diverged ones never win)
    result.epochs_trained       # the budget spent: epochs actually trained, over all trials
    print(result.table())
    result.to_csv("trials.csv"); result.to_jsonl("trials.jsonl"); result.plot("scores.png", space)
"""
from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict, dataclass, field

from minidl.serialization import atomic_write, is_number, plain

__all__ = ["SearchResult", "Trial"]


@dataclass
class Trial:
    """One evaluation: configuration ``config`` trained to ``epochs`` epochs, scoring ``score``.

    ``status`` is "ok" or "diverged" (the loss became NaN/inf or an epoch's mean rose above
    where it started; ``score`` is then NaN). ``epochs_trained`` counts the epochs this
    evaluation actually ran: fewer than ``epochs`` when it continued an earlier
    rung of the same configuration, or when it diverged. ``rung`` and
    ``bracket`` place it in successive halving and Hyperband (0 otherwise).
    """

    number: int
    config: dict
    epochs: int
    score: float
    status: str = "ok"
    epochs_trained: int = 0
    rung: int = 0
    bracket: int = 0
    seconds: float = 0.0
    info: dict = field(default_factory=dict)

    @property
    def diverged(self) -> bool:
        return self.status == "diverged"


@dataclass
class SearchResult:
    """Every trial of one search, in the order they ran; ``mode`` is "max" or "min" (what ``score`` wants)."""

    strategy: str
    trials: list
    mode: str = "max"
    metric: str = "score"

    def _key(self, trial):
        return trial.score if self.mode == "max" else -trial.score

    @property
    def finished(self) -> list:
        return [t for t in self.trials if t.status == "ok" and math.isfinite(t.score)]

    def ranked(self) -> list:
        """Every trial, best first: the one order that :meth:`table` prints and :attr:`best` takes the head of.

        Finished trials first, those trained the longest before the others (scores after
        fewer epochs are not comparable with scores after more: in successive halving a
        configuration's early score is no rival to a survivor's final one), then by score,
        then by trial number; diverged trials last.
        """
        def order(t):
            ok = t.status == "ok" and math.isfinite(t.score)
            return (not ok, -t.epochs if ok else 0, -self._key(t) if ok else 0, t.number)
        return sorted(self.trials, key=order)

    @property
    def best(self):
        """The first trial of :meth:`ranked`: the best finished one among those trained the longest (None if all
        diverged)."""
        head = self.ranked()[:1]
        return head[0] if head and head[0].status == "ok" and math.isfinite(head[0].score) else None

    @property
    def epochs_trained(self) -> int:
        return sum(t.epochs_trained for t in self.trials)

    def rows(self, info: tuple = ()) -> list:
        """One flat dict per trial: number, each hyperparameter, epochs, score, status, ..., then each key of
        ``info`` from the trial's info (None where it has none), e.g. ``info=("params", "flops")``."""
        names = []
        for t in self.trials:
            names += [k for k in t.config if k not in names]
        out = []
        for t in self.trials:
            row = {"number": t.number, **{k: plain(t.config.get(k), strict=True) for k in names},
                   "epochs": t.epochs, self.metric: plain(t.score, strict=True), "status": t.status,
                   "epochs_trained": t.epochs_trained,
                   "rung": t.rung, "bracket": t.bracket, "seconds": round(t.seconds, 3)}
            row.update({k: plain(t.info.get(k), strict=True) for k in info})
            out.append(row)
        return out

    def to_csv(self, path) -> None:
        """Write one row per trial; the file is replaced whole (a temporary file, then a rename)."""
        rows = self.rows()

        def write(tmp):
            with open(tmp, "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["number"])
                writer.writeheader()
                writer.writerows(rows)

        atomic_write(path, write)

    def to_jsonl(self, path) -> None:
        """Write one JSON line per trial; the file is replaced whole, as :meth:`to_csv`."""
        def write(tmp):
            with open(tmp, "w") as f:
                for t, row in zip(self.trials, self.rows()):
                    f.write(json.dumps({**row, "config": {k: plain(v, strict=True) for k, v in t.config.items()},
                                        "info": {k: plain(v, strict=True) for k, v in t.info.items()}}) + "\n")

        atomic_write(path, write)

    def table(self, limit: int | None = None, info: tuple = ()) -> str:
        """The trials as aligned text in :meth:`ranked`'s order, best first (diverged last); ``limit`` rows at most;
        ``info``: keys of each trial's info shown as more columns (:meth:`rows`)."""
        ordered = self.ranked()
        rows = self.rows(info)
        by_number = {r["number"]: r for r in rows}
        shown = [by_number[t.number] for t in ordered][:limit]
        if not shown:
            return "(no trials)"
        columns = [c for c in shown[0] if c not in ("seconds", "bracket", "rung") or
                   any(r[c] for r in shown)]

        def cell(v):
            if v is None:
                return "nan"
            return f"{v:.4g}" if isinstance(v, float) else str(v)

        widths = {c: max(len(c), *(len(cell(r[c])) for r in shown)) for c in columns}
        lines = ["  ".join(c.rjust(widths[c]) for c in columns)]
        lines += ["  ".join(cell(r[c]).rjust(widths[c]) for c in columns) for r in shown]
        return "\n".join(lines)

    def plot(self, path=None, space: dict | None = None, title: str | None = None):
        """Score against each hyperparameter that varied, one panel each; diverged trials as red crosses
        at the bottom; log axes for log-uniform ranges. Saves to ``path`` when given; returns the figure."""
        from matplotlib.figure import Figure

        from minidl.tune.space import Choice, Dimension

        names = [k for k in (space or {}) if isinstance(space[k], Dimension)] or \
            [k for k in (self.trials[0].config if self.trials else {})
             if len({repr(t.config.get(k)) for t in self.trials}) > 1]
        names = names or ["number"]
        fig = Figure(figsize=(3.6 * len(names), 3.2), layout="constrained")
        axes = fig.subplots(1, len(names), squeeze=False)[0]
        done = self.finished
        low = min((t.score for t in done), default=0.0)
        epochs = sorted({t.epochs for t in self.trials})
        for ax, name in zip(axes, names):
            dim = (space or {}).get(name)
            def value_of(t):
                return t.number if name == "number" else t.config.get(name)

            values = dim.options if isinstance(dim, Choice) else [value_of(t) for t in self.trials]
            categorical = not all(is_number(v) for v in values)
            labels = list(dict.fromkeys(values))
            log = getattr(dim, "log", False) or (isinstance(dim, Choice) and not categorical and min(values) > 0
                                                 and max(values) >= 100 * min(values))

            def x_of(t):
                return labels.index(value_of(t)) if categorical else value_of(t)

            for e in epochs:
                group = [t for t in done if t.epochs == e]
                if group:
                    ax.scatter([x_of(t) for t in group], [t.score for t in group], s=18, alpha=0.8,
                               label=f"{e} epoch{'s' if e != 1 else ''}")
            bad = [t for t in self.trials if t not in done]
            if bad:
                ax.scatter([x_of(t) for t in bad], [low] * len(bad), marker="x", color="red", label="diverged")
            if log:
                ax.set_xscale("log")
            if categorical:
                ax.set_xticks(range(len(labels)), [str(v) for v in labels])
            ax.set_xlabel(name)
            ax.set_ylabel(self.metric)
            ax.grid(alpha=0.3)
        if len(epochs) > 1 or any(t not in done for t in self.trials):
            # beside the points, never on them
            axes[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1), borderaxespad=0)
        fig.suptitle(title or f"{self.strategy}: {len(self.trials)} trials, {self.epochs_trained} epochs",
                     fontsize=10)
        if path is not None:
            atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=100))
        return fig

    def to_dict(self) -> dict:
        return {"strategy": self.strategy, "mode": self.mode, "metric": self.metric,
                "trials": [asdict(t) for t in self.trials]}

