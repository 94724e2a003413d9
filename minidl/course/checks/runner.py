"""Running a task's checks: in this process (the student's ``course check``) or isolated per task (the grader).

The grader starts one fresh Python whose ``sys.path`` begins with the
submission, so ``import minidl`` imports the student's copy and nothing else;
it loads this package from the teacher's files under a name of its own and
calls :func:`main`. There each task runs in a child process of its own (a
fork, where the system has it) with a time limit: a hang, a crash or an
exit in the student's code costs that task, with the reason, and never the
grader. A task whose checks ran fewer cases than they declare, or none, fails.
"""
from __future__ import annotations

import importlib
import json
import os
import select
import signal
import sys
import time
import traceback

from . import core

# check-name prefix -> the module of this package that registers those checks
MODULES = {"a1": "scalar", "a2": "op_backwards", "a3": "walk", "a4": "optimizers", "a5": "initializers",
           "a6": "checkpointing", "a7": "ring", "a8": "forward_mode"}


def load(check_names) -> dict:
    """The Check objects named (``"a2.matmul"``...), importing the modules that register them."""
    found = core.registry()
    for name in check_names:
        prefix = name.split(".")[0]
        if name in found:
            continue
        if prefix not in MODULES:
            raise KeyError(f"course: no check module for {name!r}")
        importlib.import_module(f"{__package__}.{MODULES[prefix]}")
    missing = [n for n in check_names if n not in found]
    if missing:
        raise KeyError(f"course: checks not found: {', '.join(missing)}")
    return {n: found[n] for n in check_names}


def _where(exc, root=None) -> str:
    """``file:line`` of the deepest frame inside minidl (the student's code, usually), relative to its root."""
    if root is None:
        import minidl
        root = os.path.dirname(os.path.dirname(os.path.abspath(minidl.__file__)))
    while exc.__cause__ is not None and exc.__cause__.__traceback__ is not None:
        exc = exc.__cause__  # the original exception, where a check raised it again with more words
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if os.path.abspath(f.filename).startswith(os.path.join(root, "minidl") + os.sep)]
    if not frames:
        return ""
    f = frames[-1]
    line = f" ({f.line.strip()})" if f.line and not f.line.strip().startswith("raise NotImplementedError") else ""
    return f"{os.path.relpath(f.filename, root)}:{f.lineno}{line}"


def run_task(task_id: str, check_names, hidden_seed=None, functions=()) -> dict:
    """Every case of the task's checks; a dict: planned and ran counts, passed, and each failure located."""
    result = {"id": task_id, "planned": 0, "ran": 0, "passed": 0, "failures": [], "error": None}
    try:
        checks = load(check_names)
    except Exception as exc:  # noqa: BLE001 - a grader fault is reported, never taken for a pass
        result["error"] = f"the checks could not be loaded: {type(exc).__name__}: {exc}"
        return result
    import minidl
    for name, chk in checks.items():
        try:
            cases = chk.cases(hidden_seed, functions)
        except Exception as exc:  # noqa: BLE001
            result["error"] = f"check {name} could not draw its cases: {type(exc).__name__}: {exc}"
            return result
        result["planned"] += len(chk.public) + (chk.hidden_count if hidden_seed is not None else 0)
        for case in cases:
            label = chk.label(case.params)
            minidl.manual_seed(0)
            try:
                with minidl.enable_grad():
                    chk.run(case)
            except core.Mismatch as exc:
                result["failures"].append({"check": name, "case": label, "hidden": case.hidden,
                                           "message": exc.message, "mistakes": exc.mistakes, "where": ""})
            except Exception as exc:  # noqa: BLE001 - the student's exception is the feedback
                text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                result["failures"].append({"check": name, "case": label, "hidden": case.hidden,
                                           "message": f"raised {type(exc).__name__}" + (f": {text}" if text else ""),
                                           "mistakes": [], "where": _where(exc)})
            else:
                result["passed"] += 1
            result["ran"] += 1
    return result


# ---------------------------------------------------------------- the grader's side: one child per task
def _run_forked(task_id, check_names, hidden_seed, timeout, functions=()) -> dict:
    """``run_task`` in a forked child with a time limit; what the child reports, or why it reported nothing."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: run, write the result, leave without running the parent's cleanup
        code = 0
        try:
            os.close(read_end)
            payload = json.dumps(run_task(task_id, check_names, hidden_seed, functions)).encode()
            with os.fdopen(write_end, "wb") as out:
                out.write(payload)
        except BaseException:  # noqa: BLE001 - a child must never return into the parent's code
            code = 70
        finally:
            os._exit(code)
    os.close(write_end)
    chunks, deadline, status = [], time.monotonic() + timeout, None
    with os.fdopen(read_end, "rb") as pipe:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select([pipe], [], [], min(left, 0.5))
            if ready:
                chunk = os.read(pipe.fileno(), 1 << 16)
                if not chunk:  # the child closed its end: finished (or died)
                    break
                chunks.append(chunk)
        if time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return _failed(task_id, f"the checks did not finish within the time limit of {timeout:g} s "
                                    "(an endless loop, or something far too slow)")
    _, status = os.waitpid(pid, 0)
    try:
        return json.loads(b"".join(chunks).decode())
    except ValueError:
        if os.WIFSIGNALED(status):
            why = f"killed by signal {os.WTERMSIG(status)}"
        else:
            why = f"exit code {os.WEXITSTATUS(status)}"
        return _failed(task_id, f"the checks stopped without a result ({why}): the code exited or crashed")


def _failed(task_id, reason) -> dict:
    return {"id": task_id, "planned": 0, "ran": 0, "passed": 0, "failures": [], "error": reason}


def main(submission: str, request_path: str) -> int:
    """Grade the tasks of the request (JSON: tasks, hidden_seed, timeout, result) against ``submission``."""
    with open(request_path) as f:
        request = json.load(f)
    results = []
    try:
        import minidl
        where = os.path.abspath(minidl.__file__)
        if not where.startswith(os.path.abspath(submission) + os.sep):
            raise ImportError(f"minidl was imported from {where}, not from the submission {submission}")
    except Exception as exc:  # noqa: BLE001 - a copy that does not import fails every task, with the reason
        reason = f"the submission's minidl does not import: {type(exc).__name__}: {exc}"
        where = _where(exc, os.path.abspath(submission))
        results = [_failed(t["id"], reason + (f" at {where}" if where else "")) for t in request["tasks"]]
    else:
        for t in request["tasks"]:
            if hasattr(os, "fork") and request.get("isolate", True):
                results.append(_run_forked(t["id"], t["checks"], request["hidden_seed"], request["timeout"],
                                           t.get("functions", ())))
            else:
                results.append(run_task(t["id"], t["checks"], request["hidden_seed"], t.get("functions", ())))
    with open(request["result"], "w") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
