"""The course's checks: public cases for the student, hidden cases for the grader, the same code.

This package imports minidl's engine and its own modules (relatively) and
nothing else of :mod:`minidl.course`, apart from the modules that hold holes
themselves (:mod:`minidl.course.scalar`, :mod:`minidl.course.data_parallel`,
which are the student's code). That is what lets the grader load the teacher's copy of
these files beside a student's minidl: the checks come from the teacher, the
code under test from the student.

One module per assignment registers its checks (see :mod:`.core`);
:mod:`.runner` runs a task's checks, isolated per task for the grader.
"""
