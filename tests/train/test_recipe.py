"""The recipe that builds a run (minidl.train.recipe): settings -> model, optimizer, schedule, loaders, Trainer."""
import math

import numpy as np
import pytest

from minidl import optim
from minidl.data import TensorDataset
from minidl.train import recipe
from minidl.train.classifiers import build_model
from minidl.train.trainer import seed_everything


def _blobs(n=96, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    x = (np.eye(3)[y] * 3 + rng.standard_normal((n, 3))).astype(np.float32)
    return TensorDataset(x[:64], y[:64]), TensorDataset(x[64:], y[64:])


def _settings(**changes):
    return {**recipe.DEFAULTS, "batch_size": 16, "epochs": 3, **changes}


def _model():
    return build_model("mlp", (3,), 3)


def test_the_learning_rate_is_resolved_once_and_shared_by_optimizer_and_schedule():
    train, val = _blobs()
    run = recipe.build_run(_settings(optimizer="adam", lr=None, schedule="cosine"), train, val, model=_model)
    assert run.lr == 1e-3  # Adam's own default, not the 0.05 of an optimizer without one
    assert all(g["lr"] == run.lr for g in run.optimizer.param_groups)
    # 64 samples in batches of 16: 4 steps an epoch, 3 epochs: the cosine spans 12 steps, from lr down to 0
    assert run.total_steps == 12
    assert run.schedule(0) == pytest.approx(run.lr)
    assert run.schedule(6) == pytest.approx(run.lr / 2)
    assert run.schedule(12) == pytest.approx(0.0, abs=1e-15)


def test_resolve_lr():
    assert recipe.resolve_lr("sgdm", None) == 0.05  # SGDM's lr has no default
    assert recipe.resolve_lr("sgd", None) == 1e-3    # SGD's default, as PyTorch's
    assert recipe.resolve_lr("nadam", None) == 2e-3
    assert recipe.resolve_lr("adam", 0.3) == 0.3
    with pytest.raises(ValueError, match="unknown optimizer 'adamx'; choose one of"):
        recipe.resolve_lr("adamx", None)


def test_accumulation_and_an_epoch_horizon_set_the_schedule_length():
    train, val = _blobs()
    run = recipe.build_run(_settings(accumulate=3, schedule="constant"), train, val, model=_model, epochs=5)
    assert run.total_steps == math.ceil(4 / 3) * 5
    assert run.schedule is None  # constant: the optimizer's rate as it is


def test_the_seed_gives_the_model_that_seeding_and_building_by_hand_gives():
    train, val = _blobs()
    run = recipe.build_run(_settings(seed=7), train, val, model=_model)
    seed_everything(7)
    by_hand = _model()
    for (name, a), (_, b) in zip(run.model.state_dict().items(), by_hand.state_dict().items()):
        np.testing.assert_array_equal(a, b, err_msg=name)


def test_parameter_groups_and_options_reach_the_optimizer():
    train, val = _blobs()

    def groups(model):
        weights = [p for name, p in model.named_parameters() if name.endswith("weight")]
        others = [p for name, p in model.named_parameters() if not name.endswith("weight")]
        return [{"params": weights, "weight_decay": 0.1}, {"params": others, "weight_decay": 0.0}]

    run = recipe.build_run(_settings(lr=0.02), train, val, model=_model, params=groups, optimizer="adamw",
                           optimizer_options={"betas": (0.8, 0.95)})
    assert isinstance(run.optimizer, optim.AdamW)
    assert [g["weight_decay"] for g in run.optimizer.param_groups] == [0.1, 0.0]
    assert all(g["betas"] == (0.8, 0.95) and g["lr"] == 0.02 for g in run.optimizer.param_groups)
    counted = sum(len(g["params"]) for g in run.optimizer.param_groups)
    assert counted == len(list(run.model.parameters()))


def test_the_trainer_takes_the_settings_and_then_the_options():
    train, val = _blobs()
    run = recipe.build_run(_settings(clip_norm=0.5, accumulate=2, label_smoothing=0.1), train, val, model=_model)
    trainer = run.trainer(progress=False, label_smoothing=0.2)
    assert (trainer.max_grad_norm, trainer.accumulation_steps, trainer.label_smoothing) == (0.5, 2, 0.2)
    assert trainer.optimizer is run.optimizer and trainer.model is run.model


def test_an_unknown_schedule_fails_before_training():
    train, val = _blobs()
    with pytest.raises(ValueError, match="unknown schedule 'linear'"):
        recipe.build_run(_settings(schedule="linear"), train, val, model=_model)


def test_minidl_gpt_builds_its_run_through_the_recipe():
    from minidl import nn
    from minidl.models import gpt_train
    s = dict(gpt_train.DEFAULTS, n_layer=1, n_head=2, n_embd=16, block_size=16, steps=40, warmup=4, lr=2e-3)
    run, tok = gpt_train.build_run(s)
    assert isinstance(run, recipe.Run) and run.lr == 2e-3 and run.total_steps == 40
    decayed = {id(m.weight) for m in run.model.modules() if isinstance(m, nn.Linear)}
    first, second = run.optimizer.param_groups
    assert {id(p) for p in first["params"]} == decayed and first["weight_decay"] == s["weight_decay"]
    assert second["weight_decay"] == 0.0 and first["betas"] == tuple(s["betas"])
    expected = gpt_train.lr_schedule(2e-3, s["min_lr"], s["warmup"], 40)
    assert [run.schedule(t) for t in (0, 3, 20, 39)] == [expected(t) for t in (0, 3, 20, 39)]
    assert run.schedule(39) == pytest.approx(s["min_lr"])


def test_each_zero_stage_wraps_the_run_as_its_class_and_trains_as_plain_data_parallelism():
    # A world of one (LocalComm): the wrappings are those of the stage; each trains the same weights
    # as zero=0, since its sharded step is the same arithmetic (MPI ranks: tests/parallel/test_cli_data_parallel.py)
    from minidl import parallel
    train, val = _blobs()
    final = {}
    for zero, model_class, inner in ((0, parallel.DataParallel, optim.Adam),
                                     (1, parallel.DataParallel, parallel.ZeroRedundancyOptimizer),
                                     (2, parallel.ShardedDataParallel, optim.Adam),
                                     (3, parallel.ShardedDataParallel, optim.Adam)):
        run = recipe.build_run(_settings(epochs=2), train, val, model=_model, comm=parallel.LocalComm(), zero=zero)
        assert type(run.model) is model_class and type(run.optimizer.optimizer) is inner
        assert getattr(run.model, "stage", zero) == zero
        run.trainer(progress=False).fit(2)
        if zero >= 2:
            run.model.gather_parameters()
        final[zero] = {k: np.array(v) for k, v in run.model.state_dict().items()}
    for zero in (1, 2, 3):
        assert list(final[zero]) == list(final[0])
        for key in final[0]:
            np.testing.assert_allclose(final[zero][key], final[0][key], rtol=0, atol=1e-6, err_msg=f"{zero} {key}")


def test_a_zero_stage_is_refused_without_ranks_out_of_range_or_with_parameter_groups():
    from minidl import parallel
    train, val = _blobs()
    with pytest.raises(ValueError, match="ZeRO stage 2 shards across data-parallel ranks; give comm"):
        recipe.build_run(_settings(), train, val, model=_model, zero=2)
    with pytest.raises(ValueError, match="zero must be a ZeRO stage 0, 1, 2 or 3, got 4"):
        recipe.build_run(_settings(), train, val, model=_model, comm=parallel.LocalComm(), zero=4)
    with pytest.raises(ValueError, match="ZeRO stage 3 optimizes flat shards .* takes no parameter groups"):
        recipe.build_run(_settings(), train, val, model=_model, comm=parallel.LocalComm(), zero=3,
                         params=lambda net: [{"params": list(net.parameters())}])
