"""Self-checks for the two Try-its of 09_pytorch_port.ipynb: the forward pass in torch, a padding mask.

    print(tryit.check_forward(my_forward, np_mha))            # judged by diagnose.forward
    print(tryit.check_padding(pad, out_padded, pt_mha, x))    # pad (B, T, T), True = may attend

Shape legend: B batch, T query length, S key length, h heads, d_k = d_model // h.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from .. import diagnose
from . import as_array, not_tried, not_yet, right


def _numpy(a: Any) -> Any:
    """A torch tensor as a numpy array (detached, on the CPU); anything else unchanged."""
    if hasattr(a, "detach") and hasattr(a, "cpu"):
        t = a.detach().cpu()
        return (t.float() if t.is_floating_point() and t.element_size() < 4 else t).numpy()
    return a


def _same(out: np.ndarray, want: np.ndarray) -> bool:
    """Equal within float64 rounding (float32 rounding if either is float32), NaN where NaN."""
    tight = out.dtype == np.float64 and want.dtype == np.float64
    with np.errstate(invalid="ignore"):
        return out.shape == want.shape and bool(np.allclose(
            out, want, equal_nan=True, rtol=1e-6 if tight else 1e-4, atol=1e-9 if tight else 1e-5))


# ---- the forward pass ------------------------------------------------------------------------
_PLANTED_IN_TORCH = {  # diagnose names the numpy step; this says it in torch, first
    "split_no_transpose": "step 2 splits without the transpose: in torch it is "
                          "q_proj(x).view(B, T, h, d_k).transpose(1, 2), not .view(B, h, T, d_k)",
    "merge_no_transpose": "step 7 merges without the transpose: the heads (B, h, T, d_k) go back "
                          "to (B, T, h, d_k) with .transpose(1, 2) before .reshape(B, T, d_model)",
    "unscaled_scores": "the scores are not scaled: SDPA divides by sqrt(d_k) by itself, so "
                       "scale=1.0 (or multiplying q by sqrt(d_k)) undoes it; leave scale out",
    "scores_over_d_k": "the scores are scaled twice, by d_k instead of sqrt(d_k): SDPA already "
                       "divides by sqrt(d_k), so dividing q by sqrt(d_k) (or scale=1/d_k) doubles it",
    "weights_transposed": "a projection uses W.T: x @ q_proj.weight is not the layer, because "
                          "nn.Linear stores weight as (out, in); call pt_mha.q_proj(x)",
    "anti_causal_mask": "the causal mask is the wrong triangle: with is_causal=True SDPA builds the "
                        "right one for you",
}


def _errors(e: Exception, shape: tuple[int, ...]) -> str:
    """What an exception raised by the student's forward most likely means, in torch terms."""
    text = f"{type(e).__name__}: {e}"
    if "view size is not compatible" in text:
        return (f"forward raised {text.split('. Use')[0]}. `.view` cannot merge axes that a "
                f"transpose has left apart in memory: after .transpose(1, 2) merge the heads "
                f"with .reshape(B, T, d_model) (or .contiguous().view)")
    if "numpy.ndarray" in text and "Tensor" in text:
        return (f"forward raised {text}: the check passes a numpy x_np; convert it with "
                f"torch.from_numpy(x_np) before the first nn.Linear")
    if "dtype" in text and ("same" in text or "expected" in text):
        return (f"forward raised {text}: keep x in float64 (torch.from_numpy keeps numpy's "
                f"float64, the dtype of pt_mha's weights); do not cast it to float32")
    if "is invalid for input of size" in text:
        return (f"forward raised {text}. The check feeds x of shape {shape}: read B and T "
                f"from x.shape inside the function instead of using the notebook's B, T")
    return f"forward raised {text}"


def _without_out_proj(module):
    """A copy of the numpy module whose output projection is the identity: the merged heads."""
    bare = copy.copy(module)
    bare.Wo, bare.bo = np.eye(module.d_model, dtype=module.Wo.dtype), np.zeros_like(module.bo)
    return bare


def _own_mistakes(out: np.ndarray, module, x: np.ndarray, causal: bool) -> str | None:
    """The torch-port mistakes that diagnose does not name: the mask polarity, no out_proj."""
    T = x.shape[1]
    tril = np.tril(np.ones((T, T), dtype=bool))  # (T, S), True = may attend
    with np.errstate(all="ignore"):
        candidates = [
            (module(x, causal=not causal),
             "forward ignores causal=True: pass is_causal=True to F.scaled_dot_product_attention"
             if causal else "forward masks although causal=False: leave is_causal out"),
            (_without_out_proj(module)(x, causal=causal),
             "forward returns the merged heads without the output projection: finish with "
             "pt_mha.out_proj(merged)"),
            (module(x, mask=~tril),
             "forward hands SDPA a mask in nn.MultiheadAttention's convention (True = masked "
             "out, triu(1)): SDPA reads True = may attend, so every query sees only the future. "
             "Use is_causal=True instead of a mask"),
        ]
    for want, why in candidates:
        if _same(out, want):
            return why
    return None


def check_forward(answer: Any, module, causal: bool = True) -> str:
    """Say right, or which mistake `answer(x_np)` makes against `module(x_np, causal=causal)`."""
    if answer is None:
        return not_tried("write my_forward(x_np) -> (B, T, d_model) in torch and set `my_forward`")
    if not callable(answer):
        not_yet(f"my_forward must be a function x_np -> (B, T, d_model), got "
                f"{type(answer).__name__}")
    if not hasattr(module, "Wq"):
        not_yet(f"the second argument must be the numpy module (np_mha), the reference; got "
                f"{type(module).__name__}")
    x = np.random.default_rng(0).normal(size=(2, 5, module.d_model)).astype(module.dtype)
    try:
        got = answer(x.copy())  # (B, T, d_model) wanted
    except Exception as e:  # noqa: BLE001 - a student's code may raise anything
        not_yet(_errors(e, x.shape))
    if got is None:
        not_yet("forward returned None: did you forget the `return`?")
    if isinstance(got, tuple):
        not_yet(f"forward returned a tuple of {len(got)} items (nn.MultiheadAttention returns "
                f"(output, weights)); SDPA returns one tensor: return the output alone")
    out = as_array(_numpy(got), "forward's output")
    B, T, d = x.shape
    h = module.n_heads
    if out.shape in ((B, h, T, d // h), (B, T, h, d // h)):
        not_yet(f"forward returned shape {out.shape}, the heads before step 7: merge them to "
                f"(B, T, d_model) = {x.shape} and apply out_proj")
    if out.shape != x.shape:
        not_yet(f"forward should return shape {x.shape} (B, T, d_model), got {out.shape}")
    verdict = diagnose.forward(answer, module, causal=causal)
    if verdict.ok:
        return right(verdict.message)
    own = _own_mistakes(out, module, x, causal)
    if own is not None:
        not_yet(own)
    if verdict.bug in _PLANTED_IN_TORCH:
        not_yet(f"{_PLANTED_IN_TORCH[verdict.bug]}. {verdict.message}")
    not_yet(verdict.message)


# ---- the padding mask ------------------------------------------------------------------------
def _as_mask(pad: Any, B: int, T: int) -> np.ndarray:
    """pad as a numpy bool (B, T, T) array, or NotYet naming what arrived instead."""
    arr = _numpy(pad)
    dtype = getattr(arr, "dtype", None)
    if dtype is not None and np.issubdtype(dtype, np.floating):
        not_yet(f"pad is a float mask (dtype {dtype}): SDPA adds a float attn_mask to the scores, "
                f"so 1 and 0 shift them instead of blocking keys (pt_mha refuses it); build pad "
                f"with dtype=torch.bool")
    shape = getattr(arr, "shape", None)
    if shape == (B, T):
        not_yet(f"pad has shape (B, T) = {shape}, one flag per token: that is nn.MultiheadAttention's "
                f"key_padding_mask. pt_mha takes one (T, S) mask per item, (B, T, T)")
    if shape == (T, T):
        not_yet(f"pad has shape (T, T) = {shape}, one mask for the whole batch: item 0 is padded and "
                f"item 1 is not, so each item needs its own, (B, T, T)")
    if shape == (B, 1, T, T):
        arr = arr[:, 0]  # (B, 1, T, S) broadcasts over the heads like (B, T, S)
    return as_array(arr, "pad", shape=(B, T, T), kind="bool")


def _keys(B: int, T: int, real: dict[int, int]) -> np.ndarray:
    """(B, T, T): item b's queries may attend to its first real[b] keys (default: all T)."""
    m = np.ones((B, T, T), dtype=bool)
    for b, n in real.items():
        m[b, :, n:] = False
    return m


def _pad_mistakes(B: int, T: int, n: int) -> list[tuple[np.ndarray, str]]:
    """(a pad a student writes, what is wrong with it) for the typical mistakes."""
    want = _keys(B, T, {0: n})
    return [
        (~want, "pad is True on the pads: that is nn.MultiheadAttention's convention (True = "
                "masked out). SDPA and pt_mha read True = may attend, so flip it"),
        (want.transpose(0, 2, 1), f"pad blocks the rows of queries {n}..{T - 1} of item 0 "
                                  f"instead of the columns of keys {n}..{T - 1}: a padding token "
                                  f"is a key nobody may read, pad[b, query, key]"),
        (want & want.transpose(0, 2, 1), f"pad blocks keys {n}..{T - 1} and also the rows of the "
                                         f"padding queries: those queries then see no key and come "
                                         f"out as the bias alone; block only the padding keys"),
        (_keys(B, T, {0: n + 1}), f"pad keeps {n + 1} real keys for item 0, one too many (off by "
                                  f"one): item 0 has {n} real tokens, 0..{n - 1}"),
        (_keys(B, T, {0: n - 1}), f"pad keeps only {n - 1} real keys for item 0, one too few (off "
                                  f"by one): item 0 has {n} real tokens, 0..{n - 1}"),
        (_keys(B, T, {b: n for b in range(B)}), "pad blocks keys of item 1 as well: item 1 has no "
                                                "padding, so pad[1] must allow every key"),
        (_keys(B, T, {1: n}), "pad pads item 1 instead of item 0: the short sentence is item 0"),
        (np.ones((B, T, T), dtype=bool), "pad allows every key: nothing is masked yet; item 0's "
                                         "padding keys must be False"),
    ]


def _judge_pad(mask: np.ndarray, n: int) -> None:
    """Return if mask is right (causal parts aside); else NotYet naming the mistake."""
    B, T, _ = mask.shape
    causal = np.tril(np.ones((T, T), dtype=bool))  # (T, S): the module adds it anyway
    want = _keys(B, T, {0: n})
    if np.array_equal(mask & causal, want & causal):
        return
    mistakes = _pad_mistakes(B, T, n)
    for wrong, why in mistakes:  # exactly a typical mistake
        if np.array_equal(mask, wrong):
            not_yet(why)
    for wrong, why in mistakes:  # the same up to what causal=True hides anyway
        if np.array_equal(mask & causal, wrong & causal):
            not_yet(why)
    b, t, s = (int(i) for i in np.argwhere((mask & causal) != (want & causal))[0])
    not_yet(f"pad is not the padding mask yet: at item {b}, query {t}, key {s} it says "
            f"{bool(mask[b, t, s])}; the first {n} tokens of item 0 are real, the rest padding, and "
            f"item 1 has none")


def _outputs(module, x, mask: np.ndarray, n: int) -> dict[str, Any]:
    """The module's outputs: the expected one (keys removed, not masked) and typical wrong ones."""
    import torch  # only when a torch module is checked

    m = torch.from_numpy(mask)
    with torch.no_grad():
        item0 = module(x[:1], context=x[:1, :n], causal=True)[0]  # (T, d_model): n real keys only
        item1 = module(x, causal=True)[1]  # (T, d_model): no padding
        return {"want": torch.stack([item0, item1]).numpy(),  # (B, T, d_model), B = 2
                "no causal": module(x, mask=m).numpy(),
                "no mask": module(x, causal=True).numpy()}


def check_padding(pad: Any, out_padded: Any, module, x, n_real: int = 3) -> str:
    """Say right, or what is wrong with `pad` (B, T, T) or with `out_padded` (B, T, d_model)."""
    if pad is None and out_padded is None:
        return not_tried("build `pad` and run the module with it as `out_padded`")
    if pad is None:
        not_yet("out_padded is set but pad is still None: set pad to the mask you passed")
    B, T, d_model = tuple(x.shape)
    mask = _as_mask(pad, B, T)
    _judge_pad(mask, n_real)
    if out_padded is None:
        not_yet("pad is right; out_padded is still None: run the module with causal=True and "
                "mask=pad under torch.no_grad() and keep its output")
    got = as_array(_numpy(out_padded), "out_padded", shape=(B, T, d_model))
    outs = _outputs(module, x, mask, n_real)
    atol = 1e-12 if got.dtype == np.float64 else 1e-5
    diff = np.abs(got.astype(np.float64) - outs["want"])  # (B, T, d_model)
    if np.nanmax(diff) <= atol:
        return right(f"item 0 with its padding masked equals item 0 with the padding removed "
                     f"(max difference {np.nanmax(diff[0]):.1g}), and item 1 is untouched")
    for name, why in (("no causal", "out_padded was run without causal=True: pass causal=True "
                                    "together with mask=pad"),
                      ("no mask", "out_padded is the output without the mask: pass mask=pad")):
        if np.allclose(got, outs[name], rtol=0.0, atol=atol):
            not_yet(why)
    worst = np.nan_to_num(diff, nan=np.inf).max(axis=-1)  # (B, T)
    b, t = (int(i) for i in np.unravel_index(int(np.argmax(worst)), (B, T)))
    not_yet(f"pad is right, but out_padded is not the module's output with it: item {b}, query {t} "
            f"is off by {np.nanmax(diff[b, t]):.3g}; compute out_padded from this x with "
            f"causal=True and mask=pad")
