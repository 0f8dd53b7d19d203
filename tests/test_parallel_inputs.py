"""Bad inputs to mha.parallel.ring's entry points: a clear error naming what was expected and what
arrived, raised before any work is done or any process starts."""

import numpy as np
import pytest
import torch

from mha.attention import torch_attention
from mha.modules.torch_mha import MultiHeadAttention
from mha.parallel import launch
from mha.parallel import ring as parallel


def _t(*shape, dtype=torch.float64, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


Q, K, V, D = _t(2, 4, 16, 8), _t(2, 4, 16, 8, seed=1), _t(2, 4, 16, 8, seed=2), _t(2, 4, 16, 8, seed=3)
K2, V2 = _t(2, 2, 16, 8, seed=4), _t(2, 2, 16, 8, seed=5)  # grouped-query: h_kv = 2 of h = 4
LAYER = MultiHeadAttention(16, 4, seed=1, dtype=torch.float64)
X = _t(2, 16, 16, seed=6)  # (B, T, d_model)

QKV_SLIPS = [  # (q, k, v) that do not fit, the error type, and what its message must say
    ((Q, K[:, :, :8], V), ValueError, r"k must be \(B=2, h_kv, T=16, d_k=8\), got \(2, 4, 8, 8\)"),
    ((Q, K, V[:, :, :12]), ValueError, r"v must be \(B=2, h_kv=4, T=16, d_k=8\), got \(2, 4, 12, 8\)"),
    ((Q, K, V[..., :4]), ValueError, r"v must be \(B=2, h_kv=4, T=16, d_k=8\), got \(2, 4, 16, 4\)"),
    ((Q, K[..., :4], V[..., :4]), ValueError, r"k must be .*d_k=8\), got \(2, 4, 16, 4\)"),
    ((Q, K[:1], V[:1]), ValueError, r"k must be \(B=2, .*got \(1, 4, 16, 8\)"),
    ((Q, K2, V), ValueError, r"v must be \(B=2, h_kv=2, .*got \(2, 4, 16, 8\)"),
    ((Q, K[:, :3], V[:, :3]), ValueError, r"h_kv that divides q's h=4 .*got h_kv=3"),
    ((Q, K.float(), V), TypeError, r"k must have q's dtype and device \(torch.float64 on cpu\), got torch.float32"),
    ((Q, K, V.half()), TypeError, r"v must have q's dtype .*got torch.float16"),
    ((Q.numpy(), K, V), TypeError, r"q must be a torch.Tensor \(B, h, T, d_k\), got ndarray \(convert it with torch.from_numpy\)"),
    ((Q, K.numpy(), V), TypeError, r"k must be a torch.Tensor \(B, h_kv, T, d_k\), got ndarray"),
    ((Q, K, V.tolist()), TypeError, r"v must be a torch.Tensor .*got list"),
    ((Q.long(), K.long(), V.long()), TypeError, r"q must hold floating-point numbers, got dtype torch.int64"),
    ((Q[0], K[0], V[0]), ValueError, r"q must be \(B, h, T, d_k\), got \(4, 16, 8\)"),
    ((Q[:, :, :0], K[:, :, :0], V[:, :, :0]), ValueError, r"every size >= 1"),
]
DOUT_SLIPS = [
    (D[:, :, :8], ValueError, r"dout must be \(B=2, h=4, T=16, d_k=8\), got \(2, 4, 8, 8\)"),
    (D[:, :2], ValueError, r"dout must be \(B=2, h=4, T=16, d_k=8\), got \(2, 2, 16, 8\)"),
    (D.float(), TypeError, r"dout must have q's dtype and device \(torch.float64 on cpu\), got torch.float32"),
    (D.numpy(), TypeError, r"dout must be a torch.Tensor \(B, h, T, d_k\), got ndarray"),
]


@pytest.fixture
def no_work(monkeypatch):
    """Any simulation or process launch fails the test: the error must come first."""
    def refuse(*args, **kwargs):
        raise AssertionError("bad input must be refused before any work or process starts")

    monkeypatch.setattr(parallel, "simulate", refuse)
    monkeypatch.setattr(launch, "run_workers", refuse)


ENTRY = {
    "ring_attention": lambda q, k, v: parallel.ring_attention(q, k, v, 2, "zigzag", True),
    "ring_backward": lambda q, k, v: parallel.ring_backward(q, k, v, D, 2, "zigzag", True),
    "ulysses_attention": lambda q, k, v: parallel.ulysses_attention(q, k, v, 2, "contiguous", True),
    "distributed_attention ring": lambda q, k, v: parallel.distributed_attention("ring", q, k, v, 2),
    "distributed_attention ulysses": lambda q, k, v: parallel.distributed_attention("ulysses", q, k, v, 2),
    "distributed_backward": lambda q, k, v: parallel.distributed_backward("ring", q, k, v, D, 2),
    "peak_bytes_per_rank": lambda q, k, v: parallel.peak_bytes_per_rank("ring", q, k, v, 2),
}


@pytest.mark.parametrize("entry", list(ENTRY))
@pytest.mark.parametrize("qkv,error,message", QKV_SLIPS, ids=range(len(QKV_SLIPS)))
def test_mismatched_q_k_v_are_refused_before_any_work(no_work, entry, qkv, error, message):
    with pytest.raises(error, match=message):
        ENTRY[entry](*qkv)


@pytest.mark.parametrize("entry", ["ring_backward", "distributed_backward"])
@pytest.mark.parametrize("dout,error,message", DOUT_SLIPS, ids=range(len(DOUT_SLIPS)))
def test_a_dout_that_is_not_the_outputs_is_refused(no_work, entry, dout, error, message):
    call = {"ring_backward": lambda: parallel.ring_backward(Q, K, V, dout, 2),
            "distributed_backward": lambda: parallel.distributed_backward("ring", Q, K, V, dout, 2)}
    with pytest.raises(error, match=message):
        call[entry]()


@pytest.mark.parametrize("call,error,message", [
    (lambda: parallel.sequence_parallel(LAYER, X.float(), 2), TypeError,
     r"x must be torch.float64 to match the weights, got torch.float32"),
    (lambda: parallel.sequence_parallel(LAYER, X.numpy(), 2), TypeError, r"x must be a torch.Tensor, got a numpy array"),
    (lambda: parallel.sequence_parallel(LAYER, X[..., :8], 2), ValueError, r"x must be \(B, T, d_model=16\), got \(2, 16, 8\)"),
    (lambda: parallel.sequence_parallel(LAYER, X[0], 2), ValueError, r"x must be \(B, T, d_model=16\), got \(16, 16\)"),
    (lambda: parallel.sequence_parallel(LAYER, X, 2, dout=X[:, :8]), ValueError,
     r"dout must have the output's shape \(2, 16, 16\) and dtype torch.float64, got \(2, 8, 16\)"),
    (lambda: parallel.sequence_parallel(LAYER, X, 2, dout=X.float()), ValueError,
     r"dout must have the output's shape \(2, 16, 16\) and dtype torch.float64, got \(2, 16, 16\) and torch.float32"),
    (lambda: parallel.sequence_parallel(LAYER, X, 2, dout=X.numpy()), TypeError,
     r"dout must be a torch.Tensor \(B, T, d_model\), got ndarray"),
    (lambda: parallel.sequence_parallel(torch.nn.Linear(16, 16), X, 2), ValueError, r"expected an mha MultiHeadAttention"),
], ids=["x dtype", "x numpy", "x width", "x 2-D", "dout shape", "dout dtype", "dout numpy", "not the module"])
def test_sequence_parallel_refuses_bad_inputs_before_any_process(no_work, call, error, message):
    with pytest.raises(error, match=message):
        call()


OTHER_SLIPS = [
    (lambda: parallel.shard(Q.numpy(), 2), TypeError, r"x must be a torch.Tensor, got ndarray"),
    (lambda: parallel.shard(Q, 2, dim=4), ValueError, r"dim must be an axis of x, an int in \[-4, 4\), got 4"),
    (lambda: parallel.shard(Q, 2, dim=2.0), ValueError, r"dim must be an axis of x.*got 2.0"),
    (lambda: parallel.unshard([Q, Q[:, :, :8]]), ValueError,
     r"every rank's piece must have one shape and dtype .*\(2, 4, 16, 8\), \(2, 4, 8, 8\)"),
    (lambda: parallel.unshard([Q, Q.float()]), ValueError, r"one shape and dtype .*torch.float32"),
    (lambda: parallel.unshard(Q), TypeError, r"pieces must be a non-empty list of tensors .*got Tensor"),
    (lambda: parallel.unshard([]), TypeError, r"pieces must be a non-empty list"),
    (lambda: parallel.unshard([Q.numpy(), Q.numpy()]), TypeError, r"pieces must all be torch.Tensors, got \['ndarray', 'ndarray'\]"),
    (lambda: parallel.unshard([Q, Q], dim=7), ValueError, r"dim must be an axis of pieces\[0\]"),
    (lambda: parallel.rank_positions(16.0, 2), TypeError, r"T must be an int, got float 16.0"),
    (lambda: parallel.rank_positions(True, 1), TypeError, r"T must be an int, got bool"),
    (lambda: parallel.rank_positions(0, 1), ValueError, r"T must be >= 1, got 0"),
    (lambda: parallel.rank_positions(16, 2.0), ValueError, r"world_size must be a whole number >= 1, got 2.0"),
    (lambda: parallel.causal_work(16.5, 2, "zigzag"), TypeError, r"T must be an int"),
    (lambda: parallel.ring_stats(12, 4, "zigzag"), ValueError, r"T=12 is not divisible by 8"),
    (lambda: parallel.ring_bytes_per_step(2, 4, 15, 2, 8, 8), ValueError, r"T=15 is not divisible by 2"),
    (lambda: parallel.ring_bytes_per_step(2, 0, 16, 2, 8, 8), ValueError, r"h_kv must be >= 1, got 0"),
    (lambda: parallel.ring_bytes_per_step(2, 4, 16, 2, 8, 2.5), TypeError, r"itemsize must be an int, got float"),
    (lambda: parallel.ring_backward_bytes(2, 4, 16, 3, 8, 8), ValueError, r"T=16 is not divisible by 3"),
    (lambda: parallel.ring_backward_bytes(-1, 4, 16, 2, 8, 8), ValueError, r"B must be >= 1, got -1"),
    (lambda: parallel.ring_backward_bytes(2, 4, 16, 2, 8, 2, grad_itemsize=0), ValueError,
     r"grad_itemsize must be >= 1, got 0"),
    (lambda: torch_attention.merge_partials(Q.numpy(), Q[..., 0], Q, Q[..., 0]), TypeError, r"out_a must be a torch.Tensor"),
    (lambda: next(parallel.ring_rank(Q, K, V, torch.arange(8), 2)), ValueError,
     r"pos must be the rank's global positions, an int tensor of shape \(T_r=16,\), got \(8,\)"),
    (lambda: next(parallel.ring_rank(Q, K, V, torch.arange(16.0), 2)), ValueError, r"pos must be .*int tensor"),
    (lambda: next(parallel.ring_rank(Q, K[:, :, :8], V, torch.arange(16), 2)), ValueError, r"k must be \(B=2"),
    (lambda: next(parallel.ring_rank_backward(Q, K, V, torch.arange(16), Q, Q[..., 0], D[:, :, :4], 2)),
     ValueError, r"dout must be \(B=2, h=4, T=16, d_k=8\), got \(2, 4, 4, 8\)"),
    (lambda: next(parallel.ulysses_rank(Q, K, V.float(), torch.arange(16), 2)), TypeError, r"v must have q's dtype"),
    (lambda: parallel.block_mask(np.arange(4), torch.arange(4), True), ValueError,
     r"q_pos must be a 1-d tensor of global positions, got ndarray"),
    (lambda: parallel.block_mask(torch.arange(4), torch.ones(2, 2).long(), True), ValueError,
     r"k_pos must be a 1-d tensor of global positions, got shape \(2, 2\)"),
    (lambda: parallel.simulate([], "ring"), TypeError, r"ranks must be a non-empty list of rank generators"),
    (lambda: parallel.simulate([Q, K], "ring"), TypeError, r"ranks must be a non-empty list of rank generators"),
]


@pytest.mark.parametrize("call,error,message", OTHER_SLIPS, ids=range(len(OTHER_SLIPS)))
def test_the_other_public_functions_refuse_bad_inputs(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_good_inputs_still_pass_the_checks():
    assert parallel.check_qkv(Q, K2, V2, D) == (2, 4, 2, 16, 8)
    out, _ = parallel.ring_attention(Q, K2, V2, 2, "zigzag", True)
    assert out.shape == Q.shape
    assert parallel.ring_bytes_per_step(np.int64(2), 4, 16, 2, 8, 8) > 0  # numpy ints are whole numbers
