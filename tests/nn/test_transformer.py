"""nn.MultiheadAttention, the encoder and decoder layers and stacks and nn.Transformer against PyTorch's modules.

Each test builds the torch module, copies its state dict into minidl's (the
names and shapes must match for that to work), runs both on the same float64
inputs and compares outputs and the gradients of every input and parameter.
A NumPy formula checks the attention itself independently of torch.
"""
import math

import numpy as np
import pytest

import minidl as mdl
from minidl import nn


def copy_from_torch(module, torch_module):
    module.load_state_dict({k: v.detach().numpy() for k, v in torch_module.state_dict().items()})
    return module.double()


def run_both(torch, module, torch_module, arrays, call, torch_call=None):
    """Outputs and gradients (inputs, then parameters by name) of minidl and torch on the same inputs."""
    torch_call = torch_call or call
    ours = [mdl.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    out, w = call(module, *ours)
    out_t, w_t = torch_call(torch_module, *theirs)
    rng = np.random.default_rng(7)
    g = rng.standard_normal(out.shape)
    loss = (out * mdl.tensor(g)).sum()
    loss_t = (out_t * torch.tensor(g)).sum()
    if w is not None:
        gw = rng.standard_normal(w.shape)
        loss = loss + (w * mdl.tensor(gw)).sum()
        loss_t = loss_t + (w_t * torch.tensor(gw)).sum()
    loss.backward()
    loss_t.backward()
    np.testing.assert_allclose(out.numpy(), out_t.detach().numpy(), rtol=1e-10, atol=1e-12)
    if w is not None:
        np.testing.assert_allclose(w.numpy(), w_t.detach().numpy(), rtol=1e-10, atol=1e-12)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-9, atol=1e-11)
    params_t = dict(torch_module.named_parameters())
    names = [name for name, _ in module.named_parameters()]
    assert names == list(params_t), "parameter names and order must be PyTorch's"
    for name, p in module.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), params_t[name].grad.numpy(), rtol=1e-9, atol=1e-11,
                                   err_msg=name)
    return out


def mha_pair(torch, **kwargs):
    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(**kwargs).double()
    ours = copy_from_torch(nn.MultiheadAttention(**kwargs), theirs)
    return ours, theirs


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("need_weights,average", [(True, True), (True, False), (False, True)])
def test_self_attention_matches_torch(torch, batch_first, need_weights, average):
    ours, theirs = mha_pair(torch, embed_dim=8, num_heads=2, batch_first=batch_first)
    x = np.random.default_rng(0).standard_normal((3, 5, 8) if batch_first else (5, 3, 8))

    def call(m, x):
        return m(x, x, x, need_weights=need_weights, average_attn_weights=average)

    run_both(torch, ours, theirs, [x], call)


@pytest.mark.parametrize("mask", ["bool_attn", "float_attn", "per_head", "padding", "padding_float", "both",
                                  "causal_hint"])
@pytest.mark.parametrize("need_weights", [True, False])
def test_masks_match_torch(torch, mask, need_weights):
    ours, theirs = mha_pair(torch, embed_dim=12, num_heads=3, batch_first=True)
    rng = np.random.default_rng(1)
    n, length, s = 2, 4, 6
    q, k, v = rng.standard_normal((n, length, 12)), rng.standard_normal((n, s, 12)), rng.standard_normal((n, s, 12))
    attn = key_padding = None
    kw = {}
    if mask in ("bool_attn", "both"):
        attn = rng.random((length, s)) < 0.3
        attn[:, 0] = False  # every query keeps a key: torch's slow path gives NaN for fully masked rows
    if mask == "float_attn":
        attn = rng.standard_normal((length, s))
    if mask == "per_head":
        attn = rng.random((n * 3, length, s)) < 0.3
        attn[..., 1] = False
    if mask in ("padding", "both"):
        key_padding = np.zeros((n, s), dtype=bool)
        key_padding[0, 4:] = True
        key_padding[1, 5:] = True
    if mask == "padding_float":
        key_padding = rng.standard_normal((n, s))
    if mask == "causal_hint":
        q, k, v = q, q[:, :length], q[:, :length]
        attn = ~np.tril(np.ones((length, length), dtype=bool))
        kw["is_causal"] = True

    def call(m, q, k, v):
        as_mask = (lambda a: None if a is None else torch.tensor(a)) if m is theirs else (lambda a: a)
        return m(q, k, v, attn_mask=as_mask(attn), key_padding_mask=as_mask(key_padding),
                 need_weights=need_weights, **kw)

    run_both(torch, ours, theirs, [q, k, v], call)


def test_kdim_vdim_bias_kv_zero_attn_and_no_bias_match_torch(torch):
    for kwargs in ({"kdim": 5, "vdim": 7}, {"add_bias_kv": True}, {"add_zero_attn": True}, {"bias": False},
                   {"add_bias_kv": True, "add_zero_attn": True, "kdim": 5, "vdim": 7}):
        ours, theirs = mha_pair(torch, embed_dim=8, num_heads=4, **kwargs)
        rng = np.random.default_rng(2)
        q = rng.standard_normal((3, 2, 8))
        k = rng.standard_normal((4, 2, kwargs.get("kdim", 8)))
        v = rng.standard_normal((4, 2, kwargs.get("vdim", 8)))
        pad = np.array([[False, False, False, True], [False, False, False, False]])

        def call(m, q, k, v):
            return m(q, k, v, key_padding_mask=torch.tensor(pad) if m is theirs else pad)

        run_both(torch, ours, theirs, [q, k, v], call)


def test_unbatched_input_matches_torch(torch):
    ours, theirs = mha_pair(torch, embed_dim=6, num_heads=2)
    rng = np.random.default_rng(3)
    q, kv = rng.standard_normal((4, 6)), rng.standard_normal((5, 6))
    out = run_both(torch, ours, theirs, [q, kv], lambda m, q, kv: m(q, kv, kv))
    assert out.shape == (4, 6)


def test_attention_equals_the_numpy_formula():
    """Independent of torch: softmax(Q Kᵀ/√d + mask) V per head, concatenated and projected."""
    mdl.manual_seed(0)
    m = nn.MultiheadAttention(8, 2, batch_first=True).double()
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 5, 8))
    causal = ~np.tril(np.ones((5, 5), dtype=bool))
    out, w = m(mdl.tensor(x), mdl.tensor(x), mdl.tensor(x), attn_mask=causal, average_attn_weights=False)
    wq, wk, wv = np.split(m.in_proj_weight.numpy(), 3)
    bq, bk, bv = np.split(m.in_proj_bias.numpy(), 3)
    heads, probs = [], []
    for h in range(2):
        cols = slice(4 * h, 4 * h + 4)
        q, k, v = ((x @ w.T + b)[..., cols] for w, b in ((wq, bq), (wk, bk), (wv, bv)))
        z = q @ k.transpose(0, 2, 1) / math.sqrt(4) + np.where(causal, -np.inf, 0.0)
        p = np.exp(z - z.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        heads.append(p @ v)
        probs.append(p)
    want = np.concatenate(heads, -1) @ m.out_proj.weight.numpy().T + m.out_proj.bias.numpy()
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(w.numpy(), np.stack(probs, 1), rtol=1e-12, atol=1e-14)
    # the one-op path and the is_causal flag give the same output
    fast, none = m(mdl.tensor(x), mdl.tensor(x), mdl.tensor(x), is_causal=True, need_weights=False)
    assert none is None
    np.testing.assert_allclose(fast.numpy(), want, rtol=1e-12, atol=1e-12)


def test_fully_masked_query_gives_zero_on_both_paths():
    m = nn.MultiheadAttention(4, 2, batch_first=True).double()
    x = mdl.tensor(np.random.default_rng(5).standard_normal((1, 3, 4)), requires_grad=True)
    mask = np.zeros((3, 3), dtype=bool)
    mask[1] = True  # query 1 may attend to nothing
    for need_weights in (True, False):
        out, w = m(x, x, x, attn_mask=mask, need_weights=need_weights)
        out.sum().backward()
        bias = m.out_proj.bias.numpy()
        np.testing.assert_allclose(out.numpy()[0, 1], bias, atol=1e-15)
        assert np.isfinite(x.grad.numpy()).all()
        if w is not None:
            assert np.all(w.numpy()[0, 1] == 0)
        x.grad = None


def test_default_initialization_is_torchs():
    mdl.manual_seed(0)
    m = nn.MultiheadAttention(64, 4, add_bias_kv=True)
    bound = math.sqrt(6 / (64 + 3 * 64))  # xavier_uniform on the (3E, E) matrix
    w = m.in_proj_weight.numpy()
    assert w.shape == (192, 64) and np.abs(w).max() <= bound and np.abs(w).max() > 0.9 * bound
    assert np.all(m.in_proj_bias.numpy() == 0) and np.all(m.out_proj.bias.numpy() == 0)
    assert np.abs(m.out_proj.weight.numpy()).max() <= 1 / math.sqrt(64)
    assert m.bias_k.shape == (1, 1, 64) and m.bias_k.numpy().std() > 0


def test_errors_name_the_layer_and_shapes():
    with pytest.raises(ValueError, match="divisible by num_heads"):
        nn.MultiheadAttention(10, 3)
    m = nn.MultiheadAttention(8, 2)
    x = mdl.tensor(np.zeros((3, 2, 8), dtype=np.float32))
    with pytest.raises(ValueError, match=r"attn_mask must have shape"):
        m(x, x, x, attn_mask=np.zeros((2, 2), dtype=bool))
    with pytest.raises(ValueError, match=r"key_padding_mask must have shape \(N, S\) = \(2, 3\)"):
        m(x, x, x, key_padding_mask=np.zeros((3, 2), dtype=bool))
    with pytest.raises(ValueError, match="features"):
        m(x, x, mdl.tensor(np.zeros((3, 2, 5), dtype=np.float32)))
    with pytest.raises(TypeError, match="boolean .* or floating point"):
        m(x, x, x, attn_mask=np.zeros((3, 3), dtype=np.int64))
    with pytest.raises(ValueError, match="activation should be relu/gelu"):
        nn.TransformerEncoderLayer(8, 2, activation="tanh")


def layer_pair(torch, **kwargs):
    torch.manual_seed(1)
    theirs = torch.nn.TransformerEncoderLayer(**kwargs).double()
    ours = copy_from_torch(nn.TransformerEncoderLayer(**kwargs), theirs)
    return ours, theirs


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_layer_matches_torch(torch, norm_first, activation):
    kwargs = dict(d_model=8, nhead=2, dim_feedforward=16, dropout=0.0, activation=activation,
                  norm_first=norm_first, batch_first=True)
    ours, theirs = layer_pair(torch, **kwargs)
    x = np.random.default_rng(6).standard_normal((2, 5, 8))
    pad = np.array([[False] * 5, [False, False, False, True, True]])
    causal = ~np.tril(np.ones((5, 5), dtype=bool))

    def call(m, x):
        as_mask = (lambda a: torch.tensor(a)) if m is theirs else (lambda a: a)
        return m(x, src_mask=as_mask(causal), src_key_padding_mask=as_mask(pad)), None

    run_both(torch, ours, theirs, [x], call)


def test_encoder_stack_matches_torch_with_its_state_dict(torch):
    torch.manual_seed(2)
    layer_t = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0)
    theirs = torch.nn.TransformerEncoder(layer_t, num_layers=3, norm=torch.nn.LayerNorm(8),
                                         enable_nested_tensor=False).double()
    ours = nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0), 3, norm=nn.LayerNorm(8))
    assert list(ours.state_dict()) == list(theirs.state_dict())
    copy_from_torch(ours, theirs)
    assert ours.layers[0].linear1.weight is not ours.layers[1].linear1.weight
    x = np.random.default_rng(8).standard_normal((5, 2, 8))
    causal = ~np.tril(np.ones((5, 5), dtype=bool))

    def call(m, x):
        return m(x, mask=torch.tensor(causal) if m is theirs else causal), None

    run_both(torch, ours, theirs, [x], call)


def test_dropout_is_used_in_training_and_not_in_evaluation():
    mdl.manual_seed(3)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.5, batch_first=True).double()
    x = mdl.tensor(np.random.default_rng(9).standard_normal((2, 4, 8)))
    a, b = layer(x).numpy(), layer(x).numpy()
    assert not np.allclose(a, b)
    layer.eval()
    np.testing.assert_array_equal(layer(x).numpy(), layer(x).numpy())


# ---------------------------------------------------------------- decoder and the whole Transformer
@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_matches_torch_with_every_mask(torch, norm_first):
    kwargs = dict(d_model=8, nhead=2, dim_feedforward=16, dropout=0.0, norm_first=norm_first, batch_first=True)
    torch.manual_seed(3)
    theirs = torch.nn.TransformerDecoderLayer(**kwargs).double()
    ours = copy_from_torch(nn.TransformerDecoderLayer(**kwargs), theirs)
    rng = np.random.default_rng(9)
    tgt, memory = rng.standard_normal((2, 4, 8)), rng.standard_normal((2, 6, 8))
    causal = ~np.tril(np.ones((4, 4), dtype=bool))
    tgt_pad = np.array([[False] * 4, [False, False, False, True]])
    memory_pad = np.array([[False] * 5 + [True], [False] * 6])
    memory_bias = rng.standard_normal((4, 6))  # a float mask, added to the scores

    def call(m, t, mem):
        as_mask = (lambda a: torch.tensor(a)) if m is theirs else (lambda a: a)
        return m(t, mem, tgt_mask=as_mask(causal), memory_mask=as_mask(memory_bias),
                 tgt_key_padding_mask=as_mask(tgt_pad), memory_key_padding_mask=as_mask(memory_pad)), None

    run_both(torch, ours, theirs, [tgt, memory], call)


@pytest.mark.parametrize("batch_first, norm_first", [(False, False), (True, True), (True, False)])
def test_transformer_loads_torchs_state_dict_and_matches_outputs_and_gradients(torch, batch_first, norm_first):
    kwargs = dict(d_model=8, nhead=2, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=16, dropout=0.0,
                  batch_first=batch_first, norm_first=norm_first)
    torch.manual_seed(4)
    theirs = torch.nn.Transformer(**kwargs).double()
    ours = nn.Transformer(**kwargs)
    assert list(ours.state_dict()) == list(theirs.state_dict())  # PyTorch's key names, in PyTorch's order
    copy_from_torch(ours, theirs)
    rng = np.random.default_rng(10)
    src = rng.standard_normal((3, 5, 8) if batch_first else (5, 3, 8))
    tgt = rng.standard_normal((3, 4, 8) if batch_first else (4, 3, 8))
    src_pad = np.zeros((3, 5), dtype=bool)
    src_pad[1, 3:] = True

    def call(m, s, t):
        if m is theirs:
            mask = torch.nn.Transformer.generate_square_subsequent_mask(4, dtype=torch.float64)
            pad = torch.tensor(src_pad)
        else:
            mask, pad = nn.Transformer.generate_square_subsequent_mask(4, dtype="float64"), src_pad
        return m(s, t, tgt_mask=mask, src_key_padding_mask=pad, memory_key_padding_mask=pad), None

    out = run_both(torch, ours, theirs, [src, tgt], call)
    assert out.shape == tgt.shape


def test_transformer_defaults_and_initialization_are_torchs(torch):
    ours, theirs = nn.Transformer(d_model=16, nhead=4, num_encoder_layers=1, num_decoder_layers=1), \
        torch.nn.Transformer(d_model=16, nhead=4, num_encoder_layers=1, num_decoder_layers=1)
    assert ours.encoder.layers[0].linear1.out_features == 2048 and ours.encoder.layers[0].dropout.p == 0.1
    shapes = {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
    assert {k: tuple(v.shape) for k, v in ours.state_dict().items()} == shapes
    w = ours.decoder.layers[0].linear1.weight.numpy()  # Xavier-uniform: U(±√(6 / (fan_in + fan_out)))
    bound = math.sqrt(6 / (16 + 2048))
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.9 * bound
    np.testing.assert_array_equal(nn.Transformer.generate_square_subsequent_mask(3).numpy(),
                                  torch.nn.Transformer.generate_square_subsequent_mask(3).numpy())


def test_transformer_refuses_mismatched_inputs():
    model = nn.Transformer(d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=8)
    with pytest.raises(ValueError, match=r"Transformer: src \(5, 3, 8\) and tgt \(4, 2, 8\) must have the same batch"):
        model(mdl.zeros(5, 3, 8), mdl.zeros(4, 2, 8))
    with pytest.raises(ValueError, match=r"Transformer: the feature number of src and tgt must equal d_model=8"):
        model(mdl.zeros(5, 3, 6), mdl.zeros(4, 3, 6))

