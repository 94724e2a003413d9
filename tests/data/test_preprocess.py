"""Standardizer: training-split statistics, applied unchanged everywhere else."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from minidl.data import Standardizer


def test_statistics_come_from_the_training_split_only():
    rng = np.random.default_rng(0)
    train = rng.normal(3.0, 2.0, size=(500, 4)).astype(np.float32)
    test = rng.normal(-1.0, 5.0, size=(50, 4)).astype(np.float32)
    scaler = Standardizer().fit(train)
    z_train, z_test = scaler.transform(train), scaler.transform(test)
    np.testing.assert_allclose(z_train.mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(z_train.std(axis=0), 1.0, rtol=1e-5)
    expected = (test.astype(np.float64) - train.astype(np.float64).mean(0)) / train.astype(np.float64).std(0)
    np.testing.assert_allclose(z_test, expected, rtol=1e-5, atol=1e-5)
    assert abs(z_test.mean()) > 0.5  # the test split is not re-centred on its own mean
    single = scaler.transform(test[:1])  # a deployment batch of one is fine
    np.testing.assert_allclose(single, expected[:1], rtol=1e-5, atol=1e-5)


def test_hand_computed_values():
    x = np.array([[1.0, 10.0], [3.0, 10.0]], dtype=np.float32)   # column 2 is constant
    scaler = Standardizer().fit(x)
    np.testing.assert_array_equal(scaler.transform(x), [[-1.0, 0.0], [1.0, 0.0]])
    np.testing.assert_array_equal(scaler.transform(np.array([[5.0, 12.0]], np.float32)), [[3.0, 2.0]])
    assert scaler.constant.ravel().tolist() == [False, True]


@given(x=arrays(np.float64, st.tuples(st.integers(1, 20), st.integers(1, 5)),
                elements=st.floats(-1e3, 1e3, allow_nan=False)))
@settings(max_examples=50, deadline=None)
def test_inverse_transform_undoes_transform_and_output_is_finite(x):
    scaler = Standardizer().fit(x)
    z = scaler.transform(x)
    assert z.dtype == np.float64 and np.all(np.isfinite(z))
    np.testing.assert_allclose(scaler.inverse_transform(z), x, rtol=1e-9, atol=1e-9)


def test_zero_variance_features_become_x_minus_mean():
    x = np.zeros((10, 8, 8), dtype=np.float32)   # digits-like: border pixels always blank
    x[:, 2:6, 2:6] = np.random.default_rng(1).integers(0, 17, size=(10, 4, 4))
    x[:, 0, 0] = 7.0
    scaler = Standardizer().fit(x)
    z = scaler.transform(x)
    assert np.all(np.isfinite(z)) and z.dtype == np.float32
    np.testing.assert_array_equal(z[:, 0, 0], 0.0)
    np.testing.assert_array_equal(z[:, 7, 7], 0.0)
    new = np.full((1, 8, 8), 2.0, np.float32)
    assert scaler.transform(new)[0, 0, 0] == 2.0 - 7.0 and scaler.transform(new)[0, 7, 7] == 2.0


def test_per_channel_statistics_for_images():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(16, 3, 5, 5)) * np.array([1.0, 2.0, 3.0])[None, :, None, None] + 4.0
    scaler = Standardizer(axis=(0, 2, 3)).fit(x)
    assert scaler.mean.shape == (1, 3, 1, 1)
    z = scaler.transform(x)
    np.testing.assert_allclose(z.mean(axis=(0, 2, 3)), 0.0, atol=1e-12)
    np.testing.assert_allclose(z.std(axis=(0, 2, 3)), 1.0)
    z_other_size = scaler.transform(rng.normal(size=(2, 3, 7, 9)))  # shared axes may change size
    assert z_other_size.shape == (2, 3, 7, 9)
    whole = Standardizer(axis=None).fit(x)
    assert whole.mean.size == 1 and np.isclose(whole.transform(x).std(), 1.0)


def test_dtypes():
    x8 = np.arange(12, dtype=np.uint8).reshape(6, 2)
    assert Standardizer().fit(x8).transform(x8).dtype == np.float32
    x32 = x8.astype(np.float32)
    assert Standardizer().fit(x32).transform(x32).dtype == np.float32
    assert Standardizer().fit(x32).inverse_transform(x32).dtype == np.float32


def test_state_dict_restores_the_same_transform(tmp_path):
    rng = np.random.default_rng(3)
    train = rng.normal(size=(40, 6)).astype(np.float32)
    train[:, 1] = 1.0
    scaler = Standardizer().fit(train)
    state = scaler.state_dict()
    assert all(isinstance(v, np.ndarray) for v in state.values())
    np.savez(tmp_path / "scaler.npz", **state)
    with np.load(tmp_path / "scaler.npz", allow_pickle=False) as f:
        restored = Standardizer().load_state_dict(dict(f))
    deploy = rng.normal(size=(3, 6)).astype(np.float32)
    np.testing.assert_array_equal(restored.transform(deploy), scaler.transform(deploy))
    np.testing.assert_array_equal(restored.constant, scaler.constant)


def test_state_dict_through_minidl_save(tmp_path):
    serialization = pytest.importorskip("minidl.serialization")
    train = np.random.default_rng(4).normal(size=(20, 3, 4, 4)).astype(np.float32)
    scaler = Standardizer(axis=(0, 2, 3)).fit(train)
    serialization.save({"scaler": scaler.state_dict()}, tmp_path / "model.safetensors")
    restored = Standardizer().load_state_dict(serialization.load(tmp_path / "model.safetensors")["scaler"])
    np.testing.assert_array_equal(restored.transform(train), scaler.transform(train))
    assert restored.reduced_axes == (0, 2, 3)


def test_errors_speak_to_the_user():
    scaler = Standardizer()
    with pytest.raises(RuntimeError, match="not fitted.*training split"):
        scaler.transform(np.zeros((2, 3)))
    scaler.fit(np.random.default_rng(0).normal(size=(5, 3)))
    with pytest.raises(ValueError, match=r"got shape \(5, 4\).*\('N', 3\)"):
        scaler.transform(np.zeros((5, 4)))
    with pytest.raises(ValueError, match="NaN"):
        Standardizer().fit(np.array([[1.0], [np.nan]]))
    with pytest.raises(ValueError, match="axis 3 is out of range"):
        Standardizer(axis=3).fit(np.zeros((2, 2)))
    with pytest.raises(ValueError, match="missing"):
        Standardizer().load_state_dict({"mean": np.zeros((1, 3))})
