"""The arithmetic the layers call, with no knowledge of layers, by kind: generic `xp` array
code here (im2col, windows, GEMM, Winograd, shifted and per-sample convolution), loops
compiled with numba for the CPU in `loops/`, CUDA kernels for the GPU in `cuda/`."""
