"""InnerProduct (Caffe's fully connected layer): one GEMM forward, up to two backward.

The bottom is viewed as a matrix (M, K): M = product of the axes before `axis` (default 1),
K = product of the rest. Weight (num_output, K), or (K, num_output) with `transpose: true`
(as in a .caffemodel); bias (num_output,). Top shape: bottom.shape[:axis] + (num_output,).
"""

from __future__ import annotations

import time
from math import prod

import numpy as np

from ..blob import Blob
from ..cpu.parallel import CallSite, blas_threads
from ..fillers import fill_blob, filler_rng
from ..kernels.gemm import gemm_accumulate
from ..kernels.sample_gemm import for_each_gemm
from .base import Layer
from .choice.inner_product import choose_inner_product
from .registry import register_layer


@register_layer
class InnerProduct(Layer):
    """top = bottom @ weight.T (+ bias); `transpose` stores the weight as (K, num_output)."""

    type = "InnerProduct"
    exact_num_bottom = 1
    exact_num_top = 1
    # How it runs is its path (choice.inner_product.choose_inner_product, made in reshape):
    # on the CPU a small batch (at most InnerProductRules.weight_major_upto rows) computes
    # top.T = W @ bottom.T into many outputs (OpenBLAS runs that layout faster there), writes
    # an overwritten weight gradient in cache-sized blocks of rows (OpenBLAS's beta = 0 first
    # zeroes its whole output), and sums the bottom diff over blocks of weight rows while the
    # BLAS has one thread (on two, each small GEMM waits for the other thread).

    def layer_setup(self, bottom, top):
        #: {BLAS threads: CallSite}: one call (True) against blocks, timed per thread count.
        self._overwrite_ways = {}
        p = self.param.inner_product_param
        shape = bottom[0].shape
        if not -len(shape) <= p.axis < max(len(shape), 1):
            raise self.error(f"axis {p.axis} out of range for bottom shape {shape}")
        self.axis = p.axis % len(shape)
        self.num_output = int(p.num_output)
        if self.num_output <= 0:
            raise self.error(f"num_output must be positive, got {self.num_output}")
        self.transpose = bool(p.transpose)
        self.bias_term = bool(p.bias_term)
        self.k = prod(shape[self.axis:])
        weight_shape = ((self.k, self.num_output) if self.transpose
                        else (self.num_output, self.k))
        shapes = [weight_shape] + ([(self.num_output,)] if self.bias_term else [])
        if self.blobs:  # loaded weights: Caffe skips the fillers but checks the shapes
            found = [b.shape for b in self.blobs]
            if found != shapes:
                raise self.error(f"expected parameter blobs of shapes {shapes} (weight, bias), "
                                 f"found {found}")
            return
        rng = filler_rng(self.ctx.seed, self.name)
        for i, (shape_i, filler) in enumerate(zip(shapes, (p.weight_filler, p.bias_filler))):
            blob = Blob(shape_i, xp=self.xp, dtype=self.dtype, name=f"{self.name}[{i}]")
            fill_blob(blob, filler, rng)
            self.blobs.append(blob)

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        if len(shape) < self.axis or prod(shape[self.axis:]) != self.k:
            raise self.error(f"input size incompatible with the weights: expected "
                             f"{self.k} values per item from axis {self.axis} on, got shape "
                             f"{shape}")
        self.m = prod(shape[:self.axis])
        top[0].reshape(shape[:self.axis] + (self.num_output,))
        self.rules = self.ctx.rules.inner_product
        self.choice = choose_inner_product(self.m, self.num_output, self.transpose,
                                           self.choice_target(), self.rules)
        small = self.choice.path == "small-batch"
        self._weight_major = small and self.choice.option("forward") == "weight-major"
        self._weight_grad_blocks = small and self.choice.option("weight_grad") == "blocks"
        self._input_grad_blocks = small and self.choice.option("input_grad") == "row-blocks"

    def _overwrite_weight_diff(self, a, b, diff):
        """diff = a @ b (numpy, few rows) in blocks, or in one call where `--threads
        adaptive` allows the choice and one call has been the faster here."""
        site = None
        if self.ctx.adaptive_blas:
            threads = blas_threads()
            site = self._overwrite_ways.get(threads)
            if site is None:
                site = self._overwrite_ways[threads] = CallSite()
        one_call = site is not None and site.pick()
        start = time.perf_counter()
        if one_call:
            gemm_accumulate(a, b, diff, None, True)
        else:
            rows = max(1, self.rules.overwrite_block_elements // diff.shape[1])

            def blocks(start, stop):
                for lo in range(start, stop, rows):
                    hi = min(stop, lo + rows)
                    gemm_accumulate(a[lo:hi], b, diff[lo:hi], None, True)

            for_each_gemm(np, diff.shape[0], blocks, self.ctx.chunk_runner,
                          grain=rows * self.rules.overwrite_blocks_per_chunk)
        if site is not None:
            site.record(one_call, time.perf_counter() - start)

    def _weight_as_k_by_n(self, array):
        """The (K, num_output) operand of x @ W, a view either way (BLAS transposes free)."""
        return array if self.transpose else array.T

    def forward(self, bottom, top):
        x = bottom[0].data.reshape(self.m, self.k)
        out = top[0].data.reshape(self.m, self.num_output)
        if self._weight_major:
            product = self.scratch(1, (self.num_output, self.m))
            np.matmul(self.blobs[0].data, x.T, out=product)
            if self.bias_term:
                np.add(product.T, self.blobs[1].data, out=out)
            else:
                np.copyto(out, product.T)
            return
        self.xp.matmul(x, self._weight_as_k_by_n(self.blobs[0].data), out=out)
        if self.bias_term:
            out += self.blobs[1].data

    def backward(self, top, propagate_down, bottom):
        top_diff = top[0].diff.reshape(self.m, self.num_output)
        weight = self.blobs[0]
        if self.param_propagate_down[0]:
            x = bottom[0].data.reshape(self.m, self.k)
            # dW (as K x N) = x.T @ dtop, in the weight's own layout, added into the diff.
            a, b = (x.T, top_diff) if self.transpose else (top_diff.T, x)
            # A lazily cleared diff (the iteration's first write) is overwritten: beta = 0.
            diff, overwrite = weight.diff_for_write()
            if overwrite and self._weight_grad_blocks:
                self._overwrite_weight_diff(a, b, diff)
            elif self.xp is np:  # inside the GEMM (beta = 1): one pass over the diff
                gemm_accumulate(a, b, diff, lambda shape: self.scratch(0, shape), overwrite)
            elif overwrite:
                self.xp.matmul(a, b, out=diff)
            else:
                grad = self.scratch(0, weight.shape)
                self.xp.matmul(a, b, out=grad)
                diff += grad
        if self.bias_term and self.param_propagate_down[1]:
            self.blobs[1].add_to_diff(top_diff.sum(axis=0))
        if propagate_down[0]:
            out = bottom[0].diff.reshape(self.m, self.k)
            rows = self.rules.dx_block_rows
            # Only while the BLAS runs on one thread, which is known here, at call time.
            if self._input_grad_blocks and blas_threads() == 1:
                for start in range(0, self.num_output, rows):
                    gemm_accumulate(top_diff[:, start:start + rows],
                                    weight.data[start:start + rows], out,
                                    lambda shape: self.scratch(0, shape), start == 0)
                return
            self.xp.matmul(top_diff, self._weight_as_k_by_n(weight.data).T, out=out)
