"""Self-checks for the two Try-its of 09_pytorch_port.ipynb: the forward pass in torch, a padding mask.

    print(tryit.check_forward(my_forward, np_mha))            # judged by diagnose.forward
    print(tryit.check_padding(pad, out_padded, pt_mha, x))    # pad (B, T, T), True = may attend

Shape legend: B batch, T query length, S key length, h heads, d_k = d_model // h.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from mha_course import diagnose
from mha_course.i18n import _
from mha_course.tryit import (
    NotYet,
    all_matches,
    as_array,
    guarded,
    judge_parts,
    not_tried,
    not_yet,
    read_array,
    read_mask,
    relate,
    right,
    self_check,
    where_in_students_code,
)


def _rule() -> str:
    return _("my_forward must be built from pt_mha's four nn.Linear layers and "
             "F.scaled_dot_product_attention, not by calling a module's forward or the package's "
             "attention")


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


def _math_kernel():
    """A context in which SDPA runs its math kernel: it returns the heads (B, h, T, d_k) laid out
    in that order, so `.transpose(1, 2).view(...)` raises (the default CPU kernel happens to
    return (B, T, h, d_k) memory, where the wrong `.view` would pass)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.MATH])


# ---- the forward pass ------------------------------------------------------------------------
def _planted_in_torch(bug: str) -> str | None:
    """diagnose names the numpy step; this says it in torch, first."""
    return {
        "split_no_transpose": _("step 2 splits without the transpose: in torch it is "
                                "q_proj(x).view(B, T, h, d_k).transpose(1, 2), not .view(B, h, T, "
                                "d_k)"),
        "merge_no_transpose": _("step 7 merges without the transpose: the heads (B, h, T, d_k) go "
                                "back to (B, T, h, d_k) with .transpose(1, 2) before .reshape(B, "
                                "T, d_model)"),
        "unscaled_scores": _("the scores are not scaled: SDPA divides by sqrt(d_k) by itself, so "
                             "scale=1.0 (or multiplying q by sqrt(d_k)) undoes it; leave scale "
                             "out"),
        "scores_over_d_k": _("the scores are scaled twice, by d_k instead of sqrt(d_k): SDPA "
                             "already divides by sqrt(d_k), so dividing q by sqrt(d_k) (or "
                             "scale=1/d_k) doubles it"),
        "weights_transposed": _("a projection uses W.T: x @ q_proj.weight is not the layer, "
                                "because nn.Linear stores weight as (out, in); call "
                                "pt_mha.q_proj(x)"),
        "anti_causal_mask": _("the causal mask is the wrong triangle: with is_causal=True SDPA "
                              "builds the right one for you"),
    }.get(bug)


def _errors(e: Exception, shape: tuple[int, ...]) -> str:
    """What an exception raised by the student's forward most likely means, in torch terms."""
    text = f"{type(e).__name__}: {str(e)[:300]}"
    where = where_in_students_code(e.__traceback__)
    at = _(" ({where})").format(where=where) if where else ""
    if "view size is not compatible" in text:
        return _("forward raised {text}{at}. `.view` cannot merge axes that a transpose has left "
                 "apart in memory: after .transpose(1, 2) merge the heads with .reshape(B, T, "
                 "d_model) (or .contiguous().view). The check runs SDPA's math kernel, which lays "
                 "the heads out as (B, h, T, d_k); the default CPU kernel happens to return (B, "
                 "T, h, d_k) memory, where this .view slips through").format(
            text=text.split(". Use")[0], at=at)
    if "numpy.ndarray" in text and "Tensor" in text:
        return _("forward raised {text}{at}: the check passes a numpy x_np; convert it with "
                 "torch.from_numpy(x_np) before the first nn.Linear").format(text=text, at=at)
    if "dtype" in text and ("same" in text or "expected" in text):
        return _("forward raised {text}{at}: keep x in float64 (torch.from_numpy keeps numpy's "
                 "float64, the dtype of pt_mha's weights); do not cast it to float32").format(
            text=text, at=at)
    if "is invalid for input of size" in text or "shape '[" in text:
        return _("forward raised {text}{at}. The check feeds x of shape {shape}: read B and T "
                 "from x.shape inside the function instead of using the notebook's B, T").format(
            text=text, at=at, shape=shape)
    return _("forward raised {text}{at}").format(text=text, at=at)


def _run(answer: Callable, x: np.ndarray) -> Any:
    """answer(x) under the grading guard and SDPA's math kernel; its own error is NotYet."""
    try:
        with _math_kernel():
            return guarded(answer, x.copy(), rule=_rule())
    except NotYet:
        raise
    except Exception as e:  # noqa: BLE001 - a student's code may raise anything
        not_yet(_errors(e, x.shape))


def _variant(module, x: np.ndarray, causal: bool, scale: float | None = None, heads: int | None = None,
             drop: tuple[str, ...] = (), layers: str = "qkv", w_t: bool = False,
             masked: str = "-inf", split_dh: bool = False, out: str = "once") -> np.ndarray:
    """The module's forward in numpy with one slip: another scale or head count, biases dropped,
    q, k, v made by the layers `layers` (e.g. "qqv": k from q_proj) or with W.T (`w_t`), masked
    scores set to 0 or a 0/1 mask added (`masked` "0" / "add01"), heads split as (d_k, h)
    (`split_dh`), out_proj applied twice or x added back (`out` "twice" / "residual")."""
    B, T, d = x.shape
    h = heads or module.n_heads
    d_k = d // h
    b = {n: np.zeros_like(getattr(module, n)) if n in drop else getattr(module, n)
         for n in ("bq", "bk", "bv", "bo")}

    def split(a):  # (B, T, d) -> (B, h, T, d_k)
        if split_dh:
            return a.reshape(B, T, d_k, h).transpose(0, 3, 1, 2)  # (B, T, d_k, h) -> (B, h, T, d_k)
        return a.reshape(B, T, h, d_k).transpose(0, 2, 1, 3)

    def weight(n: str) -> np.ndarray:
        W = getattr(module, f"W{n}")  # (d_model in, d_model out)
        return W.T if w_t else W

    q, k, v = (split(x @ weight(n) + b[f"b{n}"]) for n in layers)  # (B, h, T, d_k)
    scores = q @ k.transpose(0, 1, 3, 2) * (1 / math.sqrt(d_k) if scale is None else scale)  # (B, h, T, T)
    tril = np.tril(np.ones((T, T), dtype=bool))  # (T, S)
    if causal:
        scores = {"-inf": np.where(tril, scores, -np.inf), "0": np.where(tril, scores, 0.0),
                  "add01": scores + tril}[masked]
    w = np.exp(scores - scores.max(axis=-1, keepdims=True))
    w = w / w.sum(axis=-1, keepdims=True)  # (B, h, T, T)
    merged = (w @ v).transpose(0, 2, 1, 3).reshape(B, T, d)  # (B, h, T, d_k) -> (B, T, d_model)
    y = merged @ module.Wo + b["bo"]  # (B, T, d_model)
    return {"once": y, "twice": y @ module.Wo + b["bo"], "residual": x + y}[out]


def _without_out_proj(module):
    """A copy of the numpy module whose output projection is the identity: the merged heads."""
    bare = copy.copy(module)
    bare.Wo, bare.bo = np.eye(module.d_model, dtype=module.Wo.dtype), np.zeros_like(module.bo)
    return bare


def _own_mistakes(module, x: np.ndarray, causal: bool) -> list[tuple[np.ndarray, str]]:
    """The torch-port mistakes that diagnose does not name, with their outputs for x."""
    T, d, h = x.shape[1], module.d_model, module.n_heads
    tril = np.tril(np.ones((T, T), dtype=bool))  # (T, S), True = may attend
    with np.errstate(all="ignore"):
        found = [
            (module(x, causal=not causal),
             _("forward ignores causal=True: pass is_causal=True to F.scaled_dot_product_attention")
             if causal else _("forward masks although causal=False: leave is_causal out")),
            (_without_out_proj(module)(x, causal=causal),
             _("forward returns the merged heads without the output projection: finish with "
               "pt_mha.out_proj(merged)")),
            (module(x, mask=~tril),
             _("forward hands SDPA a mask in nn.MultiheadAttention's convention (True = masked "
               "out, triu(1)): SDPA reads True = may attend, so every query sees only the future. "
               "Use is_causal=True instead of a mask")),
            (_variant(module, x, causal, scale=1 / math.sqrt(d)),
             _("the scores are divided by sqrt(d_model) instead of sqrt(d_k), the size of one "
               "head: SDPA's default scale is already the right one")),
            (_variant(module, x, causal, heads=1),
             _("forward attends with one head of size d_model: the heads are never split, so "
               "split q, k, v into h = {h} heads of d_k = {d_k} before SDPA").format(h=h,
                                                                                   d_k=d // h)),
            (_variant(module, x, causal, drop=("bo",)),
             _("forward drops the output projection's bias: out_proj is merged @ W.T + b; call "
               "pt_mha.out_proj(merged) rather than multiplying by its weight alone")),
            (_variant(module, x, causal, drop=("bq", "bk", "bv")),
             _("forward drops the biases of q, k and v: call pt_mha.q_proj(x) (and k_proj, "
               "v_proj), which add them, rather than multiplying by the weights alone")),
        ]
        for n in "qv":  # without bk the scores shift by q . bk, the same for every key: no change
            found.append((_variant(module, x, causal, drop=(f"b{n}",)),
                          _("forward drops the bias of {n}_proj: call pt_mha.{n}_proj(x) rather "
                            "than multiplying by its weight alone").format(n=n)))
        found += [
            (_variant(module, x, causal, w_t=True),
             _("q, k and v are x @ weight + bias: nn.Linear stores weight as (out, in) and "
               "computes x @ weight.T + bias; call pt_mha.q_proj(x) (and k_proj, v_proj)")),
            (_variant(module, x, causal, masked="0"),
             _("the masked scores are set to 0, not -inf: exp(0) = 1 still gives the future keys "
               "weight; with is_causal=True SDPA masks them properly")),
            (_variant(module, x, causal, masked="add01"),
             _("the causal mask went in as a float 0/1 tensor: SDPA adds a float attn_mask to "
               "the scores, so 1 and 0 shift them and block nothing. Use is_causal=True (or a "
               "bool mask, True = may attend)")),
            (_variant(module, x, causal, split_dh=True),
             _("the heads are split as .view(B, T, d_k, h): each head must own d_k consecutive "
               "features, .view(B, T, h, d_k).transpose(1, 2)")),
            (_variant(module, x, causal, out="twice"),
             _("out_proj is applied twice: once, to the merged heads")),
            (_variant(module, x, causal, out="residual"),
             _("forward adds x back (a residual connection): the attention module returns "
               "out_proj(merged) alone; the residual belongs to the transformer block around "
               "it")),
        ]
        for layers in ("qqv", "qkk", "qkq", "kqv", "vkq", "qvk", "kkv"):
            wrong = [_("{n} with {m}_proj").format(n=n, m=m)
                     for n, m in zip("qkv", layers, strict=True) if n != m]
            made = wrong[0]
            for more in wrong[1:]:
                made = _("{this} and {that}").format(this=made, that=more)
            found.append((_variant(module, x, causal, layers=layers),
                          _("forward makes {made}: each of q, k, v has its own layer (q_proj, "
                            "k_proj, v_proj)").format(made=made)))
    return found


def _relate_forward(answer: Callable, module, causal: bool) -> str:
    """How the output differs, on the first input where it does, without showing the reference."""
    d_k = module.d_model // module.n_heads
    for case, x in diagnose._inputs(module, 0):
        with np.errstate(all="ignore"):
            want = module(x, causal=causal)
        got = as_array(_numpy(_run(answer, x)), _("forward's output")).astype(np.float64)
        if not _same(got, want):
            said = relate(got, want, _("forward's output"),
                          factors={"sqrt(d_k)": math.sqrt(d_k),
                                   _("h (the heads)"): module.n_heads},
                          rtol=1e-6, atol=1e-9)
            return _("forward differs from the numpy module on {case} in a way no single known "
                     "mistake explains (two slips together?): {said}. Compare each step with the "
                     "numpy module's (trace it with diagnose.trace_values) to find the first that "
                     "differs").format(case=case, said=said)
    return _("forward differs from the numpy module on one of the inputs")


@self_check
def check_forward(answer: Any, module, causal: bool = True) -> str:
    """Say right, or which mistake `answer(x_np)` makes against `module(x_np, causal=causal)`."""
    if answer is None:
        return not_tried(_("write my_forward(x_np) -> (B, T, d_model) in torch and set "
                           "`my_forward`"))
    if not callable(answer):
        not_yet(_("my_forward must be a function x_np -> (B, T, d_model), got {kind}").format(
            kind=type(answer).__name__))
    if type(answer).__module__.split(".")[0] == "mha":  # pt_mha or np_mha itself, not a function
        not_yet(_("{rule}: my_forward is the package's own {name}, so this would check the "
                  "package, not your work").format(
            rule=_rule(), name=f"{type(answer).__module__}.{type(answer).__qualname__}"))
    if not hasattr(module, "Wq"):
        not_yet(_("the second argument must be the numpy module (np_mha), the reference; got "
                  "{kind}").format(kind=type(module).__name__))
    x = np.random.default_rng(0).normal(size=(2, 5, module.d_model)).astype(module.dtype)
    got = _run(answer, x)  # (B, T, d_model) wanted
    if got is None:
        not_yet(_("forward returned None: did you forget the `return`?"))
    if isinstance(got, list):
        not_yet(_("forward returned a list of {n} item(s): return the output tensor itself").format(
            n=len(got)))
    if isinstance(got, tuple):
        not_yet(_("forward returned a tuple of {n} items (nn.MultiheadAttention returns (output, "
                  "weights)); SDPA returns one tensor: return the output alone").format(
            n=len(got)))
    out = as_array(_numpy(got), _("forward's output"))
    B, T, d = x.shape
    h = module.n_heads
    if out.shape in ((B, h, T, d // h), (B, T, h, d // h)):
        not_yet(_("forward returned shape {shape}, the heads before step 7: merge them to (B, T, "
                  "d_model) = {want} and apply out_proj").format(shape=out.shape, want=x.shape))
    if out.shape != x.shape:
        not_yet(_("forward should return shape {want} (B, T, d_model), got {shape}").format(
            want=x.shape, shape=out.shape))
    again = as_array(_numpy(_run(answer, x)), _("forward's output"))
    if again.shape == out.shape and not _same(again, out):
        not_yet(_("forward gives a different output each time it runs on the same x: something "
                  "random is left on (dropout_p > 0 in SDPA, or a layer in training mode with "
                  "dropout); attention at inference is deterministic"))
    with _math_kernel():
        verdict = diagnose.forward(answer, module, causal=causal)
    if verdict.ok:  # diagnose's own words stay English, glossed in Chinese
        return right(_("{diagnosis}").format(diagnosis=verdict.message))
    own = list(dict.fromkeys(why for want, why in _own_mistakes(module, x, causal)
                             if _same(out, want)))
    if own:
        not_yet(own[0] if len(own) == 1 else _("two slips give this same output: {slips}").format(
            slips=_("; or ").join(own)))
    in_torch = verdict.message.replace(  # diagnose speaks numpy; this lesson is torch
        "transpose(0, 2, 1, 3)", ".transpose(1, 2) (numpy's transpose(0, 2, 1, 3))")
    planted = _planted_in_torch(verdict.bug) if verdict.bug is not None else None
    if planted is not None:
        not_yet(_("{said}. {extra}").format(said=planted, extra=in_torch))
    if verdict.bug is not None:
        not_yet(_("{diagnosis}").format(diagnosis=in_torch))
    not_yet(_relate_forward(answer, module, causal))


# ---- the padding mask ------------------------------------------------------------------------
def _convention(kind: str) -> str:
    return {"0/1": _("0/1 numbers"),
            "additive": _("an additive float mask (0 = attend, -inf = blocked)")}[kind]


def _keys(B: int, T: int, real: dict[int, int]) -> np.ndarray:
    """(B, T, T): item b's queries may attend to its first real[b] keys (default: all T)."""
    m = np.ones((B, T, T), dtype=bool)
    for b, n in real.items():
        m[b, :, n:] = False
    return m


def _left(B: int, T: int, n: int) -> np.ndarray:
    """(B, T, T): item 0 keeps its last n keys (its padding at the start), item 1 all."""
    m = np.ones((B, T, T), dtype=bool)
    m[0] = np.arange(T) >= T - n  # (S,) broadcast over the queries
    return m


def _pad_mistakes(B: int, T: int, n: int) -> list[tuple[np.ndarray, str]]:
    """(a pad a student writes, what is wrong with it) for the typical mistakes."""
    want = _keys(B, T, {0: n})
    return [
        (~want, _("pad is True on the pads: that is nn.MultiheadAttention's convention (True = "
                  "masked out). SDPA and pt_mha read True = may attend, so flip it with ~pad")),
        (want.transpose(0, 2, 1), _("pad blocks the rows of queries {n}..{last} of item 0 instead "
                                    "of the columns of keys {n}..{last}: a padding token is a key "
                                    "nobody may read, pad[b, query, key]").format(n=n, last=T - 1)),
        (want & want.transpose(0, 2, 1), _("pad blocks keys {n}..{last} and also the rows of the "
                                           "padding queries: those queries then see no key and "
                                           "come out as the bias alone; block only the padding "
                                           "keys").format(n=n, last=T - 1)),
        (_keys(B, T, {0: n + 1}), _("pad keeps {m} real keys for item 0, one too many (off by "
                                    "one): item 0 has {n} real tokens, 0..{last}").format(
            m=n + 1, n=n, last=n - 1)),
        (_keys(B, T, {0: n - 1}), _("pad keeps only {m} real keys for item 0, one too few (off by "
                                    "one): item 0 has {n} real tokens, 0..{last}").format(
            m=n - 1, n=n, last=n - 1)),
        (_keys(B, T, {b: n for b in range(B)}), _("pad blocks keys of item 1 as well: item 1 has "
                                                  "no padding, so pad[1] must allow every key")),
        (_keys(B, T, {1: n}), _("pad pads item 1 instead of item 0: the short sentence is item "
                                "0")),
        (np.ones((B, T, T), dtype=bool), _("pad allows every key: nothing is masked yet; item 0's "
                                           "padding keys must be False")),
        (_keys(B, T, {0: n, 1: 0}), _("pad blocks every key of item 1: item 1 has no padding, so "
                                      "pad[1] must allow every key")),
        (_left(B, T, n),
         _("pad keeps the last {n} keys of item 0 and blocks the first: that is left padding; "
           "here item 0's real tokens come first (0..{last}) and the padding at the end").format(
             n=n, last=n - 1)),
        (_keys(B, T, {0: T - n}), _("pad keeps the first {m} keys of item 0, the number of "
                                    "padding tokens: item 0 has {n} real tokens, 0..{last}").format(
            m=T - n, n=n, last=n - 1)),
    ]


def _read_pad(pad: Any, B: int, T: int, n: int) -> tuple[np.ndarray, str]:
    """(allowed (B, T, T), convention) of pad in any convention, or NotYet for a wrong shape."""
    arr = read_array(_numpy(pad), _("pad must be a boolean (B, T, T) mask"))
    if arr.shape == (B, T):
        flags, convention = read_mask(arr, "pad")
        real = np.arange(T) < n
        marks = (_(" Your flags are True on the padding, torch's key_padding_mask convention "
                   "(True = blocked); here True = may attend.")
                 if np.array_equal(flags, ~(real | (np.arange(B) > 0)[:, None])) else
                 _(" Your flags mark the right tokens; only the shape is not what pt_mha takes.")
                 if np.array_equal(flags, real | (np.arange(B) > 0)[:, None]) else "")
        not_yet(_("pad has shape (B, T) = {shape}, one flag per token: the form of "
                  "nn.MultiheadAttention's key_padding_mask. pt_mha takes one (T, S) mask per "
                  "item, (B, T, T): each query of item b gets item b's row of key "
                  "flags.{marks}").format(shape=arr.shape, marks=marks))
    if arr.shape == (T, T):
        not_yet(_("pad has shape (T, T) = {shape}, one mask for the whole batch: item 0 is "
                  "padded and item 1 is not, so each item needs its own, (B, T, T)").format(
            shape=arr.shape))
    if arr.shape in ((B, 1, 1, T), (B, 1, T)):
        not_yet(_("pad has shape {shape}: that broadcasts over the queries in SDPA itself, but "
                  "pt_mha takes (T, S), (B, T, S) or (B, 1, T, S) masks: give every query its "
                  "row, (B, T, T), e.g. with .expand").format(shape=arr.shape))
    if arr.shape == (B, 1, T, T):
        arr = arr[:, 0]  # (B, 1, T, S) broadcasts over the heads like (B, T, S)
    return read_mask(arr, "pad", shape=(B, T, T))


def _judge_pad(pad: Any, B: int, T: int, n: int) -> str:
    """The pad part: right, or NotYet naming the mistake (in the student's convention)."""
    if pad is None:
        return not_tried(_("build `pad`, a boolean (B, T, T) mask, True = may attend"))
    mask, convention = _read_pad(pad, B, T, n)
    causal = np.tril(np.ones((T, T), dtype=bool))  # (T, S): the module adds it anyway
    want = _keys(B, T, {0: n})
    if np.array_equal(mask & causal, want & causal):
        if convention == "bool":
            return right(_("item 0's padding keys are blocked for every query, item 1 is "
                           "untouched"))
        if convention == "additive":
            not_yet(_("pad marks the right keys as an additive float mask (0 = attend, -inf = "
                      "blocked): SDPA itself would accept that as attn_mask, but pt_mha takes a "
                      "boolean mask, True = may attend. `pad == 0` turns yours into one (not "
                      ".bool() or .astype(bool): those make -inf True and 0 False, inverting "
                      "it)"))
        if np.issubdtype(read_array(_numpy(pad), "pad").dtype, np.floating):
            not_yet(_("pad marks the right keys, but as float 0/1 numbers, not booleans (a float "
                      "mask: SDPA adds a float attn_mask to the scores, so its 1s and 0s would "
                      "shift them instead of blocking keys, and pt_mha refuses it): `pad == 1` "
                      "(or pad.bool()) gives the boolean mask, True = may attend"))
        not_yet(_("pad marks the right keys, but as integer 0/1 numbers, not booleans: `pad == "
                  "1` (or pad.bool()) gives the boolean mask, True = may attend"))
    read = "" if convention == "bool" else _(" (read as {convention})").format(
        convention=_convention(convention))
    if np.array_equal(~mask & causal, want & causal):
        if convention == "additive":
            not_yet(_("pad has 0 and -inf swapped: an additive mask adds 0 where a key may be "
                      "read and -inf where it is blocked, so yours blocks the real tokens and "
                      "lets the padding through"))
        if convention == "0/1":
            not_yet(_("pad is 1 on the pads and 0 on the real tokens: that is torch's "
                      "key_padding_mask and nn.MultiheadAttention's convention (True = masked "
                      "out). SDPA and pt_mha read True = may attend: `pad == 0` gives that "
                      "boolean mask (not ~pad, which on integers is a bitwise not: -1 and -2)"))
        not_yet(_("pad is True on the pads: that is torch's key_padding_mask and "
                  "nn.MultiheadAttention's convention (True = masked out). SDPA and pt_mha read "
                  "True = may attend, so negate it with ~pad"))
    mistakes = _pad_mistakes(B, T, n)
    found = all_matches(mask, mistakes) or all_matches(
        mask & causal, [(wrong & causal, why) for wrong, why in mistakes])
    if found:
        not_yet((found[0] if len(found) == 1 else _("two slips give this same mask: {slips}")
                 .format(slips=_("; or ").join(found))) + read)
    said = relate(mask & causal, want & causal, _("pad (where causal=True leaves a choice)"))
    not_yet(_("{said}{read}: the first {n} tokens of item 0 are real, the rest padding, and item "
              "1 has none").format(said=said, read=read, n=n))


def _zero_pad_rows(out: np.ndarray, n: int) -> np.ndarray:
    """out (B, T, d_model) with item 0's padding queries n.. set to 0."""
    zeroed = out.copy()
    zeroed[0, n:] = 0.0
    return zeroed


def _module_out(module, x, mask: np.ndarray | None, causal: bool = True) -> np.ndarray:
    """module(x, causal, mask) as numpy, without gradients."""
    import torch  # only when a torch module is checked

    with torch.no_grad():
        m = None if mask is None else torch.from_numpy(mask)
        return module(x, causal=causal, mask=m).numpy()


def _judge_out(out_padded: Any, pad: Any, module, x, n: int) -> str:
    """The out_padded part: right (for the right pad, or for the student's own), or NotYet."""
    import torch  # only when a torch module is checked

    B, T, d_model = tuple(x.shape)
    if out_padded is None:
        return not_tried(_("out_padded is still None: run the module with causal=True and "
                           "mask=pad under torch.no_grad() and keep its output"))
    got = as_array(_numpy(out_padded), "out_padded", shape=(B, T, d_model)).astype(np.float64)
    with torch.no_grad():
        item0 = module(x[:1], context=x[:1, :n], causal=True)[0]  # (T, d_model): n real keys only
        item1 = module(x, causal=True)[1]  # (T, d_model): no padding
        want = torch.stack([item0, item1]).numpy()  # (B, T, d_model)
    atol = 1e-12 if np.asarray(_numpy(out_padded)).dtype == np.float64 else 1e-5
    diff = np.abs(got - want)
    if np.nanmax(diff) <= atol:
        return right(_("item 0 with its padding masked equals item 0 with the padding removed "
                       "(max difference {diff:.1g}), and item 1 is untouched").format(
            diff=np.nanmax(diff[0])))
    try:
        mask, _convention = _read_pad(pad, B, T, n)
    except NotYet:
        mask = None  # pad is unreadable: compare with the right output only
    right_pad = _keys(B, T, {0: n})
    candidates = [(_module_out(module, x, right_pad, causal=False),
                   _("out_padded was run without causal=True: pass causal=True together with "
                     "mask=pad")),
                  (_module_out(module, x, None),
                   _("out_padded is the output without the mask: pass mask=pad")),
                  (_module_out(module, x, ~right_pad),
                   _("out_padded was run with the mask inverted (True on the pads): pt_mha reads "
                     "True = may attend")),
                  (_zero_pad_rows(want, n),
                   _("out_padded is 0 on item 0's padding queries: the module still gives those "
                     "queries an output (they attend to the real keys); keep the module's output "
                     "as it is"))]
    if mask is not None and not np.array_equal(mask, right_pad):
        theirs = _module_out(module, x, mask)
        if np.allclose(got, theirs, rtol=0.0, atol=atol):
            return right(_("out_padded is pt_mha's output with your pad: it will be right once "
                           "pad is"))
        candidates.insert(0, (_module_out(module, x, mask, causal=False),
                              _("out_padded was run with your pad but without causal=True: pass "
                                "causal=True together with mask=pad")))
    found = all_matches(got, candidates, atol=atol)
    if found:
        not_yet(found[0] if len(found) == 1 else _("; or ").join(found))
    said = relate(got, want, "out_padded", rtol=1e-6, atol=atol)
    not_yet(_("out_padded is not the module's output with the padding masked: {said}; compute it "
              "from this x with causal=True and mask=pad").format(said=said))


@self_check
def check_padding(pad: Any, out_padded: Any, module, x, n_real: int = 3) -> str:
    """Say right, or what is wrong with `pad` (B, T, T) and with `out_padded` (B, T, d_model)."""
    if pad is None and out_padded is None:
        return not_tried(_("build `pad` and run the module with it as `out_padded`"))
    B, T, _d_model = tuple(x.shape)
    said = judge_parts(pad=lambda: _judge_pad(pad, B, T, n_real),
                       out_padded=lambda: _judge_out(out_padded, pad, module, x, n_real))
    return said
