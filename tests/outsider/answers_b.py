"""Held-out student answers (set M2), written blind to the checkers' code."""
import numpy as np
import torch
import torch.nn.functional as F

S = {}  # per-lesson setup, filled by setup()
ANSWERS = []


def A(id, lesson, check, kind, mistake, keywords, run_new, run_old=None):
    ANSWERS.append(dict(id=id, lesson=lesson, check=check, kind=kind, mistake=mistake,
                        keywords=keywords, run_new=run_new, run_old=run_old))


def setup(lesson, tryit, which):
    """Rebuild what the notebook's Try-it cell needs (same seeds)."""
    S.clear()
    S["which"] = which
    if lesson == 2:
        from mha import steps
        from mha.modules.numpy_mha import MultiHeadAttention
        B, T, d_model = 2, 4, 8
        rng = np.random.default_rng(0)
        x = rng.normal(0.0, 1.0, (B, T, d_model))
        m = MultiHeadAttention(d_model, 2, seed=0)
        W_qkv = np.concatenate([m.Wq, m.Wk, m.Wv], axis=1)
        b_qkv = np.concatenate([m.bq, m.bk, m.bv])
        qkv = steps.linear(x, W_qkv, b_qkv)
        q2, k2, v2 = np.split(qkv, 3, axis=-1)
        S.update(B=B, T=T, d_model=d_model, qkv=qkv, q2=q2, q=steps.linear(x, m.Wq, m.bq))
    if lesson == 9:
        from mha.modules import numpy_mha
        from mha.modules.torch_mha import MultiHeadAttention
        torch.manual_seed(0)
        B, T, d_model, n_heads = 2, 6, 512, 8
        S["np_mha"] = numpy_mha.MultiHeadAttention(d_model, n_heads, seed=42)
        S["pt_mha"] = MultiHeadAttention(d_model, n_heads, seed=42, dtype=torch.float64)
        x_np = np.random.default_rng(0).normal(0.0, 1.0, (B, T, d_model))
        S.update(B=B, T=T, d_model=d_model, x=torch.from_numpy(x_np), x_np=x_np)
    if lesson == 10:
        from mha.training import train as tr

        def rotation_batch(generator, B, T, vocab):
            x = torch.randint(0, vocab, (B, T), generator=generator)
            return x, x.roll(-3, dims=1)
        rotation = tr.Task("rotation", T=8, vocab=10, causal=False, make=rotation_batch)
        model_rot = tr.TinyTransformer.for_task(rotation, d_model=32, n_heads=1, n_layers=1, seed=0)
        tr.train(model_rot, rotation, steps=200, lr=3e-3, progress=False)
        x_rot, y_rot = rotation.batch(torch.Generator().manual_seed(7), 512)
        maps_rot = tr.attention_maps(model_rot, x_rot)[0].mean(dim=0)[0]
        if which == "new":
            S["read"] = tryit.measured_keys(maps_rot.argmax(dim=-1))
        else:
            S["read"] = maps_rot.argmax(dim=-1).numpy()
    if lesson == 11:
        from mha.perf import bench
        torch.manual_seed(0)
        q_try = torch.randn(1, 8, 256, 64)
        S["measured"] = bench.kernel_that_runs(q_try, q_try, q_try, dropout_p=0.1)


# ---------------------------------------------------------------- lesson 01
def _band(T, lo, hi):
    t = np.arange(T)[:, None]
    s = np.arange(T)[None, :]
    return (s <= t + hi) & (s >= t - lo)


T1 = 8
_right01 = _band(T1, 2, 0)


def _c01(mask):
    return lambda tr: tr.check_window_mask(mask, T=T1, window=3)


for i, (kind, mistake, kw, mask) in enumerate([
    ("wrong", "plain causal staircase: keeps every earlier key, no window cut", ["staircase", "whole past", "older", "every earlier"], np.tril(np.ones((T1, T1), bool))),
    ("wrong", "window of 2 keys (s >= t-1): one key too few", ["too short", "too few", "one key short", "2 keys"], _band(T1, 1, 0)),
    ("wrong", "window of 4 keys (s >= t-3): one key too many", ["too long", "too many", "4 keys", "one key more"], _band(T1, 3, 0)),
    ("wrong", "transposed: keys t..t+2 (the next ones, the future)", ["transpos", "future", "later keys", "ahead"], _band(T1, 0, 2)),
    ("wrong", "own key left out: keys t-3..t-1", ["diagonal", "itself", "own key", "its own"], _band(T1, 3, 0) & ~np.eye(T1, dtype=bool)),
    ("wrong", "inverted convention: True where blocked", ["invert", "true = blocked", "flipped", "~"], ~_right01),
    ("wrong", "centred window |s-t| <= 1 (symmetric, reads one future key)", ["future", "later", "symmetric", "ahead"], _band(T1, 1, 1)),
    ("wrong", "forgot the causal cut: np.triu(ones, k=-2) only", ["future", "causal", "later keys", "ahead"], np.triu(np.ones((T1, T1), bool), k=-2)),
    ("right", "0/1 int mask", [], _right01.astype(int)),
    ("right", "additive 0/-inf float mask", [], np.where(_right01, 0.0, -np.inf)),
    ("right", "torch bool tensor", [], torch.from_numpy(_right01.copy())),
    ("right", "nested python list of bools", [], _right01.tolist()),
]):
    A(f"01-{i+1:02d}", 1, "check_window_mask", kind, mistake, kw, _c01(mask), _c01(mask))

# ---------------------------------------------------------------- lesson 02


def _c02(pred, qfn):
    def new(tr):
        return tr.check_split(pred, qfn(), S["qkv"], S["q2"])

    def old(tr):
        return tr.check_split(pred, qfn(), S["qkv"])
    return new, old


def _q_right():
    return S["qkv"].reshape(S["B"], S["T"], 3, S["d_model"])[:, :, 0]


for i, (kind, mistake, kw, pred, qfn) in enumerate([
    ("wrong", "prediction True (thinks the classmate's split works), my_q right", ["prediction", "consecutive", "interleav", "every third"], True, _q_right),
    ("wrong", "my_q is the classmate's split reshape(B,T,d_model,3)[...,0]", ["consecutive", "interleav", "every third", "columns 0, 3"], False, lambda: S["qkv"].reshape(S["B"], S["T"], S["d_model"], 3)[..., 0]),
    ("wrong", "my_q is the lesson's q2 (not cut from qkv by the student)", ["q2", "lesson's", "not cut", "np.split"], False, lambda: S["q2"]),
    ("wrong", "my_q a copy of the right slice (.copy())", ["copy", "view", "not cut"], False, lambda: _q_right().copy()),
    ("wrong", "took block 1 (the keys) instead of block 0", ["key", "block 1", "index 1", "second block"], False, lambda: S["qkv"].reshape(S["B"], S["T"], 3, S["d_model"])[:, :, 1]),
    ("wrong", "indexed the wrong axis: reshape(B,T,3,d_model)[..., 0] (shape (B,T,3))", ["shape", "wrong axis", "last axis"], False, lambda: S["qkv"].reshape(S["B"], S["T"], 3, S["d_model"])[..., 0]),
    ("wrong", "3 put in front of the batch: reshape(3,B,T,d_model)[0]", ["batch", "in front", "first axis", "leading"], False, lambda: S["qkv"].reshape(3, S["B"], S["T"], S["d_model"])[0]),
    ("wrong", "two slips: prediction True and the classmate's split as my_q", ["prediction", "consecutive", "interleav", "every third"], True, lambda: S["qkv"].reshape(S["B"], S["T"], S["d_model"], 3)[..., 0]),
    ("wrong", "my_q is the separately computed q (not from qkv)", ["not cut", "copy", "view", "q itself"], False, lambda: S["q"]),
    ("right", "a plain slice view qkv[..., :d_model]", [], False, lambda: S["qkv"][..., :S["d_model"]]),
    ("right", "np.bool_ prediction and np.split view", [], np.False_, lambda: np.split(S["qkv"], 3, axis=-1)[0]),
    ("right", "int 0 as the prediction (False) with the right reshape", [], 0, _q_right),
]):
    n, o = _c02(pred, qfn)
    A(f"02-{i+1:02d}", 2, "check_split", kind, mistake, kw, n, o)

# ---------------------------------------------------------------- lesson 03


def _rule_planted(B, T, d_model, h):
    from mha_course import planted
    from mha import steps
    xs = np.random.default_rng(1).normal(size=(B, T, d_model))
    return bool(np.array_equal(planted.merge_no_transpose(steps.split_heads(xs, h)), xs))


for i, (kind, mistake, kw, rule) in enumerate([
    ("wrong", "only h == 1 (forgot T == 1)", ["t == 1", "one token", "single token", "t = 1"], lambda B, T, d_model, h: h == 1),
    ("wrong", "only T == 1 (forgot h == 1)", ["h == 1", "one head", "single head", "h = 1"], lambda B, T, d_model, h: T == 1),
    ("wrong", "T == 1 and h == 1 (and instead of or)", ["either", " or ", "only one of", "and"], lambda B, T, d_model, h: T == 1 and h == 1),
    ("wrong", "d_model divisible by h", ["divisib", "d_model", "d_k"], lambda B, T, d_model, h: d_model % h == 0),
    ("wrong", "batch of 1", ["batch", "b == 1", "b = 1", "b does not matter"], lambda B, T, d_model, h: B == 1),
    ("wrong", "h == T (square)", ["h == t", "equal", "t == 1", "h == 1"], lambda B, T, d_model, h: h == T),
    ("wrong", "d_k == 1 (d_model == h)", ["d_k", "d_model == h", "head width"], lambda B, T, d_model, h: d_model == h),
    ("wrong", "runs the round trip itself with planted/steps", ["planted", "steps", "round trip", "refused"], _rule_planted),
    ("wrong", "h == 1 or T == 1 or B == 1 (batch too)", ["batch", "b == 1", "b does not"], lambda B, T, d_model, h: h == 1 or T == 1 or B == 1),
    ("right", "returns int 0/1", [], lambda B, T, d_model, h: int(T == 1 or h == 1)),
    ("right", "min(T, h) == 1", [], lambda B, T, d_model, h: min(T, h) == 1),
    ("right", "(T-1)*(h-1) == 0 as np.bool_", [], lambda B, T, d_model, h: np.bool_((T - 1) * (h - 1) == 0)),
]):
    A(f"03-{i+1:02d}", 3, "check_harmless_rule", kind, mistake, kw,
      (lambda r: lambda tr: tr.check_harmless_rule(r))(rule), (lambda r: lambda tr: tr.check_harmless_rule(r))(rule))

# ---------------------------------------------------------------- lesson 04
for i, (kind, mistake, kw, var, div) in enumerate([
    ("wrong", "variance sigma^2 (not sigma^4) and divisor sigma*sqrt(d_k)", ["sigma^4", "σ⁴", "square", "each product", "σ^4", "sigma**2"], 4, 16),
    ("wrong", "divisor forgot sigma^2: sqrt(d_k) only", ["sigma", "σ", "variance 4", "still"], 16, 8),
    ("wrong", "thinks the sqrt(d_k) scale still gives variance 1", ["sigma", "σ", "variance 4", "inputs"], 1, 8),
    ("wrong", "variance forgot the /sqrt(d_k): sigma^4*d_k; divisor sigma^4*d_k", ["sqrt(d_k)", "divid", "d_k", "before the scale"], 1024, 256),
    ("wrong", "divisor = the variance 16 (not its square root times sqrt(d_k))", ["square root", "std", "standard deviation", "sqrt"], 16, 16),
    ("wrong", "variance sigma^2 but divisor right", ["sigma^4", "σ⁴", "square", "each product", "σ^4"], 4, 32),
    ("wrong", "divisor 4*d_k (square root of d_k forgotten)", ["square root", "sqrt", "d_k not"], 16, 256),
    ("wrong", "used the std 2 everywhere", ["std", "standard deviation", "variance", "σ"], 2, 16),
    ("wrong", "divided by the variance twice: var 16, divisor 16*64", ["square root", "sqrt", "std"], 16, 1024),
    ("right", "floats", [], 16.0, 32.0),
    ("right", "numpy scalars: 4*np.sqrt(64)", [], np.float64(16), 4 * np.sqrt(64)),
    ("right", "torch scalars", [], torch.tensor(16.0), torch.tensor(32.0)),
]):
    f = (lambda a, b: lambda tr: tr.check_variance_and_divisor(a, b, sigma2=4.0, d_k=64))(var, div)
    A(f"04-{i+1:02d}", 4, "check_variance_and_divisor", kind, mistake, kw, f, f)

# ---------------------------------------------------------------- lesson 05
T5 = 6


def _cm(T):
    return np.tril(np.ones((T, T), dtype=bool))


_w5 = np.triu(_cm(T5), k=-2)
for i, (kind, mistake, kw, mask) in enumerate([
    ("wrong", "plain staircase steps.causal_mask(T)", ["staircase", "plain causal", "whole past", "older"], _cm(T5)),
    ("wrong", "triu k=-1: window one key too short", ["too short", "too few", "one key short", "2 keys"], np.triu(_cm(T5), k=-1)),
    ("wrong", "triu k=-3: window one key too long", ["too long", "too many", "4 keys", "one key more"], np.triu(_cm(T5), k=-3)),
    ("wrong", "wrong sign of the offset: triu k=2", ["sign", "k=2", "k = 2", "offset"], np.triu(_cm(T5), k=2)),
    ("wrong", "tril instead of triu: np.tril(causal, k=-2) keeps only old keys", ["tril", "wrong triangle", "older", "old keys"], np.tril(_cm(T5), k=-2)),
    ("wrong", "transposed window", ["transpos", "future", "upper"], _w5.T.copy()),
    ("wrong", "True = blocked (inverted)", ["invert", "true = blocked", "blocked", "~"], ~_w5),
    ("wrong", "band without the staircase: triu(ones, k=-2)", ["future", "causal", "later", "ahead"], np.triu(np.ones((T5, T5), bool), k=-2)),
    ("wrong", "two slips: window too long and transposed", ["transpos", "too long", "future"], np.triu(_cm(T5), k=-3).T.copy()),
    ("right", "0/1 ints", [], _w5.astype(int)),
    ("right", "additive float 0/-inf", [], np.where(_w5, 0.0, -np.inf)),
    ("right", "torch bool tensor", [], torch.from_numpy(_w5.copy())),
]):
    f = (lambda m: lambda tr: tr.check_window(m, T5))(mask)
    A(f"05-{i+1:02d}", 5, "check_window", kind, mistake, kw, f, f)

# ---------------------------------------------------------------- lesson 06
for i, (kind, mistake, kw, row) in enumerate([
    ("wrong", "row of equal values", ["equal", "same value", "all the same"], [1000.0, 1000.0, 1000.0]),
    ("wrong", "[800, 0]: mean 400, e^400 fits - no overflow at all with the mean", ["fits", "no overflow", "does not overflow", "largest exponent"], [800.0, 0.0]),
    ("wrong", "[1000, 0]: overflows only without a shift (e^500 fits)", ["without any shift", "without a shift", "unshifted", "only without"], [1000.0, 0.0]),
    ("wrong", "exponents fit but their sum overflows", ["sum", "exponents fit", "total"], [1418.0, 1418.0, 1418.0, 0.0, 0.0, 0.0]),
    ("wrong", "contains inf (not finite)", ["finite", "inf"], [np.inf, 0.0]),
    ("wrong", "a single logit (mean = the value)", ["single", "one logit", "one entry", "equal"], [2000.0]),
    ("wrong", "negative spike: underflow not overflow", ["underflow", "negative", "sign", "too small"], [-2000.0, 0.0, 0.0, 0.0]),
    ("wrong", "the row as a string", ["list", "string", "numbers", "text"], "2000, 0, 0, 0"),
    ("wrong", "empty list", ["empty", "no logits", "at least"], []),
    ("right", "numpy array", [], np.array([2000.0, 0.0, 0.0, 0.0])),
    ("right", "torch tensor [3000, 1, 2]", [], torch.tensor([3000.0, 1.0, 2.0], dtype=torch.float64)),
    ("right", "tuple of ints", [], (2000, 0, 0, 0)),
]):
    f = (lambda r: lambda tr: tr.check_mean_overflow(r))(row)
    A(f"06-{i+1:02d}", 6, "check_mean_overflow", kind, mistake, kw, f, f)

# ---------------------------------------------------------------- lesson 07
v_try7 = np.random.default_rng(7).normal(size=(1, 1, 4, 2))


def nm_right(v):
    return np.broadcast_to(v.mean(axis=2, keepdims=True), v.shape)


def ca_right(v):
    return np.cumsum(v, axis=2) / np.arange(1, v.shape[2] + 1)[:, None]


def _nm_axis(v):
    return np.broadcast_to(v.mean(axis=-1, keepdims=True), v.shape)


def _nm_sum(v):
    return np.broadcast_to(v.sum(axis=2, keepdims=True), v.shape)


def _ca_off(v):
    return np.cumsum(v, axis=2) / np.arange(2, v.shape[2] + 2)[:, None]


def _nm_noshape(v):
    return v.mean(axis=2, keepdims=True)


def _ca_sum(v):
    return np.cumsum(v, axis=2)


def _ca_rev(v):
    r = np.cumsum(v[:, :, ::-1], axis=2) / np.arange(1, v.shape[2] + 1)[:, None]
    return r[:, :, ::-1]


def _nm_hard(v):
    return np.broadcast_to(v_try7.mean(axis=2, keepdims=True), v_try7.shape)


def _nm_steps(v):
    from mha import steps
    z = np.zeros(v.shape[:2] + (v.shape[2], v.shape[2]))
    return steps.weighted_sum(steps.softmax(z), v)


def _ca_lastaxis(v):
    return np.cumsum(v, axis=-1) / np.arange(1, v.shape[-1] + 1)


def _nm_torch(v):
    t = torch.from_numpy(np.asarray(v))
    return t.mean(dim=2, keepdim=True).expand_as(t)


def _ca_tril(v):
    S_ = v.shape[2]
    W = np.tril(np.ones((S_, S_)))
    W = W / W.sum(axis=1, keepdims=True)
    return np.einsum("ts,bhsd->bhtd", W, v)


def _nm_repeat(v):
    return np.repeat(v.mean(axis=2, keepdims=True), v.shape[2], axis=2)


def _ca_loop(v):
    out = np.empty_like(v)
    for t in range(v.shape[2]):
        out[:, :, t] = v[:, :, :t + 1].mean(axis=2)
    return out


for i, (kind, mistake, kw, nm, ca, old_ok) in enumerate([
    ("wrong", "no-mask mean over the wrong axis (d_k)", ["wrong axis", "axis=-1", "d_k", "over the features"], _nm_axis, ca_right, True),
    ("wrong", "no-mask sum instead of mean", ["sum", "instead of a mean", "not divided", "times s"], _nm_sum, ca_right, True),
    ("wrong", "causal running mean divided by t+2 (off by one)", ["off by one", "t + 2", "one too many"], nm_right, _ca_off, True),
    ("wrong", "mask ignored: causal = same as no mask", ["mask ignored", "ignor", "no mask", "same as without"], nm_right, nm_right, True),
    ("wrong", "no-mask output not broadcast: shape (B,h,1,d_k)", ["shape", "broadcast", "one row"], _nm_noshape, ca_right, True),
    ("wrong", "causal running sum, not divided", ["sum", "not divided", "running sum", "count"], nm_right, _ca_sum, True),
    ("wrong", "causal reversed: mean of the later values (anti-causal)", ["future", "later", "revers", "upper"], nm_right, _ca_rev, True),
    ("wrong", "hard-coded v_try inside the function", ["hard-coded", "hard coded", "v_try", "other shape", "ignores its argument"], _nm_hard, ca_right, False),
    ("wrong", "shortcut with steps (forbidden)", ["steps", "guard", "not allowed", "package"], _nm_steps, ca_right, False),
    ("wrong", "causal cumsum over the last axis (d_k)", ["axis", "d_k", "wrong axis"], nm_right, _ca_lastaxis, True),
    ("right", "torch tensor output / explicit tril weight matrix", [], _nm_torch, _ca_tril, True),
    ("right", "np.repeat and an explicit loop", [], _nm_repeat, _ca_loop, True),
]):
    new = (lambda a, b: lambda tr: tr.check_uniform(a, b, v_try7))(nm, ca)
    old = (lambda a, b: lambda tr: tr.check_uniform(np.asarray(a(v_try7)), np.asarray(b(v_try7)), v_try7))(nm, ca) if old_ok else None
    A(f"07-{i+1:02d}", 7, "check_uniform", kind, mistake, kw, new, old)

# ---------------------------------------------------------------- lesson 08
for i, (kind, mistake, kw, n) in enumerate([
    ("wrong", "1: forgot q_t can be negative (ranks reverse)", ["sign", "negative", "smallest", "reverse"], 1),
    ("wrong", "6: every key (T)", ["every key", "all keys", "ranks the keys", "k_s alone"], 6),
    ("wrong", "8: every key at T = 8", ["every key", "all keys", "ranks the keys", "k_s alone"], 8),
    ("wrong", "16: counted heads", ["head", "per head"], 16),
    ("wrong", "3: largest, smallest and the own key", ["two", "largest or", "smallest"], 3),
    ("wrong", "0: thought no key is favoured", ["at least", "every row", "favours one"], 0),
    ("wrong", "4: 2 per sign of k counted twice", ["twice", "two", "largest or"], 4),
    ("right", "2.0 float", [], 2.0),
    ("right", "np.int64", [], np.int64(2)),
    ("right", "torch tensor", [], torch.tensor(2)),
]):
    f = (lambda a: lambda tr: tr.check_favoured_keys(a))(n)
    A(f"08a-{i+1:02d}", 8, "check_favoured_keys", kind, mistake, kw, f, f)

for i, (kind, mistake, kw, n) in enumerate([
    ("wrong", "21: diagonal counted in T(T+1)/2", ["diagonal", "strictly"], 21),
    ("wrong", "60: all 4 heads counted", ["all heads", "every head", "per head", "heads"], 60),
    ("wrong", "36: all T*T entries", ["all", "t*t", "t²", "every weight", "whole"], 36),
    ("wrong", "30: T(T-1), forgot halving", ["twice", "half", "/2", "both triangles"], 30),
    ("wrong", "0: counted with the mask off", ["mask", "causal", "off"], 0),
    ("wrong", "10: off by one, T-1 tokens", ["off by one", "t - 1", "one row"], 10),
    ("wrong", "18: T^2/2", ["diagonal", "half", "t²/2"], 18),
    ("right", "15.0", [], 15.0),
    ("right", "np.int64(15)", [], np.int64(15)),
    ("right", "torch tensor 15", [], torch.tensor(15)),
]):
    f = (lambda a: lambda tr: tr.check_zeros_per_head(a, 6))(n)
    A(f"08b-{i+1:02d}", 8, "check_zeros_per_head", kind, mistake, kw, f, f)

for i, (kind, mistake, kw, n) in enumerate([
    ("wrong", "5: the last row (sees all keys)", ["last", "first row", "one key", "single key"], 5),
    ("wrong", "1: counting rows from 1", ["from 1", "from 0", "1-based", "zero-based", "index"], 1),
    ("wrong", "6: T (1-based last row)", ["last", "index", "from 0", "out of range"], 6),
    ("wrong", "-1: python's last row", ["last", "-1", "negative"], -1),
    ("wrong", "3: middle row", ["one key", "single key", "only its own"], 3),
    ("wrong", "2", ["one key", "single key", "only its own"], 2),
    ("wrong", "None-like string 'row 0'", ["number", "index", "string", "int"], "row 0"),
    ("right", "0.0", [], 0.0),
    ("right", "np.int64(0)", [], np.int64(0)),
    ("right", "torch tensor 0", [], torch.tensor(0)),
]):
    f = (lambda a: lambda tr: tr.check_unchanged_row(a, 6))(n)
    A(f"08c-{i+1:02d}", 8, "check_unchanged_row", kind, mistake, kw, f, f)

# ---------------------------------------------------------------- lesson 09


def _fwd(causal="is", merge="transpose_reshape", out=True, split_t=True, scale=None, vproj="v", shortcut=False, ret_np=False):
    def my_forward(x_np):
        pt = S["pt_mha"]
        if shortcut:
            return pt(torch.from_numpy(x_np), causal=True)
        x = torch.from_numpy(x_np)
        B, T, _ = x.shape
        h, d_k = pt.n_heads, pt.d_k

        def sp(t):
            return t.view(B, T, h, d_k).transpose(1, 2) if split_t else t.view(B, h, T, d_k)
        q = sp(pt.q_proj(x))
        k = sp(pt.k_proj(x))
        v = sp(pt.v_proj(x) if vproj == "v" else pt.k_proj(x))
        kw = {}
        if causal == "is":
            kw["is_causal"] = True
        elif causal == "triu":
            kw["attn_mask"] = torch.ones(T, T, dtype=torch.bool).triu(1)
        elif causal == "tril":
            kw["attn_mask"] = torch.ones(T, T, dtype=torch.bool).tril()
        if scale is not None:
            kw["scale"] = scale
        heads = F.scaled_dot_product_attention(q, k, v, **kw)
        if merge == "transpose_reshape":
            merged = heads.transpose(1, 2).reshape(B, T, h * d_k)
        elif merge == "no_transpose":
            merged = heads.reshape(B, T, h * d_k)
        elif merge == "view":
            merged = heads.transpose(1, 2).view(B, T, h * d_k)
        elif merge == "contig":
            merged = heads.transpose(1, 2).contiguous().view(B, T, h * d_k)
        o = pt.out_proj(merged) if out else merged
        return o.detach().numpy() if ret_np else o
    return my_forward


for i, (kind, mistake, kw, fn) in enumerate([
    ("wrong", "forgot is_causal=True", ["causal", "mask", "future"], _fwd(causal=None)),
    ("wrong", "no transpose before the merge", ["transpose", "merge"], _fwd(merge="no_transpose")),
    ("wrong", ".view after the transpose (fails on math kernel)", ["view", "contiguous", "reshape"], _fwd(merge="view")),
    ("wrong", "out_proj left out", ["out_proj", "output projection", "w_o", "missing layer"], _fwd(out=False)),
    ("wrong", "causal mask in nn.MultiheadAttention's convention triu(1) handed to SDPA", ["convention", "true = may attend", "invert", "flipped", "triu"], _fwd(causal="triu")),
    ("wrong", "shortcut: calls pt_mha itself", ["pt_mha", "guard", "refused", "package", "not allowed"], _fwd(shortcut=True)),
    ("wrong", "split without transpose: view(B, h, T, d_k)", ["transpose", "split", "heads"], _fwd(split_t=False)),
    ("wrong", "scale=1.0 (no 1/sqrt(d_k))", ["scale", "sqrt", "temperature"], _fwd(scale=1.0)),
    ("wrong", "k_proj used for v", ["v_proj", "value", "k_proj"], _fwd(vproj="k")),
    ("right", "returns numpy", [], _fwd(ret_np=True)),
    ("right", "explicit tril bool mask", [], _fwd(causal="tril")),
    ("right", ".contiguous().view merge", [], _fwd(merge="contig")),
]):
    f = (lambda a: lambda tr: tr.check_forward(a, S["np_mha"]))(fn)
    A(f"09a-{i+1:02d}", 9, "check_forward", kind, mistake, kw, f, f)


def _pad_case(kind_):
    B, T = 2, 6
    pt, x = S["pt_mha"], S["x"]
    pad = torch.ones(B, T, T, dtype=torch.bool)
    pad[0, :, 3:] = False
    mask_for_module = pad
    out_kw = dict(causal=True)
    if kind_ == "inverted":
        pad = ~pad
        mask_for_module = pad
    elif kind_ == "rows":
        pad = torch.ones(B, T, T, dtype=torch.bool)
        pad[0, 3:, :] = False
        mask_for_module = pad
    elif kind_ == "realkeys":
        pad = torch.ones(B, T, T, dtype=torch.bool)
        pad[0, :, :3] = False
        mask_for_module = pad
    elif kind_ == "item1":
        pad = torch.ones(B, T, T, dtype=torch.bool)
        pad[1, :, 3:] = False
        mask_for_module = pad
    elif kind_ == "offby1":
        pad = torch.ones(B, T, T, dtype=torch.bool)
        pad[0, :, 4:] = False
        mask_for_module = pad
    elif kind_ == "nomask_out":
        mask_for_module = None
    elif kind_ == "nocausal_out":
        out_kw = {}
    elif kind_ == "both_items":
        pad = torch.ones(T, T, dtype=torch.bool)
        pad[:, 3:] = False
        mask_for_module = pad
    elif kind_ == "numpy_out":
        pass
    elif kind_ == "numpy_pad":
        pad = (np.arange(T)[None, None, :] < np.array([3, 6])[:, None, None]) & np.ones((B, T, 1), bool)
        mask_for_module = torch.from_numpy(pad)
    elif kind_ == "arange":
        pad = (torch.arange(T)[None, None, :] < torch.tensor([3, 6])[:, None, None]).expand(B, T, T)
        mask_for_module = pad
    with torch.no_grad():
        if mask_for_module is None:
            out = pt(x, **out_kw)
        else:
            out = pt(x, mask=mask_for_module, **out_kw)
    if kind_ == "numpy_out":
        out = out.numpy()
    return pad, out


for i, (kind, mistake, kw, k_) in enumerate([
    ("wrong", "pad inverted (True = padding, key_padding_mask convention)", ["invert", "true = blocked", "convention", "~", "key_padding_mask"], "inverted"),
    ("wrong", "masked the padded queries (rows) instead of the keys", ["quer", "rows", "instead of the keys", "axis"], "rows"),
    ("wrong", "masked the real keys 0-2 instead of the pads", ["real", "wrong keys", "first three", "keys 0"], "realkeys"),
    ("wrong", "masked item 1 instead of item 0", ["item 1", "wrong item", "batch"], "item1"),
    ("wrong", "off by one: keys 4, 5 masked, key 3 left open", ["off by one", "key 3", "one pad"], "offby1"),
    ("wrong", "out_padded computed without passing the mask", ["without the mask", "mask=", "not passed", "out_padded"], "nomask_out"),
    ("wrong", "out_padded without causal=True", ["causal"], "nocausal_out"),
    ("wrong", "one (T, T) mask for both items: item 1 padded too", ["item 1", "both items", "batch", "shape"], "both_items"),
    ("right", "out_padded as numpy", [], "numpy_out"),
    ("right", "pad built in numpy by broadcasting", [], "numpy_pad"),
    ("right", "pad via torch.arange comparison, expanded", [], "arange"),
]):
    f = (lambda kk: lambda tr: tr.check_padding(*_pad_case(kk), S["pt_mha"], S["x"]))(k_)
    A(f"09b-{i+1:02d}", 9, "check_padding", kind, mistake, kw, f, f)

# ---------------------------------------------------------------- lesson 10
for i, (kind, mistake, kw, ans) in enumerate([
    ("wrong", "shift in the wrong direction: t-3", ["direction", "sign", "minus", "backward", "t - 3"], [5, 6, 7, 0, 1, 2, 3, 4]),
    ("wrong", "no wrap-around: t+3 without mod", ["wrap", "mod", "modulo", "out of range"], [3, 4, 5, 6, 7, 8, 9, 10]),
    ("wrong", "identity: each query reads itself", ["diagonal", "itself", "own position", "shift"], list(range(8))),
    ("wrong", "shift 2 (off by one)", ["off by one", "shift", "by 2", "one short"], [(t + 2) % 8 for t in range(8)]),
    ("wrong", "shift 4 (off by one)", ["off by one", "shift", "by 4", "one too far"], [(t + 4) % 8 for t in range(8)]),
    ("wrong", "answer = read (the measurement)", ["measured", "refused", "measurement", "read"], "READ"),
    ("wrong", "answer computed from read ([int(k) for k in read])", ["measured", "refused", "measurement", "computed from"], "READLIST"),
    ("wrong", "clipped at 7 instead of wrapping", ["wrap", "mod", "modulo", "clip"], [3, 4, 5, 6, 7, 7, 7, 7]),
    ("wrong", "only 7 entries", ["8", "eight", "length", "one per query"], [3, 4, 5, 6, 7, 0, 1]),
    ("right", "numpy array", [], np.array([3, 4, 5, 6, 7, 0, 1, 2])),
    ("right", "torch tensor", [], torch.tensor([3, 4, 5, 6, 7, 0, 1, 2])),
    ("right", "floats", [], [3.0, 4.0, 5.0, 6.0, 7.0, 0.0, 1.0, 2.0]),
]):
    def f(tr, ans=ans):
        a = ans
        if isinstance(a, str) and a == "READ":
            a = S["read"]
        elif isinstance(a, str) and a == "READLIST":
            a = [int(k) for k in S["read"]]
        return tr.check_rotation_keys(a, read=S["read"])
    A(f"10-{i+1:02d}", 10, "check_rotation_keys", kind, mistake, kw, f, f)

# ---------------------------------------------------------------- lesson 11
for i, (kind, mistake, kw, g) in enumerate([
    ("wrong", "float32: 4 bytes a number", ["4 bytes", "float32", "2 bytes", "bfloat16"], 8.0),
    ("wrong", "1 byte a number", ["1 byte", "2 bytes", "bfloat16", "byte"], 2.0),
    ("wrong", "bytes, not GiB", ["bytes", "2**30", "2^30", "unit", "gib"], 4294967296),
    ("wrong", "GB (1e9) instead of GiB", ["1e9", "10**9", "gb", "gib", "10^9"], 4.294967296),
    ("wrong", "forgot the 32 heads", ["head", "32"], 0.125),
    ("wrong", "T not squared (T*h*2 bytes)", ["t * t", "t×t", "square", "(t, t)", "t²", "once"], 32 * 8192 * 2 / 2 ** 30),
    ("wrong", "float64, 8 bytes", ["8 bytes", "float64", "2 bytes", "bfloat16"], 16.0),
    ("wrong", "MiB instead of GiB", ["mib", "unit", "1024", "2**20"], 4096.0),
    ("wrong", "heads counted twice (h*h)", ["head", "twice", "32"], 128.0),
    ("right", "int 4", [], 4),
    ("right", "np.float64", [], np.float64(4.0)),
    ("right", "torch tensor", [], torch.tensor(4.0)),
]):
    f = (lambda a: lambda tr: tr.check_score_gib(a))(g)
    A(f"11a-{i+1:02d}", 11, "check_score_gib", kind, mistake, kw, f, f)

from torch.nn.attention import SDPBackend  # noqa: E402
for i, (kind, mistake, kw, k_) in enumerate([
    ("wrong", "flash (the CPU flash kernel refuses dropout)", ["dropout", "refuse", "dropout_p"], "flash"),
    ("wrong", "memory-efficient (CUDA only)", ["cuda", "gpu", "not on", "cpu"], "efficient"),
    ("wrong", "cudnn (CUDA only)", ["cuda", "gpu", "not on", "cpu"], "cudnn"),
    ("wrong", "FLASH_ATTENTION enum name", ["dropout", "refuse", "dropout_p"], "FLASH_ATTENTION"),
    ("wrong", "'default'", ["flash\" or \"math", "one of", "default", "which kernel"], "default"),
    ("right", "'Math' capitalised", [], "Math"),
    ("right", "'MATH'", [], "MATH"),
    ("right", "SDPBackend.MATH", [], SDPBackend.MATH),
    ("right", "' math ' with spaces", [], " math "),
]):
    f = (lambda a: lambda tr: tr.check_dropout_kernel(a, measured=S["measured"]))(k_)
    A(f"11b-{i+1:02d}", 11, "check_dropout_kernel", kind, mistake, kw, f, f)

# ---------------------------------------------------------------- lesson 12
for i, (kind, mistake, kw, ans) in enumerate([
    ("wrong", "diagonal tiles counted as skipped: 36", ["diagonal", "partly", "partial"], (36, 8)),
    ("wrong", "no partial tiles (diagonal forgotten)", ["diagonal", "partial", "partly"], (28, 0)),
    ("wrong", "swapped order (partial, skipped)", ["swap", "order", "other way"], (8, 28)),
    ("wrong", "half of the grid: 32 skipped", ["half", "diagonal", "n(n-1)/2"], (32, 8)),
    ("wrong", "n = 7 blocks (off by one)", ["off by one", "7", "blocks per side"], (21, 7)),
    ("wrong", "counted entries, not tiles", ["entries", "elements", "tiles", "numbers"], (2016, 64)),
    ("wrong", "partial = the full tiles (28, 28)", ["full", "computed in full", "partial"], (28, 28)),
    ("wrong", "diagonal and sub-diagonal partial (28, 15)", ["diagonal", "partial", "below"], (28, 15)),
    ("wrong", "a single number 28", ["two", "pair", "both"], 28),
    ("right", "list", [], [28, 8]),
    ("right", "dict", [], {"skipped": 28, "partial": 8}),
    ("right", "float numpy array", [], np.array([28.0, 8.0])),
]):
    f = (lambda a: lambda tr: tr.check_tile_counts(a))(ans)
    A(f"12-{i+1:02d}", 12, "check_tile_counts", kind, mistake, kw, f, f)

# ---------------------------------------------------------------- lesson 13
for i, (kind, mistake, kw, n) in enumerate([
    ("wrong", "forgot V (factor 2)", ["k and v", "factor 2", "2 (k and v)", "values"], 2097152),
    ("wrong", "float64: 8 bytes a number", ["8 bytes", "float64", "itemsize", "4 bytes"], 8388608),
    ("wrong", "counted numbers, not bytes", ["bytes", "itemsize", "4 bytes", "numbers"], 1048576),
    ("wrong", "K only and numbers (two slips)", ["k and v", "itemsize", "bytes", "factor 2"], 524288),
    ("wrong", "in MiB", ["mib", "unit", "bytes"], 4),
    ("wrong", "in MB (1e6)", ["mb", "unit", "bytes", "10**6"], 4.194304),
    ("wrong", "heads counted twice (h * d_model)", ["head", "twice", "d_model", "h *"], 33554432),
    ("wrong", "times 32 layers", ["layer", "32", "one layer"], 4194304 * 32),
    ("wrong", "max_len 1023 (off by one)", ["off by one", "max_len", "1023", "slot"], 2 * 8 * 1023 * 64 * 4),
    ("right", "float", [], 4194304.0),
    ("right", "4 * 2**20", [], 4 * 2 ** 20),
    ("right", "torch tensor", [], torch.tensor(4194304)),
]):
    f = (lambda a: lambda tr: tr.check_cache_bytes(a))(n)
    A(f"13a-{i+1:02d}", 13, "check_cache_bytes", kind, mistake, kw, f, f)


def _kvc(B, h, max_len, d_k, itemsize):
    from mha.inference.kv_cache import KVCache
    dt = {2: np.float16, 4: np.float32, 8: np.float64}[itemsize]
    return KVCache(B, h, max_len, d_k, dt).nbytes


for i, (kind, mistake, kw, fn, old_ok) in enumerate([
    ("wrong", "forgot the 2 (K and V)", ["k and v", "factor 2", "2 (k and v)", "values"], lambda B, h, m, d, s: B * h * m * d * s, True),
    ("wrong", "V forgotten and 8 bytes hard-coded (cancel at float32)", ["k and v", "itemsize", "cancel", "8 bytes"], lambda B, h, m, d, s: B * h * m * d * 8, True),
    ("wrong", "itemsize ignored, 4 hard-coded", ["itemsize", "4 bytes", "bytes per number", "float32"], lambda B, h, m, d, s: 2 * B * h * m * d * 4, True),
    ("wrong", "forgot the batch B", ["batch", "b ", "the b"], lambda B, h, m, d, s: 2 * h * m * d * s, True),
    ("wrong", "max_len - 1 slots (off by one)", ["off by one", "max_len", "slot"], lambda B, h, m, d, s: 2 * B * h * (m - 1) * d * s, True),
    ("wrong", "calls KVCache(...).nbytes", ["kvcache", "nbytes", "package"], _kvc, False),
    ("wrong", "bits, not bytes (x8)", ["bits", "8", "bytes"], lambda B, h, m, d, s: 2 * B * h * m * d * s * 8, True),
    ("wrong", "heads counted twice (h * h * d_k)", ["head", "twice", "h *", "d_model"], lambda B, h, m, d, s: 2 * B * h * m * (h * d) * s, True),
    ("wrong", "returns MiB", ["mib", "unit", "bytes", "2**20"], lambda B, h, m, d, s: 2 * B * h * m * d * s / 2 ** 20, True),
    ("right", "float result", [], lambda B, h, m, d, s: 2.0 * B * h * m * d * s, True),
    ("right", "np.prod (int64)", [], lambda B, h, m, d, s: np.prod([2, B, h, m, d, s]), True),
    ("right", "K bytes + V bytes", [], lambda B, h, m, d, s: B * h * m * d * s + B * h * m * d * s, True),
]):
    new = (lambda a: lambda tr: tr.check_cache_formula(a))(fn)
    old = (lambda a: lambda tr: tr.check_cache_bytes(a(1, 8, 1024, 64, 4)))(fn) if old_ok else None
    A(f"13b-{i+1:02d}", 13, "check_cache_formula", kind, mistake, kw, new, old)

# ---------------------------------------------------------------- lesson 14
try_lengths = np.array([5, 3, 1])


def dm_right(lengths, T):
    pos = np.arange(T)
    real = pos[None, :] < np.asarray(lengths)[:, None]
    tri = pos[None, :] <= pos[:, None]
    return real[:, None, None, :] & real[:, None, :, None] & tri


def _dm(query=True, key=True, causal=True, le=False, inv=False, head=True, tri_t=False, fmt="bool"):
    def my_decoder_mask(lengths, T):
        pos = np.arange(T)
        L = np.asarray(lengths)[:, None]
        real = (pos[None, :] <= L) if le else (pos[None, :] < L)
        tri = (pos[None, :] >= pos[:, None]) if tri_t else (pos[None, :] <= pos[:, None])
        m = np.ones((len(L), 1, T, T), bool)
        if key:
            m = m & real[:, None, None, :]
        if query:
            m = m & real[:, None, :, None]
        if causal:
            m = m & tri
        if inv:
            m = ~m
        if not head:
            m = m[:, 0]
        if fmt == "add":
            return np.where(m, 0.0, -np.inf)
        if fmt == "fin":
            return np.where(m, 0.0, -1e9)
        if fmt == "01":
            return m.astype(np.float32)
        if fmt == "torch":
            return torch.from_numpy(m)
        return m
    return my_decoder_mask


def _dm_hard(lengths, T):
    return dm_right(try_lengths, 5)


def _dm_pkg(lengths, T):
    from mha.attention import masks
    return masks.padding_mask(lengths, T, causal=True)


for i, (kind, mistake, kw, fn, old_ok) in enumerate([
    ("wrong", "no query term: padded queries' rows stay open", ["query", "padded quer", "rows"], _dm(query=False), True),
    ("wrong", "no causal triangle", ["causal", "triangle", "future", "later keys"], _dm(causal=False), True),
    ("wrong", "off by one: pos <= lengths", ["off by one", "<=", "one pad", "first padded"], _dm(le=True), True),
    ("wrong", "inverted: True = blocked", ["invert", "true = blocked", "~", "flipped"], _dm(inv=True), True),
    ("wrong", "no head axis: (B, T, T)", ["head axis", "(b, 1", "shape", "4-d", "axis"], _dm(head=False), True),
    ("wrong", "triangle transposed (keys at or after the query)", ["transpos", "future", "upper", "after"], _dm(tri_t=True), True),
    ("wrong", "hard-coded try_lengths and T=5", ["hard-coded", "hard coded", "other lengths", "ignores", "argument"], _dm_hard, False),
    ("wrong", "shortcut: masks.padding_mask", ["padding_mask", "package", "guard", "masks."], _dm_pkg, False),
    ("wrong", "additive with finite fill -1e9", ["finite", "-1e9", "fully masked", "uniform", "-inf"], _dm(fmt="fin"), True),
    ("wrong", "0/1 float numbers (SDPA would add them)", ["0/1", "added", "float", "bias", "numbers"], _dm(fmt="01"), True),
    ("wrong", "two slips: no query term and no causal triangle", ["query", "causal", "triangle", "padded quer"], _dm(query=False, causal=False), True),
    ("right", "key term dropped (redundant under causal + right padding)", [], _dm(key=False), True),
    ("right", "additive 0/-inf", [], _dm(fmt="add"), True),
    ("right", "torch bool tensor", [], _dm(fmt="torch"), True),
]):
    new = (lambda a: lambda tr: tr.check_decoder_mask(a))(fn)
    old = (lambda a: lambda tr: tr.check_decoder_mask(a(try_lengths, 5)))(fn) if old_ok else None
    A(f"14-{i+1:02d}", 14, "check_decoder_mask", kind, mistake, kw, new, old)

# ---------------------------------------------------------------- lesson 15


def sb_right(dweights, weights):
    Sn = weights.shape[-1]
    w = weights[..., :, None]
    J = w * np.eye(Sn) - w * weights[..., None, :]
    return np.einsum("...ij,...i->...j", J, dweights)


def _sb_diag(g, w):
    J = w[..., :, None] * np.eye(w.shape[-1])
    return np.einsum("...ij,...i->...j", J, g)


def _sb_ww(g, w):
    wi = w[..., :, None]
    J = wi * np.eye(w.shape[-1]) - w[..., :, None] * w[..., :, None]
    return np.einsum("...ij,...i->...j", J, g)


def _sb_sign(g, w):
    return -sb_right(g, w)


def _sb_zero(g, w):
    wi = w[..., :, None]
    J = wi * np.eye(w.shape[-1]) - wi * w[..., None, :]
    return np.einsum("...ij,...j->...j", J, g)


def _sb_pkg(g, w):
    from mha.training import grad
    return grad.softmax_backward(g, w)


def _sb_nan(g, w):
    return w * (g - (w * g).sum(-1, keepdims=True) / w.sum(-1, keepdims=True))


def _sb_nokeep(g, w):
    return w * (g - (w * g).sum(-1))


def _sb_noterm(g, w):
    return w * g


def _sb_J(g, w):
    wi = w[..., :, None]
    return wi * np.eye(w.shape[-1]) - wi * w[..., None, :]


def _sb_axis(g, w):
    return w * (g - (w * g).sum(-2, keepdims=True))


def _sb_fast(g, w):
    return w * (g - (w * g).sum(axis=-1, keepdims=True))


def _sb_loop(g, w):
    out = np.zeros_like(w)
    for idx in np.ndindex(w.shape[:-1]):
        wr = w[idx]
        J = np.diag(wr) - np.outer(wr, wr)
        out[idx] = g[idx] @ J
    return out


for i, (kind, mistake, kw, fn) in enumerate([
    ("wrong", "kept only diag(w), outer product dropped", ["diag", "outer product", "w w^t", "dropped", "w wᵀ"], _sb_diag),
    ("wrong", "w*w elementwise instead of the outer product", ["elementwise", "w * w", "outer"], _sb_ww),
    ("wrong", "sign flipped", ["sign"], _sb_sign),
    ("wrong", "einsum '...ij,...j->...j': zero everywhere", ["0 everywhere", "zero", "row sum"], _sb_zero),
    ("wrong", "calls grad.softmax_backward", ["grad.softmax_backward", "package", "guard", "not counted"], _sb_pkg),
    ("wrong", "divides by the row sum: NaN on a fully masked row", ["nan", "fully masked", "0/0", "divid"], _sb_nan),
    ("wrong", "fast formula with the row sum broadcast along the wrong axis (no keepdims)", ["keepdims", "broadcast", "axis", "transpos"], _sb_nokeep),
    ("wrong", "dropped the row term: w * g", ["dropped", "term", "row term", "w · g", "subtract"], _sb_noterm),
    ("wrong", "returns J itself (B,h,T,S,S)", ["shape", "jacobian", "(b, h, t, s, s)", "5"], _sb_J),
    ("wrong", "row sum over axis -2 (queries)", ["axis", "wrong axis", "over the queries", "-2"], _sb_axis),
    ("right", "the O(S) formula", [], _sb_fast),
    ("right", "explicit loop with np.outer", [], _sb_loop),
]):
    f = (lambda a: lambda tr: tr.check_softmax_backward(a))(fn)
    A(f"15-{i+1:02d}", 15, "check_softmax_backward", kind, mistake, kw, f, f)

# ---------------------------------------------------------------- lesson 16
for i, (kind, mistake, kw, fn) in enumerate([
    ("wrong", "from 0: arange(t_new)", ["from 0", "offset", "n_cached", "cache", "start at 0"], lambda n, t: np.arange(t)),
    ("wrong", "off by one: n_cached+1 ..", ["off by one", "one too far", "+ 1", "shift"], lambda n, t: np.arange(n + 1, n + t + 1)),
    ("wrong", "off by one: n_cached-1 ..", ["off by one", "one too early", "- 1", "shift"], lambda n, t: np.arange(n - 1, n + t - 1)),
    ("wrong", "hard-coded [5, 6, 7]", ["hard-coded", "hard coded", "other sizes", "fixed", "arguments"], lambda n, t: np.array([5, 6, 7])),
    ("wrong", "all positions arange(n_cached + t_new)", ["length", "all", "t_new", "too many", "cached"], lambda n, t: np.arange(n + t)),
    ("wrong", "every new query at n_cached", ["same position", "every query", "one position", "increase", "repeat"], lambda n, t: np.full(t, n)),
    ("wrong", "arguments swapped: arange(t_new, t_new + n_cached)", ["swap", "argument", "order", "length"], lambda n, t: np.arange(t, t + n)),
    ("wrong", "reversed order", ["revers", "order", "descending", "backward"], lambda n, t: np.arange(n + t - 1, n - 1, -1)),
    ("wrong", "positions of the last cached tokens (n_cached - t_new ..)", ["cached", "last cached", "offset", "already"], lambda n, t: np.arange(n - t, n)),
    ("right", "float array of whole numbers", [], lambda n, t: np.arange(n, n + t).astype(float)),
    ("right", "python list", [], lambda n, t: list(range(n, n + t))),
    ("right", "torch.arange", [], lambda n, t: torch.arange(n, n + t)),
]):
    f = (lambda a: lambda tr: tr.check_chunk_positions(a))(fn)
    A(f"16-{i+1:02d}", 16, "check_chunk_positions", kind, mistake, kw, f, f)

# ---------------------------------------------------------------- lesson 17
lengths17, T17 = [2, 5, 3], 5


def pp_right(lengths, T):
    col = np.arange(T)[None, :]
    start = T - np.asarray(lengths)[:, None]
    pos = col - start
    return np.where(pos >= 0, pos, -1)


def _pp_rightpad(lengths, T):
    col = np.arange(T)[None, :]
    L = np.asarray(lengths)[:, None]
    return np.where(col < L, col, -1)


def _pp_zero(lengths, T):
    pos = np.arange(T)[None, :] - (T - np.asarray(lengths)[:, None])
    return np.where(pos >= 0, pos, 0)


def _pp_from1(lengths, T):
    pos = np.arange(T)[None, :] - (T - np.asarray(lengths)[:, None]) + 1
    return np.where(pos >= 1, pos, -1)


def _pp_nopad(lengths, T):
    return np.tile(np.arange(T), (len(lengths), 1))


def _pp_hard(lengths, T):
    return np.array([[-1, -1, -1, 0, 1], [0, 1, 2, 3, 4], [-1, -1, 0, 1, 2]])


def _pp_off(lengths, T):
    pos = np.arange(T)[None, :] - (T - np.asarray(lengths)[:, None] - 1)
    return np.where(pos >= 0, pos, -1)


def _pp_pkg(lengths, T):
    from mha.modules import compose
    return compose.padded_positions(lengths, T)


def _pp_list(lengths, T):
    pos = np.arange(T)[None, :] - (T - lengths)
    return np.where(pos >= 0, pos, -1)


def _pp_T(lengths, T):
    return pp_right(lengths, T).T


def _pp_neg(lengths, T):
    return np.arange(T)[None, :] - (T - np.asarray(lengths)[:, None])


def _pp_nested(lengths, T):
    return pp_right(lengths, T).tolist()


def _pp_torch(lengths, T):
    return torch.from_numpy(pp_right(lengths, T))


for i, (kind, mistake, kw, fn, old_ok) in enumerate([
    ("wrong", "pads on the right (right padding)", ["right", "left-pad", "left pad", "end in the last column"], _pp_rightpad, True),
    ("wrong", "pads at position 0", ["0", "negative", "pad at position 0", "looks like a first token"], _pp_zero, True),
    ("wrong", "counting from 1", ["from 1", "1-based", "start at 0", "from 0"], _pp_from1, True),
    ("wrong", "padding ignored: 0..T-1 for every row", ["padding", "first column", "no padding", "ignor"], _pp_nopad, True),
    ("wrong", "hard-coded the lesson's batch", ["hard-coded", "hard coded", "other batch", "fixed", "lengths"], _pp_hard, False),
    ("wrong", "off by one: start one column early", ["off by one", "one early", "shift", "one column"], _pp_off, True),
    ("wrong", "calls compose.padded_positions", ["compose", "padded_positions", "guard", "package"], _pp_pkg, False),
    ("wrong", "list lengths not converted: T - list raises TypeError", ["list", "typeerror", "asarray", "unsupported operand", "error"], _pp_list, False),
    ("wrong", "transposed (T, B)", ["transpos", "shape", "(b, t)", "(t, b)"], _pp_T, True),
    ("right", "pads -3..-1 (any negative)", [], _pp_neg, True),
    ("right", "nested list", [], _pp_nested, True),
    ("right", "torch tensor", [], _pp_torch, True),
]):
    new = (lambda a: lambda tr: tr.check_padded_positions(a, lengths17, T17))(fn)
    old = (lambda a: lambda tr: tr.check_padded_positions(a(lengths17, T17), lengths17, T17))(fn) if old_ok else None
    A(f"17-{i+1:02d}", 17, "check_padded_positions", kind, mistake, kw, new, old)

# ---------------------------------------------------------------- lesson 18


def _rb_pkg(B, h, T, W, d_k, itemsize):
    from mha.parallel import ring as parallel
    return (W - 1) * parallel.ring_bytes_per_step(B, h, T, W, d_k, itemsize)


for i, (kind, mistake, kw, fn) in enumerate([
    ("wrong", "W steps instead of W-1", ["w - 1", "w-1", "one step too many", "w steps"], lambda B, h, T, W, d, s: W * 2 * B * h * (T // W) * d * s),
    ("wrong", "forgot V", ["k and v", "factor 2", "2 (k and v)", "values"], lambda B, h, T, W, d, s: (W - 1) * B * h * (T // W) * d * s),
    ("wrong", "forgot /W: the whole sequence's K, V per step", ["/ w", "/w", "own tokens", "t / w", "whole sequence", "w (the ranks)"], lambda B, h, T, W, d, s: (W - 1) * 2 * B * h * T * d * s),
    ("wrong", "8 bytes hard-coded", ["itemsize", "8 bytes", "float64", "bytes per number"], lambda B, h, T, W, d, s: (W - 1) * 2 * B * h * (T // W) * d * 8),
    ("wrong", "one step only", ["one step", "w - 1", "w-1", "steps"], lambda B, h, T, W, d, s: 2 * B * h * (T // W) * d * s),
    ("wrong", "V forgotten and 8 bytes (cancel at float32)", ["k and v", "itemsize", "cancel", "8 bytes"], lambda B, h, T, W, d, s: (W - 1) * B * h * (T // W) * d * 8),
    ("wrong", "halved for the causal mask", ["causal", "half", "every block", "passes"], lambda B, h, T, W, d, s: (W - 1) * B * h * (T // W) * d * s),
    ("wrong", "calls parallel.ring_bytes_per_step", ["ring_bytes_per_step", "package", "guard", "positions"], _rb_pkg),
    ("wrong", "whole ring: summed over all W ranks", ["all ranks", "per rank", "one rank", "w ranks", "whole ring"], lambda B, h, T, W, d, s: W * (W - 1) * 2 * B * h * (T // W) * d * s),
    ("right", "float division T / W", [], lambda B, h, T, W, d, s: (W - 1) * 2 * B * h * T / W * d * s),
    ("right", "rearranged integer formula", [], lambda B, h, T, W, d, s: 2 * (W - 1) * B * h * T * d * s // W),
    ("right", "np.int64 result", [], lambda B, h, T, W, d, s: np.int64(2) * (W - 1) * B * h * (T // W) * d * s),
]):
    new = (lambda a: lambda tr: tr.check_ring_bytes(a, B=1, h=8, T=4096, W=4, d_k=64, itemsize=4))(fn)
    old = (lambda a: lambda tr: tr.check_ring_bytes(a(1, 8, 4096, 4, 64, 4), B=1, h=8, T=4096, W=4, d_k=64, itemsize=4))(fn)
    A(f"18-{i+1:02d}", 18, "check_ring_bytes", kind, mistake, kw, new, old)

MODULES = {1: "attention_from_scratch", 2: "qkv_projection", 3: "split_heads", 4: "scaled_scores",
           5: "causal_mask", 6: "softmax", 7: "weighted_sum", 8: "merge_and_output", 9: "pytorch_port",
           10: "attention_that_learns", 11: "sdpa_backends", 12: "flash_attention", 13: "kv_cache",
           14: "padding_masks", 15: "backward_pass", 16: "positions_and_variants", 17: "generation",
           18: "attention_across_devices"}
