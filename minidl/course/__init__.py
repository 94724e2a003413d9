"""A course on minidl: assignments cut from minidl's own source, checked and graded by its own checks.

- :mod:`minidl.course.assignments`: the one table of assignments and tasks (functions by
  qualified name, points, dependencies, checks);
- :mod:`minidl.course.holes`: functions found by name and their bodies cut (no markers in the engine);
- :mod:`minidl.course.make`: an assignment as a complete copy of minidl with holes;
- :mod:`minidl.course.checks`: the checks (public and hidden cases) and the mistakes they name;
- :mod:`minidl.course.selfcheck`, :mod:`minidl.course.grade`, :mod:`minidl.course.gradebook`: the
  student's checks, one submission graded, a class graded;
- :mod:`minidl.course.scalar`, :mod:`minidl.course.data_parallel`: the teaching modules of assignments 1
  and 7 (a scalar autograd engine; gradients averaged over replicas on the engine's ring), real code that
  the tests run.

The command is ``minidl course`` (:mod:`minidl.cli.course`); docs/course.md is the teacher's guide.
Nothing in minidl imports this package except the command line.
"""
