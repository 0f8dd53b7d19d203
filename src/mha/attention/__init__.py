"""Attention itself: the backends, masks, positions and tiled kernels."""
