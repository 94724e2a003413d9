"""``minidl plan``: the planner's table and recommendation on the command line; bad input in one line, exit 2."""
import pytest

from minidl.cli import main
from minidl.parallel.planner import Machine, ModelSpec, plan


def test_the_gpt_table_is_the_planners(capsys):
    argv = ["plan", "--model", "gpt", "--layers", "4", "--width", "128", "--heads", "4", "--context", "64",
            "--batch", "32", "--devices", "4", "--memory", "16GB", "--bandwidth", "25GB/s", "--latency", "10us",
            "--flops", "100TFLOP/s"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    want = plan(ModelSpec.gpt(4, 128, 4, 64, 65), 32, Machine(4, 16e9, 25e9, 10e-6, 100e12))
    assert out.strip() == str(want).strip()
    assert out.count("\n") == len(want.rows) + len(want.dropped) + 3
    assert f"recommended: {want.recommended.layout} is the fastest layout that fits 16 GB per device" in out


def test_the_mlp_and_binary_units(capsys):
    argv = ["plan", "--model", "mlp", "--sizes", "784,512,512,10", "--batch", "64", "--devices", "2",
            "--memory", "1GiB", "--bandwidth", "1.5e9", "--latency", "0.02ms", "--flops", "2e11", "--dtype", "float16"]
    assert main(argv) == 0
    want = plan(ModelSpec.mlp([784, 512, 512, 10], itemsize=2), 64, Machine(2, 2**30, 1.5e9, 2e-5, 2e11))
    assert capsys.readouterr().out.strip() == str(want).strip()


def test_nothing_fits_is_exit_1_with_the_least_needed(capsys):
    assert main(["plan", "--model", "mlp", "--sizes", "256,512,10", "--memory", "1kB"]) == 1
    out = capsys.readouterr().out
    assert "recommended: No layout fits 1 kB per device; the least any layout needs is" in out


@pytest.mark.parametrize("extra, message", [
    (["--memory", "16XB"], "--memory '16XB': expected a positive number with an optional unit, such as 16GB"),
    (["--bandwidth", "0GB/s"], "--bandwidth '0GB/s': expected a positive number"),
    (["--latency", "soon"], "--latency 'soon': expected a time of at least 0, such as 10us"),
    (["--devices", "0"], "--devices must be a positive integer, got 0"),
    (["--heads", "3"], "n_embd divisible by n_head, got n_layer=4, n_embd=128, n_head=3"),
    (["--model", "mlp", "--sizes", "784"], "--sizes '784': expected at least two positive widths"),
    (["--micro-batches", "0"], "--micro-batches must be a positive integer, got 0"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, extra, message):
    assert main(["plan", *extra]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith("minidl plan: error: ")
    assert message in captured.err
