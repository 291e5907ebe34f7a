"""Profile JSON: loading the paper's profiles, round trips, one-line errors naming file+field."""

from __future__ import annotations

import json

import pytest

from mgcaffe.cli import main
from mgcaffe.comm.model.cost import cost_for, load_network
from mgcaffe.comm.model.profile import LayerProfile, Profile, load_profile
from mgcaffe.comm.model.schemes import SCHEMES, make_plan
from mgcaffe.errors import PlanError


def _good() -> dict:
    return {"model": "toy", "batch_size": 8, "dtype_bytes": 4, "forward_time": 0.01,
            "layers": [{"name": "conv1", "params": 100, "backward_time": 0.002},
                       {"name": "conv2", "params": 200, "backward_time": 0.003},
                       {"name": "fc", "params": 50, "backward_time": 0.001},
                       {"name": "fc2", "params": 10, "backward_time": 0.0005}]}


def _write(tmp_path, d, name="profile.json"):
    path = tmp_path / name
    path.write_text(json.dumps(d) if not isinstance(d, str) else d)
    return path


def test_paper_profiles_load(paper_dir):
    expected = json.loads((paper_dir / "expected.json").read_text())["models"]
    for model, fname in (("googlenet", "googlenet-k80.json"), ("resnet50", "resnet50-k80.json")):
        prof = load_profile(paper_dir / fname)
        exp = expected[model]
        assert prof.model == model
        assert prof.num_layers == exp["layers"]
        assert prof.total_params == exp["params"]
        assert prof.dtype_bytes == 4
        assert prof.forward_time == pytest.approx(exp["forward_time"], rel=1e-12)
        assert prof.backward_time == pytest.approx(exp["backward_time"], rel=1e-12)
        assert prof.ideal_time == pytest.approx(exp["single_worker_time"], rel=1e-12)
        assert all(isinstance(layer, LayerProfile) for layer in prof.layers)


def test_googlenet_layer_order_is_input_side_first(paper_dir):
    prof = load_profile(paper_dir / "googlenet-k80.json")
    assert prof.names[0] == "conv1/7x7_s2"
    assert prof.names[-1] == "loss3/classifier"


def test_round_trip(tmp_path):
    prof = Profile.from_dict(_good(), source="x.json")
    again = Profile.from_dict(prof.to_dict())
    assert again == prof
    path = tmp_path / "p.json"
    prof.save(path)
    assert load_profile(path) == prof
    assert json.loads(prof.to_json()) == prof.to_dict()


def test_defaults_and_unknown_keys_ignored():
    d = _good()
    del d["batch_size"], d["dtype_bytes"]
    d["source"] = "measured somewhere"
    d["layers"][0]["comment"] = "extra"
    prof = Profile.from_dict(d)
    assert prof.batch_size is None and prof.dtype_bytes == 4
    assert prof.layers[0] == LayerProfile("conv1", 100, 0.002)


def test_integral_float_params_accepted():
    d = _good()
    d["layers"][1]["params"] = 200.0
    assert Profile.from_dict(d).layers[1].params == 200


def test_profile_is_frozen():
    prof = Profile.from_dict(_good())
    with pytest.raises(AttributeError):
        prof.forward_time = 1.0  # type: ignore[misc]


def test_negative_backward_time_message(tmp_path):
    d = _good()
    d["layers"][3]["backward_time"] = -1
    path = _write(tmp_path, d)
    with pytest.raises(PlanError) as exc:
        load_profile(path)
    assert str(exc.value) == f"{path}: layers[3].backward_time: must be >= 0, got -1"


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.pop("model"), "model: missing"),
    (lambda d: d.pop("forward_time"), "forward_time: missing"),
    (lambda d: d.pop("layers"), "layers: missing"),
    (lambda d: d["layers"][1].pop("name"), "layers[1].name: missing"),
    (lambda d: d["layers"][2].pop("params"), "layers[2].params: missing"),
    (lambda d: d["layers"][0].pop("backward_time"), "layers[0].backward_time: missing"),
    (lambda d: d.update(forward_time=-0.5), "forward_time: must be >= 0"),
    (lambda d: d.update(forward_time="fast"), "forward_time: must be a number"),
    (lambda d: d.update(forward_time=float("nan")), "forward_time: must be finite"),
    (lambda d: d.update(layers=[]), "layers: must not be empty"),
    (lambda d: d.update(layers={"a": 1}), "layers: must be a list"),
    (lambda d: d["layers"][2].update(name="conv1"), "layers[2].name: 'conv1' repeats layers[0]"),
    (lambda d: d["layers"][2].update(name=""), "layers[2].name: must be a non-empty string"),
    (lambda d: d["layers"][1].update(params=-3), "layers[1].params: must be >= 0"),
    (lambda d: d["layers"][1].update(params=1.5), "layers[1].params: must be an integer"),
    (lambda d: d["layers"][1].update(params=True), "layers[1].params: must be an integer"),
    (lambda d: d["layers"].__setitem__(1, 7), "layers[1]: must be a JSON object"),
    (lambda d: d.update(dtype_bytes=0), "dtype_bytes: must be >= 1"),
    (lambda d: d.update(batch_size=0), "batch_size: must be >= 1"),
    (lambda d: d.update(model=3), "model: must be a string"),
])
def test_bad_profiles(tmp_path, mutate, field):
    d = _good()
    mutate(d)
    path = _write(tmp_path, d)
    with pytest.raises(PlanError) as exc:
        load_profile(path)
    msg = str(exc.value)
    assert msg.startswith(f"{path}: {field}"), msg
    assert "\n" not in msg


def test_unreadable_and_invalid_json(tmp_path):
    with pytest.raises(PlanError, match=r"nope\.json: cannot read"):
        load_profile(tmp_path / "nope.json")
    path = _write(tmp_path, "{\"model\": ", "broken.json")
    with pytest.raises(PlanError, match=r"broken\.json: invalid JSON"):
        load_profile(path)
    path = _write(tmp_path, "[1, 2]", "list.json")
    with pytest.raises(PlanError, match=r"list\.json: top level: must be a JSON object"):
        load_profile(path)


def test_forward_and_update_times_per_layer_are_optional():
    given = Profile.from_dict({"model": "m", "forward_time": 0.01, "layers": [
        {"name": "a", "params": 1, "backward_time": 0.002, "forward_time": 0.003,
         "update_time": 0.0005},
        {"name": "b", "params": 1, "backward_time": 0.006, "forward_time": 0.004}]})
    prefix, f = given.forward_segments()
    assert prefix == pytest.approx(0.003) and f == [0.003, 0.004]  # t_f leaves the prefix
    assert given.update_time == pytest.approx(0.0005)
    assert Profile.from_dict(given.to_dict()) == given
    shared = Profile.from_dict({"model": "m", "forward_time": 0.01, "layers": [
        {"name": "a", "params": 1, "backward_time": 0.002},
        {"name": "b", "params": 1, "backward_time": 0.006}]})
    assert shared.forward_segments() == (0.0, [pytest.approx(0.0025), pytest.approx(0.0075)])
    assert shared.update_time == 0 and "update_time" not in shared.to_dict()["layers"][0]
    with pytest.raises(PlanError, match=r"p: layers\[1\].update_time: must be >= 0"):
        Profile.from_dict({"model": "m", "forward_time": 0, "layers": [
            {"name": "a", "params": 1, "backward_time": 0},
            {"name": "b", "params": 1, "backward_time": 0, "update_time": -1}]}, "p")


def test_a_saved_plan_reads_as_the_profile_it_was_made_from(paper_dir, tmp_path, capsys):
    """Every scheme planned from a plan's profile gets the same groups and times as from the
    profile itself: `mgcaffe plan --profile plan.json` compares the schemes on the profile a
    training run measured."""
    profile = load_profile(paper_dir / "googlenet-k80.json")
    cost = cost_for(load_network(paper_dir / "network-10gbe.json"), 8)
    path = tmp_path / "plan.json"
    make_plan(profile, cost, "mgwfbp").save(path)
    back = load_profile(path)
    assert back.names == profile.names and back.total_params == profile.total_params
    for s in SCHEMES:
        want, got = make_plan(profile, cost, s), make_plan(back, cost, s)
        assert got.groups == want.groups
        assert got.iteration_time == pytest.approx(want.iteration_time, rel=1e-12)
    assert main(["plan", "--profile", str(path), "--network",
                 str(paper_dir / "network-10gbe.json"), "--nodes", "8"]) == 0
    assert "googlenet: 64 learnable layers" in capsys.readouterr().out
    # predicted with interference: its layer times are slowed ones, not a profile
    slowed = make_plan(profile, cost.with_interference([(1, 0.5)]), "wfbp")
    slowed.save(path)
    with pytest.raises(PlanError, match=rf"{path}: interference: this plan was predicted "
                                        r"with interference"):
        load_profile(path)
