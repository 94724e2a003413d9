"""Population-based training: exploit copies weights and optimizer state by value, explore multiplies by the
factors given, a changed learning rate is the one the next steps use, and the search moves the bottom members
onto copies of the top ones."""
import numpy as np
import pytest

from minidl.tune import LogUniform, TrainerObjective, Uniform, exploit, explore, hyperparameter_schedule, pbt_search
from minidl.tune.pbt import set_hyperparameters


def objective(optimizer="adam", **kw):
    return TrainerObjective(data="digits", model="mlp", optimizer=optimizer, batch_size=128, seed=0, **kw)


def weights(trainer):
    return {k: np.array(v) for k, v in trainer.model.state_dict().items()}


def moments(trainer):
    return {pos: {k: np.array(v) for k, v in s.items()} for pos, s in trainer.optimizer.state_dict()["state"].items()}


def test_exploit_copies_the_weights_the_optimizer_state_and_the_counters():
    obj = objective()
    source, target = obj.build({"lr": 3e-3}, 3), obj.build({"lr": 1e-4}, 3)
    source.fit(2)
    target.fit(1)
    exploit(target, source)
    src_w, tgt_w = weights(source), weights(target)
    assert src_w.keys() == tgt_w.keys()
    for name in src_w:
        np.testing.assert_array_equal(tgt_w[name], src_w[name])
    src_m, tgt_m = moments(source), moments(target)
    assert src_m and src_m.keys() == tgt_m.keys()
    for pos in src_m:
        for key in src_m[pos]:
            np.testing.assert_array_equal(tgt_m[pos][key], src_m[pos][key])
    assert target.optimizer.param_groups[0]["lr"] == 3e-3
    assert (target.epoch, target.step) == (source.epoch, source.step)
    # copies, not shared arrays: training the source on leaves the target where it was
    source.fit(3)
    for name in src_w:
        np.testing.assert_array_equal(weights(target)[name], tgt_w[name])
    assert any(not np.array_equal(weights(source)[n], tgt_w[n]) for n in src_w)


def test_explore_multiplies_by_the_factors():
    space = {"lr": LogUniform(1e-4, 1.0), "weight_decay": Uniform(0.0, 1e-3), "batch_size": 64}
    config = {"lr": 0.01, "weight_decay": 5e-4, "batch_size": 64}
    rng, ref = np.random.default_rng(0), np.random.default_rng(0)
    ratios = set()
    for _ in range(100):
        out = explore(config, space, rng, factors=(0.8, 1.2), resample_probability=0.0)
        for name in ("lr", "weight_decay"):
            ref.random()  # explore draws the resampling coin first, then the factor
            factor = (0.8, 1.2)[int(ref.integers(2))]
            assert out[name] == pytest.approx(config[name] * factor, rel=1e-12)
            ratios.add(round(out[name] / config[name], 12))
        assert out["batch_size"] == 64
    assert ratios == {0.8, 1.2}


def test_explore_resamples_with_its_probability():
    space = {"lr": LogUniform(1e-4, 1.0)}
    rng, ref = np.random.default_rng(7), np.random.default_rng(7)
    out = explore({"lr": 0.5}, space, rng, resample_probability=1.0)
    ref.random()
    assert out["lr"] == space["lr"].sample(ref)


def test_a_learning_rate_changed_mid_run_is_the_one_used():
    """SGD, one run at lr 0.05 throughout, another started at 0.5 and set to 0.05 before its first step:
    the same weights after an epoch (the setting took effect, and nothing else kept the old rate)."""
    obj = objective("sgd")
    plain, changed = obj.build({"lr": 0.05}, 2), obj.build({"lr": 0.5}, 2)
    set_hyperparameters(changed, {"lr": 0.05})
    plain.fit(1)
    changed.fit(1)
    for name, w in weights(plain).items():
        np.testing.assert_array_equal(weights(changed)[name], w)
    # and mid-run: the recorded rate of every step of epoch 2 is the new one
    set_hyperparameters(changed, {"lr": 0.01})
    steps_before = len(changed.steps["lr"])
    changed.fit(2)
    assert set(changed.steps["lr"][steps_before:]) == {0.01}
    assert set(changed.steps["lr"][:steps_before]) == {0.05}


def test_pbt_moves_the_bottom_member_onto_the_top_one():
    """Two members, quantile 0.5, factor 1: after each interval the worse member continues the better's run
    exactly, so from then on both train the same weights on the same batches: equal losses to the last bit."""
    result = pbt_search(objective(), {"lr": LogUniform(1e-4, 1e-2)}, population_size=2, intervals=3,
                        epochs_per_interval=1, quantile=0.5, factors=(1.0,), resample_probability=0.0, seed=0)
    first = result.trials[:2]
    worse, better = sorted(first, key=lambda t: t.score)
    later = result.trials[2:4]
    assert later[worse.info["member"]].info["copied_from"] == better.info["member"]
    assert later[0].config == later[1].config == better.config
    assert later[0].info["train_loss"] == later[1].info["train_loss"]
    assert result.epochs_trained == 2 * 3


def test_pbt_search_schedule_and_budget():
    space = {"lr": LogUniform(1e-4, 0.3)}
    result = pbt_search(objective("sgd"), space, population_size=4, intervals=3, epochs_per_interval=1,
                        quantile=0.25, resample_probability=0.0, seed=1)
    assert result.epochs_trained == 4 * 3 and result.strategy == "pbt"
    assert [t.rung for t in result.trials] == [0] * 4 + [1] * 4 + [2] * 4
    for k in (0, 1):   # one member moves each time: the worst, onto the best, its lr times 0.8 or 1.2
        now, then = result.trials[4 * k:4 * k + 4], result.trials[4 * k + 4:4 * k + 8]
        worst = min(now, key=lambda t: (t.score, -t.info["member"]))
        best = max(now, key=lambda t: (t.score, -t.info["member"]))
        moved = [t for t in then if t.info["copied_from"] is not None]
        assert [t.info["member"] for t in moved] == [worst.info["member"]]
        assert moved[0].info["copied_from"] == best.info["member"]
        ratio = moved[0].config["lr"] / best.config["lr"]
        assert min(abs(ratio - 0.8), abs(ratio - 1.2)) < 1e-12
    schedule = hyperparameter_schedule(result)
    assert sorted(schedule) == [0, 1, 2, 3]
    for member, steps in schedule.items():
        assert steps[0][0] == 0 and [s for s, _ in steps] == sorted(s for s, _ in steps)
        assert steps[-1][1] == result.trials[8 + member].config


@pytest.mark.parametrize("space, kwargs, match", [
    ({"batch_size": LogUniform(16, 128)}, {}, "cannot change"),
    ({"lr": LogUniform(1e-3, 1.0)}, {"quantile": 0.7}, "quantile"),
    ({"lr": LogUniform(1e-3, 1.0)}, {"population_size": 1}, "population_size"),
])
def test_bad_settings_are_refused(space, kwargs, match):
    args = {"population_size": 4, "intervals": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        pbt_search(objective(), space, **args)


def test_a_learning_rate_schedule_or_a_plain_function_is_refused():
    with pytest.raises(ValueError, match="schedule='constant'"):
        pbt_search(objective(schedule="cosine"), {"lr": LogUniform(1e-3, 1.0)}, 4, 2)
    with pytest.raises(TypeError, match="build"):
        pbt_search(lambda config, epochs: 0.0, {"lr": LogUniform(1e-3, 1.0)}, 4, 2)
