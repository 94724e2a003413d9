"""minidl.compile: a traced step equals the eager step bit for bit, prints as Python, and refuses
what a replay cannot follow."""
import ast
import re

import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from minidl import nn, optim
from minidl.models.gpt import GPT, GPTConfig
from minidl.tracing import TraceError


def _twins(build):
    """Two copies of one model and step (same seed): one run eagerly, one traced."""
    eager_model, eager_step = build()
    traced_model, traced_step = build()
    return eager_model, eager_step, traced_model, mdl.compile(traced_step)


def _assert_same_run(build, batches, seeds=None):
    """Step both copies over ``batches``; the losses, the gradients and the parameters agree bit for bit
    after every step, and the traced copy replays (no recording) after its first two calls."""
    eager_model, eager_step, traced_model, traced = _twins(build)
    for i, batch in enumerate(batches):
        if seeds is not None:
            mdl.manual_seed(seeds[i])
        expected = eager_step(*batch)
        if seeds is not None:
            mdl.manual_seed(seeds[i])
        got = traced(*batch)
        np.testing.assert_array_equal(got.numpy(), expected.numpy())
        for p, q in zip(eager_model.parameters(), traced_model.parameters()):
            np.testing.assert_array_equal(q.numpy(), p.numpy())
            assert (p.grad is None) == (q.grad is None)
            if p.grad is not None:
                np.testing.assert_array_equal(q.grad.numpy(), p.grad.numpy())
    assert traced.recordings == 2, "calls after the second must replay the plan"
    return traced


# ---------------------------------------------------------------- the three programs
def _regression(device="cpu"):
    """pytorch/examples' regression: a linear model on [x, x², x³, x⁴], smooth L1 loss, SGD."""
    def build():
        mdl.manual_seed(0)
        fc = nn.Linear(4, 1).to(device)
        opt = optim.SGD(fc.parameters(), lr=0.1)

        def step(x, y):
            fc.zero_grad()
            loss = F.smooth_l1_loss(fc(x), y)
            loss.backward()
            opt.step()
            return loss
        return fc, step
    return build


def _poly_batches(n, device="cpu"):
    rng = np.random.default_rng(1)
    batches = []
    for _ in range(n):
        r = rng.standard_normal(32).astype(np.float32)
        x = np.stack([r ** i for i in range(1, 5)], axis=1)
        y = x @ np.array([[0.5], [-1.0], [2.0], [0.3]], np.float32) + 1.5
        batches.append((mdl.tensor(x, device=device), mdl.tensor(y, device=device)))
    return batches


def test_regression_traced_equals_eager():
    _assert_same_run(_regression(), _poly_batches(6))


def test_cnn_traced_equals_eager():
    def build():
        mdl.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Conv2d(4, 6, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(6 * 4 * 4, 10))
        opt = optim.Adam(model.parameters(), lr=1e-2)

        def step(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss
        return model, step
    rng = np.random.default_rng(2)
    batches = [(mdl.tensor(rng.standard_normal((8, 1, 8, 8)).astype(np.float32)), mdl.tensor(rng.integers(0, 10, 8)))
               for _ in range(5)]
    _assert_same_run(build, batches)


def test_gpt_with_dropout_traced_equals_eager():
    """The GPT of minidl.models, dropout on: the replay draws the same masks as the eager step
    from the generator (same seed before each step)."""
    def build():
        mdl.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16, dropout=0.1))
        opt = optim.AdamW(model.parameters(), lr=1e-2)

        def step(idx, targets):
            opt.zero_grad()
            logits = model(idx)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
            loss.backward()
            opt.step()
            return loss
        return model, step
    rng = np.random.default_rng(3)
    batches = [(mdl.tensor(rng.integers(0, 11, (3, 8))), mdl.tensor(rng.integers(0, 11, (3, 8)))) for _ in range(5)]
    _assert_same_run(build, batches, seeds=[10, 11, 12, 13, 14])


def test_cross_entropy_with_ignored_samples_and_weights_traced_equals_eager():
    """The target distribution and the weighted mean's denominator are ops of the targets: each
    batch's own, not the first batch's."""
    def build():
        mdl.manual_seed(0)
        fc = nn.Linear(5, 4)
        opt = optim.SGD(fc.parameters(), lr=0.5)

        def step(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(fc(x), y, weight=np.array([0.5, 1.0, 2.0, 1.5], np.float32),
                                   ignore_index=3, label_smoothing=0.1)
            loss.backward()
            opt.step()
            return loss
        return fc, step
    rng = np.random.default_rng(4)
    batches = [(mdl.tensor(rng.standard_normal((6, 5)).astype(np.float32)),
                mdl.tensor(np.array([0, 3, 1, 2, 3, 1]) if i % 2 else np.array([3, 0, 2, 2, 1, 3])))
               for i in range(5)]
    _assert_same_run(build, batches)


def test_gradients_accumulate_over_calls_as_eagerly():
    """A step without zero_grad adds to .grad (gradient accumulation); the replay adds alike."""
    def build():
        mdl.manual_seed(0)
        fc = nn.Linear(4, 1)

        def step(x, y):
            loss = F.mse_loss(fc(x), y)
            loss.backward()
            return loss
        return fc, step
    eager_model, eager_step, traced_model, traced = _twins(build)
    for x, y in _poly_batches(6):
        np.testing.assert_array_equal(traced(x, y).numpy(), eager_step(x, y).numpy())
    for p, q in zip(eager_model.parameters(), traced_model.parameters()):
        np.testing.assert_array_equal(q.grad.numpy(), p.grad.numpy())
    assert traced.recordings == 3  # the first call met empty .grad, the others full: two guards' worth


def test_a_new_shape_records_again_and_still_equals_eager():
    build = _regression()
    eager_model, eager_step, traced_model, traced = _twins(build)
    batches = _poly_batches(4)
    rng = np.random.default_rng(5)
    small = [(mdl.tensor(rng.standard_normal((7, 4)).astype(np.float32)),
              mdl.tensor(rng.standard_normal((7, 1)).astype(np.float32))) for _ in range(3)]
    for x, y in batches + small + batches:
        np.testing.assert_array_equal(traced(x, y).numpy(), eager_step(x, y).numpy())
    for p, q in zip(eager_model.parameters(), traced_model.parameters()):
        np.testing.assert_array_equal(q.numpy(), p.numpy())
    assert traced.recordings == 4  # two per guard: batch 32, then batch 7; batch 32 again replays


def test_the_plan_prints_as_valid_python_naming_its_ops():
    traced = _assert_same_run(_regression(), _poly_batches(4))
    code = traced.plan()
    tree = ast.parse(code)
    assert isinstance(tree.body[0], ast.FunctionDef) and tree.body[0].name == "traced_step"
    for op in ("SmoothL1Loss", "SmoothL1LossGrad"):  # no lowering: the op's own forward
        assert re.search(rf"= ops\[\d+\]\.forward\(.*\)  # {op}[(:]", code), op
    for op in ("Linear", "LinearGradWeight", "Sum"):  # lowered: inline NumPy
        assert re.search(rf"np\.(matmul|sum)\(.*\)  # {op}[(:]", code), op
    assert "optimizers[0].step()" in code and "leaves[0].grad = Tensor(" in code
    assert code == traced.code


def test_the_traced_step_on_the_gpu_standin_equals_eager(standin):
    _assert_same_run(_regression("cuda"), _poly_batches(5, "cuda"))


# ---------------------------------------------------------------- refused, with the op named
def _step_on(body):
    w = mdl.tensor(np.array([1.0, -2.0, 3.0], np.float32), requires_grad=True)

    @mdl.compile
    def step(x):
        w.grad = None
        loss = body(w, x)
        loss.backward()
        return loss
    return step


def _xs(*values):
    return [mdl.tensor(np.array(v, np.float32)) for v in values]


def test_item_in_the_step_is_refused():
    def body(w, x):
        loss = (w * x).sum()
        if loss.item() > 0:
            return loss
        return -loss
    with pytest.raises(TraceError, match=r"item\(\)"):
        _step_on(body)(*_xs([1.0, 2.0, 3.0]))


def test_a_boolean_mask_is_refused_for_its_data_dependent_shape():
    with pytest.raises(TraceError, match="GetItem.*boolean mask"):
        _step_on(lambda w, x: (w * x)[x > 1].sum())(*_xs([1.0, 2.0, 3.0]))


def test_a_backward_building_arrays_with_raw_code_is_refused_by_name():
    with pytest.raises(TraceError, match="backward of Abs"):
        _step_on(lambda w, x: mdl.abs(w * x).sum())(*_xs([1.0, 2.0, 3.0]))


def test_a_value_computed_from_the_batch_outside_ops_is_found_by_the_second_recording():
    step = _step_on(lambda w, x: (w * mdl.Tensor(np.sign(x.array) * 2)).sum())
    step(*_xs([1.0, 2.0, 3.0]))
    with pytest.raises(TraceError, match="Mul reads a tensor"):
        step(*_xs([1.0, -2.0, 3.0]))


def test_a_gradient_changed_outside_ops_before_the_update_is_refused():
    """clip_grad_norm_ scales .grad in place on arrays: a replay would skip it, so recording refuses."""
    fc = nn.Linear(4, 1)
    opt = optim.SGD(fc.parameters(), lr=0.1)

    @mdl.compile
    def step(x, y):
        opt.zero_grad()
        loss = F.mse_loss(fc(x), y)
        loss.backward()
        nn.utils.clip_grad_norm_(fc.parameters(), 1e-3)
        opt.step()
        return loss
    x, y = _poly_batches(1)[0]
    with pytest.raises(TraceError, match=r"\.grad of a tensor of shape \(1, 4\) changed before SGD\.step\(\)"):
        step(x, y)


def test_an_in_place_change_in_the_step_is_refused():
    def body(w, x):
        h = w * x
        with mdl.no_grad():
            x += 1.0
        return (h * x).sum()
    with pytest.raises(TraceError, match="in place"):
        _step_on(body)(*_xs([1.0, 2.0, 3.0]))


def test_compile_takes_a_function():
    with pytest.raises(TypeError, match="compile: expected a function"):
        mdl.compile(3)


def test_masks_and_index_tensors_of_each_call_are_read():
    """where(x > 0, ...) and x[rows, cols] with index tensors that change per call: the comparison is an
    op and the index arrays are inputs, so the replay follows each call's values."""
    w = mdl.tensor(np.arange(12, dtype=np.float32).reshape(3, 4) / 7 - 0.5, requires_grad=True)

    def step(x, rows, cols):
        w.grad = None
        h = w * x
        loss = (mdl.where(h > 0, h, h * 0.1)[rows, cols] ** 2).sum()
        loss.backward()
        return loss
    traced = mdl.compile(step)
    rng = np.random.default_rng(6)
    for _ in range(5):
        x = mdl.tensor(rng.standard_normal((3, 4)).astype(np.float32))
        rows, cols = mdl.tensor(rng.integers(0, 3, 5)), mdl.tensor(rng.integers(0, 4, 5))
        got = traced(x, rows, cols).numpy()
        got_grad = w.grad.numpy().copy()
        expected = step(x, rows, cols).numpy()
        np.testing.assert_array_equal(got, expected)
        np.testing.assert_array_equal(got_grad, w.grad.numpy())
    assert traced.recordings == 2
