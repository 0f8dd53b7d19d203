"""The graded course, end to end with nbgrader: what a teacher relies on.

For each assignment, in a private copy of the course: the source passes its own tests; the
untouched release scores 0 without a grader error; a full submission gets every autograded
point; a submission with one planted bug loses exactly the points of the part it breaks,
keeps the rest, and its feedback names that bug; an edited locked test cell is restored
and reported; a part that loops forever is cut off and the rest is still graded.
"""

from __future__ import annotations

import ast
import csv
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
COURSE = ROOT / "notebooks" / "assignments"
sys.path.insert(0, str(COURSE))
import course  # noqa: E402  (the course's own tooling: notebooks/assignments/course.py)


@dataclass(frozen=True)
class Planted:
    """One wrong submission: `old` -> `new` in solution cell `cell`; it must lose `loses`."""

    student: str
    cell: str
    old: str
    new: str
    loses: frozenset[str]
    feedback: str  # the feedback HTML must contain this (it names the bug)


def planted(student, cell, old, new, loses, feedback) -> Planted:
    return Planted(student, cell, old, new, frozenset([loses] if isinstance(loses, str) else loses),
                   feedback)


PLANTED: dict[str, list[Planted]] = {
    "A1_seven_steps": [
        planted("split-no-transpose", "a1-split",
                "x = x.reshape(B, T, n_heads, d_k)  # (B, T, h, d_k)\n    return x.transpose(0, 2, 1, 3)",
                "return x.reshape(B, n_heads, T, d_k)", "a1-split-tests", "matches planted bug 'split_no_transpose'"),
        planted("merge-no-transpose", "a1-merge", "x = x.transpose(0, 2, 1, 3)  # (B, T, h, d_k)",
                "", "a1-merge-tests", "matches planted bug 'merge_no_transpose'"),
        planted("unscaled", "a1-scores", " / math.sqrt(d_k)", "", "a1-scores-tests",
                "matches planted bug 'unscaled_scores'"),
        planted("anti-causal", "a1-mask", "np.tril(", "np.triu(", "a1-mask-tests",
                "matches planted bug 'anti_causal_mask'"),
        planted("mask-off-by-one", "a1-mask", "dtype=bool))", "dtype=bool), k=-1)",
                "a1-mask-tests", "matches planted bug 'mask_without_diagonal'"),
        planted("softmax-no-max", "a1-softmax", "np.exp(scores - row_max)", "np.exp(scores)",
                "a1-softmax-tests", "matches planted bug 'softmax_no_max'"),
        planted("softmax-wrong-axis", "a1-softmax", "axis=-1", "axis=-2", "a1-softmax-tests",
                "matches planted bug 'softmax_wrong_axis'"),
        planted("softmax-nan-row", "a1-softmax",
                "return np.divide(e, total, out=np.zeros_like(e), where=total > 0)",
                "return e / total", "a1-softmax-tests", "must come out as zeros, not NaN"),
        planted("forward-w-transposed", "a1-forward", "module.W", "module.W", "a1-forward-tests",
                "matches planted bug 'weights_transposed'"),  # `new` is applied by _edit below: every W becomes W.T
        planted("forward-mask-after-softmax", "a1-forward",
                "    if causal:\n        scores = np.where(causal_mask(x.shape[1]), scores, -np.inf)"
                "  # 4) future -> -inf\n    weights = softmax(scores)  # 5) (B, h, T, T)",
                "    weights = softmax(scores)\n    if causal:\n"
                "        weights = np.where(causal_mask(x.shape[1]), weights, 0.0)",
                "a1-forward-tests", "matches planted bug 'mask_after_softmax'"),
        planted("forward-no-mask", "a1-forward", "    if causal:\n        scores = np.where(",
                "    if False:\n        scores = np.where(", "a1-forward-tests",
                "ignores causal=True"),
        planted("rows-nan-pass", "a1-rows", "bool(np.all(np.abs(sums - 1.0) <= atol))",
                "not np.any(np.abs(sums - 1.0) > atol)", "a1-rows-tests", "row of NaN"),
        planted("renamed-merge", "a1-merge", "def merge_heads(x):", "def merge_head(x):",
                "a1-merge-tests", "name 'merge_heads' is not defined"),
        planted("forward-no-bias", "a1-forward", " + module.b", "", "a1-forward-tests",
                "with every bias left out"),
        planted("causal-no-control", "a1-causal",
                "return not np.array_equal(out[:, t], forward_fn(present)[:, t])", "return True",
                "a1-causal-tests", "control case"),
    ],
    "A2_pytorch_port": [
        planted("load-no-transpose", "a2-load", "torch.from_numpy(W.T)", "torch.from_numpy(W)",
                "a2-load-tests", "matches planted bug 'weights_transposed'"),
        planted("split-view-no-transpose", "a2-sdpa", "proj.view(B, T, h, d_k).transpose(1, 2)",
                "proj.view(B, h, T, d_k)", "a2-sdpa-tests",
                "matches planted bug 'split_no_transpose'"),
        planted("mask-unflipped", "a2-mask", "return ~allowed", "return allowed",
                "a2-mask-tests", "flip it (~allowed); you returned the mask unchanged"),
    ],
    "A3_find_the_bug": [
        planted("wrong-name-b", "a3-bug-b", 'bug_B = "scores_over_d_k"', 'bug_B = "softmax_no_max"',
                "a3-bug-b-tests",
                "suspect B does not carry 'softmax_no_max'; it carries 'scores_over_d_k'"),
        planted("fix-a-no-transpose", "a3-fix-a", "x = x.transpose(0, 2, 1, 3)", "x = x",
                "a3-fix-a-tests", "matches planted bug 'merge_no_transpose'"),
        planted("fix-d-triu", "a3-fix-d", "np.tril(", "np.triu(", "a3-fix-d-tests",
                "matches planted bug 'anti_causal_mask'"),
        planted("fix-c-overflows", "a3-fix-c", "np.exp(masked - row_max)", "np.exp(masked)",
                "a3-fix-c-tests", "at x * 400, where scores pass exp's range"),
    ],
}

PLANTED["A4_kv_cache"] = [
    planted("mask-top-left", "a4-mask", "k=S - t_new", "k=0", "a4-mask-tests",
            "top-left alignment: for a chunk after cached keys, query i sits at position "
            "S - t_new + i"),
    planted("decode-top-left", "a4-decode", "offset=S - t_new", "offset=0", "a4-decode-tests",
            "your chunk sees only the first keys: top-left alignment; use offset S - t_new"),
    planted("decode-before-append", "a4-decode",
            "    K, V = cache.append(k, v)  # 3) (B, h, S, d_k): the past and the new positions\n",
            "    S0 = len(cache)\n    K, V = cache.K[:, :, :S0], cache.V[:, :, :S0]  # the past only\n"
            "    cache.append(k, v)\n", "a4-decode-tests",
            "append the new keys and values before attending: a token must see itself"),
    planted("decode-no-bias", "a4-decode", ", module.b", ", 0.0", "a4-decode-tests",
            "tokens"),
    planted("cache-buffer", "a4-cache", "return self.K[:, :, :stop], self.V[:, :, :stop]",
            "return self.K, self.V", "a4-cache-tests", "you returned the whole buffer"),
]

PLANTED["A5_backward_pass"] = [
    planted("softmax-no-outer-product", "a5-softmax", "return weights * (dweights - wg)",
            "return weights * dweights", "a5-softmax-tests",
            "matches planted bug 'softmax_no_outer_product'"),
    planted("mask-grad-into-masked", "a5-mask", "return np.where(allowed, dscores, 0.0)",
            "return dscores", "a5-mask-tests", "matches planted bug 'mask_backward_skipped'"),
    planted("linear-dW-transposed", "a5-linear", "dW = x2.T @ g2", "dW = g2.T @ x2",
            "a5-linear-tests", "matches planted bug 'linear_dW_transposed'"),
    planted("scores-dk-no-transpose", "a5-scores", "dscores.swapaxes(-1, -2) @ q", "dscores @ q",
            "a5-scores-tests", "matches planted bug 'scores_backward_dk_no_transpose'"),
    planted("scores-unscaled", "a5-scores", "scale = math.sqrt(q.shape[-1])", "scale = 1.0",
            "a5-scores-tests", "matches planted bug 'scores_backward_unscaled'"),
    planted("backward-ignores-mask", "a5-backward",
            "allowed = module.allowed(B, T, S, causal, mask)", "allowed = None",
            "a5-backward-tests", "matches planted bug 'backward_ignores_mask'"),
    planted("dx-query-path-only", "a5-backward", 'grads["dx"] = dx + dctx_k + dctx_v',
            'grads["dx"] = dx', "a5-backward-tests", "matches planted bug 'dx_query_path_only'"),
]

PLANTED["A6_generation"] = [
    planted("pads-right", "a6-positions", "pos = col - (T - lengths)  #",
            "pos = np.where(col < lengths, col, -1)  #", "a6-positions-tests",
            "the pads are on the right"),
    planted("positions-from-1", "a6-positions", "return np.where(pos >= 0, pos, -1)",
            "return np.where(pos >= 0, pos + 1, -1)", "a6-positions-tests",
            "off by one: a sentence's first real token is at position 0"),
    planted("position-restarts", "a6-generate", "step = step + 1  #", "step = 0 * step  #",
            "a6-generate-tests", "the new token's position restarted at 0"),
    planted("no-cache", "a6-generate",
            "            logits = model(nxt[:, None], step, caches)  # (B, 1, V): only the new token",
            "            tokens = np.concatenate([tokens, nxt[:, None]], axis=1)\n"
            "            positions = np.concatenate([positions, step], axis=1)\n"
            "            logits = model(tokens, positions)  # the whole sequence again, no cache",
            "a6-generate-tests", "never used the cache"),
    planted("argmax-batch-axis", "a6-generate", "axis=-1)  # (B,)", "axis=0)  # (B,)",
            "a6-generate-tests", "the argmax ran over the batch axis"),
    planted("ring-keeps-oldest", "a6-ring", "for i in range(max(0, t_new - self.window), t_new):",
            "for i in range(min(t_new, self.window - self.seen)):", "a6-ring-tests",
            "matches planted mistake 'keeps_oldest'"),
    planted("ring-grows", "a6-ring",
            "        for i in range(max(0, t_new - self.window), t_new):  # only the newest window is "
            "read again\n            slot = (self.seen + i) % self.window  # the oldest slot\n"
            "            self.K[:, :, slot], self.V[:, :, slot] = k[:, :, i], v[:, :, i]\n"
            "            self.pos[:, slot] = positions[:, i]\n",
            "        self.K, self.V, self.pos = K, V, pos  # keeps every key\n", "a6-ring-tests",
            "the cache grows"),
    planted("bytes-query-heads", "a6-bytes", "2 * B * n_kv_heads * slots", "2 * B * n_heads * slots",
            "a6-bytes-tests", "you counted all n_heads query heads"),
]

PLANTED["A7_ring_attention"] = [
    planted("merge-average", "a7-merge", "return share_a * out_a + share_b * out_b, lse",
            "return (out_a + out_b) / 2, lse", "a7-merge-tests", "matches planted mistake 'average'"),
    planted("merge-overflow", "a7-merge",
            "    share_a = torch.exp(lse_a - shift)[..., None]  # (B, h, T, 1): A's fraction of the softmax mass\n"
            "    share_b = torch.exp(lse_b - shift)[..., None]  # (B, h, T, 1): B's; the two add up to 1\n"
            "    return share_a * out_a + share_b * out_b, lse",
            "    w_a, w_b = torch.exp(lse_a)[..., None], torch.exp(lse_b)[..., None]  # unshifted\n"
            "    return (w_a * out_a + w_b * out_b) / (w_a + w_b), lse", "a7-merge-tests",
            "matches planted mistake 'overflow'"),
    planted("merge-nan-empty", "a7-merge",
            "shift = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))", "shift = lse",
            "a7-merge-tests", "matches planted mistake 'nan_empty'"),
    planted("positions-w-1-r", "a7-positions", "torch.arange((2 * W - 1 - r) * n, (2 * W - r) * n)",
            "torch.arange((W - 1 - r) * n, (W - r) * n)", "a7-positions-tests",
            "matches planted mistake 'mirror_w'"),
    planted("positions-divisible-by-w", "a7-positions", "if T % (2 * W):", "if T % W:",
            "a7-positions-tests", "checking T % W is not enough"),
    planted("step-local-mask", "a7-step", "allowed = k_pos[None, :] <= q_pos[:, None]",
            "allowed = torch.ones(len(q_pos), len(k_pos), dtype=torch.bool).tril()", "a7-step-tests",
            "matches planted mistake 'local_mask'"),
    planted("step-strict", "a7-step", "allowed = k_pos[None, :] <= q_pos[:, None]",
            "allowed = k_pos[None, :] < q_pos[:, None]", "a7-step-tests",
            "matches planted mistake 'strict'"),
    planted("step-no-lse", "a7-step", "return merge_partials(out, lse, block_out, block_lse)",
            "return (out + block_out) / 2, torch.logaddexp(lse, block_lse)", "a7-step-tests",
            "matches planted mistake 'no_lse_merge'"),
    planted("step-rows-nan", "a7-step", "block_out = torch.exp(scores - base[..., None]) @ v",
            "block_out = torch.softmax(scores, dim=-1) @ v", "a7-step-tests",
            "matches planted mistake 'rows_nan'"),
    planted("ring-w-1-steps", "a7-ring", "for _ in range(W):", "for _ in range(W - 1):",
            "a7-ring-tests", "matches planted mistake 'one_block_missed'"),
    planted("ring-own-k-positions", "a7-ring", "pos[r], kp, outs[r]", "pos[r], pos[r], outs[r]",
            "a7-ring-tests", "matches planted mistake 'own_k_positions'"),
    planted("ring-not-unsharded", "a7-ring",
            "    out = torch.empty_like(q)  # (B, h, T, d_k)\n    for r in range(W):\n"
            "        out[:, :, pos[r]] = outs[r]  # back in sequence order: row i of rank r is position pos[r][i]\n"
            "    return out",
            "    return torch.cat(outs, dim=2)  # in rank order", "a7-ring-tests",
            "matches planted mistake 'not_unsharded'"),
    planted("pairs-strict", "a7-pairs", "int((p + 1).sum())", "int(p.sum())", "a7-pairs-tests",
            "that leaves out each query's own key"),
]

PLANTED["A8_flash_attention"] = [
    planted("update-no-rescale", "a8-update", "alpha = np.exp(m - base)", "alpha = 1.0",
            "a8-update-tests", "matches planted mistake 'no_rescale'"),
    planted("update-ell-only", "a8-update", "acc = alpha * acc + p @ v_block", "acc = acc + p @ v_block",
            "a8-update-tests", "matches planted mistake 'rescale_ell_only'"),
    planted("update-nan-empty", "a8-update", "base = np.where(np.isfinite(m_new), m_new, 0.0)",
            "base = m_new", "a8-update-tests", "matches planted mistake 'nan_empty'"),
    planted("update-block-max", "a8-update", "m_new = np.maximum(m, scores.max(axis=-1, keepdims=True))",
            "m_new = scores.max(axis=-1, keepdims=True)", "a8-update-tests",
            "matches planted mistake 'block_max'"),
    planted("update-normalised", "a8-update", "    return m_new, ell, acc",
            "    return m_new, ell, acc / np.where(ell > 0, ell, 1.0)", "a8-update-tests",
            "matches planted mistake 'normalised'"),
    planted("forward-local-mask", "a8-forward",
            "allowed = np.arange(s0, s1)[None, :] <= np.arange(t0, t1)[:, None] + offset  # (bq, bk)",
            "allowed = np.tril(np.ones((t1 - t0, s1 - s0), dtype=bool))  # (bq, bk)", "a8-forward-tests",
            "matches planted mistake 'local_mask'"),
    planted("forward-ragged-dropped", "a8-forward", "for t0 in range(0, T, block_q):",
            "for t0 in range(0, T - T % block_q, block_q):", "a8-forward-tests",
            "the last, shorter tile was dropped"),
    planted("forward-no-division", "a8-forward",
            "out[:, :, t0:t1] = np.divide(acc, ell, out=np.zeros_like(acc), where=ell > 0)",
            "out[:, :, t0:t1] = acc", "a8-forward-tests", "matches planted mistake 'no_division'"),
    planted("forward-divide-by-zero", "a8-forward",
            "out[:, :, t0:t1] = np.divide(acc, ell, out=np.zeros_like(acc), where=ell > 0)",
            "out[:, :, t0:t1] = acc / ell", "a8-forward-tests", "matches planted mistake 'divide_by_zero'"),
    planted("forward-lse-is-m", "a8-forward", "(m + np.log(ell))[..., 0]  # -inf", "m[..., 0]  # -inf",
            "a8-forward-tests", "matches planted mistake 'lse_is_m'"),
    planted("forward-unscaled", "a8-forward", " / math.sqrt(d_k)  # (B, h, bq, bk)", "  # (B, h, bq, bk)",
            "a8-forward-tests", "matches planted mistake 'unscaled'"),
    planted("backward-delta-dout", "a8-backward", "delta = (dout * out).sum(axis=-1)",
            "delta = dout.sum(axis=-1)", "a8-backward-tests", "matches planted mistake 'delta_from_dout'"),
    planted("backward-delta-tile", "a8-backward", "ds = p * (dp - delta[:, :, t0:t1, None]) * scale",
            "ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True)) * scale", "a8-backward-tests",
            "matches planted mistake 'delta_from_tile'"),
    planted("backward-p-tile", "a8-backward", "p = np.exp(scores - base[:, :, t0:t1])",
            "p = np.exp(scores - scores.max(axis=-1, keepdims=True))\n"
            "            p = p / p.sum(axis=-1, keepdims=True)", "a8-backward-tests",
            "P was normalised over this tile's keys alone"),
    planted("backward-unscaled", "a8-backward", "ds = p * (dp - delta[:, :, t0:t1, None]) * scale",
            "ds = p * (dp - delta[:, :, t0:t1, None])", "a8-backward-tests",
            "matches planted mistake 'unscaled_grads'"),
    planted("backward-overwritten", "a8-backward", "dk[:, :, s0:s1] += ds.swapaxes",
            "dk[:, :, s0:s1] = ds.swapaxes", "a8-backward-tests", "add (+=) over the query blocks"),
    planted("backward-local-mask", "a8-backward",
            "allowed = np.arange(s0, s1)[None, :] <= np.arange(t0, t1)[:, None] + offset\n",
            "allowed = np.tril(np.ones((t1 - t0, s1 - s0), dtype=bool))\n", "a8-backward-tests",
            "matches planted mistake 'local_mask'"),
    planted("bytes-ts-twice", "a8-bytes", "elements += 2 * T * S  # 2)", "elements += 0  # 2)",
            "a8-bytes-tests", "matches planted mistake 'ts_twice'"),
    planted("bytes-no-v", "a8-bytes", "elements += T * S + S * d + T * d", "elements += T * S + T * d",
            "a8-bytes-tests", "matches planted mistake 'no_k_or_v'"),
    planted("bytes-no-itemsize", "a8-bytes", "return itemsize * elements", "return elements",
            "a8-bytes-tests", "matches planted mistake 'no_itemsize'"),
]

PLANTED["A9_serving"] = [
    planted("lookup-logical-block", "a9-lookup", "return table[i // block_size], i % block_size",
            "return i // block_size, i % block_size", "a9-lookup-tests",
            "matches planted mistake 'logical_block'"),
    planted("lookup-whole-blocks", "a9-lookup", "return rows[:length]", "return rows", "a9-lookup-tests",
            "matches planted mistake 'whole_blocks'"),
    planted("append-cow-skipped", "a9-append", "elif refcounts[table[-1]] > 1:", "elif False:",
            "a9-append-tests", "matches planted mistake 'cow_skipped'"),
    planted("append-no-copy", "a9-append", "        K[new], V[new] = K[old], V[old]", "        pass",
            "a9-append-tests", "matches planted mistake 'cow_no_copy'"),
    planted("append-shared-freed-late", "a9-append", "refcounts[old] -= 1", "refcounts[old] -= 0",
            "a9-append-tests", "matches planted mistake 'cow_no_decref'"),
    planted("append-freed-while-shared", "a9-append", "refcounts[old] -= 1",
            "refcounts[old] = 0\n        free.append(old)", "a9-append-tests",
            "matches planted mistake 'freed_while_shared'"),
    planted("append-fill-off-by-one", "a9-append", "if slot == 0:",
            "if (length + 1) % block_size == 0 or not table:", "a9-append-tests",
            "matches planted mistake 'fill_off_by_one'"),
    planted("step-never-freed", "a9-step",
            '            free(r["rid"])\n            n_free += blocks(len(r["tokens"]) - 1)\n    running =',
            "            pass\n    running =", "a9-step-tests", "matches planted mistake 'never_freed'"),
    planted("step-positions-restart", "a9-step", "waiting.insert(0, r)  #",
            'waiting.insert(0, {**r, "tokens": r["tokens"][:r["n_prompt"]]})  #', "a9-step-tests",
            "matches planted mistake 'restart'"),
    planted("step-prompt-only", "a9-step", 'batch += [(r["rid"], r["tokens"], 0)',
            'batch += [(r["rid"], r["tokens"][:r["n_prompt"]], 0)', "a9-step-tests",
            "matches planted mistake 'prompt_only'"),
    planted("step-preempt-oldest", "a9-step", "r = running.pop()\n", "r = running.pop(0)\n",
            "a9-step-tests", "matches planted mistake 'preempt_oldest'"),
    planted("step-fill-off-by-one", "a9-step",
            'return blocks(len(r["tokens"])) - blocks(len(r["tokens"]) - 1)',
            'return int(len(r["tokens"]) % block_size == 0)', "a9-step-tests",
            "matches planted mistake 'fill_off_by_one'"),
    planted("step-separate-calls", "a9-step", "for r, token in zip(running, model(batch), strict=True):",
            "for r, token in zip(running, [model([e])[0] for e in batch], strict=True):", "a9-step-tests",
            "matches planted mistake 'separate_calls'"),
    planted("saved-partial-block", "a9-saved", "shared = prefix_len // block_size",
            "shared = -(-prefix_len // block_size)", "a9-saved-tests",
            "matches planted mistake 'partial_shared'"),
    planted("saved-n-copies", "a9-saved", "return (n_requests - 1) * shared * block",
            "return n_requests * shared * block", "a9-saved-tests",
            "matches planted mistake 'n_not_n_minus_1'"),
]

# Reaching for the reference: the part earns nothing and the summary names student, part and
# the reference reached. (student, cell, old, new, part, reference named in the summary)
CHEATS: dict[str, list[tuple[str, str, str, str, str, str]]] = {
    "A1_seven_steps": [
        ("cheat-wrapper", "a1-softmax", "    row_max = scores.max(axis=-1, keepdims=True)  # (..., 1)\n",
         "    from mha import steps\n    return steps.softmax(scores)\n", "a1-softmax-tests",
         "mha.steps.softmax"),
        ("cheat-bound-at-import", "a1-split", "def split_heads(x, n_heads):",
         "from mha.steps import split_heads\n\n\ndef _unused(x, n_heads):", "a1-split-tests",
         "mha.steps.split_heads"),
        ("cheat-partial", "a1-mask", "def causal_mask(T):",
         "import functools\n\nfrom mha import steps as st\n\ncausal_mask = functools.partial("
         "st.causal_mask)\n\n\ndef _unused(T):", "a1-mask-tests", "mha.steps.causal_mask"),
        ("cheat-other-module", "a1-scores", "    d_k = q.shape[-1]\n",
         "    from mha_course import diagnose as d\n    return d._REAL['scaled_scores'](q, k)\n",
         "a1-scores-tests", "mha.steps.scaled_scores"),
        ("cheat-module-forward", "a1-forward", "    h = module.n_heads\n",
         "    return module(x, causal=causal)\n", "a1-forward-tests",
         "mha.modules.numpy_mha.MultiHeadAttention.__call__"),
        ("cheat-checks", "a1-rows", "    sums = np.sum(weights, axis=-1)\n",
         "    from mha import checks\n    try:\n        checks.check_rows_sum_to_one(weights, atol)\n"
         "        return True\n    except AssertionError:\n        return False\n",
         "a1-rows-tests", "mha.checks.check_rows_sum_to_one"),
    ],
    "A2_pytorch_port": [
        ("cheat-converter", "a2-load", "    pairs = [",
         "    return torch_module.load_numpy_(np_module)\n    pairs = [", "a2-load-tests",
         "load_numpy_"),
        ("cheat-mask-helper", "a2-mask", "    return ~allowed",
         "    from mha.attention import masks\n    return masks.combine(~allowed)", "a2-mask-tests",
         "mha.attention.masks"),
    ],
    "A3_find_the_bug": [
        ("cheat-fix-calls-package", "a3-fix-b", "return q @ k.swapaxes(-1, -2) / math.sqrt(d_k)",
         "return steps.scaled_scores(q, k)", "a3-fix-b-tests", "mha.steps.scaled_scores"),
        ("cheat-fix-real", "a3-fix-a", "def fix_A(x):",
         "from mha_course import diagnose\n\nfix_A = diagnose._REAL['merge_heads']\n\n\ndef _unused(x):",
         "a3-fix-a-tests", "mha.steps.merge_heads"),
    ],
    "A4_kv_cache": [
        ("cheat-decode-step", "a4-decode", "    h, t_new = module.n_heads, x_new.shape[1]\n",
         "    from mha.inference import kv_cache\n    return kv_cache.decode_step(module, cache, x_new)\n",
         "a4-decode-tests", "decode_step"),
        ("cheat-mask", "a4-mask", "return np.tril(np.ones((t_new, S), dtype=bool), k=S - t_new)",
         "return steps.causal_mask(t_new, S, offset=S - t_new)", "a4-mask-tests",
         "mha.steps.causal_mask"),
    ],
    "A5_backward_pass": [
        ("cheat-step-backward", "a5-softmax", "    return weights * (dweights - wg)",
         "    from mha.training import grad as g\n    return g.softmax_backward(dweights, weights)",
         "a5-softmax-tests", "mha.training.grad.softmax_backward"),
        ("cheat-whole-backward", "a5-backward", "    h = module.n_heads\n",
         "    from mha.training import grad as g\n    return g.backward(module, x, dout, context=context, "
         "causal=causal, mask=mask)\n", "a5-backward-tests", "backward"),
    ],
    "A6_generation": [
        ("cheat-padded-positions", "a6-positions", "    lengths = np.asarray(lengths)[:, None]  # (B, 1)\n",
         "    from mha.modules import compose\n    return compose.padded_positions(np.asarray(lengths), T)\n",
         "a6-positions-tests", "mha.modules.compose.padded_positions"),
        ("cheat-generate", "a6-generate", "    B, T = tokens.shape\n",
         "    from mha.inference import generate as gen\n    return gen.generate(model, [[int(t) for t, p in "
         "zip(row, pos) if p >= 0] for row, pos in zip(tokens, positions)], n_new)\n",
         "a6-generate-tests", "mha.inference.generate.generate"),
        ("cheat-ring-kvcache", "a6-ring", "        t_new = k.shape[2]\n",
         "        from mha.inference.kv_cache import KVCache\n        if not hasattr(self, 'inner'):\n"
         "            self.inner = KVCache(k.shape[0], k.shape[1], 10**6, k.shape[3], window=self.window)\n"
         "        return self.inner.update(k, v, positions)\n", "a6-ring-tests", "mha.inference.kv_cache"),
        # issue 28: a class body that borrows the package's method (flagged when the class is defined)
        ("cheat-ring-borrows-update", "a6-ring", "    def update(self, k, v, positions):",
         "    from mha.inference import kv_cache as _kv\n    update = _kv._Cache.update\n\n"
         "    def _unused(self, k, v, positions):", "a6-ring-tests", "mha.inference.kv_cache._Cache.update"),
        ("cheat-bytes-formula", "a6-bytes", "    one_layer = 2 *",
         "    from mha.inference import generate as gen\n    return gen.cache_bytes_formula(n_layers, B, "
         "n_kv_heads, slots, d_k, itemsize)\n    one_layer = 2 *", "a6-bytes-tests",
         "mha.inference.generate.cache_bytes_formula"),
    ],
    "A7_ring_attention": [
        ("cheat-merge", "a7-merge", "    lse = torch.logaddexp(lse_a, lse_b)  #",
         "    from mha.attention import torch_attention\n"
         "    return torch_attention.merge_partials(out_a, lse_a, out_b, lse_b)\n"
         "    lse = torch.logaddexp(lse_a, lse_b)  #", "a7-merge-tests", "mha.attention.torch_attention.merge_partials"),
        ("cheat-rank-positions", "a7-positions", "    W = world_size\n",
         "    from mha.parallel.ring import rank_positions\n    return rank_positions(T, world_size, 'zigzag')\n",
         "a7-positions-tests", "mha.parallel.ring.rank_positions"),
        ("cheat-attention-lse", "a7-step", "    if causal:\n        allowed =",
         "    from mha.attention.torch_attention import attention_lse\n"
         "    o, o_lse = attention_lse(q, k, v, k_pos[None, :] <= q_pos[:, None] if causal else None)\n"
         "    return merge_partials(out, lse, o, o_lse)\n    if causal:\n        allowed =",
         "a7-step-tests", "mha.attention.torch_attention.attention_lse"),
        ("cheat-ring-attention", "a7-ring", "    T, W = q.shape[2], world_size\n",
         "    from mha.parallel import ring as parallel\n    return parallel.ring_attention(q, k, v, world_size, layout, causal)[0]\n",
         "a7-ring-tests", "mha.parallel.ring.ring_attention"),
        ("cheat-causal-work", "a7-pairs", "    if layout == \"zigzag\":\n",
         "    from mha.parallel import ring as parallel\n    return parallel.causal_work(T, world_size, layout)\n"
         "    if layout == \"zigzag\":\n", "a7-pairs-tests", "mha.parallel.ring.causal_work"),
        # issue 28: thin wrappers round mha.parallel.ring made by exec (their code lives in <string>)
        ("cheat-exec-positions", "a7-positions", "def zigzag_positions(T, world_size):",
         "from mha.parallel import ring as _par\n\nexec(\"def zigzag_positions(T, world_size):\\n\"\n"
         "     \"    return _par.rank_positions(T, world_size, 'zigzag')\\n\", globals())\n\n\n"
         "def _unused(T, world_size):", "a7-positions-tests", "mha.parallel.ring.rank_positions"),
        ("cheat-exec-pairs", "a7-pairs", "def causal_pairs(T, world_size, layout=\"contiguous\"):",
         "from mha.parallel import ring as _par\n\nexec(\"def causal_pairs(T, world_size, layout='contiguous'):\\n\"\n"
         "     \"    return _par.causal_work(T, world_size, layout)\\n\", globals())\n\n\n"
         "def _unused(T, world_size, layout=\"contiguous\"):", "a7-pairs-tests", "mha.parallel.ring.causal_work"),
    ],
    "A8_flash_attention": [
        ("cheat-update", "a8-update", "    m_new = np.maximum(",
         "    from mha.attention import flash\n    return flash._update((m, ell, acc.copy()), scores.copy(), v_block)\n"
         "    m_new = np.maximum(", "a8-update-tests", "mha.attention.flash._update"),
        ("cheat-flash-attention", "a8-forward", "    B, h, T, d_k = q.shape\n",
         "    from mha.attention import flash\n    return flash.flash_attention(q, k, v, causal=causal, block_q=block_q, "
         "block_k=block_k, offset=offset)\n    B, h, T, d_k = q.shape\n", "a8-forward-tests",
         "mha.attention.flash.flash_attention"),
        ("cheat-flash-backward", "a8-backward", "    T, d_k = q.shape[2], q.shape[3]\n",
         "    from mha.attention import flash\n    return flash.flash_attention_backward(q, k, v, out, lse, dout, "
         "causal=causal, block_q=block_q, block_k=block_k, offset=offset)\n"
         "    T, d_k = q.shape[2], q.shape[3]\n", "a8-backward-tests", "mha.attention.flash.flash_attention_backward"),
        ("cheat-forward-math", "a8-bytes", "    elements = T * d",
         "    from mha.perf import traffic\n    return traffic.forward_math(1, 1, T, S, d, itemsize).bytes\n"
         "    elements = T * d", "a8-bytes-tests", "mha.perf.traffic.forward_math"),
        # issue 28: part 1 made by exec, a thin wrapper round the package's update
        ("cheat-exec-update", "a8-update", "def online_update(m, ell, acc, scores, v_block):",
         "from mha.attention import flash as _fl\n\nexec(\"def online_update(m, ell, acc, scores, v_block):\\n\"\n"
         "     \"    return _fl._update((m, ell, acc.copy()), scores.copy(), v_block)\\n\", globals())\n\n\n"
         "def _unused(m, ell, acc, scores, v_block):", "a8-update-tests", "mha.attention.flash._update"),
    ],
    "A9_serving": [
        ("cheat-gather-pool", "a9-lookup", "    block_size = pool.shape[1]\n",
         "    from mha.inference import paged\n    n, bs = pool.shape[:2]\n"
         "    lib = paged.BlockPool(1, n, bs, 1, int(np.prod(pool.shape[2:])), dtype=pool.dtype)\n"
         "    lib.K[0, :, 0] = pool.reshape(n, bs, -1)\n    lib.add(0)\n    lib.reserve(0, length)\n"
         "    return lib.K[0, list(table), 0].reshape((-1,) + pool.shape[2:])[:length]\n"
         "    block_size = pool.shape[1]\n", "a9-lookup-tests", "mha.inference.paged"),
        # a thin wrapper made by exec round the library's pool: its reserve does the copy-on-write
        ("cheat-exec-append", "a9-append", "def append_token(K, V, refcounts, free, table, length, k, v):",
         "from mha.inference import paged as _pg\n\n"
         "exec(\"def append_token(K, V, refcounts, free, table, length, k, v):\\n\"\n"
         "     \"    pool = _pg.BlockPool(1, K.shape[0], K.shape[1], 1, 1)\\n\"\n"
         "     \"    pool._refcounts, pool._free = refcounts, free\\n\"\n"
         "     \"    pool._tables, pool._written, pool._next = {0: list(table)}, {0: [length]}, {0: [length]}\\n\"\n"
         "     \"    pool.K, pool.V = K[None, :, None], V[None, :, None]\\n\"\n"
         "     \"    pool.reserve(0, 1)\\n\"\n"
         "     \"    t = list(pool.tables[0])\\n\"\n"
         "     \"    K[t[-1], length % K.shape[1]], V[t[-1], length % K.shape[1]] = k, v\\n\"\n"
         "     \"    return t, length + 1\\n\", globals())\n\n\n"
         "def _unused(K, V, refcounts, free, table, length, k, v):", "a9-append-tests",
         "mha.inference.paged._Pool"),
        # a class of the student's whose body borrows the library's copy-on-write
        ("cheat-borrowed-reserve", "a9-append", "def append_token(K, V, refcounts, free, table, length, k, v):\n",
         "from mha.inference import paged as _pg\n\n\nclass _Blocks:\n"
         "    _plan = _pg._Pool._plan\n    _reserve = _pg._Pool._reserve\n\n"
         "    def __init__(self, K, V, refcounts, free, table):\n"
         "        self.K, self.V = K[None, :, None], V[None, :, None]\n"
         "        self.positions = np.zeros(K.shape[:2], np.int64)\n"
         "        self._refcounts, self._free, self._tables = refcounts, free, {0: list(table)}\n"
         "        self.block_size, self.n_blocks = K.shape[1], K.shape[0]\n\n\n"
         "def append_token(K, V, refcounts, free, table, length, k, v):\n"
         "    blocks = _Blocks(K, V, refcounts, free, table)\n"
         "    blocks._reserve([(0, length, 1)])\n    t = blocks._tables[0]\n"
         "    K[t[-1], length % K.shape[1]], V[t[-1], length % K.shape[1]] = k, v\n"
         "    return t, length + 1\n", "a9-append-tests", "mha.inference.paged._Pool._reserve"),
        ("cheat-step-blocks-needed", "a9-step", "    def grow(r):  # a new block",
         "    def grow(r):  # the library counts it\n        from mha.inference import paged\n"
         "        lib = paged.BlockPool(1, blocks(len(r[\"tokens\"])) + 1, block_size, 1, 1)\n"
         "        lib.add(0)\n        lib.reserve(0, len(r[\"tokens\"]) - 1)\n"
         "        return lib.blocks_needed(0, 1)\n\n    def _unused(r):  # a new block",
         "a9-step-tests", "mha.inference.paged"),
        # the library's Request tells when a request is done
        ("cheat-step-request-done", "a9-step", '    finished = [r["rid"] for r in running if len(r["tokens"]) == '
         'r["n_prompt"] + r["n_new"]]',
         '    from mha.inference import serving\n    finished = [r["rid"] for r in running if serving.Request('
         'r["rid"], r["tokens"][:r["n_prompt"]], r["n_new"], out=r["tokens"][r["n_prompt"]:]).done]',
         "a9-step-tests", "mha.inference.serving.Request.done"),
        ("cheat-saved-nbytes", "a9-saved", "    block = 2 * n_layers",
         "    from mha.inference import paged\n    return paged.BlockPool(n_layers, (n_requests - 1) * "
         "(prefix_len // block_size), block_size, n_kv_heads, d_k, dtype={2: np.float16, 4: np.float32, "
         "8: np.float64}.get(itemsize, np.float32)).nbytes // 1\n    block = 2 * n_layers",
         "a9-saved-tests", "mha.inference.paged"),
    ],
}

# Correct work in other styles, and what must not cost points.
KEEPS: dict[str, list[tuple]] = {  # (student, cell, old, new); old, new: a string or a tuple of edits
    "A1_seven_steps": [
        ("numpy-bools", "a1-rows", "return bool(np.all(np.abs(sums - 1.0) <= atol))",
         "return np.all(np.abs(sums - 1.0) <= atol)"),
        ("minus-1e9", "a1-forward", "scores, -np.inf)  # 4) future -> -inf", "scores, -1e9)"),
        ("einsum-style", "a1-scores", "return q @ k.swapaxes(-1, -2) / math.sqrt(d_k)",
         "return np.einsum('bhtd,bhsd->bhts', q, k) / np.sqrt(d_k)"),
    ],
    "A6_generation": [
        ("positions-as-lists", "a6-positions", "    lengths = np.asarray(lengths)[:, None]  # (B, 1)\n",
         "    return [[-1] * (T - int(L)) + list(range(int(L))) for L in lengths]\n"),
        ("positions-from-the-cache", "a6-generate", "logits = model(nxt[:, None], step, caches)",
         "logits = model(nxt[:, None], None, caches)"),  # the cache knows each next position
        ("ring-keys-in-any-order", "a6-ring", "        return K, V, pos",
         "        return K[:, :, ::-1], V[:, :, ::-1], pos[:, ::-1]"),
        ("bytes-as-float", "a6-bytes", "return n_layers * one_layer", "return float(n_layers * one_layer)"),
    ],
    "A7_ring_attention": [
        ("positions-as-lists", "a7-positions", "    n = T // (2 * W)  # positions per chunk\n",
         "    n = T // (2 * W)\n    return [list(range(r * n, (r + 1) * n)) + "
         "list(range((2 * W - 1 - r) * n, (2 * W - r) * n)) for r in range(W)]\n"),
        ("step-minus-1e9", "a7-step", 'scores.masked_fill(~allowed, float("-inf"))',
         "scores.masked_fill(~allowed, -1e9)"),  # a row that sees nothing adds nothing either way
        ("ring-passes-left", "a7-ring", "held[(r - 1) % W]", "held[(r + 1) % W]"),  # same blocks, other way
        ("pairs-as-tensor", "a7-pairs", "return [int((p + 1).sum()) for p in pos]",
         "return torch.stack([(p + 1).sum() for p in pos])"),
        # issue 28: the ring calls part 3 through the student's own alias: judged on its own
        ("ring-calls-an-alias", "a7-ring",
         ("def ring_attention(", "            outs[r], lses[r] = ring_step("),
         ("attend = ring_step\n\n\ndef ring_attention(", "            outs[r], lses[r] = attend(")),
    ],
    "A8_flash_attention": [
        ("update-einsum", "a8-update", "acc = alpha * acc + p @ v_block",
         "acc = alpha * acc + np.einsum('...rk,...kd->...rd', p, v_block)"),
        ("forward-every-tile", "a8-forward", "                break  # this tile",
         "                pass  # this tile"),  # computing the hidden tiles too: slower, same answer
        ("backward-einsum", "a8-backward", "dq[:, :, t0:t1] += ds @ kj",
         "dq[:, :, t0:t1] += np.einsum('bhqk,bhkd->bhqd', ds, kj)"),
        ("bytes-as-float", "a8-bytes", "return itemsize * elements", "return float(itemsize * elements)"),
        # issue 28: the forward calls part 1 through an alias, or through a default argument
        ("forward-calls-an-alias", "a8-forward", ("def flash_forward(", "m, ell, acc = online_update("),
         ("update = online_update\n\n\ndef flash_forward(", "m, ell, acc = update(")),
        ("forward-default-fold", "a8-forward", ("offset=0):", "m, ell, acc = online_update("),
         ("offset=0, fold=online_update):", "m, ell, acc = fold(")),
    ],
    "A9_serving": [
        ("locate-as-array", "a9-lookup", "return table[i // block_size], i % block_size",
         "return np.array([table[i // block_size], i % block_size])"),
        ("gather-row-by-row", "a9-lookup", "    block_size = pool.shape[1]\n",
         "    return np.stack([pool[locate(table, i, pool.shape[1])] for i in range(length)])\n"
         "    block_size = pool.shape[1]\n"),  # built from part 1, a list of rows stacked
        ("append-free-from-the-front", "a9-append", "free.pop()", "free.pop(0)"),  # another block, same reads
        ("append-returns-arrays", "a9-append", "return table, length + 1",
         "return np.array(table, dtype=np.int64), np.int64(length + 1)"),
        ("step-batch-in-another-order", "a9-step",
         ("    running += admitted\n", "for r, token in zip(running, model(batch), strict=True):"),
         ("    running += admitted\n    batch = batch[::-1]  # any order: each token goes back to its request\n",
          "for r, token in zip(running[::-1], model(batch), strict=True):")),
        ("step-tokens-as-arrays", "a9-step", ('r["tokens"] = r["tokens"] + [int(token)]',
                                               "return running, waiting, n_free, finished"),
         ('r["tokens"] = np.append(r["tokens"], token)', "return running, waiting, n_free, set(finished)")),
        ("saved-as-float", "a9-saved", "return (n_requests - 1) * shared * block",
         "return float((n_requests - 1) * shared * block)"),
    ],
}

# A part that does not compile costs only its own points; later parts run on the reference.
BROKEN: dict[str, tuple[str, str, str, str]] = {  # (cell, old, new, the only part lost)
    "A1_seven_steps": ("a1-split", "    B, T, d_model = x.shape\n", "    B, T, d_model = x.shape)\n",
                       "a1-split-tests"),
    "A5_backward_pass": ("a5-softmax", "    return weights * (dweights - wg)",
                         "    return weights * (dweights - wg", "a5-softmax-tests"),
    "A6_generation": ("a6-ring", "        self.seen += t_new\n", "        self.seen += t_new)\n",
                      "a6-ring-tests"),
    "A7_ring_attention": ("a7-merge", "    return share_a * out_a + share_b * out_b, lse",
                          "    return share_a * out_a + share_b * out_b, lse)", "a7-merge-tests"),
    "A8_flash_attention": ("a8-update", "    return m_new, ell, acc", "    return m_new, ell, acc)",
                           "a8-update-tests"),
    "A9_serving": ("a9-append", "    return table, length + 1", "    return table, length + 1)",
                   "a9-append-tests"),
}

LOOP_LIMIT_S = 8  # the cell limit in the copy of a course with a planted loop (the course's: 30)
LOOPS = {  # a solution cell whose function never returns: the part is cut off, the rest graded
    "A1_seven_steps": ("a1-params", "return 4 * d_model",  # sleeps: it never ends, burns no CPU
                       "while True:\n        __import__('time').sleep(0.5)", "a1-params-tests"),
}
TAMPER = {  # break a solution and "fix" its locked test: the test is restored and reported
    "A1_seven_steps": ("a1-mask", "np.tril(", "np.triu(", "a1-mask-tests"),
    "A2_pytorch_port": ("a2-mask", "return ~allowed", "return allowed", "a2-mask-tests"),
    "A3_find_the_bug": ("a3-fix-d", "np.tril(", "np.triu(", "a3-fix-d-tests"),
    "A4_kv_cache": ("a4-mask", "k=S - t_new", "k=0", "a4-mask-tests"),
    "A5_backward_pass": ("a5-softmax", "return weights * (dweights - wg)", "return weights * dweights",
                         "a5-softmax-tests"),
    "A6_generation": ("a6-positions", "return np.where(pos >= 0, pos, -1)",
                      "return np.where(pos >= 0, pos, 0)", "a6-positions-tests"),
    "A7_ring_attention": ("a7-positions", "if T % (2 * W):", "if T % W:", "a7-positions-tests"),
    "A8_flash_attention": ("a8-bytes", "return itemsize * elements", "return elements", "a8-bytes-tests"),
    "A9_serving": ("a9-saved", "(n_requests - 1) * shared", "n_requests * shared", "a9-saved-tests"),
}


def _edit(src: str, p: Planted) -> str:
    if p.student == "forward-w-transposed":
        return re.sub(r"module\.(W[qkvo])", r"module.\1.T", src)
    if p.student == "forward-no-bias":
        return re.sub(r" \+ module\.b[qkvo]", "", src)
    if p.student == "decode-no-bias":
        return re.sub(r", module\.(b[qkvo])\)", r", 0 * module.\1)", src)
    assert p.old in src, f"planted edit {p.student}: {p.old!r} not in cell {p.cell}"
    return src.replace(p.old, p.new)


def _replace(old, new):
    """An edit of a cell's source: `old` -> `new`, or each old -> new in turn when given tuples."""
    def edit(src: str) -> str:
        for o, n in zip(*((old, new) if isinstance(old, tuple) else ((old,), (new,))), strict=True):
            assert o in src, f"{o!r} not in the cell"
            src = src.replace(o, n)
        return src
    return edit


def _in_cell(cell: str, edit):
    """A notebook edit that changes the source of one tracked cell."""
    def apply(nb) -> None:
        c = course.graded_cells(nb)[cell]
        c.source = edit(c.source)
    return apply


def _deleted_test(nb) -> None:
    """A1's mask broken and its test cell deleted (it must be put back and graded)."""
    _in_cell("a1-mask", _replace("np.tril(", "np.triu("))(nb)
    nb.cells = [c for c in nb.cells
                if c.metadata.get("nbgrader", {}).get("grade_id") != "a1-mask-tests"]


def _tampered(name: str):
    gid, old, new, test = TAMPER[name]

    def apply(nb) -> None:
        _in_cell(gid, _replace(old, new))(nb)
        course.graded_cells(nb)[test].source = "print('all good')  # the tests were here"
    return apply


def _mixes(name: str) -> list[list[tuple[str, frozenset[str], object, frozenset[str]]]]:
    """Every planted bug, cheat, other-style answer, broken or deleted cell, endless loop and
    tampered test of `name`, packed into few submissions: (label, cells, edit, parts lost).

    Each part is graded on its own, so edits to different cells that cost different parts
    can share one notebook: the submission must lose exactly the union of their parts (a
    stronger test of independence, and a third of the kernels in CI).
    """
    one = frozenset
    edits = [(p.student, one([p.cell]), _in_cell(p.cell, lambda src, p=p: _edit(src, p)),
              p.loses) for p in PLANTED[name]]
    edits += [(s, one([cell]), _in_cell(cell, _replace(old, new)), one([part]))
              for s, cell, old, new, part, _ in CHEATS.get(name, [])]
    edits += [(s, one([cell]), _in_cell(cell, _replace(old, new)), one())
              for s, cell, old, new in KEEPS.get(name, [])]
    if name in BROKEN:
        cell, old, new, part = BROKEN[name]
        # a module-level alias of the broken part (update = online_update) cannot run without it:
        # those styles go in other notebooks
        near = {c for _, c, o, _ in KEEPS.get(name, []) if isinstance(o, tuple)}
        edits.append(("syntax-error", one([cell, *near]), _in_cell(cell, _replace(old, new)), one([part])))
    if name == "A1_seven_steps":
        edits.append(("deleted-test", one(["a1-mask", "a1-mask-tests"]), _deleted_test,
                      one(["a1-mask-tests"])))
    if name in LOOPS:
        gid, old, new, test = LOOPS[name]
        edits.append(("loops", one([gid]), _in_cell(gid, _replace(old, new + "\n    " + old)),
                      one([test])))
    if name in TAMPER:
        gid, _, _, test = TAMPER[name]
        edits.append(("tampered", one([gid, test]), _tampered(name), one([test])))
    groups: list[list] = []
    for e in edits:
        home = next((g for g in groups if all(not e[1] & o[1] and not e[3] & o[3] for o in g)),
                    None)
        if home is None:
            groups.append([e])
        else:
            home.append(e)
    return groups


def _course(*args: str, root: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(root / "course.py"), *args], cwd=root,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"course.py {args} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def failing_test_cells(nb) -> list[str]:
    """Graded test cells of an autograded notebook that failed, or that printed a value.

    A test cell whose last line is an expression leaves an execute_result, which nbgrader reads
    as a partial-credit score ("cannot be converted to a float" when it is not a number).
    """
    problems = []
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type != "code" or not meta.get("grade") or meta.get("solution"):
            continue
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                problems.append(f"{meta['grade_id']}: {out['ename']}: {out['evalue']}")
            elif out.get("output_type") == "execute_result":
                problems.append(f"{meta['grade_id']}: prints a value nbgrader takes as a score: "
                                f"{out['data'].get('text/plain', '')!r}")
    return problems


def test_the_test_cell_check_catches_a_failure_and_a_printed_value():
    def cell(*outputs):
        return nbformat.v4.new_code_cell("assert f()", outputs=list(outputs), metadata={
            "nbgrader": {"grade": True, "solution": False, "grade_id": "p-tests", "points": 1}})
    error = nbformat.v4.new_output("error", ename="AssertionError", evalue="wrong", traceback=[])
    value = nbformat.v4.new_output("execute_result", data={"text/plain": "'ok'"}, execution_count=1)
    shown = nbformat.v4.new_output("stream", name="stdout", text="ok\n")
    assert failing_test_cells(nbformat.v4.new_notebook(cells=[cell(shown)])) == []
    assert failing_test_cells(nbformat.v4.new_notebook(cells=[cell(error)])) == [
        "p-tests: AssertionError: wrong"]
    assert "takes as a score: \"'ok'\"" in failing_test_cells(nbformat.v4.new_notebook(
        cells=[cell(value)]))[0]


class Graded:
    """Everything about one graded run of one assignment, made once per class."""

    def __init__(self, name: str, root: Path):
        self.name, self.root = name, root
        self.source = nbformat.read(root / "source" / name / f"{name}.ipynb", as_version=4)
        _course("release", name, root=root)
        self.release = nbformat.read(root / "release" / name / f"{name}.ipynb", as_version=4)
        full = course.model_submission(name, root)
        course.submit(name, "untouched", self.release, root=root)
        course.submit(name, "full", full, root=root)
        self.student_of: dict[str, str] = {}  # planted, cheat or keep -> the submission holding it
        self.expected: dict[str, set[str]] = {}  # submission -> the parts it must lose
        for i, group in enumerate(_mixes(name), 1):
            student = f"mix{i}"
            nb = nbformat.from_dict(full)
            for label, _, edit, _ in group:
                edit(nb)
                self.student_of[label] = student
            self.expected[student] = set().union(*(loses for *_, loses in group))
            course.submit(name, student, nb, root=root)
        self.proc = _course("grade", name, root=root)
        self.scores: dict[str, dict[str, tuple[float, float, bool]]] = {}
        with open(root / "reports" / "grades_by_part.csv") as f:
            for row in csv.DictReader(f):
                self.scores.setdefault(row["student"], {})[row["part"]] = (
                    float(row["score"]), float(row["max_score"]),
                    row["needs_manual_grade"] == "True")
        self.summary = (root / "reports" / "summary.md").read_text()

    def auto_parts(self) -> dict[str, float]:
        """Autograded parts -> max points, from the full submission's row."""
        return {p: m for p, (_, m, manual) in self.scores["full"].items() if not manual}

    def lost(self, student: str) -> set[str]:
        """Autograded parts where `student` scored less than the full submission."""
        full = self.scores["full"]
        return {p for p, (s, _, manual) in self.scores[student].items()
                if not manual and s < full[p][0]}

    def feedback_html(self, student: str) -> str:
        """The feedback page the student reads."""
        return (self.root / "feedback" / student / self.name / f"{self.name}.html").read_text()

    def feedback(self, student: str) -> str:
        """The error lines the student's feedback shows ("Name: message"), one per line.

        Read from the autograded notebook the feedback HTML is rendered from: the HTML also
        holds the tests' source, which may mention any bug's name.
        """
        html = list((self.root / "feedback" / student / self.name).glob("*.html"))
        assert html, f"no feedback HTML for {student}"
        lines = []
        for path in (self.root / "autograded" / student / self.name).glob("*.ipynb"):
            for cell in nbformat.read(path, as_version=4).cells:
                lines += [f"{o['ename']}: {o['evalue']}" for o in cell.get("outputs", [])
                          if o.get("output_type") == "error"]
        return "\n".join(lines)


class AssignmentContract:
    """One contract, one subclass per assignment (xdist runs the classes in parallel)."""

    name = ""

    @pytest.fixture(scope="class")
    @classmethod
    def graded(cls, tmp_path_factory) -> Graded:
        root = course.private_copy(tmp_path_factory.mktemp(cls.name), [cls.name])
        if cls.name in LOOPS:  # the planted endless loop waits out the limit: keep it short
            config = root / "nbgrader_config.py"
            text = config.read_text()
            assert "c.Execute.timeout = 30" in text, "the course's cell limit moved"
            config.write_text(text.replace("c.Execute.timeout = 30",
                                           f"c.Execute.timeout = {LOOP_LIMIT_S}"))
        return Graded(cls.name, root)

    def test_the_model_solution_passes_every_test_and_prints_no_score(self, graded):
        # What `nbgrader validate` of the source would say, read off the graded model solution
        # (the source's answers in the release, hidden tests put back) instead of one more kernel.
        nb = nbformat.read(graded.root / "autograded" / "full" / self.name / f"{self.name}.ipynb",
                           as_version=4)
        assert not failing_test_cells(nb), failing_test_cells(nb)

    def test_release_hides_solutions_and_hidden_tests(self, graded):
        text = nbformat.writes(graded.release)
        for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "nbgrader import"):
            assert marker not in text, f"the release still contains {marker!r}"
        assert "raise NotImplementedError()" in text and "YOUR ANSWER HERE" in text

    def test_untouched_release_scores_zero_without_grader_errors(self, graded):
        parts = graded.scores["untouched"]
        assert set(parts) == set(graded.scores["full"]), "every part must be graded"
        assert all(score == 0 for score, _, _ in parts.values()), parts
        assert "| untouched |" in graded.summary

    def test_full_submission_gets_every_autograded_point(self, graded):
        for part, (score, max_score, manual) in graded.scores["full"].items():
            if manual:
                assert score == 0, f"{part} is a written answer: graded by hand, not by the grader"
            else:
                assert score == max_score, f"the model solution lost points in {part}"
        assert any(manual for *_, manual in graded.scores["full"].values()), \
            "each assignment has written answers for the teacher"

    def test_each_planted_bug_loses_exactly_its_part_and_feedback_names_it(self, graded):
        assert PLANTED[self.name], "each assignment needs planted-bug submissions"
        for p in PLANTED[self.name]:
            s = graded.student_of[p.student]
            assert graded.lost(s) == graded.expected[s], \
                f"{s} ({p.student}, ...): lost {sorted(graded.lost(s))}, " \
                f"expected {sorted(graded.expected[s])}"
            assert p.feedback in graded.feedback(s), \
                f"{p.student} (in {s}): feedback does not mention {p.feedback!r}"
            page = graded.feedback_html(s)  # what the student reads: no grader jargon, printed or raised
            assert "matches planted" not in page, \
                f"{p.student} (in {s}): grader jargon in the feedback page: " \
                f"{page[max(0, page.find('matches planted') - 200):page.find('matches planted') + 80]!r}"

    def test_an_edited_locked_cell_is_restored_and_reported(self, graded):
        if self.name not in TAMPER:
            pytest.fail(f"no tampering case for {self.name}")
        gid, _, _, test = TAMPER[self.name]
        s = graded.student_of["tampered"]
        assert test in graded.lost(s), "the restored test must still catch the bug"
        assert graded.lost(s) == graded.expected[s], (graded.lost(s), graded.expected[s])
        row = next(line for line in graded.summary.splitlines() if line.startswith(f"| {s} |"))
        assert test in row.split("|")[-2], f"summary must list the edited cell {test}: {row}"
        assert all(line.split("|")[-2].strip() == "-" for line in graded.summary.splitlines()
                   if line.startswith("| full |")), "an honest submission is never reported"

    def test_reaching_for_the_reference_earns_nothing_and_is_flagged(self, graded):
        assert CHEATS[self.name], "each assignment needs cheating-style submissions"
        flagged = graded.summary.split("reached the package's reference")[-1]
        for label, _, _, _, part, ref in CHEATS[self.name]:
            student = graded.student_of[label]
            assert graded.scores[student][part][0] == 0, f"{label}: {part} must score 0"
            lost = graded.lost(student)
            assert lost == graded.expected[student], \
                f"{label} (in {student}): lost {sorted(lost)}, expected {sorted(graded.expected[student])}"
            line = " ".join(ln for ln in flagged.splitlines()
                            if f"**{student}**" in ln and f"`{part}`" in ln)
            assert ref in line, f"summary must flag {label}, {part} and {ref}; it says {line!r}"
        honest = [ln for ln in flagged.splitlines() if "**full**" in ln]
        assert not honest, f"an honest submission is flagged: {honest}"

    def test_correct_work_in_other_styles_keeps_every_point(self, graded):
        flagged = graded.summary.split("reached the package's reference")[-1]
        for label, cell, *_ in KEEPS.get(self.name, []):
            student = graded.student_of[label]
            assert graded.lost(student) == graded.expected[student], \
                f"{label} (in {student}) lost {sorted(graded.lost(student) - graded.expected[student])}"
            part = f"{cell}-tests"  # and no false message: not flagged, not told it never called a part
            line = [ln for ln in flagged.splitlines() if f"**{student}**" in ln and f"`{part}`" in ln]
            assert not line, f"{label} (in {student}) is flagged: {line}"
            assert "never called" not in graded.feedback(student), \
                f"{label} (in {student}): {graded.feedback(student)}"

    def test_points_in_the_intro_match_the_grader(self, graded):
        intro = graded.source.cells[0].source
        stated = sum(int(n) for line in intro.splitlines()
                     if line.startswith("|") and re.search(r"\| *[\d +]+ *\|$", line)
                     for n in re.findall(r"\d+", line.rsplit("|", 2)[1]))
        actual = sum(m for _, m, _ in graded.scores["full"].values())
        assert stated == actual, f"the intro table states {stated} points, the grader has {actual}"

    def test_test_cells_do_not_end_in_an_expression(self, graded):
        for gid, cell in course.graded_cells(graded.source).items():
            meta = cell.metadata["nbgrader"]
            if cell.cell_type == "code" and meta.get("grade") and not meta.get("solution"):
                last = ast.parse(cell.source).body[-1]
                func = last.value.func if isinstance(last, ast.Expr) and \
                    isinstance(last.value, ast.Call) else None
                callee = getattr(func, "attr", getattr(func, "id", ""))
                returns_none = callee == "print" or callee.startswith("assert")
                assert returns_none or not isinstance(last, ast.Expr), \
                    f"{gid} ends in an expression: nbgrader would read its value as partial credit"


class CombinedPart:
    """For assignments with a part built from earlier parts (A1's forward, A5's backward)."""

    name = ""

    def test_a_part_that_does_not_compile_costs_only_its_points(self, graded):
        *_, part = BROKEN[self.name]
        s = graded.student_of["syntax-error"]
        assert part in graded.lost(s) and graded.lost(s) == graded.expected[s], graded.lost(s)
        assert "in its place" in graded.feedback_html(s), \
            "the feedback must say that the later part ran with the reference"


class TestA1(CombinedPart, AssignmentContract):
    name = "A1_seven_steps"

    def test_the_first_screen_of_feedback_for_three_mistakes(self, graded):
        """Screenshots (.ci-reports/feedback/) of what three students see first; the
        diagnosis is in the summary table at the top, whole."""
        import feedback

        if not Path(feedback.CHROMIUM).exists():
            pytest.skip("needs Debian chromium (CI installs it)")
        out = ROOT / ".ci-reports" / "feedback"
        out.mkdir(parents=True, exist_ok=True)
        for label, words in [("softmax-no-max", "exp overflowed"),
                             ("forward-mask-after-softmax", "rows sum to"),
                             ("loops", f"ran past {LOOP_LIMIT_S} s")]:
            student = graded.student_of.get(label, label)
            page = graded.feedback_html(student)
            top = page.split("<table", 1)[1].split("</table>", 1)[0]
            assert words in top, f"{student}: the summary table does not say {words!r}"
            png = out / f"A1-{label}.png"
            feedback.screenshot(graded.root / "feedback" / student / graded.name /
                                f"{graded.name}.html", png)
            assert png.stat().st_size > 10_000, f"{png} is empty"

    def test_a_deleted_test_cell_is_restored_graded_and_reported(self, graded):
        s = graded.student_of["deleted-test"]
        assert "a1-mask-tests" in graded.lost(s) and graded.lost(s) == graded.expected[s]
        assert graded.scores[s]["a1-mask-tests"][1] == 2, "still worth its points"
        row = next(ln for ln in graded.summary.splitlines() if ln.startswith(f"| {s} |"))
        assert "a1-mask-tests" in row.split("|")[-2], row
        assert "was deleted; it was restored" in graded.feedback_html(s)

    def test_a_part_that_loops_forever_is_cut_off_and_the_rest_graded(self, graded):
        *_, test = LOOPS[self.name]
        s = graded.student_of["loops"]
        assert test in graded.lost(s) and graded.lost(s) == graded.expected[s]
        assert "CellTimeoutError" in graded.feedback(s) or "KeyboardInterrupt" in graded.feedback(s)
        assert f"ran past {LOOP_LIMIT_S} s" in graded.feedback_html(s), \
            "say it in words, not KeyboardInterrupt"


class TestA2(AssignmentContract):
    name = "A2_pytorch_port"


class TestA3(AssignmentContract):
    name = "A3_find_the_bug"


class TestA4(AssignmentContract):
    name = "A4_kv_cache"


class TestA5(CombinedPart, AssignmentContract):
    name = "A5_backward_pass"


class TestA6(AssignmentContract):
    name = "A6_generation"

    def test_a_part_that_does_not_compile_costs_only_its_points(self, graded):
        """No part of A6 is built from another: a broken cell costs its own part, nothing else."""
        *_, part = BROKEN[self.name]
        s = graded.student_of["syntax-error"]
        assert part in graded.lost(s) and graded.lost(s) == graded.expected[s], graded.lost(s)


class TestA7(CombinedPart, AssignmentContract):
    """Ring step, ring and pairs are built from earlier parts: they run with the references."""

    name = "A7_ring_attention"

    def test_a_wrong_earlier_part_costs_nothing_later(self):
        """The mixed submissions lose the union of their parts; this shows the later parts alone.

        Cell by cell in one namespace, as a kernel runs it: a merge that averages and a zigzag that
        pairs chunk r with W-1-r fail their own tests, and the hidden tests of the ring step, the
        ring and the pairs, which run with the reference merge and zigzag, still pass.
        """
        nb = nbformat.read(COURSE / "source" / self.name / f"{self.name}.ipynb", as_version=4)
        wrong = {p.cell: p for p in PLANTED[self.name] if p.student in ("merge-average", "positions-w-1-r")}
        ns: dict = {}
        for cell in nb.cells:
            gid = cell.metadata.get("nbgrader", {}).get("grade_id")
            if cell.cell_type != "code" or gid is None:
                continue
            src = _edit(cell.source, wrong[gid]) if gid in wrong else cell.source
            run = compile(src, f"<ipython-input-{gid}>", "exec")
            if gid in ("a7-merge-tests", "a7-positions-tests"):
                with pytest.raises(AssertionError, match="planted mistake"):
                    exec(run, ns)
            else:
                exec(run, ns)  # parts 3-5 and their hidden tests: no error


class TestA8(CombinedPart, AssignmentContract):
    """The tiled forward is built from the online update: it runs with the reference one."""

    name = "A8_flash_attention"

    def test_a_wrong_earlier_part_costs_nothing_later(self):
        """Cell by cell in one namespace, as a kernel runs it: an update that never rescales fails its
        own test, and the forward's hidden tests, run with the reference update, still pass."""
        nb = nbformat.read(COURSE / "source" / self.name / f"{self.name}.ipynb", as_version=4)
        wrong = {p.cell: p for p in PLANTED[self.name] if p.student == "update-no-rescale"}
        ns: dict = {}
        for cell in nb.cells:
            gid = cell.metadata.get("nbgrader", {}).get("grade_id")
            if cell.cell_type != "code" or gid is None:
                continue
            src = _edit(cell.source, wrong[gid]) if gid in wrong else cell.source
            run = compile(src, f"<ipython-input-{gid}>", "exec")
            if gid == "a8-update-tests":
                with pytest.raises(AssertionError, match="planted mistake"):
                    exec(run, ns)
            else:
                exec(run, ns)  # the forward, backward, bytes and their hidden tests: no error


class TestA9(AssignmentContract):
    """No part of A9 is built from another: each is graded on its own state, passed in."""

    name = "A9_serving"

    def test_a_part_that_does_not_compile_costs_only_its_points(self, graded):
        """A broken append costs its own part; the scheduler and the bytes still score."""
        *_, part = BROKEN[self.name]
        s = graded.student_of["syntax-error"]
        assert part in graded.lost(s) and graded.lost(s) == graded.expected[s], graded.lost(s)


def test_every_assignment_has_a_contract():
    names = sorted(p.name for p in (COURSE / "source").iterdir() if p.is_dir())
    covered = sorted(c.name for c in AssignmentContract.__subclasses__())
    assert names == covered, f"add a TestXX(AssignmentContract) class for {set(names) - set(covered)}"
