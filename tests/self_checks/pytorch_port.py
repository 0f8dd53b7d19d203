"""Contract cases for mha_course.tryit.pytorch_port (09_pytorch_port.ipynb).

The right answers are written here in plain torch from the numpy module's weights (the forward)
and with tests/reference.py's loops (the padded output), not with the code the checks compare to.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from mha.modules import numpy_mha
from mha.modules.torch_mha import MultiHeadAttention
from mha_course import diagnose
from mha_course.tryit import pytorch_port as tryit
from tests.reference import attention_loops
from tests.self_checks import Case

D_MODEL, N_HEADS = 16, 2
NP_MHA = diagnose.module_with_biases(D_MODEL, N_HEADS, seed=5)  # nonzero biases: they matter


def forward(split="view-transpose", merge="transpose-reshape", causal=True, scale=None,
            out_proj=True, mask=None, ret="out", drop=()):
    """A student's my_forward(x_np), written in plain torch from NP_MHA's weights, with one slip."""
    W = {n: torch.from_numpy(getattr(NP_MHA, n)) for n in
         ("Wq", "bq", "Wk", "bk", "Wv", "bv", "Wo", "bo")}  # numpy layout: W (in, out)

    def my_forward(x_np):
        x = torch.from_numpy(x_np)  # (B, T, d_model)
        B, T, d = x.shape
        h, d_k = N_HEADS, d // N_HEADS

        def heads(a):  # (B, T, d_model) -> (B, h, T, d_k)
            if split == "view-transpose":
                return a.view(B, T, h, d_k).transpose(1, 2)
            return a.view(B, h, T, d_k)  # no transpose: tokens and heads mixed

        q, k, v = (heads(x @ W[f"W{n}"] + (0 if f"b{n}" in drop else W[f"b{n}"]))
                   for n in "qkv")  # (B, h, T, d_k)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                           scale=scale)  # (B, h, T, d_k)
        if ret == "heads":
            return y
        merged = {"transpose-reshape": lambda: y.transpose(1, 2).reshape(B, T, d),
                  "transpose-contiguous-view": lambda: y.transpose(1, 2).contiguous().view(B, T, d),
                  "transpose-view": lambda: y.transpose(1, 2).view(B, T, d),  # the trap
                  "reshape": lambda: y.reshape(B, T, d),     # no transpose back
                  "view": lambda: y.view(B, T, d)}[merge]()  # (B, T, d_model)
        out = merged @ W["Wo"] + (0 if "bo" in drop else W["bo"]) if out_proj else merged
        return (out, None) if ret == "tuple" else out

    return my_forward


def _uses_globals(x_np):
    """A forward that takes B, T from the notebook (2, 6) instead of from x."""
    return torch.from_numpy(x_np).view(2, 6, N_HEADS, D_MODEL // N_HEADS)


def _numpy_input(x_np):
    """A forward that hands the numpy array to a torch layer."""
    return torch.nn.Linear(D_MODEL, D_MODEL, dtype=torch.float64)(x_np)


ANTI = ~torch.ones(5, 5, dtype=torch.bool).tril()  # nn.MultiheadAttention's causal mask (T = 5)
PT_TWIN = MultiHeadAttention(D_MODEL, N_HEADS, seed=5, dtype=torch.float64)
PT_TWIN.load_numpy_(NP_MHA)  # the torch module of the lesson: NP_MHA's weights, transposed


def with_layers(x_np):
    """The lesson's answer: PT_TWIN's four nn.Linear layers and SDPA."""
    x = torch.from_numpy(x_np)  # (B, T, d_model)
    B, T, _ = x.shape
    h, d_k = PT_TWIN.n_heads, PT_TWIN.d_k
    q, k, v = (lin(x).view(B, T, h, d_k).transpose(1, 2)
               for lin in (PT_TWIN.q_proj, PT_TWIN.k_proj, PT_TWIN.v_proj))  # (B, h, T, d_k)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, h, T, d_k)
    return PT_TWIN.out_proj(y.transpose(1, 2).reshape(B, T, h * d_k)).detach().numpy()


def calls_pt_mha(x_np):
    """The forbidden shortcut: the torch module's own forward."""
    return PT_TWIN(torch.from_numpy(x_np), causal=True)


def calls_np_mha(x_np):
    """The forbidden shortcut: the numpy reference itself."""
    return NP_MHA(x_np, causal=True)


def k_from_q_proj(x_np):
    """An unlisted slip: k made with q_proj (a copy-paste line)."""
    x = torch.from_numpy(x_np)  # (B, T, d_model)
    B, T, _ = x.shape
    h, d_k = PT_TWIN.n_heads, PT_TWIN.d_k
    q, k, v = (lin(x).view(B, T, h, d_k).transpose(1, 2)
               for lin in (PT_TWIN.q_proj, PT_TWIN.q_proj, PT_TWIN.v_proj))  # (B, h, T, d_k)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, h, T, d_k)
    return PT_TWIN.out_proj(y.transpose(1, 2).reshape(B, T, h * d_k))  # (B, T, d_model)


def with_dropout(x_np):
    """An unlisted slip: SDPA's dropout left on."""
    x = torch.from_numpy(x_np)  # (B, T, d_model)
    B, T, _ = x.shape
    h, d_k = PT_TWIN.n_heads, PT_TWIN.d_k
    q, k, v = (lin(x).view(B, T, h, d_k).transpose(1, 2)
               for lin in (PT_TWIN.q_proj, PT_TWIN.k_proj, PT_TWIN.v_proj))  # (B, h, T, d_k)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.1)  # (B, h, T, d_k)
    return PT_TWIN.out_proj(y.transpose(1, 2).reshape(B, T, h * d_k))  # (B, T, d_model)


def with_residual(x_np):
    """An unlisted slip: the residual connection added inside the attention module."""
    return torch.from_numpy(x_np) + forward()(x_np)


def float_mask(x_np):
    """An unlisted slip: the causal mask handed to SDPA as a float 0/1 tensor."""
    T = x_np.shape[1]
    return forward(causal=False, mask=torch.ones(T, T, dtype=torch.float64).tril())(x_np)


def doubled(x_np):
    """An unlisted slip: the output twice over (out_proj applied to merged + merged)."""
    return 2 * forward()(x_np)

# ---- the padding mask: B = 2, T = 6, item 0 has 3 real tokens ---------------------------------
B, T, REAL = 2, 6, 3
PT_MHA = MultiHeadAttention(D_MODEL, N_HEADS, seed=3, dtype=torch.float64)
X = torch.from_numpy(np.random.default_rng(7).normal(size=(B, T, D_MODEL)))  # (B, T, d_model)


def pad_of(rule) -> np.ndarray:
    """pad[b, t, s] = rule(b, t, s), built with loops (True = may attend)."""
    return np.array([[[rule(b, t, s) for s in range(T)] for t in range(T)] for b in range(B)])


RIGHT_PAD = pad_of(lambda b, t, s: b == 1 or s < REAL)


def padded_output(pad: np.ndarray, causal: bool = True) -> torch.Tensor:
    """The module's output under `pad` (and causal), from tests/reference.py's loops."""
    allowed = pad[:, None] & (np.tril(np.ones((T, T), dtype=bool)) if causal else True)  # (B, 1, T, S)
    twin = numpy_mha.MultiHeadAttention(D_MODEL, N_HEADS, seed=3)  # the same draws as PT_MHA
    out, _ = attention_loops(twin, X.numpy(), allowed=np.broadcast_to(allowed, (B, N_HEADS, T, T)))
    return torch.from_numpy(out)  # (B, T, d_model)


def with_pad(pad) -> tuple:
    """check_padding's arguments for a pad, out_padded computed with it when the module takes it."""
    try:
        with torch.no_grad():
            out = PT_MHA(X, causal=True, mask=torch.as_tensor(pad))
    except (TypeError, ValueError):
        out = None  # the student's cell raised: out_padded stays None
    return (pad, out, PT_MHA, X)


CASES = [
    Case(tryit.check_forward,
         right=lambda: (forward(), NP_MHA),
         untried=lambda: (None, NP_MHA),
         right_forms=[lambda: (with_layers, NP_MHA),  # returns numpy, built from the layers
                      lambda: (forward(merge="transpose-contiguous-view"), NP_MHA)],
         wrong={"splits without the transpose": lambda: (forward(split="view"), NP_MHA),
                "merges without the transpose": lambda: (forward(merge="reshape"), NP_MHA),
                # the trap the CPU flash kernel hid: caught by running SDPA's math kernel
                "cannot merge axes": lambda: (forward(merge="transpose-view"), NP_MHA),
                "is_causal=True": lambda: (forward(causal=False), NP_MHA),
                "not scaled": lambda: (forward(scale=1.0), NP_MHA),
                "scaled twice": lambda: (forward(scale=1 / (D_MODEL // N_HEADS)), NP_MHA),
                "without the output projection": lambda: (forward(out_proj=False), NP_MHA),
                "nn.MultiheadAttention's convention": lambda: (forward(causal=False, mask=ANTI),
                                                               NP_MHA),
                "the heads before step 7": lambda: (forward(ret="heads"), NP_MHA),
                "returned a tuple": lambda: (forward(ret="tuple"), NP_MHA),
                "from x.shape": lambda: (_uses_globals, NP_MHA),
                "torch.from_numpy": lambda: (_numpy_input, NP_MHA),
                "forget the `return`": lambda: (lambda x_np: None, NP_MHA),
                # the forbidden shortcuts, refused by the grading guard
                "mha.modules.torch_mha.MultiHeadAttention": lambda: (calls_pt_mha, NP_MHA),
                "mha.modules.numpy_mha.MultiHeadAttention": lambda: (calls_np_mha, NP_MHA),
                "my_forward is the package's own": lambda: (PT_TWIN, NP_MHA),
                # not in the old table
                "sqrt(d_model) instead of sqrt(d_k)": lambda: (forward(scale=1 / D_MODEL ** 0.5),
                                                               NP_MHA),
                "drops the output projection's bias": lambda: (forward(drop=("bo",)), NP_MHA),
                "drops the bias of q_proj": lambda: (forward(drop=("bq",)), NP_MHA),
                "exactly 2 times the right one": lambda: (doubled, NP_MHA),
                "makes k with q_proj": lambda: (k_from_q_proj, NP_MHA),
                "dropout_p > 0": lambda: (with_dropout, NP_MHA),
                "a residual connection": lambda: (with_residual, NP_MHA),
                "a float 0/1 tensor": lambda: (float_mask, NP_MHA),
                "returned a list": lambda: (lambda x_np: [forward()(x_np)], NP_MHA)},
         garbage=[lambda: ("my_forward", NP_MHA), lambda: (np.zeros((2, 5, D_MODEL)), NP_MHA),
                  lambda: (lambda x_np: "out", NP_MHA),
                  lambda: (lambda x_np: [[1.0, 2.0], [3.0]], NP_MHA)]),
    Case(tryit.check_padding,
         right=lambda: (RIGHT_PAD, padded_output(RIGHT_PAD), PT_MHA, X),
         untried=lambda: (None, None, PT_MHA, X),
         right_forms=[lambda: with_pad(torch.from_numpy(RIGHT_PAD)),
                      lambda: with_pad(RIGHT_PAD[:, None]),  # (B, 1, T, S): broadcast over heads
                      # the causal part may be written in too: the module adds it anyway
                      lambda: with_pad(RIGHT_PAD & np.tril(np.ones((T, T), dtype=bool)))],
         wrong={"nn.MultiheadAttention's convention": lambda: with_pad(~RIGHT_PAD),
                "(B, T)": lambda: with_pad(np.array([[s < REAL for s in range(T)], [s > 0 for s in range(T)]])),
                "True on the padding, torch's key_padding_mask":
                    lambda: with_pad(np.array([[s >= REAL for s in range(T)], [False] * T])),
                "whole batch": lambda: with_pad(np.tril(np.ones((T, T), dtype=bool))),
                "rows of queries": lambda: with_pad(pad_of(lambda b, t, s: b == 1 or t < REAL)),
                "also the rows": lambda: with_pad(pad_of(lambda b, t, s: b == 1 or max(s, t) < REAL)),
                "one too many": lambda: with_pad(pad_of(lambda b, t, s: b == 1 or s < REAL + 1)),
                "one too few": lambda: with_pad(pad_of(lambda b, t, s: b == 1 or s < REAL - 1)),
                "item 1 as well": lambda: with_pad(pad_of(lambda b, t, s: s < REAL)),
                "instead of item 0": lambda: with_pad(pad_of(lambda b, t, s: b == 0 or s < REAL)),
                "nothing is masked": lambda: with_pad(pad_of(lambda b, t, s: True)),
                "float mask": lambda: with_pad(RIGHT_PAD.astype(np.float32)),
                "without causal=True": lambda: (RIGHT_PAD, padded_output(RIGHT_PAD, causal=False),
                                                PT_MHA, X),
                "without the mask": lambda: (RIGHT_PAD, padded_output(np.ones((B, T, T), bool)),
                                             PT_MHA, X),
                "still None": lambda: (RIGHT_PAD, None, PT_MHA, X),
                "allows 4 entries that should be blocked": lambda: with_pad(
                    pad_of(lambda b, t, s: not (b == 0 and s == 4))),
                "out_padded is not the module's output": lambda: (
                    RIGHT_PAD, padded_output(RIGHT_PAD) + 1e-3, PT_MHA, X),
                # the findings: masks in other conventions are read as such
                "an additive float mask": lambda: with_pad(np.where(RIGHT_PAD, 0.0, -np.inf)),
                "0 and -inf swapped": lambda: with_pad(np.where(RIGHT_PAD, -np.inf, 0.0)),
                "integer 0/1 numbers": lambda: with_pad(RIGHT_PAD.astype(np.int64)),
                "(not ~pad, which on integers": lambda: with_pad((~RIGHT_PAD).astype(np.int64)),
                # both parts judged: a wrong pad with out_padded computed from it
                "right once pad is": lambda: with_pad(pad_of(
                    lambda b, t, s: (b == 1 and s != 0) or (b == 0 and s < REAL))),
                "0 of 2 parts right": lambda: (pad_of(lambda b, t, s: s < REAL),
                                               padded_output(RIGHT_PAD) * 2, PT_MHA, X),
                # not in the old table
                "blocks every key of item 1": lambda: with_pad(pad_of(lambda b, t, s: b == 0 and s < REAL)),
                "with the mask inverted": lambda: (RIGHT_PAD, padded_output(~RIGHT_PAD), PT_MHA, X),
                "left padding": lambda: with_pad(pad_of(lambda b, t, s: b == 1 or s >= T - REAL)),
                "your flags mark the right tokens": lambda: with_pad(
                    np.array([[s < REAL for s in range(T)], [True] * T])),
                "0 on item 0's padding queries": lambda: (
                    RIGHT_PAD, padded_output(RIGHT_PAD) * torch.tensor(
                        [[1.0] * REAL + [0.0] * (T - REAL), [1.0] * T])[:, :, None], PT_MHA, X),
                "every entry of out_padded is": lambda: (RIGHT_PAD, padded_output(RIGHT_PAD) * 2,
                                                          PT_MHA, X)},
         garbage=[lambda: ("pad", None, PT_MHA, X), lambda: ([[True, False], [True]], None, PT_MHA, X),
                  lambda: (np.full((B, T, T), 0.5), None, PT_MHA, X),
                  lambda: (RIGHT_PAD, "out", PT_MHA, X),
                  lambda: (RIGHT_PAD, torch.zeros(B, T), PT_MHA, X)]),
]
