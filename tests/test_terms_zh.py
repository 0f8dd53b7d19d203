"""One Chinese term per concept across the Chinese edition (issue 31, item 3).

`notebooks/glossary.md` is the authority: it pins one Chinese term per concept and says that the
first use of a term in a lesson reads 中文（English）. Seven translators wrote the catalogs in
parallel and drifted (词元 for token, three renderings of the running max, 笔记本 NN beside
第 NN 课, the course's name in three forms). This test pins the most important terms:

- where an entry's English uses a term, its Chinese uses the pinned term (or, for the words the
  glossary keeps in English, the English word);
- no known wrong variant appears anywhere;
- in each catalog, the first Chinese use of each glossed term (outside headings) is followed by
  its English in full-width brackets, 中文（English）.

Code spans, maths, link targets, HTML tags and URLs are taken out of both sides first (they stay
English by rule). Every exemption is listed below with its reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

import pytest

from tools.book import i18n


@dataclass(frozen=True)
class Term:
    """A pinned term: `en` finds it in the English, `zh` must then be in the Chinese."""

    en: str  # regex, case-insensitive, on the English prose
    zh: str  # regex, on the Chinese prose: the pinned term
    gloss: str | None = None  # regex for the English of 中文（English） on first use; None: no gloss
    forbid: tuple[str, ...] = ()  # regexes of known wrong variants, forbidden in every catalog


# English regex (key) -> the pinned Chinese. Words the glossary keeps in English (token, batch,
# kernel, softmax, dropout, stride) must stay English in the Chinese and are not glossed.
TERMS: dict[str, Term] = {
    "token": Term(r"\btokens?\b", r"token", forbid=(r"词元",)),
    "batch": Term(r"\bbatch(es)?\b(?![- ]?(size|dim))", r"batch|一批|批处理",
                  # 批量 is d2l-zh's noun for batch; as an adverb (批量矩阵乘法, batched) it is fine
                  forbid=(r"批量(大小|维|中|里|的大小)|[一每整这那]个批量",)),
    "dropout": Term(r"\bdropout\b", r"dropout", forbid=(r"(?<!dropout（)暂退法",)),  # d2l-zh's, as a gloss
    "multi-head attention": Term(r"multi-head attention", r"多头注意力", r"multi-head attention"),
    "tensor": Term(r"\btensors?\b(?![-\s]*(core|parallel|float))", r"张量(?!核心)", r"tensors?"),
    "forward pass": Term(r"forward pass", r"前向计算", r"forward( pass)?", forbid=(r"前向传播",)),
    "backward pass": Term(r"backward pass", r"反向传播", r"backward( pass)?|backprop",
                          forbid=(r"反向传递",)),
    "seven-step pipeline": Term(r"seven-step pipeline", r"七步流水线", r"seven-step pipeline"),
    "shape ledger": Term(r"shape ledger", r"形状账", r"shape ledger"),
    "output projection": Term(r"output projection", r"输出投影", r"output projection"),
    "scaled dot product": Term(r"scaled dot[- ]product(?! attention)", r"缩放点积(?!注意力)",
                               r"scaled dot[- ]product"),
    "causal mask": Term(r"causal mask", r"因果掩码|因果掩蔽", r"causal mask(ing)?",
                        forbid=(r"因果(遮罩|屏蔽|蒙版)",)),
    "fill value": Term(r"fill value", r"掩码值", r"fill value", forbid=(r"填充值",)),
    "bit-identical": Term(r"bit[- ]identical", r"逐位相等|逐位(一致|相同)", r"bit[- ]identical",
                          forbid=(r"按位相等",)),
    "control case": Term(r"control case", r"对照组", r"control( case)?"),
    "fully masked row": Term(r"fully masked rows?", r"全掩蔽行", r"fully masked rows?"),
    "weighted sum": Term(r"weighted sum", r"加权求和", r"weighted sum", forbid=(r"加权和",)),
    "convex combination": Term(r"convex combination", r"凸组合", r"convex combination"),
    "attention weights": Term(r"attention weights", r"注意力权重", r"attention weights?"),
    "planted bug": Term(r"planted bugs?", r"预埋(的)?错误", r"planted bugs?"),
    "self-check": Term(r"self-checks?", r"自检", r"self-checks?"),
    "broadcasting": Term(r"\bbroadcasting\b", r"广播", r"broadcast(ing)?"),
    "self-attention": Term(r"self-attention", r"自注意力", r"self-attention"),
    "cross-attention": Term(r"cross-attention", r"交叉注意力", r"cross-attention"),
    "mixed precision": Term(r"mixed precision", r"混合精度", r"mixed precision"),
    "tolerance": Term(r"\btolerances?\b", r"容差", r"tolerances?", forbid=(r"公差",)),
    "residual connection": Term(r"residual connection", r"残差连接", r"residual connections?"),
    "induction head": Term(r"induction heads?", r"归纳头", r"induction heads?"),
    "math path": Term(r"math path", r"数学路径", r"math path"),
    "online softmax": Term(r"online softmax", r"在线 softmax", r"online softmax"),
    "running max": Term(r"running (row )?max", r"累计最大值", r"running max",
                        forbid=(r"运行最大值", r"运行中的最大值")),
    "running sum": Term(r"running sum(?! of)", r"累计和", r"running sum",
                        forbid=(r"运行和", r"运行中的和")),
    "arithmetic intensity": Term(r"arithmetic intensity", r"算术强度", r"arithmetic intensity",
                                 forbid=(r"计算强度",)),
    "KV cache": Term(r"\bKV cache", r"KV 缓存", r"KV cache"),
    "chunked prefill": Term(r"chunked prefill", r"分块预填充", r"chunked prefill"),
    "padding mask": Term(r"padding masks?", r"填充掩码", r"(key |query )?padding masks?"),
    "finite differences": Term(r"finite differences?", r"有限差分", r"finite differences?"),
    "recomputation": Term(r"\brecomputation\b", r"(?<!权)重计算", r"recomput(ation|e)"),
    "positional encoding": Term(r"positional encoding", r"(?<!旋转)位置编码", r"positional encodings?"),
    "sliding window": Term(r"sliding[- ]window", r"滑动窗口", r"sliding[- ]window"),
    "greedy decoding": Term(r"greedy decoding", r"贪心解码", r"greedy decoding",
                            forbid=(r"贪婪解码",)),
    "block table": Term(r"block tables?", r"块表", r"block tables?", forbid=(r"页表",)),
    "copy-on-write": Term(r"copy-on-write", r"写时复制", r"copy-on-write", forbid=(r"写时拷贝",)),
    "continuous batching": Term(r"continuous batching", r"连续批处理", r"continuous batching"),
    "ring attention": Term(r"ring attention", r"环形注意力", r"ring attention",
                           forbid=(r"环状注意力",)),
    "twin": Term(r"\b(torch|numpy) twin", r"孪生版本", r"twin",
                 forbid=(r"孪生兄弟", r"孪生实现")),
    "slot": Term(r"\bslots?\b", r"槽位", r"slots?", forbid=(r"(?<!插)槽(?!位)",)),
}

# The course's name is always plain `Attention by Hand`: no 《》, no quotes, no Chinese rendering.
NAME_EN = r"Attention by Hand"
NAME_FORBID = (r"手撕注意力", r"《\s*Attention by Hand\s*》", r"[“\"「]Attention by Hand[”\"」]")
# A link to a lesson reads 第 NN 课, never 笔记本 NN.
LESSON_FORBID = (r"笔记本\s*\[?\s*(第\s*)?\d\d",)
LESSON_BARE = r"(?<!第 )\[\d\d\]\((\.\./)*\d\d_\w+\.ipynb"  # a bare number as a lesson's link text

# Exemptions, each with its reason.
# The glossary page names d2l-zh's renderings (词元, 批量, 暂退法) to say they are not used, and it
# defines the terms in a table (English beside Chinese), so it is not a lesson: no first-use rule.
FORBID_EXEMPT_DOMAINS = {"glossary": {"token", "batch", "dropout"}}
GLOSS_EXEMPT_DOMAINS = {"glossary"}
# Presence exemptions: (domain, term, a piece of the English entry) -> why the Chinese may differ.
PRESENCE_EXEMPT: dict[tuple[str, str, str], str] = {
    ("10_attention_that_learns", "running sum", "The running sum, one vector per position"):
        "the residual stream (残差流), not the online softmax's running sum",
    ("14_padding_masks", "slot", "the 12 added slots"): "padding positions (位置), not cache slots",
    ("17_generation", "slot", "where slots is the maximum length"):
        "`slots` is a symbol of the formula, kept as written",
    ("errata", "recomputation", "a KV cache only avoids recomputation"):
        "the decode loop's repeated work (重复计算), not the backward's recomputation technique",
    ("student_readme", "token", "prints a URL with a login token"):
        "a login token (登录令牌) of Jupyter, not a text token",
}
# First-use exemptions: (domain, term) -> why. None needed: the narrower rules in `_mask` and
# `first_uses` (lesson names in links, the errata's quotes of the articles) cover the cases.
GLOSS_EXEMPT: dict[tuple[str, str], str] = {}


def _prose(block: str) -> str:
    """The block without code, maths, link targets, HTML tags and URLs (they stay English)."""
    s = i18n._prose(block)  # what a translation translates: no code, maths, links, tags or URLs
    # nor the seed articles' titles, 《...》, and their English renderings, ("...") beside them
    return re.sub(r"《[^》]*》|\(\s*[\"“][^\"”]*[\"”][^()]*\)", " ", s)


def domains() -> list[str]:
    out = [s.domain for s in i18n.sources()]
    if i18n.po_path("student_readme").exists():
        out.append("student_readme")  # the student pack's README: same terms
    return out


@cache
def entries(domain: str) -> tuple[tuple[int, str, str], ...]:
    """(index as `todo --all` numbers it, English, Chinese) of every translated entry."""
    cat = i18n.read(domain)
    assert cat is not None, f"no catalog for {domain}"
    return tuple((i, m.id, m.string) for i, m in enumerate(m for m in cat if m.id) if m.string)


def _english(block: str) -> str:
    """The English prose less what the Chinese keeps verbatim or quotes: italic titles of papers
    (`*Attention Is All You Need*`), and the articles' Chinese words quoted in 「」 or in brackets."""
    s = _prose(block)
    s = re.sub(r"(?<!\*)\*(?![*\s])[^*]+(?<![*\s])\*(?!\*)", " ", s)
    return re.sub(r"「[^」]*」|\([^()]*[\u3400-\u9fff][^()]*\)", " ", s)


def presence_problems(domain: str) -> list[str]:
    out = []
    for i, en, zh in entries(domain):
        pe, pz = _english(en), _prose(zh)
        # a link text the Chinese keeps verbatim (a page title: [KV cache strategies](...))
        pe = "".join(x if f"[{x}]" not in pz else " " for x in re.split(r"(?<=\[)([^\]]*)(?=\])", pe))
        for key, t in TERMS.items():
            if not re.search(t.en, pe, flags=re.I) or re.search(t.zh, pz):
                continue
            if any(d == domain and k == key and piece in en for d, k, piece in PRESENCE_EXEMPT):
                continue
            out.append(f"{domain} @@ {i}: English says {key!r}, Chinese lacks {t.zh!r}")
        if re.search(NAME_EN, pe) and NAME_EN not in pz:
            out.append(f"{domain} @@ {i}: English names the course, Chinese lacks {NAME_EN!r}")
    return out


def forbidden_problems(domain: str) -> list[str]:
    out = []
    exempt = FORBID_EXEMPT_DOMAINS.get(domain, set())
    rules = [(k, f) for k, t in TERMS.items() if k not in exempt for f in t.forbid]
    rules += [("course name", f) for f in NAME_FORBID] + [("lesson link", f) for f in LESSON_FORBID]
    for i, _en, zh in entries(domain):
        pz = re.sub(r"`[^`]*`", " ", zh)
        for line in pz.splitlines():  # outside tables (the glossary's column of lesson numbers)
            if not line.lstrip().startswith("|"):
                for m in re.finditer(LESSON_BARE, line):
                    out.append(f"{domain} @@ {i}: lesson link: write [第 NN 课](…), not {m.group(0)!r}")
        for key, pattern in rules:
            for m in re.finditer(pattern, pz):
                ctx = pz[max(0, m.start() - 12):m.end() + 12].replace("\n", " ")
                out.append(f"{domain} @@ {i}: {key}: forbidden {m.group(0)!r} in …{ctx}…")
    return out


def _mask(text: str) -> str:
    """The text with what is not prose blanked out, same length (positions kept): code, maths,
    link targets, HTML tags, URLs, headings, link texts (`[KV 缓存那一课](13_kv_cache.ipynb)`
    names a lesson, it is not a use of the term), the topic in brackets after a lesson's link
    (`[第 13 课](13_kv_cache.ipynb)（KV 缓存）`), and the seed articles' section titles the
    errata cite, （第一篇源文章，第三步：缩放点积）: quoted names, not uses."""
    def blank(m: re.Match) -> str:
        return "\0" * len(m.group(0))

    for pattern, flags in ((r"\.ipynb(#[^)]*)?\)\s*（[^（）]*）", 0),  # a lesson's topic after its link
                           (r"(```|~~~).*?(\1|\Z)", re.S), (r"`[^`]*`", 0),
                           (r"\$\$.*?\$\$|\$[^$]*\$", re.S), (r"\[[^\]]*\]\([^)]*\)", 0),
                           (r"https?://\S+", 0), (r"<[^>]+>", 0), (r"^\s*#.*$", re.M),
                           # a seed article's section cited by its Chinese title (the errata)
                           (r"（第[一二]篇源文章[，,][^（）]*）", 0)):
        text = re.sub(pattern, blank, text, flags=flags)
    return text


GLOSSED = r"\**(?:（[^（）]*?\b(?:{g})\b[^（）]*）|[，,、]\s*(?:{g})\b)"


def first_uses(domain: str) -> list[tuple[str, int, int, int, bool]]:
    """(term, entry index, start, end, glossed) of the first use of each glossed term in a catalog:
    the first match outside what `_mask` blanks and not inside a longer pinned term."""
    texts = [(i, _mask(zh)) for i, _en, zh in entries(domain)]
    if domain == "errata":  # its 「」 quote the seed articles word for word: not the book's uses
        texts = [(i, re.sub(r"「[^」]*」", lambda m: "\0" * len(m.group(0)), t)) for i, t in texts]
    out = []
    for key, t in TERMS.items():
        if t.gloss is None:
            continue
        others = [o.zh for k, o in TERMS.items() if k != key]
        first = _first_use(texts, t.zh, others)
        if first is not None:
            i, text, m = first
            ok = (re.match(GLOSSED.format(g=t.gloss), text[m.end():], flags=re.I) is not None
                  # or the reverse, English（中文）, as the explorer's English control names have
                  or re.search(r"\b(?:" + t.gloss + r")\**（$", text[:m.start()], flags=re.I) is not None)
            out.append((key, i, m.start(), m.end(), ok))
    return out


def gloss_problems(domain: str) -> list[str]:
    """The first use of each glossed term (outside headings) must read 中文（English）."""
    if domain in GLOSS_EXEMPT_DOMAINS:
        return []
    zh = {i: z for i, _en, z in entries(domain)}
    out = []
    for key, i, a, b, ok in first_uses(domain):
        if not ok and (domain, key) not in GLOSS_EXEMPT:
            ctx = zh[i][max(0, a - 10):b + 16].replace("\n", " ")
            out.append(f"{domain} @@ {i}: first {TERMS[key].zh!r} not glossed "
                       f"({TERMS[key].gloss}): …{ctx}…")
    return out


def _first_use(texts, pattern, others):
    """(index, text, match) of the first use of `pattern` not inside a longer pinned term."""
    for i, text in texts:
        longer = [o for p in others for o in re.finditer(p, text)]
        for m in re.finditer(pattern, text):
            inside = any(o.start() <= m.start() and m.end() <= o.end() and
                         (o.end() - o.start()) > (m.end() - m.start()) for o in longer)
            if not inside:
                return i, text, m
    return None


@pytest.mark.parametrize("domain", domains())
def test_pinned_terms_are_used(domain):
    bad = presence_problems(domain)
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("domain", domains())
def test_no_forbidden_variants(domain):
    bad = forbidden_problems(domain)
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("domain", domains())
def test_first_use_is_glossed(domain):
    bad = gloss_problems(domain)
    assert not bad, "\n".join(bad)


def test_the_pinned_terms_are_the_glossarys():
    """The table here follows the glossary page: each term's English is in `glossary.md` and its
    pinned Chinese in the page's Chinese edition."""
    english = (i18n.NOTEBOOKS / "glossary.md").read_text(encoding="utf-8").lower()
    chinese = " ".join(zh for _i, _en, zh in entries("glossary"))
    missing = [k for k in TERMS if k.lower() not in english]
    assert not missing, f"terms missing from glossary.md: {missing}"
    missing = [k for k, t in TERMS.items() if not re.search(t.zh, chinese)]
    assert not missing, f"pinned terms missing from the glossary's Chinese: {missing}"


if __name__ == "__main__":  # a report: python -m tests.test_terms_zh
    for d in domains():
        for line in presence_problems(d) + forbidden_problems(d) + gloss_problems(d):
            print(line)
