"""The Chinese edition's catalogs (tools.book.i18n): blocks, checks, fuzzy entries, Chinese notebooks."""

from __future__ import annotations

import json
import pathlib

import nbformat
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tools.book import i18n

ROOT = pathlib.Path(__file__).resolve().parent.parent

LINES = st.sampled_from([
    "Some words here.", "", "", "   ", "## A heading", "- an item with `code`", "1. first",
    "| a | b |", "|---|---|", "$$", "x^2 + y^2", "```python", "print('x')", "```", "$a$ and $b$",
    "<details><summary>Show answer</summary>", "</details>", "Text over\tline",
])


@settings(max_examples=300, deadline=None)
@given(st.lists(LINES, max_size=25), st.booleans())
def test_blocks_put_back_together_give_the_text(lines, newline):
    """Cutting markdown into blocks never loses or moves a character."""
    text = "\n".join(lines) + ("\n" if newline else "")
    assert "".join(i18n.split_blocks(text)) == text


def test_blocks_keep_fenced_code_and_display_maths_whole():
    text = "Intro.\n\n```python\na = 1\n\nb = 2\n```\n\n$$\nx\n\ny\n$$\n\nEnd."
    blocks = [b for b in i18n.split_blocks(text) if b.strip()]
    assert blocks == ["Intro.", "```python\na = 1\n\nb = 2\n```", "$$\nx\n\ny\n$$", "End."]
    assert [i18n.translatable(b) for b in blocks] == [True, False, False, True]
    assert not i18n.translatable("`mha.steps` $x$ [](05_causal_mask.ipynb)")


ENGLISH = ("## The `softmax` step\n- divide by $\\sqrt{d_k}$, see [05](05_causal_mask.ipynb)\n"
           "- <b>twice</b>: $x_1,\nx_2$")
RIGHT = ("## `softmax` 这一步\n- 除以 $\\sqrt{d_k}$，见 [05](05_causal_mask.ipynb)\n"
         "- <b>两次</b>：$x_1, x_2$")


@pytest.mark.parametrize("broken, complaint", [
    (RIGHT.replace("`softmax`", "softmax"), "code spans"),
    (RIGHT.replace("\\sqrt{d_k}", "\\sqrt{d}"), "maths"),
    (RIGHT.replace("05_causal_mask.ipynb", "06_softmax.ipynb"), "link targets"),
    (RIGHT.replace("<b>两次</b>", "两次"), "HTML tags"),
    (RIGHT.replace("## ", "### "), "heading level"),
    (RIGHT.replace("\n- <b>", " <b>"), "list items"),
    (ENGLISH, "no Chinese"),
    ("", "empty"),
    (RIGHT + "\n", "trailing newline"),
])
def test_a_translation_that_drops_what_its_block_points_at_is_refused(broken, complaint):
    assert i18n.problems(ENGLISH, RIGHT) == []  # maths may wrap differently
    said = i18n.problems(ENGLISH, broken)
    assert any(complaint in p for p in said), said


def test_tables_keep_their_rows_and_columns():
    en = "| term | meaning |\n|---|---|\n| mask | which keys |"
    assert i18n.problems(en, "| 术语 | 含义 |\n|---|---|\n| 掩码 | 哪些键 |") == []
    assert i18n.problems(en, "| 术语 | 含义 |\n|---|---|\n| 掩码 | 哪些 | 键 |")
    assert i18n.problems(en, "| 术语 | 含义 |\n|---|---|")


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """i18n pointed at a folder holding one notebook and its catalogs."""
    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# 05 · The mask\n\nMask before softmax. See [the README](../README.md)."),
        nbformat.v4.new_code_cell("x = 1  # stays English", outputs=[
            nbformat.v4.new_output("stream", text="1\n")]),
        nbformat.v4.new_markdown_cell("Rows sum to one."),
    ])
    nbformat.write(nb, nbs / "05_mask.ipynb")
    monkeypatch.setattr(i18n, "ROOT", tmp_path)
    monkeypatch.setattr(i18n, "NOTEBOOKS", nbs)
    monkeypatch.setattr(i18n, "LOCALE_DIR", nbs / "locale")
    return nbs


def test_round_trip_and_a_changed_sentence_turns_fuzzy(sandbox):
    i18n.update()
    assert "@@ 0\n# 05 · The mask" in i18n.todo("05_mask")
    refused = i18n.fill("05_mask", {0: "# 05 · 掩码", 1: "先掩码，再 softmax。见 [README](../README.md)。",
                                    2: "每行和为一。"})
    assert refused == []
    (st_,) = i18n.stat()
    assert st_.complete and st_.translated == 3
    # The English changes: its entry turns fuzzy (old translation kept as a hint), stat fails.
    path = sandbox / "05_mask.ipynb"
    nb = nbformat.read(path, as_version=4)
    nb.cells[2].source = "Every row sums to one."
    nbformat.write(nb, path)
    i18n.update()
    (st_,) = i18n.stat()
    assert (st_.fuzzy, st_.complete) == (1, False)
    assert "fuzzy" in i18n.todo("05_mask") and "每行和为一。" in i18n.todo("05_mask")
    assert i18n.fill("05_mask", {2: "每一行的和都是一。"}) == []
    assert i18n.stat()[0].complete
    # A refused entry leaves the catalog as it was.
    assert i18n.fill("05_mask", {2: "Every row sums to one."}) != []
    assert i18n.stat()[0].complete


def test_chinese_notebooks_keep_code_and_outputs_and_reach_files_from_their_folder(sandbox):
    i18n.update()
    i18n.fill("05_mask", {0: "# 05 · 掩码", 1: "先掩码，再 softmax。见 [README](../README.md)。",
                          2: "每行和为一。"})
    out = sandbox / "zh_CN"
    (written,) = i18n.write_notebooks(out)
    en = json.loads((sandbox / "05_mask.ipynb").read_text())
    zh = json.loads(written.read_text())
    assert [c for c in zh["cells"] if c["cell_type"] == "code"] == \
        [c for c in en["cells"] if c["cell_type"] == "code"]
    assert "".join(zh["cells"][0]["source"]).startswith("# 05 · 掩码")
    assert "](../../README.md)" in "".join(zh["cells"][0]["source"])  # one folder deeper
    assert (out / ".mha-language").read_text().strip() == "zh_CN"


def test_a_line_break_between_chinese_characters_is_not_shown_as_a_space():
    assert i18n.unwrap("就是\n把 rank $r$ 的消息\n$j$ 项。\n- 下一项") == "就是把 rank $r$ 的消息\n$j$ 项。\n- 下一项"


def test_an_untranslated_block_falls_back_to_english_in_the_notebook(sandbox):
    i18n.update()
    i18n.fill("05_mask", {0: "# 05 · 掩码"})
    nb = i18n.translated_notebook(sandbox / "05_mask.ipynb")
    assert nb.cells[0].source.startswith("# 05 · 掩码\n\nMask before softmax.")
    assert not i18n.stat()[0].complete  # and the strict check says so


def test_the_repository_catalogs_cover_every_lesson_assignment_and_page():
    domains = {s.domain for s in i18n.sources()}
    stems = {p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    stems |= {p.stem for p in (ROOT / "notebooks" / "assignments" / "source").glob("A*/A*.ipynb")}
    assert stems | {"glossary", "errata"} <= domains
    for d in domains:
        assert i18n.po_path(d).exists(), f"no catalog for {d}: python -m tools.book.i18n update {d}"
