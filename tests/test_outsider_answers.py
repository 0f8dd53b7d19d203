"""Blind student answers (tests/outsider/) against the Try-it checks: none raises, no wrong
answer is told "right", and every right answer is told "right" except where the lesson asks for
one form and the message says which.

How well the wrong answers are *named* needs a person to judge (the note of issue 27 gives the
counts); this test holds the line that needs no judgement.
"""

from __future__ import annotations

import contextlib
import importlib
import io

import pytest

from mha_course.tryit import Verdict

# Right answers the check refuses, each with the form its message asks for instead.
FORM_NAMED = {
    ("c", "05-02"): "a (1, 1, T, T) mask where the lesson asks for (T, T): the shape is named",
    ("c", "09-22"): "pad as an additive 0/-inf mask: pt_mha takes booleans, `pad == 0` is said",
}
# Wrong answers told "right" only in this harness, with why.
HARNESS_ONLY = {
    ("b", "10-07"): "made in a branch of the harness's function; a notebook cell that computes "
                    "the answer from `read` is refused (test_tryit_layer's IPython test)",
}


def _lessons(name: str) -> list[tuple[str, int]]:
    answers = importlib.import_module(f"tests.outsider.answers_{name}")
    return [(name, lesson) for lesson in sorted({a["lesson"] for a in answers.ANSWERS})]


@pytest.mark.parametrize("name, lesson", _lessons("b") + _lessons("c"),
                         ids=lambda v: str(v))
def test_blind_answers(name, lesson):
    answers = importlib.import_module(f"tests.outsider.answers_{name}")
    tryit = importlib.import_module("mha_course.tryit." + answers.MODULES[lesson])
    if name == "b":
        answers.setup(lesson, tryit, "new")
    else:
        answers.ctx(lesson)
    problems = []
    for a in answers.ANSWERS:
        if a["lesson"] != lesson or a["run_new"] is None:
            continue
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                said = a["run_new"](tryit)
            except Exception as err:  # noqa: BLE001 - any raise is a failure of the contract
                problems.append(f"{a['id']} ({a['mistake']}) raised {type(err).__name__}: {err}")
                continue
        if not isinstance(said, Verdict):
            problems.append(f"{a['id']} returned {type(said).__name__}, not a Verdict")
            continue
        key = (name, a["id"])
        if a["kind"] == "right" and not said.ok and key not in FORM_NAMED:
            problems.append(f"{a['id']} right ({a['mistake']}) told: {said}")
        if a["kind"] == "wrong" and said.ok and key not in HARNESS_ONLY:
            problems.append(f"{a['id']} wrong ({a['mistake']}) told: {said}")
    assert not problems, "\n".join(problems)
