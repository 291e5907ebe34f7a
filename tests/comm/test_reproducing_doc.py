"""docs/reproducing-the-paper.md stays in step with the code.

Each table between `<!-- simulate: ARGS -->` and `<!-- /simulate -->` is exactly what
`mgcaffe simulate ARGS` prints (run from the repository root); the headline comparison between
`<!-- headline -->` and `<!-- /headline -->` is what `headline_table()` below builds. On a
mismatch the assertion shows the regenerated text to paste into the doc.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from mgcaffe.cli import main
from mgcaffe.comm.model.cost import cost_for, load_network
from mgcaffe.comm.model.profile import load_profile
from mgcaffe.comm.model.simulate import weak_scaling

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "reproducing-the-paper.md"
SIMULATE_BLOCK = re.compile(r"<!-- simulate: (.*?) -->\n(.*?)\n<!-- /simulate -->", re.S)
HEADLINE_BLOCK = re.compile(r"<!-- headline -->\n(.*?)\n<!-- /headline -->", re.S)

NETWORKS = {"paper constants": "network-10gbe-paper-constants.json",
            "measured 10GbE": "network-10gbe.json"}
MODELS = {"GoogleNet": "googlenet-k80.json", "ResNet-50": "resnet50-k80.json"}
# the paper's claims (INFOCOM 2019, Section VI)
PAPER_64 = {"GoogleNet": ("1.78", "1.35", "–", "–"),
            "ResNet-50": ("1.75", "1.45", "about 55%", "almost linear")}


def _efficiency_bound(profile, cost) -> float:
    """No grouping beats t_f + t_b(L) + a + b * (all bytes): the first message cannot start
    before the output layer's gradient is ready and every byte crosses the channel once."""
    t = profile.forward_time + profile.layers[-1].backward_time + cost.time(
        profile.dtype_bytes * profile.total_params)
    return min(1.0, profile.ideal_time / t)


def _headline_cells(profile, network) -> dict[str, str]:
    sc = weak_scaling(profile, network, [8, 64], ("wfbp", "synceasgd", "mgwfbp-paper", "mgwfbp"))
    p8, p64 = sc.point(8), sc.point(64)
    eff = {s: f"{100 * p64.schemes[s].efficiency:.1f}%" for s in p64.schemes}
    return {
        "over_wfbp": f"{p64.ratio('mgwfbp-paper', 'wfbp'):.2f}",
        "over_sync": f"{p64.ratio('mgwfbp-paper', 'synceasgd'):.2f}",
        "optimal": f"{p64.ratio('mgwfbp', 'wfbp'):.2f} / {p64.ratio('mgwfbp', 'synceasgd'):.2f}",
        "eff_ws": f"{eff['wfbp']} / {eff['synceasgd']}",
        "eff_mg": f"{eff['mgwfbp-paper']} / {eff['mgwfbp']}",
        "bound": f"{100 * _efficiency_bound(profile, cost_for(network, 64)):.1f}%",
        "8_wfbp": f"{p8.ratio('mgwfbp-paper', 'wfbp'):.2f}",
        "8_sync": f"{p8.ratio('mgwfbp-paper', 'synceasgd'):.2f}",
    }


def headline_table(paper_dir: Path) -> str:
    """The paper's headline claims beside the simulation under both networks."""
    cells = {(model, net): _headline_cells(load_profile(paper_dir / pfile),
                                           load_network(paper_dir / nfile))
             for model, pfile in MODELS.items() for net, nfile in NETWORKS.items()}
    rows = [["", "paper"] + [f"simulated, {name}" for name in NETWORKS]]
    for model in MODELS:
        over_w, over_s, eff_ws, eff_mg = PAPER_64[model]
        for key, label, claim in (
                ("over_wfbp", "mgwfbp-paper (Alg. 1) over wfbp", over_w),
                ("over_sync", "mgwfbp-paper (Alg. 1) over synceasgd", over_s),
                ("optimal", "mgwfbp (the optimum) over wfbp / synceasgd", "–"),
                ("eff_ws", "efficiency of wfbp / synceasgd", eff_ws),
                ("eff_mg", "efficiency of mgwfbp-paper / mgwfbp", eff_mg),
                ("bound", "best efficiency any grouping can reach", "–")):
            rows.append([f"{model}, 64 nodes: {label}", claim]
                        + [cells[model, net][key] for net in NETWORKS])
    for key, label, claim in (("8_wfbp", "wfbp", "1.2"), ("8_sync", "synceasgd", "1.36")):
        rows.append([f"8 nodes: mgwfbp-paper (Alg. 1) over {label}, GoogleNet / ResNet-50",
                     f"{claim} (real cluster)"]
                    + [" / ".join(cells[m, net][key] for m in MODELS) for net in NETWORKS])
    out = ["| " + " | ".join(rows[0]) + " |", "|---|" + "---:|" * (len(rows[0]) - 1)]
    out += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    return "\n".join(out)


def _doc() -> str:
    return DOC.read_text(encoding="utf-8")


def test_doc_has_the_four_simulate_tables():
    blocks = SIMULATE_BLOCK.findall(_doc())
    args = [shlex.split(a) for a, _ in blocks]
    assert len(blocks) == 4
    for profile in MODELS.values():
        for network in NETWORKS.values():
            assert any(f"models/paper/{profile}" in a and f"models/paper/{network}" in a
                       and a[a.index("--nodes") + 1:a.index("--nodes") + 6]
                       == ["4", "8", "16", "32", "64"] for a in args), (profile, network)


@pytest.mark.parametrize("index", range(4))
def test_simulate_tables_match_the_code(index, capsys, monkeypatch):
    args, table = SIMULATE_BLOCK.findall(_doc())[index]
    monkeypatch.chdir(REPO)
    assert main(["simulate", *shlex.split(args)]) == 0
    regenerated = capsys.readouterr().out.strip()
    assert table.strip() == regenerated, f"regenerated table for {args}:\n{regenerated}"


def test_headline_table_matches_the_code(paper_dir):
    m = HEADLINE_BLOCK.search(_doc())
    assert m, "no <!-- headline --> block"
    regenerated = headline_table(paper_dir)
    assert m.group(1).strip() == regenerated, f"regenerated headline table:\n{regenerated}"


def test_doc_images_exist():
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", _doc())
    assert len(images) >= 4
    for rel in images:
        assert (DOC.parent / rel).is_file(), rel
