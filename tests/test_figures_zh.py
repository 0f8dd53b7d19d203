"""The course's figures and widgets in Chinese (issue 31, item 2: "figures that carry words get
CJK-capable labels").

Under `use_language("zh_CN")` every drawing function of `mha_course.viz`, `viz_serving` and
`scrub` labels its figure in Chinese (read back from the figure's own Text artists), renders it
with a CJK font and no missing-glyph warning (warnings are errors here), and leaves no English
prose on it; under English the labels are the old ones, byte for byte, and no CJK font is in
matplotlib's rcParams. The widgets' labels and captions follow too. The catalogs
(`src/mha_course/locale/zh_CN/LC_MESSAGES/{viz,viz_serving,scrub}.po`) hold exactly the
messages the code marks with `_()` / `N_()`, each translated, placeholders kept. The checks are
shown to fail when a translation is missing and when no CJK font is found.
"""

from __future__ import annotations

import copy
import io
import logging
import pathlib
import re
import types
import warnings

import matplotlib
import matplotlib.pyplot as plt
import matplotlib.text
import numpy as np
import pytest
import torch
from matplotlib import font_manager, ft2font

from mha.modules.numpy_mha import MultiHeadAttention
from mha.training.train import History
from mha_course import i18n, scrub, viz, viz_serving
from mha_course.i18n import use_language

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCES = {m.__name__.rsplit(".", 1)[1]: pathlib.Path(m.__file__) for m in (viz, viz_serving, scrub)}
LC = ROOT / "src" / "mha_course" / "locale" / "zh_CN" / "LC_MESSAGES"
CJK = re.compile(r"[\u3400-\u9fff]")
# Latin words that stay English on a Chinese figure: API, method and library names, the
# glossary's untranslated terms, maths and code drawn as such, and this file's test data.
KEEP_ENGLISH = {
    "QKV", "softmax", "reshape", "transpose", "sqrt", "inf", "weights", "LayerNorm", "Transformer",
    "MLP", "MHA", "d_model", "d_k", "W_o", "out", "token", "nats", "one", "hot", "RoPE", "ALiBi",
    "pad", "mathdefault", "reversal",
}


@pytest.fixture(autouse=True)
def _close_figures_and_restore_fonts():
    sans = list(matplotlib.rcParams["font.sans-serif"])
    yield
    plt.close("all")
    i18n.use_cjk_font()  # English (the default): takes out what a Chinese figure put in
    assert list(matplotlib.rcParams["font.sans-serif"]) == sans


# Inputs: small, fixed, no training ------------------------------------------------------------
def _history() -> History:
    g = torch.Generator().manual_seed(0)
    snaps = [[torch.softmax(torch.randn(2, 2, 5, 5, generator=g), -1)] for _ in range(3)]
    return History(task="reversal", losses=[2.0 / (i + 1) for i in range(40)],
                   eval_steps=[0, 20, 40], eval_acc=[0.1, 0.5, 0.9], snapshot_steps=[0, 20, 40],
                   snapshots=snaps)


def _pool():
    """A block pool as plot_pool reads it: block 0 shared by two tables, one table empty."""
    return types.SimpleNamespace(
        tables={0: [0, 1], 1: [0, 2], 2: []}, refcounts=np.array([2, 1, 1, 0]), block_size=4,
        positions=np.array([[0, 1, 2, 3], [4, 5, -1, -1], [4, -1, -1, -1], [-1] * 4]))


def _timeline():
    """Scheduler StepRecords as plot_timeline reads them, every state of STATES used once."""
    def rec(**k):
        return types.SimpleNamespace(**{"prefilled": [], "decoded": [], "preempted": [],
                                        "retired": [], "blocks_in_use": 0, **k})
    return [rec(step=0, prefilled=[(0, 0, 4)], blocks_in_use=1),
            rec(step=1, prefilled=[(1, 0, 3)], decoded=[0], blocks_in_use=3),
            rec(step=2, decoded=[0, 1], blocks_in_use=3),
            rec(step=3, decoded=[1], preempted=[0], retired=[1], blocks_in_use=2)], {0: 0, 1: 1, 2: 3}


def _ledger(causal: bool = True):
    return MultiHeadAttention(16, 4).trace(np.zeros((1, 6, 16)), causal=causal)


# Each figure function: how to draw it, and (English, Chinese) labels it must carry.
FIGURES = {
    "plot_pipeline": (lambda: viz.plot_pipeline().figure, [
        ("Multi-head attention in seven steps", "七步走完多头注意力"),
        ("1) QKV projection", "1) QKV 线性投影"), ("2) split heads", "2) 分头"),
        ("3) scaled scores", "3) 缩放打分"), ("4) causal mask", "4) 因果掩码"),
        ("-inf above diagonal", "对角线上方为 -inf"), ("5) softmax", "5) softmax"),
        ("rows sum to 1", "每行和为 1"), ("6) weighted sum", "6) 加权求和"),
        ("7) merge + project", "7) 合头 + 投影"), ("concat heads, W_o", "拼接各头，乘 W_o"),
        ("x W + b", "x W + b")]),
    "plot_pipeline(ledger)": (lambda: viz.plot_pipeline(_ledger(causal=False)).figure, [
        ("Multi-head attention in seven steps (shapes from a real run)",
         "七步走完多头注意力（形状来自一次真实运行）"),
        ("(skipped)", "（跳过）"), ("(1, 4, 6, 6)", "(1, 4, 6, 6)")]),
    "plot_attention": (lambda: viz.plot_attention(viz.attention_maps(16, 4, 5)[0], title="A1",
                                                  colorbar=True, annotate=True).figure, [
        ("key s", "键 s"), ("query t", "查询 t"), ("weight (grey: exactly 0)", "权重（灰色：恰为 0）")]),
    "plot_heads": (lambda: viz.plot_heads(viz.attention_maps(16, 4, 5), suptitle="B2"), [
        ("head 0", "头 0"), ("head 3", "头 3"), ("weight (grey: exactly 0)", "权重（灰色：恰为 0）")]),
    "plot_pool": (lambda: viz_serving.plot_pool(_pool(), title="P", names={0: "S0"}).figure, [
        ("(no blocks)", "（无块）"), ("ref 2\n4/4", "引用 2\n4/4"), ("ref 1\n1/4", "引用 1\n1/4"),
        ("pool", "块池"), ("tables", "块表"), ("held by one table", "仅一个块表持有"),
        ("shared (refcount > 1)", "共享（引用计数 > 1）"), ("free", "空闲")]),
    "plot_timeline": (lambda: viz_serving.plot_timeline(*_timeline(), title="TL"), [
        ("blocks\nin use", "在用\n块数"), ("scheduler step", "调度步"), ("request 0", "请求 0"),
        ("request 2", "请求 2"), ("not arrived", "未到达"), ("waiting", "等待"),
        ("prefill chunk", "预填充分块"), ("decode", "解码"), ("preempted", "被抢占"), ("done", "完成")]),
    "plot_block": (lambda: scrub.plot_block().figure, [
        ("multi-head\nattention", "多头\n注意力"), ("residual: x + MHA(LN(x))", "残差：x + MHA(LN(x))"),
        ("residual: h + MLP(LN(h))", "残差：h + MLP(LN(h))"), ("LayerNorm", "LayerNorm"),
        ("One pre-LayerNorm Transformer block (our toy models switch the MLP off)",
         "一个前置 LayerNorm 的 Transformer 块（我们的玩具模型关掉了 MLP）")]),
    "plot_curves": (lambda: scrub.plot_curves(_history(), step=20).figure, [
        ("training step", "训练步"), ("loss (cross-entropy)", "损失（交叉熵）"),
        ("held-out accuracy", "留出集准确率"), ("reversal: loss and accuracy", "reversal：损失与准确率")]),
    "plot_snapshot": (lambda: scrub.plot_snapshot(_history(), -1, marks=[[0, 1, 2, 3, 4]] * 2), [
        ("layer 0 head 0", "第 0 层 头 0"), ("layer 0 head 1", "第 0 层 头 1"),
        ("reversal: step 40", "reversal：第 40 步"), ("key s", "键 s")]),
    "plot_before_after": (lambda: scrub.plot_before_after(_history()), [
        ("reversal: step 0", "reversal：第 0 步"), ("reversal: step 40", "reversal：第 40 步"),
        ("weight (grey: exactly 0)", "权重（灰色：恰为 0）")]),
    "TrainingScrubber.frame": (lambda: scrub.TrainingScrubber(_history()).frame(1), [
        ("reversal: step 20", "reversal：第 20 步"), ("layer 0 head 1", "第 0 层 头 1"),
        ("training step", "训练步"), ("reversal: loss and accuracy", "reversal：损失与准确率")]),
    "AttentionExplorer.fig": (lambda: _explorer(n_heads=2).fig, [
        ("head 0", "头 0"), ("query t", "查询 t"), ("weight (grey: exactly 0)", "权重（灰色：恰为 0）")]),
    "AttentionExplorer.fig(one head)": (lambda: _one_head(), [
        ("head 1 of 4", "头 1（共 4 个）"), ("key s", "键 s")]),
}


def _explorer(**kw) -> viz.AttentionExplorer:
    pytest.importorskip("ipywidgets")
    return viz.AttentionExplorer(**kw)


def _one_head():
    e = _explorer()
    e.controls["head"].value = 1
    return e.fig


def texts(fig) -> list[str]:
    """Every non-empty text a figure draws: titles, labels, ticks, legends, annotations."""
    fig.canvas.draw()
    return [t.get_text() for t in fig.findobj(matplotlib.text.Text) if t.get_text()]


def render(fig, caplog) -> bytes:
    """The figure as PNG, failing on a missing glyph (a warning) or a font matplotlib cannot
    find or match (its log)."""
    caplog.clear()
    buf = io.BytesIO()
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING, logger="matplotlib"):
        warnings.simplefilter("error")
        fig.savefig(buf, format="png", dpi=50)
    fonts = [r.getMessage() for r in caplog.records if r.name.startswith("matplotlib")]
    assert not fonts, f"matplotlib's font lookup complained: {fonts}"
    return buf.getvalue()


def check_chinese(name: str, got: list[str]) -> None:
    """The Chinese labels are there, the English ones are not, no English prose is left."""
    _draw, pairs = FIGURES[name]
    for en, zh in pairs:
        assert zh in got, f"{name}: no {zh!r} on the Chinese figure (the English {en!r} instead?)"
        if en != zh:
            assert en not in got, f"{name}: {en!r} is still English on the Chinese figure"
    for text in got:
        words = set(re.findall(r"[A-Za-z_]{3,}", text)) - KEEP_ENGLISH
        assert not words, f"{name}: English words {sorted(words)} left in {text!r}"


# The figures ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", FIGURES)
def test_figure_labels_are_chinese_and_every_glyph_renders(name, caplog):
    with use_language("zh_CN"):
        fig = FIGURES[name][0]()
        assert i18n.cjk_font() is not None, "no CJK font: make fonts-zh"
        assert matplotlib.rcParams["font.sans-serif"][0] == i18n.cjk_font()
        check_chinese(name, texts(fig))
        assert render(fig, caplog)[:4] == b"\x89PNG"


@pytest.mark.parametrize("name", FIGURES)
def test_figure_labels_stay_english_in_english(name, caplog):
    with use_language("zh_CN"):  # a Chinese figure first: switching back must undo its font
        FIGURES[name][0]()
    plt.close("all")
    with use_language("en"):
        fig = FIGURES[name][0]()
        assert not set(matplotlib.rcParams["font.sans-serif"]) & set(i18n.CJK_FAMILIES)
        got = texts(fig)
        for en, _zh in FIGURES[name][1]:
            assert en in got, f"{name}: the English label {en!r} changed"
        assert not [t for t in got if CJK.search(t)], f"{name}: Chinese on an English figure"
        render(fig, caplog)


def test_chinese_pipeline_labels_fit_inside_their_boxes():
    from matplotlib.patches import FancyBboxPatch

    with use_language("zh_CN"):
        ax = viz.plot_pipeline(_ledger(causal=False))
        ax.figure.canvas.draw()
        r = ax.figure.canvas.get_renderer()
        boxes = [p.get_window_extent(r) for p in ax.patches if isinstance(p, FancyBboxPatch)]
        inside = 0
        for t in ax.texts:
            tb = t.get_window_extent(r)
            box = next((b for b in boxes if b.x0 <= tb.x0 + tb.width / 2 <= b.x1), None)
            if box is not None:
                assert box.x0 <= tb.x0 and tb.x1 <= box.x1, f"{t.get_text()!r} spills out of its box"
                inside += 1
        assert inside == 21


def test_the_chinese_check_fails_when_a_translation_is_missing(monkeypatch):
    merged = dict(i18n.catalog("zh_CN"))
    del merged["weight (grey: exactly 0)"]
    monkeypatch.setattr(i18n, "catalog", lambda lang: merged if lang == "zh_CN" else {})
    with use_language("zh_CN"):
        got = texts(FIGURES["plot_heads"][0]())
    with pytest.raises(AssertionError, match="weight"):
        check_chinese("plot_heads", got)


def test_rendering_fails_without_a_cjk_font(monkeypatch, caplog):
    monkeypatch.setattr(i18n, "cjk_font", lambda: None)
    with use_language("zh_CN"):
        fig = FIGURES["plot_block"][0]()
        assert matplotlib.rcParams["font.sans-serif"][0] not in i18n.CJK_FAMILIES
        with pytest.raises(UserWarning, match="missing from font"):
            render(fig, caplog)


# The widgets ----------------------------------------------------------------------------------
def test_explorer_controls_and_caption_in_both_languages(monkeypatch):
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda obj, raw=False: shown.append(obj))
    with use_language("en"):
        e = _explorer()
        assert [c.description for c in e.controls.values()] == [
            "causal mask", "heads h", "length T", "temperature", "show", "mask / bias"]
        assert [label for label, _ in e.controls["head"].options][:2] == ["all heads", "head 0"]
        assert [label for label, _ in e.controls["pattern"].options] == [
            "none", "sliding window", "padding", "ALiBi", "RoPE"]
        assert e.caption.value.startswith("<b>initial view</b>. causal on: 15 of 36 weights")
        e._ipython_display_()
        assert shown[-1]["text/plain"].startswith("attention explorer (run the notebook")
    with use_language("zh_CN"):
        e = _explorer()
        assert [c.description for c in e.controls.values()] == [
            "因果掩码", "头数 h", "长度 T", "温度", "显示", "掩码 / 偏置"]
        assert [label for label, _ in e.controls["head"].options][:2] == ["全部头", "头 0"]
        assert [label for label, _ in e.controls["pattern"].options] == [
            "无", "滑动窗口", "填充", "ALiBi", "RoPE"]
        assert [v for _, v in e.controls["pattern"].options] == list(viz.PATTERNS)
        assert e.caption.value.startswith("<b>初始视图</b>。因果掩码开：每个头的 36 个权重中有 15 个恰为 0")
        e.controls["T"].value = 8
        assert "<b>改动：T 6 -> 8</b>" in e.caption.value
        e._ipython_display_()
        assert shown[-1]["text/plain"].startswith("注意力探索器")
        odd = _explorer(d_model=12, n_heads=4)  # d_k = 3: RoPE cannot rotate an odd width
        odd.controls["pattern"].value = "rope"
        assert odd.caption.value.startswith("<b style='color:#b00'>无法显示：")


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("pattern", list(viz.PATTERNS))
def test_describe_says_the_same_numbers_in_chinese(pattern, causal):
    maps = viz.attention_maps(16, 4, 7, causal, 0.7, pattern=pattern)
    with use_language("en"):
        en = viz.describe(maps, causal, 0.7, pattern)
    with use_language("zh_CN"):
        zh = viz.describe(maps, causal, 0.7, pattern)
    assert CJK.search(zh) and not {"causal", "temperature", "entropy"} & set(zh.split())
    number = re.compile(r"\d+(?:\.\d+)?")
    assert sorted(number.findall(zh)) == sorted(number.findall(en))
    assert ("因果掩码开" if causal else "因果掩码关") in zh


def test_scrubber_slider_and_caption_in_chinese(monkeypatch):
    pytest.importorskip("ipywidgets")
    with use_language("en"):
        s = scrub.TrainingScrubber(_history())
        assert s.slider.description == "training step"
        assert s.caption_text(2) == ("step 40 of 40: training loss 0.050; held-out accuracy 0.900 "
                                     "(snapshot 3 of 3)")
    with use_language("zh_CN"):
        s = scrub.TrainingScrubber(_history())
        assert s.slider.description == "训练步"
        assert s.caption_text(0) == "第 0 步（共 40 步）：还没训练；留出集准确率 0.100（快照 1 / 3）"
        assert s.caption_text(2) == "第 40 步（共 40 步）：训练损失 0.050；留出集准确率 0.900（快照 3 / 3）"


# The catalogs ---------------------------------------------------------------------------------
def _extract(module: str) -> list[str]:
    from babel.messages.extract import extract_from_file

    seen: dict[str, None] = {}
    for _line, msg, _comments, _context in extract_from_file(
            "python", str(SOURCES[module]), keywords={"_": None, "N_": None}):
        if isinstance(msg, str) and msg:
            seen.setdefault(msg)
    return list(seen)


@pytest.mark.parametrize("module", sorted(SOURCES))
def test_catalog_holds_exactly_the_marked_messages_all_translated(module):
    from babel.messages.pofile import read_po

    from tools.book.messages import problems

    with (LC / f"{module}.po").open("rb") as f:
        cat = read_po(f, locale="zh_CN", domain=module)
    entries = {m.id: m for m in cat if m.id}
    marked = _extract(module)
    assert marked, f"no _() / N_() messages found in {module}.py"
    missing = [m for m in marked if m not in entries]
    assert not missing, f"{module}.po lacks {missing} (run the catalog update, then translate)"
    stale = sorted(set(entries) - set(marked))
    assert not stale, f"{module}.po holds messages the code no longer has: {stale}"
    for msg in marked:
        entry = entries[msg]
        assert entry.string and not entry.fuzzy, f"{module}.po: {msg!r} untranslated or fuzzy"
        assert not problems(msg, entry.string), f"{module}.po: {msg!r}: {problems(msg, entry.string)}"
    merged = i18n.catalog("zh_CN")  # every catalog together: no other one overrides ours
    assert all(merged[m] == entries[m].string for m in marked)


def test_messages_are_translated_where_drawn_not_at_import():
    """Module constants keep their English (N_ marks them); the drawing code translates them."""
    with use_language("zh_CN"):
        assert viz.PIPELINE[0][1] == "QKV projection" and viz_serving.STATES[1] == "waiting"
        assert i18n._(viz.PIPELINE[0][1]) == "QKV 线性投影"


# The font -------------------------------------------------------------------------------------
@pytest.fixture
def bare_fonts(monkeypatch):
    """matplotlib's font manager with no CJK font in it, and cjk_font looking afresh."""
    bare = copy.copy(font_manager.fontManager)
    bare.ttflist = [f for f in font_manager.fontManager.ttflist
                    if f.name not in i18n.CJK_FAMILIES and "CJK" not in f.name
                    and "WenQuanYi" not in f.name]
    monkeypatch.setattr(font_manager, "fontManager", bare)
    monkeypatch.delenv("MHA_CJK_FONT", raising=False)
    i18n.cjk_font.cache_clear()
    yield bare
    i18n.cjk_font.cache_clear()


def _wheel_font() -> pathlib.Path | None:
    try:
        import noto_cjk_sans_otc
    except ImportError:
        return None
    return pathlib.Path(str(noto_cjk_sans_otc.FONT_PATH))


def test_lookup_takes_a_system_font_file_the_cache_predates(bare_fonts, monkeypatch):
    wqy = pathlib.Path("/usr/share/fonts/truetype/wqy/wqy-microhei.ttc")
    if not wqy.is_file():
        pytest.skip("fonts-wqy-microhei is not installed")
    monkeypatch.setattr(font_manager, "findSystemFonts", lambda *a, **k: [str(wqy)])
    assert i18n.cjk_font() == "WenQuanYi Micro Hei"
    bold = [f for f in bare_fonts.ttflist if f.name == "WenQuanYi Micro Hei" and f.weight == 700]
    assert bold and bold[0].fname == str(wqy)  # bold text uses the regular face, quietly


def test_lookup_falls_back_to_the_pypi_wheel(bare_fonts, monkeypatch):
    path = _wheel_font()
    if path is None:
        pytest.skip("noto-cjk-sans-otc is not installed (make fonts-zh)")
    monkeypatch.setattr(font_manager, "findSystemFonts", lambda *a, **k: [])
    assert i18n.cjk_font() == "Noto Sans CJK SC"  # the Simplified Chinese face of the .ttc
    assert any(f.name == "Noto Sans CJK SC" and pathlib.Path(f.fname) == path
               for f in bare_fonts.ttflist)


def test_lookup_honours_mha_cjk_font(bare_fonts, monkeypatch):
    path = _wheel_font() or pathlib.Path("/usr/share/fonts/truetype/wqy/wqy-microhei.ttc")
    if not path.is_file():
        pytest.skip("no CJK font file on this machine")
    monkeypatch.setenv("MHA_CJK_FONT", str(path))
    assert i18n.cjk_font() in ("Noto Sans CJK SC", "WenQuanYi Micro Hei")


def test_lookup_warns_when_there_is_no_cjk_font(bare_fonts, monkeypatch):
    import importlib.util

    monkeypatch.setattr(font_manager, "findSystemFonts", lambda *a, **k: [])
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == i18n.CJK_WHEEL else real(name, *a))
    with pytest.warns(UserWarning, match="no CJK font found.*make fonts-zh"):
        assert i18n.cjk_font() is None
    with use_language("zh_CN"):
        assert i18n.use_cjk_font() is None


@pytest.fixture
def fresh_lookup(monkeypatch):
    """cjk_font looks again (in matplotlib's own font manager), and again after the test."""
    i18n.cjk_font.cache_clear()
    yield monkeypatch
    monkeypatch.delenv("MHA_CJK_FONT", raising=False)
    i18n.cjk_font.cache_clear()


@pytest.mark.parametrize("source", ["system", "wheel"])
def test_a_chinese_figure_renders_with_either_font(source, fresh_lookup, caplog):
    """Both fonts `make` may give a learner draw every glyph of the course's figures."""
    path = (pathlib.Path("/usr/share/fonts/truetype/wqy/wqy-microhei.ttc") if source == "system"
            else _wheel_font())
    if path is None or not path.is_file():
        pytest.skip(f"no {source} CJK font installed (apt-get install fonts-wqy-microhei; "
                    "pip install noto-cjk-sans-otc)")
    fresh_lookup.setenv("MHA_CJK_FONT", str(path))
    family = "WenQuanYi Micro Hei" if source == "system" else "Noto Sans CJK SC"
    with use_language("zh_CN"):
        for name in ("plot_pipeline(ledger)", "plot_timeline"):  # bold, full-width, minus signs
            fig = FIGURES[name][0]()
            assert matplotlib.rcParams["font.sans-serif"][0] == family
            found = font_manager.fontManager._find_fonts_by_props(
                font_manager.FontProperties(family=["sans-serif"]))
            assert pathlib.Path(found[0]).resolve() == path.resolve()
            render(fig, caplog)
            plt.close("all")
    # every character any translation of the three catalogs can put on a figure, in that face
    face = next(f for f in font_manager.fontManager.ttflist
                if f.name == family and pathlib.Path(f.fname).resolve() == path.resolve())
    charmap = ft2font.FT2Font(face.fname, face_index=face.index).get_charmap()
    used = {c for m in SOURCES for text in i18n.read_po(LC / f"{m}.po").values() for c in text}
    used |= {chr(c) for c in range(0x20, 0x7f)} | {"\u2212"}  # ASCII and the tick labels' minus
    lacking = sorted(c for c in used - {"\n"} if ord(c) not in charmap)
    assert not lacking, f"{family} has no glyph for {lacking}"
