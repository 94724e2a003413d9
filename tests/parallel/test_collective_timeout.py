"""Every collective has a timeout: a frozen rank ends the whole job, with one line naming it.

The job (timeout_worker.py, 2 ranks, MINIDL_COLLECTIVE_TIMEOUT=3) trains until rank 1 is stopped with
SIGSTOP; rank 0 then waits in its next all-reduce. Without a timeout the job would wait forever.
"""
import os
import signal
import subprocess
import threading
import time

import numpy as np
import pytest

import minidl as mdl
from minidl.parallel import LocalComm, launch
from minidl.parallel.comm import TIMEOUT_VARIABLE, Watchdog, default_timeout, timeout_message

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
REASON = launch.mpi_unavailable_reason()
TIMEOUT = 3


def _alive(pid: int) -> bool:
    """True while process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_for(path, until, what):
    while not os.path.exists(path) or not open(path).read().strip():
        if time.monotonic() > until:
            raise AssertionError(f"the job never wrote {what}")
        time.sleep(0.1)
    return open(path).read().strip()


@pytest.mark.skipif(REASON is not None, reason=f"MPI not installed: {REASON}")
def test_a_stopped_rank_ends_every_rank_within_the_timeout(tmp_path):
    cmd = launch.mpiexec_command(2, [os.path.join(HERE, "timeout_worker.py"), str(tmp_path)],
                                 use_mpi4py_runner=False)
    env = dict(os.environ, OMPI_MCA_mpi_yield_when_idle="1", PYTHONPATH=REPO, **{TIMEOUT_VARIABLE: str(TIMEOUT)})
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    pids = []
    try:
        until = time.monotonic() + 120
        pids = [int(_wait_for(tmp_path / f"pid{r}", until, f"rank {r}'s pid")) for r in range(2)]
        while int(_wait_for(tmp_path / "step1", until, "a step")) < 3:  # a few steps trained
            time.sleep(0.05)
        os.kill(pids[1], signal.SIGSTOP)
        stopped = time.monotonic()
        stdout, stderr = job.communicate(timeout=TIMEOUT + 60)
        elapsed = time.monotonic() - stopped
    finally:
        if job.poll() is None:
            job.kill()
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert job.returncode != 0
    assert "finished without a timeout" not in stdout
    lines = [line.strip() for line in stderr.splitlines() if "minidl.parallel:" in line]
    assert len(lines) == 1, stderr[-3000:]
    assert "timed out after 3 s on rank 0 of 2: rank 1 did not arrive" in lines[0]
    assert elapsed < TIMEOUT + 10, f"the job took {elapsed:.1f} s to end after rank 1 stopped"
    time.sleep(1)
    assert not any(_alive(pid) for pid in pids), "a rank outlived the job"
    state = mdl.load(str(tmp_path / "last.safetensors"))  # the last checkpoint is whole
    assert state and all(np.isfinite(np.asarray(v)).all() for v in state.values())


def test_timeout_defaults_and_settings(monkeypatch):
    monkeypatch.delenv(TIMEOUT_VARIABLE, raising=False)
    assert default_timeout() == 1800.0 and LocalComm().timeout == 1800.0
    monkeypatch.setenv(TIMEOUT_VARIABLE, "2.5")
    assert LocalComm().timeout == 2.5
    comm = LocalComm()
    comm.set_timeout(7)
    assert comm.timeout == 7.0
    for bad in (0, -1, "soon", float("nan"), True):
        with pytest.raises(ValueError, match="positive number of seconds"):
            comm.set_timeout(bad)
    monkeypatch.setenv(TIMEOUT_VARIABLE, "ten")
    with pytest.raises(ValueError, match=f"{TIMEOUT_VARIABLE}='ten'"):
        default_timeout()


def test_the_one_line_names_the_operation_and_the_ranks():
    line = timeout_message("allreduce", 5, 0, 4, [2, 3])
    assert "\n" not in line
    assert line.startswith("minidl.parallel: allreduce timed out after 5 s on rank 0 of 4: ranks 2, 3 did not arrive")
    assert TIMEOUT_VARIABLE in line


def test_watchdog_fires_once_for_an_operation_that_never_finishes_and_not_for_done_ones():
    fired, finished = [], threading.Event()
    dog = Watchdog(lambda op, seconds: (fired.append((op, seconds, time.monotonic())), finished.set()), period=0.05)
    start = time.monotonic()
    dog.watch("allreduce", lambda: True, 0.2)        # done at once
    dog.watch("broadcast", lambda: False, 0.3)       # never done
    assert finished.wait(5)
    time.sleep(0.2)
    assert [(op, s) for op, s, _ in fired] == [("broadcast", 0.3)]
    assert 0.3 <= fired[0][2] - start < 2


def test_watchdog_keeps_quiet_while_operations_finish_in_time():
    fired = []
    dog = Watchdog(lambda op, seconds: fired.append(op), period=0.05)
    done_at = time.monotonic() + 0.15
    dog.watch("allreduce", lambda: time.monotonic() >= done_at, 1.0)
    time.sleep(0.5)
    assert fired == [] and dog.pending() == 0


class _NeverDoneEvent:
    """A CUDA event whose work never finishes (a peer that never joins the NCCL kernel)."""

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.recorded_on = None

    def record(self, stream=None):
        self.recorded_on = stream

    @property
    def done(self):
        return False


def test_nccl_collective_not_done_by_its_deadline_aborts_naming_the_operation(capsys):
    """NCCLComm hands each collective's event to the watchdog; one never done ends the job (no GPU needed:
    the NCCL call itself is replaced by nothing, the watchdog and the abort are NCCLComm's own)."""
    import types

    from minidl.parallel.comm import NCCLComm
    stream = types.SimpleNamespace(ptr=0)
    cuda = types.SimpleNamespace(Event=_NeverDoneEvent, get_current_stream=lambda: stream)
    world = object.__new__(NCCLComm)
    world.cp, world.mpi, world.rank, world.size = types.SimpleNamespace(cuda=cuda), None, 1, 2
    world.set_timeout(0.3)
    aborted = threading.Event()
    world.abort = lambda code=1: aborted.set()
    world._watch("allreduce")
    assert aborted.wait(5)
    err = capsys.readouterr().err
    assert "minidl.parallel: NCCL allreduce timed out after 0.3 s on rank 1 of 2: some rank did not join it" in err
