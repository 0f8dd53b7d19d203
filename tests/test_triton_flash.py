"""The Triton kernel (mha.attention.triton_flash) against mha.attention.flash, a float64 reference and SDPA; on CPU in Triton's interpreter.

Where the kernel runs is decided per call from the tensors' device; the CUDA-dependent decisions
are exercised here with CUDA mocked, and the compiled kernel's float32 dots are checked in the
Triton IR the compiler front end builds on the CPU (no GPU needed for that stage).
"""

import contextlib
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from mha.attention import flash, triton_flash
from mha.attention.torch_attention import manual_attention
from mha.perf import bench

pytestmark = pytest.mark.skipif(not triton_flash.available(),
                                reason="triton is a test requirement (requirements-dev.txt)")


def _qkv(T, S, d=16, dtype=torch.float32, seed=0, B=2, h=2):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, h, T, d, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, h, S, d, generator=g, dtype=torch.float64) for _ in range(2))
    return [t.to(dtype) for t in (q, k, v)]


def _reference(q, k, v, causal, offset):
    """Attention in float64 from its definition, the whole (T, S) at once: (out, lse); no key -> 0, -inf."""
    q, k, v = (t.double() for t in (q, k, v))
    T, S = q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5  # (B, h, T, d) @ (B, h, d, S) -> (B, h, T, S)
    if causal:
        allowed = torch.arange(S)[None, :] <= torch.arange(T)[:, None] + offset  # (T, S)
        scores = scores.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # (B, h, T); -inf where no key is allowed
    weights = torch.exp(scores - torch.where(torch.isfinite(lse), lse, 0.0)[..., None])  # (B, h, T, S)
    return weights @ v, lse  # (B, h, T, S) @ (B, h, S, d) -> (B, h, T, d)


def _max_abs(x):
    return float(x.abs().max()) if x.numel() else 0.0


def _assert_matches(out, lse, want, want_lse, what):
    err = _max_abs(out.double() - want)
    assert err < 1e-12, f"{what}: kernel output differs from the float64 reference by {err:.3g}"
    finite = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse), finite), f"{what}: lse -inf exactly where no key is allowed"
    err_lse = _max_abs((lse.double() - want_lse)[finite])
    assert err_lse < 1e-5, f"{what}: float32 lse differs by {err_lse:.3g}"  # lse is kept in float32


def _tile_at_the_edge(T, S, offset, block_q, block_k):
    """True when some key tile's first key is exactly a query block's last visible key."""
    for t1 in range(block_q, T + block_q, block_q):
        last_row = min(t1, T) - 1
        last_key = last_row + offset  # the last key this query block sees
        if 0 < last_key < S and last_key % block_k == 0:
            return True
    return False


CASES = [(64, 64, False, 0), (64, 64, True, 0), (50, 70, True, 20), (70, 50, False, 0),
         (33, 33, True, 0), (40, 40, True, -8)]  # ragged, bottom-right, rows with no key


@pytest.mark.parametrize("T,S,causal,offset", CASES)
def test_float64_equals_the_numpy_tiles(T, S, causal, offset):
    q, k, v = _qkv(T, S, dtype=torch.float64, seed=T + S)
    out, lse = triton_flash.flash_forward(q, k, v, causal, offset, block_q=16, block_k=32)
    want, want_lse = flash.flash_attention(q.numpy(), k.numpy(), v.numpy(), causal, offset=offset)
    assert float(np.abs(out.numpy() - want).max()) < 1e-12
    finite = np.isfinite(want_lse)
    assert np.array_equal(np.isfinite(lse.numpy()), finite), "lse -inf exactly where no key is allowed"
    assert float(np.abs(lse.double().numpy()[finite] - want_lse[finite]).max()) < 1e-5  # float32 lse
    if not finite.all():
        assert float(np.abs(out.numpy()[~finite]).max(initial=0.0)) == 0.0, "no key: output 0"


EDGES = [  # (T, S, offset, block_q, block_k): a key tile starts at a query block's last visible key
    (48, 65, 17, 16, 32),  # query block 0's last row (15) sees keys up to 32: the tile 32..63 is needed
    (16, 33, 17, 16, 16),  # one query block; its last row sees key 32, the first of the last tile
    (64, 48, -15, 32, 16),  # negative offset (rows 0-14 see no key) and the edge at key 16
    (20, 40, 13, 16, 16),  # a ragged query block: its last row (19) sees keys up to 32
    (33, 33, 0, 16, 16),  # plain causal, T = S: only a ragged last block (row 32) puts the edge at 32
]


@pytest.mark.parametrize("T,S,offset,block_q,block_k", EDGES)
def test_a_key_tile_that_starts_at_the_last_visible_key_is_read(T, S, offset, block_q, block_k):
    assert _tile_at_the_edge(T, S, offset, block_q, block_k), "the case must reach the edge it is for"
    q, k, v = _qkv(T, S, dtype=torch.float64, seed=T * S + offset, B=1, h=2)
    out, lse = triton_flash.flash_forward(q, k, v, True, offset, block_q=block_q, block_k=block_k)
    _assert_matches(out, lse, *_reference(q, k, v, True, offset),
                    f"T={T}, S={S}, offset={offset}, blocks {block_q} x {block_k}")


@st.composite
def _causal_case(draw):
    """T, S, blocks and an offset, half of the time one that puts a tile edge on a last visible key."""
    block_q, block_k = draw(st.sampled_from([16, 32])), draw(st.sampled_from([16, 32]))
    T, S = draw(st.integers(1, 72)), draw(st.integers(1, 80))
    if draw(st.booleans()):  # aim: query block i's last row sees exactly the first key of tile j
        i = draw(st.integers(0, (T - 1) // block_q))
        j = draw(st.integers(0, (S - 1) // block_k))
        offset = j * block_k - (min((i + 1) * block_q, T) - 1) + draw(st.sampled_from([-1, 0, 0, 1]))
    else:
        offset = draw(st.integers(-T - 2, S + 2))
    return T, S, offset, block_q, block_k


@settings(max_examples=30, deadline=None)
@given(_causal_case(), st.booleans())
def test_drawn_shapes_offsets_and_blocks_match_the_float64_reference(case, causal):
    T, S, offset, block_q, block_k = case
    q, k, v = _qkv(T, S, dtype=torch.float64, seed=T + 7 * S, B=1, h=1)
    out, lse = triton_flash.flash_forward(q, k, v, causal, offset, block_q=block_q, block_k=block_k)
    _assert_matches(out, lse, *_reference(q, k, v, causal, offset),
                    f"T={T}, S={S}, causal={causal}, offset={offset}, blocks {block_q} x {block_k}")


@pytest.mark.parametrize("h_kv", [1, 2])
def test_grouped_query_heads_read_their_shared_head_in_place(h_kv):
    """h_kv < h: query head j reads key/value head j // (h / h_kv), as repeat_kv lays them out."""
    q, k, v = _qkv(20, 24, h=4, seed=3, dtype=torch.float64)
    k, v = k[:, :h_kv], v[:, :h_kv]  # (B, h_kv, S, d)
    g = 4 // h_kv
    out, lse = triton_flash.flash_forward(q, k, v, causal=True, offset=4, block_q=16, block_k=16)
    want, want_lse = _reference(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), True, 4)
    _assert_matches(out, lse, want, want_lse, f"h_kv={h_kv}")
    wrong, _ = _reference(q, k.repeat(1, g, 1, 1), v.repeat(1, g, 1, 1), True, 4)  # heads tiled
    assert h_kv == 1 or _max_abs(out.double() - wrong) > 1e-3, "the check can tell the head order"


def test_float32_within_the_tolerance_of_float32_sdpa():
    q, k, v = _qkv(96, 96, d=32, seed=3)
    golden = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    _, allowed = bench.derived_tolerance(golden, F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                         torch.float32)
    out, _ = triton_flash.flash_forward(q, k, v, causal=True, block_q=32, block_k=16)
    assert out.dtype == torch.float32
    assert float((out.double() - golden).abs().max()) <= allowed


def test_bfloat16_within_the_tolerance_of_the_manual_path():
    q, k, v = _qkv(48, 48, d=32, dtype=torch.bfloat16, seed=4)
    golden = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    mask = torch.ones(48, 48, dtype=torch.bool).tril()
    _, allowed = bench.derived_tolerance(golden, manual_attention(q, k, v, mask)[0], torch.bfloat16)
    out, _ = triton_flash.flash_forward(q, k, v, causal=True, block_q=16, block_k=16)
    assert out.dtype == torch.bfloat16
    err = float((out.double() - golden).abs().max())
    assert err <= allowed, f"bfloat16 kernel error {err:.3g} > allowed {allowed:.3g}"


def test_views_and_empty_sizes():
    q, k, v = _qkv(24, 40, dtype=torch.float64, seed=9)
    qt, kt, vt = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))  # same values, other strides
    assert not qt.is_contiguous()
    out, lse = triton_flash.flash_forward(qt, kt, vt, True, 16, block_q=16, block_k=16)
    _assert_matches(out, lse, *_reference(q, k, v, True, 16), "non-contiguous views")
    for B, h, T, S in ((0, 2, 8, 8), (1, 0, 8, 8), (1, 2, 0, 8), (1, 2, 8, 0)):  # no batch, head, query or key
        q, k, v = _qkv(T, S, dtype=torch.float32, B=B, h=h)
        out, lse = triton_flash.flash_forward(q, k, v, causal=bool(S), block_q=16, block_k=16)
        assert out.shape == (B, h, T, 16) and lse.shape == (B, h, T) and lse.dtype == torch.float32
        assert torch.all(out == 0) and torch.all(lse == float("-inf")), "no key: output 0, lse -inf"


# --- where the kernel runs: decided per call from the tensors' device --------------------------


@pytest.fixture
def cuda_present(monkeypatch):
    """A machine that says it has a CUDA GPU (the tensors below stay on the CPU)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_cpu_tensors_take_the_interpreter_when_cuda_is_present(cuda_present, dtype):
    q, k, v = _qkv(40, 56, dtype=dtype, seed=11)
    out, lse = triton_flash.flash_forward(q, k, v, True, 16, block_q=16, block_k=16)
    want, want_lse = _reference(q, k, v, True, 16)
    err = float((out.double() - want).abs().max())
    # bfloat16: rounding the output alone costs up to 2**-9 of |out| <= max |v|
    allowed = 1e-12 if dtype == torch.float64 else 4 * 2**-9 * float(v.double().abs().max())
    assert err <= allowed, (f"{dtype} CPU tensors with CUDA present: error {err:.3g} > {allowed:.3g} "
                            f"(the interpreter's bf16 dot needs UPCAST on CPU tensors)")
    assert triton_flash.interpreted(q, k, v)


def _gpu_like_report() -> dict:
    """Run in a fresh process set up as on a GPU machine (see the fixture): what the tests below check.

    Each item is its value, or the error that stopped it (as text), so one failure hides no other.
    """
    def attempt(fn):
        try:
            return fn()
        except Exception as exc:  # reported, and asserted on by the tests
            return f"{type(exc).__name__}: {exc}"[-1500:]

    def error(dtype):
        q, k, v = _qkv(20, 40, dtype=dtype, seed=1, B=1)
        out, _ = triton_flash.flash_forward(q, k, v, True, 20, block_q=16, block_k=16)
        return _max_abs(out.double() - _reference(q, k, v, True, 20)[0])

    constexprs = {"CAUSAL": True, "BLOCK_Q": 64, "BLOCK_K": 64, "D": 64, "UPCAST": False}
    return {
        "compiled_language": attempt(lambda: triton_flash._require_compiled_language() is None),
        "error torch.float64": attempt(lambda: error(torch.float64)),
        "error torch.bfloat16": attempt(lambda: error(torch.bfloat16)),
        "max |v| bfloat16": float(_qkv(20, 40, dtype=torch.bfloat16, seed=1, B=1)[2].double().abs().max()),
        "detector": attempt(lambda: _ttir_dots(_plain_dot_kernel(), "fp32", {"N": 16})),
        **{f"kernel {dtype}": attempt(lambda dtype=dtype: _ttir_dots(triton_flash._kernel(False), dtype, constexprs))
           for dtype in ("fp32", "bf16")},
    }


@pytest.fixture(scope="module")
def gpu_like():
    """A fresh Python as on a CUDA machine: CUDA reported present, TRITON_INTERPRET unset, and triton
    imported for compiling before mha uses it (as torch.compile may). Its report, once per module."""
    script = (
        "import json, sys, torch\n"
        "torch.cuda.is_available = lambda: True\n"
        "import triton.language\n"
        f"sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})\n"
        "import test_triton_flash\n"
        "print('REPORT', json.dumps(test_triton_flash._gpu_like_report()))\n")
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                         timeout=300)
    assert run.returncode == 0, f"the GPU-like process failed:\n{run.stderr[-3000:]}"
    return json.loads(run.stdout.split("REPORT", 1)[1])


@pytest.mark.parametrize("dtype", ["torch.float64", "torch.bfloat16"])
def test_a_fresh_process_on_a_cuda_machine_runs_cpu_tensors_in_the_interpreter(gpu_like, dtype):
    err = gpu_like[f"error {dtype}"]
    assert isinstance(err, float), f"the CPU call failed with CUDA present: {err}"
    # bfloat16 output: one rounding of |out| <= max |v| costs up to 2**-9 of it; allow 4 of them
    allowed = 1e-12 if dtype == "torch.float64" else 4 * 2**-9 * gpu_like["max |v| bfloat16"]
    assert err <= allowed, f"{dtype}: error {err:.3g} > {allowed:.3g}"
    assert gpu_like["compiled_language"] is True, f"triton imported for compiling: {gpu_like['compiled_language']}"


class _FakeLaunch:
    """Stands in for the kernel: records the grid, the arguments and Triton's mode at launch."""

    def __init__(self, interpret):
        self.defined_for, self.calls = interpret, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            import triton

            self.calls.append((grid, args, kwargs, triton.knobs.runtime.interpret,
                               os.environ.get("TRITON_INTERPRET")))
        return launch


@pytest.mark.parametrize("on_cuda", [False, True])
def test_the_launch_follows_the_device(monkeypatch, on_cuda):
    """The CUDA branch with the device mocked: compiled kernel, interpreter off, no UPCAST."""
    fakes = {}

    monkeypatch.setattr(triton_flash, "_kernel", lambda interpret: fakes.setdefault(interpret, _FakeLaunch(interpret)))
    checked, entered = [], []
    monkeypatch.setattr(triton_flash, "_require_compiled_language", lambda: checked.append(True))
    monkeypatch.setattr(torch.cuda, "device", lambda device: entered.append(device) or contextlib.nullcontext())
    monkeypatch.setattr(triton_flash, "interpreted", lambda q, k, v: not on_cuda)
    before = os.environ.get("TRITON_INTERPRET")
    q, k, v = _qkv(50, 70, dtype=torch.bfloat16)
    triton_flash.flash_forward(q, k, v, True, 1000, block_q=32, block_k=16)
    (fake,) = fakes.values()
    assert fake.defined_for is (not on_cuda), "the kernel is defined for the mode of this call"
    ((grid, args, kwargs, interpret_at_launch, env_at_launch),) = fake.calls
    assert grid == (2, 4), "one program per (query block, batch x head): ceil(50 / 32) x 2 * 2"
    assert interpret_at_launch is (not on_cuda) and env_at_launch in ((None, "0") if on_cuda else ("1",))
    assert kwargs["UPCAST"] is (not on_cuda), "UPCAST only under the interpreter"
    assert checked == ([True] if on_cuda else []), "compiling checks triton.language's mode first"
    assert entered == ([q.device] if on_cuda else []), "a compiled launch runs on the tensors' GPU"
    assert args[7] == 70, "an offset past the last key is clamped to S (same mask, int32-safe)"
    assert os.environ.get("TRITON_INTERPRET") == before, "the environment is left as it was"


def test_compiling_after_triton_was_imported_for_the_interpreter_is_explained(monkeypatch):
    import triton.language as tl

    monkeypatch.setattr(tl.standard, "_elementwise_max", lambda a, b: a)  # not a JITFunction
    with pytest.raises(RuntimeError, match="imported with TRITON_INTERPRET=1"):
        triton_flash._require_compiled_language()


def test_mixed_and_unsupported_devices_are_refused():
    q, k, v = _qkv(16, 16)
    with pytest.raises(TypeError, match="k must be a torch.Tensor, got ndarray"):
        triton_flash.interpreted(q, k.numpy(), v)
    with pytest.raises(ValueError, match="one device, got cpu, meta, cpu"):
        triton_flash.interpreted(q, k.to("meta"), v)
    with pytest.raises(ValueError, match="one device, got cpu, meta, cpu"):
        triton_flash.flash_forward(q, k.to("meta"), v)
    with pytest.raises(ValueError, match="CPU tensors .* or CUDA tensors .*, got device meta"):
        triton_flash.flash_forward(*(t.to("meta") for t in (q, k, v)))


# --- float32 dots in float32 on a GPU: the compiled kernel's IR ---------------------------------


def _ttir_dots(kernel, dtype: str, constexprs: dict) -> list[str] | None:
    """The tt.dot lines of the Triton IR the compiler front end builds for an sm_90 target (on the CPU)."""
    try:
        from triton._C.libtriton import ir
        from triton.backends.compiler import GPUTarget
        from triton.compiler.compiler import ASTSource, make_backend
    except ImportError:  # a triton whose internals moved: nothing to inspect (the tests skip)
        return None
    signature = {n: ("constexpr" if n in constexprs else "i32" if n in ("T", "S", "offset", "H", "GROUP")
                     else "fp32" if n == "scale" else f"*{dtype}") for n in kernel.arg_names}
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    options = backend.parse_options({})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    with triton_flash._triton_mode(False):
        module = ASTSource(kernel, signature, constexprs=constexprs).make_ir(
            target, options, backend.get_codegen_implementation(options), backend.get_module_map(), context)
    return [line for line in str(module).splitlines() if "tt.dot" in line]


def _plain_dot_kernel():
    """A float32 dot with Triton's default input precision, compiled mode."""
    import triton
    import triton.language as tl

    with triton_flash._triton_mode(False):

        @triton.jit
        def plain_dot(A, Out, N: tl.constexpr):
            r = tl.arange(0, N)
            a = tl.load(A + r[:, None] * N + r[None, :])  # (N, N)
            tl.store(Out + r[:, None] * N + r[None, :], tl.dot(a, a))  # (N, N) @ (N, N)

    return plain_dot


def test_the_ir_detector_sees_triton_s_tf32_default(gpu_like):
    """The check below can fail: a float32 dot without input_precision is TF32 in the IR."""
    if gpu_like["detector"] is None:
        pytest.skip("triton's compiler front end is not importable as triton 3.9 has it")
    assert isinstance(gpu_like["detector"], list), gpu_like["detector"]
    (line,) = gpu_like["detector"]
    assert "inputPrecision = tf32" in line


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_compiled_kernel_multiplies_in_ieee_never_tf32(gpu_like, dtype):
    dots = gpu_like[f"kernel {dtype}"]
    if dots is None:
        pytest.skip("triton's compiler front end is not importable as triton 3.9 has it")
    assert isinstance(dots, list), f"the compiled kernel's IR could not be built: {dots}"
    assert len(dots) == 2, f"expected the two dots (q k^T and P V), got {dots}"
    for line in dots:  # IEEE is tt.dot's default attribute, printed only when it is something else
        precision = re.search(r"inputPrecision = (\w+)", line)
        assert precision is None or precision.group(1) == "ieee", f"a non-IEEE dot: {line.strip()}"
    if dtype == "fp32":
        assert all("tensor<64x64xf32> * tensor<64x64xf32>" in line for line in dots), dots


# --- bad inputs: a clear error naming what was expected and what arrived -------------------------


def _bad_inputs():
    q, k, v = _qkv(16, 16)
    ok = {"q": q, "k": k, "v": v}

    def call(**changes):
        return {**ok, **changes}

    f8 = getattr(torch, "float8_e4m3fn", None)
    big = torch.empty(1, 1, 2**27, 16, device="meta")  # 2**31 elements, none allocated (not even by .contiguous())
    return [
        ("integers", call(q=q.to(torch.int32), k=k.to(torch.int32), v=v.to(torch.int32)),
         TypeError, "q must be float16, bfloat16, float32 or float64, got torch.int32"),
        ("bools", call(q=q > 0), TypeError, "got torch.bool"),
        ("float8", call(q=q.to(f8), k=k.to(f8), v=v.to(f8)) if f8 else call(q=q.to(torch.int8)),
         TypeError, "float16, bfloat16, float32 or float64, got torch.float8_e4m3fn" if f8 else "int8"),
        ("complex", call(v=v.to(torch.complex64)), TypeError, "v must be .* got torch.complex64"),
        ("mixed dtypes", call(k=k.double()), TypeError,
         "one dtype, got torch.float32, torch.float64, torch.float32"),
        ("numpy arrays", call(q=q.numpy(), k=k.numpy(), v=v.numpy()), TypeError,
         "q must be a torch.Tensor, got ndarray"),
        ("a list", call(v=v.tolist()), TypeError, "v must be a torch.Tensor, got list"),
        ("fractional offset", call(offset=1.5), TypeError, "offset must be an int, got float 1.5"),
        ("NaN offset", call(offset=float("nan")), TypeError, "offset must be an int, got float nan"),
        ("bool offset", call(offset=True), TypeError, "offset must be an int, got bool"),
        ("string causal", call(causal="no"), TypeError, "causal must be True or False, got str 'no'"),
        ("int causal", call(causal=1), TypeError, "causal must be True or False, got int 1"),
        ("3-D q", call(q=q[0]), ValueError, r"expected q \(B, h, T, d_k\) .*got \(2, 16, 16\)"),
        ("batch mismatch", call(k=k[:1], v=v[:1]), ValueError, r"got \(2, 2, 16, 16\), \(1, 2, 16, 16\)"),
        ("heads mismatch", call(q=q[:, :1]), ValueError, r"got \(2, 1, 16, 16\)"),
        ("key widths", call(k=torch.cat([k, k], -1), v=torch.cat([v, v], -1)), ValueError,
         r"\(2, 2, 16, 32\), \(2, 2, 16, 32\)"),
        ("value width", call(v=torch.cat([v, v], -1)), ValueError, r"\(2, 2, 16, 32\)"),
        ("k and v lengths", call(v=v[:, :, :8]), ValueError, r"\(2, 2, 16, 16\), \(2, 2, 8, 16\)"),
        ("d_k 8", call(q=q[..., :8], k=k[..., :8], v=v[..., :8]), ValueError,
         "d_k must be a power of two >= 16 .*got 8"),
        ("block_q 24", call(block_q=24), ValueError, "block_q must be a power of two >= 16 .*got 24"),
        ("block_k 0", call(block_k=0), ValueError, "block_k must be >= 1, got 0"),
        ("block_k -16", call(block_k=-16), ValueError, "block_k must be >= 1, got -16"),
        ("block_q True", call(block_q=True), TypeError, "block_q must be an int, got bool"),
        ("block_q 16.0", call(block_q=16.0), TypeError, "block_q must be an int, got float"),
        ("too big", call(q=big, k=big, v=big), ValueError, "at most 2\\*\\*31 - 1 elements .*got 2147483648"),
    ]


@pytest.mark.parametrize("name,kwargs,error,words", _bad_inputs(), ids=[c[0] for c in _bad_inputs()])
def test_bad_inputs_get_a_clear_error(name, kwargs, error, words):
    before = os.environ.get("TRITON_INTERPRET")
    with pytest.raises(error, match=words):
        triton_flash.flash_forward(**kwargs)
    assert os.environ.get("TRITON_INTERPRET") == before


def test_bad_shapes_are_refused_and_the_environment_is_left_as_it_was():
    q, k, v = _qkv(16, 16, d=8)
    with pytest.raises(ValueError, match="d_k must be a power of two >= 16 .*got 8"):
        triton_flash.flash_forward(q, k, v)
    q, k, v = _qkv(16, 16)
    with pytest.raises(ValueError, match=r"block_q must be a power of two >= 16 .*, got 24"):
        triton_flash.flash_forward(q, k, v, block_q=24)
    with pytest.raises(ValueError, match=r"expected q \(B, h, T, d_k\)"):
        triton_flash.flash_forward(q, k[:, :1], v)
    before = os.environ.get("TRITON_INTERPRET")
    triton_flash.flash_forward(q, k, v)
    assert os.environ.get("TRITON_INTERPRET") == before


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the compiled Triton kernel")
def test_compiled_on_the_gpu_matches_sdpa_in_bfloat16():
    q, k, v = (t.cuda() for t in _qkv(1024, 1024, d=128, dtype=torch.bfloat16, seed=5, B=1, h=4))
    golden = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    _, allowed = bench.derived_tolerance(golden, sdpa, torch.bfloat16)
    out, _ = triton_flash.flash_forward(q, k, v, causal=True, block_q=128, block_k=64)
    assert float((out.double() - golden).abs().max()) <= allowed


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the compiled Triton kernel")
def test_compiled_float32_is_ieee_exact_and_cpu_tensors_still_run_beside_it():
    """On a GPU: float32 within float32's error (TF32 would be ~1e-3 off), and a CPU call in the same process."""
    q, k, v = _qkv(256, 256, d=64, dtype=torch.float32, seed=6, B=1, h=2)
    want, _ = _reference(q, k, v, True, 0)
    out, _ = triton_flash.flash_forward(*(t.cuda() for t in (q, k, v)), causal=True)
    err = float((out.cpu().double() - want).abs().max())
    assert err < 1e-5, f"float32 on the GPU differs by {err:.3g}: TF32 dots?"
    assert not triton_flash.interpreted(*(t.cuda() for t in (q, k, v)))
    out_cpu, _ = triton_flash.flash_forward(q, k, v, causal=True, block_q=32, block_k=32)
    assert float((out_cpu.double() - want).abs().max()) < 1e-5


def test_the_benchmark_imports_on_a_cpu_and_says_it_did_not_run(tmp_path, monkeypatch):
    """benchmarks/triton_flash.py is for a GPU: here it must import, write 'not run' and exit 0."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks", "triton_flash.py")
    spec = importlib.util.spec_from_file_location("triton_flash_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(module, "OUT", tmp_path / "triton_flash.md")
    assert module.main() == 0
    text = (tmp_path / "triton_flash.md").read_text()
    assert "**Not run: no CUDA device.**" in text and text.count("| not run |") == len(module.SHAPES)
