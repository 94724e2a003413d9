"""Attention in tiles (FlashAttention's online softmax): the plain op's numbers, a fraction of its memory."""
import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from minidl import memory
from minidl.ops import attention
from minidl.ops.attention import ScaledDotProductAttention, TiledAttention


def _run(q, k, v, seed, **kwargs):
    """Output and (q, k, v) gradients of one attention call, backward from a fixed random cotangent."""
    q, k, v = (mdl.tensor(a, requires_grad=True) for a in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, **kwargs)
    cotangent = np.random.default_rng(seed).standard_normal(out.shape)
    (out * mdl.tensor(cotangent)).sum().backward()
    return [out.numpy()] + [x.grad.numpy() for x in (q, k, v)], out.creator


@pytest.mark.parametrize("kwargs", [{}, {"is_causal": True}, {"attn_mask": "keys"}, {"attn_mask": "rows"}],
                         ids=["plain", "causal", "mask with a dead query", "mask broadcast over keys"])
def test_tiled_equals_the_plain_op_in_float64_over_many_blocks(monkeypatch, kwargs):
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((3, 7, 5)), rng.standard_normal((1, 30, 5)), rng.standard_normal((1, 30, 4))
    if kwargs.get("attn_mask") == "keys":
        mask = rng.random((7, 30)) > 0.5
        mask[2] = False  # a query that sees no key: output and gradients 0, as the plain op
        kwargs = {"attn_mask": mask}
    elif kwargs.get("attn_mask") == "rows":
        kwargs = {"attn_mask": np.array([[True], [False], [True], [True], [False], [True], [True]])}
    blocks = []
    monkeypatch.setattr(TiledAttention, "__init__", _small_blocks(TiledAttention.__init__, blocks))
    plain, plain_node = _run(q, k, v, 1, tiled=False, **kwargs)
    tiled, tiled_node = _run(q, k, v, 1, tiled=True, **kwargs)
    assert type(plain_node) is ScaledDotProductAttention and type(tiled_node) is TiledAttention
    assert blocks == [4]  # 30 keys: eight blocks, the last one short
    for a, b in zip(plain, tiled):
        np.testing.assert_allclose(b, a, rtol=1e-13, atol=1e-15)
    if "attn_mask" in kwargs and kwargs["attn_mask"].shape == (7, 30):
        assert not tiled[0][:, 2].any() and not tiled[1][:, 2].any()


def _small_blocks(init, blocks):
    def small(self, *args, **kwargs):
        init(self, *args, **{**kwargs, "block": 4})
        blocks.append(self.block)
    return small


def test_tiled_holds_the_output_and_one_number_per_row_not_the_probabilities():
    """What the tracker counts for backward, against the bytes each path must keep, derived by hand."""
    n, e = 256, 16
    rng = np.random.default_rng(0)
    held = {}
    for tiled in (False, True):
        q, k, v = (mdl.tensor(rng.standard_normal((1, n, e)), requires_grad=True) for _ in range(3))
        with memory.track() as tracked:
            F.scaled_dot_product_attention(q, k, v, is_causal=True, tiled=tiled).sum().backward()
        held[tiled] = tracked.peak_bytes
    inputs = 3 * n * e * 8  # q, k, v in float64: the tracker counts a user's inputs
    output = n * e * 8  # held by the sum's node in both runs, and by the tiled node too (one buffer)
    assert held[True] == inputs + output + n * 8  # + one log-sum-exp per query
    # + the n × n probabilities, the causal mask and a flag per row (whether its keys are all masked)
    assert held[False] == inputs + output + n * n * 8 + n * n + n


def test_tiled_refuses_what_it_does_not_compute():
    q = mdl.tensor(np.ones((2, 3, 4)))
    with pytest.raises(ValueError, match="tiled=True takes a boolean or causal mask and no dropout; got a float"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=np.zeros((3, 3)), tiled=True)
    with pytest.raises(ValueError, match="dropout_p=0.5"):
        F.scaled_dot_product_attention(q, q, q, dropout_p=0.5, tiled=True)


def test_large_scores_take_the_tiled_path_by_themselves(monkeypatch):
    q = mdl.tensor(np.random.default_rng(0).standard_normal((1, 8, 4)).astype(np.float32), requires_grad=True)
    monkeypatch.setattr(attention, "TILED_ABOVE_BYTES", 8 * 8 * 4)  # the scores of this call, in float32
    assert type(F.scaled_dot_product_attention(q, q, q).creator) is TiledAttention
    assert type(F.scaled_dot_product_attention(q, q, q, dropout_p=0.1).creator) is ScaledDotProductAttention
    assert type(F.scaled_dot_product_attention(q, q, q, tiled=False).creator) is ScaledDotProductAttention
    monkeypatch.setattr(attention, "TILED_ABOVE_BYTES", 8 * 8 * 4 + 1)
    assert type(F.scaled_dot_product_attention(q, q, q).creator) is ScaledDotProductAttention
