"""Placement on a second GPU: the stand-in has two, as CuPy it runs every kernel on the *current* GPU and
refuses an array of another GPU (as CuPy does without peer access; with it, results land on the current
GPU). So work on "cuda:1" must run with GPU 1 current: minidl's tensor factories, ops, backward walk and
optimizer steps switch to their arrays' GPU themselves."""
import numpy as np
import pytest

import minidl as mdl
from minidl import backend
from minidl.op_cases import cases
from minidl.selftest import collectives, parity


def test_the_stand_in_refuses_an_array_of_another_gpu(standin):
    with standin.cuda.Device(1):
        x = standin.arange(3.0)
    assert x.device.id == 1
    with pytest.raises(ValueError, match="different from the current device"):
        x + 1
    with standin.cuda.Device(1):
        assert (x + 1).device.id == 1


def test_tensors_made_on_cuda_1_live_there(standin):
    made = [mdl.tensor(np.ones(3), device="cuda:1"), mdl.zeros(2, device="cuda:1"), mdl.randn(2, device="cuda:1"),
            mdl.ones(2).to("cuda:1"), mdl.full((2,), 3.0, device="cuda:1")]
    assert [t.device for t in made] == ["cuda:1"] * len(made)
    assert standin.cuda.get_device_id() == 0  # and the current GPU is as it was


def test_a_training_step_on_cuda_1_stays_there_and_matches_the_cpu(standin):
    # forward, cross-entropy, backward and an Adam step with GPU 0 current
    assert collectives.placement("cuda:1") == []


@pytest.mark.parametrize("case", range(len(cases())), ids=[c[0] for c in cases()])
def test_op_case_on_cuda_1_with_gpu_1_current_stays_there(case, standin):
    """One process per GPU (what NCCL's data parallelism does): every op case on cuda:1 gives the CPU's
    numbers and every result and derivative lands on cuda:1."""
    with backend.using("cuda:1"):
        problems = parity.compare_case(case, "cuda:1")
    assert not problems, "\n".join(problems)
