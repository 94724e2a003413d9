"""minidl.backend: device strings, array modules, transfers, the seeded generators, NumPy/CuPy spellings."""
import ast
import math
import sys
from pathlib import Path

import numpy as np
import pytest

import minidl as mdl
from minidl import backend

no_gpu = pytest.mark.skipif(mdl.gpu_available(), reason="checks the error a CPU-only machine gives")


@pytest.mark.parametrize("text, expected", [
    (None, ("cpu", 0)), ("cpu", ("cpu", 0)), ("cuda", ("cuda", 0)), ("cuda:0", ("cuda", 0)),
    ("cuda:3", ("cuda", 3)), ("gpu", ("cuda", 0)),
])
def test_parse_device_accepts_the_usual_spellings(text, expected):
    assert backend.parse_device(text) == expected


@pytest.mark.parametrize("text", ["tpu", "cpu:1", "cuda:x", "CUDA", "", "cuda:-1"])
def test_unknown_device_string_is_a_value_error_that_lists_the_valid_ones(text):
    with pytest.raises(ValueError) as info:
        backend.parse_device(text)
    message = str(info.value)
    assert repr(text) in message
    assert "'cpu'" in message and "'cuda'" in message


@pytest.mark.parametrize("make", [
    lambda: mdl.tensor([1.0], device="tpu"),
    lambda: mdl.zeros(2, device="tpu"),
    lambda: mdl.randn(2, device="npu:0"),
    lambda: mdl.tensor([1.0]).to("tpu"),
])
def test_factories_and_to_reject_an_unknown_device(make):
    with pytest.raises(ValueError, match="unknown device"):
        make()


def test_cpu_array_module_is_numpy():
    a = np.zeros(3)
    assert backend.xp_for("cpu") is np
    assert backend.xp_of(a) is np
    assert backend.device_of(a) == "cpu"
    assert mdl.tensor(a).xp is np


def test_to_device_cpu_keeps_a_numpy_array_without_copying():
    a = np.arange(6.0).reshape(2, 3)
    assert backend.to_device(a, "cpu") is a
    out = backend.to_numpy(a)
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, a)


def test_gpu_available_answers_a_bool_and_never_raises():
    assert mdl.gpu_available() in (True, False)


@no_gpu
@pytest.mark.parametrize("make", [
    lambda: backend.xp_for("cuda"),
    lambda: mdl.tensor([1.0], device="cuda"),
    lambda: mdl.zeros(2, 3, device="cuda"),
    lambda: mdl.randn(2, device="cuda:0"),
    lambda: mdl.tensor([1.0]).to("cuda"),
    lambda: mdl.tensor([1.0]).cuda(),
])
def test_asking_for_cuda_without_a_gpu_says_how_to_fix_it(make):
    with pytest.raises(RuntimeError) as info:
        make()
    message = str(info.value)
    assert "cuda" in message
    assert "device='cpu'" in message  # the fix that always works
    assert "CuPy" in message or "GPU" in message  # and what is missing


def test_manual_seed_makes_the_cpu_generator_reproducible():
    mdl.manual_seed(123)
    first = backend.rng("cpu").standard_normal(5)
    mdl.manual_seed(123)
    again = backend.rng("cpu").standard_normal(5)
    np.testing.assert_array_equal(first, again)
    mdl.manual_seed(124)
    other = backend.rng("cpu").standard_normal(5)
    assert not np.array_equal(first, other)


def test_rng_state_round_trip_resumes_the_same_stream():
    mdl.manual_seed(7)
    backend.rng().random(3)
    state = backend.get_rng_state()
    expected = backend.rng().random(4)
    backend.rng().random(10)  # move on, then rewind
    backend.set_rng_state(state)
    np.testing.assert_array_equal(backend.rng().random(4), expected)


def test_device_generator_is_reproducible(device):
    mdl.manual_seed(5)
    a = mdl.randn(3, 4, device=device).numpy()
    mdl.manual_seed(5)
    b = mdl.randn(3, 4, device=device).numpy()
    np.testing.assert_array_equal(a, b)


def test_arrays_move_between_devices(device):
    a = np.arange(4.0)
    on = backend.to_device(a, device)
    assert backend.device_of(on).startswith(backend.parse_device(device)[0])
    assert backend.xp_of(on) is backend.xp_for(device)
    np.testing.assert_array_equal(backend.to_numpy(on), a)


# ---------------------------------------------------------------- one name, two spellings
def test_scatter_add_adds_every_repeat_of_an_index():
    target = np.zeros(4)
    backend.scatter_add(target, np.array([1, 3, 1, 1]), np.array([1.0, 2.0, 10.0, 100.0]))
    np.testing.assert_array_equal(target, [0.0, 111.0, 0.0, 2.0])
    rows = np.zeros((3, 2), np.float32)
    backend.scatter_add(rows, (np.array([2, 0, 2]),), np.array([[1, 2], [3, 4], [5, 6]], np.float32))
    np.testing.assert_array_equal(rows, [[3, 4], [0, 0], [6, 8]])
    assert rows.dtype == np.float32


ERF_POINTS = [-3.0, -1.0, -0.5, -1e-3, 0.0, 0.25, 0.5, 1.0, 2.0, 6.0]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_erf_matches_pythons_math_erf(dtype):
    x = np.array(ERF_POINTS, dtype=dtype).reshape(2, 5)
    y = backend.erf(x)
    assert y.dtype == dtype and y.shape == (2, 5)
    expected = np.array([math.erf(float(v)) for v in x.ravel()]).reshape(2, 5)
    np.testing.assert_allclose(y, expected, rtol=1e-15 if dtype == np.float64 else 1e-6, atol=0)


class _NoScipySpecial:
    """A finder that refuses ``scipy.special`` and counts how often its import was tried."""

    def __init__(self):
        self.tries = 0

    def find_spec(self, name, path=None, target=None):
        if name == "scipy.special":
            self.tries += 1
            raise ImportError("scipy.special is hidden for this test")
        return None


def test_erf_without_scipy_is_numpys_own_kernel_and_tries_the_import_once(monkeypatch):
    """Without SciPy, erf is minidl.array_kernels.erf (whole-array NumPy, no per-element Python):
    within 2 ulps of math.erf in float64 and 6 float32 ulps in float32; the failed import of
    scipy.special is tried once, not at every call."""
    hider = _NoScipySpecial()
    monkeypatch.setattr(backend, "_optional", {})  # forget a SciPy found earlier in this process
    for name in [n for n in sys.modules if n == "scipy.special" or n.startswith("scipy.special.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [hider] + sys.meta_path)
    x = np.array(ERF_POINTS + [-6.5, 0.75, -0.7499, 3.9, 1e-300], dtype=np.float64)
    expected = np.array([math.erf(float(v)) for v in x])
    y = backend.erf(x)
    assert y.dtype == np.float64
    assert np.all(np.abs(y - expected) <= 2 * np.spacing(np.abs(expected)))
    x32 = x.astype(np.float32)
    expected32 = np.array([math.erf(float(v)) for v in x32])
    y32 = backend.erf(x32)
    assert y32.dtype == np.float32
    assert np.all(np.abs(y32 - expected32) <= 6 * np.spacing(np.abs(expected32).astype(np.float32)))
    assert abs(backend.erf(np.array(0.5)) - math.erf(0.5)) <= 2 * np.spacing(math.erf(0.5))  # a 0-d array too
    assert hider.tries == 1


@no_gpu
def test_nccl_without_a_gpu_says_how_to_get_one():
    with pytest.raises(RuntimeError, match=r"minidl\[gpu\]"):
        backend.nccl()
    from minidl import parallel
    assert parallel.nccl_available() is False


def _cupy_imports(tree):
    """(line, module) for each import of cupy or cupyx, including importlib.import_module('cupy...')."""
    def is_cupy(name):
        return name is not None and name.split(".")[0] in ("cupy", "cupyx")
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names if is_cupy(alias.name))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and is_cupy(node.module):
            yield node.lineno, node.module
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if called in ("import_module", "__import__") and is_cupy(str(node.args[0].value)):
                yield node.lineno, node.args[0].value


def test_the_import_finder_sees_every_spelling():
    source = ("import cupy\nimport cupyx.scipy.special as s\nfrom cupy.cuda import nccl\n"
              "importlib.import_module('cupyx')\nimport numpy\nfrom .cupy_like import x\n")
    assert [module for _, module in _cupy_imports(ast.parse(source))] == [
        "cupy", "cupyx.scipy.special", "cupy.cuda", "cupyx"]


def test_only_backend_imports_cupy():
    package = Path(mdl.__file__).resolve().parent
    offenders = []
    for path in sorted(package.rglob("*.py")):
        if path == package / "backend.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        offenders += [f"{path.relative_to(package.parent)}:{line} imports {module}"
                      for line, module in _cupy_imports(tree)]
    assert not offenders, ("only minidl/backend.py may import cupy or cupyx (ask backend for xp, "
                           "scatter_add, erf or nccl instead):\n" + "\n".join(offenders))


def test_blas_threads_limits_inside_the_block_and_restores_after():
    from minidl import backend
    before = backend.get_num_threads()
    try:
        backend.set_num_threads(2)  # so that the limit is seen on a one-core machine too
        with backend.blas_threads(1):
            assert backend.get_num_threads() == 1
        assert backend.get_num_threads() == 2
    finally:
        backend.set_num_threads(before)


def test_sampling_runs_with_one_blas_thread():
    """GPT.generate's one-token steps run on one BLAS thread, and the threads come back after."""
    from minidl import backend
    from minidl.models import GPT, GPTConfig
    seen = []
    model = GPT(GPTConfig(vocab_size=7, block_size=8, n_layer=1, n_head=2, n_embd=8, dropout=0.0))
    before = backend.get_num_threads()
    try:
        backend.set_num_threads(2)
        model.generate(np.zeros((1, 1), np.int64), 3, generator=np.random.default_rng(0),
                       on_token=lambda n: seen.append(backend.get_num_threads()))
        assert seen == [1, 1, 1] and backend.get_num_threads() == 2
    finally:
        backend.set_num_threads(before)


def test_one_parser_reads_every_spelling_of_the_16_bit_floats():
    for spelling in (np.float16, np.dtype("float16"), "float16", "half", "fp16", mdl.float16):
        assert backend.sixteen_bit_name(spelling) == "float16", spelling
    for spelling in ("bfloat16", "bf16"):
        assert backend.sixteen_bit_name(spelling) == "bfloat16", spelling
    for other in (None, np.float32, "float64", "int8", "fp8", "bfloat"):
        assert backend.sixteen_bit_name(other) is None, other
    ml_dtypes = pytest.importorskip("ml_dtypes")
    assert backend.sixteen_bit_name(ml_dtypes.bfloat16) == "bfloat16"
    assert backend.bfloat16() == np.dtype(ml_dtypes.bfloat16)


def test_the_bfloat16_lookup_says_what_to_install_in_the_callers_terms(monkeypatch):
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # as on a machine without ml_dtypes
    with pytest.raises(ValueError, match=r"^storage_dtype='bfloat16' needs the ml_dtypes package.*"
                                         r"pip install 'minidl\[bf16\]'\), or use float32$"):
        backend.bfloat16("storage_dtype='bfloat16'", ValueError, ", or use float32")
    with pytest.raises(TypeError, match="bfloat16 needs the ml_dtypes package"):
        backend.bfloat16()


_PRODUCT_FAULTS = """
import resource, sys
import numpy as np
if sys.argv[1] == "minidl":
    import minidl  # noqa: F401
shapes = [(512, 256, 64), (512, 64, 256), (256, 512, 64), (768, 128, 512), (768, 512, 128), (64, 512, 256)]
work = [(np.ones((m, k), np.float32), np.ones((k, n), np.float32), np.ones((m, n), np.float32)) for m, k, n in shapes]
faults = 0
for a, b, out in work:  # every array already written: a fault now is a page of the BLAS's own
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    np.matmul(a, b, out=out)
    faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(faults)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts page faults as Linux reports them")
def test_the_blas_workspace_is_mapped_before_the_first_product_of_the_real_programs(tmp_path):
    """backend.map_blas_workspace, run at import: after ``import minidl`` the products of the makemore and
    nanoGPT programs (benchmarks/programs' shapes, each no larger along any axis than the product run at
    import, so on any BLAS its packed blocks fit in what that one packed) write to no page of the BLAS's
    workspace that was not backed already; with NumPy alone the same products map new ones (so the test
    can fail)."""
    import os
    import subprocess
    script = tmp_path / "faults.py"
    script.write_text(_PRODUCT_FAULTS)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(Path(mdl.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]))

    def faults(mode):
        done = subprocess.run([sys.executable, str(script), mode], env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        return int(done.stdout.split()[-1])

    without = faults("numpy")
    if without == 0:
        pytest.skip("this BLAS maps its whole workspace itself: the products fault no page even without minidl")
    assert faults("minidl") == 0, f"after import minidl the products still mapped pages ({without} without it)"
