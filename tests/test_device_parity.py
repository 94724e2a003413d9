"""CPU against "cuda" (the CuPy stand-in without a GPU, the GPU with one): every op case gives the
same values and gradients on both devices, so every op's CuPy path runs on every CI run. The comparison
is minidl.selftest.parity's, which ``minidl selftest`` runs on a real GPU."""
import pytest

from minidl.op_cases import cases
from minidl.selftest.parity import compare_case

IDS = [c[0] for c in cases()]


@pytest.mark.parametrize("case", range(len(IDS)), ids=IDS)
def test_op_case_gives_the_same_values_and_gradients_on_cuda(case, standin_or_gpu):
    problems = compare_case(case, "cuda")
    assert not problems, "\n".join(problems)
