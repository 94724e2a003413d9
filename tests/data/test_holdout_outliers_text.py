"""The test split that counts its looks, per-sample outlier statistics, and synonym augmentation, by value."""
import re
import warnings

import numpy as np
import pytest

from minidl import data
from minidl.data.text_augment import SYNONYMS


# ---------------------------------------------------------------- TestSplit
def test_the_first_look_is_silent_the_second_warns_and_every_look_is_counted():
    x, y = np.arange(10.0).reshape(5, 2), np.array([0, 1, 0, 1, 1])
    test = data.TestSplit(x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert test.evaluate(lambda a, b: float(b.mean()), label="final") == pytest.approx(0.6)
    with pytest.warns(data.TestSetReuseWarning, match=r"look number 2 at the test split .*'final'"):
        assert test.evaluate(lambda a, b: float(a.sum()), label="again") == 45.0
    assert test.evaluations == 2 and len(test) == 5
    assert test.history == [("final", pytest.approx(0.6)), ("again", 45.0)]
    np.testing.assert_allclose(test.scores(), [0.6, 45.0])


def test_allowed_looks_pass_silently():
    test = data.TestSplit(np.zeros((3, 1)), np.zeros(3), name="holdout", allowed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            test.evaluate(lambda a, b: 1.0)
    with pytest.warns(data.TestSetReuseWarning, match="holdout split"):
        test.evaluate(lambda a, b: 1.0)


@pytest.mark.parametrize("kwargs, match", [({"allowed": 0}, "allowed must be"), ({"allowed": True}, "allowed")])
def test_bad_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        data.TestSplit(np.zeros((2, 1)), np.zeros(2), **kwargs)
    with pytest.raises(ValueError, match="same number of samples"):
        data.TestSplit(np.zeros((2, 1)), np.zeros(3))
    with pytest.raises(TypeError, match="score must be a function"):
        data.TestSplit(np.zeros((2, 1)), np.zeros(2)).evaluate(0.5)


# ---------------------------------------------------------------- outliers
def test_sample_statistics_against_numpy():
    x = np.random.default_rng(0).normal(size=(6, 2, 3))
    flat = x.reshape(6, -1)
    stats = data.sample_statistics(x)
    for name, expected in (("mean", flat.mean(1)), ("std", flat.std(1)), ("min", flat.min(1)),
                           ("max", flat.max(1)), ("norm", np.linalg.norm(flat, axis=1))):
        np.testing.assert_allclose(stats[name], expected, rtol=1e-12)


def test_robust_z_by_hand():
    # median 3, |v - 3| = 2, 1, 0, 1, 97 -> MAD 1; z = (v - 3) / 1.4826
    np.testing.assert_allclose(data.robust_z([1, 2, 3, 4, 100]), np.array([-2, -1, 0, 1, 97]) / 1.4826)
    # MAD 0 (three of five equal): the mean absolute deviation from 5, (0 + 0 + 0 + 2 + 4) / 5 = 1.2, instead
    np.testing.assert_allclose(data.robust_z([5, 5, 5, 7, 1]), np.array([0, 0, 0, 2, -4]) / (1.2533 * 1.2))
    np.testing.assert_array_equal(data.robust_z([3, 3, 3]), [0, 0, 0])


def test_the_corrupted_samples_score_highest_and_sit_at_the_end():
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 1, size=(50, 16))
    x[7] = 0.0            # blank
    x[31] *= 40.0         # wrongly scaled
    scores = data.outlier_scores(x)
    low, high = data.extremes(scores, k=2)
    assert set(high) == {7, 31} and scores[31] > scores[7] > np.sort(scores)[-3]
    assert list(low) == list(np.argsort(scores, kind="stable")[:2])
    np.testing.assert_allclose(data.outlier_scores(x, ("mean",)), np.abs(data.robust_z(x.mean(1))))
    with pytest.raises(ValueError, match="statistics must be some of"):
        data.outlier_scores(x, ("median",))
    with pytest.raises(ValueError, match="k must be"):
        data.extremes(scores, k=51)


def test_plot_extremes_draws_two_rows():
    import matplotlib
    matplotlib.use("Agg")
    x = np.random.default_rng(2).normal(size=(20, 64))
    fig = data.plot_extremes(x, data.outlier_scores(x), k=4, shape=(8, 8), labels=np.arange(20))
    assert len(fig.axes) == 8


# ---------------------------------------------------------------- synonyms
def test_every_table_word_is_replaced_with_p_1_keeping_case_and_everything_else():
    augment = data.SynonymReplacement(p=1.0, rng=0)
    text = "Good my LORD, speak: the King is here. O, a noble heart!"
    out = augment(text)
    words, new = re.findall(r"[A-Za-z']+", text), re.findall(r"[A-Za-z']+", out)
    assert len(words) == len(new) and re.sub(r"[A-Za-z']+", "_", text) == re.sub(r"[A-Za-z']+", "_", out)
    for old, replacement in zip(words, new):
        if old.lower() in SYNONYMS:
            assert replacement.lower() in SYNONYMS[old.lower()]
            assert (replacement.isupper() == old.isupper()) and (replacement[0].isupper() == old[0].isupper())
        else:
            assert replacement == old
    assert augment.replaced == augment.candidates == 6  # good, lord, speak, king, noble, heart


def test_p_0_changes_nothing_and_the_share_replaced_follows_p():
    text = " ".join(["good night sweet friend"] * 500)
    assert data.SynonymReplacement(p=0.0, rng=0)(text) == text
    augment = data.SynonymReplacement(p=0.3, rng=1)
    augment(text)
    assert augment.candidates == 2000 and abs(augment.replaced / 2000 - 0.3) < 0.04  # 4 std of a binomial share


def test_augment_sentences_keeps_the_originals_then_k_copies():
    lines = ["Good night.", "Speak, friend."]
    out = data.augment_sentences(lines, k=3, p=1.0, rng=0)
    assert out[:2] == lines and len(out) == 8 and all(a != b for a, b in zip(out[2:], lines * 3))
    assert data.augment_sentences(lines, k=1, keep_original=False, p=0.0) == lines
    with pytest.raises(ValueError, match="k must be"):
        data.augment_sentences(lines, k=-1)
    with pytest.raises(ValueError, match="p must be a probability"):
        data.SynonymReplacement(p=2.0)
    with pytest.raises(ValueError, match="non-empty list of synonyms"):
        data.SynonymReplacement({"good": []})
