"""The fused optimizer kernels, compiled for real: CuPy's own source, NVRTC, sm_80 and sm_90, no GPU needed.

On a GPU, ``run_update`` hands each traced update to ``cupy.ElementwiseKernel``
(``kernels.fused_kernel`` gives its definition); on the first call CuPy writes
the kernel's CUDA source and compiles it with NVRTC. Here the same happens
without a device:

- every fused update of every optimizer, in every pattern of zero and non-zero
  hyperparameters it produces (``_fused_patterns``), for float16, float32 and
  float64;
- CuPy writes the source with its own generator
  (``cupy._core._kernel._get_elementwise_kernel_code``), given the argument
  descriptions a call on contiguous arrays produces (CuPy reduces them to one
  dimension), with 32-bit indexing (arrays up to 2 GiB) and with 64-bit indexing;
- NVRTC compiles it with the options CuPy's ``compile_with_cache`` uses, for an
  explicit architecture (``-arch=sm_80``: A100, ``-arch=sm_90``: H100), through
  CuPy's ``_NVRTCProgram`` (``compile_using_nvrtc`` would ask the device for its
  architecture).

The numbers a kernel computes are checked in test_kernels.py (the same body
compiled as C++ on the host against the NumPy update). The wheels come with
``pip install -e '.[gpu-check]'`` (part of ``[test]``). If CuPy's internals have
moved, these tests skip and say so; they never pass without compiling.
"""
import functools
import re
import time
from pathlib import Path

import numpy as np
import pytest

from minidl.optim import kernels
from tests.optim._fused_patterns import fused_patterns

DTYPES = ["float16", "float32", "float64"]
ARCHS = ["80", "90"]
INSTALL = "pip install -e '.[gpu-check]' (CuPy, NVRTC and CUDA 12 headers: no GPU needed)"


@functools.lru_cache(maxsize=None)
def _definitions():
    """{kernel definition: (names of the optimizers that use it, (spec, args) of one pattern)}."""
    result = {}
    for owners, fn, args in fused_patterns().values():
        spec = kernels.fused_kernel(fn, args)
        users, _ = result.setdefault(spec.definition, (set(), (spec, args)))
        users.update(owners)
    return result


# ---------------------------------------------------------------- what is compiled (no CuPy needed)
def test_every_run_update_call_site_is_driven():
    """The pattern driver reaches every update that minidl.optim fuses, so none escapes the compile check."""
    folder = Path(kernels.__file__).parent
    called = set()
    for path in folder.glob("*.py"):
        if path.name == "kernels.py":  # run_update's own definition
            continue
        called |= set(re.findall(r"run_update\(\s*(\w+)", path.read_text()))
    driven = {fn.__name__ for _, fn, _ in fused_patterns().values()}
    assert called and called == driven, f"not driven: {sorted(called - driven)}"


def test_every_pattern_traces_into_one_kernel():
    """No optimizer falls back to unfused CuPy calls on the GPU without anyone noticing."""
    failures = []
    for owners, fn, args in fused_patterns().values():
        try:
            kernels.fused_kernel(fn, args)
        except kernels.Untraceable as exc:
            failures.append(f"{fn.__name__} ({', '.join(sorted(owners))}): {exc}")
    assert not failures, "\n".join(failures)


def test_zero_hyperparameters_select_their_own_kernels():
    """The patterns really differ: a zero weight decay drops its term, amsgrad adds v_max, Nesterov its look-ahead."""
    operations = {}
    for _, fn, args in fused_patterns().values():
        spec = kernels.fused_kernel(fn, args)
        operations.setdefault(fn.__name__, set()).add(spec.operation)
    assert len(operations["sgd_update"]) >= 5  # {plain, momentum, Nesterov} × {decay, no decay}, minus impossible
    assert len(operations["adam_update"]) >= 5  # {L2, decoupled, none} × amsgrad
    assert any("weight_decay" not in body for body in operations["adam_update"])
    assert any("v_max" in body for body in operations["adam_update"])


# ---------------------------------------------------------------- CuPy's generator and NVRTC
class _CupyCompiler:
    """CuPy's ElementwiseKernel source generation and NVRTC compile, with the architecture given explicitly."""

    def __init__(self):
        cupy = pytest.importorskip("cupy", reason=f"needs CuPy: {INSTALL}")
        try:
            from cupy._core import _carray, _kernel, _scalar, core
            from cupy.cuda import compiler
            from cupy_backends.cuda.libs import nvrtc
        except ImportError as exc:  # pragma: no cover - depends on the CuPy release
            pytest.skip(f"CuPy {cupy.__version__} moved the modules this check reads ({exc}); "
                        "update tests/optim/test_nvrtc_compile.py")
        try:
            self.nvrtc_version = nvrtc.getVersion()
        except Exception as exc:  # noqa: BLE001 - the library is missing: say which and how to get it
            pytest.skip(f"NVRTC cannot be loaded ({type(exc).__name__}: {str(exc).splitlines()[0]}): {INSTALL}")
        self.cupy, self.kernel_module, self.compiler = cupy, _kernel, compiler
        self.scalar_type, self.indexer_type = _scalar.CScalar, _carray.Indexer
        try:
            # compile_with_cache: CuPy's headers first, its include paths and C++17 (core.pyx)
            self.header = "".join(f"#include <{name}>\n" for name in core._cupy_header_list)
            options = core.assemble_cupy_compiler_options(())
        except RuntimeError as exc:  # CuPy found no CUDA headers
            pytest.skip(f"{exc}: {INSTALL}")
        except AttributeError as exc:  # pragma: no cover
            pytest.skip(f"CuPy {cupy.__version__} moved its compiler options ({exc}); update this test")
        # _compile_with_cache_cuda adds -ftz=true; _compile_using_nvrtc_no_warning the architecture and
        # --device-as-default-execution-space (and --pch only when CUPY_NVRTC_USE_PCH asks for it).
        self.options = options + ("-ftz=true",)
        self.extra = ("--device-as-default-execution-space",)
        if self.nvrtc_version >= (12, 8) and getattr(compiler, "_use_pch", False):
            self.extra += ("--pch",)
        self._check_generator()

    def source(self, definition, dtype, index_32_bits=True):
        """The CUDA source CuPy writes for ``ElementwiseKernel(*definition)`` called on contiguous ``dtype`` arrays."""
        kernel = self.cupy.ElementwiseKernel(*definition)
        dtype = np.dtype(dtype)
        # ElementwiseKernel.__call__: the dtypes of ndarray inputs (None for scalars) and outputs decide T
        in_types, out_types, type_map = self.kernel_module._decide_params_type(
            kernel.in_params, kernel.out_params,
            tuple(dtype if p.ctype == "T" else None for p in kernel.in_params),
            tuple(dtype for _ in kernel.out_params))
        infos = []
        for p, t in zip(kernel.in_params + kernel.out_params, in_types + out_types):
            if p.ctype == "T":  # _ArgInfo.from_ndarray of the one-dimensional view _reduce_dims makes
                infos.append(self.kernel_module._ArgInfo(_NDARRAY, self.cupy.ndarray, t, 1, True, index_32_bits))
            else:  # _ArgInfo.from_scalar: a Python float becomes a CScalar of the parameter's type
                infos.append(self.kernel_module._ArgInfo(_SCALAR, self.scalar_type, t, 0, True, True))
        infos.append(self.kernel_module._ArgInfo(_INDEXER, self.indexer_type, None, 1, True, index_32_bits))
        return self.header + self.kernel_module._get_elementwise_kernel_code(
            tuple(infos), type_map, kernel.params, kernel.operation, kernel.name, kernel.preamble, **kernel.kwargs)

    def compile(self, source, arch):
        """NVRTC's cubin for ``sm_<arch>``; raises CuPy's CompileException with NVRTC's log."""
        program = self.compiler._NVRTCProgram(source, "minidl_kernel.cu", method="cubin")
        cubin, _ = program.compile(self.options + (f"-arch=sm_{arch}",) + self.extra)
        return cubin

    def _check_generator(self):
        """A one-line kernel must come out as CuPy has always written it; otherwise its internals moved."""
        try:
            text = self.source(("T x", "T y", "y = x", "minidl_probe"), "float32")
        except Exception as exc:  # noqa: BLE001 - any change of signature or enum
            pytest.skip(f"CuPy {self.cupy.__version__} changed its ElementwiseKernel source generator "
                        f"({type(exc).__name__}: {exc}); update tests/optim/test_nvrtc_compile.py")
        expected = ['extern "C" __global__ void minidl_probe(const CArray<float, 1, 1, 1> _raw_x, '
                    'CArray<float, 1, 1, 1> _raw_y, CIndexer<1, 1> _ind)',
                    "typedef float T;", "const T &x = _raw_x[_ind.get()];", "T &y = _raw_y[_ind.get()];",
                    "y = x;"]
        missing = [line for line in expected if line not in text]
        if missing:
            pytest.skip(f"CuPy {self.cupy.__version__} writes ElementwiseKernel source differently "
                        f"(missing {missing}); update tests/optim/test_nvrtc_compile.py")


# CuPy's _ArgKind (cupy/_core/_kernel.pxd): a C enum, invisible from Python. A wrong value makes
# _ArgInfo.get_c_type fail, which _check_generator turns into a skip that says so.
_NDARRAY, _INDEXER, _SCALAR = 1, 2, 3


@pytest.fixture(scope="module")
def nvrtc():
    return _CupyCompiler()


# 32-bit indexing (arrays up to 2 GiB) everywhere; 64-bit indexing (larger arrays) changes only CuPy's
# CArray/CIndexer templates around the same body, so one dtype and one architecture cover it.
LAYOUTS = [(dtype, arch, True) for dtype in DTYPES for arch in ARCHS] + [("float32", "90", False)]


@pytest.mark.parametrize("dtype, arch, index_32_bits", LAYOUTS,
                         ids=[f"{d}-sm_{a}-{'int32' if i else 'int64'}_index" for d, a, i in LAYOUTS])
def test_every_fused_kernel_compiles_with_nvrtc(nvrtc, dtype, arch, index_32_bits):
    """Each distinct kernel definition, in CuPy's source for ``dtype``, compiles for sm_80 / sm_90."""
    failures, compiled = [], 0
    start = time.perf_counter()
    for definition, (owners, _) in sorted(_definitions().items(), key=lambda item: item[0][3]):
        source = nvrtc.source(definition, dtype, index_32_bits)
        assert f"void {definition[3]}(" in source and definition[2] in source
        try:
            cubin = nvrtc.compile(source, arch)
        except nvrtc.compiler.CompileException as exc:
            log = "\n    ".join(exc.get_message().strip().splitlines()[:6])
            failures.append(f"{definition[3]} ({', '.join(sorted(owners))}), {dtype}, sm_{arch}, "
                            f"{'32' if index_32_bits else '64'}-bit indexing:\n    {log}\n{definition[2]}")
            continue
        assert cubin[:4] == b"\x7fELF" and definition[3].encode() in cubin  # a cubin holding our kernel
        compiled += 1
    assert not failures, f"{len(failures)} kernels did not compile:\n" + "\n".join(failures)
    assert compiled == len(_definitions())
    print(f"{compiled} kernels compiled for {dtype}, sm_{arch} in {time.perf_counter() - start:.1f} s")


def test_a_kernel_with_an_error_is_reported_not_skipped(nvrtc):
    """The check can fail: NVRTC's error for a broken body surfaces as CuPy's CompileException."""
    source = nvrtc.source(("T x", "T y", "y = undefined_name(x)", "minidl_broken"), "float32")
    with pytest.raises(nvrtc.compiler.CompileException, match="undefined_name"):
        nvrtc.compile(source, "80")


@pytest.mark.gpu
def test_on_a_gpu_cupy_compiles_exactly_the_source_checked_here(nvrtc):
    """With a GPU: call each kernel as run_update does; CuPy's cached source equals the one compiled above."""
    import minidl
    if not minidl.gpu_available():
        pytest.skip("needs a CUDA GPU: compares the source above with what CuPy compiles on a device")
    cp = nvrtc.cupy
    for definition, (_, (spec, args)) in _definitions().items():
        for dtype in DTYPES:
            kernel = cp.ElementwiseKernel(*definition)
            arrays = {k: cp.full(64, 0.5, dtype) for k, v in args.items() if hasattr(v, "shape")}
            inputs = [arrays[k] if k in arrays else float(args[k]) for k in spec.in_names]
            kernel(*inputs, *[arrays[k] for k in spec.out_names])
            cp.cuda.Device().synchronize()
            expected = nvrtc.source(definition, dtype)[len(nvrtc.header):]
            assert kernel.cached_code == expected, (definition[3], dtype)
