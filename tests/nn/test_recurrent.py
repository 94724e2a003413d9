"""RNN, LSTM, GRU: PyTorch's names, layouts and gate order; values and gradients against PyTorch and by hand."""
import math

import numpy as np
import pytest

import minidl as mdl
from minidl import nn


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def make_pair(kind, torch, **kwargs):
    theirs = getattr(torch.nn, kind)(3, 4, **kwargs).double()
    ours = getattr(nn, kind)(3, 4, **kwargs).double()
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    return ours, theirs


def combine(out, state):
    """A scalar that depends on the output and on every final state (so each gets a gradient)."""
    states = state if isinstance(state, tuple) else (state,)
    total = (out * out).sum()
    for k, s in enumerate(states):
        total = total + ((s * s * s).sum() * (k + 2))
    return total


@pytest.mark.parametrize("kind", ["RNN", "LSTM", "GRU"])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_two_layer_recurrent_layers_match_torch(kind, batch_first, bidirectional):
    torch = pytest.importorskip("torch")
    ours, theirs = make_pair(kind, torch, num_layers=2, batch_first=batch_first, bidirectional=bidirectional)
    x = np.random.default_rng(0).normal(size=(2, 5, 3))  # (N, T, I) when batch_first else (T, N, I)
    xo, xt = mdl.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    (out_o, state_o), (out_t, state_t) = ours(xo), theirs(xt)
    np.testing.assert_allclose(out_o.numpy(), out_t.detach().numpy(), rtol=1e-10, atol=1e-12)
    for so, st in zip(*(s if isinstance(s, tuple) else (s,) for s in (state_o, state_t))):
        np.testing.assert_allclose(so.numpy(), st.detach().numpy(), rtol=1e-10, atol=1e-12)
    combine(out_o, state_o).backward()
    combine(out_t, state_t).backward()
    np.testing.assert_allclose(xo.grad.numpy(), xt.grad.numpy(), rtol=1e-9, atol=1e-12)
    names = [n for n, _ in theirs.named_parameters()]
    assert [n for n, _ in ours.named_parameters()] == names
    for (name, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("kind", ["RNN", "LSTM", "GRU"])
def test_initial_state_gets_its_gradient_like_torch(kind):
    torch = pytest.importorskip("torch")
    ours, theirs = make_pair(kind, torch, num_layers=2, batch_first=True)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 4, 3))
    states = [rng.normal(size=(2, 3, 4)) for _ in range(2 if kind == "LSTM" else 1)]
    so = [mdl.tensor(s, requires_grad=True) for s in states]
    st = [torch.tensor(s, requires_grad=True) for s in states]
    out_o, fin_o = ours(mdl.tensor(x), tuple(so) if kind == "LSTM" else so[0])
    out_t, fin_t = theirs(torch.tensor(x), tuple(st) if kind == "LSTM" else st[0])
    combine(out_o, fin_o).backward()
    combine(out_t, fin_t).backward()
    for a, b in zip(so, st):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_relu_rnn_and_unbatched_input_match_torch():
    torch = pytest.importorskip("torch")
    ours, theirs = make_pair("RNN", torch, nonlinearity="relu", bias=False)
    x = np.random.default_rng(2).normal(size=(6, 3))  # unbatched (T, I)
    out_o, h_o = ours(mdl.tensor(x))
    out_t, h_t = theirs(torch.tensor(x))
    assert out_o.shape == (6, 4) and h_o.shape == (1, 4)
    np.testing.assert_allclose(out_o.numpy(), out_t.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(h_o.numpy(), h_t.detach().numpy(), rtol=1e-10, atol=1e-12)


def test_lstm_one_step_by_the_textbook_formulas():
    lstm = nn.LSTM(3, 2).double()
    rng = np.random.default_rng(3)
    x, h0, c0 = rng.normal(size=(1, 1, 3)), rng.normal(size=(1, 1, 2)), rng.normal(size=(1, 1, 2))
    out, (h1, c1) = lstm(mdl.tensor(x), (mdl.tensor(h0), mdl.tensor(c0)))
    a = (lstm.weight_ih_l0.array @ x[0, 0] + lstm.bias_ih_l0.array
         + lstm.weight_hh_l0.array @ h0[0, 0] + lstm.bias_hh_l0.array)
    i, f, g, o = sigmoid(a[0:2]), sigmoid(a[2:4]), np.tanh(a[4:6]), sigmoid(a[6:8])
    c = f * c0[0, 0] + i * g
    h = o * np.tanh(c)
    np.testing.assert_allclose(c1.numpy()[0, 0], c, rtol=1e-12)
    np.testing.assert_allclose(h1.numpy()[0, 0], h, rtol=1e-12)
    np.testing.assert_allclose(out.numpy()[0, 0], h, rtol=1e-12)


def test_gru_one_step_by_the_formulas():
    gru = nn.GRU(3, 2).double()
    rng = np.random.default_rng(4)
    x, h0 = rng.normal(size=(1, 1, 3)), rng.normal(size=(1, 1, 2))
    _, h1 = gru(mdl.tensor(x), mdl.tensor(h0))
    a = gru.weight_ih_l0.array @ x[0, 0] + gru.bias_ih_l0.array
    b = gru.weight_hh_l0.array @ h0[0, 0] + gru.bias_hh_l0.array
    r, z = sigmoid(a[0:2] + b[0:2]), sigmoid(a[2:4] + b[2:4])
    n = np.tanh(a[4:6] + r * b[4:6])
    np.testing.assert_allclose(h1.numpy()[0, 0], (1 - z) * n + z * h0[0, 0], rtol=1e-12)


def test_rnn_two_steps_by_hand():
    rnn = nn.RNN(2, 3).double()
    x = np.random.default_rng(5).normal(size=(2, 1, 2))
    out, h_n = rnn(mdl.tensor(x))
    w_ih, w_hh = rnn.weight_ih_l0.array, rnn.weight_hh_l0.array
    b = rnn.bias_ih_l0.array + rnn.bias_hh_l0.array
    h = np.zeros(3)
    for t in range(2):
        h = np.tanh(w_ih @ x[t, 0] + w_hh @ h + b)
        np.testing.assert_allclose(out.numpy()[t, 0], h, rtol=1e-12)
    np.testing.assert_allclose(h_n.numpy()[0, 0], h, rtol=1e-12)


@pytest.mark.parametrize("kind", ["RNN", "LSTM", "GRU"])
def test_recurrent_gradcheck_float64(kind):
    layer = getattr(nn, kind)(2, 2, num_layers=2, batch_first=True, bidirectional=(kind == "GRU")).double()
    x = mdl.randn(2, 3, 2, dtype=np.float64, requires_grad=True)

    def run(x, *params):
        out, state = layer(x)
        return out, *(state if isinstance(state, tuple) else (state,))

    params = [layer.weight_ih_l0, layer.weight_hh_l1, layer.bias_hh_l0]
    assert mdl.gradcheck(run, [x] + params)


def test_parameter_shapes_and_default_init():
    lstm = nn.LSTM(5, 8, num_layers=2, bidirectional=True)
    shapes = {n: p.shape for n, p in lstm.named_parameters()}
    assert shapes["weight_ih_l0"] == (32, 5) and shapes["weight_hh_l0"] == (32, 8)
    assert shapes["weight_ih_l1"] == (32, 16) and shapes["bias_ih_l1_reverse"] == (32,)
    assert len(shapes) == 16
    gru = nn.GRU(5, 100)
    assert gru.weight_ih_l0.shape == (300, 5)
    bound = 1 / math.sqrt(100)
    for p in gru.parameters():
        assert p.dtype == np.float32 and np.abs(p.array).max() <= bound
    assert np.abs(gru.weight_hh_l0.array).max() > 0.95 * bound


def test_output_shapes_and_dropout_between_layers():
    lstm = nn.LSTM(3, 4, num_layers=3, batch_first=True, dropout=0.5, bidirectional=True)
    x = mdl.randn(2, 7, 3)
    out, (h, c) = lstm(x)
    assert out.shape == (2, 7, 8) and h.shape == (6, 2, 4) and c.shape == (6, 2, 4)
    lstm.eval()
    first = lstm(x)[0].numpy()
    np.testing.assert_array_equal(lstm(x)[0].numpy(), first)  # no dropout in evaluation
    lstm.train()
    assert not np.allclose(lstm(x)[0].numpy(), first)


def test_recurrent_input_errors():
    with pytest.raises(ValueError, match="expected input \\(T, N, 3\\).*got shape \\(2, 5, 4\\)"):
        nn.GRU(3, 4)(mdl.zeros(2, 5, 4))
    with pytest.raises(ValueError, match="initial state of shape \\(1, 2, 4\\), expected \\(2, 2, 4\\)"):
        nn.RNN(3, 4, num_layers=2)(mdl.zeros(5, 2, 3), mdl.zeros(1, 2, 4))
    with pytest.raises(TypeError, match="tuple \\(h_0, c_0\\)"):
        nn.LSTM(3, 4)(mdl.zeros(5, 2, 3), mdl.zeros(1, 2, 4))
    with pytest.raises(ValueError, match="nonlinearity"):
        nn.RNN(3, 4, nonlinearity="sigmoid")


def test_lstm_learns_to_remember_the_first_input():
    """A sanity run: a small LSTM learns 'the sign of the first of 6 steps' with Adam.

    Adam at lr 0.03 brings the loss under 2e-3 within 300 steps for every seed tried
    (0 to 7); plain SGD at lr 1 lands anywhere from 0.02 to 0.7 depending on the seed and
    the machine's rounding, so it cannot carry a threshold.
    """
    from minidl import optim
    mdl.manual_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 6, 1)).astype(np.float32)
    y = (x[:, 0, 0] > 0).astype(np.float32)[:, None]
    lstm, head = nn.LSTM(1, 8, batch_first=True), nn.Linear(8, 1)
    nn.init.init_lstm_gate_biases(lstm)
    opt = optim.Adam(list(lstm.parameters()) + list(head.parameters()), lr=0.03)
    for _ in range(300):
        out, _ = lstm(mdl.tensor(x))
        p = head(out[:, -1]).sigmoid()
        loss = -(mdl.tensor(y) * (p + 1e-7).log() + (1 - mdl.tensor(y)) * (1 - p + 1e-7).log()).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05  # from ln 2 ≈ 0.69 at the start
    assert ((p.numpy() > 0.5) == (y > 0.5)).all()


def test_recurrent_on_the_device(device):
    gru = nn.GRU(3, 4, batch_first=True).to(device)
    out, h = gru(mdl.randn(2, 5, 3).to(device))
    assert out.device.startswith(device) and h.shape == (1, 2, 4)


def test_dropout_on_a_single_layer_warns_and_p_one_is_refused():
    with pytest.warns(UserWarning, match="does nothing"):
        nn.LSTM(3, 4, dropout=0.2)
    with pytest.raises(ValueError, match="\\[0, 1\\)"):
        nn.GRU(3, 4, num_layers=2, dropout=1.0)


# ---------------------------------------------------------------- cells
def make_cell_pair(kind, torch, **kwargs):
    theirs = getattr(torch.nn, kind)(3, 4, **kwargs).double()
    ours = getattr(nn, kind)(3, 4, **kwargs).double()
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    return ours, theirs


@pytest.mark.parametrize("kind, kwargs", [("RNNCell", {}), ("RNNCell", dict(nonlinearity="relu", bias=False)),
                                          ("LSTMCell", {}), ("GRUCell", {}), ("GRUCell", dict(bias=False))])
def test_cells_match_torch_over_a_sequence_with_gradients(kind, kwargs):
    torch = pytest.importorskip("torch")
    ours, theirs = make_cell_pair(kind, torch, **kwargs)
    assert repr(ours) == repr(theirs)
    rng = np.random.default_rng(6)
    x = rng.normal(size=(4, 2, 3))
    states = [rng.normal(size=(2, 4)) for _ in range(2 if kind == "LSTMCell" else 1)]
    xo, xt = mdl.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    so = [mdl.tensor(s, requires_grad=True) for s in states]
    st = [torch.tensor(s, requires_grad=True) for s in states]
    ho, ht = (tuple(so) if kind == "LSTMCell" else so[0]), (tuple(st) if kind == "LSTMCell" else st[0])
    total_o, total_t = 0, 0
    for step in range(4):  # a cell is one time step: run it as a loop would
        ho, ht = ours(xo[step], ho), theirs(xt[step], ht)
        for a, b in zip(*(h if isinstance(h, tuple) else (h,) for h in (ho, ht))):
            np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=1e-10, atol=1e-12)
        total_o, total_t = total_o + combine(xo[step], ho), total_t + combine(xt[step], ht)
    total_o.backward()
    total_t.backward()
    np.testing.assert_allclose(xo.grad.numpy(), xt.grad.numpy(), rtol=1e-9, atol=1e-12)
    for a, b in zip(so, st):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-9, atol=1e-12)
    for (name, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("kind", ["RNNCell", "LSTMCell", "GRUCell"])
def test_cells_unbatched_and_zero_state_match_torch(kind):
    torch = pytest.importorskip("torch")
    ours, theirs = make_cell_pair(kind, torch)
    x = np.random.default_rng(7).normal(size=3)
    ho, ht = ours(mdl.tensor(x)), theirs(torch.tensor(x))
    for a, b in zip(*(h if isinstance(h, tuple) else (h,) for h in (ho, ht))):
        assert a.shape == (4,)
        np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=1e-10, atol=1e-12)


def test_lstm_cell_by_the_formulas_and_gate_order():
    cell = nn.LSTMCell(3, 2).double()
    rng = np.random.default_rng(8)
    x, h0, c0 = rng.normal(size=(1, 3)), rng.normal(size=(1, 2)), rng.normal(size=(1, 2))
    h1, c1 = cell(mdl.tensor(x), (mdl.tensor(h0), mdl.tensor(c0)))
    a = x[0] @ cell.weight_ih.array.T + cell.bias_ih.array + h0[0] @ cell.weight_hh.array.T + cell.bias_hh.array
    i, f, g, o = sigmoid(a[0:2]), sigmoid(a[2:4]), np.tanh(a[4:6]), sigmoid(a[6:8])
    c = f * c0[0] + i * g
    np.testing.assert_allclose(c1.numpy()[0], c, rtol=1e-12)
    np.testing.assert_allclose(h1.numpy()[0], o * np.tanh(c), rtol=1e-12)


def test_gru_and_rnn_cells_by_the_formulas():
    rng = np.random.default_rng(9)
    x, h0 = rng.normal(size=(2, 3)), rng.normal(size=(2, 2))
    gru = nn.GRUCell(3, 2).double()
    a = x @ gru.weight_ih.array.T + gru.bias_ih.array
    b = h0 @ gru.weight_hh.array.T + gru.bias_hh.array
    r, z = sigmoid(a[:, 0:2] + b[:, 0:2]), sigmoid(a[:, 2:4] + b[:, 2:4])
    n = np.tanh(a[:, 4:6] + r * b[:, 4:6])
    np.testing.assert_allclose(gru(mdl.tensor(x), mdl.tensor(h0)).numpy(), (1 - z) * n + z * h0, rtol=1e-12)
    rnn = nn.RNNCell(3, 2, nonlinearity="relu").double()
    pre = x @ rnn.weight_ih.array.T + rnn.bias_ih.array + h0 @ rnn.weight_hh.array.T + rnn.bias_hh.array
    np.testing.assert_allclose(rnn(mdl.tensor(x), mdl.tensor(h0)).numpy(), np.maximum(pre, 0), rtol=1e-12)


def test_layer_is_its_cell_run_over_the_sequence():
    """An LSTM with the cell's weights gives the cell's states at every step (one formula for both)."""
    lstm, cell = nn.LSTM(3, 4).double(), nn.LSTMCell(3, 4).double()
    cell.load_state_dict({k[:-3]: v for k, v in lstm.state_dict().items()})  # weight_ih_l0 -> weight_ih
    x = np.random.default_rng(10).normal(size=(5, 2, 3))
    out, (h_n, c_n) = lstm(mdl.tensor(x))
    state = None
    for t in range(5):
        state = cell(mdl.tensor(x[t]), state)
        np.testing.assert_allclose(out.numpy()[t], state[0].numpy(), rtol=1e-13)
    np.testing.assert_allclose(c_n.numpy()[0], state[1].numpy(), rtol=1e-13)


@pytest.mark.parametrize("kind", ["RNNCell", "LSTMCell", "GRUCell"])
def test_cell_shapes_init_gradcheck_and_errors(kind):
    cell = getattr(nn, kind)(5, 3)
    gates = {"RNNCell": 1, "LSTMCell": 4, "GRUCell": 3}[kind]
    assert {n: p.shape for n, p in cell.named_parameters()} == {
        "weight_ih": (3 * gates, 5), "weight_hh": (3 * gates, 3), "bias_ih": (3 * gates,), "bias_hh": (3 * gates,)}
    bound = 1 / math.sqrt(3)
    for p in cell.parameters():
        assert p.dtype == np.float32 and np.abs(p.numpy()).max() <= bound
    assert np.abs(cell.weight_ih.numpy()).max() > 0.5 * bound  # filled, not zeros
    assert [n for n, _ in getattr(nn, kind)(5, 3, bias=False).named_parameters()] == ["weight_ih", "weight_hh"]
    cell.double()
    x = mdl.randn(2, 5, dtype=np.float64, requires_grad=True)
    h = mdl.randn(2, 3, dtype=np.float64, requires_grad=True)
    state = (h, mdl.randn(2, 3, dtype=np.float64, requires_grad=True)) if kind == "LSTMCell" else h
    run = (lambda x, h, c, w: cell(x, (h, c))) if kind == "LSTMCell" else (lambda x, h, w: cell(x, h))
    assert mdl.gradcheck(run, [x, *(state if isinstance(state, tuple) else (state,)), cell.weight_hh])
    with pytest.raises(ValueError, match=rf"{kind}: expected input \(N, 5\)"):
        cell(mdl.zeros(2, 4, dtype=np.float64))
    with pytest.raises(ValueError, match=rf"{kind}: state of shape \(3, 3\)"):
        cell(x, (mdl.zeros(3, 3),) * 2 if kind == "LSTMCell" else mdl.zeros(3, 3))
    if kind == "LSTMCell":
        with pytest.raises(TypeError, match="LSTMCell: the state must be a tuple"):
            cell(x, h)
    if kind == "RNNCell":
        with pytest.raises(ValueError, match="nonlinearity must be 'tanh' or 'relu'"):
            nn.RNNCell(2, 2, nonlinearity="sigmoid")


def test_rnn_flatten_parameters_is_accepted_and_changes_nothing():
    for layer in (nn.RNN(3, 4), nn.LSTM(3, 4, num_layers=2), nn.GRU(3, 4, bidirectional=True)):
        before = {k: v.copy() for k, v in layer.state_dict().items()}
        assert layer.flatten_parameters() is None
        assert all(np.array_equal(before[k], v) for k, v in layer.state_dict().items())
