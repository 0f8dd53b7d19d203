"""Backends of the attention core: what each kernel can do, and a registry that says who can serve a call.

One attention entry point per framework (`numpy_attention.attention`,
`torch_attention.attention`) runs steps 3-6 on a named backend, the way Hugging Face's
`ALL_ATTENTION_FUNCTIONS` maps `config._attn_implementation` to a function. Each backend
declares what it supports; a call that needs something it lacks is refused before any work,
with the reason and the backends that could serve it:

    Backend(name, framework, run, supports...)   one kernel and its declared features
    Call(...)                                    what one call needs (built by the entry point)
    Registry.register(backend) / get(name)       the framework's backends, by name
    Registry.check(name, call)                   the backend, or ValueError naming what it lacks
    Registry.serving(call)                       the names of every backend that can serve it
    Registry.rows()                              the backend-by-feature table (README, lessons)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

FEATURES = ("gqa", "bias", "mask", "window", "documents", "dropout", "backward", "weights")
"""The features a call may need, in the order the table shows them."""

FEATURE_WORDS = {
    "gqa": "grouped-query heads (h_kv < h)",
    "bias": "an additive bias (ALiBi)",
    "mask": "an arbitrary boolean mask",
    "window": "a sliding window",
    "documents": "packed documents",
    "dropout": "dropout on the weights",
    "backward": "gradients",
    "weights": "the attention weights returned",
}


@dataclass(frozen=True)
class Call:
    """What one attention call needs from a backend; the entry point fills it from its inputs."""

    device: str = "cpu"  # "cpu" or "cuda"
    dtype: str = "float32"  # the inputs' dtype, by name: "float16", "bfloat16", "float32", "float64"
    needs: frozenset[str] = frozenset()  # a subset of FEATURES
    d_k: int | None = None  # the head width, for backends that take only some widths


@dataclass(frozen=True)
class Backend:
    """One kernel of the attention core and what it declares it supports."""

    name: str
    framework: str  # "numpy" or "torch"
    run: Callable = field(repr=False, compare=False)
    supports: frozenset[str] = frozenset()  # a subset of FEATURES
    devices: tuple[str, ...] = ("cpu",)
    dtypes: tuple[str, ...] = ("float16", "float32", "float64")
    available: Callable[[], bool] = field(default=lambda: True, repr=False, compare=False)
    note: str = ""  # one line for the table: what the kernel is
    head_dims: tuple[Callable[[int], bool], str] | None = field(default=None, compare=False)
    """(takes this d_k?, the widths it takes in words), for kernels compiled for some widths only."""

    def missing(self, call: Call) -> list[str]:
        """What this backend lacks for `call`, in words (empty when it can serve it)."""
        lacks = [FEATURE_WORDS[f] for f in FEATURES if f in call.needs and f not in self.supports]
        if call.device not in self.devices:
            lacks.append(f"device {call.device!r} (it runs on {', '.join(self.devices)})")
        if call.dtype not in self.dtypes:
            lacks.append(f"dtype {call.dtype} (it takes {', '.join(self.dtypes)})")
        if self.head_dims is not None and call.d_k is not None and not self.head_dims[0](call.d_k):
            lacks.append(f"head width d_k={call.d_k} (it takes {self.head_dims[1]})")
        if not self.available():
            lacks.append("its package, which is not installed here")
        return lacks


class Registry:
    """A framework's attention backends by name, in the order they were registered."""

    def __init__(self, framework: str):
        self.framework = framework
        self._backends: dict[str, Backend] = {}

    def register(self, backend: Backend) -> Backend:
        """Add `backend` (its framework must be this registry's); return it."""
        if backend.framework != self.framework:
            raise ValueError(f"a {backend.framework} backend cannot join the {self.framework} "
                             f"registry")
        unknown = sorted(set(backend.supports) - set(FEATURES))
        if unknown:
            raise ValueError(f"backend {backend.name!r} declares unknown features {unknown}; "
                             f"known: {FEATURES}")
        self._backends[backend.name] = backend
        return backend

    def names(self) -> tuple[str, ...]:
        """Every backend's name, in registration order."""
        return tuple(self._backends)

    def get(self, name: str) -> Backend:
        """The backend called `name`, or ValueError listing the names there are."""
        if not isinstance(name, str) or name not in self._backends:
            raise ValueError(f"backend must be one of {self.names()} for {self.framework}, "
                             f"got {name!r}")
        return self._backends[name]

    def serving(self, call: Call) -> tuple[str, ...]:
        """The names of the backends that can serve `call`."""
        return tuple(n for n, b in self._backends.items() if not b.missing(call))

    def check(self, name: str, call: Call) -> Backend:
        """The backend `name` if it can serve `call`; else ValueError with what it lacks and who can."""
        backend = self.get(name)
        lacks = backend.missing(call)
        if lacks:
            others = self.serving(call)
            instead = (f"backends that can: {', '.join(others)}" if others
                       else "no backend here can")
            raise ValueError(f"the {self.framework} backend {name!r} cannot serve this call: it "
                             f"lacks {'; '.join(lacks)} ({instead})")
        return backend

    def rows(self) -> list[dict[str, str]]:
        """The backend-by-feature table: one dict per backend, "yes" / "-" per feature."""
        out = []
        for b in self._backends.values():
            row = {"backend": f"{self.framework} {b.name}"}
            row.update({f: "yes" if f in b.supports else "-" for f in FEATURES})
            row["devices"] = ", ".join(b.devices)
            row["what"] = b.note
            out.append(row)
        return out


def markdown_table(*registries: Registry) -> str:
    """The backend-by-feature table of one or more registries, as a Markdown table."""
    rows = [r for reg in registries for r in reg.rows()]
    cols = ["backend", *FEATURES, "devices", "what"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(r[c] for c in cols) + " |" for r in rows]
    return "\n".join(lines)
