"""The language the course speaks to a learner: English, or Chinese in the Chinese edition.

The Try-it checks wrap each message in `_()`: `not_yet(_("got {kind}").format(kind=...))`. In
the English edition `_` returns its argument. In the Chinese edition (`make lab-zh` writes the
Chinese notebooks into a folder holding a `.mha-language` file; the kernel starts in that
folder) it returns the message's translation from the catalogs in `locale/zh_CN/LC_MESSAGES/` (one
per module),
falling back to the English when an entry is missing or fuzzy. `MHA_LANG=zh_CN` (or `en`)
chooses explicitly, and `use_language` switches inside a running kernel or a test.

Library error messages (numpy's, PyTorch's, `mha`'s own) stay English in both editions.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pathlib
from collections.abc import Iterator

LOCALE = pathlib.Path(__file__).resolve().parent / "locale"
LANGUAGES = ("en", "zh_CN")
MARKER = ".mha-language"
_chosen: list[str] = []  # set by use_language; wins over the environment and the marker


def language() -> str:
    """'en' or 'zh_CN': use_language, else $MHA_LANG, else a `.mha-language` file here, else 'en'."""
    if _chosen:
        return _chosen[-1]
    lang = os.environ.get("MHA_LANG", "").strip()
    if not lang:
        marker = pathlib.Path.cwd() / MARKER
        lang = marker.read_text(encoding="utf-8").strip() if marker.is_file() else "en"
    return lang if lang in LANGUAGES else "en"


@contextlib.contextmanager
def use_language(lang: str) -> Iterator[None]:
    """Speak `lang` inside the block (tests, or a learner who wants the other edition's messages)."""
    if lang not in LANGUAGES:
        raise ValueError(f"language must be one of {LANGUAGES}, got {lang!r}")
    _chosen.append(lang)
    try:
        yield
    finally:
        _chosen.pop()


def read_po(path: pathlib.Path) -> dict[str, str]:
    """msgid -> msgstr of a gettext catalog, leaving out empty, fuzzy and obsolete entries."""
    from babel.messages.pofile import read_po as babel_read_po  # requirements.txt

    with path.open("rb") as f:
        cat = babel_read_po(f)
    return {m.id: m.string for m in cat if m.id and m.string and not m.fuzzy}


@functools.cache
def catalog(lang: str) -> dict[str, str]:
    """The course's messages in `lang` (empty for English or when no catalog is installed)."""
    if lang == "en":
        return {}
    merged: dict[str, str] = {}
    for path in sorted((LOCALE / lang / "LC_MESSAGES").glob("*.po")):  # one catalog per module
        merged.update(read_po(path))
    return merged


def _(message: str) -> str:
    """`message` in the learner's language; the English itself where no translation exists."""
    return catalog(language()).get(message, message)


# Figures in Chinese -------------------------------------------------------------------------
CJK_FAMILIES = (
    "Noto Sans CJK SC", "Source Han Sans SC", "Noto Sans SC", "Source Han Sans CN",
    "WenQuanYi Micro Hei", "WenQuanYi Zen Hei", "PingFang SC", "Hiragino Sans GB",
    "Microsoft YaHei", "SimHei", "Heiti SC", "STHeiti", "Sarasa Gothic SC", "Droid Sans Fallback",
    "Noto Sans CJK TC", "Noto Sans CJK JP", "Arial Unicode MS",
)
"""Font families that draw Simplified Chinese, best first (Linux, macOS, Windows)."""
CJK_FILES = (
    "notosanscjk-regular.ttc", "notosanscjksc-regular.otf", "notosanssc-regular.otf",
    "notosanssc-regular.ttf", "sourcehansanssc-regular.otf", "wqy-microhei.ttc", "wqy-zenhei.ttc",
    "pingfang.ttc", "hiragino sans gb.ttc", "msyh.ttc", "msyh.ttf", "simhei.ttf", "stheiti medium.ttc",
    "droidsansfallbackfull.ttf", "droidsansfallback.ttf", "arial unicode.ttf",
)
"""The files those families come in (lower case), for fonts installed after matplotlib built its
font cache: `apt-get install fonts-wqy-microhei` in a running kernel."""
CJK_WHEEL = "noto_cjk_sans_otc"
"""The PyPI wheel `noto-cjk-sans-otc` (Noto Sans CJK, 15.5 MB) that `make fonts-zh` installs."""
_cjk_inserted: dict[str, str] = {}  # rcParams key -> the family use_cjk_font put there


@functools.cache
def cjk_font() -> str | None:
    """The family name of a font matplotlib can draw Chinese with, its file registered; None if none.

    Looked up in this order: $MHA_CJK_FONT (a family name or a font file); the families of
    CJK_FAMILIES that matplotlib already knows; font files of CJK_FILES on the system that its
    cache predates; the `noto-cjk-sans-otc` wheel in this environment. Found once per process.
    """
    import importlib.util
    import warnings

    from matplotlib import font_manager

    def known() -> str | None:
        names = {f.name for f in font_manager.fontManager.ttflist}
        return next((name for name in CJK_FAMILIES if name in names), None)

    override = os.environ.get("MHA_CJK_FONT", "").strip()
    if override and pathlib.Path(override).is_file():
        font_manager.fontManager.addfont(override)
        here = pathlib.Path(override).resolve()
        faces = [f.name for f in font_manager.fontManager.ttflist
                 if pathlib.Path(f.fname).resolve() == here]
        name = next((name for name in CJK_FAMILIES if name in faces), faces[0])
        _bold_alias(font_manager, name)
        return name
    if override in {f.name for f in font_manager.fontManager.ttflist}:
        _bold_alias(font_manager, override)
        return override
    if override:
        warnings.warn(f"MHA_CJK_FONT={override!r} is neither a font file nor a family matplotlib "
                      "knows; looking for another CJK font", stacklevel=2)
    name = known()
    if name is None:
        for path in font_manager.findSystemFonts():
            if pathlib.Path(path).name.lower() in CJK_FILES:
                font_manager.fontManager.addfont(path)
        name = known()
    if name is None and importlib.util.find_spec(CJK_WHEEL) is not None:
        wheel = importlib.import_module(CJK_WHEEL)
        font_manager.fontManager.addfont(str(wheel.FONT_PATH))
        name = known()
    if name is not None:
        _bold_alias(font_manager, name)
    else:
        warnings.warn("no CJK font found: Chinese labels on figures will show as empty boxes. "
                      "`make fonts-zh` (or `pip install noto-cjk-sans-otc`, or "
                      "`apt-get install fonts-wqy-microhei`) installs one", stacklevel=2)
    return name


def _bold_alias(font_manager, name: str) -> None:
    """Let bold text of family `name` use its regular face when it has no bold one (the CJK fonts
    found here often have none), instead of logging "Failed to find font weight bold" each time."""
    import dataclasses

    faces = [f for f in font_manager.fontManager.ttflist if f.name == name]
    if faces and not any(isinstance(f.weight, int) and f.weight >= 600 for f in faces):
        font_manager.fontManager.ttflist.append(dataclasses.replace(faces[0], weight=700))
        cached = getattr(font_manager.fontManager, "_findfont_cached", None)
        if cached is not None and hasattr(cached, "cache_clear"):
            cached.cache_clear()


def use_cjk_font() -> str | None:
    """Make matplotlib's sans-serif text draw Chinese when the course speaks Chinese.

    The course's drawing functions call this first. In Chinese the font of `cjk_font()` goes
    first in `font.sans-serif` (it has Latin letters and digits too: a generic family resolves
    to one font, with no fallback per glyph); in English what it put there is taken out again,
    so English figures look as they always did. Returns the family in use, or None.
    """
    import matplotlib

    name = cjk_font() if language() == "zh_CN" else None
    families = list(matplotlib.rcParams["font.sans-serif"])
    mine = _cjk_inserted.pop("font.sans-serif", None)
    if mine in families:  # take out what this function put in, nothing else
        families.remove(mine)
    if name is not None:
        families.insert(0, name)
        _cjk_inserted["font.sans-serif"] = name
    if families != list(matplotlib.rcParams["font.sans-serif"]):
        matplotlib.rcParams["font.sans-serif"] = families
    return name
