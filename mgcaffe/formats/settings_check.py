"""The numbers in a net or solver file, checked once at start against one table of fields.

Every float field of a NetParameter or SolverParameter (and of the messages inside them, the
weights in `blobs` excepted) must be finite: a `base_lr: nan` or an `lr_mult: inf` would
otherwise train until the first NaN loss, which names a layer, not the setting. Beyond
that, `RULES` lists the values each field may take: where Caffe's own CHECK macros abort
(a gaussian filler's std, RMSProp's rms_decay, ...) and where mgcaffe refuses a value that
Caffe accepts, in which case the message says so and what Caffe would have done.

Each error is one line naming the file, the layer (for a net) and the field path:
`net.prototxt: layer 'conv1' (Convolution): param[0].lr_mult: expected a finite number,
found nan (Caffe would have accepted it: ...)`.

The Net and the Solver read the nets they build with `protoio.read_net_to_build`, which
calls `check_net_settings`; the Solver calls `check_solver_settings`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from google.protobuf.descriptor import FieldDescriptor

from ..errors import NetError, SolverError
from ..proto import caffe_pb2

_FLOATS = (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE)

#: Messages whose numbers are data, not settings (weights given inside a net).
_DATA_MESSAGES = {"BlobProto"}

#: The nets inside a solver: checked as nets when they are built.
_SOLVER_NETS = ("net_param", "train_net_param", "test_net_param")

_ADAPTIVE = ("AdaGrad", "RMSProp", "AdaDelta", "Adam")
_NON_GAUSSIAN_FILLERS = ("constant", "uniform", "positive_unitball", "xavier", "msra",
                         "bilinear")


@dataclass(frozen=True)
class Rule:
    """Field `field` of message `message` must satisfy `ok(value)` where `applies(owner)`.

    expected: what the error says is expected. caffe: what Caffe does with a value that
    fails, for the error's parenthesis; "" when Caffe aborts on it too (then `check` names
    Caffe's check instead).
    """

    message: str
    field: str
    ok: Callable[[float], bool]
    expected: str
    caffe: str = ""
    check: str = ""
    applies: Callable[[object], bool] = lambda owner: True

    def note(self) -> str:
        if self.caffe:
            return f"Caffe would have accepted it: {self.caffe}"
        return f"Caffe aborts on it too: {self.check}"


def _solver(*types: str) -> Callable[[object], bool]:
    return lambda p: p.type in types


def _filler(*types: str) -> Callable[[object], bool]:
    return lambda p: p.type in types


#: The one table of value ranges (comparisons are written so that NaN fails them).
RULES: tuple[Rule, ...] = (
    # -- solver ------------------------------------------------------------------------
    Rule("SolverParameter", "base_lr", lambda v: v >= 0, ">= 0",
         caffe="with a negative rate every update climbs the loss (gradient ascent)"),
    Rule("SolverParameter", "weight_decay", lambda v: v >= 0, ">= 0",
         caffe="negative decay pushes every weight away from zero, more each update"),
    Rule("SolverParameter", "momentum", lambda v: v >= 0, ">= 0",
         caffe="a negative momentum flips the sign of the history every update"),
    Rule("SolverParameter", "momentum", lambda v: v == 0, "0 (AdaGrad and RMSProp have no "
         "momentum)", check="CHECK_EQ(0, momentum) in the solver's constructor",
         applies=_solver("AdaGrad", "RMSProp")),
    Rule("SolverParameter", "momentum", lambda v: 0 <= v < 1, "a value in [0, 1) (Adam's "
         "beta1)", caffe="with beta1 >= 1 the bias correction 1/(1 - beta1^t) divides by "
         "zero or flips sign: NaN or diverging updates", applies=_solver("Adam")),
    Rule("SolverParameter", "momentum", lambda v: 0 <= v <= 1, "a value in [0, 1] "
         "(AdaDelta's decay)", caffe="with a decay > 1 the squared-gradient history turns "
         "negative and its square root NaN", applies=_solver("AdaDelta")),
    Rule("SolverParameter", "momentum2", lambda v: 0 <= v < 1, "a value in [0, 1) (Adam's "
         "beta2)", caffe="with beta2 = 1 the correction sqrt(1 - beta2^t) is 0 and the "
         "weights never change; outside [0, 1] the square root is NaN",
         applies=_solver("Adam")),
    Rule("SolverParameter", "rms_decay", lambda v: 0 <= v < 1, "a value in [0, 1)",
         check="CHECK_GE(rms_decay, 0) and CHECK_LT(rms_decay, 1) in RMSPropSolver",
         applies=_solver("RMSProp")),
    Rule("SolverParameter", "delta", lambda v: v > 0, "> 0",
         caffe="with delta <= 0 a parameter whose gradient history is 0 divides 0 by 0: "
         "NaN weights", applies=_solver(*_ADAPTIVE)),
    # -- fillers -----------------------------------------------------------------------
    Rule("FillerParameter", "std", lambda v: v > 0, "> 0 for a gaussian filler",
         check="CHECK_GT(sigma, 0) in caffe_rng_gaussian, when the blob is filled",
         applies=_filler("gaussian")),
    Rule("FillerParameter", "sparse", lambda v: v >= -1, ">= -1",
         check="CHECK_GE(sparse, -1) in GaussianFiller", applies=_filler("gaussian")),
    Rule("FillerParameter", "sparse", lambda v: v == -1, "-1 (only gaussian fillers are "
         "sparse)", check="CHECK_EQ(sparse, -1): \"Sparsity not supported by this Filler\"",
         applies=_filler(*_NON_GAUSSIAN_FILLERS)),
    # -- layers ------------------------------------------------------------------------
    Rule("DropoutParameter", "dropout_ratio", lambda v: 0 <= v < 1, "a value in [0, 1)",
         caffe="a ratio of 1 drops every value and scales by 1/(1 - 1) = inf: NaN TRAIN "
         "outputs (outside [0, 1] its CPU forward aborts in caffe_rng_bernoulli, its GPU "
         "forward scales by 1/(1 - ratio))"),
    Rule("ExpParameter", "base", lambda v: v > 0 or v == -1, "> 0, or -1 for e",
         check="CHECK_GT(base, 0) \"base must be strictly positive\" in ExpLayer"),
    Rule("LogParameter", "base", lambda v: v > 0 or v == -1, "> 0, or -1 for e",
         check="CHECK_GT(base, 0) \"base must be strictly positive\" in LogLayer"),
)

_RULES_BY_FIELD: dict[tuple[str, str], list[Rule]] = {}
for _rule in RULES:
    _RULES_BY_FIELD.setdefault((_rule.message, _rule.field), []).append(_rule)

def _accepted(what: str) -> str:
    return f"Caffe would have accepted it: {what}"


#: What Caffe does with a non-finite value, by (message, field); else by message; else
#: `_DEFAULT_NOT_FINITE`.
_NOT_FINITE = {
    ("SolverParameter", "base_lr"): _accepted("every update, and so every weight, is NaN "
                                              "or infinite after the first iteration"),
    ("SolverParameter", "clip_gradients"): _accepted("a NaN bound never clips; an infinite "
                                                     "one never clips either"),
    ("ParamSpec", "lr_mult"): _accepted("this parameter's updates, then its values, are NaN "
                                        "or infinite after the first iteration"),
    ("ParamSpec", "decay_mult"): _accepted("this parameter's decay, then its values, are "
                                           "NaN or infinite after the first iteration"),
    ("LayerParameter", "loss_weight"): _accepted("the loss and every gradient below this "
                                                 "top are NaN or infinite"),
    ("FillerParameter", "min"): "Caffe aborts on a NaN bound (CHECK_LE(min, max) in "
                                "caffe_rng_uniform) and fills the blob with NaN or inf for "
                                "an infinite one",
    ("FillerParameter", "max"): "Caffe aborts on a NaN bound (CHECK_LE(min, max) in "
                                "caffe_rng_uniform) and fills the blob with NaN or inf for "
                                "an infinite one",
    ("LogParameter", "scale"): "Caffe aborts on it too: CHECK(!isnan(base_scale)) and "
                               "CHECK(!isinf(base_scale)) in LogLayer",
    ("SolverParameter",): _accepted("the learning rate or the update is NaN or infinite "
                                    "from the iteration that uses it"),
    ("FillerParameter",): _accepted("the blob is filled with NaN or infinite values"),
    ("TransformationParameter",): _accepted("every input value is NaN or infinite"),
    ("CommParameter",): "an mgcaffe setting, not Caffe's: a number of seconds or megabytes "
                        "must be finite",
}
_DEFAULT_NOT_FINITE = _accepted("this layer's outputs or gradients are NaN or infinite")


def _not_finite_note(message: str, field: str) -> str:
    return _NOT_FINITE.get((message, field)) or _NOT_FINITE.get((message,)) \
        or _DEFAULT_NOT_FINITE


def _fmt(value) -> str:
    return repr(value) if isinstance(value, str) else f"{value:g}"


def _messages(message, path: str = "", skip: tuple[str, ...] = ()) -> Iterator[tuple[str,
                                                                                 object]]:
    """(path prefix, message) for `message` and every message inside it, in field order;
    weights (BlobProto) and the fields in `skip` (of `message` itself) left out."""
    yield path, message
    for fd, value in message.ListFields():
        if fd.name in skip or fd.type != FieldDescriptor.TYPE_MESSAGE \
                or fd.message_type.name in _DATA_MESSAGES:
            continue
        if fd.is_repeated:
            for i, item in enumerate(value):
                yield from _messages(item, f"{path}{fd.name}[{i}].")
        else:
            yield from _messages(value, f"{path}{fd.name}.")


def _field_problem(path: str, owner, fd: FieldDescriptor) -> str | None:
    """The error text for one scalar field of `owner`, or None when its values are fine."""
    kind = owner.DESCRIPTOR.name
    values = getattr(owner, fd.name)
    values = list(values) if fd.is_repeated else [values]
    for i, value in enumerate(values):
        where = f"{path}{fd.name}[{i}]" if fd.is_repeated else f"{path}{fd.name}"
        finite = fd.type not in _FLOATS or math.isfinite(value)
        for rule in _RULES_BY_FIELD.get((kind, fd.name), ()):
            # A NaN or inf outside a range is named as such, unless Caffe's range check
            # aborts on it too (CHECK_GT(nan, 0) fails as well).
            if rule.applies(owner) and not rule.ok(value) and (finite or rule.check):
                return (f"{where}: expected {rule.expected}, found {_fmt(value)} "
                        f"({rule.note()})")
        if not finite:
            return (f"{where}: expected a finite number, found {_fmt(value)} "
                    f"({_not_finite_note(kind, fd.name)})")
    return None


def _message_problem(path: str, owner) -> str | None:
    """A rule between two fields: Caffe's CHECK_LE(min, max) in caffe_rng_uniform."""
    if owner.DESCRIPTOR.name == "FillerParameter" and owner.type == "uniform" \
            and owner.min > owner.max:
        return (f"{path}max: expected >= min ({_fmt(owner.min)}) for a uniform filler, found "
                f"{_fmt(owner.max)} (Caffe aborts on it too: CHECK_LE(min, max) in "
                "caffe_rng_uniform, when the blob is filled)")
    return None


def _first_problem(message, skip: tuple[str, ...] = ()) -> str | None:
    for path, owner in _messages(message, "", skip):
        for fd, _ in owner.ListFields():
            if fd.type != FieldDescriptor.TYPE_MESSAGE:
                problem = _field_problem(path, owner, fd)
                if problem:
                    return problem
        problem = _message_problem(path, owner)
        if problem:
            return problem
    return None


def check_net_settings(net: caffe_pb2.NetParameter, source: str) -> None:
    """Raise NetError naming `source`, the layer and the field for the first value that is
    not finite or outside the range `RULES` gives it."""
    for layer in net.layer:
        problem = _first_problem(layer)
        if problem:
            raise NetError(f"{source}: layer {layer.name!r} ({layer.type}): {problem}")
    problem = _first_problem(net, skip=("layer", "layers"))
    if problem:
        raise NetError(f"{source}: {problem}")


def check_solver_settings(solver: caffe_pb2.SolverParameter, source: str) -> None:
    """Raise SolverError naming `source` and the field for the first value that is not
    finite or outside the range `RULES` gives it. Nets given inside the solver are
    checked when they are read to be built (`read_net_to_build`)."""
    problem = _first_problem(solver, skip=_SOLVER_NETS)
    if problem:
        raise SolverError(f"{source}: {problem}")
