"""LSTMUnit: one LSTM time step on precomputed gate inputs (Caffe's LSTMUnitLayer).

Bottoms: c_prev (1, N, H), gate inputs X (1, N, 4H) in the order input, forget, output,
candidate (i, f, o, g), sequence markers cont (1, N). Tops: c (1, N, H), h (1, N, H).

    i = sigmoid(X_i)   f = cont * sigmoid(X_f)   o = sigmoid(X_o)   g = tanh(X_g)
    c = f * c_prev + i * g        h = o * tanh(c)

`cont` = 0 starts a new sequence (the previous cell is forgotten); Caffe cannot backpropagate
to it. The LSTM layer runs the same step through `lstm_step` / `lstm_step_backward`.
"""

from __future__ import annotations

from .base import Layer
from .registry import register_layer


def sigmoid(xp, x):
    """1 / (1 + exp(-x)) in the overflow-free form 0.5 * tanh(x / 2) + 0.5."""
    return 0.5 * xp.tanh(0.5 * x) + 0.5


def lstm_step(xp, c_prev, gates, cont):
    """Forward of one step for (N, H) c_prev, (N, 4H) gates, (N,) cont.

    Returns (c, h, acts) where acts = (i, f, o, g, tanh_c) is what the backward needs."""
    hidden = c_prev.shape[-1]
    i = sigmoid(xp, gates[:, :hidden])
    # Caffe folds the marker into the forget gate: f = cont * sigmoid(X_f).
    f = cont[:, None] * sigmoid(xp, gates[:, hidden:2 * hidden])
    o = sigmoid(xp, gates[:, 2 * hidden:3 * hidden])
    g = xp.tanh(gates[:, 3 * hidden:])
    c = f * c_prev + i * g
    tanh_c = xp.tanh(c)
    return c, o * tanh_c, (i, f, o, g, tanh_c)


def lstm_step_backward(xp, c_prev, acts, c_diff, h_diff, gates_diff):
    """Backward of one step: writes d(gates) into `gates_diff` (N, 4H), returns d(c_prev).

    Uses Caffe's expressions, in which f already holds cont * sigmoid(X_f) (exact for the
    0/1 markers Caffe expects)."""
    i, f, o, g, tanh_c = acts
    hidden = c_prev.shape[-1]
    c_term = c_diff + h_diff * o * (1 - tanh_c * tanh_c)
    gates_diff[:, :hidden] = c_term * g * i * (1 - i)
    gates_diff[:, hidden:2 * hidden] = c_term * c_prev * f * (1 - f)
    gates_diff[:, 2 * hidden:3 * hidden] = h_diff * tanh_c * o * (1 - o)
    gates_diff[:, 3 * hidden:] = c_term * i * (1 - g * g)
    return c_term * f


@register_layer
class LSTMUnit(Layer):
    """One LSTM step: (c_prev, gate inputs, cont) -> (c, h); see the module docstring."""

    type = "LSTMUnit"
    exact_num_bottom = 3
    exact_num_top = 2

    def allow_force_backward(self, bottom_index):
        return bottom_index != 2

    def reshape(self, bottom, top):
        n = bottom[0].shape[1] if bottom[0].num_axes > 1 else None
        for k, blob in enumerate(bottom):
            axes = 2 if k == 2 else 3
            if blob.num_axes != axes or blob.shape[0] != 1 or blob.shape[1] != n:
                raise self.error(f"bottom[{k}] must have shape (1, N{', ...' if k != 2 else ''})"
                                 f" with {axes} axes and N = {n}, got {blob.shape}")
        self.hidden = bottom[0].shape[2]
        if bottom[1].shape[2] != 4 * self.hidden:
            raise self.error(f"bottom[1] (gate inputs) needs 4 * {self.hidden} = "
                             f"{4 * self.hidden} values per item, got {bottom[1].shape[2]}")
        top[0].reshape(bottom[0].shape)
        top[1].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        c, h, _ = lstm_step(self.xp, bottom[0].data[0], bottom[1].data[0], bottom[2].data[0])
        top[0].data[0] = c
        top[1].data[0] = h

    def backward(self, top, propagate_down, bottom):
        if propagate_down[2]:
            raise self.error("cannot backpropagate to the sequence markers (bottom[2])")
        if not (propagate_down[0] or propagate_down[1]):
            return
        xp = self.xp
        c_prev = bottom[0].data[0]
        _, _, acts = lstm_step(xp, c_prev, bottom[1].data[0], bottom[2].data[0])
        gates_diff = xp.empty_like(bottom[1].data[0])
        c_prev_diff = lstm_step_backward(xp, c_prev, acts, top[0].diff[0], top[1].diff[0],
                                         gates_diff)
        # Caffe writes both diffs whenever either is wanted; we honour each flag.
        if propagate_down[0]:
            bottom[0].diff[0] = c_prev_diff
        if propagate_down[1]:
            bottom[1].diff[0] = gates_diff
