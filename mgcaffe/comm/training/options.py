"""The distributed settings: command-line flags over the solver's comm_param over defaults.

Every value remembers where it came from (`Options.origin`), so that an error names the flag
the user typed or the solver field they wrote (`solver.prototxt: comm_param.comm: ...`), never
a flag nobody gave. `--comm` takes the planner's scheme names (`planner.SCHEMES`): a scheme's
name is its --comm value everywhere. The old `--merge paper` (comm_param `merge: "paper"`)
still works and says what to write instead: `--comm=mgwfbp-paper`.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from typing import Any

from ...errors import CommError, PlanError
from ..backends.communicator import Communicator
from ..model.cost import COMPRESS, canonical_compress
from ..model.plan import Plan, load_plan
from ..model.schemes import DEFAULT_SCHEME, SCHEMES, scheme_named
from ..runtime.trace import TraceWindow

__all__ = ["BACKENDS", "COMM_MODES", "MERGES", "Options", "add_arguments", "check_for_world",
           "options_from", "wanted"]

COMM_MODES = SCHEMES  # --comm takes exactly the planner's scheme names
MERGES = ("optimal", "paper")  # the deprecated --merge: optimal = mgwfbp, paper = mgwfbp-paper
BACKENDS = ("auto", "mpi", "nccl")


def _suggest(value, choices) -> str:
    """"; did you mean 'x'?" for a value close to one of `choices` (comm_param typos)."""
    close = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else ""


@dataclass
class Options:
    """Every distributed setting; `options_from` fills it from flags over comm_param.

    `origin` maps a field to where its value came from ("--comm", "S.prototxt:
    comm_param.comm"); fields left at their defaults are absent. `plan_scheme`: the scheme
    of the saved plan given (--plan), which is what trains. `notes`: warnings for the
    user (deprecated spellings), logged once by rank 0. `merge` is kept only for the old
    spelling: the scheme is `comm` alone."""

    comm: str = DEFAULT_SCHEME
    merge: str = "optimal"
    bucket_mb: float = 25.0
    profile: str | None = None
    network: str | None = None
    plan: str | None = None
    save_plan: str | None = None
    profile_iters: int = 5
    replan_after: int = 50  # re-plan once this many iterations after the start-up plan
    timeout: float = 120.0
    timeline: str | None = None
    timeline_iters: str | None = None  # the iterations a trace keeps (default: the last 100)
    emulate_network: str | None = None
    emulate_nodes: int | None = None
    check_sync: int = 0
    test_timeout: float = 3600.0
    backend: str = "auto"
    pack_gradients: bool = False
    thread_nice: int | None = -10
    compress: str = "none"  # the wire formats the planner may use (model.cost.COMPRESS)
    origin: dict[str, str] = field(default_factory=dict, compare=False, repr=False)
    plan_scheme: str | None = field(default=None, compare=False, repr=False)  # --plan's
    notes: list[str] = field(default_factory=list, compare=False, repr=False)

    @property
    def scheme(self) -> str:
        """The scheme this run trains: a saved plan's (when --comm is left out), else the
        --comm value."""
        return self.plan_scheme or self.comm

    @property
    def trace_window(self) -> TraceWindow:
        """The iterations --timeline keeps (`--timeline-iters`; the last 100 by default)."""
        if self.timeline_iters is None:
            return TraceWindow()
        return TraceWindow.parse(self.timeline_iters)

    def named(self, name: str, flag: str | None = None) -> str:
        """Where the value of field `name` came from, for messages: the flag, the solver
        field, or (left at its default) the flag that sets it."""
        return self.origin.get(name, flag or f"--{name.replace('_', '-')}")

    def check(self) -> Options:
        """Raise a CommError naming the flag or solver field of the first bad value."""
        if self.comm not in COMM_MODES:
            raise CommError(f"{self.named('comm')}: expected one of {', '.join(COMM_MODES)}, "
                            f"got {self.comm!r}{_suggest(self.comm, COMM_MODES)}")
        if self.merge not in MERGES:
            raise CommError(f"{self.named('merge')}: expected one of {', '.join(MERGES)}, got "
                            f"{self.merge!r}{_suggest(self.merge, MERGES)}")
        if not self.bucket_mb > 0:
            raise CommError(f"{self.named('bucket_mb')}: must be > 0 MiB, got "
                            f"{self.bucket_mb:g}")
        if self.profile_iters < 2:
            raise CommError(f"{self.named('profile_iters')}: must be >= 2 (the first is "
                            f"skipped), got {self.profile_iters}")
        if self.replan_after < 0:
            raise CommError(f"{self.named('replan_after')}: must be >= 0 (0: never), got "
                            f"{self.replan_after}")
        if not self.timeout > 0:
            raise CommError(f"{self.named('timeout', '--comm-timeout')}: must be > 0 seconds, "
                            f"got {self.timeout:g}")
        if self.check_sync < 0:
            raise CommError(f"--check-sync: must be >= 0, got {self.check_sync}")
        if (self.emulate_network is None) != (self.emulate_nodes is None):
            raise CommError("--emulate-network and --emulate-nodes go together")
        if self.backend not in BACKENDS:
            raise CommError(f"--comm-backend: expected one of {', '.join(BACKENDS)}, got "
                            f"{self.backend!r}")
        if self.backend == "nccl" and self.emulate_network is not None:
            raise CommError("--emulate-network works with the MPI backend only "
                            "(--comm-backend mpi)")
        if self.emulate_nodes is not None and self.emulate_nodes < 1:
            raise CommError(f"--emulate-nodes: must be >= 1, got {self.emulate_nodes}")
        try:
            self.compress = canonical_compress(self.compress, self.named("compress"))
        except PlanError as exc:
            raise CommError(str(exc)) from None
        if self.timeline_iters is not None:
            self.trace_window  # noqa: B018 - parsed for its error
            if not self.timeline:
                raise CommError("--timeline-iters: give --timeline TRACE.json too")
        return self


def add_arguments(parser) -> None:
    """The distributed flags of `mgcaffe train` (they override the solver's comm_param)."""
    g = parser.add_argument_group("distributed training (start under mpiexec -n N)")
    g.add_argument("--comm", choices=COMM_MODES, default=None,
                   help="gradient communication (`mgcaffe plan` compares them): " + "; ".join(
                       f"{s.name}: {s.summary}" for s in map(scheme_named, COMM_MODES))
                   + f" (default {DEFAULT_SCHEME})")
    g.add_argument("--merge", choices=MERGES, default=None,
                   help="deprecated: --merge paper is --comm=mgwfbp-paper, --merge optimal is "
                        "--comm=mgwfbp (the default)")
    g.add_argument("--bucket-mb", type=float, default=None, metavar="MIB",
                   help="bucket size in MiB for --comm=threshold (default 25)")
    g.add_argument("--profile", default=None, metavar="P.json",
                   help="layer profile to plan from (default: measured on the first "
                        "iterations)")
    g.add_argument("--network", default=None, metavar="NET.json",
                   help="all-reduce cost a + b*M to plan with (default: measured at start)")
    g.add_argument("--plan", default=None, metavar="PLAN.json",
                   help="use this saved plan (no profiling, no planning)")
    g.add_argument("--save-plan", default=None, metavar="PLAN.json",
                   help="write the plan used (rank 0); needs several ranks or an emulated "
                        "network: one process has no all-reduce to plan for")
    g.add_argument("--profile-iters", type=int, default=None, metavar="N",
                   help="iterations timed for the profile (the first is skipped; default 5)")
    g.add_argument("--replan-after", type=int, default=None, metavar="N",
                   help="profile again N iterations after the start-up plan (warm-up over) "
                        "and re-plan once from that profile; 0: never (default 50)")
    g.add_argument("--timeline", default=None, metavar="TRACE.json",
                   help="write a Chrome/Perfetto trace of every rank (rank 0 writes) of the "
                        "last 100 iterations, or of --timeline-iters")
    g.add_argument("--timeline-iters", default=None, metavar="A:B[:K]",
                   help="the iterations the trace keeps: A:B (A to B-1), A:B:K (every K-th), "
                        "A: (from A on, unbounded)")
    g.add_argument("--emulate-network", default=None, metavar="NET.json",
                   help="make each gradient all-reduce last at least this network's a + b*M")
    g.add_argument("--emulate-nodes", type=int, default=None, metavar="N",
                   help="number of nodes whose a and b --emulate-network uses")
    g.add_argument("--check-sync", type=int, default=None, metavar="K",
                   help="every K iterations compare weight checksums across ranks")
    g.add_argument("--comm-backend", choices=BACKENDS, default=None,
                   help="gradient all-reduce: nccl (GPU arrays on their own stream), mpi (host "
                        "buffers; GPU gradients staged through them) or auto (default: nccl "
                        "when training on GPUs and every rank can load NCCL)")
    g.add_argument("--comm-timeout", type=float, default=None, metavar="SECONDS",
                   help="a collective making no progress this long ends every rank "
                        "(default 120)")
    g.add_argument("--comm-thread-nice", type=int, default=None, metavar="N",
                   help="nice value of the communication thread, so that it runs as soon as "
                        "it wakes even when backward fills the cores (default -10; lowering "
                        "it needs root or CAP_SYS_NICE, otherwise it is left as it is)")
    g.add_argument("--compress", default=None, metavar="|".join(COMPRESS),
                   help="the gradients' format on the wire: none (float32), fp16 or bf16 "
                        "(divided by the world size, cast, all-reduced, cast back), or auto "
                        "(the planner chooses per message where the cast pays for itself; "
                        "default none)")
    g.add_argument("--pack-gradients", action="store_true", default=None,
                   help="copy each group's gradients into a separate buffer to all-reduce "
                        "them (default: one flat gradient buffer, reduced in place; the "
                        "results are bit-identical)")


def _resolve_path(value: str, solver_path: str | None) -> str:
    """A path from the solver file: as given when it exists, else next to the solver file."""
    if not value or os.path.isabs(value) or os.path.exists(value) or not solver_path:
        return value
    alt = os.path.join(os.path.dirname(os.path.abspath(solver_path)), value)
    return alt if os.path.exists(alt) else value


# comm_param field -> Options field; the flags of the same meaning override them
_COMM_PARAM_FIELDS = (("comm", "comm"), ("merge", "merge"), ("bucket_mb", "bucket_mb"),
                      ("profile_iters", "profile_iters"), ("timeout", "timeout"),
                      ("compress", "compress"))
_FLAGS = {"comm": "comm", "merge": "merge", "bucket_mb": "bucket_mb", "profile": "profile",
          "network": "network", "plan": "plan", "save_plan": "save_plan",
          "profile_iters": "profile_iters", "replan_after": "replan_after",
          "timeline": "timeline", "timeline_iters": "timeline_iters",
          "emulate_network": "emulate_network", "emulate_nodes": "emulate_nodes",
          "check_sync": "check_sync", "comm_timeout": "timeout",
          "comm_backend": "backend", "pack_gradients": "pack_gradients",
          "comm_thread_nice": "thread_nice", "compress": "compress"}


def options_from(args: Any, comm_param: Any = None, solver_path: str | None = None) -> Options:
    """Options from the solver's comm_param, each overridden by its flag when given; checked
    (CommError naming the flag or the solver field). With a plan (--plan or comm_param.plan),
    the plan is read: its scheme is what trains (a --comm that names another is an error)."""
    o = Options()
    where = f"{solver_path}: comm_param" if solver_path else "comm_param"
    if comm_param is not None:
        for pfield, name in _COMM_PARAM_FIELDS:
            if comm_param.HasField(pfield):
                value = getattr(comm_param, pfield)
                setattr(o, name, float(value) if isinstance(value, float) else value)
                o.origin[name] = f"{where}.{pfield}"
        for name in ("profile", "network", "plan"):
            if comm_param.HasField(name):
                setattr(o, name, _resolve_path(getattr(comm_param, name), solver_path))
                o.origin[name] = f"{where}.{name}"
    for flag, name in _FLAGS.items():
        value = getattr(args, flag, None)
        if value is not None:
            setattr(o, name, value)
            o.origin[name] = "--" + flag.replace("_", "-")
    _old_merge(o)
    o.check()
    if o.plan:
        _adopt_plan_scheme(o, load_plan(o.plan))
    return o


def _old_merge(o: Options) -> None:
    """The deprecated `merge`: paper turns mgwfbp into mgwfbp-paper, and a note says what to
    write instead. `--merge` with a --comm of another scheme is a contradiction (an error);
    a solver's old `merge` beside another scheme was always ignored, and still is (a note)."""
    if "merge" not in o.origin or o.merge not in MERGES:
        return  # check() names a bad value
    merge, where = o.merge, o.origin["merge"]
    flag = where == "--merge"
    instead = "mgwfbp-paper" if merge == "paper" else "mgwfbp"
    o.merge = "optimal"
    if o.comm not in ("mgwfbp", instead):
        if flag:
            raise CommError(f"--merge {merge} goes with --comm=mgwfbp only, but "
                            f"{o.named('comm')} is {o.comm!r}; leave --merge out")
        o.notes.append(f"{where} {merge!r} is ignored with {o.named('comm')} {o.comm!r} "
                       f"(and deprecated: the scheme is comm alone); remove it")
        return
    o.comm = instead
    o.origin.setdefault("comm", where)
    o.notes.append(f"{where} {merge} is deprecated: " + (
        f"use --comm={instead}" if flag else f"write comm: \"{instead}\" instead") + (
        " (the default)" if instead == DEFAULT_SCHEME else ""))


def _adopt_plan_scheme(o: Options, plan: Plan) -> None:
    """A saved plan decides the grouping (`scheme` is then the plan's); a --comm given must
    name the same scheme."""
    try:
        scheme = scheme_named(plan.scheme).name
    except PlanError:
        return  # a hand-made grouping: any --comm labels it
    o.plan_scheme = scheme
    if "comm" in o.origin and o.comm != scheme:
        raise CommError(f"{o.named('plan')} {o.plan}: holds a {scheme} plan, but "
                        f"{o.named('comm')} is {o.comm}: the plan's groups would train, not "
                        f"{o.comm}'s; leave {o.named('comm')} out to train the plan, or leave "
                        f"{o.named('plan')} out to plan {o.comm}")


def check_for_world(o: Options, size: int) -> list[str]:
    """Settings that cannot work with `size` ranks raise a CommError; the returned lines are
    warnings for rank 0 to log (a saved plan made for another number of nodes)."""
    nodes = o.emulate_nodes or size
    if o.save_plan and nodes == 1:
        raise CommError(f"{o.named('save_plan')} {o.save_plan}: one process has no all-reduce "
                        "to plan for (the plan would say a = b = 0); train under mpiexec -n N, "
                        "add --emulate-network NET.json --emulate-nodes N, or make it with "
                        "`mgcaffe time --profile-out P.json` and `mgcaffe plan --profile "
                        "P.json --network NET.json --nodes N --save-plan PLAN.json`")
    notes = list(o.notes)
    if nodes == 1 and o.compress != "none":
        notes.append(f"{o.named('compress')} {o.compress} has no effect with one process: no "
                     f"gradient travels")
    if o.plan:
        plan = load_plan(o.plan)
        if plan.nodes is not None and plan.nodes != nodes:
            notes.append(
                f"{o.named('plan')} {o.plan} was made for {plan.nodes} nodes, this run has "
                f"{nodes}{' (emulated)' if o.emulate_nodes else ''}: its groups and its "
                f"prediction ({plan.iteration_time * 1e3:.2f} ms) assume {plan.nodes} nodes' "
                f"all-reduce cost; plan again with `mgcaffe plan ... --nodes {nodes}` or "
                f"train without --plan")
        notes += _plan_format_notes(o, plan)
    return notes


def _plan_format_notes(o: Options, plan: Plan) -> list[str]:
    """A saved plan's messages travel in the formats it names; a line when --compress
    offers other ones (the plan wins: it is what was asked to train)."""
    offered = set(COMPRESS[canonical_compress(o.compress)]) | {"float32"}
    used = list(plan.formats or ())
    foreign = sorted({f for f in used if f not in offered})
    if not foreign:
        return []
    k = sum(f in foreign for f in used)
    return [f"{o.named('plan')} {o.plan} sends {k} of {len(used)} messages as "
            f"{'/'.join(foreign)}, which {o.named('compress')} {o.compress} does not offer; "
            f"the plan's formats travel as saved (give {o.named('compress')} auto, or plan "
            f"again)"]


def wanted(args: Any, comm: Communicator) -> bool:
    """Whether `mgcaffe train` needs the distributed machinery: several ranks, or one rank
    asked for a trace, an emulated network or a plan."""
    return comm.size > 1 or any(getattr(args, f, None) for f in (
        "timeline", "emulate_network", "plan", "save_plan"))
