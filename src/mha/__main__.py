"""`python -m mha`: a one-screen terminal demo of the numpy module and its checks."""

from __future__ import annotations

import numpy as np

from mha import checks
from mha.ledger import format_ledger
from mha.modules.numpy_mha import MultiHeadAttention


def main() -> None:
    """Build the d_model=512, h=8 module, trace one batch and run the three properties."""
    B, T, d_model, h = 2, 6, 512, 8
    mha = MultiHeadAttention(d_model, h, seed=42)
    x = np.random.default_rng(0).normal(0.0, 1.0, (B, T, d_model))
    out = mha(x, causal=True)
    print(f"{mha}\ninput {x.shape} -> output {out.shape}\n")
    print("Shape ledger (from a real run, causal=True):")
    print(format_ledger(mha.trace(x, causal=True)))
    print("\nProperties:")
    print("  PASS", checks.check_causal(lambda a: mha(a, causal=True), x, t=2))
    mha(x, causal=True)
    print("  PASS", checks.check_rows_sum_to_one(mha.attn, atol=1e-12), "(causal)")
    mha(x, causal=False)
    print("  PASS", checks.check_rows_sum_to_one(mha.attn, atol=1e-12), "(no mask)")
    print("  PASS", checks.check_param_count(mha))


if __name__ == "__main__":
    main()
