"""Which submissions of one assignment look copied from each other (MOSS / JPlag style).

    python similarity.py A4 [--root DIR] [--out DIR] [--top N]   # -> reports/similarity_A4_....{txt,html}

Only the students' own cells are compared (nbgrader's solution cells). Each is tokenized with
Python's tokenize; identifiers, numbers and strings are normalised, so renamed variables do
not hide a copy; the token k-grams are hashed and winnowed (Schleimer, Wilkerson and Aiken,
SIGMOD 2003) into fingerprints, and a pair's score is the Jaccard index of their fingerprint
sets. Fingerprints of the released template and those most of the class shares (the obvious
way to write a line) are dropped first. Reordered functions do not change the sets. A high
score is a pair to look at, not a verdict: the report shows the lines the two share.
"""

from __future__ import annotations

import argparse
import builtins
import hashlib
import html
import io
import keyword
import sys
import tokenize
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent
K = 8  # tokens per k-gram
W = 4  # winnowing window (k-grams): any match of K + W - 1 tokens is found
_KEEP = set(keyword.kwlist) | set(dir(builtins))
_SKIP = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
         tokenize.ENCODING, tokenize.ENDMARKER}


@dataclass(frozen=True)
class Token:
    """One normalised token and where it came from (cell index, line in that cell)."""

    text: str
    cell: int
    line: int


@dataclass
class Prints:
    """A submission's fingerprints: hash -> the (cell, line) places where its k-gram starts."""

    where: dict[int, set[tuple[int, int]]] = field(default_factory=dict)
    lines: dict[tuple[int, int], str] = field(default_factory=dict)  # (cell, line) -> source line


@dataclass(frozen=True)
class Pair:
    """Two students, their score and the source lines they share (first student's, second's)."""

    a: str
    b: str
    score: float
    shared: int  # fingerprints in common
    lines: tuple[tuple[str, str], ...]


def _without_magics(source: str) -> str:
    """The source with IPython magics and shell lines blanked (they are not Python)."""
    return "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in source.splitlines())


def tokens(source: str, cell: int = 0) -> list[Token]:
    """The normalised tokens of one cell: names -> V (keywords, builtins, attributes kept)."""
    out: list[Token] = []
    prev = ""
    try:
        for tok in tokenize.generate_tokens(io.StringIO(_without_magics(source)).readline):
            if tok.type in _SKIP:
                continue
            text = tok.string
            if tok.type == tokenize.NAME and text not in _KEEP and prev != ".":
                text = "V"
            elif tok.type == tokenize.NUMBER:
                text = "N"
            elif tok.type == tokenize.STRING or tok.type == getattr(tokenize, "FSTRING_START", -1):
                text = "S"
            out.append(Token(text, cell, tok.start[0]))
            prev = tok.string
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass  # an unfinished cell: keep the tokens read so far
    return out


def _hash(gram: Sequence[Token]) -> int:
    """A stable 64-bit hash of a k-gram's texts (the same in every process)."""
    data = "\x1f".join(t.text for t in gram).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def kgrams(toks: Sequence[Token], k: int = K) -> list[tuple[int, Token]]:
    """(hash, first token) of every k-gram."""
    return [(_hash(toks[i:i + k]), toks[i]) for i in range(len(toks) - k + 1)]


def winnow(grams: Sequence[tuple[int, Token]], w: int = W) -> list[tuple[int, Token]]:
    """The winnowed k-grams: the rightmost minimum of every window of w (each once)."""
    if len(grams) <= w:
        return list(grams)
    picked: dict[int, tuple[int, Token]] = {}
    for i in range(len(grams) - w + 1):
        window = grams[i:i + w]
        j = min(range(w), key=lambda t: (window[t][0], -t))
        picked[i + j] = window[j]
    return [picked[i] for i in sorted(picked)]


def student_cells(nb) -> list[str]:
    """Sources of the cells the student writes (nbgrader solution cells that hold code)."""
    return [c.source for c in nb.cells if c.cell_type == "code"
            and c.get("metadata", {}).get("nbgrader", {}).get("solution")]


def fingerprints(cells: Sequence[str], k: int = K, w: int = W) -> Prints:
    """The winnowed fingerprints of a list of cell sources."""
    p = Prints()
    for i, src in enumerate(cells):
        for n, line in enumerate(src.splitlines(), 1):
            p.lines[(i, n)] = line
        for h, tok in winnow(kgrams(tokens(src, i), k), w):
            p.where.setdefault(h, set()).add((tok.cell, tok.line))
    return p


def template_hashes(cells: Sequence[str], k: int = K) -> set[int]:
    """Every k-gram hash of the released template (not winnowed: all of them are excluded)."""
    return {h for i, src in enumerate(cells) for h, _ in kgrams(tokens(src, i), k)}


def _common(prints: Mapping[str, Prints], max_share: float) -> set[int]:
    """Hashes held by more than max_share of the class (with 4 or more students)."""
    if len(prints) < 4:
        return set()
    count: dict[int, int] = {}
    for p in prints.values():
        for h in p.where:
            count[h] = count.get(h, 0) + 1
    return {h for h, c in count.items() if c > max_share * len(prints)}


def _shared_lines(pa: Prints, pb: Prints, common: set[int], limit: int) -> tuple[tuple[str, str], ...]:
    """Up to `limit` (line of a, line of b) pairs where a shared fingerprint starts."""
    out: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for h in sorted(common, key=lambda h: min(pa.where[h])):
        la = pa.lines.get(min(pa.where[h]), "").strip()
        lb = pb.lines.get(min(pb.where[h]), "").strip()
        if (la, lb) not in seen:
            seen.add((la, lb))
            out.append((la, lb))
        if len(out) >= limit:
            break
    return tuple(out)


def compare(submissions: Mapping[str, Sequence[str]], template: Sequence[str] = (), *,
            k: int = K, w: int = W, max_share: float = 0.5, lines: int = 8) -> list[Pair]:
    """Every pair of students, highest score first. submissions: student -> their cells' sources."""
    if len(submissions) < 2:
        raise ValueError(f"need at least two submissions to compare, got {len(submissions)}")
    if k < 1 or w < 1:
        raise ValueError(f"k and w must be positive, got k={k}, w={w}")
    drop = template_hashes(template, k)
    prints = {s: fingerprints(c, k, w) for s, c in submissions.items()}
    for p in prints.values():
        p.where = {h: at for h, at in p.where.items() if h not in drop}
    drop = _common(prints, max_share)
    for p in prints.values():
        p.where = {h: at for h, at in p.where.items() if h not in drop}
    pairs = []
    for a, b in combinations(sorted(prints), 2):
        sa, sb = set(prints[a].where), set(prints[b].where)
        both = sa & sb
        score = len(both) / len(sa | sb) if sa | sb else 0.0
        pairs.append(Pair(a, b, score, len(both), _shared_lines(prints[a], prints[b], both, lines)))
    return sorted(pairs, key=lambda p: (-p.score, p.a, p.b))


def load_class(name: str, root: Path = ROOT) -> tuple[dict[str, list[str]], list[str]]:
    """(student -> their cells, template cells) of assignment `name` in a course folder."""
    release = root / "release" / name / f"{name}.ipynb"
    if not release.exists():
        raise FileNotFoundError(f"no released notebook {release}: run `python course.py release {name}`")
    template = student_cells(nbformat.read(release, as_version=4))
    subs = {}
    for path in sorted((root / "submitted").glob(f"*/{name}/{name}.ipynb")):
        subs[path.parent.parent.name] = student_cells(nbformat.read(path, as_version=4))
    return subs, template


def text_report(pairs: Sequence[Pair], assignment: str, top: int = 10, threshold: float = 0.3) -> str:
    """The plain-text report: the pairs to look at first, each with the lines they share."""
    flagged = sum(p.score >= threshold for p in pairs)
    out = [f"Similarity report: {assignment} ({len(pairs)} pairs; {flagged} at or above "
           f"{threshold:.0%}, worth a look)",
           "Score: share of fingerprints in common (Jaccard), template and class-wide lines excluded.",
           ""]
    for i, p in enumerate(pairs[:top], 1):
        mark = "LOOK" if p.score >= threshold else "    "
        out.append(f"{i:>2}. {mark} {p.score:6.1%}  {p.a} - {p.b}  ({p.shared} fingerprints shared)")
        if p.score >= threshold:
            out += [f"        {la[:60]:<60} | {lb[:60]}" for la, lb in p.lines]
    return "\n".join(out) + "\n"


def html_report(pairs: Sequence[Pair], assignment: str, top: int = 25, threshold: float = 0.3) -> str:
    """The same report as an HTML page (one row per pair; shared lines side by side)."""
    e = html.escape
    rows = []
    for i, p in enumerate(pairs[:top], 1):
        shared = "".join(f"<tr><td><code>{e(la)}</code></td><td><code>{e(lb)}</code></td></tr>"
                         for la, lb in p.lines)
        detail = (f'<details{" open" if p.score >= threshold else ""}><summary>shared lines'
                  f"</summary><table class=shared>{shared}</table></details>") if p.lines else ""
        cls = "look" if p.score >= threshold else ""
        rows.append(f'<tr class="{cls}"><td>{i}</td><td>{p.score:.1%}</td><td>{e(p.a)}</td>'
                    f"<td>{e(p.b)}</td><td>{p.shared}</td><td>{detail}</td></tr>")
    return ("<!doctype html><meta charset=utf-8>"
            f"<title>Similarity: {e(assignment)}</title><style>body{{font-family:sans-serif}}"
            "tr.look{background:#fde8e8}td{vertical-align:top;padding:2px 8px}"
            "table{border-collapse:collapse;width:100%}table.shared{table-layout:fixed}"
            "table.shared td{width:50%}table.shared code{white-space:pre-wrap;"
            "overflow-wrap:anywhere}</style>"
            f"<h1>Similarity: {e(assignment)}</h1><p>Score: share of fingerprints in common "
            "(Jaccard); the released template and lines most of the class shares are excluded. "
            f"Rows at or above {threshold:.0%} are highlighted: read the two notebooks before "
            "deciding anything.</p><table><tr><th>#</th><th>score</th><th>student</th>"
            "<th>student</th><th>shared</th><th></th></tr>" + "".join(rows) + "</table>")


def main(argv: list[str] | None = None) -> int:
    """Write reports/similarity_NAME.txt and .html for each assignment named."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="+", help="assignments (A4 or A4_kv_cache)")
    ap.add_argument("--root", type=Path, default=ROOT, help="the course folder")
    ap.add_argument("--out", type=Path, default=None, help="where to write (default ROOT/reports)")
    ap.add_argument("--top", type=int, default=10, help="pairs in the text report")
    args = ap.parse_args(argv)
    known = sorted(p.name for p in (args.root / "release").glob("*") if p.is_dir())
    out = args.out or args.root / "reports"
    out.mkdir(parents=True, exist_ok=True)
    for n in args.names:
        hits = [a for a in known if a == n or a.split("_")[0] == n]
        if len(hits) != 1:
            raise SystemExit(f"unknown assignment {n!r}; release/ has {', '.join(known) or 'nothing'}")
        try:
            pairs = compare(*load_class(hits[0], args.root))
        except (OSError, ValueError) as e:
            raise SystemExit(f"similarity.py: {hits[0]}: {e}") from None
        text = text_report(pairs, hits[0], args.top)
        (out / f"similarity_{hits[0]}.txt").write_text(text, encoding="utf-8")
        (out / f"similarity_{hits[0]}.html").write_text(html_report(pairs, hits[0]), encoding="utf-8")
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
