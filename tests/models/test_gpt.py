"""The GPT model, its data, its recipe and the ``minidl gpt`` command.

The model is checked against the same architecture in PyTorch with copied
weights (logits and every gradient), and against properties any causal
language model must have (position t never sees t+1). The recipe is checked
part by part (decay groups, schedule), then end to end on a tiny model:
the loss goes down, and a stopped and resumed run ends bit for bit where the
uninterrupted one does.
"""
import hashlib
import math
import os

import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from minidl.data.text import SHAKESPEARE_PATH, CharTokenizer, next_token_windows, shakespeare, split_ids
from minidl.models import GPT, GPTConfig, composed_attention
from minidl.models.gpt_train import DEFAULTS, decay_groups, lm_loss, load_run, lr_schedule, train

TINY = dict(DEFAULTS, n_layer=2, n_head=2, n_embd=16, block_size=16, batch_size=4, steps=6, warmup=2,
            eval_every=3, val_windows=8, sample_every=0)


def small_config(**kw):
    return GPTConfig(**{**dict(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8), **kw})


def test_gpt_matches_torch_logits_and_gradients():
    torch = pytest.importorskip("torch")
    from minidl.models.torch_gpt import from_minidl, torch_gpt
    cfg = small_config()
    model = GPT(cfg).double()
    theirs = torch_gpt(cfg).double()
    assert list(theirs.state_dict()) == list(model.state_dict())
    theirs.load_state_dict(from_minidl(model.state_dict()))
    rng = np.random.default_rng(0)
    idx, targets = rng.integers(0, 11, (3, 8)), rng.integers(0, 11, (3, 8))
    logits = model(idx)
    loss = lm_loss(logits, mdl.tensor(targets))
    loss.backward()
    logits_t = theirs(torch.tensor(idx))
    loss_t = torch.nn.functional.cross_entropy(logits_t.reshape(-1, 11), torch.tensor(targets).reshape(-1))
    loss_t.backward()
    assert logits.shape == (3, 8, 11)
    np.testing.assert_allclose(logits.numpy(), logits_t.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(loss.item(), loss_t.item(), rtol=1e-12)
    grads_t = dict(theirs.named_parameters())
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), grads_t[name].grad.numpy(), rtol=1e-8, atol=1e-12,
                                   err_msg=name)


def test_the_teaching_attention_equals_the_one_op_attention_with_gradients():
    rng = np.random.default_rng(9)
    q, k, v = (mdl.tensor(rng.standard_normal((2, 3, 5, 4)), requires_grad=True) for _ in range(3))
    causal = np.where(np.tril(np.ones((5, 5), dtype=bool)), 0.0, -np.inf)
    g = mdl.tensor(rng.standard_normal((2, 3, 5, 4)))
    ours = composed_attention(q, k, v, mdl.tensor(causal))
    grads = mdl.grad([ours], [q, k, v], grad_outputs=[g])
    op = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    grads_op = mdl.grad([op], [q, k, v], grad_outputs=[g])
    np.testing.assert_allclose(ours.numpy(), op.numpy(), rtol=1e-12, atol=1e-14)
    for a, b in zip(grads, grads_op):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-11, atol=1e-13)
    assert mdl.gradcheck(lambda q, k, v: composed_attention(q, k, v, mdl.tensor(causal)), [q, k, v])


def test_position_t_does_not_see_later_tokens():
    model = GPT(small_config()).double()
    idx = np.random.default_rng(1).integers(0, 11, (1, 8))
    changed = idx.copy()
    changed[0, 5] = (idx[0, 5] + 1) % 11
    a, b = model(idx).numpy(), model(changed).numpy()
    np.testing.assert_array_equal(a[:, :5], b[:, :5])
    assert not np.allclose(a[:, 5:], b[:, 5:])


def test_output_layer_is_the_token_embedding():
    model = GPT(small_config()).double()
    names = [n for n, _ in model.named_parameters()]
    assert not any("head" in n for n in names)  # no second (vocab, C) matrix
    x = model.ln_f(model.tok_emb(np.array([[3]])) + model.pos_emb(np.array([0])))
    # one token through no blocks: the logits are the token's row dotted with every embedding row
    empty = GPT(small_config(n_layer=0)).double()
    empty.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("blocks")})
    want = x.numpy()[0] @ model.tok_emb.weight.numpy().T
    np.testing.assert_allclose(empty(np.array([[3]])).numpy()[0], want, rtol=1e-12)


def test_gpt2_initialization_scales_the_residual_projections():
    mdl.manual_seed(0)
    n_layer = 8
    model = GPT(GPTConfig(vocab_size=50, block_size=32, n_layer=n_layer, n_head=4, n_embd=128))
    stds = {n: p.numpy().std() for n, p in model.named_parameters()}
    expected = 0.02 / math.sqrt(2 * n_layer)
    for name, std in stds.items():
        if name.endswith("proj.weight"):
            assert abs(std - expected) < 0.1 * expected, name
        elif name.endswith(("qkv.weight", "fc.weight", "emb.weight")):
            assert abs(std - 0.02) < 0.1 * 0.02, name
        elif name.endswith("bias") and ".ln" not in name and not name.startswith("ln"):
            assert std == 0, name
    assert np.all(model.blocks[0].ln1.weight.numpy() == 1)


def test_checkpointed_blocks_give_the_same_gradients():
    cfg = small_config(dropout=0.1)
    plain, ckpt = GPT(cfg).double(), GPT(cfg, checkpoint_blocks=True).double()
    ckpt.load_state_dict(plain.state_dict())
    idx = np.random.default_rng(2).integers(0, 11, (2, 8))
    y = mdl.tensor(np.random.default_rng(3).integers(0, 11, (2, 8)))
    for model in (plain, ckpt):
        mdl.manual_seed(5)  # the same dropout masks; checkpoint replays them in the recomputation
        lm_loss(model(idx), y).backward()
    for (name, a), (_, b) in zip(plain.named_parameters(), ckpt.named_parameters()):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-12, atol=1e-15, err_msg=name)


def test_generate_extends_and_respects_top_k():
    model = GPT(small_config())
    out = model.generate(np.array([[1, 2]]), 10, temperature=0.5, top_k=1, generator=np.random.default_rng(0))
    assert out.shape == (1, 12) and list(out[0, :2]) == [1, 2]
    greedy = [1, 2]
    for _ in range(10):  # top_k=1 is greedy decoding
        greedy.append(int(model(np.array([greedy[-8:]])).numpy()[0, -1].argmax()))
    assert out[0].tolist() == greedy
    with pytest.raises(ValueError, match="temperature"):
        model.generate(np.array([[1]]), 1, temperature=0)
    with pytest.raises(ValueError, match="longer than block_size"):
        model(np.zeros((1, 9), dtype=np.int64))


def test_bundled_text_and_tokenizer():
    text = shakespeare()
    with open(SHAKESPEARE_PATH, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    assert digest == "23d607c9292db1da074ea4503916f89b21e2ba9cdffbf82ccd204e6d3169e68c"
    assert os.path.isfile(os.path.join(os.path.dirname(SHAKESPEARE_PATH), "SHAKESPEARE_LICENSE.txt"))
    assert os.path.getsize(SHAKESPEARE_PATH) <= 2 * 2**20
    tok = CharTokenizer.from_text(text)
    assert tok.vocab_size == 66
    ids = tok.encode("ROMEO:\nO, she doth teach the torches to burn bright!")
    assert ids.dtype == np.int64 and tok.decode(ids) == "ROMEO:\nO, she doth teach the torches to burn bright!"
    assert CharTokenizer.from_state_dict(tok.state_dict()).chars == tok.chars
    with pytest.raises(ValueError, match="'é' is not in the vocabulary"):
        tok.encode("café")
    train_ids, val_ids = split_ids(np.arange(100), 0.1)
    assert train_ids[-1] == 89 and val_ids[0] == 90
    x, y = next_token_windows(np.arange(20), 4)
    np.testing.assert_array_equal(y, x + 1)
    assert x[1, 0] == 4 and len(next_token_windows(np.arange(1000), 4, limit=7)[0]) == 7


def test_weight_decay_only_on_linear_weights():
    model = GPT(small_config())
    decay, no_decay = decay_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    assert sorted(names[id(p)].split(".")[-2] for p in decay["params"]) == sorted(["fc", "proj", "proj", "qkv"] * 2)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(names[id(p)].endswith(("bias", "emb.weight")) or ".ln" in names[id(p)] or
               names[id(p)].startswith("ln") for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(names)


def test_schedule_warms_up_then_follows_a_cosine():
    f = lr_schedule(1e-3, 1e-4, warmup=10, steps=100)
    assert f(0) == pytest.approx(1e-3 / 20)
    assert f(5) == pytest.approx(1e-3 * (1 / 20 + 19 / 20 * 5 / 10))  # the ramp
    assert f(10) == pytest.approx(1e-3)                                # the peak, where the cosine starts
    assert f(50) == pytest.approx(1e-4 + 0.9e-3 * (1 + math.cos(math.pi * 40 / 89)) / 2)
    assert f(99) == pytest.approx(1e-4, rel=1e-12)                     # min_lr exactly at the last step


def test_training_lowers_the_loss_and_writes_a_run(tmp_path):
    s = dict(TINY, steps=30, eval_every=10, lr=1e-2)
    result = train(s, str(tmp_path), show=False)
    history = result["trainer"].history
    assert history[0]["val_loss"] > history[-1]["val_loss"]
    assert result["val_loss"] < math.log(66) - 0.5  # well below a uniform guess over 66 characters
    for name in ("gpt.safetensors", "last.safetensors", "loss.png", "metrics.jsonl"):
        assert (tmp_path / name).is_file()
    model, tok = load_run(str(tmp_path))
    trained = result["trainer"].model
    for (_, a), (_, b) in zip(model.named_parameters(), trained.named_parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    text = tok.decode(model.generate(tok.encode("\n")[None], 20, generator=np.random.default_rng(0))[0])
    assert len(text) == 21


def test_a_resumed_run_ends_bit_for_bit_where_the_uninterrupted_one_does(tmp_path):
    s = dict(TINY, steps=6, eval_every=3, dropout=0.1, accumulate=2)
    straight = train(s, str(tmp_path / "a"), show=False)["trainer"].model
    train(s, str(tmp_path / "b"), show=False, stop_after=3)  # killed after step 3 (its checkpoint)
    continued = train(s, str(tmp_path / "b"), resume=str(tmp_path / "b" / "last.safetensors"), show=False)
    assert continued["trainer"].step == 6
    for (name, a), (_, b) in zip(straight.named_parameters(), continued["trainer"].model.named_parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=name)


def test_the_command_trains_and_samples(tmp_path, capsys):
    from minidl.cli import main
    out = str(tmp_path / "run")
    args = ["gpt", "train", "--steps", "4", "--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size",
            "16", "--batch-size", "4", "--eval-every", "2", "--warmup", "1", "--out", out, "--quiet"]
    assert main(args) == 0
    assert "validation loss" in capsys.readouterr().out
    assert main(["gpt", "sample", "--run", out, "--prompt", "ROMEO:", "--tokens", "30", "--top-k", "5",
                 "--temperature", "0.7"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("ROMEO:") and len(printed.rstrip("\n")) >= 36
    # resuming to more steps continues from step 4
    assert main(["gpt", "train", "--resume", os.path.join(out, "last.safetensors"), "--steps", "6", "--quiet"]) == 0
    assert "after 6 steps" in capsys.readouterr().out
    assert main(["gpt", "sample", "--run", str(tmp_path / "nothing")]) == 1
    assert main(["gpt", "train", "--resume", str(tmp_path / "nothing.safetensors")]) == 1


def test_gpt_trains_in_mixed_precision(tmp_path):
    """amp="bf16" (``--amp bf16``): the same recipe, its matrix products rounded to bfloat16 (8-bit
    mantissa, relative error ≤ 2⁻⁸): the loss differs from float32's in the last digits only, while the
    weights stay float32."""
    pytest.importorskip("ml_dtypes")
    from minidl.models.gpt_train import DEFAULTS, train
    s = dict(DEFAULTS, steps=3, n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4, eval_every=3,
             warmup=1, val_windows=32)
    full = train(dict(s), str(tmp_path / "fp32"), show=False)
    mixed = train(dict(s, amp="bf16"), str(tmp_path / "bf16"), show=False)
    assert mixed["trainer"].amp == "bf16"
    assert all(p.dtype == np.float32 for p in mixed["trainer"].model.parameters())
    assert mixed["val_loss"] != full["val_loss"]  # bfloat16 products really ran
    assert abs(mixed["val_loss"] - full["val_loss"]) < 0.05  # ~4 nats, bfloat16 rounding ~0.4% of a term


def test_cross_entropy_of_logits_is_the_mean_over_positions():
    logits = mdl.tensor(np.random.default_rng(4).standard_normal((2, 3, 5)))
    y = np.random.default_rng(5).integers(0, 5, (2, 3))
    lp = logits.numpy() - np.log(np.exp(logits.numpy()).sum(-1, keepdims=True))
    want = -np.mean(np.take_along_axis(lp, y[..., None], -1))
    assert lm_loss(logits, mdl.tensor(y)).item() == pytest.approx(want, rel=1e-12)


def test_data_parallel_on_two_ranks_trains_the_same_model(tmp_path, capsys):
    from minidl.cli import main
    from minidl.parallel import launch
    reason = launch.mpi_unavailable_reason()
    if reason is not None:
        pytest.skip(f"MPI not installed: {reason}")
    settings = ["--steps", "3", "--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
                "--batch-size", "8", "--eval-every", "3", "--warmup", "1", "--quiet"]
    assert main(["gpt", "train", *settings, "--out", str(tmp_path / "one")]) == 0
    capsys.readouterr()
    job = launch.run(2, ["-m", "minidl", "gpt", "train", "--data-parallel", *settings, "--out", str(tmp_path / "two")],
                     timeout=180)
    assert job.returncode == 0, job.stderr[-3000:]
    assert job.stdout.count("writing to") == 1 and "data-parallel on 2 ranks" in job.stdout
    one = mdl.load(str(tmp_path / "one" / "gpt.safetensors"))["model"]
    two = mdl.load(str(tmp_path / "two" / "gpt.safetensors"))["model"]
    assert list(one) == list(two)
    for key in one:
        np.testing.assert_allclose(np.asarray(two[key]), np.asarray(one[key]), rtol=0, atol=1e-5, err_msg=key)
