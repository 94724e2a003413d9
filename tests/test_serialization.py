"""mdl.save / mdl.load: safetensors files, nested state, atomic writes, clear errors."""
import json
import os
import stat
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minidl as mdl
from minidl.serialization import LoadError, atomic_write


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
    with pytest.raises(TypeError, match="cannot store the dict: it holds something pickle refuses"):
        mdl.save({"a": np.zeros(3, np.float32), "bad": lambda: 0}, path)   # neither plain nor picklable
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["w.safetensors"]  # no temporary left behind


def test_int_keys_tuples_and_marker_names_round_trip_exactly(tmp_path):
    state = {
        "state": {0: {"t": 3, "m": np.arange(3.0)}, 7: {}},
        "betas": (0.9, 0.999),
        "keys": {None: 1, True: 2, 2.5: 3, (1, "a"): 4, "s": 5},
        "user": {"__tensor__": "not a tensor", "__tuple__": [1], "__dict_items__": 0},
        "nested": [(1, [2, (3,)]), {"x": ()}],
    }
    path = tmp_path / "s.safetensors"
    mdl.save(state, path)
    back = mdl.load(path)
    assert set(back["state"]) == {0, 7} and back["state"][7] == {} and back["state"][0]["t"] == 3
    np.testing.assert_array_equal(back["state"][0]["m"], np.arange(3.0))
    assert type(back["betas"]) is tuple and back["betas"] == (0.9, 0.999)
    assert back["keys"] == state["keys"] and all(type(a) is type(b) for a, b in zip(back["keys"], state["keys"]))
    assert back["user"] == state["user"]
    assert back["nested"] == state["nested"] and type(back["nested"][0][1][1]) is tuple


def test_keys_the_plain_format_lacks_are_pickled_and_need_weights_only_false(tmp_path):
    path = tmp_path / "x.safetensors"
    mdl.save({frozenset({1}): np.ones(2)}, path)   # torch.save pickles such keys; so does mdl.save
    with pytest.raises(mdl.serialization.LoadError, match="pickled Python object.*weights_only=False"):
        mdl.load(path)
    with pytest.warns(UserWarning, match="a pickle can run any code"):
        back = mdl.load(path, weights_only=False)
    assert list(back) == [frozenset({1})]
    np.testing.assert_array_equal(back[frozenset({1})], np.ones(2))
    assert os.listdir(tmp_path) == ["x.safetensors"]


def test_paths_that_spell_the_same_name_keep_both_arrays(tmp_path):
    mdl.save({"a.b": np.ones(2), "a": {"b": np.zeros(3)}}, tmp_path / "x.safetensors")
    back = mdl.load(tmp_path / "x.safetensors")
    np.testing.assert_array_equal(back["a.b"], np.ones(2))
    np.testing.assert_array_equal(back["a"]["b"], np.zeros(3))


def test_files_are_read_by_the_safetensors_library(tmp_path):
    """minidl writes the format itself; the reference reader must see the same arrays."""
    from safetensors.numpy import load_file

    arrays = {"f": np.arange(6, dtype=np.float32).reshape(2, 3), "big_endian": np.arange(3, dtype=">i4"),
              "flag": np.array(True), "empty": np.zeros((0, 2), np.float16), "h": np.linspace(0, 1, 5)}
    mdl.save(arrays, tmp_path / "x.safetensors")
    theirs = load_file(tmp_path / "x.safetensors")
    assert set(theirs) == set(arrays)
    for name, array in arrays.items():
        assert theirs[name].dtype == array.dtype.newbyteorder("=") and theirs[name].shape == array.shape
        np.testing.assert_array_equal(theirs[name], array)


# ---------------------------------------------------------------- bfloat16 (from ml_dtypes)
def _bfloat16_bits(shape, seed=0):
    """Random 16-bit patterns plus the awkward ones: ±0, ±inf, NaNs with payloads, subnormals, the extremes."""
    special = np.array([0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0xFFFF, 0x0001, 0x807F, 0x7F7F, 0x3F80],
                       np.uint16)
    bits = np.random.default_rng(seed).integers(0, 2**16, size=int(np.prod(shape)), dtype=np.uint16)
    bits[:len(special)] = special[:bits.size]
    return bits.reshape(shape)


def test_bfloat16_arrays_and_tensors_round_trip_bit_for_bit(tmp_path):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf16 = np.dtype(ml_dtypes.bfloat16)
    bits = {"w": _bfloat16_bits((4, 5)), "t": _bfloat16_bits((7,), seed=1), "m": _bfloat16_bits((2, 3), seed=2),
            "s": _bfloat16_bits((), seed=3), "e": _bfloat16_bits((0, 3))}
    state = {"w": bits["w"].view(bf16), "t": mdl.tensor(bits["t"].view(bf16)), "f": np.arange(3, dtype=np.float32),
             "opt": {0: {"m": bits["m"].view(bf16), "step": 2}}, "s": bits["s"].view(bf16), "e": bits["e"].view(bf16)}
    mdl.save(state, tmp_path / "b.safetensors")
    back = mdl.load(tmp_path / "b.safetensors")
    for name, got in (("w", back["w"]), ("t", back["t"]), ("m", back["opt"][0]["m"]), ("s", back["s"]),
                      ("e", back["e"])):
        assert got.dtype == bf16 and got.shape == bits[name].shape, name
        np.testing.assert_array_equal(got.view(np.uint16), bits[name], err_msg=name)
    assert back["opt"][0]["step"] == 2 and back["f"].dtype == np.float32
    back["w"][0, 0] = 1.0  # writable, as every other loaded array
    np.testing.assert_array_equal(mdl.load(tmp_path / "b.safetensors")["w"].view(np.uint16), bits["w"])


def test_bfloat16_is_written_as_BF16_little_endian_words(tmp_path):
    """The header and bytes by hand, per the format: dtype BF16, two bytes per value, least significant first."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bits = _bfloat16_bits((3, 2))
    path = tmp_path / "w.safetensors"
    mdl.save({"w": bits.view(ml_dtypes.bfloat16)}, path)
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    entry = json.loads(raw[8:8 + length])["w"]
    assert entry == {"dtype": "BF16", "shape": [3, 2], "data_offsets": [0, 12]}
    assert raw[8 + length:] == struct.pack("<6H", *(int(b) for b in bits.reshape(-1)))
    assert [p.name for p in tmp_path.iterdir()] == ["w.safetensors"]  # written through a renamed temporary


def test_bfloat16_files_agree_with_the_reference_library_both_ways(tmp_path):
    """minidl's BF16 bytes are torch's bfloat16 bytes through safetensors' own reader and writer."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    bits = _bfloat16_bits((5, 3))
    mdl.save({"w": bits.view(ml_dtypes.bfloat16)}, tmp_path / "ours.safetensors")
    theirs = st_torch.load_file(str(tmp_path / "ours.safetensors"))["w"]
    assert theirs.dtype == torch.bfloat16 and tuple(theirs.shape) == bits.shape
    np.testing.assert_array_equal(theirs.view(torch.int16).numpy().view(np.uint16), bits)

    other = _bfloat16_bits((4,), seed=5)
    st_torch.save_file({"x": torch.from_numpy(other.view(np.int16).copy()).view(torch.bfloat16)},
                       str(tmp_path / "theirs.safetensors"))
    back = mdl.load(tmp_path / "theirs.safetensors")["x"]
    assert back.dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(back.view(np.uint16), other)


def test_loading_bfloat16_without_ml_dtypes_says_what_to_install(tmp_path, monkeypatch):
    import sys

    ml_dtypes = pytest.importorskip("ml_dtypes")
    path = tmp_path / "w.safetensors"
    mdl.save({"fine": np.ones(2, np.float32), "layer.weight": _bfloat16_bits((2,)).view(ml_dtypes.bfloat16)}, path)
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # `import ml_dtypes` now raises ImportError
    with pytest.raises(LoadError) as error:   # a ValueError and an OSError, as every damaged file's error
        mdl.load(path)
    assert isinstance(error.value, ValueError) and error.value.path == str(path)
    message = str(error.value)
    assert str(path) in message and "'layer.weight'" in message
    assert "pip install 'minidl[bf16]'" in message and "pip install ml_dtypes" in message
    mdl.save({"fine": np.ones(2, np.float32)}, path)  # a file without bfloat16 still loads without it
    np.testing.assert_array_equal(mdl.load(path)["fine"], np.ones(2, np.float32))


def test_loading_bfloat16_onto_the_gpu_says_cupy_has_none(standin_or_gpu, tmp_path):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    mdl.save({"w": _bfloat16_bits((2,)).view(ml_dtypes.bfloat16)}, tmp_path / "w.safetensors")
    with pytest.raises(TypeError, match="'w'.*CuPy has no bfloat16.*device='cpu'"):
        mdl.load(tmp_path / "w.safetensors", device="cuda")


def _steps(model, opt, x, n):
    for _ in range(n):
        opt.zero_grad()
        (model(x) ** 2).mean().backward()
        opt.step()


def test_optimizer_scheduler_and_loader_states_round_trip_exactly(tmp_path):
    from minidl import nn, optim
    from minidl.data import DataLoader

    mdl.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = optim.Adam(model.parameters(), lr=1e-2, amsgrad=True)
    scheduler = optim.ScheduleLR(opt, optim.schedules.cosine_restarts(1e-2, 10))
    loader = DataLoader((np.zeros((10, 3)), np.zeros(10)), batch_size=3, shuffle=True, seed=4)
    x = mdl.tensor(np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32))
    _steps(model, opt, x, 3)
    scheduler.step()
    next(iter(loader))
    states = {"optimizer": opt.state_dict(), "scheduler": scheduler.state_dict(), "loader": loader.state_dict()}
    for name, state in states.items():
        mdl.save(state, tmp_path / f"{name}.safetensors")
        back = mdl.load(tmp_path / f"{name}.safetensors")
        assert _same(back, state), name
    # The reloaded optimizer continues exactly as the original does.
    weights = {k: v.copy() for k, v in model.state_dict().items()}
    again = optim.Adam(model.parameters(), lr=1e-2, amsgrad=True)
    again.load_state_dict(mdl.load(tmp_path / "optimizer.safetensors"))
    _steps(model, opt, x, 2)
    expected = {k: v.copy() for k, v in model.state_dict().items()}
    model.load_state_dict(weights)
    _steps(model, again, x, 2)
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v, expected[k])


def _same(a, b) -> bool:
    """Equal values of equal types, all the way down (arrays: equal dtype, shape and contents)."""
    if isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    if type(a) is not type(b):
        return False
    if isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in b)
    if isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def test_load_to_device(tmp_path, device):
    path = tmp_path / "w.safetensors"
    mdl.save({"a": np.arange(4.0)}, path)
    back = mdl.load(path, device=device)
    assert mdl.backend.device_of(back["a"]).startswith(device)
    assert os.path.exists(path)


# ---------------------------------------------------------------- damaged and hostile files
def _file_with_structure(path, structure: str, tensors=None):
    """A safetensors file written by the reference library, with ``structure`` as minidl's header."""
    from safetensors.numpy import save_file

    save_file(tensors or {}, str(path), metadata={"minidl.structure": structure})
    return path


@pytest.mark.parametrize("depth", [120, 500, 5000, 200_000])
def test_deep_nesting_is_refused_with_a_value_error(tmp_path, depth):
    path = _file_with_structure(tmp_path / "deep.safetensors", "[" * depth + "]" * depth)
    with pytest.raises(ValueError, match="nested more than 100 levels"):
        mdl.load(path)


def test_nesting_within_the_limit_loads(tmp_path):
    value = 1
    for _ in range(30):
        value = {"k": [value]}
    mdl.save(value, tmp_path / "ok.safetensors")
    assert mdl.load(tmp_path / "ok.safetensors") == value


def test_save_refuses_what_load_would_refuse(tmp_path):
    looped = []
    looped.append(looped)
    with pytest.raises(ValueError, match="nested more than 100 levels"):
        mdl.save({"a": looped}, tmp_path / "x.safetensors")
    with pytest.raises(ValueError, match="load refuses such files"):
        mdl.save({"curve": [0.5] * (mdl.serialization.MAX_JSON_VALUES + 1)}, tmp_path / "x.safetensors")
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize("reference", ["[]", "{}", "3", "null", '"absent"'])
def test_bad_tensor_references_are_refused(tmp_path, reference):
    structure = '{"w": {"__tensor__": ' + reference + '}}'
    path = _file_with_structure(tmp_path / "ref.safetensors", structure, {"present": np.ones(2)})
    with pytest.raises(ValueError, match="tensor reference .* names no tensor"):
        mdl.load(path)


@pytest.mark.parametrize("structure", ['{"__dict_items__": [[[1], 2]]}', '{"__dict_items__": [[1, 2, 3]]}',
                                       '{"__dict_items__": [[1, 2], [1, 3]]}', '{"__tuple__": 5}'])
def test_bad_markers_are_refused(tmp_path, structure):
    path = _file_with_structure(tmp_path / "m.safetensors", structure)
    with pytest.raises(ValueError, match="damaged minidl header"):
        mdl.load(path)


def _peak_memory_of_refused_load(path, match):
    """Peak bytes Python allocated while mdl.load(path) refused the file with a ValueError matching ``match``."""
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=match):
            mdl.load(path)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_oversized_header_is_refused_before_it_is_read(tmp_path):
    """A header within safetensors' own 100 MB cap but over minidl's is refused from its 8-byte length."""
    size = mdl.serialization.MAX_HEADER_BYTES + 8
    path = tmp_path / "huge.safetensors"
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", size))
        f.write(b'{"__metadata__":{"minidl.structure":"[' + b"0," * ((size - 40) // 2) + b'0]"}}')
        f.write(b" " * (size + 8 - f.tell()))
    assert _peak_memory_of_refused_load(path, "over the limit") < 2**20


def test_too_many_json_values_are_refused_before_decoding(tmp_path):
    n = mdl.serialization.MAX_JSON_VALUES + 10
    path = _file_with_structure(tmp_path / "wide.safetensors", "[" + "0," * n + "0]")
    peak = _peak_memory_of_refused_load(path, "JSON values, over the limit")
    assert peak < 4 * path.stat().st_size  # the header is read, never turned into millions of objects


def _in_thread(fn, timeout=60):
    """(the exception fn raised or None, whether it finished within ``timeout`` seconds)."""
    import threading

    outcome = []

    def run():
        try:
            fn()
            outcome.append(None)
        except BaseException as exc:  # handed back to the test
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    return (outcome[0] if outcome else None), not thread.is_alive()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_named_pipe_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.safetensors"
    os.mkfifo(fifo)
    error, finished = _in_thread(lambda: mdl.load(fifo))
    assert finished, "mdl.load blocked on a named pipe"
    assert isinstance(error, ValueError) and "not a regular file" in str(error)


def test_a_folder_is_refused(tmp_path):
    with pytest.raises(ValueError, match="not a regular file"):
        mdl.load(tmp_path)


@pytest.mark.skipif(os.name != "posix", reason="umask and permission bits are POSIX")
@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_saved_files_follow_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        mdl.save({"a": np.ones(2)}, tmp_path / "w.safetensors")
        mdl.save({"a": np.zeros(2)}, tmp_path / "w.safetensors")  # replacing a file, too
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "w.safetensors").st_mode) == 0o666 & ~umask


def _age(path, seconds=60):
    t = os.stat(path).st_mtime - seconds
    os.utime(path, (t, t))


def test_stale_temporaries_of_the_same_file_are_removed(tmp_path):
    stale = tmp_path / ".tmp-ab_cd123w.safetensors"          # what an earlier, killed save leaves
    other_target = tmp_path / ".tmp-ab_cd123other.safetensors"
    not_ours = [tmp_path / ".tmp-w.safetensors", tmp_path / ".tmp-ABCDEFGHw.safetensors", tmp_path / "x.tmp"]
    for p in [stale, other_target, *not_ours]:
        p.write_bytes(b"partial")
        _age(p)
    fresh = tmp_path / ".tmp-zzzzzzzzw.safetensors"   # started while this save ran: may be another save's

    def write(tmp):
        fresh.write_bytes(b"partial")
        with open(tmp, "wb") as f:
            f.write(b"new")

    atomic_write(tmp_path / "w.safetensors", write)
    names = set(os.listdir(tmp_path))
    assert stale.name not in names
    assert {other_target.name, fresh.name, "w.safetensors"} | {p.name for p in not_ours} == names


@pytest.mark.skipif(os.name != "posix", reason="uses fcntl locks")
def test_a_temporary_held_by_a_running_save_is_kept(tmp_path):
    import fcntl

    busy = tmp_path / ".tmp-busy0000w.safetensors"
    busy.write_bytes(b"being written")
    _age(busy)
    with open(busy, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        mdl.save({"a": np.ones(2)}, tmp_path / "w.safetensors")
        assert busy.exists()
    mdl.save({"a": np.ones(2)}, tmp_path / "w.safetensors")
    assert not busy.exists()


@pytest.mark.skipif(os.name != "posix", reason="kills a process with SIGKILL")
def test_a_save_killed_midway_leaves_the_old_file_and_its_temporary_is_cleaned(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "w.safetensors"
    mdl.save({"a": np.arange(3.0)}, path)
    script = (
        "import os, signal, numpy as np\n"
        "from minidl.serialization import atomic_write\n"
        "def write(tmp):\n"
        "    with open(tmp, 'wb') as f:\n"
        "        f.write(b'half a file'); f.flush()\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        f"atomic_write({str(path)!r}, write)\n")
    proc = subprocess.run([sys.executable, "-c", script], timeout=120)
    assert proc.returncode == -9
    (left,) = [p for p in tmp_path.iterdir() if p.name != "w.safetensors"]
    assert left.name.startswith(".tmp-") and left.name.endswith("w.safetensors")
    np.testing.assert_array_equal(mdl.load(path)["a"], np.arange(3.0))   # the old file, whole
    _age(left)
    mdl.save({"a": np.ones(2)}, path)
    assert os.listdir(tmp_path) == ["w.safetensors"]


# ---------------------------------------------------------------- fuzzing the loader
_MARKERS = ["__tensor__", "__tuple__", "__dict_items__", "model.w", "state.0.m"]
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=6)
    | st.sampled_from(_MARKERS),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=6) | st.sampled_from(_MARKERS), children, max_size=4),
    max_leaves=25)


def _reference_checkpoint() -> bytes:
    """A small training-checkpoint-like file: arrays of several dtypes, int keys, tuples, numbers, text."""
    import tempfile

    state = {"format": "minidl.training-checkpoint", "version": 1,
             "model": {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "n": np.array(3, np.int64)},
             "optimizer": {"state": {0: {"t": 2, "m": np.ones(3, np.float16)}},
                           "param_groups": [{"lr": 0.1, "betas": (0.9, 0.99), "params": [0]}]},
             "trainer": {"history": [{"step": 1, "val_loss": 0.5}], "name": "run"}}
    with tempfile.TemporaryDirectory() as folder:
        mdl.save(state, os.path.join(folder, "c.safetensors"))
        with open(os.path.join(folder, "c.safetensors"), "rb") as f:
            return f.read()


_REFERENCE = _reference_checkpoint()
_N = len(_REFERENCE)
_damaged_files = st.one_of(
    st.integers(0, _N - 1).map(lambda n: _REFERENCE[:n]),                                   # truncated
    st.lists(st.tuples(st.integers(0, _N - 1), st.integers(0, 7)), min_size=1, max_size=8)  # bits flipped
    .map(lambda flips: _flipped(_REFERENCE, flips)),
    st.tuples(st.integers(0, _N - 1), st.binary(min_size=1, max_size=24))                    # bytes overwritten
    .map(lambda t: (_REFERENCE[:t[0]] + t[1] + _REFERENCE[t[0] + len(t[1]):])[:_N]),
    st.tuples(st.integers(0, 2**64 - 1), st.binary(max_size=64))                             # a lying length
    .map(lambda t: struct.pack("<Q", t[0]) + _REFERENCE[8:] + t[1]),
    st.tuples(_json_values, st.binary(max_size=32))                                          # any JSON header
    .map(lambda t: _with_header(json.dumps(t[0]).encode(), t[1])),
    _json_values.map(lambda v: _with_header(json.dumps(                                    # any minidl structure
        {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
         "__metadata__": {"minidl.structure": json.dumps(v)}}).encode(), bytes(8))),
)


def _flipped(data: bytes, flips) -> bytes:
    out = bytearray(data)
    for position, bit in flips:
        out[position] ^= 1 << bit
    return bytes(out)


def _with_header(header: bytes, data: bytes) -> bytes:
    return struct.pack("<Q", len(header)) + header + data


@given(data=_damaged_files)
@settings(max_examples=100, deadline=None)
def test_damaged_files_raise_only_documented_errors_in_bounded_time_and_memory(data):
    """mdl.load returns or raises ValueError; read_checkpoint returns or raises CheckpointError. Nothing else."""
    import tempfile
    import time
    import tracemalloc

    from minidl.train.run_state import CheckpointError, read_checkpoint

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "c.safetensors")
        with open(path, "wb") as f:
            f.write(data)
        started = time.perf_counter()
        tracemalloc.start()
        try:
            try:
                mdl.load(path)
            except ValueError:
                pass
            try:
                read_checkpoint(path)
            except CheckpointError:
                pass
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert time.perf_counter() - started < 30      # a hang or a blow-up, not a speed test
        assert peak < 64 * 2**20


def test_every_load_error_is_a_value_error_and_an_os_error_carrying_the_path(tmp_path):
    loop = tmp_path / "loop.safetensors"
    os.symlink(tmp_path / "other.safetensors", loop)
    os.symlink(loop, tmp_path / "other.safetensors")          # loop -> other -> loop
    (tmp_path / "file").write_text("not a folder")
    (tmp_path / "short.safetensors").write_bytes(b"\x01\x02")
    cases = {str(loop): "Too many levels of symbolic links (errno 40, ELOOP)",
             str(tmp_path / "file" / "w.safetensors"): "Not a directory (errno 20, ENOTDIR)",
             str(tmp_path / "short.safetensors"): "is not a complete safetensors file",
             str(tmp_path / "none.safetensors"): "no file at"}
    for path, words in cases.items():
        with pytest.raises(LoadError) as error:
            mdl.load(path)
        assert isinstance(error.value, ValueError) and isinstance(error.value, OSError)
        assert error.value.path == path and str(error.value).startswith("load: ") and path in str(error.value)
        assert words in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(FileNotFoundError):                     # a missing file is still a FileNotFoundError
        mdl.load(tmp_path / "none.safetensors")


def test_the_small_helpers_of_state_writing_modules():
    import math

    from minidl.serialization import is_number, plain, short_repr
    assert short_repr("x" * 10) == repr("x" * 10)
    assert short_repr(list(range(100)), limit=10) == "[0, 1, 2, ..."
    assert [is_number(v) for v in (1, 2.5, np.int8(3), np.float32(0.5), True, np.bool_(True), "1", None)] == \
        [True, True, True, True, False, False, False, False]
    assert plain(np.float32(0.5)) == 0.5 and type(plain(np.float32(0.5))) is float
    assert type(plain(np.int64(3))) is int and plain(np.bool_(True)) is True
    assert plain((1, 2)) == [1, 2] and plain({3}) == [3]
    assert math.isnan(plain(float("nan"))) and plain(float("nan"), strict=True) is None
    assert plain(np.float64("inf"), strict=True) is None and plain(2.0, strict=True) == 2.0
    assert plain(object) is object and plain(object, other=str) == str(object)
    # as json.dump's default=: NumPy scalars and sets become JSON, anything else its text
    text = json.dumps({"a": np.float32(0.25), "b": {2}, "c": np.bool_(False), "d": complex(1, 2)},
                      default=lambda v: plain(v, other=str))
    assert json.loads(text) == {"a": 0.25, "b": [2], "c": False, "d": "(1+2j)"}
