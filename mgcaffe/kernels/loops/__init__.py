"""Loops compiled with numba for the CPU (`mgcaffe.cpu.compiled` says how they load, and how
the code does without numba): im2col, pooling, LRN, BatchNorm, Scale and Winograd transforms."""
