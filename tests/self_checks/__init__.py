"""The cases of the Try-it self-check contract: one module per `mha_course.tryit` module, same name.

Each module defines CASES, a list of `Case`. `tests/test_self_checks.py` runs them all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Case:
    """One self-check under the contract.

    right: the arguments of a right answer, built here independently of the package.
    wrong: phrase -> arguments of a typical wrong answer; the check must raise NotYet with a
        message containing the phrase (case-insensitive), a different message for each.
    untried: the arguments as the notebook ships them (placeholders None).
    garbage: arguments of the wrong kind; each must get a "not yet" message, not a raw error.
    right_forms: arguments of the right answer in other forms (a float for an int, a list, a
        tensor, a mask in another convention the lesson allows); each must be told "right".
    secret: text that would give the answer away (its digits, its formula); no "not yet" or
        "not tried" message may contain any of it.
    """

    check: Callable[..., str]
    right: Callable[[], tuple]
    wrong: dict[str, Callable[[], tuple]]
    untried: Callable[[], tuple] = lambda: (None,)
    garbage: list[Callable[[], tuple]] = field(default_factory=lambda: [lambda: ("seven",)])
    right_forms: list[Callable[[], tuple]] = field(default_factory=list)
    secret: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def name(self) -> str:
        return f"{self.check.__module__.rsplit('.', 1)[-1]}.{self.check.__name__}"


def call(case: Case, args: tuple) -> Any:
    """Run the check on one answer."""
    return case.check(*args)
