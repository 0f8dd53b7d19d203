"""The shared layer of the Try-it self-checks (mha_course.tryit): verdicts, relate, masks, guard.

Drawn inputs (hypothesis) rather than hand-picked ones: `relate` must name a transpose, a
ratio, an offset, a reversal, a shift and a missing reshape for any array, and never print a
value of the right answer that the student's answer does not already hold.
"""

from __future__ import annotations

import importlib.util
import re
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mha import steps
from mha_course.tryit import (
    NotYet,
    Verdict,
    as_array,
    as_number,
    describe_number,
    first_match,
    guarded,
    judge_parts,
    mask_verdict,
    not_tried,
    not_yet,
    read_mask,
    relate,
    right,
    self_check,
)

shapes = st.lists(st.integers(3, 5), min_size=2, max_size=4).map(tuple)


def _distinct(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """An array of distinct, non-round values: no two entries, no entry and its neighbour alike."""
    rng = np.random.default_rng(seed)
    return rng.permutation(np.arange(1, int(np.prod(shape)) + 1)).reshape(shape) * 1.37 + \
        rng.uniform(0.01, 0.02, size=shape)


@settings(max_examples=40, deadline=None)
@given(shape=shapes, seed=st.integers(0, 2**16))
def test_relate_names_a_swap_of_the_last_two_axes(shape, seed):
    shape = shape[:-1] + (shape[-2],)  # square in the last two axes
    w = _distinct(shape, seed)
    assert "transposed" in relate(np.swapaxes(w, -1, -2), w)


@settings(max_examples=40, deadline=None)
@given(shape=shapes, seed=st.integers(0, 2**16), k=st.sampled_from([2, 4, 8, 0.5, 0.125]))
def test_relate_names_a_constant_ratio_by_its_factor(shape, seed, k):
    w = _distinct(shape, seed)
    said = relate(w * k, w, factors={"W (the ranks)": 4, "2 (K and V)": 2, "the itemsize": 8})
    assert "times" in said or "1/" in said, said
    assert "off by" not in said and "away" not in said, said
    if k == 4:
        assert "W (the ranks)" in said
    if k == 8:  # 2 * 4 and the itemsize both fit 8: both are named
        assert "factor the itemsize too big" in said and "2 (K and V)" in said \
            and "W (the ranks)" in said, said


@settings(max_examples=40, deadline=None)
@given(shape=shapes, seed=st.integers(0, 2**16), c=st.sampled_from([1.0, -1.0, 0.5]))
def test_relate_names_a_constant_offset(shape, seed, c):
    w = _distinct(shape, seed)
    said = relate(w + c, w)
    assert f"{c:+.3g} away" in said, said
    assert ("off by one" in said) == (abs(c) == 1.0)


@settings(max_examples=40, deadline=None)
@given(shape=shapes, seed=st.integers(0, 2**16), data=st.data())
def test_relate_names_a_reversal_a_shift_and_a_permutation(shape, seed, data):
    w = _distinct(shape, seed)
    axis = data.draw(st.integers(0, len(shape) - 1))
    assert f"reversed along axis {axis}" in relate(np.flip(w, axis), w)
    shifted = np.roll(w, 1, axis=axis)
    assert f"shifted by one along axis {axis}" in relate(shifted, w)
    perm = data.draw(st.permutations(range(len(shape))))
    if tuple(perm) != tuple(range(len(shape))):
        said = relate(w.transpose(perm), w)
        assert "axes" in said or "transposed" in said or "reversed" in said, said


@settings(max_examples=40, deadline=None)
@given(shape=shapes, seed=st.integers(0, 2**16))
def test_relate_names_a_missing_reshape_and_an_extra_axis(shape, seed):
    w = _distinct(shape, seed)
    assert "reshape is missing" in relate(w.reshape(-1), w)
    assert "axis of size 1" in relate(w[None], w) or "reshape is missing" in relate(w[None], w)


@settings(max_examples=60, deadline=None)
@given(shape=shapes, seed=st.integers(0, 2**16), data=st.data())
def test_relate_never_prints_a_value_of_the_right_answer(shape, seed, data):
    w = _distinct(shape, seed)
    g = w.copy()
    n_wrong = data.draw(st.integers(1, 3))
    for i in data.draw(st.lists(st.integers(0, w.size - 1), min_size=n_wrong, max_size=n_wrong,
                                unique=True)):
        g.flat[i] = -g.flat[i] * 3.3
    said = relate(g, w)
    shown = set(re.findall(r"-?\d+\.\d+", said))
    wanted = {f"{x:.4g}" for x in w.flat} - {f"{x:.4g}" for x in g.flat}
    assert not shown & wanted, f"{said} shows {shown & wanted}"
    assert "entries are right" in said


def test_relate_reads_masks_inverted_transposed_and_at_the_diagonal():
    allowed = np.tril(np.ones((6, 6), dtype=bool))
    assert "inverted" in relate(~allowed, allowed)
    assert "transposed" in relate(allowed.T, allowed)
    assert "diagonal" in relate(np.tril(allowed, -1), allowed)
    assert "allows 1 entry" in relate(allowed | np.eye(6, k=3, dtype=bool) & ~np.eye(6, k=4, dtype=bool)
                                      & (np.arange(6)[:, None] == 0), allowed)


def test_describe_number_names_every_slip_that_fits_and_never_the_value():
    said = describe_number(8 * 4096, 4096, factors={"2 (K and V)": 2, "W": 4, "itemsize 8": 8})
    assert "itemsize 8" in said and "2 (K and V) and W" in said, said
    assert "4096" not in said and "4,096" not in said
    assert "off by 1" in describe_number(29, 28)
    assert "squared" in describe_number(49, 7)
    assert "wrong sign" in describe_number(-3.5, 3.5)
    assert "1/4 of" in describe_number(1, 4)


def test_first_match_names_both_slips_of_one_value():
    said = first_match(np.array(8), [(8, "forgot V"), (8, "float64 bytes"), (4, "K alone")])
    assert "forgot V" in said and "float64 bytes" in said and "K alone" not in said


def test_masks_are_read_in_every_convention():
    allowed = np.array([[True, False], [True, True]])
    additive = np.where(allowed, 0.0, -np.inf)
    assert mask_verdict(allowed, allowed) is None
    assert mask_verdict(additive, allowed) is None
    assert mask_verdict(np.where(allowed, 0.0, -1e9), allowed) is None
    assert mask_verdict(allowed.astype(int), allowed) is None
    assert "key_padding_mask" in mask_verdict(~allowed, allowed)
    assert "~mask" in mask_verdict(torch.tensor(~allowed), allowed)
    assert "mask == 0" in mask_verdict((~allowed).astype(int), allowed)
    assert "swapped" in mask_verdict(np.where(allowed, -np.inf, 0.0), allowed)
    assert "mask == 0" in mask_verdict(additive, allowed, accept=("bool",))
    assert read_mask(additive)[1] == "additive"
    with pytest.raises(NotYet, match="neither"):
        read_mask(np.array([[0.5, 1.0]]))


def test_numbers_and_arrays_in_other_forms():
    assert as_number(torch.tensor(28.0), "n", integer=True) == 28
    assert as_number(np.array([3]), "n", integer=True) == 3
    assert as_array([1.0, 2.0], "positions", kind="int").dtype.kind == "i"
    with pytest.raises(NotYet, match="whole numbers"):
        as_array([1.5, 2.0], "positions", kind="int")


@self_check
def _check_sum_of_three(fn):
    """A small check in the contract's style: fn(ones(3)) must sum to 3."""
    if fn is None:
        return not_tried("write fn")
    total = float(np.sum(fn(np.ones(3))))
    if total != 3:
        not_yet(relate(total, 3.0, "your sum"))
    return right("it sums to 3")


def test_verdicts_are_returned_as_text_and_errors_in_the_students_code_named_with_the_line():
    assert _check_sum_of_three(lambda x: x).ok
    said = _check_sum_of_three(lambda x: x * 2)
    assert isinstance(said, Verdict) and not said.ok and "2 times" in said and repr(said) == said

    def broken(x):
        return x @ np.ones((2, 2))

    said = _check_sum_of_three(broken)
    assert said.startswith("not yet: your code raised ValueError") and "in your broken" in said


def test_a_bug_of_the_checker_itself_still_raises():
    buggy = self_check(steps.softmax)  # package code that fails on its own: not the student's
    with pytest.raises(Exception) as info:
        buggy("not an array")
    assert not isinstance(info.value, NotYet)


def test_judge_parts_judges_the_second_part_when_the_first_is_wrong():
    with pytest.raises(NotYet) as info:
        judge_parts(weights=lambda: not_yet("rows do not sum to 1"),
                    output=lambda: not_yet("transposed"))
    text = str(info.value)
    assert "0 of 2 parts right" in text and "rows do not sum" in text and "transposed" in text
    assert judge_parts(a=lambda: right("x"), b=lambda: right("y")).startswith("right")


STUDENT = '''
import numpy as np
from mha import steps
from mha.steps import softmax as my_alias

def honest(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)

def direct(x):
    return steps.softmax(x)

def through_alias(x):
    return my_alias(x)

def make_closure():
    f = steps.softmax
    def inner(x):
        return f(x)
    return inner

class Borrowed:
    run = staticmethod(steps.softmax)

def via_class(x):
    return Borrowed.run(x)

helper = lambda x: steps.softmax(x)  # noqa: E731
'''


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    """The student's code, in a file of its own as a notebook cell is."""
    path = tmp_path_factory.mktemp("student") / "student_cell.py"
    path.write_text(STUDENT)
    spec = importlib.util.spec_from_file_location("student_cell", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["student_cell"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("student_cell", None)


@pytest.mark.parametrize("name", ["direct", "through_alias", "closure", "via_class", "helper"])
def test_guarded_catches_the_package_reached_any_way(student, name):
    fn = student.make_closure() if name == "closure" else getattr(student, name)
    with pytest.raises(NotYet, match="mha.steps.softmax"):
        guarded(fn, np.ones((2, 3)), rule="write softmax yourself")


def test_guarded_passes_honest_work_and_returns_its_value(student):
    out = guarded(student.honest, np.zeros((2, 4)))
    assert np.allclose(out, 0.25)
    assert np.allclose(guarded(student.direct, np.zeros((1, 2)), allow=(steps,)), 0.5)


def test_guarded_refuses_an_instance_of_a_package_class():
    from mha.modules.numpy_mha import MultiHeadAttention

    module = MultiHeadAttention(8, 2, seed=0)
    with pytest.raises(NotYet, match="MultiHeadAttention"):
        guarded(module, np.zeros((1, 3, 8)))


CELL = '''
from mha.attention import masks
from mha.inference import kv_cache
from mha.attention.masks import sliding_window_mask as swm
from mha_course.tryit import reached_in_cell
from mha_course.tryit.attention_from_scratch import check_window_mask

allowed = swm(8, 3)
by_alias = reached_in_cell((masks,))
cache = kv_cache.KVCache(1, 2, 16, 4)
answer = cache.nbytes
by_property = reached_in_cell((kv_cache,))
nothing = reached_in_cell((masks.causal_mask_for_lengths,)) if hasattr(masks, "x") else []
verdict = check_window_mask(allowed, T=8, window=3)
'''


def test_a_value_answer_computed_with_the_package_in_the_calling_cell_is_seen(tmp_path):
    path = tmp_path / "cell.py"
    path.write_text(CELL)
    spec = importlib.util.spec_from_file_location("student_cell_2", path)
    cell = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cell)
    assert "mha.attention.masks.sliding_window_mask" in cell.by_alias
    assert "mha.inference.kv_cache.KVCache" in cell.by_property
    assert any(ref.endswith(".nbytes") for ref in cell.by_property)
    assert cell.nothing == []
    assert not cell.verdict.ok and "sliding_window_mask" in cell.verdict, cell.verdict


def test_in_ipython_an_answer_made_in_an_earlier_cell_is_followed_there():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        for cell in ("import numpy as np\nfrom mha.inference import kv_cache\n"
                     "from mha_course.tryit import kv_cache as tryit",
                     "cache = kv_cache.KVCache(1, 8, 1024, 64, dtype=np.float32)",
                     "n = cache.nbytes",
                     "by_package = tryit.check_cache_bytes(n)",
                     "m = 2 * 8 * 1024 * 64 * 4",
                     "by_hand = tryit.check_cache_bytes(m)"):
            assert shell.run_cell(cell, store_history=True).success, cell
        by_package, by_hand = shell.user_ns["by_package"], shell.user_ns["by_hand"]
        assert not by_package.ok and "KVCache" in by_package, by_package
        assert by_hand.ok, by_hand
    finally:
        InteractiveShell.clear_instance()
