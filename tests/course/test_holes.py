"""Cutting and filling function bodies by qualified name, on source text and on the engine."""
from __future__ import annotations

import ast
import textwrap

import pytest

from minidl.course.holes import HoleError, body_of, engine_root, locate, replace_bodies, stub

SOURCE = textwrap.dedent('''\
    import functools


    class Outer:
        """A class."""

        def method(self, x):
            """Twice x.

            y = 2x
            """
            y = x * 2  # the line a student writes
            return y

        @staticmethod
        def plain(a):
            return a + 1


    @functools.lru_cache
    def decorated(n):
        """n squared."""
        if n:
            return n * n
        return 0
    ''')


def test_a_body_after_the_docstring_is_replaced_and_the_rest_kept():
    out = replace_bodies(SOURCE, {"Outer.method": stub("Task 9.1: write Outer.method"),
                                  "decorated": "return -1\n"})
    kept = '"""Twice x.\n\n        y = 2x\n        """\n'
    assert kept + "        raise NotImplementedError('Task 9.1: write Outer.method')\n" in out
    assert "x * 2" not in out and "n * n" not in out and "return -1" in out
    assert "@staticmethod\n    def plain(a):\n        return a + 1" in out  # untouched
    assert "@functools.lru_cache\ndef decorated(n):" in out
    scope = {}
    exec(compile(out, "<cut>", "exec"), scope)  # noqa: S102 - our own text
    with pytest.raises(NotImplementedError, match="Task 9.1"):
        scope["Outer"]().method(3)
    assert scope["Outer"].plain(1) == 2


def test_a_function_without_a_docstring_loses_its_whole_body():
    out = replace_bodies(SOURCE, {"Outer.plain": "return a - 1\n"})
    scope = {}
    exec(compile(out, "<cut>", "exec"), scope)  # noqa: S102
    assert scope["Outer"].plain(1) == 0


def test_unknown_names_and_one_line_bodies_are_refused():
    with pytest.raises(HoleError, match="no function 'Outer.missing'"):
        replace_bodies(SOURCE, {"Outer.missing": "pass\n"})
    with pytest.raises(HoleError, match="shares a line"):
        replace_bodies("def f(): return 1\n", {"f": "return 2\n"})


def test_a_re_exported_function_is_found_where_it_is_defined():
    site = locate("minidl.functional.softmax")  # minidl.functional imports it from minidl.ops.activation
    assert (site.file, site.qualname) == ("minidl/ops/activation.py", "softmax")
    with pytest.raises(HoleError, match="not a name inside minidl"):
        locate("numpy.sum")
    with pytest.raises(HoleError, match="no attribute path"):
        locate("minidl.ops.linalg.MatMul.nothing")


def test_writing_back_the_engine_own_body_gives_the_file_back():
    for name in ("minidl.ops.linalg.MatMul.backward", "minidl.course.scalar.Value.backward",
                 "minidl.nn.init.xavier_normal_"):
        site = locate(name)
        source = (engine_root() / site.file).read_text()
        assert replace_bodies(source, {site.qualname: body_of(name)}, site.file) == source
        cut = replace_bodies(source, {site.qualname: stub("Task 0.0")}, site.file)
        ast.parse(cut)
        assert cut.count("Task 0.0") == 1
