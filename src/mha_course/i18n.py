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

import ast
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
    entries: dict[str, str] = {}
    for group in path.read_text(encoding="utf-8").split("\n\n"):
        lines = [line.strip() for line in group.splitlines()]
        if any(line.startswith("#,") and "fuzzy" in line for line in lines):
            continue
        parts: dict[str, list[str]] = {}
        field = None
        for line in lines:
            if line.startswith(("msgid ", "msgstr ")):
                field, _, rest = line.partition(" ")
                parts[field] = [ast.literal_eval(rest)]
            elif line.startswith('"') and field is not None:
                parts[field].append(ast.literal_eval(line))
            elif line.startswith("#"):
                field = None  # comments, locations, previous ids (#|) and obsolete entries (#~)
        key, value = "".join(parts.get("msgid", [])), "".join(parts.get("msgstr", []))
        if key and value:
            entries[key] = value
    return entries


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
