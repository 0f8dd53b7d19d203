"""Show a function's or class's real source in a notebook, instead of pasting a copy."""

from __future__ import annotations

import inspect
import textwrap


class Source:
    """Source text of an object; renders highlighted in Jupyter and as plain text elsewhere."""

    def __init__(self, obj, *members: str) -> None:
        self.name = getattr(obj, "__qualname__", repr(obj))
        self.module = getattr(inspect.getmodule(obj), "__name__", "?")
        if members:  # a class, cut down to its header, docstring and the named methods
            self.text = _class_outline(obj, members)
        else:
            self.text = textwrap.dedent(inspect.getsource(obj)).rstrip() + "\n"
        self.lines = self.text.count("\n")

    def __repr__(self) -> str:
        return f"# {self.module}.{self.name}\n{self.text}"

    def _repr_html_(self) -> str:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import PythonLexer

        fmt = HtmlFormatter(noclasses=True, nobackground=True)
        code = highlight(self.text, PythonLexer(), fmt)
        return f"<p><code>{self.module}.{self.name}</code></p>{code}"


def _class_outline(cls, members: tuple[str, ...]) -> str:
    """`class X(...):`, its docstring, then the source of each named method, in that order."""
    header = inspect.getsource(cls).split("\n", 1)[0]
    doc = inspect.getdoc(cls) or ""
    parts = [header, textwrap.indent(f'"""{doc}"""', "    ")] if doc else [header]
    for name in members:
        member = inspect.getattr_static(cls, name)
        if name not in vars(cls):
            raise ValueError(f"{cls.__qualname__} defines no {name!r} itself")
        src = textwrap.dedent(inspect.getsource(member)).rstrip()
        parts.append("\n" + textwrap.indent(src, "    "))
    return "\n".join(parts) + "\n"


def show_source(obj, *members: str) -> Source:
    """Return the source of `obj` from the installed package, for display in a notebook.

    With member names (`show_source(MultiHeadAttention, "__init__", "forward")`) a class
    is shown with just those methods: the part of it a student reads.
    """
    return Source(obj, *members)
