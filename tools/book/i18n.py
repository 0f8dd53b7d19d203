"""Translation catalogs of the series: English markdown in, gettext catalogs out, Chinese notebooks back.

One source: the English notebooks (and the pages beside them: `glossary.md`, `errata.md`) hold the prose, code and outputs.
Each markdown cell is cut into blocks (a paragraph, a list, a table, a heading: text between blank
lines, fenced code and display maths kept whole); every block with words in it is one gettext
message, one catalog per notebook in `notebooks/locale/zh_CN/LC_MESSAGES/<stem>.po`. The Chinese
edition is the English notebook with each block replaced by its translation: code cells, outputs,
figures and saved widget state are the same objects, never copied by hand.

    python -m tools.book.i18n update            # catalogs follow the English (changed text -> fuzzy)
    python -m tools.book.i18n stat [--strict]   # translated / fuzzy / untranslated / invalid, per catalog
    python -m tools.book.i18n todo STEM         # what is left to translate in one catalog, as @@ blocks
    python -m tools.book.i18n fill STEM FILE    # read translated @@ blocks into the catalog, checked
    python -m tools.book.i18n notebooks OUT     # the Chinese notebooks, from the catalogs

A translation must keep what the English block points at: its code spans, maths, link targets,
HTML tags, heading level, list items and table rows (`problems`), so a translated page links,
renders and typesets like the English one.
"""

from __future__ import annotations

import argparse
import copy
import pathlib
import re
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
LOCALE_DIR = NOTEBOOKS / "locale"
LANG = "zh_CN"
FENCE = re.compile(r"^\s{0,3}(```|~~~)")
CJK = re.compile(r"[\u3400-\u9fff]")


# ---- blocks ------------------------------------------------------------------------------------
def split_blocks(text: str) -> list[str]:
    """Cut markdown into pieces whose concatenation is `text`: blocks and the blank lines between them."""
    lines = text.splitlines(keepends=True)
    pieces: list[str] = []
    block: list[str] = []
    fence: str | None = None
    in_math = False
    for line in lines:
        stripped = line.strip()
        if fence is None and not in_math and stripped == "":
            if block:
                pieces.append("".join(block))
                block = []
            if pieces and not pieces[-1].strip():
                pieces[-1] += line  # consecutive blank lines stay one separator
            else:
                pieces.append(line)
            continue
        block.append(line)
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
        elif fence is not None and stripped.startswith(fence):
            fence = None
        elif fence is None and stripped.count("$$") % 2 == 1:
            in_math = not in_math
    if block:
        pieces.append("".join(block))
    # A block keeps its trailing newline out of the message, so translations need not repeat it.
    out: list[str] = []
    for p in pieces:
        if p.strip() and p.endswith("\n"):
            out += [p[:-1], "\n"]
        else:
            out.append(p)
    return [p for p in out if p != ""]


def _prose(block: str) -> str:
    """The block with code, maths, link targets and HTML tags taken out: what is left to translate."""
    s = re.sub(r"(```|~~~).*?(\1|\Z)", " ", block, flags=re.S)
    s = re.sub(r"`[^`]*`", " ", s)
    s = re.sub(r"\$\$.*?\$\$|\$[^$]*\$", " ", s, flags=re.S)
    s = re.sub(r"\]\([^)]*\)", "]", s)
    s = re.sub(r"https?://\S+", " ", s)
    return re.sub(r"<[^>]+>", " ", s)


def translatable(block: str) -> bool:
    """Whether a block has words to translate (not only code, maths, a link target or blank lines)."""
    return bool(block.strip()) and not FENCE.match(block) and \
        re.search(r"[A-Za-z]{2,}", _prose(block)) is not None


# ---- what a translation must keep ---------------------------------------------------------------
def _keeps(block: str) -> dict[str, Counter]:
    """The parts of a block its translation must carry unchanged, counted."""
    no_code = re.sub(r"`[^`]*`", " ", block)
    lines = block.splitlines()
    return {
        "code spans": Counter(re.findall(r"`[^`]+`", block)),
        # inline maths may run over a line break; compared with its white space collapsed
        "maths": Counter(" ".join(m.split()) for m in re.findall(r"\$\$.*?\$\$|\$[^$]+\$", no_code,
                                                                 flags=re.S)),
        "link targets": Counter(re.findall(r"\]\(([^)\s]+)", no_code)),
        "HTML tags": Counter(re.findall(r"</?[a-zA-Z][^>]*>", re.sub(r"\$[^$]*\$", " ", no_code))),
        "heading level": Counter(re.findall(r"^#+(?= )", block, flags=re.M)),
        "list items": Counter(re.findall(r"^\s*(?:[-*+]|\d+[.)])(?= )", block, flags=re.M)),
        "table rows": Counter(str(line.count("|")) for line in lines if line.lstrip().startswith("|")),
        "lines": Counter({"n": len(lines)}) if any(line.lstrip().startswith("|") for line in lines)
        else Counter(),
    }


def problems(english: str, chinese: str) -> list[str]:
    """What a translation loses or changes of its English block (empty when it keeps everything)."""
    if not chinese.strip():
        return ["empty translation"]
    out = []
    if not CJK.search(_prose(chinese)):
        out.append("no Chinese in the translation")
    want, got = _keeps(english), _keeps(chinese)
    for key, counts in want.items():
        if counts != got[key]:
            lost = sorted((counts - got[key]).elements())
            extra = sorted((got[key] - counts).elements())
            out.append(f"{key} differ: missing {lost[:4]}, added {extra[:4]}")
    if chinese.endswith("\n") != english.endswith("\n"):
        out.append("a trailing newline added or lost")
    return out


# ---- sources and catalogs --------------------------------------------------------------------
@dataclass
class Source:
    """One translated document: a notebook (its markdown cells) or a markdown page."""

    domain: str  # the catalog's name: the notebook's or page's stem
    path: pathlib.Path

    def texts(self) -> Iterator[tuple[str, str]]:
        """(where, markdown) for each translated text of the document."""
        if self.path.suffix == ".md":
            yield self.path.name, self.path.read_text(encoding="utf-8")
            return
        import nbformat

        nb = nbformat.read(self.path, as_version=4)
        for i, cell in enumerate(nb.cells):
            if cell.cell_type == "markdown" and not is_answer_cell(cell):
                yield f"cell {i}", cell.source


def is_answer_cell(cell) -> bool:
    """An nbgrader written-answer cell: its text is the model answer, never shown to students."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return bool(meta.get("solution"))


def sources() -> list[Source]:
    """Every translated document: lessons, assignments (their instructions) and the book's pages."""
    found = [Source(p.stem, p) for p in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))]
    found += [Source(p.stem, p) for p in sorted((NOTEBOOKS / "assignments" / "source").glob("A*/A*.ipynb"))]
    found += [Source(p.stem, p) for p in sorted(NOTEBOOKS.glob("*.md"))]  # glossary, errata
    return found


def po_path(domain: str, lang: str = LANG) -> pathlib.Path:
    return LOCALE_DIR / lang / "LC_MESSAGES" / f"{domain}.po"


def empty_catalog(domain: str, lang: str = LANG):
    """A catalog with the project's header and nothing in it."""
    from babel.messages.catalog import Catalog

    return Catalog(locale=lang, domain=domain, project="Attention by Hand", msgid_bugs_address="",
                   copyright_holder="", fuzzy=False)


def template(src: Source):
    """A catalog of the document's blocks, in reading order, with where each occurs."""
    cat = empty_catalog(src.domain)
    rel = src.path.relative_to(ROOT).as_posix()
    for where, text in src.texts():
        for block in split_blocks(text):
            if translatable(block):
                line = int(where.split()[-1]) if where.startswith("cell") else 0
                if block in cat:
                    cat[block].locations.append((rel, line))
                else:
                    cat.add(block, "", locations=[(rel, line)])
    return cat


# ---- catalogs on disk, for this module and tools.book.messages -------------------------------
def read_catalog(path: pathlib.Path, domain: str, lang: str = LANG):
    """The catalog at `path` (None when there is none)."""
    from babel.messages.pofile import read_po

    if not path.exists():
        return None
    with path.open("rb") as f:
        return read_po(f, locale=lang, domain=domain)


def write_catalog(cat, path: pathlib.Path) -> None:
    """Write a catalog unwrapped, in its own order, obsolete entries dropped."""
    from babel.messages.pofile import write_po

    for msg in cat:
        if not msg.fuzzy:
            msg.previous_id = ()  # the old English is kept only while it helps re-translate
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        write_po(f, cat, width=0, omit_header=False, ignore_obsolete=True, include_previous=True,
                 sort_output=False)


def merged(cat, tmpl, domain: str, lang: str = LANG):
    """`cat` brought in line with `tmpl` (babel: changed English turns fuzzy), in tmpl's order."""
    if cat is None:
        return tmpl
    created = cat.creation_date  # unchanged English leaves the file unchanged
    cat.update(tmpl, no_fuzzy_matching=False, update_header_comment=False)
    ordered = empty_catalog(domain, lang)
    ordered.creation_date = created
    for msg in tmpl:
        if msg.id:
            ordered[msg.id] = cat[msg.id]
    return ordered


@dataclass
class Stat:
    """How far one catalog is translated."""

    domain: str
    translated: int = 0
    fuzzy: int = 0
    untranslated: int = 0
    invalid: int = 0
    words: int = 0  # English words of its messages
    missing: bool = False  # no catalog file at all

    @property
    def complete(self) -> bool:
        return not self.missing and self.fuzzy == self.untranslated == self.invalid == 0


def count(st: Stat, tmpl, cat, check, words, verbose: bool = False) -> Stat:
    """Fill `st` by comparing a catalog with its template: `check(english, chinese)` lists problems."""
    if cat is None:
        st.missing = any(m.id for m in tmpl)
        st.untranslated = sum(1 for m in tmpl if m.id)
        return st
    for msg in tmpl:
        if not msg.id:
            continue
        st.words += words(msg.id)
        have = cat.get(msg.id)
        if have is None or not have.string:
            st.untranslated += 1
        elif have.fuzzy:
            st.fuzzy += 1
        elif bad := check(msg.id, have.string):
            st.invalid += 1
            if verbose:
                print(f"{st.domain}: {bad}\n  {msg.id[:100]!r}", file=sys.stderr)
        else:
            st.translated += 1
    return st


def todo_text(cat, check, everything: bool = False) -> str:
    """The untranslated, fuzzy or invalid messages of a catalog as `@@ N` blocks (N: its index)."""
    parts = []
    for i, msg in enumerate(m for m in cat if m.id):
        if everything or not msg.string or msg.fuzzy or check(msg.id, msg.string):
            note = " (fuzzy: the English changed; old translation below)" if msg.fuzzy else ""
            parts.append(f"@@ {i}{note}\n{msg.id}\n" + (f"@@@ old\n{msg.string}\n" if msg.string else ""))
    return "\n".join(parts)


def fill_catalog(cat, translations: dict[int, str], check) -> list[str]:
    """Put translations into a catalog by index, each checked first; returns what was refused."""
    msgs = [m for m in cat if m.id]
    refused = []
    for i, text in sorted(translations.items()):
        if not 0 <= i < len(msgs):
            refused.append(f"@@ {i}: no such entry (the catalog has {len(msgs)})")
            continue
        msg = msgs[i]
        bad = check(msg.id, text)
        if bad:
            refused.append(f"@@ {i}: {'; '.join(bad)}")
            continue
        msg.string = text
        msg.flags.discard("fuzzy")
        msg.previous_id = ()
    return refused


# ---- the series' catalogs ------------------------------------------------------------------------
def read(domain: str, lang: str = LANG):
    """The catalog of a domain as it is on disk (None when there is none)."""
    return read_catalog(po_path(domain, lang), domain, lang)


def write(cat, domain: str, lang: str = LANG) -> None:
    write_catalog(cat, po_path(domain, lang))


def update(domains: list[str] | None = None, lang: str = LANG) -> dict[str, int]:
    """Bring catalogs (all, or `domains`) in line with their English: new blocks added, changed ones fuzzy, gone ones dropped."""
    counts = {}
    for src in sources():
        if domains and src.domain not in domains:
            continue
        cat = merged(read(src.domain, lang), template(src), src.domain, lang)
        write(cat, src.domain, lang)
        counts[src.domain] = sum(1 for m in cat if m.id)
    return counts


def _words(block: str) -> int:
    return len(re.findall(r"[A-Za-z]+", _prose(block)))


def stat(lang: str = LANG, verbose: bool = False) -> list[Stat]:
    """Per document: translated, fuzzy, untranslated and invalid entries, checked against the English."""
    return [count(Stat(src.domain), template(src), read(src.domain, lang), problems, _words, verbose)
            for src in sources()]


# ---- translators' round trip -----------------------------------------------------------------
def todo(domain: str, lang: str = LANG, everything: bool = False) -> str:
    """The untranslated, fuzzy or invalid messages of a catalog as `@@ N` blocks (N: its index)."""
    cat = read(domain, lang)
    if cat is None:
        raise SystemExit(f"no catalog for {domain!r}: run `python -m tools.book.i18n update` first")
    return todo_text(cat, problems, everything)


def parse_blocks(text: str) -> dict[int, str]:
    """`@@ N` headed blocks -> {N: text}; trailing blank lines of each block dropped."""
    out: dict[int, str] = {}
    for m in re.finditer(r"^@@ (\d+)[^\n]*\n(.*?)(?=^@@ \d+|\Z)", text, flags=re.S | re.M):
        out[int(m.group(1))] = m.group(2).rstrip("\n")
    return out


def fill(domain: str, translations: dict[int, str], lang: str = LANG) -> list[str]:
    """Put translations into a catalog by index; each is checked first. Returns what was refused."""
    cat = read(domain, lang)
    if cat is None:
        raise SystemExit(f"no catalog for {domain!r}")
    refused = fill_catalog(cat, translations, problems)
    write(cat, domain, lang)
    return refused


# ---- the Chinese notebooks -------------------------------------------------------------------
WIDE = "\u3000-\u303f\u3400-\u9fff\uff00-\uffef"  # CJK ideographs and full-width punctuation
CJK_BREAK = re.compile(f"(?<=[{WIDE}])\n(?=[{WIDE}])")


def unwrap(chinese: str) -> str:
    """A line break between two Chinese characters removed: a browser shows it as a space."""
    return CJK_BREAK.sub("", chinese)


def translation(block: str, cat) -> str | None:
    """The block's translation in `cat` when it is complete and valid (not fuzzy, keeps what
    `problems` checks), else None."""
    msg = cat.get(block) if cat is not None and translatable(block) else None
    ok = msg is not None and msg.string and not msg.fuzzy and not problems(block, msg.string)
    return msg.string if ok else None


def missing(text: str, cat) -> list[str]:
    """The translatable blocks of `text` that `cat` has no complete, valid translation for."""
    return [b for b in split_blocks(text) if translatable(b) and translation(b, cat) is None]


def translate_text(text: str, cat) -> str:
    """Markdown with every block that has a complete, valid translation replaced by it."""
    return "".join(unwrap(t) if (t := translation(block, cat)) else block
                   for block in split_blocks(text))


def translate_notebook(nb, cat, lang: str = LANG):
    """A copy of `nb` with its markdown from `cat`; code, outputs, metadata and answers untouched."""
    out = copy.deepcopy(nb)
    for cell in out.cells:
        if cell.cell_type == "markdown" and not is_answer_cell(cell):
            cell.source = translate_text(cell.source, cat)
    out.metadata["language"] = lang
    return out


def translated_notebook(path: pathlib.Path, lang: str = LANG):
    """The notebook at `path` with its markdown in `lang` (its catalog is the notebook's stem)."""
    import nbformat

    return translate_notebook(nbformat.read(path, as_version=4), read(path.stem, lang), lang)


def write_notebooks(dest: pathlib.Path, lang: str = LANG) -> list[pathlib.Path]:
    """The lessons in `lang` under `dest`, with a marker that makes the Try-it checks answer in it."""
    import nbformat

    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        nb = translated_notebook(path, lang)
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                cell.source = relink(cell.source, path.parent, dest)
        nbformat.write(nb, dest / path.name)
        written.append(dest / path.name)
    (dest / ".mha-language").write_text(lang + "\n")
    return written


def relink(text: str, src_dir: pathlib.Path, dest: pathlib.Path) -> str:
    """Relative links to files that are not lessons, rewritten to reach them from `dest`."""
    import os

    def fix(m: re.Match) -> str:
        target = m.group(1)
        if re.match(r"^(https?:|mailto:|#|\d\d_[a-z0-9_]+\.ipynb)", target):
            return m.group(0)
        path, _, anchor = target.partition("#")
        new = os.path.relpath((src_dir / path).resolve(), dest.resolve())
        return f"]({pathlib.Path(new).as_posix()}{'#' + anchor if anchor else ''})"

    return re.sub(r"\]\(([^)\s]+)\)", fix, text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.book.i18n", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("update", help="catalogs follow the English")
    u.add_argument("domains", nargs="*", help="only these catalogs (default: all)")
    s = sub.add_parser("stat", help="how far each catalog is translated")
    s.add_argument("--strict", action="store_true", help="exit 1 on anything fuzzy, untranslated or invalid")
    t = sub.add_parser("todo", help="what is left in one catalog, as @@ N blocks")
    t.add_argument("domain")
    t.add_argument("--all", action="store_true", help="every entry, translated or not")
    f = sub.add_parser("fill", help="read translated @@ N blocks into a catalog")
    f.add_argument("domain")
    f.add_argument("file", type=pathlib.Path)
    n = sub.add_parser("notebooks", help="write the Chinese notebooks")
    n.add_argument("dest", type=pathlib.Path, nargs="?", default=NOTEBOOKS / "zh_CN")
    a = p.parse_args(argv)
    if a.cmd == "update":
        counts = update(a.domains or None)
        print(f"{len(counts)} catalogs, {sum(counts.values())} messages in {LOCALE_DIR / LANG}")
    elif a.cmd == "stat":
        stats = stat(verbose=a.strict)
        for st in stats:
            print(f"{st.domain:34} {st.translated:4} translated {st.fuzzy:3} fuzzy "
                  f"{st.untranslated:4} untranslated {st.invalid:3} invalid {st.words:6} words"
                  + ("  (no catalog)" if st.missing else ""))
        tot = Stat("total", *(sum(getattr(s, k) for s in stats) for k in
                              ("translated", "fuzzy", "untranslated", "invalid", "words")))
        print(f"{'total':34} {tot.translated:4} translated {tot.fuzzy:3} fuzzy "
              f"{tot.untranslated:4} untranslated {tot.invalid:3} invalid {tot.words:6} words")
        if a.strict and not all(s.complete for s in stats):
            bad = [s.domain for s in stats if not s.complete]
            print(f"incomplete {LANG} catalogs: {', '.join(bad)} "
                  "(python -m tools.book.i18n todo DOMAIN shows what is left)", file=sys.stderr)
            return 1
    elif a.cmd == "todo":
        print(todo(a.domain, everything=a.all))
    elif a.cmd == "fill":
        refused = fill(a.domain, parse_blocks(a.file.read_text(encoding="utf-8")))
        for r in refused:
            print(r, file=sys.stderr)
        print(f"{a.domain}: {len(refused)} refused")
        return 1 if refused else 0
    elif a.cmd == "notebooks":
        written = write_notebooks(a.dest)
        print(f"{len(written)} notebooks in {a.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
