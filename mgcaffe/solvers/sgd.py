"""SGDSolver and the solvers built on it (Caffe's sgd_solvers.hpp): Nesterov, AdaGrad,
RMSProp, AdaDelta, Adam. They share SGD's update pipeline (clip, normalise, regularise,
compute the update value, apply) and differ in `compute_update_value` and their history.
"""

from __future__ import annotations

import logging
import time

from . import updates
from .base import Solver
from .evaluation import number

log = logging.getLogger("mgcaffe.solvers")


class SGDSolver(Solver):
    """Stochastic gradient descent with momentum: v = m*v + lr*g; w -= v."""

    type = "SGD"

    def apply_update(self) -> None:
        """Caffe's SGDSolver::ApplyUpdate: clip, then per parameter normalise, regularise,
        compute the update value, and data -= diff (Net::Update; each blob's arithmetic is
        independent of the others', so updating layer by layer is the same)."""
        rate = self.learning_rate_now()
        self.clip_gradients()
        net = self.net
        owned = set()
        for layer in net.learnable_layers:
            t0 = time.perf_counter()
            for i in layer.param_ids:
                self.update_param(i, rate)
                owned.add(i)
            if self.update_times is not None:
                self.update_times[layer.index - 1] = time.perf_counter() - t0
        for i in range(len(net.learnable_params)):
            if i not in owned:
                self.update_param(i, rate)
        self._sumsq = None
        self._update_iter = None

    def learning_rate_now(self) -> float:
        """This iteration's rate (logged on display iterations, as Caffe does); the update
        that follows is this iteration's (`_update_iter`, Adam's step)."""
        p = self.param
        rate = self.get_learning_rate()
        if p.display and self.iter % p.display == 0:
            log.info("Iteration %d, lr = %s", self.iter, number(rate))
        self._update_iter = self.iter
        return rate

    def update_param(self, i: int, rate: float) -> None:
        """Parameter i's whole update: normalise, regularise, update value, data -= diff."""
        self.normalize(i)
        self.regularize(i)
        self.compute_update_value(i, rate)
        blob = self.net.learnable_params[i]
        data = blob.data
        self.net.xp.subtract(data, blob.diff, out=data)

    def clip_gradients(self) -> None:
        """Scale all diffs by clip/norm when their global L2 norm exceeds clip_gradients.

        The norm is of the accumulated (not yet iter_size-normalised) gradient, as in Caffe;
        it was computed by the finiteness check of this iteration.
        """
        clip = self.param.clip_gradients
        if clip < 0:
            return
        sumsq = self._sumsq if self._sumsq is not None else self.gradient_sumsq()
        norm = float(sumsq) ** 0.5
        if norm > clip:
            scale = clip / norm
            log.info("Gradient clipping: scaling down gradients (L2 norm %s > %s) by scale "
                     "factor %s", number(norm), number(clip), number(scale))
            for blob in self.net.learnable_params:
                blob.diff *= scale

    def normalize(self, i: int) -> None:
        """Divide the accumulated gradient by iter_size."""
        n = self.param.iter_size
        if n > 1:
            self.net.learnable_params[i].diff *= 1.0 / n

    def regularize(self, i: int) -> None:
        """Add weight decay * decay_mult (L2: times w; L1: times sign(w))."""
        decay = self.param.weight_decay * self.net.params_weight_decay[i]
        if not decay:
            return
        blob = self.net.learnable_params[i]
        if self.param.regularization_type == "L1":
            updates.regularize_l1(blob.diff, blob.data, decay, self._scratch[i])
        else:
            updates.regularize_l2(blob.diff, blob.data, decay, self._scratch[i])

    def local_rate(self, i: int, rate: float) -> float:
        return rate * self.net.params_lr[i]

    def compute_update_value(self, i: int, rate: float) -> None:
        """Replace parameter i's diff by the value Net.update() subtracts."""
        updates.sgd(self.net.learnable_params[i].diff, self.history[i], self._scratch[i],
                    self.local_rate(i, rate), self.param.momentum)

    def _second_history(self, i: int):
        return self.history[len(self.net.learnable_params) + i]


class NesterovSolver(SGDSolver):
    """Nesterov's accelerated gradient, in Caffe's "step back, then over-step" form."""

    type = "Nesterov"

    def compute_update_value(self, i: int, rate: float) -> None:
        updates.nesterov(self.net.learnable_params[i].diff, self.history[i], self._scratch[i],
                         self.local_rate(i, rate), self.param.momentum)


class AdaGradSolver(SGDSolver):
    """AdaGrad: the rate divided by the root of the summed squared gradients."""

    type = "AdaGrad"

    def compute_update_value(self, i: int, rate: float) -> None:
        updates.adagrad(self.net.learnable_params[i].diff, self.history[i], self._scratch[i],
                        self.local_rate(i, rate), self.param.delta)


class RMSPropSolver(SGDSolver):
    """RMSProp: the rate divided by the root of a decaying mean of squared gradients."""

    type = "RMSProp"

    def compute_update_value(self, i: int, rate: float) -> None:
        updates.rmsprop(self.net.learnable_params[i].diff, self.history[i], self._scratch[i],
                        self.local_rate(i, rate), self.param.rms_decay, self.param.delta)


class AdaDeltaSolver(SGDSolver):
    """AdaDelta: history[0:n] squared gradients, history[n:2n] squared updates."""

    type = "AdaDelta"
    history_sets = 2

    def compute_update_value(self, i: int, rate: float) -> None:
        updates.adadelta(self.net.learnable_params[i].diff, self.history[i],
                         self._second_history(i), self._scratch[i], self.local_rate(i, rate),
                         self.param.momentum, self.param.delta)


class AdamSolver(SGDSolver):
    """Adam: history[0:n] first moments, history[n:2n] second moments."""

    type = "Adam"
    history_sets = 2

    def compute_update_value(self, i: int, rate: float) -> None:
        p = self.param
        # Caffe uses t = iter + 1 in the bias correction: a resumed run continues it. The
        # iteration whose gradient this is (a per-layer update runs in the next one).
        updates.adam(self.net.learnable_params[i].diff, self.history[i],
                     self._second_history(i), self._scratch[i], self.local_rate(i, rate),
                     p.momentum, p.momentum2, p.delta,
                     (self.iter if self._update_iter is None else self._update_iter) + 1)
