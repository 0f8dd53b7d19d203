"""The named check of RoPE (`check_relative`) and the planted RoPE mistakes it names (ROPE_BUGS).

    check_relative(score_fn)   scores move with offsets, never with a shift; names the usual
                               RoPE mistakes (ROPE_BUGS) by matching the student's numbers
    ROPE_BUGS                  name -> (score_fn that makes the mistake, the cause reported)

Used by 16_positions_and_variants.ipynb; the library's RoPE is `mha.attention.posenc.rope`, and the correct score
function `mha.attention.positions.rope_scores`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from mha import steps
from mha.attention.posenc import _rotate, check_positions, rope, rope_frequencies
from mha.validate import require_int, shape_of

ScoreFn = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], np.ndarray]
"""score_fn(q (B, h, T, d_k), k (B, h, S, d_k), q_positions (T,), k_positions (S,)) -> (B, h, T, S)."""


def _q_only(q: np.ndarray, k: np.ndarray, q_positions: Any, k_positions: Any) -> np.ndarray:
    """WRONG: q is rotated, k is not."""
    return steps.scaled_scores(rope(q, q_positions), k)


def _k_reversed(q: np.ndarray, k: np.ndarray, q_positions: Any, k_positions: Any) -> np.ndarray:
    """WRONG: k turns the opposite way (sin with the wrong sign), i.e. by -position * theta."""
    return steps.scaled_scores(rope(q, q_positions), rope(k, -check_positions(k_positions, k.shape[-2])))


def _adjacent_tables(q: np.ndarray, k: np.ndarray, q_positions: Any, k_positions: Any) -> np.ndarray:
    """WRONG: cos/sin tables laid out for adjacent pairs (np.repeat(theta, 2)) used with rotate_half."""
    def turn(x: np.ndarray, p: Any) -> np.ndarray:
        theta = np.repeat(rope_frequencies(x.shape[-1]), 2)  # (d_k,): 0, 0, 1, 1, ... layout
        angles = check_positions(p, x.shape[-2])[:, None] * theta[None, :]  # (T, d_k)
        return _rotate(x, np.cos(angles), np.sin(angles))
    return steps.scaled_scores(turn(q, q_positions), turn(k, k_positions))


def _positions_ignored(q: np.ndarray, k: np.ndarray, q_positions: Any, k_positions: Any) -> np.ndarray:
    """WRONG: rope called without the positions, so every call counts from 0."""
    return steps.scaled_scores(rope(q), rope(k))


def _no_positions(q: np.ndarray, k: np.ndarray, q_positions: Any, k_positions: Any) -> np.ndarray:
    """WRONG: no rotation at all, plain q k^T / sqrt(d_k)."""
    return steps.scaled_scores(q, k)


ROPE_BUGS: dict[str, tuple[ScoreFn, str]] = {
    "q_only": (_q_only, "only q is rotated: rotate k as well, by the keys' own positions"),
    "k_reversed": (_k_reversed, "k is turned the opposite way (the sign of sin flipped for k): the "
                                "angles then add up, so the score depends on m + n, not on m - n"),
    "adjacent_tables": (_adjacent_tables,
                        "cos/sin tables laid out for adjacent pairs (np.repeat(theta, 2)) used with "
                        "the half-split rotate_half: the two features of a pair turn by different "
                        "angles, which is no rotation; repeat the d_k/2 angles as [angles, angles]"),
    "positions_ignored": (_positions_ignored,
                          "the positions are not passed on, so rope counts from 0 in every call "
                          "(a chunk after a KV cache must use positions S - T + arange(T))"),
    "no_positions": (_no_positions, "no rotation at all: plain q k^T / sqrt(d_k) cannot tell where "
                                    "a token is, so nothing changes when the keys move"),
}
"""Planted RoPE mistakes: name -> (score_fn that makes it, the cause check_relative reports)."""


def _relative_probe(score_fn: ScoreFn, d_k: int, T: int, S: int, shift: int,
                    seed: int) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """Run score_fn on seeded q, k at four position settings; return them (checked) and the inputs."""
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(1, 2, T, d_k))  # (B, h, T, d_k)
    k = rng.normal(size=(1, 2, S, d_k))  # (B, h, S, d_k)
    q_pos = np.arange(T) + (S - T)  # the last T of S positions, as in a decoder chunk
    k_pos = np.arange(S)
    same = np.arange(T) + 3  # q and k[:T] at equal positions: offset 0 on the diagonal
    runs = {
        "base": score_fn(q, k, q_pos, k_pos),
        "shifted": score_fn(q, k, q_pos + shift, k_pos + shift),
        "moved": score_fn(q, k, q_pos, k_pos + 1),
        "same": score_fn(q, k[:, :, :T], same, same),
    }
    for name, out in runs.items():
        want = (1, 2, T, T if name == "same" else S)
        if shape_of(out) != want:
            raise AssertionError(f"relative: score_fn must return scores (B, h, T, S) = {want}, "
                                 f"got {shape_of(out)} (in the {name!r} run)")
        runs[name] = np.asarray(out, dtype=np.float64)
    return runs, q, k


def _matching_bug(runs: dict, d_k: int, T: int, S: int, shift: int, seed: int,
                  atol: float) -> tuple[str, str] | None:
    """The ROPE_BUGS entry whose outputs equal the student's on every run, or None."""
    for name, (bug, why) in ROPE_BUGS.items():
        theirs, _, _ = _relative_probe(bug, d_k, T, S, shift, seed)
        if all(np.allclose(runs[r], theirs[r], rtol=0, atol=atol) for r in runs):
            return name, why
    return None


def check_relative(score_fn: ScoreFn, d_k: int = 8, T: int = 4, S: int = 6, shift: int = 37,
                   atol: float = 1e-10, seed: int = 0) -> str:
    """Assert a RoPE score_fn(q, k, q_positions, k_positions) depends on positions only through offsets.

    Three properties, on seeded float64 inputs: (1) shifting every query and key position by
    `shift` leaves every score unchanged; (2) moving the keys one position changes the scores
    (positions are used at all); (3) at equal positions the rotations cancel, so the score is
    q.k / sqrt(d_k). On failure the message names the ROPE_BUGS mistake that gives exactly the
    student's numbers, or, when none does, says only what was measured.
    """
    d_k, T, S = require_int("d_k", d_k), require_int("T", T), require_int("S", S)
    if d_k % 2 or T > S:
        raise ValueError(f"check_relative needs an even d_k and T <= S, got d_k={d_k}, T={T}, S={S}")
    runs, q, k = _relative_probe(score_fn, d_k, T, S, shift, seed)
    shift_err = float(np.abs(runs["shifted"] - runs["base"]).max())
    moved = float(np.abs(runs["moved"] - runs["base"]).max())
    plain = np.einsum("bhtd,bhtd->bht", q, k[:, :, :T]) / math.sqrt(d_k)  # (B, h, T): q_t . k_t
    same_err = float(np.abs(np.diagonal(runs["same"], axis1=-2, axis2=-1) - plain).max())
    if shift_err > atol:
        problem = (f"shifting every position by {shift} moved the scores by up to {shift_err:.3g} "
                   f"(expected at most {atol:g}): they depend on absolute positions, not on offsets")
    elif moved <= 1e-6:
        problem = (f"moving every key one position later changed no score (largest change "
                   f"{moved:.3g}): the positions do not reach the scores")
    elif same_err > atol:
        problem = (f"at equal query and key positions the rotations should cancel, giving "
                   f"q.k / sqrt(d_k), but the scores differ from it by up to {same_err:.3g}: the "
                   f"rotation changes lengths, or the scale 1/sqrt(d_k) is missing")
    else:
        return (f"relative: scores unchanged (within {atol:g}) when all positions shift by {shift}, "
                f"changed by up to {moved:.3g} when the keys move one place, q.k/sqrt(d_k) at offset 0")
    found = _matching_bug(runs, d_k, T, S, shift, seed, atol)
    cause = (f"likely cause ({found[0]}): {found[1]}" if found else
             "it matches none of the usual mistakes (" + ", ".join(ROPE_BUGS) + "); compare your "
             "function with positions.rope_scores on the same q, k and positions")
    raise AssertionError(f"relative: {problem}. {cause}")


