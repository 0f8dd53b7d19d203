"""Translation catalogs of the Try-it messages: `_("...")` in mha_course.tryit in, gettext catalogs out.

Every learner-facing message of a Try-it module goes through `mha_course.i18n._`, with named
placeholders filled by `.format` after the lookup (`_("got {kind}").format(kind=...)`). The
msgids are extracted with babel from `src/mha_course/tryit/*.py`, one catalog per module in
`src/mha_course/locale/zh_CN/LC_MESSAGES/tryit.<module>.po` (`tryit.__init__.po` for the shared
helpers), which `mha_course.i18n.catalog` merges at run time.

    python -m tools.book.messages update            # catalogs follow the code (changed English -> fuzzy)
    python -m tools.book.messages stat [--strict]   # translated / fuzzy / untranslated / invalid, per module
    python -m tools.book.messages todo MOD          # what is left to translate in one module, as @@ N blocks
    python -m tools.book.messages fill MOD FILE     # read translated @@ N blocks into the catalog, checked

A translation must keep the message's `{placeholders}` (name, conversion and format spec, each
as often as the English has it) and be Chinese; `stat --strict` exits 1 on anything
untranslated, fuzzy or invalid, and on a message two catalogs translate differently (the catalogs
are merged into one lookup). The round trip is the one of `tools.book.i18n`.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import string
import sys
from collections import Counter

from tools.book.i18n import (
    CJK,
    LANG,
    Stat,
    count,
    empty_catalog,
    fill_catalog,
    merged,
    parse_blocks,
    read_catalog,
    todo_text,
    write_catalog,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]
TRYIT = ROOT / "src" / "mha_course" / "tryit"
LOCALE_DIR = ROOT / "src" / "mha_course" / "locale"
PROJECT = "Attention by Hand"
CJK_MARKS = re.compile(r"[\u3000-\u303f\u3400-\u9fff\uff00-\uffef]")  # ideographs or full-width marks


def modules() -> list[str]:
    """The Try-it modules that have messages' sources: '__init__' and each lesson's module."""
    return [p.stem for p in sorted(TRYIT.glob("*.py"))]


def domain(module: str) -> str:
    return f"tryit.{module}"


def po_path(module: str, lang: str = LANG) -> pathlib.Path:
    return LOCALE_DIR / lang / "LC_MESSAGES" / f"{domain(module)}.po"


def extract(module: str) -> list[tuple[str, int]]:
    """(msgid, line) of every `_("...")` in the module's source, in order, first occurrence kept."""
    from babel.messages.extract import extract_from_file

    path = TRYIT / f"{module}.py"
    seen: dict[str, int] = {}
    for lineno, message, _comments, _context in extract_from_file(
            "python", str(path), keywords={"_": None}):
        if isinstance(message, str) and message and message not in seen:
            seen[message] = lineno
    return list(seen.items())


def template(module: str):
    cat = empty_catalog(domain(module))
    rel = (TRYIT / f"{module}.py").relative_to(ROOT).as_posix()
    for msgid, line in extract(module):
        cat.add(msgid, "", locations=[(rel, line)])
    return cat


def read(module: str, lang: str = LANG):
    return read_catalog(po_path(module, lang), domain(module), lang)


def write(cat, module: str, lang: str = LANG) -> None:
    write_catalog(cat, po_path(module, lang))


def fields(text: str) -> Counter | None:
    """The `{placeholders}` of a message as written ('{name}', '{answer!r:.60}'), counted; None if
    the text is not a valid format string."""
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError:
        return None
    out: Counter = Counter()
    for _literal, name, spec, conversion in parsed:
        if name is not None:
            out["{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
                + "}"] += 1
    return out


def problems(english: str, chinese: str) -> list[str]:
    """What a translation breaks: its placeholders, its being Chinese."""
    found = []
    want, got = fields(english), fields(chinese)
    if got is None and want is not None:
        found.append("not a valid format string (a stray { or }?)")
    elif want != got:
        found.append(f"placeholders {sorted((want or Counter()).elements())} became "
                     f"{sorted((got or Counter()).elements())}")
    words = re.sub(r"\{[^{}]*\}", "", english)
    if not (CJK if re.search(r"[A-Za-z]", words) else CJK_MARKS).search(chinese):
        found.append("no Chinese in it")
    if english.endswith("\n") != chinese.endswith("\n"):
        found.append("trailing newline not kept")
    return found


def update(mods: list[str] | None = None, lang: str = LANG) -> dict[str, int]:
    """Catalogs follow the code: new messages added, changed ones fuzzy, gone ones dropped."""
    counts = {}
    for module in modules():
        if mods and module not in mods:
            continue
        tmpl = template(module)
        if not len(tmpl) and not po_path(module, lang).exists():
            continue  # a module with no messages yet
        cat = merged(read(module, lang), tmpl, domain(module), lang)
        write(cat, module, lang)
        counts[module] = sum(1 for m in cat if m.id)
    return counts


def stat(lang: str = LANG, verbose: bool = False, mods: list[str] | None = None) -> list[Stat]:
    """Per module: translated, fuzzy, untranslated and invalid messages, checked against the code."""
    return [count(Stat(module), template(module), read(module, lang), problems,
                  lambda msgid: len(msgid.split()), verbose)
            for module in modules() if not mods or module in mods]


def conflicts(lang: str = LANG) -> dict[str, dict[str, str]]:
    """Messages translated differently in two catalogs: msgid -> {module: translation}.

    The catalogs are merged into one lookup at run time (`mha_course.i18n.catalog`), so a
    message shared by two modules must read the same in both."""
    from babel.messages.pofile import read_po

    seen: dict[str, dict[str, str]] = {}
    for path in sorted((LOCALE_DIR / lang / "LC_MESSAGES").glob("*.po")):  # the Try-its' and
        with path.open("rb") as f:  # every other module's that i18n merges (babel, as tools
            cat = read_po(f, locale=lang)  # never import the course: tests/test_layout.py)
        for msg in cat:
            if msg.id and msg.string and not msg.fuzzy:
                seen.setdefault(msg.id, {})[path.stem.removeprefix("tryit.")] = msg.string
    return {k: v for k, v in seen.items() if len(set(v.values())) > 1}


def todo(module: str, lang: str = LANG, everything: bool = False) -> str:
    """The untranslated, fuzzy or invalid messages of a module's catalog as `@@ N` blocks."""
    cat = read(module, lang)
    if cat is None:
        raise SystemExit(f"no catalog for {module!r}: run `python -m tools.book.messages update` first")
    return todo_text(cat, problems, everything)


def fill(module: str, translations: dict[int, str], lang: str = LANG) -> list[str]:
    """Put translations into a module's catalog by index, each checked first. Returns what was refused."""
    cat = read(module, lang)
    if cat is None:
        raise SystemExit(f"no catalog for {module!r}")
    refused = fill_catalog(cat, translations, problems)
    write(cat, module, lang)
    return refused


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.book.messages", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("update", help="catalogs follow the code's messages")
    u.add_argument("modules", nargs="*")
    s = sub.add_parser("stat", help="how far each module's catalog is translated")
    s.add_argument("--strict", action="store_true", help="exit 1 on anything untranslated, fuzzy or invalid")
    s.add_argument("modules", nargs="*")
    t = sub.add_parser("todo", help="what is left in one module's catalog, as @@ N blocks")
    t.add_argument("module")
    t.add_argument("--all", action="store_true", help="every message, translated or not")
    f = sub.add_parser("fill", help="read translated @@ N blocks into a module's catalog")
    f.add_argument("module")
    f.add_argument("file", type=pathlib.Path)
    args = parser.parse_args(argv)
    if args.cmd == "update":
        for module, n in update(args.modules or None).items():
            print(f"{domain(module)}: {n} messages")
        return 0
    if args.cmd == "stat":
        stats = stat(verbose=True, mods=args.modules or None)
        for st in stats:
            state = "missing" if st.missing else ("complete" if st.complete else "incomplete")
            print(f"{domain(st.domain):40} {st.translated:4} translated {st.fuzzy:3} fuzzy "
                  f"{st.untranslated:4} untranslated {st.invalid:3} invalid  {state}")
        total = sum(st.translated + st.fuzzy + st.untranslated + st.invalid for st in stats)
        print(f"{'total':40} {sum(st.translated for st in stats):4} of {total} translated")
        clashes = conflicts()
        for msgid, where in clashes.items():
            print(f"conflict: {msgid[:70]!r} reads differently in " + "; ".join(
                f"tryit.{m}: {t[:40]!r}" for m, t in where.items()), file=sys.stderr)
        return 1 if args.strict and (clashes or not all(st.complete for st in stats)) else 0
    if args.cmd == "todo":
        print(todo(args.module, everything=args.all))
        return 0
    refused = fill(args.module, parse_blocks(args.file.read_text(encoding="utf-8")))
    for line in refused:
        print(line, file=sys.stderr)
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
