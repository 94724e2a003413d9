"""multinomial and randperm: their distributions, tested statistically, and PyTorch's rules and errors.

Each distribution test compares counts with their expectation by Pearson's χ² statistic and
fails above the χ² quantile of probability 1 − 1e-6: a correct sampler fails it once in a
million seeds, while a wrong probability (a category off by a few percent of its weight, with
the sample sizes here) moves the statistic far past it. The draws are seeded, so each test is
one fixed draw: NumPy's generator gives the same numbers on every machine.
"""
import itertools

import numpy as np
import pytest

import minidl as mdl
from minidl.ops.sampling import multinomial, randperm

chi2 = pytest.importorskip("scipy.stats").chi2


def _pearson(counts, expected):
    return float(((counts - expected) ** 2 / expected).sum())


def _bound(degrees_of_freedom):
    return chi2.ppf(1 - 1e-6, degrees_of_freedom)


def test_multinomial_with_replacement_draws_each_category_by_its_weight(device):
    weights = np.array([0.5, 0.0, 2.0, 1.0, 1.5])  # not normalized, one zero
    draws = 100_000
    samples = multinomial(mdl.tensor(weights, device=device), draws, replacement=True).numpy()
    assert samples.shape == (draws,) and samples.dtype == np.int64
    counts = np.bincount(samples, minlength=5)
    assert counts[1] == 0  # weight 0: never drawn
    positive = weights > 0
    expected = draws * weights[positive] / weights.sum()
    assert _pearson(counts[positive], expected) < _bound(positive.sum() - 1)


def test_multinomial_rows_are_independent_distributions():
    weights = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 3.0], [1.0, 1.0, 2.0]])
    samples = multinomial(mdl.tensor(weights), 40_000, True).numpy()
    assert samples.shape == (3, 40_000)
    assert (samples[0] == 0).all() and (samples[1] == 2).all()
    counts = np.bincount(samples[2], minlength=3)
    assert _pearson(counts, 40_000 * np.array([0.25, 0.25, 0.5])) < _bound(2)


def test_multinomial_without_replacement_draws_successively_by_weight(device):
    """P(first i, then j) = w_i / W · w_j / (W − w_i): PyTorch's sampling without replacement."""
    w = np.array([1.0, 2.0, 3.0, 4.0])
    rows = 60_000
    samples = multinomial(mdl.tensor(np.tile(w, (rows, 1)), device=device), 2).numpy()
    assert samples.shape == (rows, 2)
    assert (samples[:, 0] != samples[:, 1]).all()  # no repeats
    pairs = list(itertools.permutations(range(4), 2))
    counts = np.array([np.sum((samples[:, 0] == i) & (samples[:, 1] == j)) for i, j in pairs])
    W = w.sum()
    expected = rows * np.array([w[i] / W * w[j] / (W - w[i]) for i, j in pairs])
    assert _pearson(counts, expected) < _bound(len(pairs) - 1)


def test_multinomial_without_replacement_of_every_category_is_a_permutation_of_the_nonzero_ones():
    samples = multinomial(mdl.tensor(np.array([[0.2, 0.0, 1.0, 3.0]] * 50)), 3).numpy()
    assert all(sorted(row) == [0, 2, 3] for row in samples)


def test_multinomial_is_reproducible_under_manual_seed_and_takes_a_generator():
    w = mdl.tensor(np.array([1.0, 2.0, 3.0]))
    mdl.manual_seed(5)
    first = multinomial(w, 10, True).numpy()
    mdl.manual_seed(5)
    np.testing.assert_array_equal(multinomial(w, 10, True).numpy(), first)
    a = multinomial(w, 3, generator=np.random.default_rng(1)).numpy()
    np.testing.assert_array_equal(multinomial(w, 3, generator=np.random.default_rng(1)).numpy(), a)
    assert w.multinomial(2).shape == (2,)  # the Tensor method, as PyTorch's


def test_multinomial_without_replacement_refuses_more_samples_than_nonzero_weights():
    """PyTorch's documented rule (its CPU kernel returns zero-weight categories instead: a clear error here)."""
    with pytest.raises(ValueError, match="multinomial: .*only 2 categories of nonzero weight"):
        multinomial(mdl.tensor(np.array([1.0, 0.0, 2.0])), 3)


@pytest.mark.parametrize("weights, n, kwargs, match", [
    ([1.0, 2.0], 3, {}, "cannot sample 3 samples without replacement from 2 categories"),
    ([1.0, -0.5], 1, {}, "finite and non-negative"),
    ([1.0, np.nan], 1, {}, "finite and non-negative"),
    ([0.0, 0.0], 1, {"replacement": True}, "positive sum"),
    ([1.0, 2.0], 0, {}, "num_samples must be positive"),
    ([[[1.0]]], 1, {}, "1-D .* or 2-D"),
])
def test_multinomial_refuses_what_pytorch_refuses(weights, n, kwargs, match):
    with pytest.raises(ValueError, match=f"multinomial: .*{match}"):
        multinomial(mdl.tensor(np.array(weights)), n, **kwargs)
    torch = pytest.importorskip("torch")
    with pytest.raises(RuntimeError):
        torch.multinomial(torch.tensor(np.array(weights)), n, **kwargs)


def test_randperm_is_a_permutation_on_each_device(device):
    order = randperm(1000, device=device)
    assert order.device.startswith(device)
    np.testing.assert_array_equal(np.sort(order.numpy()), np.arange(1000))


def test_randperm_is_a_uniformly_random_permutation():
    draws = 48_000
    seen = np.array([randperm(4).numpy() for _ in range(draws)])
    assert seen.dtype == np.int64
    assert (np.sort(seen, axis=1) == np.arange(4)).all()
    orders = {p: i for i, p in enumerate(itertools.permutations(range(4)))}
    counts = np.bincount([orders[tuple(row)] for row in seen], minlength=24)
    assert _pearson(counts, np.full(24, draws / 24)) < _bound(23)


def test_randperm_is_seeded_and_checks_n():
    mdl.manual_seed(3)
    first = randperm(10).numpy()
    mdl.manual_seed(3)
    np.testing.assert_array_equal(randperm(10).numpy(), first)
    assert randperm(0).shape == (0,)
    assert randperm(5, dtype=np.int32).dtype == np.int32
    with pytest.raises(ValueError, match="randperm: n must be non-negative, got -1"):
        randperm(-1)
