"""The minidl command: gradcheck table and version."""
import subprocess
import sys

import minidl
from minidl.cli import main


def test_gradcheck_command_passes_and_prints_a_table(capsys):
    assert main(["gradcheck", "--only", "matmul", "softmax", "relu"]) == 0
    out = capsys.readouterr().out
    assert "max rel. error" in out
    lines = [line for line in out.splitlines() if line.split()[:1] in (["matmul"], ["softmax"], ["relu"])]
    assert len(lines) == 3 and all(" yes " in line for line in lines)
    assert "3 passed, 0 failed" in out


def test_gradcheck_command_reports_a_failure(capsys):
    # An absurd tolerance makes every op fail: the command must say so and exit 1.
    assert main(["gradcheck", "--only", "exp", "--tolerance", "-1"]) == 1
    assert "0 passed, 1 failed" in capsys.readouterr().out


def test_version_through_python_m():
    out = subprocess.run([sys.executable, "-m", "minidl", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == f"minidl {minidl.__version__}"


def test_gradcheck_only_with_an_unknown_name_lists_the_closest_op_names(capsys):
    import difflib

    from minidl.op_cases import cases
    names = sorted({c[0] for c in cases(0)})
    assert main(["gradcheck", "--only", "relu", "relux"]) == 2
    captured = capsys.readouterr()
    close = difflib.get_close_matches("relux", names, n=5, cutoff=0.6)
    assert "relu" in close and captured.out == ""
    assert captured.err == f"minidl gradcheck: error: no op case named 'relux'; the closest: {', '.join(close)}\n"
    assert main(["gradcheck", "--only", "qqqqqqqq"]) == 2
    assert "the op cases: " + ", ".join(names) in capsys.readouterr().err


def test_gradcheck_adjoint_checks_the_tangent_rules(capsys):
    """--adjoint: each op's forward mode against central differences and against its backward."""
    assert main(["gradcheck", "--adjoint", "--only", "matmul", "tanh", "cumprod"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.split()[:1] in (["matmul"], ["tanh"], ["cumprod"])]
    assert len(lines) == 3 and all(" yes " in line and " ulps " in line for line in lines)
    assert "3 passed, 0 failed" in out and "⟨u, J v⟩ = ⟨Jᵀu, v⟩" in out


def test_gradcheck_sweep_draws_the_error_against_the_step(tmp_path, capsys):
    assert main(["gradcheck", "--sweep", "tanh", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "sweep_tanh.png").read_bytes()[:4] == b"\x89PNG"
    assert f"wrote {tmp_path / 'sweep_tanh.png'}" in capsys.readouterr().out
    assert main(["gradcheck", "--sweep", "tanx", "--out", str(tmp_path)]) == 2
