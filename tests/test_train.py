"""mha.training.train and mha_course.scrub: toy tasks, the tiny Transformer, training, ablation, initialisation.

Targets are checked against plain Python loops; accuracy against a hand count; the ablation
against exact uniform rows; init schemes by the std they actually draw. Each check is shown
able to fail on a planted bug. Training runs use a few dozen steps, so the file stays fast.
"""

from __future__ import annotations

import contextlib
import math

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from torch import nn

from mha.modules.torch_mha import MultiHeadAttention
from mha.training import train as tr
from mha_course import scrub


@pytest.fixture(autouse=True)
def _one_thread_and_no_figures():
    """Tiny matrices: one thread is as fast and immune to a busy machine; close figures after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    plt.close("all")


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="module")
def trained_reversal():
    """A one-layer, one-head model trained briefly on reversal (T=6): enough to learn it."""
    torch.set_num_threads(1)
    task = tr.reversal_task(T=6, vocab=8)
    model = tr.TinyTransformer.for_task(task, d_model=32, n_heads=1, seed=0)
    hist = tr.train(model, task, 120, lr=1e-2, progress=False, eval_every=40, snapshot_every=40)
    return task, model, hist


# ---- the tasks, against plain loops -----------------------------------------------------------
def _loop_induction(x: torch.Tensor) -> tuple[list[list[int]], list[list[int]]]:
    """Keys and targets by the definition: the latest earlier s with x[s] == x[t]; key s + 1."""
    keys, ys = [], []
    for row in x.tolist():
        k_row, y_row = [], []
        for t, tok in enumerate(row):
            prev = [s for s in range(t) if row[s] == tok]
            k_row.append(prev[-1] + 1 if prev else -1)
            y_row.append(row[prev[-1] + 1] if prev else tr.IGNORE)
        keys.append(k_row)
        ys.append(y_row)
    return keys, ys


def test_reversal_targets_are_the_mirrored_tokens():
    x, y = tr.reversal_batch(_gen(), 5, 7, 10)
    assert x.shape == y.shape == (5, 7) and x.dtype == y.dtype == torch.long
    assert 0 <= int(x.min()) and int(x.max()) < 10
    want = [[row[7 - 1 - t] for t in range(7)] for row in x.tolist()]
    assert y.tolist() == want


def test_induction_targets_and_keys_match_the_loop_definition():
    x, y = tr.induction_batch(_gen(1), 16, 12, 6)  # small vocab: many repeats, some several times
    keys, ys = _loop_induction(x)
    assert tr.induction_keys(x).tolist() == keys
    assert y.tolist() == ys
    scored = y != tr.IGNORE
    assert 0.3 < float(scored.float().mean()) < 0.9, "a 6-token vocabulary repeats often"
    assert not bool(scored[:, 0].any()), "position 0 has no past: never scored"


def test_the_loop_reference_catches_an_off_by_one_target():
    x, _ = tr.induction_batch(_gen(2), 8, 12, 6)
    keys = tr.induction_keys(x)
    planted = torch.where(keys >= 0, x.gather(1, (keys - 1).clamp(min=0)), tr.IGNORE)  # the token AT s
    assert planted.tolist() != _loop_induction(x)[1]


def test_generators_are_reproducible_and_seed_dependent():
    for make in (tr.reversal_batch, tr.induction_batch):
        a, b, c = (make(_gen(s), 4, 10, 12) for s in (3, 3, 4))
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        assert not torch.equal(a[0], c[0])


@pytest.mark.parametrize("args, err, match", [
    ((0, 8, 10), ValueError, "B must be >= 1"),
    ((2, 1, 10), ValueError, "T must be >= 2"),
    ((2, 8, 1), ValueError, "vocab must be >= 2"),
    ((2, 8.0, 10), TypeError, "T must be an int"),
])
def test_task_generators_reject_bad_sizes(args, err, match):
    for make in (tr.reversal_batch, tr.induction_batch):
        with pytest.raises(err, match=match):
            make(_gen(), *args)


# ---- the model --------------------------------------------------------------------------------
def test_model_shapes_uses_our_module_and_leaves_the_global_rng_alone():
    state = torch.get_rng_state()
    model = tr.TinyTransformer(vocab=10, T=8, d_model=16, n_heads=2, n_layers=2, seed=5)
    assert torch.equal(torch.get_rng_state(), state), "building a model must not move the global RNG"
    again = tr.TinyTransformer(vocab=10, T=8, d_model=16, n_heads=2, n_layers=2, seed=5)
    for p, q in zip(model.parameters(), again.parameters(), strict=True):
        assert torch.equal(p, q)
    assert sum(isinstance(m, MultiHeadAttention) for m in model.modules()) == 2
    logits = model(torch.zeros(3, 5, dtype=torch.long))  # T = 5 <= 8 positions
    assert logits.shape == (3, 5, 10)


def test_block_is_pre_layernorm_with_two_residuals():
    torch.manual_seed(0)
    block = tr.Block(16, 4, seed=1, mlp=True)
    x = torch.randn(2, 5, 16)
    h = x + block.attn(block.ln1(x))  # written out independently of Block.forward
    want = h + block.mlp(block.ln2(h))
    torch.testing.assert_close(block(x), want, rtol=0, atol=0)
    post_ln = block.ln2(block.ln1(x + block.attn(x)) + block.mlp(block.ln1(x + block.attn(x))))
    assert not torch.allclose(block(x), post_ln), "the comparison must tell pre-LN from post-LN"
    no_mlp = tr.Block(16, 4, seed=1, mlp=False)
    torch.testing.assert_close(no_mlp(x), x + no_mlp.attn(no_mlp.ln1(x)), rtol=0, atol=0)


def test_model_rejects_bad_tokens():
    model = tr.TinyTransformer(vocab=10, T=8, d_model=16, n_heads=2)
    with pytest.raises(TypeError, match="tokens must be int64"):
        model(torch.zeros(2, 4))
    with pytest.raises(ValueError, match=r"positions < 8 \(the learned position table\), got position 8"):
        model(torch.zeros(2, 9, dtype=torch.long))
    with pytest.raises(ValueError, match=r"ids in 0..9 \(vocab=10\), got 10"):
        model(torch.full((2, 4), 10))  # a raw IndexError from nn.Embedding before
    with pytest.raises(ValueError, match=r"ids in 0..9 \(vocab=10\), got -1"):
        model(torch.full((2, 4), -1))
    with pytest.raises(ValueError, match=r"tokens must be \(B, T\)"):
        model(torch.zeros(2, 4, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="divisible"):
        tr.TinyTransformer(vocab=10, T=8, d_model=16, n_heads=3)


# ---- accuracy and map measures, against hand counts --------------------------------------------
class _FixedLogits(nn.Module):
    """A 'model' that returns the logits it was built with, to count accuracy by hand."""

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.logits = logits

    def forward(self, x):
        return self.logits


def _planted_accuracy_counting_ignored(model, x, y):
    """Bug: scores the IGNORE positions too (as wrong answers)."""
    return float((model(x).argmax(-1) == y).float().mean())


@pytest.mark.parametrize("fn, right", [(tr.accuracy, True),
                                       (_planted_accuracy_counting_ignored, False)])
def test_accuracy_equals_a_hand_count(fn, right):
    # predictions (argmax): [[1, 0, 2], [2, 2, 0]]
    logits = torch.tensor([[[0., 5, 0], [5, 0, 0], [0, 0, 5]],
                           [[0, 0, 5], [0, 0, 5], [5, 0, 0]]])  # (B=2, T=3, V=3)
    y = torch.tensor([[1, 1, tr.IGNORE], [2, tr.IGNORE, 0]])  # scored: 4; right: (0,0), (1,0), (1,2)
    got = fn(_FixedLogits(logits), torch.zeros(2, 3, dtype=torch.long), y)
    assert (got == 3 / 4) is right


def test_accuracy_rejects_targets_without_scored_positions():
    with pytest.raises(ValueError, match="no scored positions"):
        tr.accuracy(_FixedLogits(torch.zeros(1, 2, 3)), torch.zeros(1, 2, dtype=torch.long),
                    torch.full((1, 2), tr.IGNORE))
    with pytest.raises(ValueError, match=r"y must be \(B=1, T=2\)"):
        tr.accuracy(_FixedLogits(torch.zeros(1, 2, 3)), torch.zeros(1, 2, dtype=torch.long),
                    torch.zeros(1, 3, dtype=torch.long))


def test_key_weight_and_mirrored_key_weight_against_loops():
    maps = torch.rand(3, 2, 5, 5, generator=_gen(4)).softmax(-1)  # (B, h, T, S)
    keys = torch.randint(-1, 5, (3, 5), generator=_gen(5))  # some -1: left out
    want = []
    for j in range(2):
        vals = [float(maps[b, j, t, keys[b, t]]) for b in range(3) for t in range(5) if keys[b, t] >= 0]
        want.append(sum(vals) / len(vals))
    torch.testing.assert_close(tr.key_weight(maps, keys), torch.tensor(want), rtol=1e-6, atol=0)
    mirror = [float(np.mean([float(maps[b, j, t, 4 - t]) for b in range(3) for t in range(5)]))
              for j in range(2)]
    torch.testing.assert_close(tr.mirrored_key_weight(maps), torch.tensor(mirror), rtol=1e-6, atol=0)
    with pytest.raises(ValueError, match="square"):
        tr.mirrored_key_weight(maps[..., :4])
    with pytest.raises(ValueError, match="all < 0"):
        tr.key_weight(maps, torch.full((3, 5), -1))


def test_attention_maps_are_rows_of_probabilities_and_restore_sdpa():
    model = tr.TinyTransformer(vocab=10, T=8, d_model=16, n_heads=2, n_layers=2, causal=True)
    maps = tr.attention_maps(model, torch.randint(0, 10, (3, 8), generator=_gen()))
    assert [tuple(m.shape) for m in maps] == [(3, 2, 8, 8)] * 2
    for m in maps:
        torch.testing.assert_close(m.sum(-1), torch.ones(3, 2, 8))
        assert bool((m[..., ~torch.ones(8, 8, dtype=torch.bool).tril()] == 0).all())
    assert all(b.attn.use_sdpa for b in model.blocks), "capture_attention must restore SDPA"


# ---- training -----------------------------------------------------------------------------------
def test_training_reduces_the_loss_and_records_everything(trained_reversal):
    task, model, hist = trained_reversal
    assert len(hist.losses) == 120
    assert np.mean(hist.losses[-10:]) < 0.2 * np.mean(hist.losses[:10])
    assert hist.eval_steps == [0, 40, 80, 120] == hist.snapshot_steps
    assert hist.eval_acc[0] < 0.3 and hist.final_accuracy > 0.95
    assert hist.steps_to(0.95) is not None and hist.steps_to(1.01) is None
    assert [tuple(m.shape) for m in hist.snapshots[0]] == [(4, 1, 6, 6)]
    assert hist.probe.shape == (4, 6) and hist.seconds > 0


def test_the_loss_check_fails_for_a_run_that_cannot_learn():
    task = tr.reversal_task(T=6, vocab=8)
    model = tr.TinyTransformer.for_task(task, d_model=32, n_heads=1, seed=0)
    frozen = tr.train(model, task, 40, lr=1e-9, progress=False, eval_every=40)  # planted: no step
    assert not np.mean(frozen.losses[-10:]) < 0.2 * np.mean(frozen.losses[:10])


def test_training_is_deterministic_given_the_seed():
    task = tr.induction_task(T=8, vocab=6)

    def run(seed):
        model = tr.TinyTransformer.for_task(task, d_model=16, n_heads=2, n_layers=2, seed=seed)
        return tr.train(model, task, 15, lr=1e-2, batch=16, seed=seed, progress=False,
                        eval_every=5, n_eval=64)

    a, b, c = run(0), run(0), run(1)
    assert a.losses == b.losses and a.eval_acc == b.eval_acc  # bit-equal, not close
    assert a.losses != c.losses


def test_train_rejects_bad_arguments():
    task = tr.reversal_task(T=6, vocab=8)
    model = tr.TinyTransformer.for_task(task, d_model=16, n_heads=2)
    with pytest.raises(ValueError, match="lr must be a finite number > 0"):
        tr.train(model, task, 5, lr=0.0, progress=False)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        tr.train(model, task, 0, progress=False)
    with pytest.raises(ValueError, match="for_task"):
        tr.train(model, tr.reversal_task(T=6, vocab=9), 5, progress=False)
    with pytest.raises(TypeError, match="TinyTransformer"):
        tr.train(nn.Linear(2, 2), task, 5, progress=False)


class _FakeHandle:
    """Stands in for an IPython display handle: records what each update shows."""

    def __init__(self, shown: list):
        self.shown = shown

    def update(self, data, raw=False):
        self.shown.append(data["text/plain"])


def test_progress_bar_in_a_notebook_keeps_one_plain_text_line(monkeypatch, capsys):
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda *a, **k: _FakeHandle(shown))
    monkeypatch.setattr(tr, "_in_notebook", lambda: True)
    assert list(tr.progress_bar(range(3), "demo")) == [0, 1, 2]
    assert shown and shown[-1].startswith("demo: 100%|") and "3/3" in shown[-1]
    assert all("\r" not in line and "\n" not in line for line in shown), "one line, redrawn"
    out = capsys.readouterr()
    assert out.err == "" and out.out == "", "nothing on stderr (JupyterLab paints it red)"


def test_progress_bar_elsewhere_is_tqdms_and_can_be_switched_off(capsys):
    assert list(tr.progress_bar(range(2), "quiet", show=False)) == [0, 1]
    assert capsys.readouterr().err == ""
    assert list(tr.progress_bar(range(2), "terminal")) == [0, 1]
    assert "terminal: 100%" in capsys.readouterr().err


# ---- ablation -----------------------------------------------------------------------------------
@contextlib.contextmanager
def _planted_ablation_zeroing_values(model, layer, head):
    """Bug: silences the head's values instead of making its weights uniform."""
    m = [b.attn for b in model.blocks][layer]
    proj, first = (m.qkv_proj, m.d_model + m.n_kv_heads * m.d_k) if m.fused_qkv else (m.v_proj, 0)
    rows = slice(first + head * m.d_k, first + (head + 1) * m.d_k)  # v rows come last when fused
    saved = proj.weight[rows].clone()
    with torch.no_grad():
        proj.weight[rows] = 0.0
    try:
        yield
    finally:
        with torch.no_grad():
            proj.weight[rows] = saved


def _uniform_over_allowed(maps_head: torch.Tensor, causal: bool) -> bool:
    """True if every row is exactly 1/(number of allowed keys) on allowed keys and 0 elsewhere."""
    T = maps_head.shape[-1]
    allowed = torch.ones(T, T, dtype=torch.bool).tril() if causal else torch.ones(T, T, dtype=torch.bool)
    want = allowed / allowed.sum(-1, keepdim=True)  # (T, S): 1/(t+1) below the diagonal
    return bool((maps_head == want.to(maps_head.dtype)).all())


@contextlib.contextmanager
def _planted_ablation_keeping_the_query_bias(model, layer, head):
    """Bug: zeroes the head's query weight rows but not their bias, so q = b_q, not 0."""
    m = [b.attn for b in model.blocks][layer]
    proj = m.qkv_proj if m.fused_qkv else m.q_proj
    rows = slice(head * m.d_k, (head + 1) * m.d_k)
    saved = proj.weight[rows].clone()
    with torch.no_grad():
        proj.weight[rows] = 0.0
    try:
        yield
    finally:
        with torch.no_grad():
            proj.weight[rows] = saved


def _with_random_biases(model: nn.Module, seed: int = 0) -> nn.Module:
    """Give every Linear a non-zero bias (our draw starts them at 0, which hides a kept bias)."""
    g = _gen(seed)
    with torch.no_grad():
        for lin in model.modules():
            if isinstance(lin, nn.Linear) and lin.bias is not None:
                lin.bias.copy_(torch.randn(lin.bias.shape, generator=g))
    return model


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("ablate, right", [(tr.ablate_uniform, True),
                                           (_planted_ablation_zeroing_values, False),
                                           (_planted_ablation_keeping_the_query_bias, False)])
def test_ablation_makes_exactly_that_head_uniform_over_its_allowed_keys(ablate, right, fused):
    model = tr.TinyTransformer(vocab=10, T=7, d_model=16, n_heads=2, n_layers=2, causal=True,
                               fused_qkv=fused)
    _with_random_biases(model)
    x = torch.randint(0, 10, (3, 7), generator=_gen())
    before = tr.attention_maps(model, x)
    assert not _uniform_over_allowed(before[1][:, 0], causal=True), "the head starts uniform"
    params = [p.clone() for p in model.parameters()]
    with ablate(model, 1, 0):
        during = tr.attention_maps(model, x)
    assert _uniform_over_allowed(during[1][:, 0], causal=True) is right
    assert torch.equal(during[1][:, 1], before[1][:, 1]), "the other head must not change"
    assert torch.equal(during[0], before[0]), "the other layer must not change"
    for p, q in zip(model.parameters(), params, strict=True):
        assert torch.equal(p, q), "weights must be restored on exit"


def test_ablation_hurts_the_trained_head_and_rejects_bad_indices(trained_reversal):
    task, model, _ = trained_reversal
    x, y = task.batch(_gen(9), 256)
    full = tr.accuracy(model, x, y)
    with tr.ablate_uniform(model, 0, 0):
        ablated = tr.accuracy(model, x, y)
    tr.check_ablation_drop(full, ablated, below=0.5)
    assert tr.accuracy(model, x, y) == full
    with pytest.raises(ValueError, match=r"layer must be an int in \[0, 0\]"):
        with tr.ablate_uniform(model, 1, 0):
            pass
    with pytest.raises(ValueError, match=r"head must be an int in \[0, 0\]"):
        with tr.ablate_uniform(model, 0, 1):
            pass


# ---- the named checks can fail -------------------------------------------------------------------
def test_named_checks_pass_and_fail_with_reasons():
    assert "0.9950 >= 0.99" in tr.check_accuracy(0.995)
    with pytest.raises(AssertionError, match="expected >= 0.99, got 0.3300.*plateau"):
        tr.check_accuracy(0.33)
    assert "head 1" in tr.check_head_weight(torch.tensor([0.2, 0.95]))
    with pytest.raises(AssertionError, match="at most 0.400.*0.100, 0.400"):
        tr.check_head_weight(torch.tensor([0.1, 0.4]))
    assert "1.000 -> 0.290" in tr.check_ablation_drop(1.0, 0.29)
    with pytest.raises(AssertionError, match="redundancy"):
        tr.check_ablation_drop(1.0, 0.97)


# ---- initialisation -----------------------------------------------------------------------------
def _stds(model, scheme):
    """Measured std of each Linear weight after init_weights, with the std the scheme promises."""
    tr.init_weights(model, scheme, seed=0)
    outs = {id(lin) for lin in tr.residual_projections(model)}
    rows = []
    for m in model.modules():
        if isinstance(m, nn.Linear):
            fan_out, fan_in = m.weight.shape
            want = {"ours": 1 / math.sqrt(fan_in), "xavier": math.sqrt(2 / (fan_in + fan_out)),
                    "gpt2": 0.02}.get(scheme, 0.02)
            if scheme == "gpt2_scaled" and id(m) in outs:
                want = 0.02 / math.sqrt(len(outs))
            rows.append((float(m.weight.detach().std()), want, m))
    return rows


@pytest.mark.parametrize("scheme", sorted(tr.SCHEMES))
def test_init_schemes_draw_the_stated_std(scheme):
    model = tr.TinyTransformer(vocab=50, T=8, d_model=128, n_heads=4, n_layers=2, mlp=True)
    rows = _stds(model, scheme)
    assert len(rows) == 2 * (4 + 2) + 1  # per block: q, k, v, out, two MLP layers; plus the head
    for got, want, _ in rows:
        # >= 6,400 draws per matrix: the std's relative standard error is <= 1/sqrt(2n) ~ 0.9%
        assert abs(got / want - 1) < 0.05, f"{scheme}: std {got:.4g}, stated {want:.4g}"
    for m in model.modules():
        if isinstance(m, nn.Linear):
            assert not bool(m.bias.any())
        if isinstance(m, nn.LayerNorm):
            assert bool((m.weight == 1).all()) and not bool(m.bias.any())
    if scheme == "xavier":  # uniform: bounded by a = sqrt(6 / (fan_in + fan_out))
        for _, want, m in rows:
            assert float(m.weight.detach().abs().max()) <= want * math.sqrt(3)
    if scheme == "gpt2_scaled":
        assert len(tr.residual_projections(model)) == 4  # 2 per block: 0.02 / sqrt(2 L)


def test_the_std_check_catches_a_planted_scheme():
    model = tr.TinyTransformer(vocab=50, T=8, d_model=128, n_heads=4, n_layers=1)
    rows = _stds(model, "ours")
    with torch.no_grad():  # plant: 1/fan_in instead of 1/sqrt(fan_in)
        for _, _, m in rows:
            m.weight.normal_(0.0, 1 / m.weight.shape[1], generator=_gen())
    assert all(abs(float(m.weight.detach().std()) / want - 1) > 0.05 for _, want, m in rows)


def test_init_rejects_an_unknown_scheme():
    with pytest.raises(ValueError, match="scheme must be one of"):
        tr.init_weights(tr.TinyTransformer(vocab=5, T=4, d_model=8, n_heads=2), "kaiming")


def test_stacked_variance_shapes_and_the_measured_claims():
    bare = {s: tr.stacked_variance(s, depth=6, d_model=128, n_heads=4, T=16, B=4)
            for s in tr.SCHEMES}
    assert all(len(v) == 7 and abs(v[0] - 1) < 0.05 for v in bare.values())
    # one layer of 0.02 weights multiplies the variance by about (d * 0.02^2)^2 per W_v W_o pair
    assert bare["gpt2"][-1] < 1e-8 and 0.005 < bare["ours"][-1] < 1.0
    resid = tr.stacked_variance("gpt2_scaled", depth=6, d_model=128, n_heads=4, T=16, B=4,
                                residual=True)
    assert abs(resid[-1] - 1) < 0.05, "small residual branches keep the stream near its input"


# ---- the scrubber, without a browser ------------------------------------------------------------
def test_scrubber_slider_changes_image_and_caption(trained_reversal):
    _, _, hist = trained_reversal
    s = scrub.TrainingScrubber(hist)
    png0, cap0 = bytes(s.image.value), s.caption.value
    assert png0.startswith(b"\x89PNG") and "step 0 of 120" in cap0
    s.slider.value = 3  # the last snapshot, step 120
    assert bytes(s.image.value) != png0
    assert "step 120 of 120" in s.caption.value and "snapshot 4 of 4" in s.caption.value
    s.slider.value = 0
    assert bytes(s.image.value) == png0, "going back shows the cached first frame"
    assert [o[0] for o in s.slider.options] == ["0", "40", "80", "120"]


def test_scrubber_frames_hold_the_recorded_maps(trained_reversal):
    _, _, hist = trained_reversal
    s = scrub.TrainingScrubber(hist, example=2)
    fig = s.frame(1)
    shown = [np.asarray(ax.images[0].get_array()) for ax in fig.axes if ax.images]
    np.testing.assert_array_equal(shown[0], hist.snapshots[1][0][2, 0].numpy())
    with pytest.raises(ValueError, match=r"index must be an int in \[0, 3\]"):
        scrub.snapshot_maps(hist, 4)
    with pytest.raises(ValueError, match=r"example must be an int in \[0, 3\]"):
        scrub.TrainingScrubber(hist, example=4)


def test_scrubber_falls_back_to_a_png_for_static_viewers(trained_reversal, monkeypatch):
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda obj, raw=False: shown.append(obj))
    scrub.TrainingScrubber(trained_reversal[2])._ipython_display_()
    (bundle,) = shown
    assert "image/png" in bundle and "training scrubber" in bundle["text/plain"]


def test_pictures_draw(trained_reversal):
    _, _, hist = trained_reversal
    assert scrub.plot_block().texts
    fig = scrub.plot_before_after(hist)
    maps = [np.asarray(ax.images[0].get_array()) for ax in fig.axes if ax.images]
    np.testing.assert_array_equal(maps[0], hist.snapshots[0][0][0, 0].numpy())
    np.testing.assert_array_equal(maps[1], hist.snapshots[-1][0][0, 0].numpy())
    ax = scrub.plot_curves(hist, step=40)
    assert len(ax.lines) == 2  # the loss and the marker


def test_marks_ring_the_chosen_cells_and_must_match_the_maps(trained_reversal):
    _, _, hist = trained_reversal
    keys = [5, 4, 3, -1, 1, 0]  # query 3 has no ring
    fig = scrub.plot_snapshot(hist, -1, marks=[keys])
    (ax,) = [a for a in fig.axes if a.images]
    (rings,) = ax.collections
    np.testing.assert_array_equal(rings.get_offsets(), [[5, 0], [4, 1], [3, 2], [1, 4], [0, 5]])
    with pytest.raises(ValueError, match=r"one entry per map \(1\), got 2"):
        scrub.plot_snapshot(hist, 0, marks=[keys, keys])
