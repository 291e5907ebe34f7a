"""The Solver: builds the train and test nets and runs Caffe's training loop.

One iteration (docs/design.md, "Solver contract"): clear parameter diffs, iter_size x
`net.forward_backward` (the last one passes `gradient_sync.on_learnable_done`), then the
iteration's update mode (update_mode.py): Caffe's barrier (`gradient_sync.wait()`, check the
gradients are finite, `apply_update()`: the subclass's rule: clip, normalise by iter_size,
regularise, compute the update value, `net.update()`), or, with a gradient sync that reduces
layer by layer, each layer's update right before the next forward reads it. Testing,
display, snapshots and stop requests happen where Caffe's Solver::Step does them, with
Caffe's log lines. The loss and the gradients are checked for non-finite values every
iteration (finite.py).

Outside control (the distributed trainer, signals) plugs in without the solver knowing it:
`action_function()` returns a SolverAction after each iteration (Caffe's
SetActionFunction), and each object in `iteration_hooks` may define
`before_iteration(solver)`, `gradients_ready(solver)` (after backward and gradient sync,
before the update), `after_iteration(solver)` and `should_stop() -> bool`. pycaffe's
`solver.add_callback(on_start, on_gradients_ready)` is one such hook. A hook whose
before_iteration reads parameter diffs only afresh (`blob.diff`, `net.param_diff_buffer`,
never an array kept from an earlier read) says so with `reads_param_diffs_afresh = True`:
the iteration's clear may then stay lazy (Net.clear_param_diffs_for_pass).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, ClassVar

import numpy as np
from google.protobuf import text_format

from ..backend import CPU, Device, gpu_available
from ..cpu.engine import CpuEngine
from ..errors import SolverError
from ..formats.protoio import read_net_to_build, require_layers
from ..formats.snapshot_lock import acquire
from ..layer_types.choice.rules import LayerRules
from ..net import Net
from ..net.weights import report_initialised, weights_bytes
from ..proto import caffe_pb2
from . import data_position, evaluation, finite, progress
from . import snapshot as snap
from .actions import SolverAction
from .evaluation import number
from .lr_policy import learning_rate
from .params import check_solver_param, load_solver_param, resolve_net_path
from .update_mode import UpdateMode, blockers

log = logging.getLogger("mgcaffe.solvers")


def select_device(param: caffe_pb2.SolverParameter, device: Device | None,
                  source: str) -> Device:
    """The device to train on.

    An explicit `device` (the command line's --gpu, or the caller) is obeyed, and a GPU
    that is not there is an error. Otherwise solver_mode decides, as in `caffe train`: only
    a `solver_mode: GPU` written in the file selects the GPU (device_id); since most solver
    files copied from Caffe say GPU, it falls back to the CPU, with a warning, when no GPU
    is usable.
    """
    if device is not None:
        if device.kind == "gpu" and not gpu_available():
            raise SolverError(f"{source}: {device} requested but no GPU is usable (CuPy "
                              "missing or no CUDA device); train on the CPU instead")
        return device
    if param.HasField("solver_mode") and param.solver_mode == caffe_pb2.SolverParameter.GPU:
        if gpu_available():
            return Device("gpu", param.device_id)
        log.warning("solver_mode is GPU but no GPU is usable (CuPy missing or no CUDA "
                    "device): using the CPU")
    return CPU


class Solver:
    """Caffe's Solver. Subclasses set `type`, `history_sets` and `compute_update_value`.

    `Solver(path_or_param, *, device=None, rank=0, world_size=1, gradient_sync=None,
    iteration_hooks=(), action_function=None, dtype=np.float32, rules=None, cpu=None)`;
    `solver_path` names the file a given SolverParameter came from (relative net paths,
    messages); `rules` the layers' path rules of its nets (`layer_types.choice.rules.LayerRules`);
    `cpu` the CPU engine its nets share (`cpu.engine.CpuEngine`; default
    `CpuEngine.library_default()`). pycaffe attributes:
    `net`, `test_nets`, `iter`, `param`; methods `step`, `solve`, `snapshot`, `restore`.
    """

    type: ClassVar[str] = ""
    #: History blobs per learnable parameter (2 for AdaDelta and Adam, as in Caffe).
    history_sets: ClassVar[int] = 1

    def __init__(self, source, *, device: Device | None = None, rank: int = 0,
                 world_size: int = 1, gradient_sync=None, iteration_hooks=(),
                 action_function=None, dtype=np.float32, solver_path: str | None = None,
                 rules: LayerRules | None = None, cpu: CpuEngine | None = None):
        param, path = load_solver_param(source)
        path = path or solver_path  # a message read from `solver_path` by get_solver
        self.source = path or "<solver>"
        self.solver_path = path
        if self.type and param.type != self.type:
            if param.HasField("type"):
                log.warning("%s: type is %r; building a %s solver as asked", self.source,
                            param.type, self.type)
            param.type = self.type
        check_solver_param(param, self.source)
        self.param = param
        self.rank, self.world_size = int(rank), int(world_size)
        self.device = select_device(param, device, self.source)
        self.dtype = np.dtype(dtype)
        #: The layers' path rules every net of this solver is built with.
        self.rules = rules
        #: The CPU engine (chunk runner, per-layer way) its nets share: they run one after
        #: the other, under one thread setting.
        self.cpu = cpu if cpu is not None else CpuEngine.library_default()
        self.gradient_sync = gradient_sync
        self.iteration_hooks = list(iteration_hooks)
        self.action_function = action_function
        self.iter = 0
        self.current_step = 0
        self.last_snapshot: tuple[str, str] | None = None
        self._snapshot_iter: int | None = None  # the iteration of the last snapshot taken
        self._snapshot_lock = None
        self._requested_early_exit = False
        self._losses: list[float] = []
        self._smoothed_loss = 0.0
        self._sumsq: float | None = None  # this iteration's sum of squared diffs
        self._update_iter: int | None = None  # the iteration whose update is being applied
        # seconds of the latest update per learnable layer, when a list (the profile's)
        self.update_times: list[float] | None = None
        #: barrier or per layer, chosen each iteration (update_mode.py)
        self.update_mode = UpdateMode(self)
        # Every rank gets the same seed, so that initial weights agree without a broadcast
        # (Caffe adds the rank and broadcasts rank 0's weights instead). Without a
        # random_seed the ranks' fillers differ and the trainer must broadcast.
        self._seed = int(param.random_seed) if param.random_seed >= 0 else None
        if self.rank == 0:
            log.info("Initializing solver from parameters: \n%s",
                     text_format.MessageToString(param))
        self._check_snapshot_dir()
        self.net = self._init_train_net()
        self.test_nets = self._init_test_nets() if self.rank == 0 else []
        for weights in param.weights:
            self.load_weights(weights)
        xp = self.net.xp
        params = self.net.learnable_params
        self.history = [xp.zeros(b.shape, dtype=b.dtype)
                        for _ in range(self.history_sets) for b in params]
        self._scratch = [xp.zeros(b.shape, dtype=b.dtype) for b in params]
        log.info("Solver scaffolding done.")

    # -- nets -----------------------------------------------------------------------------
    def _read_net(self, field: str, value):

        if isinstance(value, caffe_pb2.NetParameter):
            return read_net_to_build(value, f"{self.source}: {field}")
        return read_net_to_build(resolve_net_path(value, self.solver_path, field))

    def _make_net(self, net_param, state: caffe_pb2.NetState):

        net_param.state.CopyFrom(state)
        return Net(net_param, state.phase, level=state.level, stages=tuple(state.stage),
                   device=self.device, dtype=self.dtype, seed=self._seed, rank=self.rank,
                   world_size=self.world_size, rules=self.rules, cpu=self.cpu)

    def _init_train_net(self):
        p = self.param
        if p.HasField("train_net_param"):
            log.info("Creating training net specified in train_net_param.")
            net_param = self._read_net("train_net_param", p.train_net_param)
        elif p.HasField("train_net"):
            log.info("Creating training net from train_net file: %s", p.train_net)
            net_param = self._read_net("train_net", p.train_net)
        elif p.HasField("net_param"):
            log.info("Creating training net specified in net_param.")
            net_param = self._read_net("net_param", p.net_param)
        else:
            log.info("Creating training net from net file: %s", p.net)
            net_param = self._read_net("net", p.net)
        # NetState precedence (Caffe): TRAIN default < the net's own state < train_state.
        state = caffe_pb2.NetState(phase=caffe_pb2.TRAIN)
        state.MergeFrom(net_param.state)
        state.MergeFrom(p.train_state)
        net = self._make_net(net_param, state)

        require_layers(net, f"{self.source}: the training net", "train")
        return net

    def _init_test_nets(self) -> list:
        p = self.param
        specs: list[tuple[str, Any, str]] = []
        specs += [("test_net_param", n, "test_net_param") for n in p.test_net_param]
        specs += [("test_net", n, f"test_net file: {n}") for n in p.test_net]
        # A generic net (net/net_param) serves every test_iter left over.
        for _ in range(len(p.test_iter) - len(specs)):
            if p.HasField("net_param"):
                specs.append(("net_param", p.net_param, "net_param"))
            else:
                specs.append(("net", p.net, f"net file: {p.net}"))
        nets = []
        for i, (field, value, description) in enumerate(specs):
            net_param = self._read_net(field, value)
            state = caffe_pb2.NetState(phase=caffe_pb2.TEST)
            state.MergeFrom(net_param.state)
            if p.test_state:
                state.MergeFrom(p.test_state[i])
            log.info("Creating test net (#%d) specified by %s", i, description)
            net = self._make_net(net_param, state)
            net.share_weights(self.net)
            nets.append(net)
        return nets

    def load_weights(self, paths: str) -> None:
        """Finetune from comma-separated weight files (.caffemodel or .caffemodel.h5)."""

        loaded: set[str] = set()
        for path in [s for s in paths.split(",") if s]:
            log.info("Finetuning from %s", path)
            loaded |= snap.load_weights(self.net, path)
            for net in self.test_nets:
                net.share_weights(self.net)
        report_initialised(self.net, loaded, paths)

    def _check_snapshot_dir(self) -> None:
        p = self.param
        if self.rank != 0:
            return
        directory = os.path.dirname(p.snapshot_prefix) or "."
        writable = os.path.isdir(directory) and os.access(directory, os.W_OK)
        if not writable and not (p.snapshot or p.snapshot_after_train):
            return  # only a signal could ask for a snapshot; that one fails when it comes
        if not writable:
            raise SolverError(f"{self.source}: snapshot_prefix {p.snapshot_prefix!r}: cannot "
                              f"write to directory {directory!r}; make sure it exists and is "
                              "writable")
        # Only the rank that writes snapshots locks the prefix; under the lock, what an
        # interrupted earlier run left (a half-committed pair, temporaries) is tidied.

        self._snapshot_lock = acquire(p.snapshot_prefix, f"{self.source}: snapshot_prefix")
        snap.recover_snapshots(p.snapshot_prefix)

    def close(self) -> None:
        """Stop the nets' background work (data prefetch threads)."""
        for net in [self.net, *self.test_nets]:
            net.close()
        if self._snapshot_lock is not None:
            self._snapshot_lock.release()
            self._snapshot_lock = None

    # -- the loop -------------------------------------------------------------------------
    def solve(self, resume_file: str | None = None) -> None:
        """Train to max_iter (optionally resuming a .solverstate first), as Solver::Solve."""
        p = self.param
        log.info("Solving %s", self.net.name)
        log.info("Learning Rate Policy: %s", p.lr_policy)
        self._requested_early_exit = False
        if resume_file:
            log.info("Restoring previous solver status from %s", resume_file)
            self.restore(resume_file)
        start_iter = self.iter
        self.step(p.max_iter - self.iter)
        # (Caffe: unless the interval wrote it; here also unless a request just did: SIGTERM's
        # snapshot and stop write one snapshot, not two)
        if p.snapshot_after_train and (not p.snapshot or self.iter % p.snapshot != 0) \
                and self._snapshot_iter != self.iter:
            self.snapshot()
        if self._requested_early_exit:
            log.info("Optimization stopped early.")
            return
        # One more forward to display the loss of the final weights (Caffe does the same).
        if p.display and self.iter % p.display == 0:
            self.net.forward()
            self._update_smoothed_loss(self.net.loss, start_iter)
            log.info("Iteration %d, loss = %s", self.iter, number(self._smoothed_loss))
        if p.test_interval and self.iter % p.test_interval == 0:
            self.test_all()
        log.info("Optimization Done.")

    def step(self, iters: int) -> None:
        """Run `iters` iterations (pycaffe's solver.step)."""
        stop_iter = self.iter + int(iters)
        start_iter = self.iter
        self._losses = []
        self._smoothed_loss = 0.0
        try:
            self._steps(stop_iter, start_iter, time.perf_counter())
        finally:  # an iteration left half-way: no diff stays cleared lazily
            self.net.settle_param_diffs()

    def _user_code_before_backward(self) -> bool:
        """Whether code of the user's may look at parameter diffs between an iteration's
        clear and its backward: an iteration hook's before_iteration (pycaffe's on_start)
        not marked `reads_param_diffs_afresh`, or a Python layer of a test net."""
        return any(hasattr(hook, "before_iteration")
                   and not getattr(hook, "reads_param_diffs_afresh", False)
                   for hook in self.iteration_hooks) or \
            any(net.runs_user_code for net in self.test_nets)

    def _steps(self, stop_iter: int, start_iter: int, timer: float) -> None:
        p = self.param
        iterations_last = self.iter
        while self.iter < stop_iter:
            if not self.updates_pending:  # else each layer's diffs clear after its update
                self.net.clear_param_diffs_for_pass(self._user_code_before_backward())
            if (p.test_interval and self.iter % p.test_interval == 0
                    and (self.iter > 0 or p.test_initialization)):
                self.finish_updates()
                if self.rank == 0:
                    self.test_all()
                if self._requested_early_exit:
                    break
            for hook in self.iteration_hooks:
                if hasattr(hook, "before_iteration"):
                    hook.before_iteration(self)
            display = bool(p.display) and self.iter % p.display == 0
            self.net.debug_info = display and p.debug_info  # as Caffe: display steps only
            loss = self._forward_backward()
            self._update_smoothed_loss(loss, start_iter)
            if display:
                lapse = time.perf_counter() - timer
                per_s = (self.iter - iterations_last) / (lapse or 1.0)
                log.info("Iteration %d (%s iter/s, %ss/%d iters), loss = %s", self.iter,
                         number(per_s), number(lapse), p.display, number(self._smoothed_loss))
                if self.iter > iterations_last:  # own line: Caffe's parsers skip it
                    log.info("%s", progress.time_left(stop_iter - self.iter, per_s))
                timer, iterations_last = time.perf_counter(), self.iter
                evaluation.log_outputs(self.net, "Train", evaluation.output_values(self.net), 1)
            for hook in self.iteration_hooks:
                if hasattr(hook, "gradients_ready"):
                    hook.gradients_ready(self)
            self.update_mode.current.update(self.gradient_sync)
            # iter counts the updates made, as in Caffe.
            self.iter += 1
            for hook in self.iteration_hooks:
                if hasattr(hook, "after_iteration"):
                    hook.after_iteration(self)
            request = self._requested_action()
            if ((p.snapshot and self.iter % p.snapshot == 0)
                    or request in SolverAction.SNAPSHOTS):
                self.snapshot()
            if request in SolverAction.STOPS:
                self._requested_early_exit = True
                break
        self.finish_updates()

    @property
    def stopped_early(self) -> bool:
        """Whether the last solve/step ended on a stop request before its last iteration."""
        return self._requested_early_exit

    @property
    def snapshot_iter(self) -> int | None:
        """The iteration of the last snapshot this solver took (None before)."""
        return self._snapshot_iter

    def add_callback(self, on_start, on_gradients_ready) -> None:
        """pycaffe's callbacks: on_start() before each iteration's forward, and
        on_gradients_ready() once its gradients are final, before the update."""
        self.iteration_hooks.append(_PythonCallback(on_start, on_gradients_ready))

    def share_weights(self, net) -> None:
        """Make `net` use this solver's train-net weights (pycaffe's solver.share_weights)."""
        net.share_weights(self.net)

    # -- the update mode (update_mode.py) ----------------------------------------------
    @property
    def updates_pending(self) -> bool:
        """Whether some layer's update of the last iteration still waits for its forward."""
        return self.update_mode.pending

    @property
    def updates_per_layer(self) -> bool:
        """Whether the latest iteration's update waits, layer by layer, for the next forward."""
        return self.update_mode.current.per_layer

    def finish_updates(self) -> None:
        """Apply every pending per-layer update now (before a test, a snapshot, the end)."""
        self.update_mode.finish()

    def per_layer_blockers(self) -> list[str]:
        """Why this solver cannot update layer by layer ([]: it can)."""
        return blockers(self)

    def _forward_backward(self) -> float:
        n = self.param.iter_size
        sync = self.gradient_sync
        loss = 0.0
        mode = self.update_mode.choose()
        for i in range(n):
            hook = sync.on_learnable_done if sync is not None and i == n - 1 else None
            loss += self.net.forward_backward(on_learnable_done=hook)
        mode.after_backward(sync)
        loss /= n
        finite.check_loss(loss, self.net, self.iter)
        return loss

    def serve_requests(self) -> bool:
        """Serve the snapshot and stop requests pending now, as Caffe's Solver::Test does
        between test passes; True once a stop was asked. A stop ends the serving: a hook's
        should_stop stays true once it is, where Caffe's signal flags clear when read."""
        request = self._requested_action()
        while request != SolverAction.NONE:
            if request in SolverAction.SNAPSHOTS:
                self.snapshot()
            if request in SolverAction.STOPS:
                self._requested_early_exit = True
                break
            request = self._requested_action()
        return self._requested_early_exit

    def _requested_action(self) -> str:
        action = self.action_function() if self.action_function else SolverAction.NONE
        for hook in self.iteration_hooks:
            if hasattr(hook, "should_stop") and hook.should_stop() and \
                    action not in SolverAction.STOPS:
                action = SolverAction.STOP
        return action

    def _update_smoothed_loss(self, loss: float, start_iter: int) -> None:
        # Caffe's UpdateSmoothedLoss: a running mean over the last average_loss values.
        n = self.param.average_loss
        if len(self._losses) < n:
            self._losses.append(loss)
            size = len(self._losses)
            self._smoothed_loss = (self._smoothed_loss * (size - 1) + loss) / size
        else:
            idx = (self.iter - start_iter) % n
            self._smoothed_loss += (loss - self._losses[idx]) / n
            self._losses[idx] = loss

    def gradient_sumsq(self, ids=None) -> float:
        """Sum of squares of every learnable parameter diff, or of those `ids` index (one
        host transfer)."""
        return finite.gradient_sumsq(self.net, ids)

    # -- the update (subclasses) ----------------------------------------------------------
    def apply_update(self) -> None:
        """Turn the accumulated gradients into a weight update and apply it."""
        raise NotImplementedError(f"{type(self).__name__}.apply_update")

    def get_learning_rate(self) -> float:
        """The rate of the current iteration (updates current_step for step policies)."""
        rate, self.current_step = learning_rate(self.param, self.iter, self.current_step)
        return rate

    # -- testing --------------------------------------------------------------------------
    def test_all(self) -> None:
        """Run every test net (Caffe's TestAll)."""
        self.finish_updates()
        for k in range(len(self.test_nets)):
            if self._requested_early_exit:
                break
            self.test(k)

    def test(self, k: int) -> None:
        """Average test net k's outputs over test_iter[k] forward passes and log them."""
        evaluation.run_test(self, k)

    # -- snapshots ------------------------------------------------------------------------
    def snapshot(self) -> tuple[str, str] | None:
        """Write `<prefix>_iter_N.caffemodel[.h5]` and `.solverstate[.h5]` (rank 0 only).

        Returns (weights path, state path), or None on other ranks. In distributed training
        every rank calls it (their data positions are gathered into rank 0's state)."""
        self.finish_updates()
        self._snapshot_iter = self.iter
        positions = data_position.local_positions(self)
        gather = getattr(self.gradient_sync, "allgather_state", None)
        ranks = gather(positions) if gather is not None else [positions]
        if self.rank != 0:
            return None
        p = self.param
        hdf5 = p.snapshot_format == caffe_pb2.SolverParameter.HDF5
        model = snap.snapshot_filename(p.snapshot_prefix, self.iter,
                                       ".caffemodel.h5" if hdf5 else ".caffemodel")
        log.info("Snapshotting to %s file %s", "HDF5" if hdf5 else "binary proto", model)
        state_path = snap.snapshot_filename(p.snapshot_prefix, self.iter,
                                            ".solverstate.h5" if hdf5 else ".solverstate")
        log.info("Snapshotting solver state to %s file %s", "HDF5" if hdf5 else "binary proto",
                 state_path)
        state = snap.SolverStateData(iter=self.iter, learned_net=model,
                                     current_step=self.current_step, history=self.history,
                                     data_position=data_position.encode(ranks))
        # Both files or neither (see snapshot.write_pair), under Caffe's names.
        snap.write_pair(model, lambda: weights_bytes(self.net, p.snapshot_format,
                                                     p.snapshot_diff),
                        state_path, lambda: snap.state_bytes(state, p.snapshot_format))
        self.last_snapshot = (model, state_path)
        return self.last_snapshot

    def restore(self, path: str) -> None:
        """Continue from a .solverstate[.h5]: iteration, weights, history, current_step."""
        self.finish_updates()
        # An interrupted commit of this pair is finished (by rank 0) before it is read.
        snap.recover_pair(path, writer=self.rank == 0)
        state = snap.read_state(path)
        if state.learned_net:
            model = snap.resolve_learned_net(state.learned_net, path)
            # a state of another net resumes layers of the same name only: say which not
            report_initialised(self.net, snap.load_weights(self.net, model),
                               f"{model} (of --snapshot {path})",
                               "resume from a state of this net")
        if len(state.history) != len(self.history):
            raise SolverError(f"{path}: {len(state.history)} history blobs, a {self.type} "
                              f"solver for this net needs {len(self.history)}")
        log.info("%s: restoring history", type(self).__name__)
        for i, (target, values) in enumerate(zip(self.history, state.history)):
            if values.size != target.size:
                raise SolverError(f"{path}: history blob {i} has shape {values.shape}, "
                                  f"expected {target.shape}")
            target[...] = self.net.xp.asarray(values.reshape(target.shape), dtype=target.dtype)
        self.iter = state.iter
        self.current_step = state.current_step
        data_position.apply(self, state.data_position, path)
        for net in self.test_nets:
            net.share_weights(self.net)


class _PythonCallback:
    """The iteration hook behind Solver.add_callback."""

    def __init__(self, on_start, on_gradients_ready):
        self.on_start, self.on_gradients_ready = on_start, on_gradients_ready

    def before_iteration(self, solver) -> None:
        self.on_start()

    def gradients_ready(self, solver) -> None:
        self.on_gradients_ready()
