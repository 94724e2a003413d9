"""The docs build's notebook kernel starts without "[IPKernelApp] WARNING | Kernel is running over TCP"."""
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import sys
    from pathlib import Path
    if sys.argv[1] == "quiet":
        sys.path.insert(0, str(Path(sys.argv[2]) / "docs" / "_ext"))
        from quietkernel import use_quiet_kernel
        use_quiet_kernel(Path(sys.argv[3]))
    import nbformat
    from nbclient import NotebookClient
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell("print(6 * 7)"))
    NotebookClient(nb, kernel_name="python3", timeout=60).execute()
    print("output:", nb.cells[0].outputs[0]["text"].strip())
""")


@pytest.mark.parametrize("mode", ["plain", "quiet"])
def test_the_docs_kernel_starts_without_the_tcp_warning(mode, tmp_path):
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    run = subprocess.run([sys.executable, "-c", SCRIPT, mode, str(ROOT), str(tmp_path / "jupyter")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "output: 42" in run.stdout  # the kernel runs cells all the same
    warned = "Kernel is running over TCP without encryption" in run.stderr
    if mode == "quiet":
        assert not warned, run.stderr
    else:
        import ipykernel
        if ipykernel.version_info < (7,):
            pytest.skip("this ipykernel has no TCP warning to silence")
        assert warned  # the warning the quiet kernel removes is real here
