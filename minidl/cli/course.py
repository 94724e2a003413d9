"""``minidl course``: assignments cut from minidl's own source, checked and graded.

    minidl course list [--json]                      the assignments, their tasks and points
    minidl course make NAME --out DIR [--solutions]  an assignment as a copy of minidl with holes
    python -m minidl course check [TASK]             the public checks (inside the assignment's folder)
    minidl course grade DIR [--json FILE]            the hidden checks on one submission
    minidl course grade --class FOLDER --out grades.csv   every submission of a class
"""
from __future__ import annotations

import json
import sys

from minidl.cli.args import add_command, positive_float


def _list(args) -> int:
    from minidl.course.assignments import ASSIGNMENTS
    if args.json:
        print(json.dumps([{"name": a.name, "number": a.number, "title": a.title, "section": a.section,
                           "max_points": a.max_points,
                           "tasks": [{"id": t.id, "title": t.title, "points": t.points, "functions": list(t.functions),
                                      "depends_on": list(t.depends_on)} for t in a.tasks]}
                          for a in ASSIGNMENTS], indent=2))
        return 0
    for a in ASSIGNMENTS:
        print(f"{a.number} {a.name}: {a.title} ({a.max_points} points; {a.section})")
        for t in a.tasks:
            needs = f"  [needs {', '.join(t.depends_on)}]" if t.depends_on else ""
            print(f"    {t.id}  {t.points:>2} pts  {t.title}{needs}")
    return 0


def _make(args) -> int:
    from minidl.course.assignments import find
    from minidl.course.make import make
    try:
        assignment = find(args.name)
        out = make(args.name, args.out, solutions=args.solutions)
    except (KeyError, ValueError) as exc:
        print(f"minidl course make: error: {exc.args[0]}", file=sys.stderr)
        return 2
    kind = "the teacher's copy (solutions)" if args.solutions else "the student's copy"
    print(f"wrote assignment {assignment.number} ({assignment.name}), {kind}, to {out}/: "
          f"{len(assignment.tasks)} tasks, {assignment.max_points} points; notebook {assignment.notebook}")
    return 0


def _check(args) -> int:
    from minidl.course.selfcheck import NotAnAssignment, run_public_checks
    try:
        results = run_public_checks(args.task or None)
    except (NotAnAssignment, KeyError) as exc:
        print(f"minidl course check: error: {exc.args[0]}", file=sys.stderr)
        return 2
    failed = 0
    for task, result, lines in results:
        ok = not result["error"] and result["ran"] and result["passed"] == result["ran"] == result["planned"]
        failed += not ok
        status = "passed" if ok else "FAILED"
        print(f"Task {task.id} {task.title}: {result['passed']} of {result['planned']} checks {status}")
        if result["error"]:
            print(f"    {result['error']}")
        elif not result["ran"]:
            print("    no checks ran: that is a failure, never a pass")
        for line in lines:
            print(f"    {line}")
    print(f"\n{len(results) - failed} of {len(results)} tasks pass their public checks"
          + ("" if failed else "; grading adds hidden cases"))
    return 1 if failed else 0


def _grade(args) -> int:
    from minidl.course.grade import GradeError, grade
    from minidl.course.gradebook import grade_class
    try:
        if args.class_folder:
            if not args.out:
                print("minidl course grade: error: --class needs --out grades.csv", file=sys.stderr)
                return 2
            graded = grade_class(args.class_folder, args.out, seed=args.seed, timeout=args.timeout, log=print)
            print(f"graded {len(graded)} submissions: wrote {args.out}, feedback/ and class_summary.md beside it")
            return 0
        if not args.submission:
            print("minidl course grade: error: give a submission folder, or --class FOLDER", file=sys.stderr)
            return 2
        result = grade(args.submission, seed=args.seed, timeout=args.timeout)
    except GradeError as exc:
        print(f"minidl course grade: error: {exc}", file=sys.stderr)
        return 2
    for t in result.tasks:
        print(f"Task {t.id} {t.title}: {t.points:g} of {t.max_points}")
        for line in t.feedback:
            print(f"    {line}")
    print(f"\ntotal: {result.total:g} of {result.max_total} (hidden seed {result.seed})")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result.to_dict(), f, indent=2)
        print(f"wrote {args.json}")
    return 0


def add_commands(subparsers) -> None:
    course = add_command(subparsers, "course", help="assignments cut from minidl's source: make, check, grade",
                         description="A course on minidl: assignments cut from minidl's own source (each task's "
                                     "functions replaced by a NotImplementedError), the student's public checks, "
                                     "and a grader that locates and names each mistake.")
    sub = course.add_subparsers(dest="course_command", metavar="{list,make,check,grade}", required=True,
                                help="list, make, check or grade")
    p = add_command(sub, "list", help="the assignments, their tasks and points")
    p.add_argument("--json", action="store_true", help="print a JSON list of objects (name, title, tasks)")
    p.set_defaults(run=_list)
    p = add_command(sub, "make", help="an assignment as a complete copy of minidl with the tasks cut out",
                    description="Write an assignment into a new folder: a complete copy of minidl whose task "
                                "functions raise NotImplementedError, its assignment.json, notebook and README.")
    p.add_argument("name", help="the assignment: its name (op-backwards) or number (2); see 'minidl course list'")
    p.add_argument("--out", required=True, help="the folder to write, new or empty (required: no default)")
    p.add_argument("--solutions", action="store_true", help="leave every function whole: the teacher's copy")
    p.set_defaults(run=_make)
    p = add_command(sub, "check", help="the public checks of one task or all (run inside the assignment folder)",
                    description="Run the public checks of the assignment this minidl belongs to: "
                                "'python -m minidl course check [TASK]' inside the folder 'minidl course make' "
                                "wrote. Each failure is said in plain words.")
    p.add_argument("task", nargs="*", help="task ids such as 2.3 (default: every task)")
    p.set_defaults(run=_check)
    p = add_command(sub, "grade", help="the hidden checks on a submission, or on a whole class",
                    description="Grade a submission folder (or, with --class, every submission folder under "
                                "FOLDER) with the hidden checks: points per task and feedback that locates each "
                                "error and names the mistake it looks like.")
    p.add_argument("submission", nargs="?", help="a submission folder (one student's copy of the assignment)")
    p.add_argument("--json", help="also write the grade as JSON to this file (default: none)")
    p.add_argument("--class", dest="class_folder", help="grade every submission folder under this folder "
                                                        "(default: none, grade one submission)")
    p.add_argument("--out", help="with --class: the gradebook CSV to write; feedback/ and class_summary.md go "
                                 "beside it (default: none)")
    p.add_argument("--seed", type=int, default=None, help="the hidden cases' seed (default: a fresh random one, "
                                                          "printed, so a grade can be reproduced)")
    p.add_argument("--timeout", type=positive_float, default=60.0, help="seconds each task's checks may take")
    p.set_defaults(run=_grade)
