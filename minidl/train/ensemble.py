"""Ensembles: average the predicted probabilities of several independently trained models.

    models = [train_one(seed) for seed in range(5)]     # same recipe, different seeds
    ensemble = Ensemble(models)
    probs = ensemble.predict_proba(x)                     # mean of the members' softmax
    Trainer(ensemble, ...).evaluate(test_loader)          # its outputs work as logits

Models trained from different random initializations (and batch orders) make
partly independent errors; averaging their class probabilities,

    p(y | x) = (1/N) Σₙ softmax(fₙ(x)),

cancels part of those errors, usually worth a point or two of accuracy for N
times the inference cost. ``Ensemble.forward`` returns log p(y | x): a valid
logit vector (softmax of it gives p back), so cross-entropy, ``argmax`` and
the Trainer's metrics apply to the ensemble as to one model.
"""
from __future__ import annotations

import math

import minidl.functional as F
from minidl import nn
from minidl.autograd import no_grad
from minidl.tensor import Tensor

__all__ = ["Ensemble", "average_probabilities"]


def average_probabilities(models, x) -> Tensor:
    """(1/N) Σₙ softmax(fₙ(x)) over the class axis (1), without gradients, each model in eval mode."""
    models = list(models)
    if not models:
        raise ValueError("average_probabilities: got no models")
    return Ensemble(models).predict_proba(x)


class Ensemble(nn.Module):
    """N models whose class probabilities are averaged; ``forward`` returns the log of the average.

    ``members`` is a ModuleList, so ``parameters()``, ``state_dict()``, ``to()``, ``eval()`` cover all.
    """

    def __init__(self, models):
        super().__init__()
        models = list(models)
        if not models:
            raise ValueError("Ensemble: got no models")
        self.members = nn.ModuleList(models)

    def forward(self, x) -> Tensor:
        """log((1/N) Σₙ softmax(fₙ(x))), computed as logsumexp of the log-softmaxes minus log N."""
        logs = F.stack([F.log_softmax(model(x), dim=1) for model in self.members], dim=0)
        return F.logsumexp(logs, dim=0) - math.log(len(self.members))

    def predict_proba(self, x) -> Tensor:
        """The averaged probabilities (N, C), in eval mode and without gradients.

        Every submodule's own mode (train or eval) is restored afterwards.
        """
        modes = [(m, m.training) for m in self.modules()]
        self.eval()
        try:
            with no_grad():
                return F.exp(self(x))
        finally:
            for m, mode in modes:
                m.training = mode
