"""Compression in the cost model, the planner, plans on disk, `plan`/`simulate` and the
trainer's settings: T(M) is the cheapest format's, `auto` chooses per message, plans carry
each group's format, bad values are one-line errors, ranks that disagree stop at start."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from comm_fakes import run_ranks

from mgcaffe.cli import main
from mgcaffe.comm.backends.local import LocalWorld
from mgcaffe.comm.model.cost import CostModel, compress_wires
from mgcaffe.comm.model.mgwfbp import groups_from_runs, optimal_runs
from mgcaffe.comm.model.plan import Plan, load_plan
from mgcaffe.comm.model.profile import LayerProfile, Profile
from mgcaffe.comm.model.schemes import SCHEMES, make_plan
from mgcaffe.comm.model.timeline import timeline
from mgcaffe.comm.training.options import check_for_world, options_from
from mgcaffe.comm.training.trainer import attach
from mgcaffe.commands import _plan_inputs
from mgcaffe.errors import CommError, PlanError

from .test_agreement import flags, make_solver

AUTO = ("float32", "float16", "bfloat16")
# a measured curve: flat (latency-bound) up to 64 KB, then 10 ns per byte
CURVE = ((4, 1e-4), (65536, 1e-4), (64 << 20, 1e-4 + 10e-9 * (64 << 20)))


def profile(sizes=(1000, 16, 2_000_000, 8, 4_000_000)) -> Profile:
    layers = [LayerProfile(f"l{i}", p, 1e-3 * (i + 1)) for i, p in enumerate(sizes)]
    return Profile("toy", 1, 4, 5e-3, layers)


def test_time_is_the_cheapest_format_and_wire_for_names_it():
    cost = CostModel(0.0, 0.0, times=CURVE, wires=AUTO,
                     cast=(("float16", 1e-9), ("bfloat16", 2e-9)))
    small, large = 4096, 8 << 20
    # small: the wire time does not shrink with the bytes (flat curve), the cast costs
    assert cost.wire_for(small) == "float32" and cost.time(small) == pytest.approx(1e-4)
    # large: half the bytes at 10 ns/B saves 5 ns/B, the float16 casts cost 1 ns/B
    assert cost.wire_for(large) == "float16"
    slope = 10e-9 * (64 << 20) / ((64 << 20) - 65536)  # the curve above 64 KB
    assert cost.link_time(large) == pytest.approx(1e-4 + slope * (large - 65536))
    assert cost.time(large) == pytest.approx(1e-4 + slope * (large // 2 - 65536)
                                             + 1e-9 * large)
    # the float32-only model is what it was
    plain = cost.uncompressed()
    assert plain.time(large) == plain.link_time(large) and plain.wire_for(large) == "float32"
    # a forced format is priced in that format even where it does not pay
    forced = CostModel(0.0, 0.0, times=CURVE, wires=("bfloat16",), cast=(("bfloat16", 1e-6),))
    assert forced.wire_for(small) == "bfloat16"
    assert forced.time(small) == pytest.approx(1e-4 + 1e-6 * small)


def test_ties_go_to_float32_then_float16():
    cost = CostModel(1e-4, 0.0, wires=AUTO)  # no per-byte cost: nothing to gain or pay
    assert cost.wire_for(1 << 20) == "float32"
    cost = CostModel(1e-4, 1e-9, wires=("float16", "bfloat16"))
    assert cost.wire_for(1 << 20) == "float16"


def test_the_exact_optimum_under_auto_beats_every_fixed_format_and_brute_force():
    """The dynamic programme over min-priced messages is still exact: no grouping with any
    per-group format choice beats it (checked by enumerating every grouping)."""
    prof = profile()
    cost = CostModel(0.0, 0.0, times=CURVE, wires=AUTO,
                     cast=(("float16", 2e-9), ("bfloat16", 1e-9)))
    best = timeline(prof, cost, groups_from_runs(prof, optimal_runs(prof, cost)))
    L = prof.num_layers
    for mask in range(1 << (L - 1)):  # every cut of L layers into consecutive runs
        runs, hi = [], L
        for l in range(L, 1, -1):
            if mask >> (l - 2) & 1:
                runs.append((hi, l))
                hi = l - 1
        runs.append((hi, 1))
        other = timeline(prof, cost, groups_from_runs(prof, runs))
        assert best.iteration_time <= other.iteration_time + 1e-15
    for fixed in ((), ("float16",), ("bfloat16",)):
        c = CostModel(0.0, 0.0, times=CURVE, wires=fixed,
                      cast=(("float16", 2e-9), ("bfloat16", 1e-9)))
        assert best.iteration_time <= make_plan(prof, c, "mgwfbp").iteration_time + 1e-15


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_scheme_plans_formats_per_group(scheme):
    prof = profile()
    cost = CostModel(0.0, 0.0, times=CURVE, wires=AUTO, cast=(("float16", 1e-9),
                                                             ("bfloat16", 1e-9)))
    plan = make_plan(prof, cost, scheme, bucket_bytes=1 << 20)
    assert len(plan.formats) in (0, len(plan.groups))
    for g, size in enumerate(plan.group_sizes):
        assert plan.wire(g) == cost.wire_for(size)
    fixed = make_plan(prof, CostModel(0.0, 0.0, times=CURVE, wires=("float16",)), scheme,
                      bucket_bytes=1 << 20)
    assert set(fixed.formats) == {"float16"}
    assert fixed.wire_bytes * 2 == sum(fixed.group_sizes)


def test_plans_keep_their_formats_on_disk_and_in_the_digest(tmp_path):
    prof = profile()
    plain = make_plan(prof, CostModel(0.0, 0.0, times=CURVE), "mgwfbp")
    cost = CostModel(0.0, 0.0, times=CURVE, wires=AUTO, cast=(("float16", 1e-9),))
    packed = make_plan(prof, cost, "mgwfbp")
    assert packed.compressed and not plain.compressed
    assert "formats" not in plain.to_dict()  # an all-float32 plan is written as before
    path = tmp_path / "plan.json"
    packed.save(path)
    back = load_plan(path)
    assert back.formats == packed.formats and back.digest() == packed.digest()
    assert back.cost() == cost.__class__(cost.a, cost.b, times=CURVE, wires=AUTO,
                                         cast=(("float16", 1e-9),))
    # the same groups sent in other formats are another plan to the ranks' agreement
    other = Plan(**{**packed.__dict__, "formats": ("float32",) * len(packed.groups)})
    assert other.digest() != packed.digest()
    # an edited format is refused, naming the field
    d = packed.to_dict()
    d["formats"][0] = "int8"
    d.pop("digest")
    with pytest.raises(PlanError, match="formats: must list one of"):
        Plan.from_dict(d, "p.json")


def test_compress_names_what_is_available():
    assert compress_wires("none") == () and compress_wires("half") == ("float16",)
    assert compress_wires("auto", ("float32", "float16")) == ("float32", "float16")
    with pytest.raises(PlanError) as err:
        compress_wires("bf16", ("float32", "float16"))
    assert str(err.value) == ("--compress=bf16: bfloat16 is not available here (the array "
                              "library lacks it); available: none, fp16, auto")
    with pytest.raises(PlanError, match=r"unknown compression 'int8' \(choose from none, "):
        compress_wires("int8")


# ----------------------------------------------------------------------- the commands
@pytest.fixture
def inputs(paper_dir):
    return ["--profile", str(paper_dir / "googlenet-k80.json"),
            "--network", str(paper_dir / "network-10gbe-paper-constants.json")]


def test_plan_shows_the_compressed_columns(capsys, inputs):
    rc = main(["plan", *inputs, "--nodes", "8", "--compress", "fp16",
               "--cast-ns-per-byte", "0.1", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["wires"] == ["float16"] and doc["cast"] == {"float16": pytest.approx(1e-10)}
    for s, d in doc["schemes"].items():
        assert set(d["formats"]) == {"float16"}, s
        assert d["wire_bytes"] * 2 == sum(d["group_sizes"])
        assert d["train_flags"].endswith("--compress=fp16")
        # half the bytes at 3.3 ns/B for 0.1 ns/B of casts: never slower than float32
        assert d["iteration_time"] <= d["float32_iteration_time"], s
    rc = main(["plan", *inputs, "--nodes", "8", "--compress", "auto",
               "--cast-ns-per-byte", "0.1"])
    out, err = capsys.readouterr()
    assert rc == 0 and "float32 (ms)" in out and "wire" in out and "--compress=auto" in out


def test_plan_measures_the_casts_with_the_host_sum_as_training_does(capsys, inputs,
                                                                   monkeypatch):
    asked = []
    monkeypatch.setattr(_plan_inputs, "cast_cost",
                        lambda wires, **kw: asked.append((wires, kw)) or {"float16": 2e-10})
    rc = main(["plan", *inputs, "--nodes", "8", "--compress", "fp16", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert asked == [(("float16",), {"sum_parts": 2})]
    assert json.loads(out)["cast"] == {"float16": pytest.approx(2e-10)}


def test_plan_without_compress_prints_as_before(capsys, inputs):
    main(["plan", *inputs, "--nodes", "8"])
    out, _ = capsys.readouterr()
    assert "float32 (ms)" not in out and "--compress" not in out


def test_a_bad_compress_is_one_line(capsys, inputs):
    rc = main(["plan", *inputs, "--nodes", "8", "--compress", "fp8"])
    _, err = capsys.readouterr()
    assert rc != 0 and err.strip().count("\n") == 0 and "unknown compression 'fp8'" in err


def test_simulate_gains_the_compressed_table(capsys, inputs):
    rc = main(["simulate", *inputs, "--nodes", "8", "16", "--compress", "auto",
               "--cast-ns-per-byte", "0.05", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc = json.loads(out)
    packed = doc["compressed"]
    assert packed["compress"] == "auto" and packed["wires"] == list(AUTO)
    for plain, comp in zip(doc["points"], packed["points"]):
        for s in plain["schemes"]:
            assert comp["schemes"][s]["speedup"] >= plain["schemes"][s]["speedup"] - 1e-9


# ----------------------------------------------------------------------- the trainer
def test_options_read_compress_from_flags_and_comm_param():
    assert options_from(flags(compress="FP16")).compress == "fp16"
    with pytest.raises(CommError) as err:
        options_from(flags(compress="int8"))
    assert "\n" not in str(err.value) and str(err.value).startswith("--compress: unknown")
    param = SimpleNamespace(HasField=lambda f: f == "compress", compress="bf17")
    with pytest.raises(CommError, match=r"S.prototxt: comm_param.compress: unknown"):
        options_from(flags(), param, "S.prototxt")


def test_one_process_notes_that_compress_has_no_effect():
    notes = check_for_world(options_from(flags(compress="fp16")), 1)
    assert notes == ["--compress fp16 has no effect with one process: no gradient travels"]
    assert check_for_world(options_from(flags(compress="fp16")), 2) == []


def test_ranks_that_disagree_on_the_format_stop_at_start():
    comms = LocalWorld(2, timeout=10).communicators()
    solvers = [make_solver(r, 2) for r in range(2)]

    def rank_main(r):
        with attach(solvers[r], flags(comm="wfbp", profile_iters=2,
                                      compress="fp16" if r else "none"), comms[r]):
            solvers[r].step(2)

    _, errors = run_ranks(2, rank_main, timeout=60)
    for r, e in enumerate(errors):
        assert isinstance(e, CommError), e
        assert f'rank {r}: ranks disagree on --compress (rank 0: "none"; rank 1: "fp16")' \
            in str(e), e
