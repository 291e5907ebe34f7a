"""CUDA kernels the GPU paths run: im2col, col2im and pooling, LRN, BatchNorm and Scale,
SoftmaxWithLoss (CUDA C sources compiled by CuPy at first use; nothing here imports CuPy
at import time)."""
