"""Recurrent cells and layers: RNNCell, LSTMCell, GRUCell; RNN, LSTM, GRU built from them.

PyTorch's names, layouts and gate order. A cell has weight_ih (G·H, input),
weight_hh (G·H, H), bias_ih and bias_hh (G·H), G = 1, 4, 3 gates, and takes
one time step:

    RNN:   h' = tanh(W_ih x + b_ih + W_hh h + b_hh)            (or relu)
    LSTM:  i, f, g, o = split(W_ih x + b_ih + W_hh h + b_hh)   (that order)
           i, f, o = σ(i), σ(f), σ(o);  g = tanh(g)
           c' = f ⊙ c + i ⊙ g;          h' = o ⊙ tanh(c')
    GRU:   r, z, n parts of a = W_ih x + b_ih and b = W_hh h + b_hh
           r = σ(a_r + b_r);  z = σ(a_z + b_z);  n = tanh(a_n + r ⊙ b_n)
           h' = (1 − z) ⊙ n + z ⊙ h

A layer runs its cell's step over the sequence, per layer k (and direction,
"_reverse" for the backward one of a bidirectional layer) with the
parameters weight_ih_lk, weight_hh_lk, bias_ih_lk and bias_hh_lk. The input
projection W_ih x + b_ih of all time steps is one matrix product before the
loop; only W_hh h is computed step by step. Default initialization
(PyTorch's): every weight and bias ~ U(−1/√H, 1/√H). For the textbook's LSTM
bias rule use ``nn.init.init_lstm_gate_biases(lstm)``.
"""
from __future__ import annotations

import math
import warnings

import minidl.functional as F
from minidl.autograd import Function
from minidl.backend import xp_of
from minidl.nn import init
from minidl.nn.layers import check_dtype, empty_parameter
from minidl.nn.module import Module
from minidl.tensor import Tensor


class _Unbind(Function):
    """ys = (x[0], x[1], ...) along axis 0 (views, one op for the whole sequence);  dx = stack(dys);
    ẏs = (ẋ[0], ẋ[1], ...).

    Slicing a step at a time would cost one full-size zero gradient per step in
    backward; this op hands every step's gradient back in one stack.
    """
    saved_inputs = ()

    def forward(self, x):
        return tuple(x[i] for i in range(x.shape[0]))

    def backward(self, *gys):
        return F.stack(gys, axis=0)

    def jvp(self, dx):
        return _Unbind()(dx)


class _Chunk(Function):
    """ys = x split into ``chunks`` equal parts along the last axis (the gates);  dx = concatenate(dys);
    ẏs = ẋ split alike."""
    saved_inputs = ()

    def __init__(self, chunks):
        self.chunks = chunks

    def forward(self, x):
        return tuple(xp_of(x).split(x, self.chunks, axis=-1))

    def backward(self, *gys):
        return F.concatenate(gys, axis=-1)

    def jvp(self, dx):
        return _Chunk(self.chunks)(dx)


def _unbind(x: Tensor):
    return _Unbind()(x) if x.shape[0] > 1 else (F.reshape(x, x.shape[1:]),)


# ---------------------------------------------------------------- one time step of each cell
def _rnn_tanh_step(xw, state, w_hh, b_hh):
    h = F.tanh(xw + F.linear(state[0], w_hh, b_hh))
    return h, (h,)


def _rnn_relu_step(xw, state, w_hh, b_hh):
    h = F.relu(xw + F.linear(state[0], w_hh, b_hh))
    return h, (h,)


def _lstm_step(xw, state, w_hh, b_hh):
    h, c = state
    i, f, g, o = _Chunk(4)(xw + F.linear(h, w_hh, b_hh))
    c = F.sigmoid(f) * c + F.sigmoid(i) * F.tanh(g)
    h = F.sigmoid(o) * F.tanh(c)
    return h, (h, c)


def _gru_step(xw, state, w_hh, b_hh):
    h = state[0]
    a_r, a_z, a_n = _Chunk(3)(xw)
    b_r, b_z, b_n = _Chunk(3)(F.linear(h, w_hh, b_hh))
    r = F.sigmoid(a_r + b_r)
    z = F.sigmoid(a_z + b_z)
    n = F.tanh(a_n + r * b_n)
    h = (1 - z) * n + z * h
    return h, (h,)


class _CellBase(Module):
    """Shared by RNNCell, LSTMCell and GRUCell: one time step, ``step`` being the layer's step too."""

    gates = 1
    state_count = 1

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None, dtype=None):
        super().__init__()
        cell = type(self).__name__
        if input_size <= 0 or hidden_size <= 0:
            raise ValueError(f"{cell}: input_size and hidden_size must be positive, got {input_size}, {hidden_size}")
        check_dtype(cell, dtype)
        self.input_size, self.hidden_size, self.bias = input_size, hidden_size, bias
        rows = self.gates * hidden_size
        self.weight_ih = empty_parameter((rows, input_size), device, dtype)
        self.weight_hh = empty_parameter((rows, hidden_size), device, dtype)
        self.register_parameter("bias_ih", empty_parameter((rows,), device, dtype) if bias else None)
        self.register_parameter("bias_hh", empty_parameter((rows,), device, dtype) if bias else None)
        self.reset_parameters()

    def reset_parameters(self):
        bound = 1.0 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            init.uniform_(p, -bound, bound)

    def _step_fn(self):
        return type(self).step

    def forward(self, x, hx=None):
        """x: (N, input_size) or unbatched (input_size,); hx: (N, H) (an LSTMCell: a tuple (h, c)),
        zeros when None. Returns h' (an LSTMCell: (h', c')) shaped like hx."""
        cell = type(self).__name__
        if x.ndim not in (1, 2) or x.shape[-1] != self.input_size:
            raise ValueError(f"{cell}: expected input (N, {self.input_size}) or unbatched ({self.input_size},), "
                             f"got shape {x.shape}")
        unbatched = x.ndim == 1
        if unbatched:
            x = F.reshape(x, 1, x.shape[0])
        expected = (x.shape[0], self.hidden_size)
        if hx is None:
            state = (Tensor(x.xp.zeros(expected, x.dtype)),) * self.state_count
        else:
            state = (hx,) if self.state_count == 1 else hx
            if not isinstance(state, (tuple, list)) or len(state) != self.state_count:
                raise TypeError(f"{cell}: the state must be a tuple (h, c), got {type(hx).__name__}")
            state = tuple(self._checked_hidden(h, expected, unbatched) for h in state)
        _, state = self._step_fn()(F.linear(x, self.weight_ih, self.bias_ih), state, self.weight_hh, self.bias_hh)
        if unbatched:
            state = tuple(F.reshape(h, h.shape[1:]) for h in state)
        return state[0] if self.state_count == 1 else state

    def _checked_hidden(self, h, expected, unbatched):
        if not isinstance(h, Tensor):
            raise TypeError(f"{type(self).__name__}: states must be Tensors, got {type(h).__name__}")
        h = F.reshape(h, 1, h.shape[0]) if unbatched and h.ndim == 1 else h
        if h.shape != expected:
            shape = f"({self.hidden_size},) for an unbatched input" if unbatched else \
                f"{expected} (batch, hidden_size) to match the input"
            raise ValueError(f"{type(self).__name__}: state of shape {h.shape}, expected {shape}")
        return h

    def extra_repr(self):
        text = f"{self.input_size}, {self.hidden_size}"
        if not self.bias:
            text += ", bias=False"
        if getattr(self, "nonlinearity", "tanh") != "tanh":
            text += f", nonlinearity={self.nonlinearity}"  # unquoted, as PyTorch prints it
        return text


class RNNCell(_CellBase):
    """One Elman RNN step: h' = tanh(W_ih x + b_ih + W_hh h + b_hh) (``nonlinearity='relu'`` for relu).

    ``cell(x, h)`` → h'. Default initialization: every parameter ~ U(−1/√hidden_size, 1/√hidden_size).
    """

    step = staticmethod(_rnn_tanh_step)

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh",
                 device=None, dtype=None):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"RNNCell: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        super().__init__(input_size, hidden_size, bias, device, dtype)
        self.nonlinearity = nonlinearity

    def _step_fn(self):
        return _rnn_tanh_step if self.nonlinearity == "tanh" else _rnn_relu_step


class LSTMCell(_CellBase):
    """One LSTM step, gates in PyTorch's order (i, f, g, o): ``cell(x, (h, c))`` → (h', c').

    Default initialization: every parameter ~ U(−1/√hidden_size, 1/√hidden_size).
    """

    gates = 4
    state_count = 2
    step = staticmethod(_lstm_step)


class GRUCell(_CellBase):
    """One GRU step, gates in PyTorch's order (r, z, n): ``cell(x, h)`` → h'.

    Default initialization: every parameter ~ U(−1/√hidden_size, 1/√hidden_size).
    """

    gates = 3
    step = staticmethod(_gru_step)


class _RNNBase(Module):
    """Shared by RNN, LSTM and GRU: parameters, layers, directions, batch_first, initial states."""

    cell = RNNCell  # whose ``step`` the layer runs over the sequence; its gates and states too

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 device=None, dtype=None):
        super().__init__()
        layer = type(self).__name__
        if input_size <= 0 or hidden_size <= 0 or num_layers <= 0:
            raise ValueError(f"{layer}: input_size, hidden_size and num_layers must be positive, "
                             f"got {input_size}, {hidden_size}, {num_layers}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"{layer}: dropout is a probability in [0, 1), got {dropout}")
        if dropout > 0 and num_layers == 1:
            warnings.warn(f"{layer}: dropout={dropout} acts between stacked layers only, so with "
                          "num_layers=1 it does nothing", stacklevel=2)
        check_dtype(layer, dtype)
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout = bias, batch_first, float(dropout)
        self.bidirectional = bidirectional
        directions = 2 if bidirectional else 1
        rows = self.cell.gates * hidden_size
        for k in range(num_layers):
            layer_input = input_size if k == 0 else hidden_size * directions
            for suffix in ("", "_reverse")[:directions]:
                setattr(self, f"weight_ih_l{k}{suffix}", empty_parameter((rows, layer_input), device, dtype))
                setattr(self, f"weight_hh_l{k}{suffix}", empty_parameter((rows, hidden_size), device, dtype))
                if bias:
                    setattr(self, f"bias_ih_l{k}{suffix}", empty_parameter((rows,), device, dtype))
                    setattr(self, f"bias_hh_l{k}{suffix}", empty_parameter((rows,), device, dtype))
        self.reset_parameters()

    def reset_parameters(self):
        bound = 1.0 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            init.uniform_(p, -bound, bound)

    def flatten_parameters(self):
        """PyTorch's call to pack the weights into one cuDNN buffer: nothing to do in minidl, which
        keeps each weight its own array and runs no cuDNN kernel (kept so ported code runs)."""
        return None

    def _step_fn(self):
        return self.cell.step

    def _layer_params(self, k, suffix):
        get = self._parameters.get
        return (get(f"weight_ih_l{k}{suffix}"), get(f"bias_ih_l{k}{suffix}"),
                get(f"weight_hh_l{k}{suffix}"), get(f"bias_hh_l{k}{suffix}"))

    def _initial_states(self, hx, batch, x, unbatched):
        """A list, per layer and direction, of the tuple of initial state tensors (h,) or (h, c)."""
        count = self.num_layers * (2 if self.bidirectional else 1)
        expected = (count, batch, self.hidden_size)
        if hx is None:
            zeros = Tensor(x.xp.zeros(expected, x.dtype))
            hx = (zeros,) * self.cell.state_count
        elif self.cell.state_count == 1:
            hx = (hx,)
        elif not isinstance(hx, (tuple, list)) or len(hx) != 2:
            raise TypeError(f"{type(self).__name__}: the initial state must be a tuple (h_0, c_0)")
        per_state = []
        for h in hx:
            if not isinstance(h, Tensor):
                raise TypeError(f"{type(self).__name__}: initial states must be Tensors, got {type(h).__name__}")
            h = F.reshape(h, h.shape[0], 1, h.shape[1]) if unbatched and h.ndim == 2 else h
            if h.shape != expected:
                raise ValueError(f"{type(self).__name__}: initial state of shape {h.shape}, expected {expected} "
                                 "(num_layers * num_directions, batch, hidden_size)")
            per_state.append(_unbind(h))
        return [tuple(states[i] for states in per_state) for i in range(count)]

    def forward(self, x, hx=None):
        """x: (T, N, input_size), or (N, T, input_size) with batch_first, or unbatched (T, input_size).

        Returns (output, h_n) for RNN and GRU, (output, (h_n, c_n)) for LSTM: output
        (T, N, D·H) (batch first if asked) holds the last layer's h at every step;
        h_n and c_n (num_layers·D, N, H) hold every layer's final state.
        """
        layer = type(self).__name__
        if x.ndim not in (2, 3) or x.shape[-1] != self.input_size:
            layout = f"(N, T, {self.input_size}) (batch_first)" if self.batch_first else f"(T, N, {self.input_size})"
            raise ValueError(f"{layer}: expected input {layout} or unbatched (T, {self.input_size}), "
                             f"got shape {x.shape}")
        unbatched = x.ndim == 2
        if unbatched:
            x = F.reshape(x, x.shape[0], 1, x.shape[1])
        elif self.batch_first:
            x = F.transpose(x, 1, 0, 2)  # the loop runs over the time axis, which goes first
        if x.shape[0] == 0:
            raise ValueError(f"{layer}: the input sequence is empty (0 time steps)")
        states = self._initial_states(hx, x.shape[1], x, unbatched)
        step = self._step_fn()
        directions = 2 if self.bidirectional else 1
        finals = []
        for k in range(self.num_layers):
            outputs = []
            for d, suffix in enumerate(("", "_reverse")[:directions]):
                w_ih, b_ih, w_hh, b_hh = self._layer_params(k, suffix)
                xw = _unbind(F.linear(x, w_ih, b_ih))  # W_ih x + b_ih for all steps at once
                state = states[k * directions + d]
                hs = [None] * len(xw)
                for t in (reversed(range(len(xw))) if d else range(len(xw))):
                    hs[t], state = step(xw[t], state, w_hh, b_hh)
                finals.append(state)
                outputs.append(F.stack(hs, axis=0))
            x = outputs[0] if directions == 1 else F.concatenate(outputs, axis=-1)
            if self.dropout > 0 and self.training and k < self.num_layers - 1:
                x = F.dropout(x, self.dropout, True)
        output = x
        if unbatched:
            output = F.reshape(output, output.shape[0], output.shape[2])
        elif self.batch_first:
            output = F.transpose(output, 1, 0, 2)
        final = [F.stack([s[i] for s in finals], axis=0) for i in range(self.cell.state_count)]
        if unbatched:
            final = [F.reshape(f, f.shape[0], f.shape[2]) for f in final]
        return output, (final[0] if self.cell.state_count == 1 else tuple(final))

    def extra_repr(self):
        text = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            text += f", num_layers={self.num_layers}"
        if getattr(self, "nonlinearity", "tanh") != "tanh":
            text += f", nonlinearity={self.nonlinearity!r}"
        for name, default in (("bias", True), ("batch_first", False), ("dropout", 0.0), ("bidirectional", False)):
            if getattr(self, name) != default:
                text += f", {name}={getattr(self, name)}"
        return text


class RNN(_RNNBase):
    """Elman RNN: h' = tanh(W_ih x + b_ih + W_hh h + b_hh) (``nonlinearity='relu'`` for relu).

    Default initialization: every parameter ~ U(−1/√hidden_size, 1/√hidden_size).
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, nonlinearity: str = "tanh",
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, device=None, dtype=None):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"RNN: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         device, dtype)
        self.nonlinearity = nonlinearity

    _step_fn = RNNCell._step_fn  # tanh or relu, as the cell


class LSTM(_RNNBase):
    """Long short-term memory, gates in PyTorch's order (i, f, g, o); returns (output, (h_n, c_n)).

    Default initialization: every parameter ~ U(−1/√hidden_size, 1/√hidden_size);
    ``nn.init.init_lstm_gate_biases(lstm)`` applies the forget-gate-1 / input- and
    output-gate −1 rule.
    """

    cell = LSTMCell


class GRU(_RNNBase):
    """Gated recurrent unit, gates in PyTorch's order (r, z, n); returns (output, h_n).

    Default initialization: every parameter ~ U(−1/√hidden_size, 1/√hidden_size).
    """

    cell = GRUCell
