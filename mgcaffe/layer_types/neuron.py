"""Element-wise activation layers: ReLU, ELU, Sigmoid, TanH, AbsVal, BNLL, Threshold, Clip, Swish.

Every neuron layer may run in place (the Net passes the same Blob as bottom and top). Backward
passes then read the top data where the input can be recovered from it (ReLU, ELU, Sigmoid,
TanH), and otherwise a copy of the input kept by the forward (`NeuronLayer.needs_input`).
"""

from __future__ import annotations

from ..cpu.parallel import for_each_chunk
from .base import Layer
from .layer_util import in_place
from .registry import register_layer


class NeuronLayer(Layer):
    """One bottom, one top of the same shape; subclasses write `forward`/`backward`.

    `needs_input` says whether backward reads the original input x; when the layer runs in
    place, `keep_input` copies x before the forward overwrites it and `input_data` returns
    that copy (or bottom data when not in place).
    """

    exact_num_bottom = 1
    exact_num_top = 1
    needs_input = False

    def __init__(self, param, ctx=None):
        super().__init__(param, ctx)
        self._input_copy = None

    def reshape(self, bottom, top):
        if top[0] is not bottom[0]:
            top[0].reshape(bottom[0].shape)

    def keep_input(self, bottom, top):
        """Copy bottom data aside when in place and backward will need it."""
        if not (self.needs_input and in_place(bottom, top)):
            return
        x = bottom[0].data
        if self._input_copy is None or self._input_copy.shape != x.shape:
            self._input_copy = self.xp.empty_like(x)
        self.xp.copyto(self._input_copy, x)

    def by_sample(self, body, like) -> None:
        """body(part) over parts of arrays shaped like `like` (an index: a slice of the first
        axis, or `...`), split over the CPU cores (kernels.parallel): an element-wise pass is
        a memory-bound loop that numpy runs on one core."""
        if like.ndim == 0 or like.shape[0] == 0:
            body(...)
            return
        count = like.shape[0]
        for_each_chunk(self.xp, count, lambda start, stop: body(slice(start, stop)),
                       item_elements=like.size // count, cache_sized=False,
                       runner=self.ctx.chunk_runner)

    def input_data(self, bottom, top):
        """The forward's input x, for backward."""
        if self.needs_input and in_place(bottom, top):
            return self._input_copy
        return bottom[0].data


@register_layer
class ReLULayer(NeuronLayer):
    """y = max(x, 0) + negative_slope * min(x, 0)."""

    type = "ReLU"

    def layer_setup(self, bottom, top):
        self.negative_slope = float(self.param.relu_param.negative_slope)
        # With slope >= 0, y > 0 exactly when x > 0, so an in-place backward can use y.
        self.needs_input = self.negative_slope < 0

    def forward(self, bottom, top):
        self.keep_input(bottom, top)
        xp, x, y = self.xp, bottom[0].data, top[0].data
        if self.negative_slope == 0:
            self.by_sample(lambda part: xp.maximum(x[part], 0, out=y[part]), x)
            return
        negative = xp.minimum(x, 0)
        xp.maximum(x, 0, out=y)
        negative *= self.negative_slope
        y += negative

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = self.xp
        x = self.input_data(bottom, top) if self.needs_input else top[0].data
        dy, dx = top[0].diff, bottom[0].diff
        if self.negative_slope == 0:
            self.by_sample(lambda part: xp.multiply(dy[part], x[part] > 0, out=dx[part]), x)
            return
        positive = x > 0
        slope = positive.astype(self.dtype)
        slope += (~positive) * self.dtype.type(self.negative_slope)
        xp.multiply(dy, slope, out=dx)


@register_layer
class ELULayer(NeuronLayer):
    """y = x for x > 0, alpha * (exp(x) - 1) otherwise."""

    type = "ELU"

    def layer_setup(self, bottom, top):
        self.alpha = float(self.param.elu_param.alpha)
        # For alpha >= 0 the sign of y matches the sign of x (y = 0 only where the gradient
        # is alpha + y = 0 anyway), so y suffices in place.
        self.needs_input = self.alpha < 0

    def forward(self, bottom, top):
        self.keep_input(bottom, top)
        xp, x, y = self.xp, bottom[0].data, top[0].data
        negative = xp.minimum(x, 0)
        xp.expm1(negative, out=negative)
        negative *= self.alpha
        xp.maximum(x, 0, out=y)
        y += negative

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = self.xp
        y = top[0].data
        x = self.input_data(bottom, top) if self.needs_input else y
        positive = x > 0
        # Caffe: dy * ((x > 0) + (alpha + y) * (x <= 0)).
        slope = y + self.dtype.type(self.alpha)
        slope *= ~positive
        slope += positive
        xp.multiply(top[0].diff, slope, out=bottom[0].diff)


@register_layer
class SigmoidLayer(NeuronLayer):
    """y = 1 / (1 + exp(-x)), computed as Caffe does: 0.5 * tanh(0.5 x) + 0.5."""

    type = "Sigmoid"

    def forward(self, bottom, top):
        xp, y = self.xp, top[0].data
        xp.multiply(bottom[0].data, 0.5, out=y)
        xp.tanh(y, out=y)
        y *= 0.5
        y += 0.5

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        y = top[0].data
        slope = 1 - y
        slope *= y
        self.xp.multiply(top[0].diff, slope, out=bottom[0].diff)


@register_layer
class TanHLayer(NeuronLayer):
    """y = tanh(x)."""

    type = "TanH"

    def forward(self, bottom, top):
        self.xp.tanh(bottom[0].data, out=top[0].data)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        y = top[0].data
        slope = y * y
        self.xp.subtract(1, slope, out=slope)
        self.xp.multiply(top[0].diff, slope, out=bottom[0].diff)


@register_layer
class AbsValLayer(NeuronLayer):
    """y = |x|; the gradient is sign(x) (0 at 0)."""

    type = "AbsVal"
    needs_input = True

    def forward(self, bottom, top):
        self.keep_input(bottom, top)
        self.xp.abs(bottom[0].data, out=top[0].data)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        sign = self.xp.sign(self.input_data(bottom, top))
        self.xp.multiply(top[0].diff, sign, out=bottom[0].diff)


@register_layer
class BNLLLayer(NeuronLayer):
    """Binomial normal log likelihood: y = log(1 + exp(x)), evaluated without overflow."""

    type = "BNLL"
    needs_input = True
    #: Caffe clips x at this value before exp in the gradient.
    threshold = 50.0

    def forward(self, bottom, top):
        self.keep_input(bottom, top)
        xp, x, y = self.xp, bottom[0].data, top[0].data
        # max(x, 0) + log(1 + exp(-|x|)) equals Caffe's two-branch formula.
        tail = xp.abs(x)
        xp.negative(tail, out=tail)
        xp.exp(tail, out=tail)
        xp.log1p(tail, out=tail)
        xp.maximum(x, 0, out=y)
        y += tail

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = self.xp
        e = xp.minimum(self.input_data(bottom, top), self.threshold)
        xp.exp(e, out=e)
        slope = e + 1
        xp.divide(e, slope, out=slope)
        xp.multiply(top[0].diff, slope, out=bottom[0].diff)


@register_layer
class ThresholdLayer(NeuronLayer):
    """y = 1 if x > threshold else 0. No backward, as in Caffe."""

    type = "Threshold"

    def layer_setup(self, bottom, top):
        self.threshold = float(self.param.threshold_param.threshold)

    def forward(self, bottom, top):
        self.xp.greater(bottom[0].data, self.threshold, out=top[0].data)

    def allow_force_backward(self, bottom_index):
        return False

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            raise self.error("Threshold has no gradient; it cannot propagate down")


@register_layer
class ClipLayer(NeuronLayer):
    """y = max(min, min(x, max)); the gradient passes where min <= x <= max."""

    type = "Clip"
    needs_input = True

    def layer_setup(self, bottom, top):
        self.low = float(self.param.clip_param.min)
        self.high = float(self.param.clip_param.max)

    def forward(self, bottom, top):
        self.keep_input(bottom, top)
        xp, y = self.xp, top[0].data
        xp.minimum(bottom[0].data, self.high, out=y)
        xp.maximum(y, self.low, out=y)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        x = self.input_data(bottom, top)
        inside = x >= self.low
        inside &= x <= self.high
        self.xp.multiply(top[0].diff, inside, out=bottom[0].diff)


@register_layer
class SwishLayer(NeuronLayer):
    """y = x * sigmoid(beta * x); the sigmoid is kept for backward."""

    type = "Swish"

    def layer_setup(self, bottom, top):
        self.beta = float(self.param.swish_param.beta)
        self._sigmoid = None

    def forward(self, bottom, top):
        xp, x = self.xp, bottom[0].data
        if self._sigmoid is None or self._sigmoid.shape != x.shape:
            self._sigmoid = xp.empty_like(x)
        s = self._sigmoid
        xp.multiply(x, 0.5 * self.beta, out=s)
        xp.tanh(s, out=s)
        s *= 0.5
        s += 0.5
        xp.multiply(x, s, out=top[0].data)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        # Caffe: dy * (beta*y + sigmoid(beta*x) * (1 - beta*y)).
        s = self._sigmoid
        beta_y = top[0].data * self.dtype.type(self.beta)
        slope = 1 - beta_y
        slope *= s
        slope += beta_y
        self.xp.multiply(top[0].diff, slope, out=bottom[0].diff)
