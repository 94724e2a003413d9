"""Filter-wise and spatial parallelism on real MPI ranks (2 and 4), each equal to one process.

One mpiexec job per world size runs split_worker.py; the tests compare what each rank saved with the plain
model run here (nothing of minidl.parallel), reassembling the ranks' parts by hand, and each rank's counted
bytes with the cost model.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from minidl import optim
from minidl.parallel import cost_model, launch
from minidl.train import Trainer

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import split_scenarios as S  # noqa: E402

REASON = launch.mpi_unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"MPI not installed: {REASON}")

# Which parameters a rank holds a part of, and along which axis the ranks' parts lie side by side.
SPLIT = {"filter_gathered": {"0.weight": 0, "0.bias": 0, "2.weight": 0, "2.bias": 0},
         "filter_paired": {"0.weight": 0, "0.bias": 0, "2.weight": 1},   # conv 2 takes rank r's input channels
         "spatial": {}}
MODELS = {"cnn": (S.cnn, S.cnn_batch), "odd": (S.odd_cnn, S.odd_batch)}


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"{n}ranks")
def job(request, tmp_path_factory):
    ranks = request.param
    out = tmp_path_factory.mktemp(f"split{ranks}")
    result = launch.run(ranks, [os.path.join(HERE, "split_worker.py"), str(out)], timeout=300)
    assert result.returncode == 0, f"mpiexec failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    return ranks, [(dict(np.load(out / f"rank{r}.npz")), json.loads((out / f"rank{r}.json").read_text()))
                   for r in range(ranks)]


def _reference(model_name):
    make, batch = MODELS[model_name]
    model = make()
    out, gx = S.forward_backward(model, *batch())
    return out, gx, {name: p.grad.numpy() for name, p in model.named_parameters()}


def _cases(ranks):
    return [(m, s) for m in MODELS for s in SPLIT if not (m == "odd" and s != "spatial" and ranks == 4)]


def test_forward_and_every_gradient_equal_one_process(job):
    ranks, outputs = job
    for model_name, scheme in _cases(ranks):
        key = f"{model_name}/{scheme}"
        want_out, want_gx, want_grads = _reference(model_name)
        for rank, (arrays, _) in enumerate(outputs):
            np.testing.assert_allclose(arrays[f"{key}/out"], want_out, rtol=1e-10, atol=1e-12, err_msg=key)
            np.testing.assert_allclose(arrays[f"{key}/input_grad"], want_gx, rtol=1e-10, atol=1e-13, err_msg=key)
        for name, want in want_grads.items():
            parts = [arrays[f"{key}/grad/{name}"] for arrays, _ in outputs]
            axis = SPLIT[scheme].get(name)
            if axis is None:                 # whole on every rank
                for part in parts:
                    np.testing.assert_allclose(part, want, rtol=1e-10, atol=1e-13, err_msg=f"{key} {name}")
            else:                            # rank r's part is the r-th of N equal slices
                assert parts[0].shape[axis] == want.shape[axis] // ranks
                np.testing.assert_allclose(np.concatenate(parts, axis=axis), want, rtol=1e-10, atol=1e-13,
                                           err_msg=f"{key} {name}")


def _params(model_name):
    return {name: p.numpy().size for name, p in MODELS[model_name][0]().named_parameters()}


def test_bytes_counted_equal_the_cost_model(job):
    ranks, outputs = job
    B, item = 8, 8                                   # the cnn batch, float64
    conv = [("gathered", (1, 8, 8), (8, 8, 8), True), ("gathered", (8, 8, 8), (8, 8, 8), True)]
    paired = [("split", (1, 8, 8), (8, 8, 8), True), ("input_channel", (8, 8, 8), (8, 8, 8), True)]
    p = _params("cnn")
    spatial_convs = [(1, 8, 1, p["0.weight"] + p["0.bias"], True), (8, 8, 1, p["2.weight"] + p["2.bias"], True)]
    for rank, (_, traffic) in enumerate(outputs):
        assert traffic["cnn/filter_gathered"] == cost_model.filter_parallel_step_payloads(ranks, B, conv, item)
        assert traffic["cnn/filter_paired"] == cost_model.filter_parallel_step_payloads(ranks, B, paired, item)
        assert traffic["cnn/spatial"] == cost_model.spatial_step_payloads(
            rank, ranks, B, spatial_convs, gathered_map=(8, 8, 8), image_map=(1, 8, 8), itemsize=item)
    # by hand, 2 ranks: the gathered filters hand in half of each 8 × 64-value map per image; an edge rank
    # sends one halo row of 8 values per channel and image, forward and back
    if ranks == 2:
        assert outputs[0][1]["cnn/filter_gathered"]["allgather"] == 2 * B * 4 * 64 * item
        assert outputs[0][1]["cnn/spatial"]["send"] == B * (1 + 8) * 8 * 2 * item


def test_halo_bytes_follow_the_halo_equation():
    assert cost_model.halo_bytes(batch=4, channels=3, width=10, halo=2, itemsize=4) == 2 * 4 * 3 * 10 * 4
    inner = cost_model.spatial_step_payloads(1, 4, 2, [(3, 5, 1, 7, False)], gathered_map=(3, 8, 5))
    edge = cost_model.spatial_step_payloads(0, 4, 2, [(3, 5, 1, 7, False)], gathered_map=(3, 8, 5))
    assert inner["send"] == 2 * edge["send"] == 2 * 1 * 2 * 3 * 5 * 4
    assert inner["allgather"] == 2 * 3 * 2 * 5 * 4 and inner["allreduce"] == 7 * 4
    alone = cost_model.spatial_step_payloads(0, 1, 2, [(3, 5, 1, 7, True)], gathered_map=(3, 8, 5))
    assert "send" not in alone and "recv" not in alone


def _plain_training(clip, with_optimizer=False):
    model = S.cnn()
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    trainer = Trainer(model, opt, S.train_batches(), metrics=None, progress=False, max_grad_norm=clip)
    trainer.fit(1)
    if with_optimizer:
        return model.state_dict(), opt.state_dict()
    return model.state_dict(), np.asarray(trainer.steps["loss"])


def test_training_with_the_trainer_equals_one_process(job):
    _, outputs = job
    for scheme, clip in (("filter_paired", S.CLIP), ("spatial", None)):
        want_state, want_losses = _plain_training(clip)
        for arrays, _ in outputs:
            np.testing.assert_allclose(arrays[f"train/{scheme}/loss"], want_losses, rtol=1e-10, err_msg=scheme)
            for name, want in want_state.items():
                np.testing.assert_allclose(arrays[f"train/{scheme}/{name}"], np.asarray(want), rtol=1e-9,
                                           atol=1e-12, err_msg=f"{scheme} {name}")


def test_a_checkpoint_of_the_filter_split_is_one_process_state_and_loads_back(job):
    """The consolidated weights and momentum buffers equal the plain run's, parameter by parameter at the
    plain optimizer's positions; loaded into a fresh split model and gathered again, they come back whole."""
    _, outputs = job
    want_state, want_opt = _plain_training(S.CLIP, with_optimizer=True)
    for arrays, _ in outputs:
        for name, want in want_state.items():
            np.testing.assert_allclose(arrays[f"resumed/filter_paired/{name}"], np.asarray(want), rtol=1e-9,
                                       atol=1e-12, err_msg=name)
        assert len(want_opt["state"]) == len(want_state) == 8
        for position, entry in want_opt["state"].items():
            np.testing.assert_allclose(arrays[f"resumed/filter_paired/momentum/{position}"],
                                       np.asarray(entry["b"]), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("scheme", ["filter_parallel", "spatial"])
def test_the_benchmark_script_reports_one_process_losses_and_the_predicted_bytes(scheme, tmp_path):
    """benchmarks/schemes/<scheme>.py on 2 ranks: the losses of the same script run alone (a world of one), and
    the payloads counted per step equal to those the cost model predicts."""
    script = os.path.join(HERE, "..", "..", "benchmarks", "schemes", f"{scheme}.py")
    result = launch.run(2, [script, "--steps", "3", "--out", str(tmp_path / "two.json")], timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    alone = subprocess.run([sys.executable, script, "--steps", "3", "--out", str(tmp_path / "one.json")],
                           capture_output=True, text=True, timeout=300)
    assert alone.returncode == 0, alone.stderr[-4000:]
    two, one = (json.loads((tmp_path / name).read_text()) for name in ("two.json", "one.json"))
    assert len(two["loss"]) == 3 and two["ranks"] == 2
    np.testing.assert_allclose(two["loss"], one["loss"], rtol=1e-5)
    assert two["payloads_per_step"] == two["predicted_payloads_per_step"]
    assert two["bytes_per_step"] == sum(two["payloads_per_step"].values()) > 0
