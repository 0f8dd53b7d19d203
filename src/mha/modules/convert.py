"""Moving weights in and out of `mha.modules.torch_mha.MultiHeadAttention`: numpy and nn.MultiheadAttention.

Kept out of the module a student reads. `WeightConversion` is a mixin: the torch module
inherits these methods, so `MultiHeadAttention.from_numpy(np_module)` and
`module.to_torch_mha()` work as before, while the class body stays the seven steps.

Two layout facts:
  * numpy stores a projection as W of shape (in, out) and computes `x @ W`; nn.Linear stores
    `weight` of shape (out, in) and computes `x @ weight.T`. Moving weights is a transpose.
  * nn.MultiheadAttention packs q, k, v into one `in_proj_weight` (3*d_model, d_model), rows
    stacked q, k, v, in nn.Linear's (out, in) layout.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from mha.modules import numpy_mha


class WeightConversion:
    """Weight transfer for the torch MultiHeadAttention (mixed into it; not used alone)."""

    # ---- weights in one canonical form: (out, in) tensors, q/k/v separate -------------------
    def qkv_weights(self) -> tuple[torch.Tensor, ...]:
        """(Wq, bq, Wk, bk, Wv, bv) in nn.Linear layout: W (out, d_model in), out = d_model or h_kv d_k."""
        if self.fused_qkv:
            sizes = [self.d_model, self.n_kv_heads * self.d_k, self.n_kv_heads * self.d_k]
            Wq, Wk, Wv = self.qkv_proj.weight.split(sizes, dim=0)  # (d, d), 2 x (h_kv d_k, d)
            bq, bk, bv = self.qkv_proj.bias.split(sizes, dim=0)
            return Wq, bq, Wk, bk, Wv, bv
        return (self.q_proj.weight, self.q_proj.bias, self.k_proj.weight, self.k_proj.bias,
                self.v_proj.weight, self.v_proj.bias)

    @torch.no_grad()
    def load_weights_(self, Wq, bq, Wk, bk, Wv, bv, Wo, bo) -> WeightConversion:
        """Copy eight tensors in nn.Linear layout (W (out, in)) into this module; returns self."""
        d, d_kv = self.d_model, self.n_kv_heads * self.d_k
        for name, w, out in (("Wq", Wq, d), ("Wk", Wk, d_kv), ("Wv", Wv, d_kv), ("Wo", Wo, d)):
            if tuple(w.shape) != (out, d):
                what = "d_model" if out == d else "n_kv_heads * d_k"
                raise ValueError(f"{name} must be ({what}={out}, d_model={d}), got {tuple(w.shape)}")
        if self.fused_qkv:
            self.qkv_proj.weight.copy_(torch.cat([Wq, Wk, Wv], dim=0))  # (3*d_model, d_model)
            self.qkv_proj.bias.copy_(torch.cat([bq, bk, bv], dim=0))  # (3*d_model,)
        else:
            for lin, w, b in ((self.q_proj, Wq, bq), (self.k_proj, Wk, bk), (self.v_proj, Wv, bv)):
                lin.weight.copy_(w)
                lin.bias.copy_(b)
        self.out_proj.weight.copy_(Wo)
        self.out_proj.bias.copy_(bo)
        return self

    def load_numpy_(self, np_module: numpy_mha.MultiHeadAttention) -> WeightConversion:
        """Copy weights from the numpy module: numpy's W is (in, out), nn.Linear's is (out, in), so transpose."""
        t = [torch.as_tensor(np.ascontiguousarray(a)) for a in np_module.parameters()]
        Wq, bq, Wk, bk, Wv, bv, Wo, bo = t
        return self.load_weights_(Wq.T, bq, Wk.T, bk, Wv.T, bv, Wo.T, bo)  # (in,out).T -> (out,in)

    @classmethod
    def from_numpy(cls, np_module, dtype: torch.dtype | None = None, **kwargs) -> WeightConversion:
        """A torch module with the numpy module's weights (transposed to (out, in)); dtype defaults to numpy's."""
        if dtype is None:
            dtype = torch.float64 if np_module.dtype == np.float64 else torch.float32
        for name, value in np_module.options.kwargs().items():
            kwargs.setdefault(name, value)  # the same options: GQA heads, RoPE, ALiBi, window
        m = cls(np_module.d_model, np_module.n_heads, dtype=dtype, **kwargs)
        return m.load_numpy_(np_module)

    def to_numpy(self, dtype=np.float64) -> numpy_mha.MultiHeadAttention:
        """A numpy module with this module's weights, transposed back to numpy's (in, out) layout."""
        out = numpy_mha.MultiHeadAttention(self.d_model, self.n_heads, dtype=dtype,
                                           **self.options.kwargs())
        Wq, bq, Wk, bk, Wv, bv = (p.detach().cpu().double().numpy().astype(dtype)
                                  for p in self.qkv_weights())
        Wo, bo = (p.detach().cpu().double().numpy().astype(dtype)
                  for p in (self.out_proj.weight, self.out_proj.bias))
        out.Wq, out.Wk, out.Wv, out.Wo = Wq.T, Wk.T, Wv.T, Wo.T  # (out, in) -> (in, out)
        out.bq, out.bk, out.bv, out.bo = bq, bk, bv, bo
        return out

    @classmethod
    def from_torch_mha(cls, ref: nn.MultiheadAttention, **kwargs) -> WeightConversion:
        """A module with nn.MultiheadAttention's weights: in_proj_weight is q, k, v stacked on dim 0."""
        _check_plain_torch_mha(ref)
        Wq, Wk, Wv = ref.in_proj_weight.chunk(3, dim=0)  # 3 x (d_model, d_model), (out, in)
        bq, bk, bv = ref.in_proj_bias.chunk(3, dim=0)  # 3 x (d_model,)
        kwargs.setdefault("dtype", ref.in_proj_weight.dtype)
        kwargs.setdefault("device", ref.in_proj_weight.device)
        m = cls(ref.embed_dim, ref.num_heads, **kwargs)
        return m.load_weights_(Wq, bq, Wk, bk, Wv, bv, ref.out_proj.weight, ref.out_proj.bias)

    @torch.no_grad()
    def to_torch_mha(self) -> nn.MultiheadAttention:
        """An nn.MultiheadAttention(batch_first=True) with these weights (q, k, v stacked into in_proj)."""
        if self.options.describe(self.n_heads):
            raise ValueError(f"nn.MultiheadAttention has no twin for {self.options.describe(self.n_heads)}: "
                             f"only plain multi-head attention converts")
        p = self.out_proj.weight
        ref = nn.MultiheadAttention(self.d_model, self.n_heads, batch_first=True,
                                    dtype=p.dtype, device=p.device)
        Wq, bq, Wk, bk, Wv, bv = self.qkv_weights()
        ref.in_proj_weight.copy_(torch.cat([Wq, Wk, Wv], dim=0))  # (3*d_model, d_model)
        ref.in_proj_bias.copy_(torch.cat([bq, bk, bv], dim=0))  # (3*d_model,)
        ref.out_proj.weight.copy_(self.out_proj.weight)
        ref.out_proj.bias.copy_(self.out_proj.bias)
        return ref



def _check_plain_torch_mha(ref: nn.MultiheadAttention) -> None:
    """Reject nn.MultiheadAttention options this module has no twin for."""
    if not isinstance(ref, nn.MultiheadAttention):
        raise TypeError(f"expected nn.MultiheadAttention, got {type(ref).__name__}")
    if ref.in_proj_weight is None or ref.in_proj_bias is None:
        raise ValueError("need one packed in_proj_weight with bias (kdim = vdim = embed_dim, bias=True)")
    if ref.bias_k is not None or ref.add_zero_attn:
        raise ValueError("add_bias_kv / add_zero_attn have no equivalent here")


