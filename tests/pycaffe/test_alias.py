"""The opt-in `caffe` alias: pycaffe imports resolve to mgcaffe; a real Caffe is not shadowed
silently."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import mgcaffe
from mgcaffe import caffe_alias

SCRIPT = """
import sys
import caffe
import caffe.io
from caffe import layers as L, params as P
from caffe.proto import caffe_pb2
import mgcaffe
assert caffe is mgcaffe and caffe.io is mgcaffe.io and caffe_pb2 is mgcaffe.caffe_pb2
assert L is mgcaffe.layers and P.Pooling.MAX == 0
assert caffe.__spec__.name == "mgcaffe"
print("argv", sys.argv[1:])
"""


def run(args, tmp_path, env_path=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env_path, env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-m", "mgcaffe.caffe_alias", *args],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)


def test_script_runs_with_the_alias(tmp_path):
    (tmp_path / "uses_caffe.py").write_text(SCRIPT)
    done = run(["uses_caffe.py", "a", "b"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "argv ['a', 'b']" in done.stdout
    (tmp_path / "plain.py").write_text("import caffe\n")
    plain = subprocess.run([sys.executable, "plain.py"], capture_output=True, text=True,
                           cwd=tmp_path, timeout=120)
    assert plain.returncode != 0 and "No module named 'caffe'" in plain.stderr  # opt-in only


def test_a_real_caffe_is_not_shadowed_silently(tmp_path):
    real = tmp_path / "site" / "caffe"
    real.mkdir(parents=True)
    (real / "__init__.py").write_text("REAL = True\n")
    (tmp_path / "uses_caffe.py").write_text(SCRIPT)
    refused = run(["uses_caffe.py"], tmp_path, env_path=str(tmp_path / "site"))
    assert refused.returncode == 1
    assert "a real Caffe is importable here" in refused.stderr
    assert str(real) in refused.stderr and "Traceback" not in refused.stderr
    forced = run(["--force", "uses_caffe.py"], tmp_path, env_path=str(tmp_path / "site"))
    assert forced.returncode == 0, forced.stderr


def test_module_mode_and_usage(tmp_path):
    (tmp_path / "checkmod.py").write_text(SCRIPT)
    done = run(["-m", "checkmod", "x"], tmp_path, env_path=str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "argv ['x']" in done.stdout
    assert run([], tmp_path).returncode == 2


def test_install_in_process():
    if caffe_alias.real_caffe() is not None:
        pytest.skip("a real caffe is importable in this environment")
    caffe_alias.install()
    try:
        import caffe  # noqa: PLC0415
        import caffe.coord_map  # noqa: PLC0415

        assert caffe is mgcaffe and caffe.coord_map is mgcaffe.coord_map
        assert caffe_alias.installed()
    finally:
        caffe_alias.uninstall()
    assert not caffe_alias.installed() and "caffe" not in sys.modules
