"""mha.perf.bench: the FLOP formula against a brute-force count, the helpers' contracts, and the backends."""

from __future__ import annotations

import contextlib
import time

import numpy as np
import pytest
import torch

from mha import steps
from mha.perf import bench


def count_flops_by_loops(B: int, h: int, T: int, S: int, d_k: int, causal: bool) -> int:
    """Count multiply-adds pair by pair: q.k (d_k) and weights @ v (d_k), 2 FLOPs each."""
    allowed = steps.causal_mask(T, S) if causal else np.ones((T, S), dtype=bool)
    pairs = sum(1 for t in range(T) for s in range(S) if allowed[t, s])
    return B * h * pairs * 2 * (2 * d_k)


@pytest.mark.parametrize(("B", "h", "T", "S", "d_k"), [(1, 1, 4, 4, 8), (2, 8, 16, 16, 64), (3, 2, 5, 9, 4)])
def test_attention_flops_matches_a_brute_force_count(B, h, T, S, d_k):
    assert bench.attention_flops(B, h, T, d_k, S=S) == count_flops_by_loops(B, h, T, S, d_k, False)


@pytest.mark.parametrize("T", [2, 16, 256])
def test_causal_flops_are_half_within_T_over_2_pairs(T):
    half = bench.attention_flops(2, 4, T, 32, causal=True)
    exact = count_flops_by_loops(2, 4, T, T, 32, causal=True)  # T(T+1)/2 pairs
    assert half == bench.attention_flops(2, 4, T, 32) // 2
    assert exact - half == 2 * 4 * (T // 2) * 4 * 32  # the diagonal's half: T/2 pairs per head


def test_tflops_and_matrix_bytes():
    assert bench.tflops(2e12, 0.5) == pytest.approx(4.0)
    assert bench.score_matrix_bytes(2, 8, 1024, 512, torch.float32) == 2 * 8 * 1024 * 512 * 4
    assert bench.score_matrix_bytes(1, 1, 4, 4, torch.bfloat16) == 32


def test_time_fn_calls_warmup_plus_repeats():
    calls = []
    t = bench.time_fn(lambda: calls.append(1), repeats=4, warmup=2)
    assert len(calls) == 6 and t.repeats == 4 and 0 <= t.min_s <= t.median_s
    # min_time_s keeps calling until the calls add up to it: each sleep is >= 10 ms,
    # so 50 ms needs at most 5 calls, and never fewer than `repeats`
    t = bench.time_fn(lambda: time.sleep(0.01), repeats=2, warmup=0, min_time_s=0.05)
    assert 2 <= t.repeats <= 5
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        bench.time_fn(lambda: None, repeats=0)


def test_time_interleaved_runs_each_function_in_rounds():
    order = []
    fns = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    res = bench.time_interleaved(fns, repeats=3, warmup=1)
    assert order == ["a", "b"] + ["a", "b"] * 3  # warm-ups, then alternating rounds
    assert {n: t.repeats for n, t in res.items()} == {"a": 3, "b": 3}


class _FakeClock:
    """A perf_counter that moves only when told: timings become exact, whatever the load."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class _SlowContext:
    """A context that takes `cost` s (on the fake clock) to enter and to leave, and logs it."""

    def __init__(self, clock: _FakeClock, cost: float, log: list):
        self.clock, self.cost, self.log = clock, cost, log

    def __enter__(self):
        self.clock.now += self.cost
        self.log.append("enter")

    def __exit__(self, *exc):
        self.log.append("exit")
        self.clock.now += self.cost


def test_a_timed_call_runs_inside_its_context_but_the_clock_leaves_the_context_out(monkeypatch):
    clock, log = _FakeClock(), []
    monkeypatch.setattr(bench, "time", clock)  # bench reads time.perf_counter() only

    def call():
        log.append("call")
        clock.now += 0.001  # the call itself: 1 ms

    spec = bench.Timed(call, context=lambda: _SlowContext(clock, 0.05, log))
    t = bench.time_fn(spec, repeats=3, warmup=1)
    assert log == ["enter", "call", "exit"] * 4  # every call, warm-up included, inside it
    # the context costs 0.1 s per call; the clock must see only the call's 1 ms
    assert t.min_s == pytest.approx(0.001) and t.max_s == pytest.approx(0.001), \
        f"the timing includes the context: {t.min_s * 1e3:.1f} to {t.max_s * 1e3:.1f} ms"


@pytest.fixture
def count_sdpa_kernel(monkeypatch):
    """Count entries into bench's sdpa_kernel (the real one still runs)."""
    entries = []
    real = bench.sdpa_kernel

    @contextlib.contextmanager
    def counting(*args, **kwargs):
        entries.append(args)
        with real(*args, **kwargs):
            yield

    monkeypatch.setattr(bench, "sdpa_kernel", counting)
    return entries


def test_sdpa_timed_holds_sdpa_kernel_outside_the_timed_callable(count_sdpa_kernel):
    q = torch.randn(1, 2, 8, 16, generator=torch.Generator().manual_seed(0))  # (B, h, T, d_k)
    forced = bench.sdpa_timed(q, q, q, backend="math")
    forced.fn()
    assert count_sdpa_kernel == [], "the timed callable itself must not enter sdpa_kernel"
    bench.time_interleaved({"math": forced, "default": bench.sdpa_timed(q, q, q)}, repeats=3,
                           warmup=2)
    assert len(count_sdpa_kernel) == 5  # math only, once per call (2 warm-ups + 3 timed)
    # the context is really applied around the call: a backend the CPU lacks must fail
    with pytest.raises(RuntimeError, match="No viable backend"):
        bench.time_fn(bench.sdpa_timed(q, q, q, backend="efficient"), repeats=1, warmup=0)
    with pytest.raises(ValueError, match="backend must be one of"):
        bench.sdpa_timed(q, q, q, backend="fast")
    np.testing.assert_array_equal(forced().numpy(), bench.sdpa_core(q, q, q, backend="math").numpy())


def test_the_sdpa_benchmark_times_bare_calls(count_sdpa_kernel):
    mod = _load_benchmark("sdpa_backends")
    q = torch.randn(1, 2, 8, 16)  # (B, h, T, d_k)
    for impl in ("math", "flash", "default"):
        call = mod.make_call(impl, q, q, q, False)
        assert isinstance(call, bench.Timed), f"{impl}: the benchmark must time a bench.Timed"
        call.fn()
    assert count_sdpa_kernel == []


def test_context_cost_is_a_small_positive_time():
    cost = bench.context_cost("math", repeats=200)
    assert 0 < cost < 0.01  # microseconds here; a bound that only catches a broken measurement


def test_kernel_that_runs_leaves_requires_grad_as_given(monkeypatch):
    seen = []
    real = bench.F.scaled_dot_product_attention

    def spy(q, k, v, **kwargs):
        seen.append(q.requires_grad)
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(bench.F, "scaled_dot_product_attention", spy)
    q = torch.randn(1, 2, 16, 64)  # (B, h, T, d_k)
    g = q.clone().requires_grad_()
    assert bench.kernel_that_runs(q, q, q) == "flash"
    assert bench.kernel_that_runs(g, g, g) == "flash"
    assert seen == [False, True], "SDPA must see the inputs' requires_grad as given"
    assert not q.requires_grad and g.requires_grad


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_kernel_that_runs_sees_the_kernel_without_grad_too(mode):
    q = torch.randn(1, 2, 16, 64)  # (B, h, T, d_k)
    with mode():
        assert bench.kernel_that_runs(q, q, q) == "flash"
        assert bench.kernel_that_runs(q, q, q, dropout_p=0.1) == "math"


def _load_benchmark(name: str):
    """Import benchmarks/<name>.py as a module."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_sdpa_benchmark_reports_min_median_max_and_the_machine(tmp_path):
    mod = _load_benchmark("sdpa_backends")
    args = ["--device", "cpu", "--dtypes", "float32", "--T", "32,64", "--repeats", "3",
            "--min-time", "0", "--out-dir", str(tmp_path)]
    assert mod.main(args) == 0
    report = (tmp_path / "cpu.md").read_text()
    for needed in ("min / median / max", "load_1min", "torch_threads", "outside the timing"):
        assert needed in report, f"cpu.md lacks {needed!r}"
    rows = (tmp_path / "cpu.csv").read_text().splitlines()
    assert "max_ms" in rows[0].split(",") and len(rows) == 1 + 2 * 5  # 2 T x 5 implementations


def test_cores_agree():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 16, generator=g, dtype=torch.float64) for _ in range(3))
    for causal in (False, True):
        want = bench.numpy_core(q.numpy(), k.numpy(), v.numpy(), causal)
        for got in (bench.manual_core(q, k, v, causal), bench.sdpa_core(q, k, v, causal),
                    bench.sdpa_core(q, k, v, causal, "math")):
            np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-13)


def test_math_path_memory_grows_with_the_score_matrix_and_flash_does_not():
    q = torch.randn(1, 4, 512, 32, generator=torch.Generator().manual_seed(0))
    scores = bench.score_matrix_bytes(1, 4, 512, 512, torch.float32)
    math_peak = bench.peak_memory_bytes(lambda: bench.sdpa_core(q, q, q, backend="math"))
    flash_peak = bench.peak_memory_bytes(lambda: bench.sdpa_core(q, q, q, backend="flash"))
    assert math_peak >= scores  # the (B, h, T, T) matrix is really allocated
    assert flash_peak < scores / 4  # tiles, never the whole matrix


def test_numpy_peak_sees_the_score_matrix():
    q = np.random.default_rng(0).normal(size=(1, 2, 256, 16)).astype(np.float32)
    peak = bench.numpy_peak_bytes(lambda: bench.numpy_core(q, q, q))
    assert peak >= 2 * 256 * 256 * 4


def test_cpu_backends_and_refusal_reasons():
    assert bench.available_backends("cpu") == ["math", "flash"]
    q = torch.randn(1, 2, 8, 16, generator=torch.Generator().manual_seed(0))
    assert bench.try_backend("flash", q, q, q) == (True, "ok")
    ok, why = bench.try_backend("flash", q, q, q, dropout_p=0.1)
    assert not ok and "dropout" in why
    ok, why = bench.try_backend("flash", q, q, torch.randn(1, 2, 8, 32))
    assert not ok and "same last dimension" in why
    assert not bench.try_backend("efficient", q, q, q)[0]  # a CUDA-only kernel


@pytest.mark.parametrize(("name", "peak"), [
    ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H200", 989.0), ("NVIDIA H100 PCIe", 756.0),
    ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA L4", 121.0), ("NVIDIA L40S", 362.0),
    ("NVIDIA H100 NVL", None), ("Tesla T4", None),
])
def test_gpu_peak_table(name, peak):
    assert bench.gpu_peak_bf16_tflops(name) == peak


def test_machine_info_names_versions_and_threads():
    info = bench.machine_info()
    assert info["torch"] == torch.__version__ and info["numpy"] == np.__version__
    assert int(info["torch_threads"]) >= 1
    assert torch.__version__ in bench.machine_line(info)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: fused GPU kernels")
@pytest.mark.parametrize("backend", ["flash", "efficient", "cudnn"])
def test_cuda_backends_match_math_within_derived_tolerance(backend):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 8, 256, 64, generator=g, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    golden = bench.sdpa_core(q.double(), k.double(), v.double(), True, "math")
    lp_ref = bench.manual_core(q, k, v, True).double()
    ok, why = bench.try_backend(backend, q, k, v, is_causal=True)
    if not ok:
        pytest.skip(f"needs CUDA with {backend} support on this GPU: {why}")
    ref_err = float((golden - lp_ref).abs().max())
    err = float((bench.sdpa_core(q, k, v, True, backend).double() - golden).abs().max())
    assert err <= max(3 * ref_err, torch.finfo(torch.bfloat16).eps * float(golden.abs().max()))


def test_derived_tolerance_is_floored_and_scaled():
    from mha.perf.bench import DEFAULT_ATOL, FUDGE, derived_tolerance

    golden = torch.zeros(3, dtype=torch.float64)
    assert derived_tolerance(golden, golden.float(), torch.float32) == (0.0, DEFAULT_ATOL[torch.float32])
    err, allowed = derived_tolerance(golden, torch.tensor([0.0, 0.1, 0.0]), torch.bfloat16)
    assert abs(err - 0.1) < 1e-7 and abs(allowed - FUDGE * err) < 1e-7


def test_kernel_that_runs_tells_flash_from_math_on_the_cpu():
    from mha.perf.bench import kernel_that_runs

    q = torch.randn(1, 2, 16, 64)  # (B, h, T, d_k)
    assert kernel_that_runs(q, q, q) == "flash"
    assert kernel_that_runs(q, q, q, dropout_p=0.1) == "math"  # the CPU flash kernel refuses dropout
    assert kernel_that_runs(q, q, torch.randn(1, 2, 16, 128)) == "math"  # v wider than q, k


def test_flash_kv_benchmark_runs_and_reports_each_goal(tmp_path):
    mod = _load_benchmark("flash_kv")
    assert mod.main(["--quick", "--out", str(tmp_path)]) == 0
    report = (tmp_path / "flash_kv.md").read_text()
    for goal in ("within 2x of SDPA", "at most 1/20 of naive", "at least 50x"):
        assert goal in report
    for needed in ("min / median / max", "Machine:", "load"):
        assert needed in report, f"flash_kv.md lacks {needed!r}"
    assert (tmp_path / "flash_kv.csv").exists() and (tmp_path / "flash_kv.png").exists()
