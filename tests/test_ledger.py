"""mha.ledger records one row per step call, per tensor of a tuple, and always restores."""

import types

import numpy as np
import pytest

from mha import ledger


def _owner():
    return types.SimpleNamespace(one=lambda a: a * 2, two=lambda a: (a, a[..., :1]))


def test_rows_follow_the_calls_and_the_functions_come_back():
    owner = _owner()
    originals = (owner.one, owner.two)
    labels = {"one": [("1", "first", "(n,)"), ("1", "again", "(n,)")],
              "two": [[("2", "left", "(m, k)"), ("2", "right", "(m, 1)")]]}
    with ledger.recording(owner, labels) as rows:
        owner.one(np.zeros(3))
        owner.one(np.zeros(4))
        owner.one(np.zeros(5))  # more calls than labels: the last label repeats
        owner.two(np.zeros((2, 6)))
    assert [(r.tensor, r.shape) for r in rows] == [
        ("first", (3,)), ("again", (4,)), ("again", (5,)), ("left", (2, 6)), ("right", (2, 1))]
    assert (owner.one, owner.two) == originals


def test_functions_are_restored_when_the_block_raises():
    owner = _owner()
    original = owner.one
    with pytest.raises(RuntimeError), ledger.recording(owner, {"one": [("1", "x", "()")]}):
        raise RuntimeError("leave early")
    assert owner.one is original
