"""The Chinese edition for students: `make student-pack LANG=zh_CN`, `make assignment A=A1 LANG=zh_CN`.

One private course is released for the module (tmp: the teacher's release/ and gradebook are
never touched) and both packs are built from it. The Chinese pack must be the English one with
only its prose changed: the lessons' code cells and outputs, the assignments' code, answer stubs
and nbgrader cells are the same objects; every markdown block comes from the catalogs; the
README from its own catalog (student_readme.po), refused when the English moves on without it;
`.mha-language` beside the lessons and each assignment; nothing of the answers. A Chinese
submission is graded exactly like the English one by the course's own (English) gradebook.
Each check is shown failing on a planted fault.
"""

from __future__ import annotations

import re
import shutil
import sys
import zipfile
from collections import Counter
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
COURSE = ROOT / "notebooks" / "assignments"
sys.path.insert(0, str(COURSE))
import course  # noqa: E402
import self_study  # noqa: E402
import student_pack as sp  # noqa: E402

ZH = "zh_CN"
A1 = "A1_seven_steps"
CJK = re.compile(r"[\u3400-\u9fff]")
i18n = sp.i18n_tools()


@pytest.fixture(scope="module")
def packs(tmp_path_factory) -> tuple[sp.Pack, sp.Pack, Path]:
    """(English pack, Chinese pack, the private course both were built from)."""
    tmp = tmp_path_factory.mktemp("student-zh")
    copy = course.private_copy(tmp)
    sp.release(copy)
    en = sp.build(tmp / "en" / "pack", course=copy, do_release=False, archive=False)
    zh = sp.build(tmp / "zh" / "pack", course=copy, do_release=False, lang=ZH)
    return en, zh, copy


def _prose_blocks(text: str) -> list[str]:
    return [b for b in i18n.split_blocks(text) if i18n.translatable(b)]


def _code_view(cell) -> dict:
    """Everything of a code (or raw) cell: it must not change in translation."""
    return {k: v for k, v in cell.items()}


def test_the_chinese_lessons_are_the_english_code_and_outputs_with_chinese_prose(packs):
    en, zh, _ = packs
    lessons = sp.lessons(ROOT)
    assert len(lessons) >= 17
    for path in lessons:
        english = nbformat.read(en.folder / "notebooks" / path.name, as_version=4)
        chinese = nbformat.read(zh.folder / "notebooks" / path.name, as_version=4)
        cat = i18n.read(path.stem, ZH)
        assert len(english.cells) == len(chinese.cells), path.name
        prose = 0
        for i, (e, c) in enumerate(zip(english.cells, chinese.cells, strict=True)):
            where = f"{path.name} cell {i}"
            assert e.cell_type == c.cell_type and e.metadata == c.metadata, where
            if e.cell_type != "markdown":
                assert _code_view(e) == _code_view(c), f"{where}: code or outputs changed"
                continue
            assert e.get("attachments") == c.get("attachments"), where
            assert c.source == i18n.translate_text(e.source, cat), where
            assert not sp.missing_translations(e.source, cat), f"{where}: English left"
            for block in _prose_blocks(e.source):
                prose += 1
                assert block not in c.source, f"{where}: an English block: {block[:80]!r}"
            if _prose_blocks(e.source):
                assert CJK.search(c.source), where
        assert prose > 5, path.name
        meta = {k: v for k, v in chinese.metadata.items() if k != "language"}
        assert meta == english.metadata and chinese.metadata["language"] == ZH, path.name


def test_the_chinese_assignments_change_only_their_instructions(packs):
    from nbgrader.utils import compute_checksum

    en, zh, copy = packs
    names = course.assignments(COURSE)
    assert len(names) >= 5
    for name in names:
        rel = f"notebooks/assignments/{name}/{name}.ipynb"
        english = nbformat.read(en.folder / rel, as_version=4)
        chinese = nbformat.read(zh.folder / rel, as_version=4)
        release = nbformat.read(copy / "release" / name / f"{name}.ipynb", as_version=4)
        cat = i18n.read(name, ZH)
        translated_locked = []
        for i, (e, c) in enumerate(zip(english.cells, chinese.cells, strict=True)):
            where = f"{name} cell {i}"
            meta_e, meta_c = e.metadata.get("nbgrader", {}), c.metadata.get("nbgrader", {})
            if e.cell_type == "code" or sp.i18n_tools().is_answer_cell(e):
                assert _code_view(e) == _code_view(c), f"{where}: a code or answer cell changed"
                continue
            assert c.source == sp.relink_lessons(i18n.translate_text(release.cells[i].source, cat))
            assert not sp.missing_translations(release.cells[i].source, cat), where
            if _prose_blocks(e.source):
                assert CJK.search(c.source), where
            if "checksum" in meta_e:  # a locked instruction cell: its new text, its new checksum
                translated_locked.append(meta_c["grade_id"])
                assert {k: v for k, v in meta_c.items() if k != "checksum"} == \
                    {k: v for k, v in meta_e.items() if k != "checksum"}, where
                note = c.metadata["mha_translation"]
                assert note["lang"] == ZH and course.translated_from(c, release.cells[i]), where
            else:
                assert c.metadata == e.metadata, where
        # nbgrader's Validate compares every checksum with the cell: none reads as changed.
        stale = [c.metadata["nbgrader"]["grade_id"] for c in chinese.cells
                 if "checksum" in c.metadata.get("nbgrader", {})
                 and compute_checksum(c) != c.metadata["nbgrader"]["checksum"]]
        assert not stale, f"{name}: cells nbgrader would report as changed: {stale}"
        assert translated_locked, f"{name}: no written-answer prompt was translated"
        text = "\n".join(c.source for c in chinese.cells)
        assert "# YOUR CODE HERE" in text and "YOUR ANSWER HERE" in text, name
        assert nbformat.read(zh.folder / rel, as_version=4).metadata["language"] == ZH
        for target in re.findall(r"\]\(([^)\s]+\.ipynb)\)", (zh.folder / rel).read_text()):
            assert (zh.folder / rel).parent.joinpath(target).resolve().is_file(), (name, target)


def test_a_stale_checksum_would_be_caught(packs):
    """The checksum check above fails on a translated locked cell that kept its English checksum."""
    from nbgrader.utils import compute_checksum

    en, zh, _ = packs
    rel = f"notebooks/assignments/{A1}/{A1}.ipynb"
    english = nbformat.read(en.folder / rel, as_version=4)
    chinese = nbformat.read(zh.folder / rel, as_version=4)
    i = next(i for i, c in enumerate(chinese.cells) if "mha_translation" in c.metadata)
    chinese.cells[i].metadata["nbgrader"]["checksum"] = english.cells[i].metadata["nbgrader"]["checksum"]
    assert compute_checksum(chinese.cells[i]) != chinese.cells[i].metadata["nbgrader"]["checksum"]


def test_the_language_marker_is_beside_the_lessons_and_each_assignment(packs, monkeypatch):
    from mha_course import i18n as course_i18n

    en, zh, _ = packs
    assert sp.LANGUAGE_MARKER == course_i18n.MARKER
    folders = [zh.folder / "notebooks", *(zh.folder / "notebooks" / "assignments" / n
                                          for n in course.assignments(COURSE))]
    for folder in folders:
        assert (folder / sp.LANGUAGE_MARKER).read_text() == f"{ZH}\n", folder
        assert f"{(folder / sp.LANGUAGE_MARKER).relative_to(zh.folder).as_posix()}" in zh.files
    assert not [f for f in en.files if f.endswith(sp.LANGUAGE_MARKER)]
    monkeypatch.delenv("MHA_LANG", raising=False)
    monkeypatch.chdir(folders[1])
    assert course_i18n.language() == ZH  # a kernel started beside the notebook speaks Chinese


def test_the_chinese_readme_comes_from_its_catalog(packs):
    en, zh, _ = packs
    assert sp.readme_catalog_problems(ZH) == []
    readme = (zh.folder / "README.md").read_text(encoding="utf-8")
    assert readme.startswith(sp.readme_titles()[1]) and CJK.search(readme.splitlines()[0])
    for block in _prose_blocks(sp.readme_source(ZH)):
        assert block not in readme, f"English left in the Chinese README: {block[:80]!r}"
    # the same commands, paths and rows as the English README, the titles in Chinese
    english = (en.folder / "README.md").read_text(encoding="utf-8")
    spans = re.compile(r"`[^`\n]+`")
    assert Counter(spans.findall(readme)) == \
        Counter(spans.findall(english)) + Counter(spans.findall(sp.EDITION_NOTE))
    for path in sp.lessons(ROOT):
        title = sp._title(zh.folder / "notebooks" / path.name)
        assert CJK.search(title) and f"| `notebooks/{path.name}` | {title} |" in readme
    for name in course.assignments(COURSE):
        assert f"`notebooks/assignments/{name}/{name}.ipynb` | {name.split('_')[0]} · " in readme
    note = (zh.folder / "requirements.txt").read_text()
    heading = note.split('README, "', 1)[1].split('"', 1)[0]
    assert re.search(rf"^## .*{re.escape(heading)}", readme, re.M), heading
    assert ".mha-language" in readme


def test_the_readme_catalog_is_complete_and_follows_the_english():
    """student_readme.po holds exactly the README's blocks, each translated and valid (what
    `student_pack.py --check-readme-catalog` checks); no build needed."""
    assert sp.readme_catalog_problems(ZH) == []
    cat = i18n.read(sp.README_DOMAIN, ZH)
    assert [m.id for m in cat if m.id] == _prose_blocks(sp.readme_source(ZH))
    assert all(CJK.search(m.string) for m in cat if m.id)
    assert sp.main(["--check-readme-catalog"]) == 0


def test_a_changed_english_readme_without_its_translation_is_refused(monkeypatch, tmp_path):
    """The README's Chinese cannot drift: a changed English block has no translation until
    the catalog follows (update: fuzzy), and nothing is built half English meanwhile."""
    changed = sp.README_BODY.replace("The whole course runs on a CPU.",
                                     "The whole course runs on any CPU.")
    assert changed != sp.README_BODY
    monkeypatch.setattr(sp, "README_BODY", changed)
    missing = sp.readme_catalog_problems(ZH)
    assert len(missing) == 1 and "any CPU" in missing[0]
    with pytest.raises(sp.Untranslated, match="student_readme: 1 block"):
        sp.student_readme([], {}, ZH)
    assert sp.student_readme([], {}, "en")  # English is never held back
    # `--update-readme-catalog` turns the entry fuzzy (old translation kept), still refused.
    locale = tmp_path / "locale"
    shutil.copytree(i18n.LOCALE_DIR, locale)
    monkeypatch.setattr(i18n, "LOCALE_DIR", locale)
    sp.update_readme_catalog(ZH)
    fuzzy = [m for m in i18n.read(sp.README_DOMAIN, ZH) if m.id and m.fuzzy]
    assert len(fuzzy) == 1 and "any CPU" in fuzzy[0].id and fuzzy[0].string
    assert sp.readme_catalog_problems(ZH) == missing


def test_a_missing_lesson_or_assignment_translation_stops_the_chinese_pack(packs, monkeypatch,
                                                                          tmp_path):
    _, _, copy = packs
    locale = tmp_path / "locale"
    shutil.copytree(i18n.LOCALE_DIR, locale)
    monkeypatch.setattr(i18n, "LOCALE_DIR", locale)
    for domain in ("05_causal_mask", A1):
        po = i18n.po_path(domain, ZH)
        saved = po.read_bytes()
        cat = i18n.read(domain, ZH)
        next(m for m in cat if m.id).string = ""
        i18n.write(cat, domain, ZH)
        out = tmp_path / f"pack-{domain}"
        with pytest.raises(sp.Untranslated, match=rf"{domain}: 1 block"):
            sp.build(out, course=copy, do_release=False, lang=ZH)
        assert not out.exists() and not (tmp_path / f"{sp.archive_name(ZH)}.zip").exists()
        po.write_bytes(saved)


def test_no_answer_is_in_the_chinese_pack_and_a_planted_one_is_found(packs, tmp_path):
    _, zh, _ = packs
    report = sp.check_leaks(zh.folder, COURSE / "source", ROOT)
    assert report.ok and report.regions > 50 and report.lines > 100, report.summary()
    assert zh.leaks is not None and zh.leaks.ok  # the build checked before zipping
    # A solution region pasted into a Chinese instruction cell is found like in English.
    regions, _ = sp.secret_regions(COURSE / "source")
    solution = next(r for r in regions if r.notebook == f"{A1}.ipynb" and r.kind == "solution"
                    and "\n" in r.text.strip() and r.cell != "a1-params")
    leaky = tmp_path / "leaky"
    shutil.copytree(zh.folder, leaky)
    path = leaky / "notebooks" / "assignments" / A1 / f"{A1}.ipynb"
    nb = nbformat.read(path, as_version=4)
    cell = next(c for c in nb.cells if "mha_translation" in c.metadata)
    cell.source += "\n\n提示：\n" + solution.text
    nbformat.write(nb, path)
    found = sp.check_leaks(leaky, COURSE / "source", ROOT)
    assert (solution, path.relative_to(leaky).as_posix()) in found.leaks, found.summary()


def test_the_chinese_zip_holds_the_pack_beside_the_english_one(packs):
    _, zh, _ = packs
    assert zh.archive.name == "attention-by-hand-student-zh_CN.zip"
    with zipfile.ZipFile(zh.archive) as z:
        assert sorted(z.namelist()) == [f"{sp.archive_name(ZH)}/{f}" for f in zh.files]
    assert sp.default_out(ZH) != sp.default_out("en") and sp.default_out(ZH).parent == \
        sp.default_out("en").parent


def _filled(nb, source) -> nbformat.NotebookNode:
    """`nb` (a pack's notebook) with every answer cell holding the model answer of `source`."""
    nb = nbformat.from_dict(nb)
    answers = course.graded_cells(source)
    for gid, cell in course.graded_cells(nb).items():
        if cell.metadata["nbgrader"].get("solution"):
            cell.source = "\n".join(line for line in answers[gid].source.splitlines()
                                    if "### BEGIN SOLUTION" not in line
                                    and "### END SOLUTION" not in line)
    return nb


def test_a_chinese_submission_is_graded_exactly_like_the_english_one(packs):
    en, zh, copy = packs
    rel = f"notebooks/assignments/{A1}/{A1}.ipynb"
    source = nbformat.read(COURSE / "source" / A1 / f"{A1}.ipynb", as_version=4)
    english = nbformat.read(en.folder / rel, as_version=4)
    chinese = nbformat.read(zh.folder / rel, as_version=4)
    # One model answer half wrong, so points are both won and lost.
    half = _filled(english, source)
    zh_half = _filled(chinese, source)
    for nb in (half, zh_half):
        cell = course.graded_cells(nb)["a1-softmax"]
        cell.source = "def softmax(scores):\n    raise NotImplementedError()\n"
    # A Chinese submission that edits a translated prompt: reported, like an English edit.
    edited = nbformat.from_dict(chinese)
    prompt = next(c for c in edited.cells if "mha_translation" in c.metadata)
    prompt.source += "\n（我改了题目）"
    subs = {"en-blank": english, "zh-blank": chinese, "en-model": _filled(english, source),
            "zh-model": _filled(chinese, source), "en-half": half, "zh-half": zh_half,
            "zh-edited": edited}
    for student, nb in subs.items():
        course.submit(A1, student, nb, copy)
    rows = course.grade([A1], copy, students=list(subs), workers=4)

    def scores(student):
        return sorted((p.part, p.score, p.max_score, p.needs_manual_grade, p.manual)
                      for p in rows if p.student == student)

    assert scores("en-model") and scores("en-half") != scores("en-model") != scores("en-blank")
    for kind in ("blank", "model", "half"):
        assert scores(f"zh-{kind}") == scores(f"en-{kind}"), kind
        assert course.edited_locked_cells(A1, f"zh-{kind}", copy) == []
        assert course._notes(A1, f"zh-{kind}", copy) == course._notes(A1, f"en-{kind}", copy)
    assert scores("zh-edited") == scores("en-blank")
    assert course.edited_locked_cells(A1, "zh-edited", copy) == [prompt.metadata["nbgrader"]["grade_id"]]
    # Grading restores every locked cell from the gradebook: the graded notebook's prompts are
    # the English ones, whatever edition was handed in.
    graded = course.graded_cells(nbformat.read(
        copy / "autograded" / "zh-model" / A1 / f"{A1}.ipynb", as_version=4))
    release = course.graded_cells(nbformat.read(copy / "release" / A1 / f"{A1}.ipynb",
                                                as_version=4))
    prompts = [gid for gid, c in course.graded_cells(chinese).items()
               if "mha_translation" in c.metadata]
    assert prompts and all(graded[gid].source == release[gid].source for gid in prompts)


# ---- self-study in Chinese -------------------------------------------------------------------
@pytest.fixture(scope="module")
def started_zh(tmp_path_factory) -> tuple[Path, Path, Path, Path]:
    """(work, cache, the Chinese A1, the English A1 started from the same cache)."""
    tmp = tmp_path_factory.mktemp("self-study-zh")
    cache = tmp / "cache"
    english = self_study.start("A1", tmp / "work-en", cache)
    return tmp / "work", cache, self_study.start("A1", tmp / "work", cache, lang=ZH), english


def test_start_in_chinese_gives_chinese_instructions_and_the_marker(started_zh):
    work, _, notebook, english_path = started_zh
    assert notebook == work / "A1" / f"{A1}.ipynb"
    assert (work / "A1" / sp.LANGUAGE_MARKER).read_text() == f"{ZH}\n"
    assert not (english_path.parent / sp.LANGUAGE_MARKER).exists()
    mine, english = (nbformat.read(p, as_version=4) for p in (notebook, english_path))
    for e, c in zip(english.cells, mine.cells, strict=True):
        if e.cell_type == "code" or sp.i18n_tools().is_answer_cell(e):
            assert e == c
        elif _prose_blocks(e.source):
            assert CJK.search(c.source) and not any(b in c.source for b in _prose_blocks(e.source))
    assert sp.check_leaks(work, COURSE / "source", ROOT).ok
    text = "\n".join(c.source for c in mine.cells)
    for link in re.findall(r"\]\(([^)]*\d\d_[a-z0-9_]+\.ipynb)", text):
        assert (notebook.parent / link).resolve().is_file(), link
        assert (notebook.parent / link).resolve().parent == self_study.lessons_dir(ZH)


def test_check_grades_the_chinese_self_study_notebook_like_the_english(started_zh):
    work, cache, notebook, english_path = started_zh
    blank = self_study.check("A1", work, cache)
    assert blank.score == 0 and blank.max_score > 0 and blank.feedback.is_file()
    assert "was edited" not in blank.feedback.read_text(encoding="utf-8")
    saved = notebook.read_bytes()
    try:
        source = nbformat.read(COURSE / "source" / A1 / f"{A1}.ipynb", as_version=4)
        nbformat.write(_filled(nbformat.read(notebook, as_version=4), source), notebook)
        model = self_study.check("A1", work, cache)
        assert model.score == model.max_score == blank.max_score
        assert model.written == blank.written >= 1
    finally:
        notebook.write_bytes(saved)


def test_start_in_chinese_refuses_a_missing_translation(started_zh, monkeypatch, tmp_path):
    _, cache, _, _ = started_zh
    locale = tmp_path / "locale"
    shutil.copytree(i18n.LOCALE_DIR, locale)
    monkeypatch.setattr(i18n, "LOCALE_DIR", locale)
    cat = i18n.read(A1, ZH)
    next(m for m in cat if m.id).string = ""
    i18n.write(cat, A1, ZH)
    work = tmp_path / "work"
    with pytest.raises(sp.Untranslated, match=f"{A1}: 1 block"):
        self_study.start("A1", work, cache, lang=ZH)
    assert not list(work.rglob("*.ipynb"))
    assert self_study.main(["start", "A1", "--work", str(work), "--cache", str(cache),
                            "--lang", ZH]) == 2


@pytest.mark.skipif("--lang" not in (ROOT / "Makefile").read_text(),
                    reason="the Makefile does not pass LANG=zh_CN on yet")
def test_the_make_targets_pass_the_language_on(tmp_path):
    import subprocess

    def make_n(*args: str) -> str:
        return subprocess.run(["make", "-n", *args, f"VENV={tmp_path / 'venv'}"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout

    zh = make_n("student-pack", "assignment", "A=A1", "LANG=zh_CN")
    assert "student_pack.py --lang zh_CN" in zh and "self_study.py start A1" in zh
    assert re.search(r"self_study.py start A1 .*--lang zh_CN", zh)
    # the shell's own locale (LANG=en_US.UTF-8, C.UTF-8, zh_CN.UTF-8) chooses nothing
    for shell in ("en_US.UTF-8", "C.UTF-8", "zh_CN.UTF-8"):
        assert "--lang" not in make_n("student-pack", "assignment", "A=A1", f"LANG={shell}")
