"""InnerProduct's path: a pure function of geometry, target and rules.

InnerProduct: `gemm` (one GEMM forward, one for each gradient; `gpu-gemm` on a GPU) or, on
the CPU for a batch of at most `weight_major_upto` rows, `small-batch`, whose options say
what changes: `forward` "weight-major" (top^T = W @ bottom^T, then one small transposing
copy; for at least 4x as many outputs as rows, an untransposed weight), `weight_grad`
"blocks" (an overwritten weight gradient in cache-sized row blocks on the runner's threads,
each GEMM on one BLAS thread; under `--threads adaptive` timed against one call) and
`input_grad` "row-blocks" (the bottom diff as a sum of products of weight row blocks, taken
only while the BLAS runs on one thread, which is known at call time).

The measurements behind the rules are in benchmarks/README.md ("InnerProduct").
"""

from __future__ import annotations

from dataclasses import dataclass

from . import Choice, Target


@dataclass(frozen=True)
class InnerProductRules:
    """InnerProduct's thresholds; the defaults are the measured ones."""

    #: A CPU batch of at most this many rows is a small batch (see the module docstring);
    #: 0: never.
    weight_major_upto: int = 16
    #: A small batch's overwritten weight gradient in blocks of about this many diff
    #: elements (the BLAS zeroes its whole output first; per block that stays in the
    #: cache); 0: one call.
    overwrite_block_elements: int = 1 << 16
    #: Blocks a chunk of the runner takes at once.
    overwrite_blocks_per_chunk: int = 8
    #: A small batch's bottom diff on one BLAS thread as products of blocks of this many
    #: weight rows (the first overwrites, the rest add inside the GEMM); 0: one call.
    dx_block_rows: int = 64


def choose_inner_product(rows: int, num_output: int, transpose: bool, target: Target,
                         rules: InnerProductRules) -> Choice:
    """The path of an InnerProduct with `rows` (M) rows into `num_output` outputs, its weight
    stored transposed or not."""
    if target.gpu:
        return Choice("gpu-gemm", "one GEMM per product on the device")
    if rows > rules.weight_major_upto:
        return Choice("gemm", f"{rows} > {rules.weight_major_upto} rows")
    forward = ("weight-major" if not transpose and num_output >= 4 * rows
               else "batch-major")
    weight_grad = "blocks" if rules.overwrite_block_elements > 0 else "one-call"
    input_grad = ("row-blocks" if not transpose and 0 < rules.dx_block_rows < num_output
                  else "one-call")
    return Choice("small-batch", f"{rows} <= {rules.weight_major_upto} rows",
                  (("forward", forward), ("weight_grad", weight_grad),
                   ("input_grad", input_grad)))
