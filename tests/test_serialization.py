"""mdl.save / mdl.load: safetensors files, nested state, atomic writes, clear errors."""
import json
import os
import struct

import numpy as np
import pytest

import minidl as mdl


def test_round_trip_of_nested_state(tmp_path):
    state = {
        "model": {"fc.weight": np.arange(6, dtype=np.float32).reshape(2, 3), "fc.bias": mdl.zeros(2)},
        "optimizer": {"step": 7, "lr": 0.25, "state": [{"m": np.full(3, 0.5)}, {}], "name": "adam"},
        "rng": mdl.backend.get_rng_state(),
        "none": None,
    }
    path = tmp_path / "ckpt.safetensors"
    mdl.save(state, path)
    back = mdl.load(path)
    np.testing.assert_array_equal(back["model"]["fc.weight"], state["model"]["fc.weight"])
    assert back["model"]["fc.weight"].dtype == np.float32
    np.testing.assert_array_equal(back["model"]["fc.bias"], np.zeros(2, np.float32))
    assert back["optimizer"]["step"] == 7 and back["optimizer"]["lr"] == 0.25
    np.testing.assert_array_equal(back["optimizer"]["state"][0]["m"], np.full(3, 0.5))
    assert back["rng"] == state["rng"]  # 128-bit integers survive (JSON, not float)
    assert back["none"] is None


def test_flat_state_dict_is_a_plain_safetensors_file(tmp_path):
    """Other tools see one tensor per name: check the header by hand, per the format."""
    path = tmp_path / "w.safetensors"
    mdl.save({"a": np.ones((2, 2), np.float32), "b": np.arange(3, dtype=np.int64)}, path)
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length])
    assert header["a"]["dtype"] == "F32" and header["a"]["shape"] == [2, 2]
    assert header["b"]["dtype"] == "I64" and header["b"]["shape"] == [3]


def test_truncated_file_gives_a_clear_error(tmp_path):
    path = tmp_path / "w.safetensors"
    mdl.save({"a": np.ones(100, np.float32)}, path)
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(path.read_bytes()[:60])
    with pytest.raises(ValueError, match="not a complete safetensors file"):
        mdl.load(cut)


def test_foreign_file_gives_a_clear_error(tmp_path):
    path = tmp_path / "evil.pkl"
    path.write_bytes(b"\x80\x04\x95" + b"cos\nsystem\n" * 10)  # a pickle-looking payload is never run
    with pytest.raises(ValueError, match="Nothing was executed"):
        mdl.load(path)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no file"):
        mdl.load(tmp_path / "nope.safetensors")


def test_failed_write_leaves_the_old_file_untouched(tmp_path):
    path = tmp_path / "w.safetensors"
    mdl.save({"a": np.ones(3, np.float32)}, path)
    before = path.read_bytes()
    with pytest.raises(TypeError, match="cannot store a object"):
        mdl.save({"a": np.zeros(3, np.float32), "bad": object()}, path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["w.safetensors"]  # no temporary left behind


def test_non_string_keys_rejected(tmp_path):
    with pytest.raises(TypeError, match="keys must be strings"):
        mdl.save({1: np.ones(2)}, tmp_path / "x.safetensors")


def test_load_to_device(tmp_path, device):
    path = tmp_path / "w.safetensors"
    mdl.save({"a": np.arange(4.0)}, path)
    back = mdl.load(path, device=device)
    assert mdl.backend.device_of(back["a"]).startswith(device)
    assert os.path.exists(path)
