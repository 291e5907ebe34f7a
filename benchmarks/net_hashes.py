"""A fingerprint of the engine's numerics: every blob and parameter, data and diff, after two
forward + backward passes of the five benchmark nets (LeNet b64, CIFAR-10 quick b100,
AlexNet b8, GoogleNet b8, ResNet-50 b4; the nets bench_vs_caffe.py times).

Inputs are seeded random values (labels in range), the weights the nets' own seeded fillers;
parameter diffs accumulate over the two passes as in Caffe. Prints one sha256 per net and
one over all; `--blobs` prints each blob's. A change that must not alter numerics shows the
same lines before and after:

    python benchmarks/net_hashes.py [--nets lenet,resnet50] [--threads 1] [--blobs]

Threads: results do not depend on the thread count (the engine sums fixed chunks in order),
but the BLAS's own may; the default of one thread keeps the fingerprint machine-stable.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from bench_vs_caffe import NETS, generate  # noqa: E402 - same folder


def fingerprint(prototxt: Path, seed: int = 1701, show_blobs: bool = False) -> str:
    """sha256 over every blob's and parameter's data and diff after two forward+backward."""
    from mgcaffe.backend import to_host  # noqa: PLC0415
    from mgcaffe.layer_types.base import TRAIN  # noqa: PLC0415
    from mgcaffe.net import Net  # noqa: PLC0415

    net = Net(str(prototxt), TRAIN, seed=seed)
    try:
        rng = np.random.default_rng(seed)
        for name in net.inputs:
            blob = net.blobs[name]
            shape = blob.data.shape
            if name == "label":
                blob.data[...] = rng.integers(0, 10, size=shape)
            else:
                blob.data[...] = rng.standard_normal(shape)
        net.clear_param_diffs()
        for _ in range(2):
            net.forward()
            net.backward()
        whole = hashlib.sha256()
        items = [(f"blob {n}", b) for n, b in net.blobs.items()]
        items += [(f"param {n}[{i}]", b) for n, blobs in net.params.items()
                  for i, b in enumerate(blobs)]
        for label, blob in items:
            h = hashlib.sha256()
            for array in (blob.data, blob.diff):
                host = np.ascontiguousarray(to_host(array))
                h.update(str((host.dtype.str, host.shape)).encode())
                h.update(host.tobytes())
            whole.update(label.encode() + h.digest())
            if show_blobs:
                print(f"  {label}: {h.hexdigest()[:16]}")
        return whole.hexdigest()
    finally:
        net.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", default=",".join(NETS))
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads")
    parser.add_argument("--blobs", action="store_true", help="print each blob's hash too")
    args = parser.parse_args(argv)
    from threadpoolctl import threadpool_limits  # noqa: PLC0415

    total = hashlib.sha256()
    with threadpool_limits(args.threads), tempfile.TemporaryDirectory() as tmp:
        for name in args.nets.split(","):
            digest = fingerprint(generate(name, Path(tmp)), show_blobs=args.blobs)
            total.update(digest.encode())
            print(f"{name}: {digest}", flush=True)
    print(f"all: {total.hexdigest()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
