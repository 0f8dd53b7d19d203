"""mha_course.diagnose.parallel names each usual ring-attention mistake, calls correct code correct, and
names nothing it can't tell.

Contracts:
  * correct code in several styles passes every check (a max-shift merge, positions as lists, a
    -1e9 fill, blocks passed the other way round the ring, pairs as a tensor);
  * each mistake A7's hidden tests name is named, by value: the merge (its planted merges), the
    zigzag positions and their refusal, the ring step (its planted steps), the ring (the recorded
    calls of ring_step and the output's order) and the causal pairs;
  * student code that raises, returns None or the wrong shape is reported, not raised;
  * the later parts run with the references of the earlier ones: a wrong merge does not fail the
    step, the ring or the pairs, and a missing one is put in with a note;
  * the verdicts do not lean on module state: a grader's refusing(parallel, ...) cannot break them.
"""

from __future__ import annotations

import math

import pytest
import torch

from mha.attention import torch_attention
from mha.parallel import ring as parallel
from mha_course import diagnose
from mha_course.diagnose import parallel as dp


# ---- part 1: the merge ---------------------------------------------------------------------------
def merge_shifted(out_a, lse_a, out_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    base = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    return torch.exp(lse_a - base)[..., None] * out_a + torch.exp(lse_b - base)[..., None] * out_b, lse


def merge_by_max(out_a, lse_a, out_b, lse_b):
    """Another right style: shift by the larger lse, normalise by the sum (numpy-like)."""
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    wa, wb = torch.exp(lse_a - m), torch.exp(lse_b - m)
    total = wa + wb
    out = (wa[..., None] * out_a + wb[..., None] * out_b) / torch.where(total > 0, total, 1)[..., None]
    return out, m + torch.log(total)


@pytest.mark.parametrize("fn", [merge_shifted, merge_by_max, torch_attention.merge_partials])
def test_correct_merges_pass(fn):
    d = dp.merge_diagnosis(fn)
    assert d.ok, d.message


@pytest.mark.parametrize("name", list(dp.MERGE_MISTAKES))
def test_each_planted_merge_is_named(name):
    d = dp.merge_diagnosis(dp.MERGE_MISTAKES[name][0])
    assert not d.ok and d.bug == name, d.message


@pytest.mark.parametrize("wrong, words", [
    (lambda oa, la, ob, lb: (oa + ob) / 2, "must return two things"),
    (lambda oa, la, ob, lb: None, "returned None"),
    (lambda oa, la, ob, lb: (oa, torch.logaddexp(la, lb)[..., None]), "drop the keepdim axis"),
    (lambda oa, la, ob, lb: (oa[..., :1], la), "returned out of shape"),
    (lambda oa, la, ob, lb: (oa + ob, torch.logaddexp(la, lb)), "no known mistake fits"),
    (lambda oa, la, ob, lb: 1 / 0, "raised ZeroDivisionError"),
])
def test_merge_slips_that_are_not_planted_are_reported(wrong, words):
    d = dp.merge_diagnosis(wrong)
    assert not d.ok and words in d.message, d.message


def test_the_merge_cases_are_what_they_say():
    """Huge scores really overflow exp; the empty rows really have no key on either side."""
    (_, lse_a, _, lse_b), (out, lse) = dp.merge_inputs(dp.MergeCase("huge"))
    assert float(lse_a[torch.isfinite(lse_a)].min()) > 900 and torch.isinf(torch.exp(lse)).all()
    (_, lse_a, _, lse_b), (out, lse) = dp.merge_inputs(dp.MergeCase("both_empty", seed=4))
    assert torch.isneginf(lse[:, :, [1, 3]]).all() and (out[:, :, [1, 3]] == 0).all()
    assert torch.isfinite(lse[:, :, [0, 2, 4]]).all()


# ---- part 2: zigzag positions --------------------------------------------------------------------
def zigzag(T, W):
    if T % (2 * W):
        raise ValueError(f"T={T} is not divisible by 2W={2 * W}")
    c = torch.arange(T).chunk(2 * W)
    return [torch.cat([c[r], c[2 * W - 1 - r]]) for r in range(W)]


def zigzag_lists(T, W):
    if T % (2 * W):
        raise ValueError("T must be divisible by 2 * world_size")
    n = T // (2 * W)
    return [list(range(r * n, (r + 1) * n)) + list(range((2 * W - 1 - r) * n, (2 * W - r) * n))
            for r in range(W)]


@pytest.mark.parametrize("fn", [zigzag, zigzag_lists, dp.reference_zigzag_positions,
                                lambda T, W: torch.stack(zigzag(T, W))])
def test_correct_positions_pass(fn):
    d = dp.positions_diagnosis(fn)
    assert d.ok, d.message


@pytest.mark.parametrize("name", list(dp.POSITION_MISTAKES))
def test_each_planted_layout_is_named(name):
    slip = dp.POSITION_MISTAKES[name][0]
    d = dp.positions_diagnosis(slip)
    assert not d.ok and d.bug == name and "zigzag_positions(16, 4)" in d.message, d.message


def _checks_only_w(T, W):
    if T % W:
        raise ValueError("T must be divisible by W")
    n = T // (2 * W)
    return [list(range(r * n, (r + 1) * n)) + list(range((2 * W - 1 - r) * n, (2 * W - r) * n))
            for r in range(W)]


def _asserts(T, W):
    assert T % (2 * W) == 0
    return zigzag(T, W)


def _silent_message(T, W):
    if T % (2 * W):
        raise ValueError()
    return zigzag(T, W)


@pytest.mark.parametrize("fn, words", [
    (_checks_only_w, "checking T % W is not enough"),
    (_asserts, "an assert is not a clear error"),
    (_silent_message, "without a message"),
    (lambda T, W: [torch.cat([c[r], c[r + W]]) for c in [torch.arange(T).chunk(2 * W)] for r in range(W)],
     "no usual slip fits"),  # chunks r and r + W
    (lambda T, W: None, "returned None"),
    (lambda T, W: [torch.arange(T // W).float() + 0.5 for _ in range(W)], "whole-number positions"),
    (lambda T, W: zigzag(T, W)[:-1] if W > 1 else [], "must return world_size=4 rows"),
    (lambda T, W: [torch.zeros(T // W, dtype=torch.long) for _ in range(W)], "exactly one rank"),
])
def test_position_slips_are_named(fn, words):
    d = dp.positions_diagnosis(fn)
    assert not d.ok and words in d.message, d.message


# ---- part 3: one ring step -----------------------------------------------------------------------
def step_student(q, k, v, q_pos, k_pos, out, lse, causal=False):
    """A student's step, calling merge_partials by name (as the notebook's does)."""
    if causal:
        allowed = k_pos[None, :] <= q_pos[:, None]
        if not allowed.any():
            return out, lse
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        scores = scores.masked_fill(~allowed, -1e9)  # a -1e9 fill does as well as -inf
    block_lse = torch.logsumexp(scores, dim=-1)
    block_out = torch.softmax(scores, dim=-1) @ v
    return merge_partials(out, lse, block_out, block_lse)  # noqa: F821 (swapped in by the check)


@pytest.mark.parametrize("fn", [dp.reference_ring_step, dp.planted_step()])
def test_correct_steps_pass(fn):
    d = dp.step_diagnosis(fn)
    assert d.ok, d.message


def test_a_step_that_calls_merge_partials_runs_with_the_reference(capsys):
    """merge_partials is not defined in this module: the check puts the reference in, with a note."""
    d = dp.step_diagnosis(step_student, globals())
    assert d.ok, d.message
    assert "merge_partials" not in globals(), "the swapped-in reference must be taken out again"
    assert "in its place" in capsys.readouterr().out


def test_a_wrong_merge_does_not_fail_the_step():
    globals()["merge_partials"] = dp.MERGE_MISTAKES["average"][0]
    try:
        assert dp.step_diagnosis(step_student, globals()).ok
        assert not dp.step_diagnosis(step_student).ok  # the check can fail: without the swap it does
        assert globals()["merge_partials"] is dp.MERGE_MISTAKES["average"][0], "restored afterwards"
    finally:
        del globals()["merge_partials"]


@pytest.mark.parametrize("name", list(dp.STEP_MISTAKES))
def test_each_planted_step_is_named(name):
    d = dp.step_diagnosis(dp.STEP_MISTAKES[name][0])
    assert not d.ok and d.bug == name, d.message


def test_the_step_cases_hold_the_traps_they_claim():
    """Case 3's block is hidden entirely; case 4's early rows see nothing of it, its late rows all."""
    hidden, zig = dp.STEP_CASES[2], dp.STEP_CASES[3]
    assert not dp._causal(torch.tensor(hidden.q_pos), torch.tensor(hidden.k_pos)).any()
    rows = dp._causal(torch.tensor(zig.q_pos), torch.tensor(zig.k_pos)).any(dim=1)
    assert rows.tolist() == [False, False, True, True]


@pytest.mark.parametrize("wrong, words", [
    (lambda q, k, v, qp, kp, out, lse, causal: out, "must return two things"),
    (lambda q, k, v, qp, kp, out, lse, causal: (out[..., 0], lse), "returned out of shape"),
    (lambda q, k, v, qp, kp, out, lse, causal: (out, lse), "no known mistake fits"),
])
def test_step_slips_that_are_not_planted_are_reported(wrong, words):
    d = dp.step_diagnosis(wrong)
    assert not d.ok and words in d.message, d.message


# ---- part 4: the ring ----------------------------------------------------------------------------
def ring_student(q, k, v, world_size, layout="contiguous", causal=False, *, steps=None, own_k=False,
                 keep_v=False, rank_order=False, hop=-1, pass_causal=True):
    """The model ring, calling ring_step and zigzag_positions by name, with one knob per mistake."""
    T, W = q.shape[2], world_size
    pos = zigzag_positions(T, W) if layout == "zigzag" else list(torch.arange(T).chunk(W))  # noqa: F821
    qs = [q[:, :, p] for p in pos]
    held = [(k[:, :, p], v[:, :, p], p) for p in pos]
    vs = [v[:, :, p] for p in pos]
    outs = [torch.zeros_like(x) for x in qs]
    lses = [torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype) for x in qs]
    for _ in range(W if steps is None else steps(W)):
        for r in range(W):
            k_r, v_r, kp = held[r]
            outs[r], lses[r] = ring_step(qs[r], k_r, vs[r] if keep_v else v_r,  # noqa: F821
                                         pos[r], pos[r] if own_k else kp, outs[r], lses[r],
                                         causal if pass_causal else False)
        held = [held[(r + hop) % W] for r in range(W)]
    if rank_order:
        return torch.cat(outs, dim=2)
    out = torch.empty_like(q)
    for r in range(W):
        out[:, :, pos[r]] = outs[r]
    return out


def run_ring(**knobs):
    return dp.ring_diagnosis(lambda *a: ring_student(*a, **knobs), globals())


@pytest.mark.parametrize("knobs", [{}, {"hop": 1}], ids=["passes-right", "passes-left"])
def test_correct_rings_pass(knobs):
    d = run_ring(**knobs)
    assert d.ok, d.message
    assert "ring_step" not in globals() and "zigzag_positions" not in globals()


@pytest.mark.parametrize("knobs, bug", [
    ({"steps": lambda W: W - 1}, "one_block_missed"),
    ({"own_k": True}, "own_k_positions"),
    ({"keep_v": True}, "v_left_behind"),
    ({"rank_order": True}, "not_unsharded"),
])
def test_each_ring_mistake_is_named(knobs, bug):
    d = run_ring(**knobs)
    assert not d.ok and d.bug == bug, d.message


def test_a_ring_that_forgets_causal_is_named():
    d = run_ring(pass_causal=False)
    assert not d.ok and "got causal=False" in d.message, d.message


def test_a_ring_without_ring_step_is_not_a_ring():
    """Right values from one pass over the whole sequence are not this part."""
    def one_process(q, k, v, world_size, layout="contiguous", causal=False):
        return dp._attend(q, k, v, dp._causal(torch.arange(q.shape[2]), torch.arange(q.shape[2]))
                          if causal else None)[0]

    d = dp.ring_diagnosis(one_process, globals())
    assert not d.ok and "never called ring_step" in d.message, d.message

    def whole_sequence_once(q, k, v, world_size, layout="contiguous", causal=False):
        T = q.shape[2]
        out = torch.zeros_like(q)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype)
        return ring_step(q, k, v, torch.arange(T), torch.arange(T), out, lse, causal)[0]  # noqa: F821

    d = dp.ring_diagnosis(whole_sequence_once, globals())
    assert not d.ok and "queries of 16 tokens" in d.message, d.message


def test_a_ring_in_the_wrong_layout_is_named():
    d = dp.ring_diagnosis(lambda q, k, v, W, layout, causal: ring_student(q, k, v, W, "contiguous", causal),
                          globals())
    assert not d.ok and "the zigzag layout gives rank r chunks r and 2W-1-r" in d.message, d.message


@pytest.mark.parametrize("wrong, words", [
    (lambda q, k, v, W, layout, causal: None, "returned None"),
    (lambda q, k, v, W, layout, causal: "out", "not a tensor"),
    (lambda q, k, v, W, layout, causal: q[:, :, :4], "returned shape"),
    (lambda q, k, v, W, layout, causal: 1 / 0, "raised ZeroDivisionError"),
])
def test_rings_returning_the_wrong_thing_are_reported(wrong, words):
    d = dp.ring_diagnosis(wrong, globals())
    assert not d.ok and words in d.message, d.message


def test_the_recorder_is_the_reference_step_to_its_caller():
    (q, k, v), _ = dp.ring_truth(dp.RING_CASES[1])
    rec = dp.StepRecorder()
    rec.reset(q, k, v)
    args = (q[:, :, :4], k[:, :, 4:], v[:, :, 4:], torch.arange(4), torch.arange(4, 8),
            torch.zeros_like(q[:, :, :4]), torch.full(q[:, :, :4].shape[:-1], float("-inf"), dtype=q.dtype), True)
    got = rec(*args)
    want = dp.reference_ring_step(*args)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert rec.calls[0].k_at == (4, 5, 6, 7) and rec.calls[0].q_at == (0, 1, 2, 3)


# ---- part 5: the causal pairs --------------------------------------------------------------------
def pairs(T, W, layout="contiguous"):
    pos = zigzag_positions(T, W) if layout == "zigzag" else list(torch.arange(T).chunk(W))  # noqa: F821
    return [int((p + 1).sum()) for p in pos]


@pytest.mark.parametrize("fn", [pairs, lambda T, W, layout: torch.tensor(pairs(T, W, layout)).double(),
                                lambda T, W, layout: tuple(parallel.causal_work(T, W, layout))])
def test_correct_pairs_pass(fn):
    d = dp.pairs_diagnosis(fn, globals())
    assert d.ok, d.message


@pytest.mark.parametrize("slip", ["strict", "no_mask", "own_block", "other_layout", "blocks", "total"])
def test_each_pairs_slip_is_named(slip):
    def wrong(T, W, layout):
        return dp._pair_slips(T, W, layout)[slip][0]

    d = dp.pairs_diagnosis(wrong)
    why = dp._pair_slips(32, 4, "contiguous")[slip][1]
    assert not d.ok and why.split(":")[0].split(";")[0] in d.message, d.message


def test_pairs_of_the_wrong_kind_are_reported():
    assert "one per rank" in dp.pairs_diagnosis(lambda T, W, layout: "many").message
    assert "world_size = 4 numbers" in dp.pairs_diagnosis(lambda T, W, layout: [1, 2]).message


# ---- the verdicts stand on their own -------------------------------------------------------------
def test_verdicts_survive_a_refused_reference():
    """A grader may refuse the package's functions; the checks' own references are bound at import."""
    names = ("merge_partials", "rank_positions", "block_mask", "causal_work", "ring_attention")
    with diagnose.refusing(parallel, names):
        assert dp.merge_diagnosis(merge_shifted).ok
        assert dp.positions_diagnosis(zigzag).ok
        assert dp.step_diagnosis(dp.planted_step()).ok
        assert run_ring().ok
        assert dp.pairs_diagnosis(pairs, globals()).ok


def test_the_pairs_and_their_slips_agree_with_what_the_ring_code_does():
    """The counts A7 grades stay those of mha.parallel.ring: the allowed pairs are the least any rank can
    score, the ring code's own count (ring_stats) exceeds them only by its own block's masked part,
    and the "blocks" slip is the number of blocks the code scores something of."""
    for T, W, layout in dp.PAIRS_CASES:
        pairs = dp._work(T, W, layout)
        assert pairs == parallel.causal_work(T, W, layout)
        stats = parallel.ring_stats(T, W, layout)
        assert [s["blocks"] for s in stats] == dp._pair_slips(T, W, layout)["blocks"][0]
        for r, (s, p) in enumerate(zip(stats, parallel.rank_positions(T, W, layout), strict=True)):
            own_masked = len(p) ** 2 - int((p[None, :] <= p[:, None]).sum())
            assert s["scores"] - pairs[r] == own_masked, f"T={T} W={W} {layout} rank {r}: {s}"
