"""Training: the loop, callbacks, metrics, checkpoints, curves and the debugging recipe.

    from minidl.train import Trainer, EarlyStopping, ModelCheckpoint, JSONLLogger
    trainer = Trainer(model, optimizer, train_loader, val_loader,
                      callbacks=[EarlyStopping(patience=5), ModelCheckpoint("runs/exp")], seed=0)
    trainer.fit(epochs=20)
    plot_curves(trainer.history, "runs/exp/curves.png", steps=trainer.steps)

The command line does all of it in one go: ``minidl train`` (see docs/training.md), which builds
its run from settings with :func:`minidl.train.recipe.build_run`. ``minidl diagnose`` runs the
debugging recipe (:mod:`minidl.train.diagnostics`), the detectors of the silent failures
(:mod:`minidl.train.silent_failures`) and the inference budget (:mod:`minidl.train.inference_budget`).
"""
from minidl.train.batch_scaling import (
    BatchScalingStudy,
    batch_size_study,
    classify_regions,
    fit_steps_model,
    noise_scale_at,
    plot_batch_scaling,
    scaling_efficiency,
    steps_to_target,
)
from minidl.train.callbacks import Callback, CSVLogger, EarlyStopping, JSONLLogger, ModelCheckpoint
from minidl.train.claims import ClaimLog
from minidl.train.classifiers import build_model
from minidl.train.clipping import PercentileClipping, clip_loss
from minidl.train.curves import make_figure, plot_curves
from minidl.train.diagnostics import (
    CheckResult,
    check_dropout_batchnorm,
    check_initial_loss,
    compare_with_random_inputs,
    compare_with_zeroed_inputs,
    diagnose,
    format_report,
    format_statistics,
    layer_statistics,
    overfit_small_batch,
)
from minidl.train.distill import DistillationLoss, distillation_loss, ensemble_soft_targets
from minidl.train.ensemble import Ensemble, average_probabilities
from minidl.train.inference_budget import format_inference_report, inference_report
from minidl.train.inspection import PredictionGallery, plot_mispredictions, show_batch, worst_predictions
from minidl.train.landscape import (
    Landscape,
    filter_normalized_direction,
    interpolate,
    loss_landscape,
    rescale_relu_layers,
    sharpness,
)
from minidl.train.metrics import (
    ValidationSizeWarning,
    accuracy,
    accuracy_interval,
    bootstrap_interval,
    check_validation_size,
    classification_report,
    confusion_matrix,
    macro_f1,
    macro_precision,
    macro_recall,
    per_class_precision_recall_f1,
    precision_recall_f1,
    smallest_difference,
    wilson_interval,
)
from minidl.train.predict import Run, load_run
from minidl.train.run_state import CheckpointError, load_checkpoint, read_checkpoint, save_checkpoint
from minidl.train.silent_failures import (
    check_augmentation,
    check_capacity,
    check_loss_gradient,
    check_next_token_leak,
    check_next_token_targets,
)
from minidl.train.tensorboard import TensorBoardLogger
from minidl.train.trainer import NonFiniteLossError, Trainer, TrainingInterrupted, fit, seed_everything

__all__ = [
    "CSVLogger", "Callback", "CheckResult", "CheckpointError", "EarlyStopping", "JSONLLogger",
    "ModelCheckpoint", "NonFiniteLossError", "Run", "TensorBoardLogger", "TrainingInterrupted",
    "BatchScalingStudy", "batch_size_study", "classify_regions", "fit_steps_model", "noise_scale_at",
    "plot_batch_scaling", "scaling_efficiency", "steps_to_target",
    "Trainer", "ValidationSizeWarning", "accuracy", "accuracy_interval", "bootstrap_interval", "build_model",
    "check_validation_size", "smallest_difference", "wilson_interval", "check_dropout_batchnorm",
    "check_initial_loss", "classification_report", "compare_with_random_inputs", "compare_with_zeroed_inputs",
    "confusion_matrix",
    "diagnose", "fit", "format_report", "format_statistics", "layer_statistics", "load_checkpoint", "load_run",
    "macro_f1", "macro_precision", "macro_recall", "make_figure", "overfit_small_batch",
    "per_class_precision_recall_f1", "plot_curves", "precision_recall_f1", "read_checkpoint",
    "save_checkpoint", "seed_everything",
    "DistillationLoss", "Ensemble", "average_probabilities", "distillation_loss", "ensemble_soft_targets",
    "PercentileClipping", "clip_loss", "plot_mispredictions", "show_batch", "worst_predictions",
    "Landscape", "filter_normalized_direction", "interpolate", "loss_landscape", "rescale_relu_layers", "sharpness",
    "ClaimLog", "PredictionGallery", "check_augmentation", "check_capacity", "check_loss_gradient",
    "check_next_token_leak", "check_next_token_targets", "format_inference_report", "inference_report",
]
