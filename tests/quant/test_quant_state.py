"""Quantized state on load: impossible scales and zero points are refused; a QAT model's observed range is saved."""
import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from minidl import nn, optim, quant
from minidl.nn.module import StateDictError
from minidl.quant.layers import QuantizedLinear


def _int8_mlp():
    mdl.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    x = np.random.default_rng(1).standard_normal((32, 6)).astype(np.float32)
    return quant.quantize_model(model, x), x


@pytest.mark.parametrize("key,value,problem", [
    ("0.input_scale", np.float32(np.nan), "scales must be finite and positive, got nan"),
    ("0.input_scale", np.float32(0), "scales must be finite and positive, got 0\n"),
    ("2.weight_scale", np.full(3, -0.1, np.float32), r"scales must be finite and positive, got -0.1 \(and 2 more\)"),
    ("2.weight_scale", np.array([0.1, np.inf, 0.1], np.float32), "scales must be finite and positive, got inf"),
    ("0.input_zero_point", np.int64(100_000),
     "the zero point must be an integer code of uint8, from 0 to 255; got 100000"),
    ("0.input_zero_point", np.int64(-1), "the zero point must be .* from 0 to 255; got -1"),
])
def test_impossible_quantization_parameters_in_a_file_are_refused_naming_the_layer(tmp_path, key, value, problem):
    int8, x = _int8_mlp()
    state = int8.state_dict()
    state[key] = value
    mdl.save(state, tmp_path / "damaged.safetensors")
    target, _ = _int8_mlp()
    with mdl.no_grad():
        before = target(x).numpy()
    # before: loaded without a word, then gave finite wrong outputs
    with pytest.raises(StateDictError, match=rf"unusable key {key}: QuantizedLinear '{key[0]}': {problem}"):
        target.load_state_dict(mdl.load(tmp_path / "damaged.safetensors"))
    with mdl.no_grad():
        np.testing.assert_array_equal(target(x).numpy(), before)   # nothing was copied


def test_a_valid_int8_state_loads_and_gives_the_same_outputs(tmp_path):
    int8, x = _int8_mlp()
    mdl.save(int8.state_dict(), tmp_path / "int8.safetensors")
    other = quant.quantize_model(nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)), x)
    other.load_state_dict(mdl.load(tmp_path / "int8.safetensors"))
    with mdl.no_grad():
        np.testing.assert_array_equal(other(x).numpy(), int8(x).numpy())


def test_an_int8_layer_built_with_impossible_parameters_is_refused():
    w = np.ones((2, 3), np.float32)
    with pytest.raises(ValueError, match="QuantizedLinear: input_scale: scales must be finite and positive, got nan"):
        QuantizedLinear(w, None, np.nan, 0)
    with pytest.raises(ValueError, match="QuantizedLinear: input_zero_point: .* from 0 to 255; got 300"):
        QuantizedLinear(w, None, 0.1, 300)


# ---------------------------------------------------------------- QAT: the observed range is state
def _trained_qat(steps=5):
    mdl.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((32, 6)).astype(np.float32), rng.integers(0, 3, 32)
    qat = quant.prepare_qat(model)
    opt = optim.SGD(qat.parameters(), lr=0.1)
    for _ in range(steps):
        loss = F.cross_entropy(qat(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return qat, x


def test_the_observed_ranges_are_in_the_state_dict_as_pytorch_keeps_its_observers(torch):
    qat, x = _trained_qat()
    state = qat.state_dict()
    assert {"0.input_min", "0.input_max", "0.observed_batches", "2.input_min"} <= set(state)
    # the moving average of the batch minima and maxima, by hand: the first batch as it is, then c = 0.01
    assert int(state["0.observed_batches"]) == 5
    assert float(state["0.input_min"]) == pytest.approx(x.min())
    assert float(state["0.input_max"]) == pytest.approx(x.max())
    # PyTorch's QAT model keeps its observers' min_val and max_val in the state dict too
    tq = torch.ao.quantization
    reference = torch.nn.Sequential(tq.QuantStub(), torch.nn.Linear(6, 8), tq.DeQuantStub())
    reference.qconfig = tq.get_default_qat_qconfig("fbgemm")
    prepared = tq.prepare_qat(reference.train())
    assert any(k.endswith("activation_post_process.min_val") for k in prepared.state_dict())


def test_a_loaded_qat_model_evaluates_and_converts_as_the_saved_one(tmp_path):
    qat, x = _trained_qat()
    mdl.save(qat.state_dict(), tmp_path / "qat.safetensors")
    fresh = quant.prepare_qat(nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)))
    fresh.load_state_dict(mdl.load(tmp_path / "qat.safetensors"))
    qat.eval()
    fresh.eval()
    with mdl.no_grad():   # before: "FakeQuantLinear... no data observed" on both lines
        np.testing.assert_array_equal(fresh(x).numpy(), qat(x).numpy())
        np.testing.assert_array_equal(quant.convert(fresh)(x).numpy(), quant.convert(qat)(x).numpy())


def test_training_resumes_the_moving_average_from_the_loaded_range():
    qat, x = _trained_qat(steps=3)
    fresh = quant.prepare_qat(nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)))
    fresh.load_state_dict(qat.state_dict())
    batch = 3 * x
    qat(batch)
    fresh(batch)
    # min ← min + 0.01 (batch_min − min): one step of the average on both, from the same range
    expected = x.min() + 0.01 * (batch.min() - x.min())
    assert float(fresh[0].input_min.numpy()) == pytest.approx(expected)
    assert float(fresh[0].input_min.numpy()) == float(qat[0].input_min.numpy())
    assert int(fresh[0].observed_batches.numpy()) == 4


def test_a_damaged_observed_range_is_refused():
    qat, _ = _trained_qat(steps=1)
    state = qat.state_dict()
    state["0.input_min"], state["0.input_max"] = np.float64(2.0), np.float64(1.0)
    with pytest.raises(StateDictError, match=r"0.input_min: FakeQuantLinear '0': the observed input range must be "
                                             r"finite with min <= max"):
        quant.prepare_qat(nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))).load_state_dict(state)
