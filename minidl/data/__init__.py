"""Data: datasets, loaders, splits, standardization, augmentation, bundled and IDX data.

    from minidl import data
    x, y = data.digits(flatten=True)                                   # bundled, no download
    (x_tr, y_tr), (x_va, y_va), (x_te, y_te) = data.train_val_test_split(
        x, y, ratios=(0.8, 0.1, 0.1), stratify=True, seed=0)
    scaler = data.Standardizer().fit(x_tr)                             # training split only
    loader = data.DataLoader(data.TensorDataset(scaler.transform(x_tr), y_tr),
                             batch_size=64, shuffle=True, seed=0)
    for xb, yb in loader: ...                                          # Tensors, as PyTorch's loader
    data.DataLoader(ds, sampler=data.RandomSampler(ds, replacement=True), batch_size=64)
    data.check_leakage(x_tr, x_va, x_te)                               # raises if a sample is in two splits
    test = data.TestSplit(x_te, y_te); test.evaluate(score)            # counts each look, warns on the second
    data.plot_extremes(x, data.outlier_scores(x), k=8, shape=(8, 8))  # the samples to look at first
    for tr, va in data.StratifiedKFold(5).split(x, y): ...             # scikit-learn's folds

Datasets and splits are NumPy: float32 features, int64 labels. The loader
yields Tensors (on its ``device=`` when one is given); the Trainer moves
batches to the model's device.
"""
from minidl.data.collate import default_collate, default_convert
from minidl.data.dataset import Dataset, Subset, TensorDataset
from minidl.data.datasets import (
    digits,
    gaussian_blobs,
    imbalanced_digits,
    polynomial_coefficients,
    polynomial_features,
    polynomial_regression,
    polynomial_target,
    two_spirals,
)
from minidl.data.folds import GroupKFold, KFold, StratifiedKFold, TimeSeriesSplit
from minidl.data.holdout import TestSetReuseWarning, TestSplit
from minidl.data.idx import load_idx, mnist
from minidl.data.imbalance import (
    adasyn,
    class_balance,
    class_weights,
    misclassification_counts,
    random_undersample,
    smote,
    undersample_hard,
)
from minidl.data.leakage import check_leakage, find_duplicates, sample_keys
from minidl.data.loader import DataLoader
from minidl.data.outliers import extremes, outlier_scores, plot_extremes, robust_z, sample_statistics
from minidl.data.preprocess import Standardizer
from minidl.data.samplers import (
    BatchSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)
from minidl.data.split import oversample_minority, random_split, split_ratios, train_val_test_split
from minidl.data.text_augment import SYNONYMS, SynonymReplacement, augment_sentences
from minidl.data.transforms import (
    Compose,
    FrequencyMasking,
    GaussianNoise,
    RandomCrop,
    RandomHorizontalFlip,
    RandomRotation,
    TimeMasking,
    TimeWarp,
    Transform,
    WindowSlice,
    augment_dataset,
)

__all__ = [
    "BatchSampler", "RandomSampler", "Sampler", "SequentialSampler", "SubsetRandomSampler", "WeightedRandomSampler",
    "default_collate", "default_convert", "Subset", "random_split",
    "Compose", "DataLoader", "Dataset", "FrequencyMasking", "GaussianNoise", "GroupKFold", "KFold", "RandomCrop",
    "RandomHorizontalFlip", "RandomRotation", "Standardizer", "StratifiedKFold", "TensorDataset", "TimeMasking",
    "TimeSeriesSplit", "TimeWarp", "Transform", "WindowSlice", "adasyn", "augment_dataset", "check_leakage",
    "class_balance", "class_weights", "digits", "find_duplicates", "gaussian_blobs", "imbalanced_digits",
    "load_idx", "misclassification_counts", "mnist", "oversample_minority", "polynomial_coefficients",
    "polynomial_features", "polynomial_regression", "polynomial_target", "random_undersample", "sample_keys",
    "smote", "split_ratios", "train_val_test_split", "two_spirals", "undersample_hard",
    "SYNONYMS", "SynonymReplacement", "TestSetReuseWarning", "TestSplit", "augment_sentences", "extremes",
    "outlier_scores", "plot_extremes", "robust_z", "sample_statistics",
]
