"""A self-feeding tiny model (DummyData -> InnerProduct -> EuclideanLoss) for command tests."""

from __future__ import annotations

import pytest

NET = """name: "dummy"
layer {{ name: "data" type: "DummyData" top: "data" top: "target"
  dummy_data_param {{ shape {{ dim: 8 dim: 4 }} shape {{ dim: 8 dim: {out} }}
    data_filler {{ type: "gaussian" std: 1 }} }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param {{ num_output: {out} weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "target" top: "loss" }}
"""

SOLVER = """net: "{net}"
base_lr: 0.01
lr_policy: "fixed"
momentum: 0.9
max_iter: 20
display: 5
snapshot: 10
snapshot_prefix: "{prefix}"
random_seed: 3
"""


class Model:
    """Writes the net (`net_file`) and solver files into `dir`."""

    def __init__(self, directory):
        self.dir = directory
        self.net_file = self.write_net("net.prototxt")

    def write_net(self, name: str, out: int = 2) -> str:
        path = self.dir / name
        path.write_text(NET.format(out=out))
        return str(path)

    def solver(self, extra: str = "", name: str = "solver.prototxt", net: str | None = None,
               prefix: str | None = None) -> str:
        path = self.dir / name
        path.write_text(SOLVER.format(net=net or self.net_file,
                                      prefix=prefix or self.dir / "snap") + extra)
        return str(path)


@pytest.fixture
def model(tmp_path):
    return Model(tmp_path)


@pytest.fixture
def cli(capsys):
    """cli(*argv) -> (exit status, stderr text) of `mgcaffe argv...` run in-process."""
    from mgcaffe.cli import main

    def run(*argv):
        capsys.readouterr()
        rc = main([str(a) for a in argv])
        return rc, capsys.readouterr().err

    return run
