"""``minidl train --data-parallel`` under mpiexec trains the same model as ``minidl train`` in one process.

One epoch on the bundled digits: 1437 samples in batches of 32, so the last batch (29) splits
unevenly (15 + 14) and is weighted by sample counts.
"""
import numpy as np
import pytest

import minidl as mdl
from minidl.cli import main
from minidl.parallel import launch

REASON = launch.mpi_unavailable_reason()


@pytest.mark.skipif(REASON is not None, reason=f"MPI not installed: {REASON}")
def test_train_cli_on_two_ranks_equals_one_process(tmp_path, capsys):
    settings = ["--epochs", "1", "--quiet", "--batch-size", "32"]
    assert main(["train", *settings, "--out", str(tmp_path / "one")]) == 0
    capsys.readouterr()
    job = launch.run(2, ["-m", "minidl", "train", "--data-parallel", *settings, "--out", str(tmp_path / "two")],
                     timeout=120)
    assert job.returncode == 0, job.stderr[-3000:]
    assert job.stdout.count("writing to") == 1          # only rank 0 speaks...
    assert "data-parallel on 2 ranks (mpi)" in job.stdout
    for name in ("model.safetensors", "last.safetensors", "metrics.jsonl", "curves.png"):  # ...and writes
        assert (tmp_path / "two" / name).exists()
    one = mdl.load(str(tmp_path / "one" / "model.safetensors"))
    two = mdl.load(str(tmp_path / "two" / "model.safetensors"))
    assert list(one) == list(two)
    for key in one:
        np.testing.assert_allclose(np.asarray(two[key]), np.asarray(one[key]), rtol=0, atol=1e-5, err_msg=key)
