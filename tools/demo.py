"""`make demo`: the main job on built-in defaults, and what merging gradients is for.

1. Convert scikit-learn's bundled handwritten digits into Caffe LMDBs (data/digits/).
2. Train the LeNet-style digits net (models/digits/) in full on 2 MPI ranks with the default
   `--comm=mgwfbp`, as 2 of the 8 nodes of an emulated cluster (--emulate-network
   models/digits/emulated-network.json: every gradient all-reduce of M bytes lasts at least
   a + b*M, the numbers of that file). The run profiles its first iterations with all
   gradients in one all-reduce after backward, plans, and saves that plan
   (demo-output/plan-trained.json): the profile it was made from is the demo's one shared
   profile, measured by the trainer itself with nothing overlapping backward. It does not
   re-plan (--replan-after 0): a re-plan profiles while mgwfbp's all-reduces overlap
   backward, and its slower backward would then be charged to every scheme, also to
   synceasgd, which never overlaps (predicting it ~15% too slow and merging's lead too large).
3. Choose the emulated network of the comparison from that profile: the start-up a and
   per-byte b (as fractions of this machine's backward time) under which the best grouping
   is furthest ahead of both extremes, one message per layer (wfbp) and one after backward
   (synceasgd), also when the layer times vary by a quarter (a faster or slower machine
   needs other a and b for the same regime). It is written to
   demo-output/emulated-network.json and said in the output.
4. Plan every scheme the planner registers (`mgcaffe plan` shows the same) from that one
   profile, so the predictions are comparable, and save each plan.
5. Measure them interleaved: `--rounds` rounds, each training every distinct plan for
   `--iterations` iterations with `mgcaffe train --plan` (the order reversed every other
   round, so that a drifting machine load hits every plan alike). A scheme whose plan has
   the same groups (and schedule) as another's shares its measurement. Each run's own
   closing line gives the measured time (median): what its plan predicts (forward start to
   reduced gradients; for `overlap`, which updates layer by layer, to the next forward
   start), and the whole iteration with the update.
6. Print the table (messages, groups, predicted, measured in each round, measured /
   predicted, whole iteration), how many times mgwfbp is faster than wfbp and synceasgd
   (measured and predicted), how many times `overlap` (merging, order and per-layer updates
   planned together, the next forward overlapped) is faster than mgwfbp, synceasgd and wfbp
   over the whole iteration, which differences are within the noise (the spread between
   rounds), the plot of the training log and the final test accuracy.

Run from the repository root (the Makefile does). `--ranks 1` trains in one process (no
comparison); `--no-emulation` uses the real (shared-memory) all-reduce, whose cost is small
next to backward: every scheme is then within noise of the others.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from a checkout: the package beside it

from mgcaffe.comm.model.cost import CostModel  # noqa: E402
from mgcaffe.comm.model.plan import Plan  # noqa: E402
from mgcaffe.comm.model.profile import LayerProfile, Profile, load_profile  # noqa: E402
from mgcaffe.comm.model.schemes import SCHEMES, make_plan  # noqa: E402

OUT = ROOT / "demo-output"
SOLVER = "models/digits/solver.prototxt"
NETWORK = "models/digits/emulated-network.json"
NODES = 8  # the emulated cluster's size: NETWORK's fit
ROUNDS = 2
ITERATIONS = 40

SUMMARY = re.compile(r"measured ([0-9.]+) ms \(median of (\d+)\), predicted ([0-9.]+) ms by "
                     r"plan ([\w-]+)")
WHOLE = re.compile(r"whole iteration with the update ([0-9.]+) ms")
ACCURACY = re.compile(r"Test net output #\d+: accuracy = ([0-9.]+)")


def run(cmd: list[str], log_path: Path, echo: bool = True) -> str:
    """Run a command from the repo root, teeing its output to log_path; return the output."""
    print("+", " ".join(cmd), flush=True)
    lines = []
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            if echo:
                sys.stdout.write(line)
            log.write(line)
            lines.append(line)
        if proc.wait() != 0:
            raise SystemExit(f"demo: {cmd[0]} failed with exit status {proc.returncode}; "
                             f"log in {log_path}")
    return "".join(lines)


def measured(text: str, log_path: Path) -> tuple[float, float]:
    """(what the plan predicts, the whole iteration), medians in ms, from a run's closing
    line: a plan that updates after every gradient is reduced predicts forward start to
    reduced gradients and the line adds the whole iteration with the update; a plan that
    updates layer by layer predicts the whole iteration itself."""
    m = SUMMARY.search(text)
    if not m:
        raise SystemExit(f"demo: no timing summary in {log_path}")
    whole = WHOLE.search(text)
    return float(m.group(1)), float(whole.group(1)) if whole else float(m.group(1))


def training_command(launch: list[str], emulation: list[str], trained: Path,
                     ranks: int) -> list[str]:
    """The full training run; on several ranks it saves the plan of its start-up profile,
    taken with backward not overlapped, and does not re-plan (the docstring's step 2)."""
    full = launch + ["--solver", SOLVER, *emulation]
    if ranks > 1:
        full += ["--save-plan", str(trained), "--replan-after", "0"]
    return full


def timing_solver(path: Path) -> None:
    """The digits solver without test passes or snapshots: the runs that time a plan."""
    text = (ROOT / SOLVER).read_text(encoding="utf-8")
    text = re.sub(r"(?m)^(snapshot|display): .*$", r"\1: 0", text)
    path.write_text(text + "test_initialization: false\nsnapshot_after_train: false\n",
                    encoding="utf-8")


def distinct(plans: dict[str, Plan]) -> dict[str, str]:
    """scheme -> the scheme whose run measures it (the first with the same groups and, for
    a scheme that decides more than groups, the same schedule)."""
    first: dict[tuple, str] = {}
    return {s: first.setdefault(_same_run(p), s) for s, p in plans.items()}


def _same_run(plan: Plan) -> tuple:
    schedule = getattr(plan, "schedule", None)
    return plan.groups, (None if schedule is None
                         else json.dumps(schedule.to_dict(), sort_keys=True))


def noise(rounds: dict[str, list[float]]) -> float:
    """The largest spread between rounds of one plan, relative to its mean (at least 1%)."""
    return max([0.01] + [(max(v) - min(v)) / statistics.mean(v)
                         for v in rounds.values() if len(v) > 1])


def verdict(name: str, base: str, t: dict[str, float], pred: dict[str, float],
            spread: float) -> str:
    """One line: how many times `name` is faster than `base`, measured and predicted, and
    whether the measured difference stands out of the noise."""
    meas, model = t[base] / t[name], pred[base] / pred[name]
    beyond = abs(meas - 1) > spread
    return (f"{name} over {base}: measured {meas:.2f}x, predicted {model:.2f}x "
            f"({'beyond' if beyond else 'within'} the noise of {100 * spread:.1f}%)")


def table(plans: dict[str, Plan], measure_of: dict[str, str],
          rounds: dict[str, list[float]], wholes: dict[str, list[float]]) -> str:
    """The comparison: per scheme its plan, predicted and measured time (what the plan
    predicts), the whole iteration measured, and the verdicts."""
    t = {s: statistics.mean(rounds[measure_of[s]]) for s in plans}
    whole = {s: statistics.mean(wholes[measure_of[s]]) for s in plans}
    pred = {s: p.iteration_time * 1e3 for s, p in plans.items()}
    per_layer = {s for s, p in plans.items()
                 if getattr(getattr(p, "schedule", None), "update", None) == "per-layer"}
    width = max(len(s) for s in plans)
    lines = [f"{'--comm':<{width}} {'messages':>8} {'predicted':>10} {'measured':>10} "
             f"{'meas/pred':>9} {'whole':>9}  rounds (ms), groups (output side first)"]
    for s, p in plans.items():
        same = f" (= {measure_of[s]}'s plan)" if measure_of[s] != s else ""
        groups = " | ".join("+".join(g) for g in p.groups)
        mark = "*" if s in per_layer else " "
        lines.append(f"{s:<{width}} {p.num_messages:>8} {pred[s]:>8.2f}ms {t[s]:>8.2f}ms "
                     f"{t[s] / pred[s]:>8.2f}{mark} {whole[s]:>7.2f}ms  "
                     f"{', '.join(f'{v:.2f}' for v in rounds[measure_of[s]])}; {groups}{same}")
    spread = noise(rounds)
    lines.append(f"(predicted and measured: forward start to reduced gradients, or, marked *, "
                 f"to the next forward start with the per-layer updates; whole: the whole "
                 f"iteration with the update; predicted from one shared profile; measured: the "
                 f"mean of {len(next(iter(rounds.values())))} interleaved rounds' medians; "
                 f"noise: the largest difference between rounds, {100 * spread:.1f}%)")
    for base in ("wfbp", "synceasgd"):
        if base in plans and "mgwfbp" in plans:
            if measure_of[base] == measure_of["mgwfbp"]:
                lines.append(f"mgwfbp over {base}: the same plan here")
            else:
                lines.append(verdict("mgwfbp", base, t, pred, spread))
    if "overlap" in plans:
        for base in ("mgwfbp", "synceasgd", "wfbp"):
            if base in plans and measure_of[base] != measure_of["overlap"]:
                gain = whole[base] / whole["overlap"]
                lines.append(f"overlap over {base}, whole iteration: measured {gain:.2f}x "
                             f"({'beyond' if abs(gain - 1) > spread else 'within'} the noise "
                             f"of {100 * spread:.1f}%)")
    return "\n".join(lines)


def _lead(profile: Profile, cost: CostModel) -> float:
    """How many times mgwfbp's plan is predicted faster than the faster of wfbp and
    synceasgd; 1 when it is one of them."""
    w, s, m = (make_plan(profile, cost, x) for x in ("wfbp", "synceasgd", "mgwfbp"))
    if m.groups in (w.groups, s.groups):
        return 1.0
    return min(w.iteration_time, s.iteration_time) / m.iteration_time


def merging_network(profile: Profile, seed: int = 0) -> tuple[CostModel, float]:
    """(a + b*M, its predicted lead) for the comparison: a in steps of 5% of the backward
    time t_b, b such that all the bytes take 10%..150% of t_b, the pair whose lead over both
    extremes is largest on the 20th percentile of 20 profiles whose times vary by up to 25%
    (the timing runs will not repeat the profile exactly)."""
    rng = random.Random(seed)
    jittered = [Profile(profile.model, profile.batch_size, profile.dtype_bytes,
                        profile.forward_time * rng.uniform(0.75, 1.25),
                        tuple(LayerProfile(layer.name, layer.params,
                                           layer.backward_time * rng.uniform(0.75, 1.25))
                              for layer in profile.layers)) for _ in range(20)]
    tb, nbytes = profile.backward_time, profile.total_params * profile.dtype_bytes
    best: tuple[float, CostModel] | None = None
    for fa in (0.05 * i for i in range(1, 13)):
        for fb in (0.1 * i for i in range(1, 16)):
            cost = CostModel(fa * tb, fb * tb / nbytes, nodes=NODES)
            leads = sorted(_lead(p, cost) for p in jittered)
            score = leads[len(leads) // 5]
            if best is None or score > best[0]:
                best = (score, cost)
    return best[1], _lead(profile, best[1])


def write_network(cost: CostModel, path: Path) -> None:
    path.write_text(json.dumps({
        "source": "tools/demo.py: a and b chosen from the shared profile, where merging "
                  "pays most on this machine", "units": "seconds, seconds per byte",
        "fits": {str(NODES): {"a": cost.a, "b": cost.b}}}, indent=1) + "\n",
        encoding="utf-8")


def plan_every_scheme(profile: Profile, cost: CostModel) -> dict[str, Plan]:
    """Every registered scheme planned from the one profile with the emulated cost, each
    saved as demo-output/plan-<scheme>.json."""
    plans = {}
    for s in SCHEMES:
        plans[s] = make_plan(profile, cost, s, nodes=NODES)
        plans[s].save(OUT / f"plan-{s}.json")
    return plans


def measure(launch: list[str], solver: Path, runs: dict[str, list[str]],
            emulation: list[str], rounds: int,
            iterations: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """({name: the measured median of each round}, {name: the whole iteration's}): every run
    of `runs` once per round, the order reversed every other round."""
    out: dict[str, list[float]] = {name: [] for name in runs}
    wholes: dict[str, list[float]] = {name: [] for name in runs}
    order = list(runs)
    for r in range(rounds):
        for name in (order if r % 2 == 0 else order[::-1]):
            path = OUT / f"time-{name}-{r + 1}.log"
            text = run(launch + ["--solver", str(solver), *runs[name], "--iterations",
                                 str(iterations), *emulation], path, echo=False)
            value, whole = measured(text, path)
            out[name].append(value)
            wholes[name].append(whole)
            print(f"  round {r + 1}, {name}: {value:.2f} ms (whole iteration {whole:.2f} ms)",
                  flush=True)
    return out, wholes


def measured_only(rounds: dict[str, list[float]]) -> str:
    """The table without predictions, and whether any two schemes differ beyond the noise."""
    t = {s: statistics.mean(v) for s, v in rounds.items()}
    spread = noise(rounds)
    lines = [f"  {s:<14} {t[s]:8.2f} ms   rounds: {', '.join(f'{x:.2f}' for x in v)}"
             for s, v in rounds.items()]
    gap = max(t.values()) / min(t.values()) - 1
    lines.append(f"the slowest is {100 * gap:.1f}% slower than the fastest: "
                 f"{'within' if gap <= spread else 'beyond'} the noise of {100 * spread:.1f}% "
                 f"(the largest difference between rounds of one scheme)")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2, help="MPI ranks (default 2)")
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help=f"interleaved rounds of timing runs (default {ROUNDS})")
    parser.add_argument("--iterations", type=int, default=ITERATIONS,
                        help=f"iterations of each timing run (default {ITERATIONS})")
    parser.add_argument("--no-emulation", action="store_true",
                        help=f"the real all-reduce instead of the emulated {NODES}-node "
                             f"cluster of {NETWORK}")
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    python = sys.executable
    run([python, "tools/convert_digits.py", "--out", "data/digits"], OUT / "convert.log")

    launch = [python, "-m", "mgcaffe", "train"]
    if args.ranks > 1:
        mpiexec = Path(python).with_name("mpiexec")
        launch = [str(mpiexec) if mpiexec.exists() else "mpiexec", "-n", str(args.ranks),
                  *launch]
    emulation = [] if args.no_emulation else ["--emulate-network", NETWORK,
                                              "--emulate-nodes", str(NODES)]
    trained = OUT / "plan-trained.json"
    log_path = OUT / "train.log"
    text = run(training_command(launch, emulation, trained, args.ranks), log_path)
    plot = OUT / "training.png"
    run([python, "tools/plot_training_log.py", str(log_path), "-o", str(plot)],
        OUT / "plot.log")
    accuracies = ACCURACY.findall(text)
    if not accuracies:
        raise SystemExit(f"demo: no test accuracy in {log_path}")

    if args.ranks > 1:
        solver = OUT / "solver-timing.prototxt"
        timing_solver(solver)
        if args.no_emulation:
            # the real all-reduce's cost is measured by each run: each plans for itself
            runs = {s: ["--comm", s, "--replan-after", "0"] for s in SCHEMES}
            plans, measure_of, profile = None, {s: s for s in SCHEMES}, None
        else:
            profile = load_profile(trained)  # the profile the trained plan was made from
            cost, lead = merging_network(profile)
            network = OUT / "emulated-network.json"
            write_network(cost, network)
            emulation = ["--emulate-network", str(network), "--emulate-nodes", str(NODES)]
            print(f"\nthe comparison's emulated network ({network.relative_to(ROOT)}): a = "
                  f"{cost.a * 1e3:.2f} ms, b = {cost.b * 1e9:.1f} ns/B (a = "
                  f"{cost.a / profile.backward_time:.2f} t_b, all bytes "
                  f"{cost.time(profile.total_params * 4) * 1e3 - cost.a * 1e3:.1f} ms): "
                  f"mgwfbp predicted {lead:.2f}x ahead of the faster extreme", flush=True)
            plans = plan_every_scheme(profile, cost)
            measure_of = distinct(plans)
            runs = {s: ["--plan", str(OUT / f"plan-{s}.json")] for s in plans
                    if measure_of[s] == s}
        rounds, wholes = measure(launch, solver, runs, emulation, args.rounds,
                                 args.iterations)
        print()
        if plans is None:
            print(f"{args.ranks} ranks, the real all-reduce (shared memory), each scheme "
                  f"planned by its own run:\n{measured_only(rounds)}")
        else:
            print(f"{args.ranks} ranks as 2 of an emulated {NODES}-node cluster (a = "
                  f"{cost.a * 1e3:.2f} ms, b = {cost.b * 1e9:.1f} ns/B); {profile.model}: "
                  f"t_f + t_b = {profile.ideal_time * 1e3:.2f} ms in the shared profile:\n"
                  f"{table(plans, measure_of, rounds, wholes)}")
    print(f"\nFinal test accuracy (--comm=mgwfbp): {float(accuracies[-1]):.4f} "
          f"(log: {log_path.relative_to(ROOT)}, plot: {plot.relative_to(ROOT)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
