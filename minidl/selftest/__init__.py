"""``minidl selftest``: does minidl work on this GPU, and how fast? The whole GPU proof in one call.

Six stages, each under its own time limit, each reported (a line, and a
progress bar over the stages) as it ends. A stage that fails, raises or runs
out of time is recorded and the next one runs:

    environment   GPU, memory, driver, CUDA runtime, CuPy, NVRTC, NCCL, NumPy;
                  whether PyTorch with CUDA is there (the speed reference, never required)
    parity        every op case (values, first and second derivatives), every
                  optimizer's fused update, a Trainer run with a bit-exact resume
                  (float32 and float16 with a GradScaler) and bfloat16 autocast,
                  on the device against the CPU         (minidl.selftest.parity)
    kernels       every fused optimizer kernel compiled on the device, a compile
                  failure an error; first-call time of each (minidl.selftest.kernels)
    nccl          every collective minidl uses through NCCL on device buffers, exact;
                  ``cuda:N`` placement on every visible GPU  (minidl.selftest.collectives)
    speed         the roofline, the MLP, CNN and GPT steps, a 100M-parameter fused
                  AdamW update, the launch overhead of tiny ops, the GPT step's peak
                  memory: minidl beside PyTorch on the same GPU  (minidl.selftest.speed)
    results       ``selftest.json`` (every figure), ``summary.txt``, and the roofline
                  and step-profile PNGs in the output folder  (minidl.selftest.report)

    results = run("cuda", out="runs/selftest", quick=False)
    results["stages"]["parity"]["status"]        # "passed", "failed", "timed out" or "skipped"

The same code runs in CI on the CuPy stand-in of the test suite (``--quick``).
"""
from __future__ import annotations

import signal
import sys
import threading
import time

from minidl.selftest.stage_timeout import StageTimeout, import_up_front

# (name, seconds allowed, seconds allowed with quick=True): 270 s in all, so that the whole run stays
# inside benchmarks/gpu_run.sh's 300 s for it; on one H100 the stages take less (docs/gpu.md).
STAGES = (
    ("environment", 15, 15),
    ("parity", 60, 60),
    ("kernels", 45, 30),
    ("nccl", 20, 20),
    ("speed", 110, 40),
    ("results", 20, 20),
)


class Unavailable(RuntimeError):
    """The device cannot be used at all: no CuPy, or no GPU. The message is one line, what is missing."""


class Stage:
    """What a stage function is given: the device, the mode, its deadline, the earlier stages' results."""

    def __init__(self, name, device, quick, seconds, results, log):
        self.name, self.device, self.quick, self.seconds = name, device, quick, seconds
        self.results, self.log = results, log
        self.started = time.perf_counter()

    def left(self) -> float:
        """Seconds left before the limit."""
        return self.seconds - (time.perf_counter() - self.started)

    def expired(self, margin: float = 0.0) -> bool:
        """True once fewer than ``margin`` seconds are left: a loop stops here and reports what it did."""
        return self.left() <= margin

    @property
    def deadline(self) -> float:
        """The limit as a ``time.perf_counter()`` value."""
        return self.started + self.seconds


def check_device(device: str) -> None:
    """Raise :class:`Unavailable` (one line: what is missing) unless ``device`` can be used."""
    from minidl import backend
    try:
        kind, index = backend.parse_device(device)
    except (ValueError, TypeError):
        raise Unavailable(f"minidl selftest: --device {device!r} is not a device; valid choices: 'cuda' or "
                          "'cuda:N' (N the GPU's index, from 0), e.g. --device cuda:0") from None
    if kind != "cuda":
        raise Unavailable(f"minidl selftest checks a GPU: --device must be 'cuda' or 'cuda:N', got {device!r}")
    try:
        cp = backend.cupy_module()
    except RuntimeError as exc:
        raise Unavailable(f"minidl selftest: {exc}".replace("\n", " ")) from None
    count = cp.cuda.runtime.getDeviceCount()
    if index >= count:
        raise Unavailable(f"minidl selftest: {device} asked for, but this machine has {count} GPU(s)")


def stage_functions() -> dict:
    """``{name: function(stage) -> dict}`` of the six stages, imported when the run starts."""
    from minidl.selftest import collectives, environment, kernels, parity, report, speed
    return {"environment": environment.run, "parity": parity.run, "kernels": kernels.run,
            "nccl": collectives.run, "speed": speed.run, "results": report.run}


def run(device: str = "cuda", out: str | None = None, quick: bool = False, only=None, limits: dict | None = None,
        log=None) -> dict:
    """Run the stages on ``device``; write the results into ``out`` (when given); return them.

    ``only``: stage names to run (the others are reported as skipped; "results" always runs when
    ``out`` is given). ``limits``: ``{stage: seconds}`` replacing the defaults of :data:`STAGES`.
    Raises :class:`Unavailable` when the device cannot be used.
    """
    from tqdm import tqdm
    check_device(device)
    log = log or (lambda line: tqdm.write(line, file=sys.stdout))
    functions = stage_functions()
    started = time.perf_counter()
    # every import before the first alarm: an alarm inside `import torch` would leave it half-made
    results = {"device": device, "quick": bool(quick), "out": out, "imports": import_up_front(), "stages": {}}
    bar = tqdm(total=len(STAGES), desc="selftest", unit="stage", file=sys.stderr, leave=False,
               disable=not sys.stderr.isatty())
    try:
        for number, (name, full, short) in enumerate(STAGES, 1):
            seconds = (limits or {}).get(name, short if quick else full)
            wanted = out is not None if name == "results" else (only is None or name in only)
            bar.set_postfix_str(name)
            if not wanted:
                record = {"status": "skipped", "seconds": 0.0, "summary": "not asked for", "limit_s": seconds}
            else:
                record = run_stage(functions[name], Stage(name, device, quick, seconds, results, log))
            results["stages"][name] = record
            results["seconds"] = time.perf_counter() - started
            if out is not None:  # after every stage: a run killed from outside still leaves what it found
                from minidl.selftest import report
                report.write_json(results, out)
            log(f"[{number}/{len(STAGES)}] {name:<12} {record['status']:<9} {record['seconds']:6.1f} s  "
                f"{record.get('summary', '')}")
            bar.update(1)
    finally:
        bar.close()
    failed = [n for n, r in results["stages"].items() if r["status"] in ("failed", "timed out")]
    results["passed"] = not failed
    if out is not None and results["stages"]["results"]["status"] == "passed":
        from minidl.selftest import report
        report.write_json(results, out)  # again, with the results stage and the verdict in it
        report.write_summary(results, out)
    log(f"selftest on {device}: " + (f"{len(failed)} stage(s) failed or ran out of time: {', '.join(failed)}"
                                     if failed else "every stage passed") + f" in {results['seconds']:.0f} s")
    return results


def run_stage(function, stage: Stage, grace: float = 5.0) -> dict:
    """``function(stage)``'s dict plus status, seconds and limit.

    The stage's time limit is enforced by an alarm ``grace`` seconds after it (the stages
    check :meth:`Stage.expired` themselves and should stop before). A stage that raises is
    "failed", one stopped by the alarm "timed out"; neither exception goes further.
    """
    try:
        with _time_limit(stage.seconds + grace):
            record = function(stage) or {}
    except StageTimeout:
        record = {"status": "timed out", "summary": f"stopped {grace:g} s after its limit of {stage.seconds:g} s"}
    except Exception as exc:  # noqa: BLE001 - a failed stage is reported; the next one runs
        record = {"status": "failed", "summary": f"{type(exc).__name__}: {exc}"[:300],
                  "failures": [f"{type(exc).__name__}: {exc}"[:2000]]}
    if "status" not in record:
        if record.get("skipped"):
            record["status"] = "skipped"
            record.setdefault("summary", record["skipped"])
        elif record.get("failures"):
            record["status"] = "failed"
        elif record.get("partial"):
            record["status"] = "timed out"
        else:
            record["status"] = "passed"
    record["seconds"] = time.perf_counter() - stage.started
    record["limit_s"] = stage.seconds
    return record


class _time_limit:
    """Raise :class:`StageTimeout` after ``seconds`` (SIGALRM); outside the main thread, where
    there are no signals, nothing is enforced."""

    def __init__(self, seconds):
        self.seconds = seconds
        self.armed = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()

    def __enter__(self):
        if self.armed:
            self.previous = signal.signal(signal.SIGALRM, self._expire)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
        return self

    def __exit__(self, *exc):
        if self.armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous)
        return False

    @staticmethod
    def _expire(signum, frame):
        raise StageTimeout()
