"""Bad input gets a clear error naming what was expected and what arrived."""

import re

import numpy as np
import pytest

from mha import steps
from mha.modules.numpy_mha import MultiHeadAttention


@pytest.fixture
def mha():
    return MultiHeadAttention(512, 8)


@pytest.fixture
def x(rng):
    return rng.normal(size=(2, 6, 512))


def _raises(exc, msg):
    return pytest.raises(exc, match=re.escape(msg))


def test_d_model_not_divisible_by_heads():
    with _raises(ValueError, "d_model=512 must be divisible by n_heads=7"):
        MultiHeadAttention(512, 7)


def test_heads_zero_or_not_int():
    with _raises(ValueError, "n_heads must be >= 1, got 0"):
        MultiHeadAttention(512, 0)
    with _raises(TypeError, "n_heads must be an int, got float 8.0"):
        MultiHeadAttention(512, 8.0)


def test_non_float_module_dtype():
    with _raises(TypeError, "dtype must be a floating-point type, got int64"):
        MultiHeadAttention(8, 2, dtype=np.int64)


def test_x_not_3d(mha, x):
    with _raises(ValueError, "x must be (B, T, d_model=512), got (6, 512)"):
        mha(x[0])


def test_last_dim_wrong(mha, rng):
    with _raises(ValueError, "x must be (B, T, d_model=512), got (2, 6, 256)"):
        mha(rng.normal(size=(2, 6, 256)))


def test_empty_sequence(mha):
    with _raises(ValueError, "x must have B >= 1 and T >= 1, got shape (2, 0, 512)"):
        mha(np.zeros((2, 0, 512)))


def test_integer_input(mha):
    with _raises(TypeError, "x must be a floating-point array (float32 or float64), got dtype int64"):
        mha(np.ones((2, 6, 512), dtype=np.int64))


def test_list_input(mha):
    with _raises(TypeError, "x must be an array, got list"):
        mha([[[0.0] * 512]])


def test_dtype_mismatch_with_weights(x):
    m32 = MultiHeadAttention(512, 8, dtype=np.float32)
    with _raises(TypeError, "x must be float32 to match the weights, got float64"):
        m32(x)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_or_inf_in_x(mha, x, bad):
    x[1, 3, 7] = bad
    with _raises(ValueError, "x must be finite, got 1 NaN/inf value(s), first at index (1, 3, 7)"):
        mha(x)


def test_mask_wrong_shape(mha, x):
    with _raises(ValueError, "mask must be (T=6, S=6), (B=2, T=6, S=6) or (B=2 or 1, h=8 or 1, T=6, S=6), got (5, 5)"):
        mha(x, mask=np.ones((5, 5), dtype=bool))
    with pytest.raises(ValueError, match="got \\(3, 6, 6\\)"):
        mha(x, mask=np.ones((3, 6, 6), dtype=bool))
    with pytest.raises(ValueError, match="got \\(2, 4, 6, 6\\)"):
        mha(x, mask=np.ones((2, 4, 6, 6), dtype=bool))


def test_mask_not_boolean(mha, x):
    with _raises(TypeError, "mask must be a boolean array (True = may attend), got int64"):
        mha(x, mask=np.ones((6, 6), dtype=np.int64))


def test_context_batch_mismatch(mha, x, rng):
    with _raises(ValueError, "context must have the same batch size as x (B=2), got 3"):
        mha(x, context=rng.normal(size=(3, 4, 512)))


def test_context_wrong_width(mha, x, rng):
    with _raises(ValueError, "context must be (B, T, d_model=512), got (2, 4, 64)"):
        mha(x, context=rng.normal(size=(2, 4, 64)))


def test_steps_reject_bad_shapes(rng):
    with _raises(ValueError, "d_model=10 must be divisible by n_heads=4"):
        steps.split_heads(rng.normal(size=(1, 2, 10)), 4)
    with _raises(ValueError, "k must be (B=1, h=2, S, d_k=4), got (1, 2, 3, 5)"):
        steps.scaled_scores(rng.normal(size=(1, 2, 3, 4)), rng.normal(size=(1, 2, 3, 5)))
    with _raises(ValueError, "v must be (B=1, h=2, S=3, d_k), got (1, 2, 4, 5)"):
        steps.weighted_sum(rng.normal(size=(1, 2, 3, 3)), rng.normal(size=(1, 2, 4, 5)))
    with _raises(ValueError, "W must be (d_in=4, d_out) to multiply x of shape (2, 4), got (3, 3)"):
        steps.linear(rng.normal(size=(2, 4)), rng.normal(size=(3, 3)), np.zeros(3))
    with _raises(ValueError, "allowed (3, 3) must broadcast to scores (1, 1, 4, 4)"):
        steps.apply_mask(rng.normal(size=(1, 1, 4, 4)), np.ones((3, 3), dtype=bool))
    with _raises(TypeError, "allowed must be a boolean array, got dtype float64"):
        steps.apply_mask(rng.normal(size=(1, 1, 4, 4)), np.ones((4, 4)))
    with _raises(ValueError, "x must be (B, h, T, d_k), got (2, 3, 4)"):
        steps.merge_heads(rng.normal(size=(2, 3, 4)))
    with _raises(TypeError, "scores must be a floating-point array (float32 or float64), got dtype int64"):
        steps.softmax(np.ones((2, 2), dtype=np.int64))


def test_numpy_lessons_and_grading_do_not_import_torch():
    """Graded kernels import these (A5 mha.training.grad, A3 mha_course.viz): torch would add 2-4 s to each."""
    import subprocess
    import sys

    code = ("import sys, mha.training.grad, mha.attention.masks, mha_course.diagnose, mha_course.diagnose.backward, mha.modules.numpy_mha, "
            "mha_course.viz, mha_course.planted; "
            "print(sorted(m for m in sys.modules if m == 'torch'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", f"importing the numpy modules loaded torch: {out.stdout}"


def test_is_torch_tells_tensors_from_arrays():
    import numpy as np
    import torch

    from mha.validate import is_torch

    assert is_torch(torch.zeros(2)) and not is_torch(np.zeros(2)) and not is_torch([0.0])
