"""Array kernels the layers share: generic `xp` code (numpy now, CuPy later)."""

from .im2col import col2im, conv_output_size, im2col, valid_range

__all__ = ["col2im", "conv_output_size", "im2col", "valid_range"]
