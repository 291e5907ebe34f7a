"""Caffe's recurrent layers, RNN and LSTM: time-major (T, N, ...) inputs with `cont` markers.

Caffe builds an unrolled net of T time steps whose steps share one set of weights; here each
layer runs the same computation as a loop over time with that one set of weights, which is
what the unrolled net's parameter sharing amounts to. The parameters are ordinary learnable
blobs of the layer, in the order Caffe's unrolled net owns them:

    LSTM: W_xc (4H, K), b_c (4H,), [W_xc_static (4H, K_static)], W_hc (4H, H)
    RNN:  W_xh (H, K), b_h (H,), [W_xh_static (H, K_static)], W_hh (H, H), W_ho (H, H), b_o (H,)

with H = recurrent_param.num_output, K = the product of x's axes after the first two, all
weights filled by weight_filler and biases by bias_filler (InnerProduct layout, so a
Caffe-trained .caffemodel loads as is).

Bottoms: x (T, N, ...), cont (T, N) (0 starts a new sequence in that stream: the state from
the previous step is dropped), an optional static input x_static (N, ...) added to every step,
then with `expose_hidden` the initial state (h_0, and c_0 for LSTM) as (1, N, H) blobs.
Tops: the per-step outputs (T, N, H), then with `expose_hidden` the final state (h_T [, c_T]).

Without `expose_hidden` the final state of one forward is the initial state of the next (zero
at first), as in Caffe; a `cont` of 0 at t = 0 makes each batch independent. Gradients never
flow into `cont`. Unlike Caffe (whose unrolled net shares only the data of the exposed state
blobs) gradients do flow from the h_T/c_T tops and into the h_0/c_0 bottoms, so a net that
chains two recurrent layers through their exposed state trains through the link.
"""

from __future__ import annotations

import logging

from .base import Layer
from .layer_util import count, ensure_param_blob
from .lstm_unit import lstm_step, lstm_step_backward
from .registry import register_layer

log = logging.getLogger(__name__)


class RecurrentLayer(Layer):
    """What RNN and LSTM share: input checks, parameters, carried state, debug output."""

    min_bottom = 2
    min_top = 1
    #: Subclasses: the state blobs per stream ("h", or "h", "c") and the gate width factor.
    state_names: tuple[str, ...] = ()
    gate_factor = 1

    def allow_force_backward(self, bottom_index):
        return bottom_index != 1

    def layer_setup(self, bottom, top):
        p = self.param.recurrent_param
        self.hidden = int(p.num_output)
        if self.hidden <= 0:
            raise self.error("recurrent_param.num_output must be positive")
        self.expose_hidden = bool(p.expose_hidden)
        self.debug_info = bool(p.debug_info)
        n_state = len(self.state_names) if self.expose_hidden else 0
        extra = len(bottom) - 2 - n_state
        if extra not in (0, 1):
            raise self.error(f"takes x, cont, an optional x_static"
                             f"{' and ' + ', '.join(s + '_0' for s in self.state_names)}"
                             f"{'' if self.expose_hidden else ' (expose_hidden is false)'}; "
                             f"got {len(bottom)} bottoms")
        self.static_input = extra == 1
        if len(top) != 1 + n_state:
            finals = "".join(f", {s}_T" for s in self.state_names) if n_state else ""
            raise self.error(f"needs {1 + n_state} top(s) (the output{finals}), "
                             f"got {len(top)}")
        x = bottom[0]
        if x.num_axes < 2:
            raise self.error(f"bottom[0] must have at least 2 axes (#timesteps, #streams, "
                             f"...), got shape {x.shape}")
        self.T = x.shape[0]
        log.info("Initializing recurrent layer: assuming input batch contains %d timesteps "
                 "of %d independent streams.", self.T, x.shape[1])
        width = self.gate_factor * self.hidden
        weights = [("x_weight", (width, count(x.shape, 2)), p.weight_filler),
                   ("x_bias", (width,), p.bias_filler)]
        if self.static_input:
            if bottom[2].num_axes < 1:
                raise self.error("x_static (bottom[2]) needs at least 1 axis")
            weights.append(("static_weight", (width, count(bottom[2].shape, 1)),
                            p.weight_filler))
        weights.append(("h_weight", (width, self.hidden), p.weight_filler))
        weights += self.extra_params(p)
        for i, (what, shape, filler) in enumerate(weights):
            ensure_param_blob(self, i, shape, filler, what)
        if len(self.blobs) != len(weights):
            raise self.error(f"expected {len(weights)} parameter blobs, found {len(self.blobs)}")
        self._state = None

    def extra_params(self, p):
        """Parameters after the recurrent weight (RNN's output transform)."""
        return []

    # -- parameter views ------------------------------------------------------------------
    @property
    def _h_weight_index(self):
        return 3 if self.static_input else 2

    def reshape(self, bottom, top):
        x, cont = bottom[0], bottom[1]
        if x.num_axes < 2:
            raise self.error(f"bottom[0] must have at least 2 axes (#timesteps, #streams, "
                             f"...), got shape {x.shape}")
        if x.shape[0] != self.T:
            raise self.error(f"input number of timesteps changed from {self.T} to "
                             f"{x.shape[0]}")
        self.N = x.shape[1]
        if cont.shape != (self.T, self.N):
            raise self.error(f"cont (bottom[1]) must have shape (T, N) = {(self.T, self.N)}, "
                             f"got {cont.shape}")
        if count(x.shape, 2) != self.blobs[0].shape[1]:
            raise self.error(f"x has {count(x.shape, 2)} values per step and stream, the "
                             f"weights expect {self.blobs[0].shape[1]}")
        if self.static_input:
            xs = bottom[2]
            if xs.shape[0] != self.N or count(xs.shape, 1) != self.blobs[2].shape[1]:
                raise self.error(f"x_static (bottom[2]) must have shape (N = {self.N}, "
                                 f"{self.blobs[2].shape[1]} values), got {xs.shape}")
        state_shape = (1, self.N, self.hidden)
        if self.expose_hidden:
            first = 2 + self.static_input
            for k, name in enumerate(self.state_names):
                if bottom[first + k].shape != state_shape:
                    raise self.error(f"{name}_0 (bottom[{first + k}]) must have shape "
                                     f"{state_shape}, got {bottom[first + k].shape}")
        if self._state is None or self._state[0].shape != (self.N, self.hidden):
            self._state = [self.xp.zeros((self.N, self.hidden), dtype=self.dtype)
                           for _ in self.state_names]
        top[0].reshape((self.T, self.N, self.hidden))
        for k in range(1, len(top)):
            top[k].reshape(state_shape)

    def reset(self):
        """Zero the carried state (Caffe's RecurrentLayer::Reset)."""
        if self._state is not None:
            for s in self._state:
                s[...] = 0

    # -- shared pieces of forward/backward ------------------------------------------------
    def _initial_state(self, bottom):
        if self.expose_hidden:
            first = 2 + self.static_input
            return [bottom[first + k].data[0] for k in range(len(self.state_names))]
        return self._state

    def _input_terms(self, bottom):
        """x @ W_x.T + b as (T, N, G), plus the static term (N, G) or None."""
        xp = self.xp
        x2 = bottom[0].data.reshape(self.T * self.N, -1)
        pre = xp.matmul(x2, self.blobs[0].data.T) + self.blobs[1].data
        static = None
        if self.static_input:
            xs = bottom[2].data.reshape(self.N, -1)
            static = xp.matmul(xs, self.blobs[2].data.T)
        return pre.reshape(self.T, self.N, -1), static

    def _input_backward(self, bottom, propagate_down, pre_diff):
        """Given d(loss)/d(x @ W_x.T + b [+ static term]) as (T, N, G): parameter and
        x / x_static gradients."""
        xp = self.xp
        g2 = pre_diff.reshape(self.T * self.N, -1)
        x2 = bottom[0].data.reshape(self.T * self.N, -1)
        if self.param_propagate_down[0]:
            self.blobs[0].diff += xp.matmul(g2.T, x2)
        if self.param_propagate_down[1]:
            self.blobs[1].diff += g2.sum(axis=0)
        if propagate_down[0]:
            bottom[0].diff[...] = xp.matmul(g2, self.blobs[0].data).reshape(bottom[0].shape)
        if self.static_input:
            s_diff = pre_diff.sum(axis=0)
            if self.param_propagate_down[2]:
                xs = bottom[2].data.reshape(self.N, -1)
                self.blobs[2].diff += xp.matmul(s_diff.T, xs)
            if propagate_down[2]:
                bottom[2].diff[...] = xp.matmul(s_diff, self.blobs[2].data).reshape(
                    bottom[2].shape)

    def _finish_forward(self, top, final_state):
        if self.expose_hidden:
            for k, s in enumerate(final_state):
                top[1 + k].data[0] = s
        else:
            for stored, s in zip(self._state, final_state):
                stored[...] = s
        if self.debug_info:
            for k, t in enumerate(top):
                log.info("    [Forward] Layer %s, top blob %d data: %.6g", self.name, k,
                         float(abs(t.data).mean()))

    def _state_diffs(self, top):
        """Diffs arriving at the exposed final state tops (zeros when not exposed)."""
        if self.expose_hidden:
            return [top[1 + k].diff[0] for k in range(len(self.state_names))]
        return [self.xp.zeros((self.N, self.hidden), dtype=self.dtype)
                for _ in self.state_names]

    def _finish_backward(self, bottom, propagate_down, initial_diffs):
        if self.expose_hidden:
            first = 2 + self.static_input
            for k, d in enumerate(initial_diffs):
                if propagate_down[first + k]:
                    bottom[first + k].diff[0] = d
        if self.debug_info:
            for k, b in enumerate(self.blobs):
                log.info("    [Backward] Layer %s, param blob %d diff: %.6g", self.name, k,
                         float(abs(b.diff).mean()))

    def _check_cont(self, propagate_down):
        if propagate_down[1]:
            raise self.error("cannot backpropagate to the sequence markers (bottom[1], cont)")


@register_layer
class LSTM(RecurrentLayer):
    """Long short-term memory over T steps; gates input, forget, output, candidate."""

    type = "LSTM"
    max_bottom = 5
    max_top = 3
    state_names = ("h", "c")
    gate_factor = 4

    def forward(self, bottom, top):
        xp = self.xp
        pre, static = self._input_terms(bottom)
        cont = bottom[1].data
        w_h = self.blobs[self._h_weight_index].data
        h_prev, c_prev = (s.copy() for s in self._initial_state(bottom))
        steps = []
        for t in range(self.T):
            h_conted = cont[t][:, None] * h_prev
            gates = pre[t] + xp.matmul(h_conted, w_h.T)
            if static is not None:
                gates += static
            c, h, acts = lstm_step(xp, c_prev, gates, cont[t])
            steps.append((h_conted, c_prev, acts))
            top[0].data[t] = h
            h_prev, c_prev = h, c
        self._steps = steps
        self._finish_forward(top, (h_prev, c_prev))

    def backward(self, top, propagate_down, bottom):
        self._check_cont(propagate_down)
        xp = self.xp
        cont = bottom[1].data
        wi = self._h_weight_index
        w_h = self.blobs[wi].data
        h_next_diff, c_next_diff = self._state_diffs(top)
        pre_diff = xp.empty((self.T, self.N, 4 * self.hidden), dtype=self.dtype)
        w_h_diff = xp.zeros_like(w_h)
        for t in reversed(range(self.T)):
            h_conted, c_prev, acts = self._steps[t]
            h_diff = top[0].diff[t] + h_next_diff
            c_next_diff = lstm_step_backward(xp, c_prev, acts, c_next_diff, h_diff, pre_diff[t])
            w_h_diff += xp.matmul(pre_diff[t].T, h_conted)
            h_next_diff = xp.matmul(pre_diff[t], w_h) * cont[t][:, None]
        if self.param_propagate_down[wi]:
            self.blobs[wi].diff += w_h_diff
        self._input_backward(bottom, propagate_down, pre_diff)
        self._finish_backward(bottom, propagate_down, (h_next_diff, c_next_diff))


@register_layer
class RNN(RecurrentLayer):
    """Elman network: h_t = tanh(W_xh x_t + b_h + W_hh (cont_t h_{t-1})), o_t = tanh(W_ho h_t
    + b_o); the top is o."""

    type = "RNN"
    max_bottom = 4
    max_top = 2
    state_names = ("h",)

    def extra_params(self, p):
        return [("out_weight", (self.hidden, self.hidden), p.weight_filler),
                ("out_bias", (self.hidden,), p.bias_filler)]

    def forward(self, bottom, top):
        xp = self.xp
        pre, static = self._input_terms(bottom)
        cont = bottom[1].data
        wi = self._h_weight_index
        w_h = self.blobs[wi].data
        (h_prev,) = (s.copy() for s in self._initial_state(bottom))
        hs = xp.empty((self.T, self.N, self.hidden), dtype=self.dtype)
        conted = []
        for t in range(self.T):
            h_conted = cont[t][:, None] * h_prev
            a = pre[t] + xp.matmul(h_conted, w_h.T)
            if static is not None:
                a += static
            xp.tanh(a, out=hs[t])
            conted.append(h_conted)
            h_prev = hs[t]
        out = xp.matmul(hs.reshape(self.T * self.N, -1), self.blobs[wi + 1].data.T)
        out += self.blobs[wi + 2].data
        xp.tanh(out, out=out)
        top[0].data[...] = out.reshape(top[0].shape)
        self._hs, self._conted = hs, conted
        self._finish_forward(top, (h_prev,))

    def backward(self, top, propagate_down, bottom):
        self._check_cont(propagate_down)
        xp = self.xp
        cont = bottom[1].data
        wi = self._h_weight_index
        w_h, w_o = self.blobs[wi].data, self.blobs[wi + 1].data
        hs2 = self._hs.reshape(self.T * self.N, -1)
        o = top[0].data.reshape(self.T * self.N, -1)
        o_diff = top[0].diff.reshape(self.T * self.N, -1) * (1 - o * o)
        if self.param_propagate_down[wi + 1]:
            self.blobs[wi + 1].diff += xp.matmul(o_diff.T, hs2)
        if self.param_propagate_down[wi + 2]:
            self.blobs[wi + 2].diff += o_diff.sum(axis=0)
        h_out_diff = xp.matmul(o_diff, w_o).reshape(self.T, self.N, -1)
        (h_next_diff,) = self._state_diffs(top)
        pre_diff = xp.empty((self.T, self.N, self.hidden), dtype=self.dtype)
        w_h_diff = xp.zeros_like(w_h)
        for t in reversed(range(self.T)):
            h = self._hs[t]
            pre_diff[t] = (h_out_diff[t] + h_next_diff) * (1 - h * h)
            w_h_diff += xp.matmul(pre_diff[t].T, self._conted[t])
            h_next_diff = xp.matmul(pre_diff[t], w_h) * cont[t][:, None]
        if self.param_propagate_down[wi]:
            self.blobs[wi].diff += w_h_diff
        self._input_backward(bottom, propagate_down, pre_diff)
        self._finish_backward(bottom, propagate_down, (h_next_diff,))
