"""Running the ``minidl`` command inside the test process, and reading what a run wrote."""
import json
import os

from minidl.cli import main


def run_cli(capsys, *argv):
    """``minidl *argv`` in this process: (exit code, stdout, stderr)."""
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def metrics_records(folder):
    """The records of a run folder's metrics.jsonl, in order."""
    with open(os.path.join(folder, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]
