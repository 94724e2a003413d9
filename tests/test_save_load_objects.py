"""mdl.save / mdl.load as torch.save / torch.load: file objects, whole objects (pickle), checksums."""
import io
import json
import struct
import warnings
import zlib

import numpy as np
import pytest

import minidl as mdl
from minidl.serialization import LoadError


def _model():
    mdl.manual_seed(0)
    return mdl.nn.Sequential(mdl.nn.Linear(4, 8), mdl.nn.ReLU(), mdl.nn.Linear(8, 2))


def _data_start(raw: bytes) -> int:
    return 8 + struct.unpack("<Q", raw[:8])[0]


def _header(raw: bytes) -> dict:
    return json.loads(raw[8:_data_start(raw)])


def _zero_200_bytes_of(path, name):
    """Zero 200 bytes in place inside the array ``name`` of the safetensors file at ``path``."""
    raw = bytearray(path.read_bytes())
    begin, end = _header(bytes(raw))[name]["data_offsets"]
    assert end - begin >= 300
    start = _data_start(bytes(raw)) + begin + 50
    raw[start:start + 200] = bytes(200)
    path.write_bytes(bytes(raw))


# ---------------------------------------------------------------- file objects
def test_state_dicts_go_through_binary_file_objects_as_through_paths(tmp_path):
    model = _model()
    with open(tmp_path / "f.safetensors", "wb") as f:
        mdl.save(model.state_dict(), f)
    mdl.save(model.state_dict(), tmp_path / "p.safetensors")
    assert (tmp_path / "f.safetensors").read_bytes() == (tmp_path / "p.safetensors").read_bytes()
    with open(tmp_path / "f.safetensors", "rb") as f:
        state = mdl.load(f)
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(state[name], value)
    buffer = io.BytesIO()
    mdl.save({"step": 3, "w": np.arange(5.0)}, buffer)
    buffer.seek(0)
    back = mdl.load(buffer)
    assert back["step"] == 3
    np.testing.assert_array_equal(back["w"], np.arange(5.0))


def test_file_objects_in_text_mode_or_of_the_wrong_kind_say_how_to_open_them(tmp_path):
    with open(tmp_path / "t.txt", "w") as f, pytest.raises(TypeError, match=r"text mode.*open\(path, 'wb'\)"):
        mdl.save({"a": np.ones(2)}, f)
    (tmp_path / "t.txt").write_text("not a checkpoint")
    with open(tmp_path / "t.txt") as f, pytest.raises(TypeError, match=r"text mode.*open\(path, 'rb'\)"):
        mdl.load(f)
    with pytest.raises(TypeError, match=r"save: f must be a path or a binary file object.*got a int"):
        mdl.save({"a": np.ones(2)}, 3)
    with pytest.raises(TypeError, match=r"load: f must be a path or a binary file object.*got a list"):
        mdl.load([1])


def test_a_damaged_file_object_is_a_load_error_naming_the_stream():
    with pytest.raises(LoadError, match="the BytesIO file object is not a complete safetensors file"):
        mdl.load(io.BytesIO(b"\x10\x00"))


# ---------------------------------------------------------------- whole objects
def _whole_model_round_trip(lib, model, path):
    """The same program under PyTorch and minidl: save a whole module, load it by default, then trusted."""
    with open(path, "wb") as f:
        lib.save(model, f)
    with open(path, "rb") as f, pytest.raises(Exception, match="weights_only") as refused:
        lib.load(f)
    with open(path, "rb") as f, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return refused.value, lib.load(f, weights_only=False)


def test_a_whole_module_saves_and_loads_only_with_weights_only_false(tmp_path):
    model = _model()
    refused, back = _whole_model_round_trip(mdl, model, tmp_path / "model.pt")
    assert isinstance(refused, LoadError)
    assert "pickled Python object ('minidl.nn.containers.Sequential'" in str(refused)
    assert "mdl.load(f, weights_only=False)" in str(refused) and "state_dict()" in str(refused)
    assert type(back) is type(model) and back is not model
    x = mdl.tensor(np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32))
    np.testing.assert_array_equal(back(x).numpy(), model(x).numpy())
    back(x).sum().backward()                                     # the loaded model trains
    assert back[0].weight.grad is not None
    with open(tmp_path / "model.pt", "rb") as f, pytest.warns(UserWarning, match="a pickle can run any code"):
        mdl.load(f, weights_only=False)


def test_the_same_program_behaves_as_under_pytorch(torch, tmp_path):
    torch_model = torch.nn.Linear(3, 2)
    torch_refused, torch_back = _whole_model_round_trip(torch, torch_model, tmp_path / "torch.pt")
    model = mdl.nn.Linear(3, 2)
    with mdl.no_grad():
        model.weight.copy_(torch_model.weight.detach().numpy())
        model.bias.copy_(torch_model.bias.detach().numpy())
    refused, back = _whole_model_round_trip(mdl, model, tmp_path / "minidl.pt")
    assert "weights_only" in str(torch_refused) and "weights_only" in str(refused)  # both refuse, both say how
    x = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    np.testing.assert_allclose(back(mdl.tensor(x)).numpy(), torch_back(torch.tensor(x)).detach().numpy(),
                               rtol=1e-6, atol=1e-6)


def test_a_checkpoint_dict_holding_a_module_and_plain_values_round_trips(tmp_path):
    model = _model()
    mdl.save({"model": model, "epoch": 7, "note": "best"}, tmp_path / "ckpt.pt")
    with pytest.warns(UserWarning):
        back = mdl.load(tmp_path / "ckpt.pt", weights_only=False)
    assert back["epoch"] == 7 and back["note"] == "best"
    for (name, a), (_, b) in zip(model.state_dict().items(), back["model"].state_dict().items()):
        np.testing.assert_array_equal(a, b, err_msg=name)


def test_arrays_of_a_pickled_object_are_raw_bytes_with_checksums(tmp_path):
    model = _model()
    mdl.save(model, tmp_path / "m.pt")
    header = _header((tmp_path / "m.pt").read_bytes())
    shapes = sorted(tuple(entry["shape"]) for name, entry in header.items() if name.startswith("pickled."))
    assert shapes == sorted(tuple(p.shape) for p in model.parameters())
    assert set(json.loads(header["__metadata__"]["minidl.crc32"])) == set(header) - {"__metadata__"}


# ---------------------------------------------------------------- checksums
def test_every_array_carries_the_crc32_of_its_bytes(tmp_path):
    state = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.array([1, -2], np.int8)}
    mdl.save(state, tmp_path / "s.safetensors")
    raw = (tmp_path / "s.safetensors").read_bytes()
    sums = json.loads(_header(raw)["__metadata__"]["minidl.crc32"])
    assert sums == {name: f"{zlib.crc32(a.tobytes()):08x}" for name, a in state.items()}


@pytest.mark.parametrize("through", ["path", "file object"])
def test_200_zeroed_bytes_are_a_load_error_naming_the_tensor(tmp_path, through):
    model = mdl.nn.Sequential(mdl.nn.Linear(16, 32), mdl.nn.Linear(32, 8))
    path = tmp_path / "w.safetensors"
    mdl.save(model.state_dict(), path)
    _zero_200_bytes_of(path, "0.weight")
    with pytest.raises(LoadError, match=r"damaged: the bytes of the tensor '0.weight' do not match the checksum"):
        if through == "path":
            mdl.load(path)
        else:
            with open(path, "rb") as f:
                mdl.load(f)


def test_a_damaged_training_checkpoint_cannot_be_resumed(tmp_path):
    from minidl.train.run_state import CheckpointError, load_checkpoint, save_checkpoint

    model = mdl.nn.Linear(20, 20)
    path = tmp_path / "last.safetensors"
    save_checkpoint(path, model)
    name = next(n for n, e in _header(path.read_bytes()).items() if n != "__metadata__" and e["shape"] == [20, 20])
    _zero_200_bytes_of(path, name)
    before = model.weight.numpy().copy()
    with pytest.raises(CheckpointError, match=f"the tensor '{name}' do not match the checksum"):
        load_checkpoint(path, mdl.nn.Linear(20, 20))
    np.testing.assert_array_equal(model.weight.numpy(), before)


def test_files_without_checksums_still_load(tmp_path):
    from safetensors.numpy import save_file

    save_file({"w": np.arange(6, dtype=np.float32)}, str(tmp_path / "other.safetensors"))
    np.testing.assert_array_equal(mdl.load(tmp_path / "other.safetensors")["w"], np.arange(6, dtype=np.float32))
    with open(tmp_path / "other.safetensors", "rb") as f:
        np.testing.assert_array_equal(mdl.load(f)["w"], np.arange(6, dtype=np.float32))


def test_a_damaged_checksum_list_is_a_load_error(tmp_path):
    path = tmp_path / "s.safetensors"
    mdl.save({"w": np.ones(4, np.float32)}, path)
    raw = path.read_bytes()
    damaged = raw.replace(b'"minidl.crc32":"{\\"w\\"', b'"minidl.crc32":"{\\"v\\"')
    assert damaged != raw
    path.write_bytes(damaged)
    with pytest.raises(LoadError, match="damaged checksums"):
        mdl.load(path)
