"""Shared fixtures: a seeded generator and small reference implementations."""

import os
import shutil

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

# Without a GPU, Triton kernels (tests/test_triton_flash.py) run in Triton's interpreter, which
# must be on before anything imports triton: torch's inductor may import it first, and
# triton.language's own @jit helpers (tl.max, tl.sum) are then compiled-mode functions the
# interpreter refuses to call. nvidia-smi stands in for "has a CUDA GPU" without importing torch.
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def rng() -> np.random.Generator:
    """A fresh, seeded generator per test."""
    return np.random.default_rng(1234)
