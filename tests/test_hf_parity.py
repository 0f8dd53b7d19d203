"""Our composed torch module against Hugging Face's LlamaAttention (transformers 5.24), same weights.

Tiny random LlamaConfig (nothing from the Hub), weights copied by `mha.modules.hf.from_llama_attention`,
a LEFT-PADDED causal batch built the way HF generation builds it (2-D attention_mask,
position_ids = cumsum - 1, the 4-D mask from `masking_utils.create_causal_mask`), then
decoding with a KV cache. Only real (non-pad) query rows are compared. The harness
(llama_config, llama_attention, as_impl, run_hf, run_ours, max_err) lives in `mha.modules.hf`, which
notebook 17 imports too; this file keeps the derived tolerances and the planted mistakes.

Tolerances are derived, as in tests/test_torch_parity.py (PyTorch's test_transformers.py rule):
    golden   = HF, sdpa, float64 weights, fed float64 cos/sin tables (`exact_tables`)
    ref_err  = max |HF as users run it (this dtype, this attn_implementation, its own
               LlamaRotaryEmbedding) - golden|
    allowed  = max(FLOOR[dtype], FUDGE * ref_err)            (mha.perf.bench.derived_tolerance)
    assert |ours - golden| <= allowed,  and  |ours - HF| <= allowed + ref_err (triangle inequality)
HF is not exact in float64, by its own design: LlamaRotaryEmbedding.forward computes the angles
and cos/sin in float32 whatever the model's dtype (modeling_llama.py line 111:
`position_ids[..., None].float() * self.inv_freq...float`, inv_freq itself float32 at line 106,
cast to x.dtype only at line 116), and eager attention takes its softmax in float32 (line 197:
`softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)`). So ref_err is about 1e-7
even in float64, and the float64 tests also check the sharp claim: fed the same float64 tables,
HF's sdpa path and ours agree to float64 rounding (FLOOR[float64] = 1e-12, the float64 contract
of tests/test_torch_parity.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaAttention

from mha.attention.posenc import rope_permutation
from mha.modules import hf
from mha.modules.hf import as_impl, from_llama_attention, llama_attention, rope_theta, rows_per_head
from mha.modules.torch_mha import MultiHeadAttention
from mha.perf.bench import DEFAULT_ATOL, FUDGE

D_MODEL, H, D_K = 32, 4, 8
THETA = hf.LLAMA3_THETA  # Llama 3's base, not the default 10000: a copy that drops it must fail
LENGTHS = (7, 4, 1)  # left-padded prompts in a (B=3, T=7) batch
T, N_NEW = 7, 4  # prompt width, tokens decoded one at a time after it
FLOOR = {torch.float64: 1e-12, torch.float32: DEFAULT_ATOL[torch.float32]}
IMPLS = ("eager", "sdpa")
DTYPES = (torch.float64, torch.float32)


def llama_config(impl: str = "sdpa", n_kv: int = 2, bias: bool = False) -> LlamaConfig:
    """mha.modules.hf.llama_config at this file's sizes (h=4, d_k=8, d_model=32, THETA)."""
    return hf.llama_config(impl, H, n_kv, D_K, THETA, bias)


def run_hf(attn: LlamaAttention, config: LlamaConfig, n_new: int = N_NEW, tables: str = "hf",
           round_to: torch.dtype | None = None) -> list[torch.Tensor]:
    """mha.modules.hf.run_hf on this file's batch: LENGTHS left-padded to T, then n_new decoded tokens."""
    return hf.run_hf(attn, config, LENGTHS, T=T, n_new=n_new, tables=tables, round_to=round_to)


def run_ours(module: MultiHeadAttention, n_new: int = N_NEW) -> list[torch.Tensor]:
    """mha.modules.hf.run_ours on the same batch."""
    return hf.run_ours(module, LENGTHS, T=T, n_new=n_new)


def max_err(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """mha.modules.hf.max_err on this file's real rows."""
    return hf.max_err(a, b, LENGTHS)


def tolerance(attn: LlamaAttention, impl: str, dtype: torch.dtype, n_new: int
              ) -> tuple[list[torch.Tensor], list[torch.Tensor], float, float]:
    """(golden, HF as run, ref_err, allowed): the derived tolerance for this HF setting.

    golden runs on the same dtype-rounded weights and inputs, upcast: it measures arithmetic only.
    """
    rounded, cfg = as_impl(attn, impl, dtype)
    golden = run_hf(*as_impl(rounded, "sdpa", torch.float64), n_new, "exact", round_to=dtype)
    as_run = run_hf(rounded, cfg, n_new)
    ref_err = max_err(as_run, golden)
    return golden, as_run, ref_err, max(FLOOR[dtype], FUDGE * ref_err)


def check_parity(ours_mod: MultiHeadAttention, attn: LlamaAttention, impl: str,
                 dtype: torch.dtype, n_new: int) -> tuple[float, float]:
    """Assert ours is as close to golden as HF is, and close to HF; return (err, allowed)."""
    golden, as_run, ref_err, allowed = tolerance(attn, impl, dtype, n_new)
    ours = run_ours(ours_mod, n_new)
    err = max_err(ours, golden)
    assert err <= allowed, f"{impl} {dtype}: |ours - golden| = {err:.2e} > {allowed:.2e}"
    gap = max_err(ours, as_run)
    assert gap <= allowed + ref_err, f"{impl} {dtype}: |ours - HF| = {gap:.2e} > {allowed + ref_err:.2e}"
    if dtype == torch.float64:  # the same float64 tables: only float64 rounding separates us
        assert err <= FLOOR[torch.float64], f"|ours - golden| = {err:.2e} in float64"
    return err, allowed


# ---- a. forward parity, left-padded, causal; c. MQA / GQA / MHA ----------------------------------
@pytest.mark.parametrize("n_kv", [1, 2, 4])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("impl", IMPLS)
def test_forward_parity(impl: str, dtype: torch.dtype, n_kv: int) -> None:
    """A left-padded causal prefill: our module equals LlamaAttention on every real row."""
    attn = llama_attention(llama_config(impl, n_kv))
    ours = from_llama_attention(*as_impl(attn, impl, dtype))
    assert (ours.n_kv_heads, ours.options.rope, ours.options.rope_base, ours.dtype) == (
        n_kv, "half", THETA, dtype)
    check_parity(ours, attn, impl, dtype, n_new=0)


# ---- b. decoding with a KV cache ------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("impl", IMPLS)
def test_decoding_parity(impl: str, dtype: torch.dtype) -> None:
    """Prefill, then N_NEW one-token steps with DynamicCache vs our cache: every step equal."""
    attn = llama_attention(llama_config(impl))
    check_parity(from_llama_attention(*as_impl(attn, impl, dtype)), attn, impl, dtype, N_NEW)


def test_attention_bias_is_copied() -> None:
    """attention_bias=True: the four biases travel too (with their rows, for the interleaved module)."""
    attn = llama_attention(llama_config("sdpa", bias=True))
    for rope in ("half", "interleaved"):
        check_parity(from_llama_attention(attn, attn.config, rope=rope), attn, "sdpa",
                     torch.float64, N_NEW)


# ---- c. the interleaved pairing is the half split with q/k rows permuted --------------------------
def permuted_twin(m: MultiHeadAttention, rope: str, order: np.ndarray) -> MultiHeadAttention:
    """A module with `rope` whose q/k rows are m's, reordered per head by `order`; v, o unchanged."""
    twin = MultiHeadAttention(m.d_model, m.n_heads, dtype=m.dtype, n_kv_heads=m.n_kv_heads,
                              rope=rope, rope_base=m.options.rope_base)
    Wq, bq, Wk, bk, Wv, bv = m.qkv_weights()
    Wq, bq = rows_per_head(Wq, m.n_heads, order), rows_per_head(bq, m.n_heads, order)
    Wk, bk = rows_per_head(Wk, m.n_kv_heads, order), rows_per_head(bk, m.n_kv_heads, order)
    return twin.load_weights_(Wq, bq, Wk, bk, Wv, bv, m.out_proj.weight, m.out_proj.bias)


def test_interleaved_is_half_with_permuted_rows() -> None:
    """Ours: rope="interleaved" with weights W == rope="half" with W's q/k rows in perm order."""
    inter = MultiHeadAttention(D_MODEL, H, seed=3, dtype=torch.float64, n_kv_heads=2,
                               rope="interleaved", rope_base=THETA)
    half = permuted_twin(inter, "half", rope_permutation(D_K))
    unpermuted = permuted_twin(inter, "half", np.arange(D_K))
    err = max_err(run_ours(half), run_ours(inter))
    # the same products summed in another order over d_k: float64 rounding only
    assert err <= FLOOR[torch.float64], f"interleaved vs permuted half: {err:.2e}"
    assert max_err(run_ours(unpermuted), run_ours(inter)) > 1e6 * FLOOR[torch.float64]


@pytest.mark.parametrize("impl", IMPLS)
def test_interleaved_module_matches_hf(impl: str) -> None:
    """from_llama_attention(rope="interleaved") reorders q/k rows so HF's half split comes out."""
    attn = llama_attention(llama_config(impl))
    ours = from_llama_attention(attn, attn.config, rope="interleaved")
    assert ours.options.rope == "interleaved"
    check_parity(ours, attn, impl, torch.float64, N_NEW)


# ---- d. the comparison can fail -------------------------------------------------------------------
def planted(attn: LlamaAttention, bug: str) -> MultiHeadAttention:
    """Our module from attn with one classic conversion mistake in it."""
    good = from_llama_attention(attn, attn.config)
    Wq, bq, Wk, bk, Wv, bv = good.qkv_weights()
    if bug == "interleaved_unpermuted":  # Meta's pairing on HF's (already permuted) rows
        return permuted_twin(good, "interleaved", np.arange(D_K))
    if bug == "permuted_the_wrong_way":  # perm where its inverse belongs
        return permuted_twin(good, "interleaved", rope_permutation(D_K))
    rope_base = 10000.0 if bug == "default_theta" else THETA
    if bug == "k_v_swapped":
        Wk, bk, Wv, bv = Wv, bv, Wk, bk
    bad = MultiHeadAttention(D_MODEL, H, dtype=good.dtype, n_kv_heads=good.n_kv_heads,
                             rope="half", rope_base=rope_base)
    return bad.load_weights_(Wq, bq, Wk, bk, Wv, bv, good.out_proj.weight, good.out_proj.bias)


@pytest.mark.parametrize("bug", ["interleaved_unpermuted", "permuted_the_wrong_way",
                                 "default_theta", "k_v_swapped"])
def test_planted_mistake_is_caught(bug: str) -> None:
    """Each planted mistake misses HF by far more than the derived tolerance."""
    attn = llama_attention(llama_config("sdpa"))
    _, as_run, _, allowed = tolerance(attn, "sdpa", torch.float64, N_NEW)
    bad = planted(attn, bug)
    err = max_err(run_ours(bad), as_run)
    assert err > 1000 * allowed, f"{bug}: error {err:.2e} is not far above {allowed:.2e}"
    with pytest.raises(AssertionError, match="golden"):  # the parity check itself says no
        check_parity(bad, attn, "sdpa", torch.float64, N_NEW)


def test_refuses_what_it_cannot_express() -> None:
    """Scaled RoPE, head_dim * h != hidden_size and non-Llama modules get a clear error."""
    cfg = llama_config()
    cfg.rope_parameters = {"rope_type": "linear", "rope_theta": THETA, "factor": 2.0}
    with pytest.raises(ValueError, match="rope_type='linear'"):
        rope_theta(cfg)
    wide = LlamaConfig(hidden_size=D_MODEL, num_attention_heads=H, num_key_value_heads=2,
                       head_dim=2 * D_K)
    with pytest.raises(ValueError, match="head_dim"):
        from_llama_attention(LlamaAttention(wide, layer_idx=0), wide)
    with pytest.raises(TypeError, match="LlamaAttention"):
        from_llama_attention(torch.nn.Linear(2, 2), cfg)
    with pytest.raises(ValueError, match="rope must be"):
        from_llama_attention(LlamaAttention(cfg, layer_idx=0), cfg, rope="none")


# ---- e. the notebook's one call -------------------------------------------------------------------
def test_compare_with_llama_prints_a_stable_verdict() -> None:
    """Notebook 17's call: a verdict per kernel, no raw floats; a bound it misses raises with numbers."""
    text = hf.compare_with_llama(lengths=(7, 4, 2), n_heads=4, n_kv_heads=2, d_k=8, n_new=3)
    lines = text.splitlines()
    assert lines[0].startswith("LlamaAttention vs mha MultiHeadAttention") and "float64" in lines[0]
    assert lines[1:] == [
        "eager: prefill and 3 decoded tokens, real rows, max |ours - HF| below 1e-6 "
        "(HF computes RoPE in float32)",
        "sdpa: prefill and 3 decoded tokens, real rows, max |ours - HF| below 1e-6 "
        "(HF computes RoPE in float32)",
        "sdpa fed float64 cos/sin tables: max |ours - HF| below 1e-12 (float64 rounding only)",
    ]
    # HF's float32 RoPE keeps it about 1e-7 from float64: a float64-rounding bound must fail
    with pytest.raises(AssertionError, match=r"sdpa float64: max \|ours - HF\| = \d\.\d{3}e-0[78]"):
        hf.compare_with_llama(lengths=(7, 4, 2), n_new=1, impls=("sdpa",), bound=1e-12)


# ---- f. the cache argument's name, as the lessons give it -------------------------------------------
def test_the_installed_llama_attention_takes_cache_and_only_warns_on_past_key_values() -> None:
    """transformers 5.24 renamed `past_key_values` to `cache`: the lessons and hf.run_hf use `cache`."""
    import inspect
    import warnings

    from transformers.cache_utils import DynamicCache

    assert "cache" in inspect.signature(LlamaAttention.forward).parameters
    assert "past_key_values" not in inspect.signature(LlamaAttention.forward).parameters
    cfg = hf.llama_config("eager")
    attn = hf.llama_attention(cfg)
    x = torch.randn(1, 3, cfg.hidden_size, dtype=torch.float64)
    emb = hf.exact_tables(torch.arange(3)[None], attn.head_dim, rope_theta(cfg), torch.float64)
    old = DynamicCache(config=cfg)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        attn(x, position_embeddings=emb, attention_mask=None, past_key_values=old)
    assert old.get_seq_length() == 3  # the old name still reaches the cache ...
    assert any("`past_key_values` is deprecated" in str(w.message) and "Use `cache`" in str(w.message)
               for w in caught)  # ... with a deprecation warning


@pytest.mark.parametrize("lesson", ["13_kv_cache", "16_positions_and_variants", "17_generation"])
def test_the_lessons_name_the_cache_argument_past_key_values_only_to_explain_the_rename(lesson) -> None:
    import pathlib
    import re

    import nbformat

    path = pathlib.Path(__file__).resolve().parents[1] / "notebooks" / f"{lesson}.ipynb"
    text = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells)
    for m in re.finditer("past_key_values", text):
        around = text[max(0, m.start() - 300):m.end() + 300]
        assert re.search(r"renam|deprecat", around), (
            f"{lesson} names `past_key_values` without saying transformers 5.24 renamed it `cache`: "
            f"...{text[max(0, m.start() - 80):m.end() + 80]}...")
