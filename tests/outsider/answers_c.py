"""Third held-out set of student answers (blind): three personas, lessons 01-18."""
import numpy as np

ANSWERS = []
_CTX = {}


def A(id, lesson, check, kind, mistake, keywords, run_new, run_old=None):
    ANSWERS.append(dict(id=id, lesson=lesson, check=check, kind=kind, mistake=mistake,
                        keywords=keywords, run_new=run_new, run_old=run_old))


def ctx(lesson):
    """The notebook setup a lesson's Try-it needs (built once per worker)."""
    if lesson in _CTX:
        return _CTX[lesson]
    c = {}
    if lesson == 2:
        from mha import steps
        from mha.modules.numpy_mha import MultiHeadAttention
        B, T, d_model, n_heads = 2, 4, 8, 2
        rng = np.random.default_rng(0)
        x = rng.normal(0.0, 1.0, (B, T, d_model))
        m = MultiHeadAttention(d_model, n_heads, seed=0)
        W_qkv = np.concatenate([m.Wq, m.Wk, m.Wv], axis=1)
        b_qkv = np.concatenate([m.bq, m.bk, m.bv])
        qkv = steps.linear(x, W_qkv, b_qkv)
        q2, k2, v2 = np.split(qkv, 3, axis=-1)
        c.update(B=B, T=T, d_model=d_model, n_heads=n_heads, qkv=qkv, q2=q2)
    if lesson == 9:
        import torch
        from mha.modules import numpy_mha
        from mha.modules.torch_mha import MultiHeadAttention
        torch.manual_seed(0)
        B, T, d_model, n_heads = 2, 6, 512, 8
        np_mha = numpy_mha.MultiHeadAttention(d_model, n_heads, seed=42)
        pt_mha = MultiHeadAttention(d_model, n_heads, seed=42, dtype=torch.float64)
        x_np = np.random.default_rng(0).normal(0.0, 1.0, (B, T, d_model))
        x = torch.from_numpy(x_np)
        c.update(B=B, T=T, d_model=d_model, n_heads=n_heads, np_mha=np_mha, pt_mha=pt_mha, x=x)
    if lesson == 10:
        import torch
        from mha.training import train as tr

        def rotation_batch(generator, B, T, vocab):
            x = torch.randint(0, vocab, (B, T), generator=generator)
            return x, x.roll(-3, dims=1)

        rotation = tr.Task("rotation", T=8, vocab=10, causal=False, make=rotation_batch)
        model_rot = tr.TinyTransformer.for_task(rotation, d_model=32, n_heads=1, n_layers=1, seed=0)
        tr.train(model_rot, rotation, steps=200, lr=3e-3, progress=False)
        x_rot, y_rot = rotation.batch(torch.Generator().manual_seed(7), 512)
        maps_rot = tr.attention_maps(model_rot, x_rot)[0].mean(dim=0)[0]
        c.update(argmax=maps_rot.argmax(dim=-1))
    if lesson == 11:
        import torch
        from mha.perf import bench
        torch.manual_seed(0)
        q_try = torch.randn(1, 8, 256, 64)
        c.update(measured=bench.kernel_that_runs(q_try, q_try, q_try, dropout_p=0.1))
    _CTX[lesson] = c
    return c


# ---------------------------------------------------------------- 01 window mask (T=8, window 3)
T1 = 8
_i1 = np.arange(T1)
ALLOWED1 = (_i1[None, :] <= _i1[:, None]) & (_i1[None, :] >= _i1[:, None] - 2)  # right


def _l01(n, kind, mistake, kw, mask):
    A(f"01-{n:02d}", 1, "check_window_mask", kind, mistake, kw,
      lambda t, m=mask: t.check_window_mask(m() if callable(m) else m, T=T1, window=3),
      lambda t, m=mask: t.check_window_mask(m() if callable(m) else m, T=T1, window=3))


_l01(1, "right", "0/1 float mask from tril minus tril(-3)", [],
     np.tril(np.ones((T1, T1))) - np.tril(np.ones((T1, T1)), -3))
_l01(2, "right", "additive 0 / -inf mask", [], np.where(ALLOWED1, 0.0, -np.inf))
_l01(3, "wrong", "plain causal staircase, no window (hurried)", ["staircase", "causal", "whole past", "no window"],
     np.tril(np.ones((T1, T1), bool)))
_l01(4, "wrong", "window of 4 keys (t-3..t): off by one", ["too long", "too many", "4 keys", "four keys", "off by one"],
     np.tril(np.ones((T1, T1), bool)) & np.triu(np.ones((T1, T1), bool), -3))
_l01(5, "wrong", "diagonal left out: keys t-3..t-1", ["diagonal", "itself", "own key"],
     np.tril(np.ones((T1, T1), bool), -1) & np.triu(np.ones((T1, T1), bool), -3))
_l01(6, "wrong", "Keras convention: True = masked", ["blocked", "inverted", "convention", "flipped"], ~ALLOWED1)
_l01(7, "wrong", "transposed: window over the next keys", ["transpos", "future", "upper", "later keys"], ALLOWED1.T.copy())
_l01(8, "wrong", "two slips: True = masked AND transposed", ["inverted", "transpos", "blocked"], (~ALLOWED1).T.copy())
_l01(9, "wrong", "symmetric band |t-s|<=2 (thinks a moving average is centred)", ["future", "later", "both sides", "symmetric", "ahead"],
     np.abs(_i1[:, None] - _i1[None, :]) <= 2)
_l01(10, "wrong", "two slips: Keras additive mask sign flipped: -1e9 on the allowed keys", ["inverted", "blocked", "wrong way round", "flipped"],
     np.where(ALLOWED1, -1e9, 0.0))
_l01(11, "wrong", "shape typo: (7, 7) mask built for T-1", ["shape", "(7, 7)", "(8, 8)"], ALLOWED1[:7, :7].copy())


# ---------------------------------------------------------------- 02 split of the fused qkv
def _l02(n, kind, mistake, kw, pred, myq, old=True):
    def new(t):
        c = ctx(2)
        return t.check_split(pred, myq(c), c["qkv"], c["q2"])

    def oldf(t):
        c = ctx(2)
        return t.check_split(pred, myq(c), c["qkv"])
    A(f"02-{n:02d}", 2, "check_split", kind, mistake, kw, new, oldf if old else None)


_l02(1, "right", "np.False_ and the (B,T,3,d_model) reshape, index with ..., 0, :", [], np.False_,
     lambda c: c["qkv"].reshape(c["B"], c["T"], 3, c["d_model"])[..., 0, :])
_l02(2, "right", "prediction 0 (int) and a slice view qkv[..., :d_model]", [], 0,
     lambda c: c["qkv"][..., :c["d_model"]])
_l02(3, "wrong", "prediction True (believes the classmate), reshape right", ["prediction", "classmate", "interleav", "every third"], True,
     lambda c: c["qkv"].reshape(c["B"], c["T"], 3, c["d_model"])[:, :, 0])
_l02(4, "wrong", "the classmate's reshape (B,T,d_model,3)[...,0] itself", ["interleav", "every third", "d_model, 3", "stride"], False,
     lambda c: c["qkv"].reshape(c["B"], c["T"], c["d_model"], 3)[..., 0])
_l02(5, "wrong", "index 1 of the (B,T,3,d) reshape: that is k", ["k ", "keys", "second block", "index 1", "block 1"], False,
     lambda c: c["qkv"].reshape(c["B"], c["T"], 3, c["d_model"])[:, :, 1])
_l02(6, "wrong", "passes the lesson's q2", ["q2"], False, lambda c: c["q2"])
_l02(7, "wrong", "a copy, not a view", ["copy", "view"], False,
     lambda c: c["qkv"].reshape(c["B"], c["T"], 3, c["d_model"])[:, :, 0].copy())
_l02(8, "wrong", "two slips: prediction True and the classmate's interleaved reshape", ["interleav", "every third", "prediction"], True,
     lambda c: c["qkv"].reshape(c["B"], c["T"], c["d_model"], 3)[..., 0])
_l02(9, "wrong", "splits heads too: (B,T,3,h,d_k)[:, :, 0], shape (B,T,h,d_k)", ["shape", "heads", "(2, 4, 8)"], False,
     lambda c: c["qkv"].reshape(c["B"], c["T"], 3, c["n_heads"], c["d_model"] // c["n_heads"])[:, :, 0])
_l02(10, "wrong", "two slips: (B,3,T,d) order (channels-first habit) and prediction 'no'", ["order", "axis", "(b, 3, t", "tokens", "true or false"], "no",
     lambda c: c["qkv"].reshape(c["B"], 3, c["T"], c["d_model"])[:, 0])


# ---------------------------------------------------------------- 03 harmless rule
def _l03(n, kind, mistake, kw, rule):
    A(f"03-{n:02d}", 3, "check_harmless_rule", kind, mistake, kw,
      lambda t: t.check_harmless_rule(rule), lambda t: t.check_harmless_rule(rule))


def _r03_ok(B, T, d_model, h):
    return T == 1 or h == 1


def _r03_ok2(B, T, d_model, h):
    return (h - 1) * (T - 1) == 0


def _r03_h(B, T, d_model, h):
    return h == 1


def _r03_T(B, T, d_model, h):
    return T == 1


def _r03_div(B, T, d_model, h):
    return d_model % h == 0


def _r03_sq(B, T, d_model, h):
    return T == h


def _r03_B(B, T, d_model, h):
    return B == 1


def _r03_and(B, T, d_model, h):
    return h == 1 and T == 1


def _r03_dk1(B, T, d_model, h):
    return d_model == h


def _r03_order(B, h, T, d_model):  # arguments written in the (B, h, T, d) order of split heads
    return h == 1 or T == 1


def _r03_runs(B, T, d_model, h):
    from mha_course import planted
    from mha import steps
    x = np.random.default_rng(0).normal(size=(B, T, d_model))
    return bool(np.allclose(planted.merge_no_transpose(steps.split_heads(x, h)), x))


_l03(1, "right", "T == 1 or h == 1", [], _r03_ok)
_l03(2, "right", "(h-1)*(T-1) == 0 (numpy-free arithmetic form)", [], _r03_ok2)
_l03(3, "wrong", "only h == 1 (forgets one token)", ["t = 1", "t == 1", "one token", "single token"], _r03_h)
_l03(4, "wrong", "only T == 1 (forgets one head)", ["h = 1", "h == 1", "one head", "single head"], _r03_T)
_l03(5, "wrong", "d_model divisible by h (always true: thinks the bug is about divisibility)", ["always", "every shape", "divisib"], _r03_div)
_l03(6, "wrong", "T == h (thinks a square transpose is harmless)", ["t == h", "square", "t = h", "equal"], _r03_sq)
_l03(7, "wrong", "B == 1 (thinks the batch matters)", ["batch", "b = 1", "b == 1"], _r03_B)
_l03(8, "wrong", "h == 1 and T == 1 ('and' for 'or')", [" and ", "both", "either"], _r03_and)
_l03(9, "wrong", "d_model == h (d_k = 1), confused model", ["d_k", "d_model == h", "d_k = 1"], _r03_dk1)
_l03(10, "wrong", "two slips: arguments in (B, h, T, d) order, so 'h' is T and 'T' is d_model", ["order", "argument", "d_model"], _r03_order)
_l03(11, "wrong", "shortcut: runs the planted round trip itself", ["planted", "steps", "refused", "round trip itself"], _r03_runs)


# ---------------------------------------------------------------- 04 variance and divisor (sigma2=4, d_k=64)
def _l04(n, kind, mistake, kw, var, div):
    f = lambda t: t.check_variance_and_divisor(var, div, sigma2=4.0, d_k=64)
    A(f"04-{n:02d}", 4, "check_variance_and_divisor", kind, mistake, kw, f, f)


_l04(1, "right", "floats 16.0 and 32.0", [], 16.0, 32.0)
_l04(2, "right", "numpy int and python int", [], np.int64(16), 32)
_l04(3, "wrong", "variance sigma^2 = 4 (one factor), divisor sqrt(d_k)*sigma^2 right", ["sigma^4", "σ⁴", "σ^4", "squared", "both q and k", "sigma**4", "16 = "], 4, 32)
_l04(4, "wrong", "divisor stays sqrt(d_k) = 8", ["sigma", "σ", "variance of the inputs", "input variance", "forgot"], 16, 8)
_l04(5, "wrong", "divisor = the variance d_k*sigma^4, not its square root", ["square root", "sqrt", "standard deviation", "variance instead"], 16, 1024)
_l04(6, "wrong", "variance of the unscaled q.k (1024)", ["d_k", "sqrt(d_k)", "unscaled", "divid"], 1024, 32)
_l04(7, "wrong", "two slips: variance 2 sigma^2 = 8 and divisor 16", ["sigma^4", "σ⁴", "σ^4", "squared", "sigma²", "σ²"], 8, 16)
_l04(8, "wrong", "hurried: the sigma = 1 answers of the lesson (1, 8)", ["sigma", "σ", "variance 4", "variance of 4"], 1, 8)
_l04(9, "wrong", "two slips: scale by std: variance 4, divisor sqrt(d_k)*sigma = 16", ["sigma^4", "σ⁴", "squared", "standard deviation"], 4, 16)
_l04(10, "wrong", "divisor written as a multiplier 1/32", ["multipl", "reciprocal", "1/", "invert"], 16, 1 / 32)


# ---------------------------------------------------------------- 05 sliding window from causal_mask (T=6)
def _causal(T):
    return np.tril(np.ones((T, T), bool))


T5 = 6
WIN5 = np.triu(_causal(T5), -2)


def _l05(n, kind, mistake, kw, mask):
    f = lambda t, m=mask: t.check_window(m() if callable(m) else m, T5)
    A(f"05-{n:02d}", 5, "check_window", kind, mistake, kw, f, f)


def _torch_win():
    import torch
    return torch.from_numpy(WIN5.copy())


_l05(1, "right", "np.triu(causal, -2) as a torch bool tensor", [], _torch_win)
_l05(2, "right", "(1, 1, T, T) broadcastable mask (batch and head axes)", [], WIN5[None, None].copy())
_l05(3, "wrong", "np.triu(causal, -3): window one key too long", ["too long", "too many", "off by one", "four keys", "4 keys"], np.triu(_causal(T5), -3))
_l05(4, "wrong", "np.triu(causal, -1): window one key too short", ["too short", "too few", "off by one", "two keys", "2 keys"], np.triu(_causal(T5), -1))
_l05(5, "wrong", "np.triu(causal, 2): sign of the offset wrong", ["sign", "offset"], np.triu(_causal(T5), 2))
_l05(6, "wrong", "TF convention: True = blocked", ["true = blocked", "blocked", "inverted", "convention"], ~WIN5)
_l05(7, "wrong", "transposed window", ["transpos", "future", "upper"], WIN5.T.copy())
_l05(8, "wrong", "two slips: additive -1e9 mask AND window too long", ["too long", "too many", "off by one", "four keys"],
     np.where(np.triu(_causal(T5), -3), 0.0, -1e9))
_l05(9, "wrong", "two slips: float16 0/1 AND window too short", ["too short", "too few", "off by one"], np.triu(_causal(T5), -1).astype(np.float16))
_l05(10, "wrong", "confused: window over t..t+2 (future)", ["future", "transpos", "ahead", "upper", "later"],
     np.tril(np.triu(np.ones((T5, T5), bool), 0), 2))


# ---------------------------------------------------------------- 06 mean-shift overflow row
def _l06(n, kind, mistake, kw, row):
    f = lambda t, r=row: t.check_mean_overflow(r() if callable(r) else r)
    A(f"06-{n:02d}", 6, "check_mean_overflow", kind, mistake, kw, f, f)


def _t06():
    import torch
    return torch.tensor([0.0, 0.0, 0.0, 3000.0], dtype=torch.float64)


_l06(1, "right", "[0, 1500] as a list", [], [0, 1500])
_l06(2, "right", "torch float64 tensor [0,0,0,3000]", [], _t06)
_l06(3, "right", "[-800, 800, -800, 800] numpy array (also overflows without a shift)", [], np.array([-800.0, 800.0, -800.0, 800.0]))
_l06(4, "wrong", "all equal [800, 800]", ["equal", "same value", "constant"], [800, 800])
_l06(5, "wrong", "[720, 0]: overflows only without a shift", ["without any shift", "without a shift", "only without", "no shift", "unshifted"], [720.0, 0.0])
_l06(6, "wrong", "[1000, 1001, 1002] (the lesson's row): only without a shift", ["without any shift", "without a shift", "no shift", "only without", "unshifted"], [1000, 1001, 1002])
_l06(7, "wrong", "contains inf", ["finite", "inf"], [0.0, np.inf])
_l06(8, "wrong", "two slips: NaN and a huge value", ["nan", "finite"], [np.nan, 1e308])
_l06(9, "wrong", "float16 habit: [0, 30] overflows in float16 only", ["float16", "float64", "dtype", "no overflow", "nothing overflows"], np.array([0, 30], dtype=np.float16))
_l06(10, "wrong", "a single logit [1500]", ["one value", "single", "one logit", "one number", "equal"], [1500.0])
_l06(11, "wrong", "[700, 705]: nothing overflows at all", ["no overflow", "nothing overflows", "does not overflow", "fits", "neither"], [700.0, 705.0])


# ---------------------------------------------------------------- 07 uniform weights, functions of v
V_TRY = np.random.default_rng(7).normal(size=(1, 1, 4, 2))


def _nm_ok(v):
    return np.broadcast_to(v.mean(axis=2, keepdims=True), v.shape).copy()


def _c_ok(v):
    S = v.shape[2]
    return np.cumsum(v, axis=2) / np.arange(1, S + 1)[:, None]


def _nm_ok2(v):
    return np.repeat(v.mean(-2, keepdims=True), v.shape[-2], axis=-2)


def _c_ok2(v):
    return np.stack([v[..., : t + 1, :].mean(-2) for t in range(v.shape[-2])], axis=-2)


def _nm_axis(v):
    return np.broadcast_to(v.mean(-1, keepdims=True), v.shape).copy()


def _nm_sum(v):
    return np.broadcast_to(v.sum(axis=2, keepdims=True), v.shape).copy()


def _c_sum(v):
    return np.cumsum(v, axis=2)


def _c_off(v):
    return np.cumsum(v, axis=2) / (np.arange(v.shape[2]) + 2)[:, None]


def _c_rev(v):
    r = np.cumsum(v[..., ::-1, :], axis=2)[..., ::-1, :]
    return r / np.arange(v.shape[2], 0, -1)[:, None]


def _nm_hard(v):
    return np.broadcast_to(V_TRY.mean(axis=2, keepdims=True), V_TRY.shape).copy()


def _c_hard(v):
    return np.cumsum(V_TRY, axis=2) / np.arange(1, 5)[:, None]


def _nm_steps(v):
    from mha import steps
    S = v.shape[2]
    return steps.weighted_sum(steps.softmax(np.zeros(v.shape[:2] + (S, S))), v)


def _c_steps(v):
    from mha import steps
    S = v.shape[2]
    return steps.weighted_sum(steps.masked_softmax(np.zeros(v.shape[:2] + (S, S)), steps.causal_mask(S)), v)


def _nm_noshape(v):
    return v.mean(axis=2, keepdims=True)


def _nm_jax(v):
    return np.broadcast_to(v.mean(axis=1, keepdims=True), v.shape).copy()


def _c_divS(v):
    return np.cumsum(v, axis=2) / v.shape[2]


def _l07(n, kind, mistake, kw, nm, c, old=True):
    A(f"07-{n:02d}", 7, "check_uniform", kind, mistake, kw,
      lambda t: t.check_uniform(nm, c, V_TRY),
      (lambda t: t.check_uniform(nm(V_TRY), c(V_TRY), V_TRY)) if old else None)


_l07(1, "right", "broadcast mean and cumsum / counts", [], _nm_ok, _c_ok)
_l07(2, "right", "np.repeat of the mean, loop of prefix means", [], _nm_ok2, _c_ok2)
_l07(3, "wrong", "no-mask mean over d_k (wrong axis)", ["wrong axis", "axis", "d_k"], _nm_axis, _c_ok)
_l07(4, "wrong", "sum instead of mean, both", ["sum instead", "sum", "not divided", "instead of a mean"], _nm_sum, _c_sum)
_l07(5, "wrong", "causal running mean off by one (divides by t+2)", ["off by one", "t + 2", "one too many"], _nm_ok, _c_off)
_l07(6, "wrong", "causal mask ignored (same as no mask)", ["mask ignored", "ignored", "no mask", "same as", "without the mask"], _nm_ok, _nm_ok)
_l07(7, "wrong", "causal the wrong way (means over the future keys; row-vs-column mix-up)", ["future", "anti", "upper", "revers", "later"], _nm_ok, _c_rev)
_l07(8, "wrong", "hard-coded v_try inside the functions", ["hard-coded", "hard coded", "another shape", "second v", "other shape", "other v"], _nm_hard, _c_hard, old=False)
_l07(9, "wrong", "shortcut: calls steps", ["steps", "not allowed", "guard", "refused"], _nm_steps, _c_steps, old=False)
_l07(10, "wrong", "two slips: mean without broadcasting (B,h,1,d_k) and causal sum", ["shape", "broadcast", "sum"], _nm_noshape, _c_sum)
_l07(11, "wrong", "JAX (B,T,h,d) habit: mean over axis 1 (heads)", ["axis", "heads", "wrong axis"], _nm_jax, _c_ok)
_l07(12, "wrong", "two slips: causal divides by S for every row, and wrong-axis mean", ["divid", "count", "number of keys", "axis"], _nm_axis, _c_divS)


# ---------------------------------------------------------------- 08 three questions
def _l08(n, check, kind, mistake, kw, val):
    if check == "check_favoured_keys":
        f = lambda t: t.check_favoured_keys(val)
    else:
        f = lambda t: getattr(t, check)(val, 6)
    A(f"08-{n:02d}", 8, check, kind, mistake, kw, f, f)


_l08(1, "check_favoured_keys", "right", "2.0 float", [], 2.0)
_l08(2, "check_favoured_keys", "right", "np.int32(2)", [], np.int32(2))
_l08(3, "check_favoured_keys", "wrong", "1: forgets that the sign of q flips the favourite", ["sign", "negative", "smallest", "minimum"], 1)
_l08(4, "check_favoured_keys", "wrong", "16: the number of heads", ["head"], 16)
_l08(5, "check_favoured_keys", "wrong", "6: every row its own key, T of the explorer", ["every key", "each row", "t =", "own key"], 6)
_l08(6, "check_favoured_keys", "wrong", "4: d_k of the default explorer (h=4)", ["d_k", "16"], 4)
_l08(7, "check_favoured_keys", "wrong", "2.5: not a whole number", ["whole", "integer"], 2.5)
_l08(8, "check_favoured_keys", "wrong", "two slips: 2 per head times 16 heads = 32", ["head", "per head"], 32)
_l08(11, "check_zeros_per_head", "right", "15.0 float", [], 15.0)
_l08(12, "check_zeros_per_head", "right", "np.int64(15)", [], np.int64(15))
_l08(13, "check_zeros_per_head", "wrong", "21: the diagonal counted in", ["diagonal"], 21)
_l08(14, "check_zeros_per_head", "wrong", "60: all 4 heads", ["heads", "all heads", "per head"], 60)
_l08(15, "check_zeros_per_head", "wrong", "36: T^2, all weights", ["all weights", "t²", "t*t", "t^2", "t * t", "whole"], 36)
_l08(16, "check_zeros_per_head", "wrong", "30: both triangles", ["both triangles", "twice", "double", "both"], 30)
_l08(17, "check_zeros_per_head", "wrong", "10: T-1 = 5 used (off by one)", ["off by one", "t - 1", "t = 5"], 10)
_l08(18, "check_zeros_per_head", "wrong", "two slips: diagonal and 4 heads: 84", ["diagonal", "heads"], 84)
_l08(19, "check_zeros_per_head", "wrong", "0.4167: the fraction 15/36 (units)", ["fraction", "share", "proportion", "count"], 15 / 36)
_l08(20, "check_zeros_per_head", "wrong", "28: T=8 of a neighbouring cell", ["t = 8", "8 tokens"], 28)
_l08(21, "check_unchanged_row", "right", "0.0 float", [], 0.0)
_l08(22, "check_unchanged_row", "right", "np.int64(0)", [], np.int64(0))
_l08(23, "check_unchanged_row", "wrong", "1: counted from 1", ["1-based", "from 1", "counting from", "index 0", "zero-based", "0-based"], 1)
_l08(24, "check_unchanged_row", "wrong", "5: the last row", ["last row", "last"], 5)
_l08(25, "check_unchanged_row", "wrong", "-1: python's last row", ["last row", "last", "negative"], -1)
_l08(26, "check_unchanged_row", "wrong", "6: T itself (out of range)", ["out of range", "no row", "0 to 5", "rows 0"], 6)
_l08(27, "check_unchanged_row", "wrong", "3: a middle row", ["middle"], 3)
_l08(28, "check_unchanged_row", "wrong", "0.5: not a whole number (between rows 0 and 1)", ["whole", "integer"], 0.5)


# ---------------------------------------------------------------- 09 forward in torch
def _mk_forward(split_tr=True, merge_tr=True, causal="is", out=True, view_merge=False, prescale=False,
                shortcut=False, heads_seq=False, bias=True, numpy_out=False):
    def my_forward(x_np):
        import torch
        import torch.nn.functional as F
        m = ctx(9)["pt_mha"]
        if shortcut:
            return m(torch.from_numpy(x_np), causal=True)
        x = torch.from_numpy(x_np)
        B, T, d = x.shape
        h = m.n_heads
        dk = d // h

        def lin(layer, a):
            return layer(a) if bias else F.linear(a, layer.weight)

        def split(a):
            if heads_seq:
                return a.reshape(B, h, T, dk)
            if split_tr:
                return a.view(B, T, h, dk).transpose(1, 2)
            return a.view(B, h, T, dk)
        q, k, v = (split(lin(layer, x)) for layer in (m.q_proj, m.k_proj, m.v_proj))
        if prescale:
            q = q / dk ** 0.5
        kw = {}
        if causal == "is":
            kw["is_causal"] = True
        elif causal == "tf":
            kw["attn_mask"] = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        elif causal == "add":
            kw["attn_mask"] = torch.triu(torch.ones(T, T, dtype=x.dtype), 1) * -1e9
        elif causal == "bool":
            kw["attn_mask"] = torch.ones(T, T, dtype=torch.bool).tril()
        o = F.scaled_dot_product_attention(q, k, v, **kw)
        if merge_tr:
            o = o.transpose(1, 2)
            o = o.view(B, T, d) if view_merge else o.reshape(B, T, d)
        else:
            o = o.reshape(B, T, d)
        r = lin(m.out_proj, o) if out else o
        return r.detach().numpy() if numpy_out else r
    return my_forward


def _l09f(n, kind, mistake, kw, fn):
    f = lambda t: t.check_forward(fn, ctx(9)["np_mha"])
    A(f"09-{n:02d}", 9, "check_forward", kind, mistake, kw, f, f)


_l09f(1, "right", "view/transpose, is_causal, reshape merge", [], _mk_forward())
_l09f(2, "right", "boolean tril attn_mask, returns numpy", [], _mk_forward(causal="bool", numpy_out=True))
_l09f(3, "right", "Keras-style additive mask -1e9 above the diagonal", [], _mk_forward(causal="add"))
_l09f(4, "wrong", "no transpose before the merge", ["transpose", "merge"], _mk_forward(merge_tr=False))
_l09f(5, "wrong", ".view after the transpose in the merge", ["view", "contiguous"], _mk_forward(view_merge=True))
_l09f(6, "wrong", "is_causal forgotten", ["causal", "mask"], _mk_forward(causal=None))
_l09f(7, "wrong", "TF convention: boolean mask True = masked", ["convention", "true = blocked", "inverted", "blocked", "true = masked"], _mk_forward(causal="tf"))
_l09f(8, "wrong", "out_proj forgotten", ["out_proj", "output projection"], _mk_forward(out=False))
_l09f(9, "wrong", "shortcut: calls pt_mha", ["pt_mha", "refused", "guard", "package"], _mk_forward(shortcut=True))
_l09f(10, "wrong", "heads split the sequence: reshape(B, h, T, d_k) without transpose", ["split", "transpose", "heads"], _mk_forward(heads_seq=True))
_l09f(11, "wrong", "two slips: no transpose at split AND at merge", ["transpose", "split"], _mk_forward(split_tr=False, merge_tr=False))
_l09f(12, "wrong", "scaled twice: q / sqrt(d_k) before SDPA", ["scale", "twice", "sqrt(d_k)", "square root"], _mk_forward(prescale=True))
_l09f(13, "wrong", "two slips: biases dropped (F.linear without bias) and no out_proj", ["bias", "out_proj", "output projection"], _mk_forward(bias=False, out=False))


def _pad_ok(B=2, T=6):
    import torch
    p = torch.ones(B, T, T, dtype=torch.bool)
    p[0, :, 3:] = False
    return p


def _l09p(n, kind, mistake, kw, make):
    def f(t):
        import torch
        c = ctx(9)
        pad, out = make(c, torch)
        return t.check_padding(pad, out, c["pt_mha"], c["x"])
    A(f"09-{n+20:02d}", 9, "check_padding", kind, mistake, kw, f, f)


def _run(c, torch, mask, causal=True):
    with torch.no_grad():
        return c["pt_mha"](c["x"], causal=causal, mask=mask)


def _p_ok(c, torch):
    p = _pad_ok()
    return p, _run(c, torch, p)


def _p_add(c, torch):
    p = _pad_ok()
    return torch.where(p, 0.0, float("-inf")).double(), _run(c, torch, p).numpy()


def _p_tf(c, torch):
    p = ~_pad_ok()
    return p, _run(c, torch, p)


def _p_rows(c, torch):
    p = torch.ones(2, 6, 6, dtype=torch.bool)
    p[0, 3:, :] = False
    return p, _run(c, torch, p)


def _p_both(c, torch):
    p = _pad_ok()
    p[0, 3:, :] = False
    return p, _run(c, torch, p)


def _p_off(c, torch):
    p = torch.ones(2, 6, 6, dtype=torch.bool)
    p[0, :, 4:] = False
    return p, _run(c, torch, p)


def _p_nomask(c, torch):
    return _pad_ok(), _run(c, torch, None)


def _p_nocausal(c, torch):
    p = _pad_ok()
    return p, _run(c, torch, p, causal=False)


def _p_bt(c, torch):
    p = torch.ones(2, 6, dtype=torch.bool)
    p[0, 3:] = False
    return p, _run(c, torch, _pad_ok())


def _p_item1(c, torch):
    p = torch.ones(2, 6, 6, dtype=torch.bool)
    p[:, :, 3:] = False
    return p, _run(c, torch, p)


def _p_tf_off(c, torch):
    p = torch.zeros(2, 6, 6, dtype=torch.bool)
    p[0, :, 4:] = True
    return p, _run(c, torch, ~p)


def _p_item0(c, torch):
    p = _pad_ok()
    return p, _run(c, torch, p)[:1]


_l09p(1, "right", "boolean mask, out from pt_mha", [], _p_ok)
_l09p(2, "right", "pad given as additive 0/-inf float, out as numpy", [], _p_add)
_l09p(3, "wrong", "TF convention: True = pad (and used so)", ["convention", "true = pad", "blocked", "inverted", "true = masked"], _p_tf)
_l09p(4, "wrong", "masks the padded query rows instead of the keys", ["rows", "query rows", "queries", "keys"], _p_rows)
_l09p(5, "wrong", "masks the padded query rows as well as keys (NaN/zero rows)", ["rows", "query rows", "nan", "fully masked"], _p_both)
_l09p(6, "wrong", "off by one: pads from token 4", ["off by one", "token 3", "three real", "4 real", "one too"], _p_off)
_l09p(7, "wrong", "out_padded computed without mask=pad", ["mask=", "without the mask", "not passed", "ignored", "no mask"], _p_nomask)
_l09p(8, "wrong", "out_padded computed without causal=True", ["causal"], _p_nocausal)
_l09p(9, "wrong", "pad as a (B, T) key-padding vector (Keras habit)", ["shape", "(b, t)", "(2, 6)", "key padding"], _p_bt)
_l09p(10, "wrong", "copy-paste: padding applied to item 1 too", ["item 1", "no padding", "both items"], _p_item1)
_l09p(11, "wrong", "two slips: TF convention and off by one", ["convention", "inverted", "true = pad", "off by one", "blocked"], _p_tf_off)
_l09p(12, "wrong", "out_padded only item 0 (shape (1, T, d))", ["shape", "item 0", "batch", "(2, 6, 512)"], _p_item0)


# ---------------------------------------------------------------- 10 rotation keys
# The notebook's flow is emulated with exec: cell 57 sets `answer`, cell 58 builds `read` and calls the check.
_CELL58_NEW = ("read = tryit.measured_keys(maps_argmax)\n"
               "_res = tryit.check_rotation_keys(answer, read=read)\n")
_CELL58_OLD = ("read = maps_argmax\n"
               "_res = tryit.check_rotation_keys(answer, read=read.numpy())\n")


def _l10(n, kind, mistake, kw, cell57, same_cell=False, after=False):
    def run(t, cell58):
        import numpy
        import torch
        g = {"tryit": t, "np": numpy, "torch": torch, "maps_argmax": ctx(10)["argmax"]}
        if after:  # the student re-runs the answer cell after the check cell, from `read`
            exec(cell58.split("\n")[0], g)
            exec(cell57, g)
            exec(cell58, g)
        elif same_cell:
            exec(cell57 + "\n" + cell58, g)
        else:
            exec(cell57, g)
            exec(cell58, g)
        return g["_res"]
    A(f"10-{n:02d}", 10, "check_rotation_keys", kind, mistake, kw,
      lambda t: run(t, _CELL58_NEW), lambda t: run(t, _CELL58_OLD))


_l10(1, "right", "list of ints", [], "answer = [3, 4, 5, 6, 7, 0, 1, 2]")
_l10(2, "right", "float numpy array", [], "answer = np.array([3.0, 4, 5, 6, 7, 0, 1, 2])")
_l10(3, "right", "torch tensor", [], "answer = torch.tensor([3, 4, 5, 6, 7, 0, 1, 2])")
_l10(13, "right", "list typed in the same cell as the check (before it)", [], "answer = [3, 4, 5, 6, 7, 0, 1, 2]", same_cell=True)
_l10(14, "right", "computed from the rule: [(t + 3) % 8 for t in range(8)]", [], "answer = [(t + 3) % 8 for t in range(8)]")
_l10(4, "wrong", "t - 3 (direction of the roll)", ["-3", "t - 3", "direction", "sign", "backward", "other way"], "answer = [5, 6, 7, 0, 1, 2, 3, 4]")
_l10(5, "wrong", "no wrap-around", ["wrap", "mod", "modulo", "out of range"], "answer = [3, 4, 5, 6, 7, 8, 9, 10]")
_l10(6, "wrong", "the reversal task's map (earlier cell)", ["reversal", "revers", "mirror"], "answer = [7, 6, 5, 4, 3, 2, 1, 0]")
_l10(7, "wrong", "t + 2: off by one", ["off by one", "t + 2", "by 2", "one short"], "answer = [2, 3, 4, 5, 6, 7, 0, 1]")
_l10(8, "wrong", "shortcut: the measured read itself (answer cell re-run after the check)", ["measure", "refused", "read"], "answer = read.tolist()", after=True)
_l10(9, "wrong", "t + 4: off by one the other way", ["off by one", "t + 4", "by 4"], "answer = [4, 5, 6, 7, 0, 1, 2, 3]")
_l10(10, "wrong", "hurried: 7 entries", ["8", "length", "seven", "eight", "one per query"], "answer = [3, 4, 5, 6, 7, 0, 1]")
_l10(11, "wrong", "two slips: 1-based and no wrap", ["wrap", "1-based", "off by one", "mod"], "answer = [4, 5, 6, 7, 8, 9, 10, 11]")
_l10(12, "wrong", "confused (thinks each query reads itself)", ["itself", "diagonal", "own position", "identity"], "answer = list(range(8))")


# ---------------------------------------------------------------- 11 score GiB and dropout kernel
def _l11g(n, kind, mistake, kw, val):
    f = lambda t: t.check_score_gib(val)
    A(f"11-{n:02d}", 11, "check_score_gib", kind, mistake, kw, f, f)


_l11g(1, "right", "4.0 float", [], 4.0)
_l11g(2, "right", "np.float32(4)", [], np.float32(4))
_l11g(3, "wrong", "float32 bytes: 8", ["bfloat16", "2 bytes", "itemsize", "float32", "4 bytes"], 8)
_l11g(4, "wrong", "GB not GiB: 4.294967296", ["gib", " gb", "1e9", "2**30", "10^9", "2^30"], 4.294967296)
_l11g(5, "wrong", "one head only: 0.125", ["heads", "32"], 0.125)
_l11g(6, "wrong", "in bytes: 4294967296", ["bytes", "gib", "units"], 4294967296)
_l11g(7, "wrong", "only the causal half: 2", ["triangle", "half", "causal"], 2)
_l11g(8, "wrong", "in MiB: 4096", ["mib", "units", "1024"], 4096)
_l11g(9, "wrong", "two slips: float32 and GB: 8.589934592", [" gb", "float32", "2 bytes", "bfloat16", "1e9"], 8.589934592)
_l11g(10, "wrong", "two slips: one head in float32: 0.25", ["heads", "32", "float32", "bfloat16"], 0.25)


def _l11k(n, kind, mistake, kw, val):
    f = lambda t: t.check_dropout_kernel(val() if callable(val) else val, measured=ctx(11)["measured"])
    A(f"11-{n+20:02d}", 11, "check_dropout_kernel", kind, mistake, kw, f, f)


def _sdpb_math():
    from torch.nn.attention import SDPBackend
    return SDPBackend.MATH


_l11k(1, "right", "'math'", [], "math")
_l11k(2, "right", "'Math ' with capital and a space", [], "Math ")
_l11k(3, "right", "SDPBackend.MATH enum", [], _sdpb_math)
_l11k(4, "wrong", "'flash' (thinks the CPU flash kernel does dropout)", ["dropout"], "flash")
_l11k(5, "wrong", "'efficient' (a CUDA kernel)", ["cuda", "gpu", "one of", "\"flash\" or \"math\"", "'flash' or 'math'"], "efficient")
_l11k(6, "wrong", "'cudnn'", ["cuda", "gpu", "one of", "'flash' or 'math'", "\"flash\" or \"math\""], "cudnn")
_l11k(7, "wrong", "'FLASH_ATTENTION' (enum name habit)", ["dropout", "flash"], "FLASH_ATTENTION")
_l11k(8, "wrong", "True (answered the question 'does it run')", ["string", "one of", "'flash' or 'math'", "\"flash\" or \"math\""], True)


# ---------------------------------------------------------------- 12 tile counts
def _l12(n, kind, mistake, kw, val):
    f = lambda t: t.check_tile_counts(val)
    A(f"12-{n:02d}", 12, "check_tile_counts", kind, mistake, kw, f, f)


_l12(1, "right", "(28, 8)", [], (28, 8))
_l12(2, "right", "[28.0, 8.0] floats", [], [28.0, 8.0])
_l12(3, "right", "dict", [], {"skipped": 28, "partial": 8})
_l12(4, "wrong", "swapped (8, 28)", ["swap", "order", "other way", "reversed"], (8, 28))
_l12(5, "wrong", "skipped counts the diagonal: (36, 8)", ["diagonal"], (36, 8))
_l12(6, "wrong", "partial = all computed tiles: (28, 36)", ["full", "fully", "not masked", "unmasked"], (28, 36))
_l12(7, "wrong", "no partial tiles: (28, 0)", ["diagonal", "partly"], (28, 0))
_l12(8, "wrong", "7x7 grid thinking: (21, 7)", ["off by one", "7", "grid"], (21, 7))
_l12(9, "wrong", "element counts, not tiles: (1792, 224)", ["element", "entries", "tiles", "64 times"], (1792, 224))
_l12(10, "wrong", "two slips: both triangles skipped (56, 8)", ["both", "twice", "double", "upper"], (56, 8))
_l12(11, "wrong", "two slips: diagonal in skipped, no partial (36, 0)", ["diagonal"], (36, 0))
_l12(12, "wrong", "half the grid: (32, 8)", ["half", "32"], (32, 8))


# ---------------------------------------------------------------- 13 cache bytes and formula
def _l13(n, kind, mistake, kw, val):
    f = lambda t: t.check_cache_bytes(val)
    A(f"13-{n:02d}", 13, "check_cache_bytes", kind, mistake, kw, f, f)


_l13(1, "right", "4194304.0 float", [], 4194304.0)
_l13(2, "right", "np.int64 of 4 * 2**20", [], np.int64(4 * 2**20))
_l13(3, "wrong", "V forgotten: 2097152", ["v ", "k and v", "values", "2 (k and v)", "factor 2"], 2097152)
_l13(4, "wrong", "itemsize forgotten (numbers, not bytes): 1048576", ["itemsize", "bytes per number", "4 bytes", "float32", "numbers"], 1048576)
_l13(5, "wrong", "float64 8 bytes: 8388608", ["8 bytes", "float64", "itemsize", "float32"], 8388608)
_l13(6, "wrong", "bytes per token, not per max_len: 4096", ["max_len", "slots", "per token", "1024"], 4096)
_l13(7, "wrong", "32 layers: 134217728", ["layer", "32"], 134217728)
_l13(8, "wrong", "in MiB: 4.0", ["mib", "units", "bytes"], 4.0)
_l13(9, "wrong", "two slips: V forgotten and bf16 itemsize 2 (= 1048576, same as itemsize forgotten)", ["v ", "k and v", "itemsize", "2 bytes", "bfloat16"], 1048576)
_l13(10, "wrong", "two slips: K and V counted twice and float64: 16777216", ["twice", "double", "float64", "8 bytes"], 16777216)


def _kvc(B, h, max_len, d_k, itemsize):
    from mha.inference.kv_cache import KVCache
    return KVCache(B, h, max_len, d_k, dtype={2: np.float16, 4: np.float32, 8: np.float64}[itemsize]).nbytes


_FORMULAS = [
    ("right", "2*B*h*max_len*d_k*itemsize", [], lambda B, h, L, d, s: 2 * B * h * L * d * s),
    ("right", "float result", [], lambda B, h, L, d, s: float(2 * B * h * L * d * s)),
    ("right", "np.prod of the six factors (np.int64)", [], lambda B, h, L, d, s: np.prod([2, B, h, L, d, s])),
    ("wrong", "V forgotten (no factor 2)", ["v ", "k and v", "values", "factor 2", "2 (k and v)"], lambda B, h, L, d, s: B * h * L * d * s),
    ("wrong", "itemsize forgotten", ["itemsize", "bytes per number"], lambda B, h, L, d, s: 2 * B * h * L * d),
    ("wrong", "itemsize hard-coded 4", ["itemsize", "hard", "float32", "4 bytes"], lambda B, h, L, d, s: 2 * B * h * L * d * 4),
    ("wrong", "two slips that cancel at float32: V forgotten and 8 bytes per number", ["v ", "k and v", "itemsize", "8 bytes", "cancel"], lambda B, h, L, d, s: B * h * L * d * 8),
    ("wrong", "shortcut: KVCache(...).nbytes", ["kvcache", "nbytes", "package"], _kvc),
    ("wrong", "max_len hard-coded 1024", ["max_len", "hard", "slots"], lambda B, h, L, d, s: 2 * B * h * 1024 * d * s),
    ("wrong", "B forgotten", ["batch", "b "], lambda B, h, L, d, s: 2 * h * L * d * s),
    ("wrong", "two slips: bits (x8) and V forgotten", ["bits", "8", "v ", "k and v"], lambda B, h, L, d, s: B * h * L * d * s * 8),
]
for _n, (_k, _m, _kw, _f) in enumerate(_FORMULAS):
    A(f"13-{_n+21:02d}", 13, "check_cache_formula", _k, _m, _kw,
      (lambda t, f=_f: t.check_cache_formula(f)), None)


# ---------------------------------------------------------------- 14 decoder mask function
def _dm_ok(lengths, T):
    L = np.asarray(lengths)[:, None, None, None]
    q = np.arange(T)[:, None]
    k = np.arange(T)[None, :]
    return (k <= q) & (q < L) & (k < L)


def _dm_ok2(lengths, T):
    from mha import steps
    L = np.asarray(lengths).reshape(-1, 1, 1, 1)
    return steps.causal_mask(T)[None, None] & (np.arange(T)[:, None] < L)  # query rows & causal


def _dm_noq(lengths, T):
    L = np.asarray(lengths)[:, None, None, None]
    q, k = np.arange(T)[:, None], np.arange(T)[None, :]
    return (k <= q) & (k < L)


def _dm_nocausal(lengths, T):
    L = np.asarray(lengths)[:, None, None, None]
    q, k = np.arange(T)[:, None], np.arange(T)[None, :]
    return (q < L) & (k < L)


def _dm_nohead(lengths, T):
    return _dm_ok(lengths, T)[:, 0]


def _dm_tf(lengths, T):
    return ~_dm_ok(lengths, T)


def _dm_off(lengths, T):
    L = np.asarray(lengths)[:, None, None, None]
    q, k = np.arange(T)[:, None], np.arange(T)[None, :]
    return (k <= q) & (q <= L) & (k <= L)


def _dm_left(lengths, T):
    L = np.asarray(lengths)[:, None, None, None]
    q, k = np.arange(T)[:, None], np.arange(T)[None, :]
    return (k <= q) & (q >= T - L) & (k >= T - L)


def _dm_pkg(lengths, T):
    from mha.attention import masks
    return masks.padding_mask(np.asarray(lengths), T, causal=True)


def _dm_tf_nocausal(lengths, T):
    return ~_dm_nocausal(lengths, T)


def _dm_hard(lengths, T):
    return _dm_ok(lengths, 5)


def _dm_tr(lengths, T):
    return np.swapaxes(_dm_ok(lengths, T), -1, -2).copy()


for _n, (_k, _m, _kw, _f, _old) in enumerate([
    ("right", "arange comparisons, causal & query & key", [], _dm_ok, True),
    ("right", "causal_mask & query rows only (right padding + causal: keys implied)", [], _dm_ok2, True),
    ("wrong", "padded queries not masked (keys only)", ["padded quer", "query rows", "queries see", "padded rows"], _dm_noq, True),
    ("wrong", "no causal triangle", ["causal", "future", "triangle", "later keys"], _dm_nocausal, True),
    ("wrong", "shape (B, T, T): head axis missing", ["shape", "head axis", "(b, 1", "(3, 1, 5, 5)"], _dm_nohead, True),
    ("wrong", "TF convention True = masked", ["inverted", "true = blocked", "convention", "blocked", "true = masked"], _dm_tf, True),
    ("wrong", "off by one: <= lengths", ["off by one", "<=", "one too many", "first pad"], _dm_off, True),
    ("wrong", "left padding assumed (real tokens at the end)", ["left", "right", "padding side", "side"], _dm_left, True),
    ("wrong", "shortcut: masks.padding_mask", ["padding_mask", "package", "refuse", "answer key"], _dm_pkg, False),
    ("wrong", "two slips: no causal and inverted", ["causal", "inverted", "convention", "blocked"], _dm_tf_nocausal, True),
    ("wrong", "hard-coded T = 5", ["hard", "other batch", "t =", "ignores t"], _dm_hard, False),
    ("wrong", "transposed (k >= q)", ["transpos", "upper", "future"], _dm_tr, True),
]):
    A(f"14-{_n+1:02d}", 14, "check_decoder_mask", _k, _m, _kw,
      (lambda t, f=_f: t.check_decoder_mask(f)),
      (lambda t, f=_f: t.check_decoder_mask(f(np.array([5, 3, 1]), 5))) if _old else None)


# ---------------------------------------------------------------- 15 softmax backward
def _sb_ok(dw, w):
    S = w.shape[-1]
    J = w[..., :, None] * (np.eye(S) - w[..., None, :])  # (B, h, T, S, S)
    return np.einsum("...i,...ij->...j", dw, J)


def _sb_ok2(dw, w):
    return w * (dw - (w * dw).sum(-1, keepdims=True))


def _sb_nowwT(dw, w):
    return w * dw


def _sb_sign(dw, w):
    return -_sb_ok(dw, w)


def _sb_axis(dw, w):
    return w * (dw - (w * dw).sum(-2, keepdims=True))


def _sb_nodiag(dw, w):
    return -w * (w * dw).sum(-1, keepdims=True)


def _sb_nan(dw, w):
    wn = w / w.sum(-1, keepdims=True)
    return wn * (dw - (wn * dw).sum(-1, keepdims=True))


def _sb_pkg(dw, w):
    from mha.training import grad
    return grad.softmax_backward(dw, w)


def _sb_J(dw, w):
    S = w.shape[-1]
    return w[..., :, None] * (np.eye(S) - w[..., None, :])


def _sb_two(dw, w):
    return -w * dw


def _sb_swap(dw, w):
    return dw * (w - (dw * w).sum(-1, keepdims=True))


def _sb_f16(dw, w):
    w16, g16 = w.astype(np.float16), dw.astype(np.float16)
    return (w16 * (g16 - (w16 * g16).sum(-1, keepdims=True))).astype(np.float64)


for _n, (_k, _m, _kw, _f) in enumerate([
    ("right", "Jacobian and einsum", [], _sb_ok),
    ("right", "compact w*(g - w.g)", [], _sb_ok2),
    ("wrong", "w w^T term dropped", ["dropped", "w w^t", "ww^t", "outer", "term", "w wᵀ"], _sb_nowwT),
    ("wrong", "sign flipped", ["sign"], _sb_sign),
    ("wrong", "w.g summed over the query axis", ["axis", "wrong axis"], _sb_axis),
    ("wrong", "diag(w) term dropped", ["diag", "dropped", "term"], _sb_nodiag),
    ("wrong", "renormalises w: NaN on fully masked rows", ["nan", "fully masked", "masked row"], _sb_nan),
    ("wrong", "shortcut: grad.softmax_backward", ["softmax_backward", "package", "guard", "not counted"], _sb_pkg),
    ("wrong", "returns the Jacobian itself (B,h,T,S,S)", ["shape", "jacobian"], _sb_J),
    ("wrong", "two slips: sign flipped and w w^T dropped", ["sign", "dropped", "term"], _sb_two),
    ("wrong", "arguments swapped (g and w)", ["swap", "order", "argument"], _sb_swap),
    ("wrong", "float16 habit: computed in float16", ["float16", "precision", "dtype", "rounding", "half"], _sb_f16),
]):
    A(f"15-{_n+1:02d}", 15, "check_softmax_backward", _k, _m, _kw,
      (lambda t, f=_f: t.check_softmax_backward(f)), (lambda t, f=_f: t.check_softmax_backward(f)))


# ---------------------------------------------------------------- 16 chunk positions
def _cp_torch(n, t):
    import torch
    return torch.arange(n, n + t)


for _n, (_k, _m, _kw, _f) in enumerate([
    ("right", "np.arange(n_cached, n_cached + t_new)", [], lambda n, t: np.arange(n, n + t)),
    ("right", "python list", [], lambda n, t: list(range(n, n + t))),
    ("right", "torch.arange", [], _cp_torch),
    ("right", "float positions holding whole numbers", [], lambda n, t: np.arange(n, n + t, dtype=float)),
    ("wrong", "starts at 0 (forgets the cache)", ["from 0", "start at 0", "cached", "offset", "0, 1, 2", "n_cached"], lambda n, t: np.arange(t)),
    ("wrong", "starts at n_cached + 1", ["off by one", "+ 1", "one too", "one later"], lambda n, t: np.arange(n + 1, n + t + 1)),
    ("wrong", "starts at n_cached - 1 (last cached)", ["off by one", "- 1", "one too", "one early"], lambda n, t: np.arange(n - 1, n + t - 1)),
    ("wrong", "all positions 0..n+t-1", ["all", "t_new", "too many", "length", "count"], lambda n, t: np.arange(n + t)),
    ("wrong", "reversed", ["revers", "order", "descending"], lambda n, t: np.arange(n + t - 1, n - 1, -1)),
    ("wrong", "two slips: from 0 and reversed", ["revers", "from 0", "start", "cached"], lambda n, t: np.arange(t - 1, -1, -1)),
    ("wrong", "hard-coded [5, 6, 7]", ["hard", "other sizes", "other cases", "ignores"], lambda n, t: np.array([5, 6, 7])),
    ("wrong", "arguments swapped: arange(t_new, t_new + n_cached)", ["swap", "order", "argument"], lambda n, t: np.arange(t, t + n)),
]):
    A(f"16-{_n+1:02d}", 16, "check_chunk_positions", _k, _m, _kw,
      (lambda t, f=_f: t.check_chunk_positions(f)), (lambda t, f=_f: t.check_chunk_positions(f)))


# ---------------------------------------------------------------- 17 left-padded positions
def _pp_ok(lengths, T):
    L = np.asarray(lengths)[:, None]
    p = np.arange(T)[None, :] - (T - L)
    return np.where(p < 0, -1, p)


def _pp_raw(lengths, T):
    return np.arange(T)[None, :] - (T - np.asarray(lengths)[:, None])


def _pp_list(lengths, T):
    return [[-1] * (T - n) + list(range(n)) for n in lengths]


def _pp_right(lengths, T):
    L = np.asarray(lengths)[:, None]
    a = np.arange(T)[None, :]
    return np.where(a < L, a, -1)


def _pp_zero(lengths, T):
    return np.maximum(_pp_ok(lengths, T), 0)


def _pp_one(lengths, T):
    p = _pp_ok(lengths, T)
    return np.where(p >= 0, p + 1, -1)


def _pp_global(lengths, T):
    return np.tile(np.arange(T), (len(lengths), 1))


def _pp_shift(lengths, T):
    return np.arange(T)[None, :] - (T - np.asarray(lengths)[:, None]) - 1


def _pp_T(lengths, T):
    return _pp_ok(lengths, T).T.copy()


def _pp_pkg(lengths, T):
    from mha.modules import compose
    return compose.padded_positions(np.asarray(lengths), T)


def _pp_hard(lengths, T):
    return np.array([[-1, -1, -1, 0, 1], [0, 1, 2, 3, 4], [-1, -1, 0, 1, 2]])


def _pp_right0(lengths, T):
    return np.maximum(_pp_right(lengths, T), 0)


def _pp_big(lengths, T):
    p = _pp_ok(lengths, T)
    return np.where(p < 0, 9999, p)


for _n, (_k, _m, _kw, _f, _old) in enumerate([
    ("right", "-1 on pads", [], _pp_ok, True),
    ("right", "raw arange - (T - L): pads -3..-1 (any negative)", [], _pp_raw, True),
    ("right", "list of lists", [], _pp_list, True),
    ("wrong", "right padding", ["right", "left", "side"], _pp_right, True),
    ("wrong", "pads 0 instead of negative", ["0", "zero", "negative"], _pp_zero, True),
    ("wrong", "counts from 1", ["1-based", "from 1", "off by one", "start at 0", "count from 0"], _pp_one, True),
    ("wrong", "padding ignored: arange(T) on every row", ["pad", "ignore", "own first token", "every row"], _pp_global, True),
    ("wrong", "shifted by one: first token at -1", ["off by one", "one too", "shift", "-1"], _pp_shift, True),
    ("wrong", "transposed (T, B)", ["transpos", "shape", "(3, 5)"], _pp_T, True),
    ("wrong", "shortcut: compose.padded_positions", ["padded_positions", "package", "refuse", "guard"], _pp_pkg, False),
    ("wrong", "hard-coded the lesson's array", ["hard", "other batch", "ignores"], _pp_hard, False),
    ("wrong", "two slips: right padding and pads 0", ["right", "left", "side"], _pp_right0, True),
    ("wrong", "pads marked 9999 (pad-id habit)", ["negative", "positive", "9999", "pad"], _pp_big, True),
]):
    A(f"17-{_n+1:02d}", 17, "check_padded_positions", _k, _m, _kw,
      (lambda t, f=_f: t.check_padded_positions(f, [2, 5, 3], 5)),
      (lambda t, f=_f: t.check_padded_positions(f([2, 5, 3], 5), [2, 5, 3], 5)) if _old else None)


# ---------------------------------------------------------------- 18 ring bytes
def _rb_pkg(B, h, T, W, d_k, itemsize):
    from mha.parallel import ring as parallel
    return (W - 1) * parallel.ring_bytes_per_step(B, h, T, W, d_k, itemsize)


for _n, (_k, _m, _kw, _f) in enumerate([
    ("right", "(W-1) steps of 2*B*h*(T/W)*d_k*itemsize", [], lambda B, h, T, W, d, s: (W - 1) * 2 * B * h * (T // W) * d * s),
    ("right", "float arithmetic T/W", [], lambda B, h, T, W, d, s: 2 * B * h * T / W * d * s * (W - 1)),
    ("right", "(W-1)/W of 2*B*h*T*d_k*itemsize, int", [], lambda B, h, T, W, d, s: int((W - 1) / W * 2 * B * h * T * d * s)),
    ("wrong", "W steps instead of W-1", ["w steps", "w - 1", "one step too many", "w-1", "steps"], lambda B, h, T, W, d, s: W * 2 * B * h * (T // W) * d * s),
    ("wrong", "V forgotten", ["v ", "k and v", "factor 2", "2 (k and v)", "values"], lambda B, h, T, W, d, s: (W - 1) * B * h * (T // W) * d * s),
    ("wrong", "shortcut: ring_bytes_per_step * (W-1) (with positions)", ["ring_bytes_per_step", "package", "positions", "guard"], _rb_pkg),
    ("wrong", "whole T per step, not T/W", ["t / w", "t/w", "block", "whole sequence", "w (the ranks)", "ranks"], lambda B, h, T, W, d, s: (W - 1) * 2 * B * h * T * d * s),
    ("wrong", "itemsize forgotten", ["itemsize", "bytes per number"], lambda B, h, T, W, d, s: (W - 1) * 2 * B * h * (T // W) * d),
    ("wrong", "one step only", ["steps", "w - 1", "one step", "w-1"], lambda B, h, T, W, d, s: 2 * B * h * (T // W) * d * s),
    ("wrong", "two slips: W steps and V forgotten", ["w - 1", "w-1", "k and v", "v ", "steps"], lambda B, h, T, W, d, s: W * B * h * (T // W) * d * s),
    ("wrong", "bits (x8)", ["bits", "8"], lambda B, h, T, W, d, s: 8 * (W - 1) * 2 * B * h * (T // W) * d * s),
    ("wrong", "thinks causal halves what is sent", ["half", "causal"], lambda B, h, T, W, d, s: (W - 1) * B * h * (T // W) * d * s),
    ("wrong", "two slips: positions added by hand and W steps", ["positions", "int64", "w - 1", "w-1"], lambda B, h, T, W, d, s: W * (2 * B * h * (T // W) * d * s + (T // W) * 8)),
]):
    A(f"18-{_n+1:02d}", 18, "check_ring_bytes", _k, _m, _kw,
      (lambda t, f=_f: t.check_ring_bytes(f, B=1, h=8, T=4096, W=4, d_k=64, itemsize=4)),
      (lambda t, f=_f: t.check_ring_bytes(f(1, 8, 4096, 4, 64, 4), B=1, h=8, T=4096, W=4, d_k=64, itemsize=4)))

MODULES = {1: "attention_from_scratch", 2: "qkv_projection", 3: "split_heads", 4: "scaled_scores",
           5: "causal_mask", 6: "softmax", 7: "weighted_sum", 8: "merge_and_output", 9: "pytorch_port",
           10: "attention_that_learns", 11: "sdpa_backends", 12: "flash_attention", 13: "kv_cache",
           14: "padding_masks", 15: "backward_pass", 16: "positions_and_variants", 17: "generation",
           18: "attention_across_devices"}
