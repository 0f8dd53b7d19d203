"""mha.attention.backends: the registry of attention backends, its refusals, and the backend-by-feature table."""

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mha.attention.backends import FEATURE_WORDS, FEATURES, Backend, Call, Registry, markdown_table

ROOT = Path(__file__).resolve().parents[1]
DEVICES = ("cpu", "cuda")
DTYPES = ("float16", "bfloat16", "float32", "float64")


def _run(*args, **kwargs):
    """A backend's kernel, never called by the registry itself."""
    raise AssertionError("the registry must not run a kernel")


def _backend(name, supports=(), devices=("cpu",), dtypes=("float32", "float64"), available=True,
             framework="numpy"):
    return Backend(name, framework, _run, supports=frozenset(supports), devices=tuple(devices),
                   dtypes=tuple(dtypes), available=lambda: available, note=f"the {name} kernel")


def _registry(*backends, framework="numpy"):
    reg = Registry(framework)
    for b in backends:
        reg.register(b)
    return reg


def _lacks(b: Backend, call: Call) -> list[str]:
    """What b lacks for call, worked out here from the declarations (not from Backend.missing)."""
    lacks = [FEATURE_WORDS[f] for f in FEATURES if f in call.needs and f not in b.supports]
    lacks += [f"device {call.device!r}"] if call.device not in b.devices else []
    lacks += [f"dtype {call.dtype}"] if call.dtype not in b.dtypes else []
    lacks += ["not installed"] if not b.available() else []
    return lacks


def test_register_get_and_names_keep_the_registration_order():
    a, b = _backend("reference", FEATURES), _backend("flash", {"gqa"})
    reg = _registry(a, b)
    assert reg.names() == ("reference", "flash")
    assert reg.get("flash") is b and reg.get("reference") is a
    assert reg.register(_backend("split_kv")).name == "split_kv" and reg.names()[-1] == "split_kv"


@pytest.mark.parametrize(("call", "error", "words"), [
    (lambda reg: reg.get("flahs"), ValueError, r"backend must be one of \('reference', 'flash'\) "
                                                r"for numpy, got 'flahs'"),
    (lambda reg: reg.get(None), ValueError, "got None"),
    (lambda reg: reg.register(_backend("sdpa", framework="torch")), ValueError,
     "a torch backend cannot join the numpy registry"),
    (lambda reg: reg.register(_backend("x", {"gqa", "alibi"})), ValueError,
     r"declares unknown features \['alibi'\]"),
])
def test_bad_names_and_declarations_are_refused_and_leave_the_registry_unchanged(call, error, words):
    reg = _registry(_backend("reference", FEATURES), _backend("flash"))
    with pytest.raises(error, match=words):
        call(reg)
    assert reg.names() == ("reference", "flash")


def test_a_call_within_the_declarations_is_served():
    reg = _registry(_backend("reference", FEATURES), _backend("flash", {"gqa", "bias"}))
    call = Call("cpu", "float32", frozenset({"gqa", "bias"}))
    assert reg.serving(call) == ("reference", "flash")
    assert reg.check("flash", call) is reg.get("flash")


def test_the_refusal_names_what_is_lacking_and_who_can_serve():
    reg = _registry(_backend("reference", FEATURES, dtypes=("float64",)),
                    _backend("flash", {"gqa"}, dtypes=("float32", "float64")),
                    _backend("triton", {"gqa", "bias"}, devices=("cuda",), available=False))
    call = Call("cpu", "float64", frozenset({"gqa", "bias", "weights"}))
    with pytest.raises(ValueError) as caught:
        reg.check("flash", call)
    assert str(caught.value) == (
        "the numpy backend 'flash' cannot serve this call: it lacks an additive bias (ALiBi); "
        "the attention weights returned (backends that can: reference)")
    with pytest.raises(ValueError) as caught:
        reg.check("triton", Call("cpu", "float16", frozenset({"window"})))
    assert str(caught.value) == (
        "the numpy backend 'triton' cannot serve this call: it lacks a sliding window; device 'cpu' "
        "(it runs on cuda); dtype float16 (it takes float32, float64); its package, which is not "
        "installed here (no backend here can)")


@st.composite
def registries_and_calls(draw):
    """A registry of 1-4 backends with drawn declarations, and one drawn call."""
    backends = []
    for i in range(draw(st.integers(1, 4))):
        backends.append(_backend(
            f"b{i}", draw(st.sets(st.sampled_from(FEATURES))),
            devices=draw(st.lists(st.sampled_from(DEVICES), min_size=1, max_size=2, unique=True)),
            dtypes=draw(st.lists(st.sampled_from(DTYPES), min_size=1, max_size=4, unique=True)),
            available=draw(st.booleans() | st.just(True))))
    call = Call(draw(st.sampled_from(DEVICES)), draw(st.sampled_from(DTYPES)),
                frozenset(draw(st.sets(st.sampled_from(FEATURES)))))
    return _registry(*backends), call


@settings(max_examples=200, deadline=None)
@given(registries_and_calls())
def test_serving_and_check_agree_with_the_declarations(case):
    reg, call = case
    expected = tuple(b for b in reg.names() if not _lacks(reg.get(b), call))
    assert reg.serving(call) == expected
    for name in reg.names():
        lacks = _lacks(reg.get(name), call)
        if not lacks:
            assert reg.check(name, call) is reg.get(name)
            continue
        with pytest.raises(ValueError) as caught:
            reg.check(name, call)
        text = str(caught.value)
        assert text.startswith(f"the numpy backend {name!r} cannot serve this call: it lacks ")
        for words in lacks:
            assert words in text, f"{name}: the refusal should name {words!r}: {text}"
        for feature in set(FEATURES) - call.needs:  # nothing the call does not need is blamed
            assert FEATURE_WORDS[feature] not in text, text
        tail = f"(backends that can: {', '.join(expected)})" if expected else "(no backend here can)"
        assert text.endswith(tail), text


def _parse(table: str) -> list[dict[str, str]]:
    """A Markdown table back into one dict per row."""
    lines = table.splitlines()
    cols = [c.strip() for c in lines[0].strip("|").split("|")]
    assert re.fullmatch(r"\|(---\|)+", lines[1]) and lines[1].count("---") == len(cols)
    return [dict(zip(cols, (c.strip() for c in line.strip("|").split("|")), strict=True))
            for line in lines[2:]]


def test_the_table_shows_each_backend_and_each_declared_feature():
    numpy_reg = _registry(_backend("reference", {"gqa", "bias", "weights"}),
                          _backend("flash", {"gqa", "window"}))
    torch_reg = _registry(_backend("sdpa", {"dropout", "backward"}, devices=("cpu", "cuda"),
                                   framework="torch"), framework="torch")
    rows = _parse(markdown_table(numpy_reg, torch_reg))
    assert list(rows[0]) == ["backend", *FEATURES, "devices", "what"]
    assert [r["backend"] for r in rows] == ["numpy reference", "numpy flash", "torch sdpa"]
    for row, reg, name in zip(rows, (numpy_reg, numpy_reg, torch_reg), ("reference", "flash", "sdpa"),
                              strict=True):
        b = reg.get(name)
        assert {f for f in FEATURES if row[f] == "yes"} == b.supports
        assert all(row[f] == "-" for f in FEATURES if f not in b.supports)
        assert row["devices"] == ", ".join(b.devices) and row["what"] == b.note
    assert numpy_reg.rows()[0]["backend"] == "numpy reference"


def _readme_table() -> str:
    """The text between the backends markers of README.md."""
    text = (ROOT / "README.md").read_text()
    begin, end = "<!-- backends:begin -->", "<!-- backends:end -->"
    assert text.count(begin) == 1 and text.count(end) == 1, f"README.md must hold {begin} ... {end} once"
    return text.split(begin, 1)[1].split(end, 1)[0].strip()


def test_the_readme_shows_the_backend_table_of_both_registries():
    from mha.attention import numpy_attention, torch_attention

    table = markdown_table(numpy_attention.BACKENDS, torch_attention.BACKENDS)
    assert _readme_table() == table, ("README.md's backend table is out of date; paste "
                                      "markdown_table(numpy_attention.BACKENDS, "
                                      "torch_attention.BACKENDS) between the markers")
