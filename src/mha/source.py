"""Show a function's or class's real source in a notebook, instead of pasting a copy."""

from __future__ import annotations

import inspect
import textwrap


class Source:
    """Source text of an object; renders highlighted in Jupyter and as plain text elsewhere."""

    def __init__(self, obj) -> None:
        self.name = getattr(obj, "__qualname__", repr(obj))
        self.module = getattr(inspect.getmodule(obj), "__name__", "?")
        self.text = textwrap.dedent(inspect.getsource(obj)).rstrip() + "\n"

    def __repr__(self) -> str:
        return f"# {self.module}.{self.name}\n{self.text}"

    def _repr_html_(self) -> str:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import PythonLexer

        fmt = HtmlFormatter(noclasses=True, nobackground=True)
        code = highlight(self.text, PythonLexer(), fmt)
        return f"<p><code>{self.module}.{self.name}</code></p>{code}"


def show_source(obj) -> Source:
    """Return the source of `obj` from the installed package, for display in a notebook."""
    return Source(obj)
