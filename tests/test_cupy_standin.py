"""The CuPy stand-in keeps CuPy's rules (so what passes on it passes on a GPU), offers only names real
CuPy has, and every CuPy name minidl uses exists in the installed real CuPy."""
import ast
import gc
from pathlib import Path

import numpy as np
import pytest

import minidl
from tests import cupy_standin as cp

PACKAGE = Path(minidl.__file__).resolve().parent


# ---------------------------------------------------------------- CuPy's rules
def test_numpy_never_sees_device_memory_implicitly():
    x = cp.arange(6.0).reshape(2, 3)
    for convert in (np.asarray, np.array, lambda a: np.asarray([a, a]), lambda a: np.ascontiguousarray(a)):
        with pytest.raises(TypeError, match="Implicit conversion to a NumPy array is not allowed"):
            convert(x)


def test_a_numpy_array_is_not_an_operand():
    x, host = cp.ones(3), np.ones(3)
    for combine in (lambda: x + host, lambda: host * x, lambda: cp.maximum(x, host), lambda: cp.exp(host),
                    lambda: x.__setitem__(slice(None), host), lambda: x @ host):
        with pytest.raises(TypeError, match="Unsupported type"):
            combine()
    assert type(x + 1.5) is cp.ndarray and type(x * np.float32(2)) is cp.ndarray  # scalars are fine


def test_only_cupy_s_parameters_and_dtypes_are_accepted():
    x = cp.arange(4.0)
    for call in (lambda: cp.sum(x, where=x > 0), lambda: x.max(initial=0), lambda: cp.zeros(3, like=x),
                 lambda: cp.clip(x, min=0, max=1), lambda: cp.exp(x, order="C")):
        with pytest.raises(TypeError, match="cupy"):
            call()
    for dtype in (object, "U3", "datetime64[s]"):
        with pytest.raises(ValueError, match="Unsupported dtype"):
            cp.asarray(np.zeros(2, dtype))
    assert cp.clip(x, 0, 1).get().tolist() == [0, 1, 1, 1] and cp.maximum(x, 1, out=x) is x


def test_keywords_real_cupy_refuses_inside_kwargs_are_refused():
    # NumPy's einsum takes order=, casting= and out=; CuPy's reads dtype= and optimize= from **kwargs
    # and raises TypeError for anything else
    x = cp.arange(3.0)
    for call in (lambda: cp.einsum("i,i->", x, x, order="K"), lambda: cp.einsum("i->i", x, casting="safe"),
                 lambda: cp.meshgrid(x, x, order="C")):
        with pytest.raises(TypeError, match="Did not understand the following kwargs"):
            call()
    assert float(cp.einsum("i,i->", x, x, optimize=False, dtype=np.float64)) == 5.0
    assert cp.meshgrid(x, x, indexing="ij", sparse=False, copy=True)[0].shape == (3, 3)


def test_ufunc_methods_as_far_as_cupy_has_them():
    x = cp.zeros(3)
    cp.add.at(x, cp.asarray(np.array([0, 0, 2])), 1.0)
    cp.maximum.at(x, cp.asarray(np.array([1])), 5.0)
    assert x.get().tolist() == [2.0, 5.0, 1.0]
    assert float(cp.add.reduce(x)) == 8.0 and cp.multiply.outer(x, cp.ones(2)).shape == (3, 2)
    with pytest.raises(NotImplementedError):
        cp.subtract.at(x, cp.asarray(np.array([0])), 1.0)
    with pytest.raises(NotImplementedError):
        cp.maximum.reduce(x)


def test_numpy_functions_dispatch_to_cupy_as_cupy_arrays_do():
    x = cp.arange(4.0)
    assert type(np.exp(x)) is cp.ndarray and type(np.sum(x)) is cp.ndarray


def test_reductions_and_indexing_give_device_arrays_not_numbers():
    x = cp.arange(6.0).reshape(2, 3)
    for value in (x.sum(), x.max(), cp.mean(x), x[0, 1], cp.allclose(x, x)):
        assert type(value) is cp.ndarray and value.ndim == 0


def test_every_read_to_the_host_is_counted():
    x = cp.arange(4.0)
    cp.syncs.reset()
    float(x.sum()), int(x[1]), bool(x[2] > 0), x[0].item(), x.get(), x.tolist(), cp.asnumpy(x)
    x[x > 1]  # a boolean mask: the output size is read back
    cp.nonzero(x)
    assert cp.syncs.count == 9
    assert "test_cupy_standin.py" in cp.syncs.where[0]
    cp.syncs.reset()
    y = (x * 2 + 1).astype(np.float32)[::2]
    cp.asarray(np.ones(3)), y.reshape(-1, 1).T, cp.where(x > 1, x, 0)
    assert cp.syncs.count == 0


def test_host_copies_never_alias_and_device_arrays_pass_through():
    host = np.ones(3)
    x = cp.asarray(host)
    host[0] = 5
    assert x.get()[0] == 1
    assert cp.asarray(x) is x and cp.array(x) is not x


def test_integer_array_indices_wrap_around_as_in_cupy():
    x = cp.arange(5.0) * 10
    assert x[cp.asarray(np.array([5, -1, 7]))].get().tolist() == [0.0, 40.0, 20.0]
    table = cp.zeros((3, 2))
    cp.cupyx.scatter_add(table, cp.asarray(np.array([0, 3, 0])), 1.0)
    assert table.get()[:, 0].tolist() == [3.0, 0.0, 0.0]


def test_views_share_one_owner_and_the_pool_counts_live_buffers():
    # A garbage collection in the middle would free unrelated stand-in arrays (cycles left by earlier
    # tests) and change the count: collect them first, and let none run until the end.
    gc.collect()
    gc.disable()
    try:
        _views_and_pool()
    finally:
        gc.enable()


def _views_and_pool():
    before = cp.get_default_memory_pool().used_bytes()
    x = cp.zeros(1000, np.float32)
    assert cp.get_default_memory_pool().used_bytes() == before + 4000
    view = x[10:20]
    assert view.base is x and x[::2].base is x and x.base is None
    del x
    assert cp.get_default_memory_pool().used_bytes() == before + 4000  # the view keeps it
    assert view.base is view.base
    del view
    assert cp.get_default_memory_pool().used_bytes() == before


def test_elementwise_kernel_runs_the_body_in_place():
    kernel = cp.ElementwiseKernel("T g, float64 lr, float64 beta", "T w, T m",
                                  "T x0_ = (((T)beta) * m);\nm = (x0_ + (((T)(1.0 - beta)) * g));\n"
                                  "w = (w - (((T)lr) * m));", "momentum")
    w, m, g = cp.ones(4, np.float32), cp.zeros(4, np.float32), cp.full(4, 2.0, np.float32)
    kernel(g, 0.1, 0.9, w, m)
    np.testing.assert_allclose(m.get(), 0.2, rtol=1e-6)
    np.testing.assert_allclose(w.get(), 1 - 0.1 * 0.2, rtol=1e-6)
    assert w.dtype == np.float32 and m.dtype == np.float32
    with pytest.raises(TypeError):
        kernel(np.ones(4, np.float32), 0.1, 0.9, w, m)


def test_the_generator_state_lives_in_a_device_array_and_round_trips():
    bits = cp.random.XORWOW(7)
    generator = cp.random.Generator(bits)
    generator.standard_normal(3, np.float32)
    state = bits._state.copy()
    first = generator.random(5, np.float32).get()
    generator.integers(0, 10, 4)
    bits._state[...] = state
    np.testing.assert_array_equal(generator.random(5, np.float32).get(), first)
    with pytest.raises(TypeError):
        generator.random(3, np.int32)


def test_devices_streams_and_events():
    with cp.cuda.Device(0) as device:
        assert device.id == 0 and cp.cuda.get_device_id() == 0
    with pytest.raises(cp.cuda.runtime.CUDARuntimeError):
        cp.cuda.Device(cp.cuda.DEVICE_COUNT)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    end.record()
    assert cp.cuda.get_elapsed_time(start, end) >= 0
    assert cp.arange(3).device == cp.cuda.Device(0)


def test_minidl_never_imports_the_stand_in():
    offenders = [str(p) for p in PACKAGE.rglob("*.py") if "cupy_standin" in p.read_text(encoding="utf-8")
                 and p.name != "backend.py"]
    assert not offenders
    assert "cupy_standin" not in (PACKAGE / "backend.py").read_text(encoding="utf-8").replace(
        "The test suite passes its CuPy stand-in", "")


# ---------------------------------------------------------------- against the real CuPy
@pytest.fixture(scope="module")
def real_cupy():
    cupy = pytest.importorskip("cupy", reason="real CuPy is not installed (pip install cupy-cuda12x: "
                                              "no GPU needed to look its names up)")
    if getattr(cupy, "STANDIN", False):
        pytest.skip("cupy is the stand-in here")
    import cupyx
    import cupyx.scipy.special  # noqa: F401
    try:
        import cupy.cuda.nccl  # noqa: F401 - a submodule: an attribute of cupy.cuda once imported
    except ImportError:
        pass
    return cupy, cupyx


def _public(namespace, skip=()):
    return {n for n in dir(namespace) if not n.startswith("_") and n not in skip}


def test_the_stand_in_offers_only_names_real_cupy_has(real_cupy):
    cupy, cupyx = real_cupy
    own = {"STANDIN", "SyncCounter", "syncs", "reset", "names", "kernels", "builtins", "operator", "sys",
           "weakref", "annotations", "cupyx",
           "nccl"}  # the stand-in's one-rank NCCL (tests/cupy_standin/nccl.py), a submodule once imported
    checks = [
        (cp, cupy, own), (cp.ndarray, cupy.ndarray, set()), (cp.linalg, cupy.linalg, {"annotations"}),
        (cp.lib.stride_tricks, cupy.lib.stride_tricks, set()),
        (cp.cuda, cupy.cuda, {"DEVICE_COUNT", "annotations"}),
        (cp.cuda.runtime, cupy.cuda.runtime, set()), (cp.cuda.Device, cupy.cuda.Device, set()),
        (cp.cuda.Stream, cupy.cuda.Stream, set()), (cp.cuda.Event, cupy.cuda.Event, set()),
        (cp.cuda.MemoryPool, cupy.cuda.MemoryPool, set()), (cp.cuda.MemoryHook, cupy.cuda.MemoryHook, set()),
        (cp.random, cupy.random, {"annotations"}), (cp.random.Generator, cupy.random.Generator, set()),
        (cp.random.XORWOW, cupy.random.XORWOW, set()),
        (cp.cupyx, cupyx, set()), (cp.cupyx.scipy.special, cupyx.scipy.special, set()),
    ]
    missing = []
    for ours, theirs, skip in checks:
        missing += [f"{getattr(theirs, '__name__', theirs)}.{n}" for n in sorted(_public(ours, skip))
                    if not hasattr(theirs, n)]
    assert not missing, f"the stand-in offers names real CuPy lacks: {missing}"


def _dotted(node):
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and (node.id in _ROOTS or "xp" not in parts[1:]):
        return node.id, parts[::-1]
    if isinstance(node, ast.Call):
        called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if called in ("cupy_module", "xp_of", "xp_for"):  # backend.cupy_module().x, xp_of(a).x
            return "cupy_module()", parts[::-1]
    parts = parts[::-1]
    if "xp" in parts[:-1]:  # tensor.xp.zeros, self.xp.where: the array module of a tensor
        return "xp", parts[parts.index("xp") + 1:]
    return None, parts


# names that hold the array module (numpy or cupy) or cupy itself, in minidl's source
_ROOTS = {"xp": "cupy", "cp": "cupy", "cupy": "cupy", "_cp": "cupy", "cupy_module()": "cupy", "cupyx": "cupyx"}


def _cupy_attributes():
    """(file:line, 'cupy.a.b') for every xp./cp./cupy./cupyx. chain in minidl, longest chains only."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        inner = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
                inner.add(id(node.value))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or id(node) in inner:
                continue
            root, parts = _dotted(node)
            if root == "self" and parts[:1] == ["_cp"]:
                root, parts = "_cp", parts[1:]
            elif root == "self" and parts[:1] == ["cp"]:
                root, parts = "cp", parts[1:]
            if root in _ROOTS and parts:
                found.append((f"{path.relative_to(PACKAGE.parent)}:{node.lineno}", ".".join([_ROOTS[root], *parts])))
    return found


def test_the_attribute_finder_sees_minidl_s_cupy_names():
    names = {name for _, name in _cupy_attributes()}
    assert {"cupy.cuda.Device", "cupy.ElementwiseKernel", "cupy.swapaxes", "cupy.lib.stride_tricks.as_strided",
            "cupy.linalg.qr", "cupy.cuda.get_elapsed_time"} <= names


def test_every_cupy_attribute_minidl_uses_exists_in_real_cupy(real_cupy):
    cupy, cupyx = real_cupy
    modules = {"cupy": cupy, "cupyx": cupyx}
    missing = []
    for where, name in _cupy_attributes():
        root, *parts = name.split(".")
        value = modules[root]
        for i, part in enumerate(parts):
            if not hasattr(value, part):
                # an attribute of an array (x.shape) or of a result is no module name: stop at the first
                # level that is a class instance; a missing module-level name is an error
                if i == 0 or isinstance(value, type(cupy)):
                    missing.append(f"{where}: {root}.{'.'.join(parts[:i + 1])}")
                break
            value = getattr(value, part)
    assert not missing, "minidl uses CuPy names that the installed CuPy lacks:\n" + "\n".join(missing)
    # names reached through objects rather than modules
    for owner, names in ((cupy.random.Generator, ("standard_normal", "random", "integers")),
                         (cupy.random.XORWOW, ("__init__",)),
                         (cupy.ndarray, ("get", "item", "astype", "reshape", "sum", "max", "min", "argmax",
                                         "device", "nbytes", "base", "fill", "copy", "transpose", "ravel"))):
        assert all(hasattr(owner, n) for n in names), owner


def _keywords_read(function):
    """(names ``function`` reads from its ``**kwargs``, whether it raises when any are left): from its source."""
    import inspect
    import textwrap
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    var = tree.body[0].args.kwarg.arg
    read = {node.args[0].value for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("pop", "get")
            and isinstance(node.func.value, ast.Name) and node.func.value.id == var
            and node.args and isinstance(node.args[0], ast.Constant)}
    refuses = any(isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == var
                  and any(isinstance(n, ast.Raise) for n in ast.walk(node)) for node in ast.walk(tree))
    return read, refuses


def test_the_keywords_read_from_kwargs_are_real_cupy_s(real_cupy):
    """Every stand-in function declared with ``**kwargs`` whose real CuPy counterpart refuses the keywords it
    does not read is listed in names.KEYWORDS, with exactly the names real CuPy reads."""
    import inspect

    from tests.cupy_standin import names
    cupy, _ = real_cupy
    found = {}
    for name, spec in names.SIGNATURES.items():
        function = getattr(cupy, name)
        if "**" not in spec or not inspect.isfunction(function):
            continue
        read, refuses = _keywords_read(function)
        if refuses:
            found[name] = set(read)
    assert {"einsum", "meshgrid"} <= set(found)
    assert found == {name: set(keywords) for name, keywords in names.KEYWORDS.items()}
