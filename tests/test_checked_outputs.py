"""Checked notebook outputs print only what every machine prints the same.

nbval compares a `# NBVAL_CHECK_OUTPUT` cell's fresh output with the saved one, character for
character. Digits of a rounding error (6.4e-16 here, 4.7e-16 on a CPU with other BLAS kernels),
timings, addresses, thread counts and hardware names change from machine to machine, so such a
cell passes where it was saved and fails elsewhere. This test scans the saved output of every
checked cell for those forms, by shape rather than from a list of known offenders: the cure is
to print a bound ("below 1e-12") and assert the value, or to move the digits to an unchecked cell.

A cell whose digits are deterministic although they look measured (a time computed from a
data-sheet model, exp(-20) from the C library) says so in its own source, one comment line per
kind, with the reason:

    # NBVAL_CHECK_OUTPUT
    # checked output keeps timing: modelled from the data sheet, not measured

The kinds are the keys of PATTERNS. The exemption travels with the cell, so a reader sees why
those digits are safe, and a new cell never inherits it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest
from nbval.plugin import find_comment_markers

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))

_NUM_START = r"(?<![\w.])"  # a number starts here, not inside a word or another number

# kind -> patterns for text that depends on the machine. Each pattern is a form, not a value.
PATTERNS: dict[str, list[str]] = {
    # Rounding errors: a mantissa with decimals and a negative exponent (6.4e-16, 2.06e-09,
    # tensor(4.4409e-16)); a bound is written without decimals (1e-12) and passes. Fixed-point
    # forms of the same: 0.000123, 0.000001; float repr noise (0.30000000000000004, 0.79999999);
    # and a float printed to 9 or more decimals, whose last digits follow the summation order.
    "rounding": [
        _NUM_START + r"[-+]?\d+\.\d+[eE]-\d+",
        _NUM_START + r"[-+]?0\.(?:0{3,}[1-9]\d|0{5,}[1-9])",
        r"\d\.\d*(?:0{6,}|9{6,})\d*[1-9]",
        _NUM_START + r"[-+]?\d+\.\d{9,}",
    ],
    # Timings and rates: 0.06 ms, 12 us, 3.1 µs, 2 s, 1.5 seconds, 35 it/s, 120 tokens/s,
    # 2.3x faster, %timeit's "± ... per loop".
    "timing": [
        _NUM_START + r"\d+(?:\.\d+)?\s?(?:s|secs?|seconds?|ms|us|µs|μs|ns|min|minutes?)(?![\w/])",
        _NUM_START + r"\d+(?:\.\d+)?\s?[A-Za-z]*/s\b",
        r"\d(?:\.\d+)?\s?x\s+(?:faster|slower|speed-?up)",
        r"\bper loop\b|\bspeed-?up\b|\belapsed\b|\bwall[- ]?time\b",
    ],
    # Memory addresses: <object at 0x7f3a5c0d2e10>, id()s printed in hex.
    "address": [r"\b0x[0-9a-fA-F]{6,}\b"],
    # Threads and cores: "2 threads", "num_threads = 8", "16 cores", cpu_count.
    "threads": [
        r"\b\d+\s+(?:CPU\s+|OpenMP\s+|BLAS\s+)?(?:threads?|cores?)\b",
        r"\b(?:num_)?threads?\s*[:=]\s*\d",
        r"get_num_threads|cpu_count|threadpool",
    ],
    # Hardware, kernel sets and builds: what a cell says about the machine it ran on,
    # including whether CUDA is there.
    "device": [
        r"\bcuda:\d\b|device\(type='cuda'|device='cuda'",
        r"\b(?:NVIDIA|GeForce|Tesla|Quadro|Radeon|Xeon|EPYC|Ryzen|Apple M\d)\b",
        r"\b[AHV]100\b|\bH200\b",
        r"\bAVX(?:2|512\w*|-512)?\b|\bavx(?:2|512\w*)\b|\bSSE\d",
        r"OpenBLAS|\bMKL\b|Haswell|Sandybridge|SkylakeX|cpu_capability",
        r"\d\+(?:cu\d{2,3}|cpu|rocm[\d.]*)\b",
        r"\b(?:no|this|a|your|one)\s+(?:GPU|CUDA)\b|\bGPU\s*[:=]|\bCUDA\s*[:=]",
        r"(?:CUDA|GPU)\s+(?:is\s+)?(?:not\s+)?(?:available|present|found|detected)",
        r"is_available\(\)\s*[:=]|device_count\(\)\s*[:=]",
    ],
}

_COMPILED = {kind: [re.compile(p) for p in pats] for kind, pats in PATTERNS.items()}
_EXEMPT = re.compile(r"^\s*#\s*checked output keeps (\w+)\s*:\s*(\S.*)$", re.MULTILINE)


def machine_dependent(text: str, allowed: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """Every (kind, matched text) in `text` that may print differently on another machine."""
    found = []
    for kind, patterns in _COMPILED.items():
        if kind in allowed:
            continue
        for pattern in patterns:
            found += [(kind, m.group(0)) for m in pattern.finditer(text)]
    return found


def is_checked(cell) -> bool:
    """True when nbval compares this cell's output: the marker comment (read by nbval's own
    parser) or the nbval-check-output tag."""
    if cell.cell_type != "code":
        return False
    markers = dict(find_comment_markers(cell.source))
    return bool(markers.get("check")) or "nbval-check-output" in cell.metadata.get("tags", [])


def exemptions(source: str) -> frozenset[str]:
    """The kinds a cell declares deterministic, each with a reason (`# checked output keeps K: why`)."""
    kinds = set()
    for kind, _reason in _EXEMPT.findall(source):
        if kind not in PATTERNS:
            raise ValueError(
                f"unknown kind {kind!r} in an exemption; expected one of {list(PATTERNS)}"
            )
        kinds.add(kind)
    return frozenset(kinds)


def output_text(cell) -> str:
    """The text nbval compares: streams, text-like display data and errors (images are not)."""
    parts = []
    for out in cell.get("outputs", []):
        if out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type in ("execute_result", "display_data"):
            parts += [
                v for k, v in out.data.items() if k.startswith("text/") and isinstance(v, str)
            ]
        elif out.output_type == "error":
            parts.append(f"{out.ename}: {out.evalue}")
    return "\n".join(parts)


def offending_cells(path: Path) -> list[str]:
    """One line per machine-dependent text found in a checked cell of the notebook at `path`."""
    nb = nbformat.read(path, as_version=4)
    problems = []
    for index, cell in enumerate(nb.cells):
        if not is_checked(cell):
            continue
        allowed = exemptions(cell.source)
        for line in output_text(cell).splitlines():
            for kind, match in machine_dependent(line, allowed):
                problems.append(f"{path.name} cell {index}: {kind} {match!r} in {line.strip()!r}")
    return problems


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_checked_cells_print_nothing_machine_dependent(path: Path) -> None:
    problems = offending_cells(path)
    assert not problems, (
        "a # NBVAL_CHECK_OUTPUT cell prints what another CPU, BLAS, thread count or a GPU prints "
        "differently, so nbval fails there:\n  " + "\n  ".join(problems) + "\nprint a bound "
        "('below 1e-12') and assert the value, or move the digits to an unchecked cell; digits "
        "that are truly deterministic take a '# checked output keeps <kind>: <reason>' line in "
        "that cell"
    )


# --- the scanner itself -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("max difference to one pass 6.4e-16", "rounding"),
        ("exp(-20) = 2.06e-09", "rounding"),
        ("error 3.0E-04 of the largest output", "rounding"),
        ("tensor(4.4409e-16)", "rounding"),
        ("off by 0.000000123", "rounding"),
        ("gap 0.000001", "rounding"),
        ("sum 0.30000000000000004", "rounding"),
        ("sum 0.7999999999999999", "rounding"),
        ("mean 1.2281591234", "rounding"),
        ("forward 0.06 ms", "timing"),
        ("decode 20.0 us per token", "timing"),
        ("3.1 µs", "timing"),
        ("took 2 s", "timing"),
        ("1.5 seconds", "timing"),
        ("35.2 it/s", "timing"),
        ("120 tokens/s", "timing"),
        ("2.3x faster", "timing"),
        ("1.2 ms ± 3 µs per loop", "timing"),
        ("<Foo object at 0x7f3a5c0d2e10>", "address"),
        ("running on 2 threads", "threads"),
        ("num_threads = 8", "threads"),
        ("16 cores", "threads"),
        ("device(type='cuda', index=0)", "device"),
        ("tensor on cuda:0", "device"),
        ("NVIDIA H200", "device"),
        ("Intel(R) Xeon(R)", "device"),
        ("CPU capability: AVX512", "device"),
        ("torch 2.13.0+cpu", "device"),
        ("no GPU here, skipping", "device"),
        ("CUDA is not available", "device"),
        ("torch.cuda.is_available(): False", "device"),
    ],
)
def test_scanner_catches(text: str, kind: str) -> None:
    kinds = {k for k, _ in machine_dependent(text)}
    assert kind in kinds, f"{text!r}: expected a {kind} finding, got {sorted(kinds)}"


@pytest.mark.parametrize(
    "text",
    [
        "max |torch - numpy| below 1e-12",
        "within 1e-12 of one pass: True",
        "float32: largest finite 3.403e+38, ln of it 88.72",
        "weights [0.7311 0.     0.2689 0.    ]",
        "weights [0.0323 0.0004 0.0095]",
        "out (2, 4, 13, 8): equals steps 3-6 within 1e-12",
        "masked_mean over the 12 real tokens: T = 6: 1.228159",
        "ring    W=4 zigzag: 4 processes, sent 28,768 bytes per rank",
        "300 tokens through a ring of 6 slots: 1536 bytes",
        "torch.backends.cuda.matmul.allow_tf32: False",
        "8 heads, slopes: [0.5 0.25 0.125 0.0625 0.0312]",
        "rows sum to one: all 96 rows within 1e-12 of 1",
        "<Figure size 400x360 with 1 Axes>",
        "B = 32, h = 32, 8 K/V heads",
    ],
)
def test_scanner_passes(text: str) -> None:
    assert machine_dependent(text) == [], f"{text!r} is machine-independent"


def test_exemption_is_per_kind_and_needs_a_reason() -> None:
    src = "# NBVAL_CHECK_OUTPUT\n# checked output keeps timing: modelled from the data sheet\n"
    assert exemptions(src) == {"timing"}
    assert machine_dependent("0.06 ms, 6.4e-16", exemptions(src)) == [("rounding", "6.4e-16")]
    assert exemptions("# checked output keeps timing:\n") == frozenset()  # no reason, no pass
    with pytest.raises(ValueError, match="unknown kind"):
        exemptions("# checked output keeps speed: fast\n")


def test_checked_marker_is_read_as_nbval_reads_it() -> None:
    marked = nbformat.v4.new_code_cell("# NBVAL_CHECK_OUTPUT\nprint(1)")
    tagged = nbformat.v4.new_code_cell("print(1)", metadata={"tags": ["nbval-check-output"]})
    quoted = nbformat.v4.new_code_cell("s = '# NBVAL_CHECK_OUTPUT'\nprint(s)")
    plain = nbformat.v4.new_code_cell("print(1)")
    assert [is_checked(c) for c in (marked, tagged, quoted, plain)] == [True, True, False, False]


# --- show_source: only a cell's last expression is displayed ----------------------------------


def hidden_show_source(source: str) -> list[int]:
    """Line numbers of bare `show_source(...)` expressions that are not the cell's last statement:
    IPython displays only the last expression, so these show nothing."""
    code = "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in source.splitlines())
    try:
        body = ast.parse(code).body
    except SyntaxError:
        return []
    hidden = []
    for stmt in body[:-1]:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            func = stmt.value.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name == "show_source":
                hidden.append(stmt.lineno)
    return hidden


def test_hidden_show_source_finder() -> None:
    assert hidden_show_source("show_source(a)\nshow_source(b)") == [1]
    assert hidden_show_source("show_source(a)\nx = 1") == [1]
    assert hidden_show_source("display(show_source(a))\nshow_source(b)") == []
    assert hidden_show_source("%matplotlib inline\nmha_course.source.show_source(a)") == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_show_source_is_displayed(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    hidden = [
        f"{path.name} cell {i}, line {line}"
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code"
        for line in hidden_show_source(cell.source)
    ]
    assert not hidden, (
        "show_source(...) that is not a cell's last statement is never displayed (IPython shows "
        "only the last expression):\n  "
        + "\n  ".join(hidden)
        + "\nwrap it in display(...) or give it a cell of its own"
    )
