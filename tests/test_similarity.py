"""The similarity report: planted near-copies (renamed, reordered) rank top, honest work low."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "notebooks" / "assignments"))
import similarity  # noqa: E402

TEMPLATE = [
    "def softmax(x, axis=-1):\n    # YOUR CODE HERE\n    raise NotImplementedError()",
    "def causal_mask(T):\n    # YOUR CODE HERE\n    raise NotImplementedError()",
    "def attention(q, k, v, mask=None):\n    # YOUR CODE HERE\n    raise NotImplementedError()",
]

HONEST = {
    "alice": [
        "def softmax(x, axis=-1):\n    shifted = x - x.max(axis=axis, keepdims=True)\n"
        "    e = np.exp(shifted)\n    total = e.sum(axis=axis, keepdims=True)\n    return e / total",
        "def causal_mask(T):\n    rows = np.arange(T)[:, None]\n    cols = np.arange(T)[None, :]\n"
        "    return cols <= rows",
        "def attention(q, k, v, mask=None):\n    d_k = q.shape[-1]\n    scores = q @ k.T / np.sqrt(d_k)\n"
        "    if mask is not None:\n        scores = np.where(mask, scores, -np.inf)\n"
        "    weights = softmax(scores)\n    out = weights @ v\n    return out, weights",
    ],
    "bob": [
        "def softmax(x, axis=-1):\n    m = np.max(x, axis, keepdims=True)\n    ex = np.exp(x - m)\n"
        "    return ex / np.sum(ex, axis, keepdims=True)",
        "def causal_mask(T):\n    return np.tril(np.ones((T, T), dtype=bool))",
        "def attention(q, k, v, mask=None):\n    s = np.matmul(q, np.swapaxes(k, -1, -2))\n"
        "    s = s / math.sqrt(k.shape[-1])\n    if mask is not None:\n        s[~mask] = -1e9\n"
        "    p = softmax(s, axis=-1)\n    return np.matmul(p, v), p",
    ],
    "carol": [
        "def softmax(x, axis=-1):\n    x = np.asarray(x, dtype=float)\n"
        "    z = np.exp(x - np.amax(x, axis=axis, keepdims=True))\n"
        "    z /= z.sum(axis=axis, keepdims=True)\n    return z",
        "def causal_mask(T):\n    mask = np.zeros((T, T), dtype=bool)\n    for i in range(T):\n"
        "        mask[i, :i + 1] = True\n    return mask",
        "def attention(q, k, v, mask=None):\n    scale = 1.0 / q.shape[-1] ** 0.5\n"
        "    logits = np.einsum('td,sd->ts', q, k) * scale\n    if mask is not None:\n"
        "        logits = logits + np.where(mask, 0.0, -np.inf)\n    a = softmax(logits)\n"
        "    return np.einsum('ts,sd->td', a, v), a",
    ],
    "dan": [
        "def softmax(x, axis=-1):\n    out = []\n    for row in np.moveaxis(x, axis, -1).reshape(-1, x.shape[axis]):\n"
        "        big = max(row)\n        exps = [math.exp(r - big) for r in row]\n"
        "        s = sum(exps)\n        out.append([e / s for e in exps])\n"
        "    res = np.array(out).reshape(np.moveaxis(x, axis, -1).shape)\n"
        "    return np.moveaxis(res, -1, axis)",
        "def causal_mask(T):\n    i, j = np.indices((T, T))\n    return j <= i",
        "def attention(q, k, v, mask=None):\n    T, d = q.shape\n    S = k.shape[0]\n"
        "    scores = np.empty((T, S))\n    for t in range(T):\n        for s in range(S):\n"
        "            scores[t, s] = np.dot(q[t], k[s]) / np.sqrt(d)\n"
        "            if mask is not None and not mask[t, s]:\n                scores[t, s] = -np.inf\n"
        "    w = softmax(scores, axis=1)\n    return w.dot(v), w",
    ],
    "erin": [
        "def softmax(x, axis=-1):\n    x_max = x.max(axis, keepdims=True)\n"
        "    unnorm = np.exp(x - x_max)\n    norm = unnorm.sum(axis, keepdims=True)\n"
        "    probs = unnorm / norm\n    assert np.allclose(probs.sum(axis), 1)\n    return probs",
        "def causal_mask(T):\n    return ~np.triu(np.ones((T, T), dtype=bool), k=1)",
        "def attention(q, k, v, mask=None):\n    dk = k.shape[1]\n    raw = np.dot(q, k.transpose())\n"
        "    raw /= np.sqrt(dk)\n    if mask is not None:\n        raw = np.where(mask == False, -np.inf, raw)\n"
        "    att = softmax(raw, -1)\n    result = np.dot(att, v)\n    return result, att",
    ],
    "frank": [
        "def softmax(x, axis=-1):\n    from scipy.special import logsumexp\n"
        "    return np.exp(x - logsumexp(x, axis=axis, keepdims=True))",
        "def causal_mask(T):\n    return np.array([[c <= r for c in range(T)] for r in range(T)])",
        "def attention(q, k, v, mask=None):\n    sc = (q @ k.T) * (q.shape[1] ** -0.5)\n"
        "    sc = sc if mask is None else np.ma.masked_array(sc, ~mask).filled(-np.inf)\n"
        "    wts = softmax(sc)\n    return wts @ v, wts",
    ],
}


def _rename(cells: list[str], names: dict[str, str]) -> list[str]:
    """The cells with whole-word identifiers renamed."""
    pat = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
    return [pat.sub(lambda m: names[m.group(1)], c) for c in cells]


def planted_class() -> dict[str, list[str]]:
    """Six honest students and two near-copies: renamed variables, reordered functions, comments."""
    subs = {s: list(c) for s, c in HONEST.items()}
    g = _rename(HONEST["alice"], {"shifted": "xs", "e": "expd", "total": "denom", "rows": "r",
                                  "cols": "c", "d_k": "dim", "scores": "logits", "weights": "probs",
                                  "out": "result"})
    subs["gina"] = ["# my own work\n" + g[2], g[0] + "  # stable", g[1]]
    h = _rename(HONEST["dan"], {"out": "acc", "row": "vec", "big": "top", "exps": "ex", "res": "arr",
                                "scores": "sc", "w": "attn", "T": "n_q", "S": "n_k"})
    subs["hugo"] = [h[1], "\n\n" + h[2], h[0].replace("        s = sum(ex)", "        s = 0\n"
                                                       "        s = sum(ex)")]
    return subs


def test_the_two_planted_copies_rank_top_and_honest_pairs_stay_low():
    pairs = similarity.compare(planted_class(), TEMPLATE)
    top = {frozenset((p.a, p.b)) for p in pairs[:2]}
    assert top == {frozenset(("alice", "gina")), frozenset(("dan", "hugo"))}
    assert min(p.score for p in pairs[:2]) >= 0.5
    assert max(p.score for p in pairs[2:]) < 0.2


def test_renaming_every_identifier_does_not_lower_the_score():
    subs = {"a": HONEST["bob"], "b": _rename(HONEST["bob"], {"m": "mx", "ex": "z", "s": "sc", "p": "pr"}),
            "c": HONEST["carol"]}
    pairs = similarity.compare(subs, TEMPLATE)
    assert (pairs[0].a, pairs[0].b, pairs[0].score) == ("a", "b", 1.0)


def test_the_template_alone_is_not_a_match():
    subs = {"x": TEMPLATE, "y": TEMPLATE, "z": HONEST["erin"]}
    pairs = similarity.compare(subs, TEMPLATE)
    assert all(p.score == 0 for p in pairs)
    without = similarity.compare(subs)  # the same class, template not excluded
    assert without[0].score == 1.0


def test_a_pair_lists_the_lines_it_shares():
    pairs = similarity.compare(planted_class(), TEMPLATE)
    ag = next(p for p in pairs if {p.a, p.b} == {"alice", "gina"})
    assert any("np.exp" in la for la, _ in ag.lines)
    text = similarity.text_report(pairs, "A0_demo")
    assert text.splitlines()[3].split()[1:4] == ["LOOK", f"{pairs[0].score:.1%}", pairs[0].a]
    page = similarity.html_report(pairs, "A0_demo")
    assert page.count('class="look"') == 2 and "np.exp" in page


def test_unfinished_cells_and_magics_do_not_raise():
    toks = similarity.tokens("%timeit f()\ndef f(:\n    x = (1,\n")
    assert [t.text for t in toks][:3] == ["def", "V", "("]


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="at least two submissions"):
        similarity.compare({"only": ["x = 1"]})
    with pytest.raises(ValueError, match="must be positive"):
        similarity.compare({"a": ["x"], "b": ["y"]}, k=0)


def _nb(cells: list[str], extra: str = "") -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    for i, src in enumerate(cells):
        c = nbformat.v4.new_code_cell(src)
        c.metadata["nbgrader"] = {"solution": True, "grade": False, "grade_id": f"s{i}"}
        nb.cells.append(c)
    nb.cells.append(nbformat.v4.new_code_cell(extra or "assert softmax(1) == 1"))
    return nb


def test_the_command_reads_a_course_folder_and_writes_both_reports(tmp_path, capsys):
    name = "A0_demo"
    (tmp_path / "release" / name).mkdir(parents=True)
    nbformat.write(_nb(TEMPLATE), tmp_path / "release" / name / f"{name}.ipynb")
    for s, cells in planted_class().items():
        d = tmp_path / "submitted" / s / name
        d.mkdir(parents=True)
        nbformat.write(_nb(cells), d / f"{name}.ipynb")
    assert similarity.main(["A0", "--root", str(tmp_path)]) == 0
    text = (tmp_path / "reports" / f"similarity_{name}.txt").read_text()
    assert "alice - gina" in text and "dan - hugo" in text
    assert (tmp_path / "reports" / f"similarity_{name}.html").exists()
    with pytest.raises(SystemExit, match="unknown assignment"):
        similarity.main(["A9", "--root", str(tmp_path)])


def test_a_class_of_one_is_a_clear_error_from_the_command(tmp_path):
    name = "A0_demo"
    for d in (tmp_path / "release" / name, tmp_path / "submitted" / "solo" / name):
        d.mkdir(parents=True)
        nbformat.write(_nb(TEMPLATE), d / f"{name}.ipynb")
    with pytest.raises(SystemExit, match="need at least two submissions"):
        similarity.main([name, "--root", str(tmp_path)])
