"""A tiny Transformer built from our `torch_mha.MultiHeadAttention`, trained on toy tasks.

Every heatmap before this lesson came from random weights. Here a model *learns* to attend,
on two tasks whose solution is visible in the attention maps:

  * reversal   y[t] = x[T-1-t]: each query must look at its mirrored key (the anti-diagonal);
  * induction  random tokens; where the current token occurred before, output the token that
               followed it last time: the query must find the key *after* the previous
               occurrence (two layers: one head marks each position's previous token, a
               second one matches the query's token against it).

Plus the tools to look inside: `attention_maps` (via `torch_mha.capture_attention`),
`ablate_uniform` (one head's weights made uniform), `mirrored_key_weight`, and the four
initialisation schemes of the lesson with `stacked_variance`.

Shape legend: B batch, T sequence length (queries), S keys (S = T here), h heads,
d_model width, V vocabulary size. Tokens are int64 (B, T); logits (B, T, V).
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from mha.modules.torch_mha import MultiHeadAttention, capture_attention
from mha.validate import require_int, require_shape

IGNORE = -100
"""Target value of a position that is not scored (F.cross_entropy's default ignore_index)."""


# ---- the two tasks ----------------------------------------------------------------------------
def _check_task_sizes(B: int, T: int, vocab: int, min_T: int = 2, min_vocab: int = 2) -> None:
    """Validate batch, length and vocabulary sizes of a task generator."""
    require_int("B", B)
    require_int("T", T, minimum=min_T)
    require_int("vocab", vocab, minimum=min_vocab)


def reversal_batch(generator: torch.Generator, B: int, T: int, vocab: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Random tokens x (B, T) and targets y = x reversed along T: y[:, t] = x[:, T-1-t]."""
    _check_task_sizes(B, T, vocab)
    x = torch.randint(0, vocab, (B, T), generator=generator)  # (B, T)
    return x, x.flip(1)  # (B, T): position t must fetch the token at T-1-t


def induction_batch(generator: torch.Generator, B: int, T: int, vocab: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Random tokens x (B, T) and targets y (B, T): the token after the previous occurrence of x[t].

    Tokens are drawn uniformly with replacement, so some recur. Where x[t] occurred before
    (latest at s < t), y[t] = x[s + 1]: the copy an induction head makes ("last time A came, B
    followed, so say B"). Where x[t] is new, nothing can be known and y[t] = IGNORE. The tokens
    carry no other pattern, so one attention layer cannot solve it (it would need to know, at
    key s + 1, which token came before it: that takes a first layer).
    """
    _check_task_sizes(B, T, vocab)
    x = torch.randint(0, vocab, (B, T), generator=generator)  # (B, T)
    keys = induction_keys(x)  # (B, T): s + 1, or -1 where x[t] is new
    y = x.gather(1, keys.clamp(min=0))  # (B, T): the token at that key
    return x, torch.where(keys >= 0, y, IGNORE)  # (B, T)


def induction_keys(x: torch.Tensor) -> torch.Tensor:
    """For each (b, t) the key an induction head should read: 1 + the previous occurrence of x[b, t].

    Returns int64 (B, T), -1 where x[b, t] has not occurred before t. Computed from x alone.
    """
    require_shape("x", x, (("B", None), ("T", None)))
    B, T = x.shape
    same = x[:, :, None] == x[:, None, :]  # (B, T, S): key s holds the query's token
    earlier = torch.ones(T, T, dtype=torch.bool).tril(-1)  # (T, S): s < t
    hits = same & earlier  # (B, T, S)
    last = torch.where(hits, torch.arange(T), -1).amax(dim=-1)  # (B, T): latest s, or -1
    return torch.where(last >= 0, last + 1, -1)  # (B, T)


@dataclass(frozen=True)
class Task:
    """A toy task: its name, sizes, whether the model is causal, and its batch generator."""

    name: str
    T: int
    vocab: int
    causal: bool
    make: Callable[..., tuple[torch.Tensor, torch.Tensor]]

    def batch(self, generator: torch.Generator, B: int) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T) int64 tokens and y (B, T) int64 targets (IGNORE where not scored)."""
        return self.make(generator, B, self.T, self.vocab)


def reversal_task(T: int = 8, vocab: int = 10) -> Task:
    """Reverse a sequence of T tokens; bidirectional attention (no causal mask)."""
    _check_task_sizes(1, T, vocab)
    return Task("reversal", T, vocab, causal=False, make=reversal_batch)


def induction_task(T: int = 16, vocab: int = 16) -> Task:
    """Output the token that followed the current token's previous occurrence; causal."""
    _check_task_sizes(1, T, vocab)
    return Task("induction", T, vocab, causal=True, make=induction_batch)


# ---- the model --------------------------------------------------------------------------------
class Block(nn.Module):
    """A pre-LayerNorm Transformer block: h = x + MHA(LN(x)), then h + MLP(LN(h)) if it has one."""

    def __init__(self, d_model: int, n_heads: int, seed: int = 0, mlp: bool = True, **options):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = MultiHeadAttention(d_model, n_heads, seed=seed, **options)  # ours, SDPA path
        self.ln2 = nn.LayerNorm(d_model) if mlp else None
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(),
                                 nn.Linear(4 * d_model, d_model)) if mlp else None

    def forward(self, x: torch.Tensor, causal: bool = False, positions=None, cache=None) -> torch.Tensor:
        """(B, T, d_model) -> (B, T, d_model); each sub-layer adds to the residual stream."""
        x = x + self.attn(self.ln1(x), causal=causal, positions=positions, cache=cache)
        if self.mlp is not None:
            x = x + self.mlp(self.ln2(x))  # the MLP works on each position on its own
        return x


class TinyTransformer(nn.Module):
    """Token + learned position embeddings, n_layers Blocks, a final LayerNorm and a linear head.

    tokens (B, T) int64 -> logits (B, T, vocab). `causal` is fixed per model (per task).
    Attention options (n_kv_heads, rope, window; see mha.modules.compose) go to every layer; with RoPE
    the model has no learned position table, so it runs at any length. Built under `seed`: the
    same arguments give the same weights, and the global torch RNG is left as it was.
    """

    def __init__(self, vocab: int, T: int, d_model: int = 32, n_heads: int = 2,
                 n_layers: int = 1, mlp: bool = False, causal: bool = False, seed: int = 0,
                 **options):
        super().__init__()
        require_int("vocab", vocab, minimum=2)
        require_int("n_layers", n_layers)
        self.T, self.vocab, self.causal = require_int("T", T), vocab, bool(causal)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)  # embeddings, LayerNorms, MLP and head
            self.tok = nn.Embedding(vocab, d_model)  # (V, d_model)
            # (T, d_model) learned positions, unless RoPE gives positions inside attention
            self.pos = nn.Embedding(T, d_model) if options.get("rope") is None else None
            self.blocks = nn.ModuleList(Block(d_model, n_heads, seed=seed + i, mlp=mlp, **options)
                                        for i in range(n_layers))
            self.ln_f = nn.LayerNorm(d_model)
            self.head = nn.Linear(d_model, vocab)

    @classmethod
    def for_task(cls, task: Task, **kwargs) -> TinyTransformer:
        """A model sized for `task` (its vocab, T and causal flag); kwargs go to the constructor."""
        return cls(task.vocab, task.T, causal=task.causal, **kwargs)

    def forward(self, tokens: torch.Tensor, positions=None, caches=None) -> torch.Tensor:
        """tokens (B, T) int64 -> logits (B, T, vocab); positions (T,)|(B, T), one cache per layer."""
        self.check_tokens(tokens, positions, caches)
        x = self.tok(tokens)  # (B, T, d_model)
        if self.pos is not None:  # learned positions: pads (negative) take row 0, never read
            at = torch.arange(tokens.shape[1]) if positions is None else positions.clamp(min=0)
            x = x + self.pos(at)  # (B, T, d_model) + (T|B,T, d_model)
        for block, cache in zip(self.blocks, caches or [None] * len(self.blocks), strict=True):
            x = block(x, causal=self.causal, positions=positions, cache=cache)  # (B, T, d_model)
        return self.head(self.ln_f(x))  # (B, T, d_model) @ (d_model, V) -> (B, T, V)

    def new_caches(self, B: int, max_len: int) -> list:
        """One KV cache per layer for B sequences of up to max_len tokens."""
        return [block.attn.new_cache(B, max_len) for block in self.blocks]

    def check_tokens(self, tokens: torch.Tensor, positions=None, caches=None) -> None:
        """Raise a clear error for tokens that are not (B, T) int64 ids in 0..vocab-1."""
        require_shape("tokens", tokens, (("B", None), ("T", None)))
        if tokens.dtype != torch.long:
            raise TypeError(f"tokens must be int64 (torch.long), got {tokens.dtype}")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab):
            bad = int(tokens.max()) if int(tokens.max()) >= self.vocab else int(tokens.min())
            raise ValueError(f"tokens must be ids in 0..{self.vocab - 1} (vocab={self.vocab}), got {bad}")
        if caches is not None and len(caches) != len(self.blocks):
            raise ValueError(f"caches must hold one cache per layer ({len(self.blocks)}), got {len(caches)}")
        if self.pos is None:
            return
        T = tokens.shape[1]
        last = T - 1 if positions is None else int(positions.max())
        if caches and positions is None:  # positions follow the cache (given ones are what is read;
            last = max(last, len(caches[0]) + T - 1)  # a paged batch's rows differ in length)
        if last >= self.T:
            raise ValueError(f"tokens must have positions < {self.T} (the learned position table), "
                             f"got position {last}; a model with rope= runs at any length")


# ---- looking inside ---------------------------------------------------------------------------
def loss_fn(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over scored positions: logits (B, T, V), y (B, T) with IGNORE."""
    return F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=IGNORE)  # (B*T, V)


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of scored positions (y != IGNORE) where the model's top token equals y."""
    require_shape("y", y, (("B", x.shape[0]), ("T", x.shape[1])))
    scored = y != IGNORE  # (B, T)
    n = int(scored.sum())
    if n == 0:
        raise ValueError("y has no scored positions (every target is IGNORE)")
    pred = model(x).argmax(dim=-1)  # (B, T, V) -> (B, T)
    return float(((pred == y) & scored).sum()) / n


@torch.no_grad()
def attention_maps(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """The attention weights of every layer on tokens x (B, T): a list of (B, h, T, S)."""
    with capture_attention(model) as maps:  # manual path + hooks, restored afterwards
        model(x)
    return list(maps)


def key_weight(maps: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Mean weight each head puts on a chosen key per query: maps (B, h, T, S), keys (B, T) -> (h,).

    keys[b, t] is the key query t should read; queries with keys[b, t] < 0 are left out.
    """
    require_shape("maps", maps, (("B", None), ("h", None), ("T", None), ("S", None)))
    B, h, T, S = maps.shape
    require_shape("keys", keys, (("B", B), ("T", T)))
    live = keys >= 0  # (B, T)
    if not bool(live.any()):
        raise ValueError("keys has no query with a key to read (all < 0)")
    idx = keys.clamp(min=0)[:, None, :, None].expand(B, h, T, 1)  # (B, h, T, 1)
    w = maps.gather(-1, idx)[..., 0]  # (B, h, T): weight on the chosen key
    return (w * live[:, None]).sum(dim=(0, 2)) / live.sum()  # (h,)


def mirrored_key_weight(maps: torch.Tensor) -> torch.Tensor:
    """Mean weight each head puts on the mirrored key s = T-1-t: maps (B, h, T, T) -> (h,)."""
    require_shape("maps", maps, (("B", None), ("h", None), ("T", None), ("S", None)))
    B, _, T, S = maps.shape
    if S != T:
        raise ValueError(f"maps must be square (T == S) to have a mirror, got T={T}, S={S}")
    keys = (T - 1 - torch.arange(T)).expand(B, T)  # (B, T)
    return key_weight(maps, keys)


@contextlib.contextmanager
def ablate_uniform(model: nn.Module, layer: int, head: int) -> Iterator[None]:
    """Inside the block, head `head` of layer `layer` spreads its weight uniformly over its keys.

    How: its rows of the query projection (weight and bias) are set to zero, so every score
    q.k / sqrt(d_k) of that head is exactly 0 and softmax gives 1 / (number of allowed keys)
    to each allowed key; masked keys keep weight 0. The weights are restored on exit.
    """
    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < len(layers):
        raise ValueError(f"layer must be an int in [0, {len(layers) - 1}], got {layer!r}")
    m = layers[layer]
    if isinstance(head, bool) or not isinstance(head, int) or not 0 <= head < m.n_heads:
        raise ValueError(f"head must be an int in [0, {m.n_heads - 1}], got {head!r}")
    proj = m.qkv_proj if m.fused_qkv else m.q_proj  # q rows come first in the fused layout
    rows = slice(head * m.d_k, (head + 1) * m.d_k)  # this head's d_k output features of q
    saved = proj.weight[rows].detach().clone(), proj.bias[rows].detach().clone()
    with torch.no_grad():
        proj.weight[rows] = 0.0
        proj.bias[rows] = 0.0
    try:
        yield
    finally:
        with torch.no_grad():
            proj.weight[rows], proj.bias[rows] = saved


# ---- named checks: what the notebook asserts ---------------------------------------------------
def check_accuracy(acc: float, target: float = 0.99, what: str = "held-out accuracy") -> str:
    """Assert acc >= target; the message names the usual reasons a toy model falls short."""
    if not acc >= target:
        raise AssertionError(
            f"{what}: expected >= {target}, got {acc:.4f}. Likely causes: too few steps or too "
            f"small a learning rate; a plateau (attention still near uniform, e.g. weights drawn "
            f"too small for the width); or a model that cannot express the solution (induction "
            f"needs two layers)")
    return f"{what} {acc:.4f} >= {target}"


def check_head_weight(per_head: torch.Tensor, threshold: float = 0.9,
                      what: str = "the mirrored key") -> str:
    """Assert some head puts a mean weight >= threshold on `what`; per_head is (h,)."""
    best = int(per_head.argmax())
    top = float(per_head[best])
    if not top >= threshold:
        shown = ", ".join(f"{float(w):.3f}" for w in per_head)
        raise AssertionError(
            f"expected some head to put a mean weight >= {threshold} on {what}, got at most "
            f"{top:.3f} (per head: {shown}). Likely causes: the model is not trained yet, the "
            f"maps belong to another layer, or several heads share the work between them")
    return f"head {best} puts a mean weight of {top:.3f} >= {threshold} on {what}"


def check_ablation_drop(before: float, after: float, below: float = 0.5) -> str:
    """Assert an ablation took accuracy from `before` down below `below`: the head was needed."""
    if not after < below:
        raise AssertionError(
            f"expected accuracy to drop below {below} with the head made uniform, got "
            f"{before:.3f} -> {after:.3f}. Either another head does the same job (redundancy: "
            f"ablate them together), or this head was not the one carrying the task")
    return f"ablation: accuracy {before:.3f} -> {after:.3f} < {below}"


# ---- training ---------------------------------------------------------------------------------
@dataclass
class History:
    """What `train` recorded: losses per step, held-out accuracy and attention-map snapshots."""

    task: str
    losses: list[float] = field(default_factory=list)  # training loss after each step
    eval_steps: list[int] = field(default_factory=list)  # steps where the held-out set was scored
    eval_acc: list[float] = field(default_factory=list)
    snapshot_steps: list[int] = field(default_factory=list)  # step 0 = before training
    # one list per snapshot step, holding each layer's maps (n_probe, h, T, S)
    snapshots: list[list[torch.Tensor]] = field(default_factory=list)
    probe: torch.Tensor | None = None  # (B_probe, T) tokens the snapshots were taken on
    seconds: float = 0.0  # wall time of the loop (snapshots and evaluation included)

    @property
    def final_accuracy(self) -> float:
        """Held-out accuracy at the end of training."""
        return self.eval_acc[-1]

    def steps_to(self, target: float) -> int | None:
        """First evaluated step with held-out accuracy >= target, or None if never reached."""
        return next((s for s, a in zip(self.eval_steps, self.eval_acc, strict=True)
                     if a >= target), None)


def train(model: TinyTransformer, task: Task, steps: int, lr: float = 3e-3, batch: int = 64,
          seed: int = 0, eval_every: int = 50, snapshot_every: int = 25, n_eval: int = 512,
          n_probe: int = 4, weight_decay: float = 0.01, progress: bool = True) -> History:
    """Train `model` on fresh batches of `task` with AdamW and a cosine schedule; return the History.

    Training batches come from a generator seeded with `seed`; the held-out set (n_eval rows)
    and the probe rows of the snapshots from `seed + 1`, another stream. Step 0 (before any
    update), every `eval_every` / `snapshot_every` steps and the last step are recorded.
    """
    _check_train_args(model, task, steps, lr, batch, eval_every, snapshot_every)
    gen = torch.Generator().manual_seed(seed)  # training batches
    held = torch.Generator().manual_seed(seed + 1)  # held-out set and probe, never trained on
    x_eval, y_eval = task.batch(held, n_eval)  # (n_eval, T) each
    hist = History(task.name, probe=task.batch(held, n_probe)[0])  # probe (n_probe, T)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    # cosine decay from lr to 0: large steps find the pattern, small ones settle on it
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: 0.5 * (1.0 + math.cos(math.pi * i / steps)))
    start = time.perf_counter()
    for step in _progress(steps + 1, task.name, progress):  # step 0: record the untrained model
        if step > 0:
            x, y = task.batch(gen, batch)  # (batch, T) each
            loss = loss_fn(model(x), y)  # logits (batch, T, V) against targets (batch, T)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            hist.losses.append(loss.item())
        if step % eval_every == 0 or step == steps:
            hist.eval_steps.append(step)
            hist.eval_acc.append(accuracy(model, x_eval, y_eval))
        if step % snapshot_every == 0 or step == steps:
            hist.snapshot_steps.append(step)
            hist.snapshots.append(attention_maps(model, hist.probe))  # L x (n_probe, h, T, S)
    hist.seconds = time.perf_counter() - start
    return hist


def _check_train_args(model, task: Task, steps, lr, batch, eval_every, snapshot_every) -> None:
    """Validate train()'s arguments: positive counts, a usable lr, a model sized for the task."""
    for name, value in (("steps", steps), ("batch", batch), ("eval_every", eval_every),
                        ("snapshot_every", snapshot_every)):
        require_int(name, value)
    if isinstance(lr, bool) or not isinstance(lr, int | float) or not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a finite number > 0, got {lr!r}")
    if not isinstance(model, TinyTransformer):
        raise TypeError(f"model must be a TinyTransformer, got {type(model).__name__}")
    if (model.vocab, model.T, model.causal) != (task.vocab, task.T, task.causal):
        raise ValueError(f"model is built for vocab={model.vocab}, T={model.T}, causal="
                         f"{model.causal} but task {task.name!r} has vocab={task.vocab}, "
                         f"T={task.T}, causal={task.causal} (build it with "
                         f"TinyTransformer.for_task(task))")


def _progress(total: int, name: str, show: bool):
    """range(total) with a progress bar named after the task (see progress_bar)."""
    return progress_bar(range(total), f"training: {name}", show)


def progress_bar(items: Iterable, desc: str, show: bool = True, total: int | None = None):
    """`items` wrapped in a tqdm bar: in a notebook one plain-text line updated in place.

    tqdm's text bar writes to stderr, which JupyterLab paints red, and a saved notebook keeps
    every state it printed. In a notebook the bar goes to a `_LatestLine` instead: one text
    output that each update replaces, so the saved notebook, nbval and a static page see only
    its last state. Elsewhere (a terminal, a script) it is tqdm's usual bar.
    """
    from tqdm import tqdm

    file = _LatestLine() if show and _in_notebook() else None
    return tqdm(items, desc=desc, total=total, disable=not show, mininterval=1.0, file=file)


def _in_notebook() -> bool:
    """True inside a Jupyter kernel (an IPython shell with a kernel attached)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return getattr(get_ipython(), "kernel", None) is not None


class _LatestLine:
    """A file for tqdm that shows only the bar's latest state, in one notebook output."""

    encoding = "utf-8"  # tqdm draws its unicode bar only for a file that says it takes unicode

    def __init__(self):
        from IPython.display import display

        self._handle = display({"text/plain": ""}, raw=True, display_id=True)
        self._line = ""

    def write(self, text: str) -> int:
        """Keep what follows the last carriage return (tqdm's redraw), and show it."""
        self._line = (self._line + text).rsplit("\r", 1)[-1]
        shown = self._line.strip("\n")
        if shown:
            self._handle.update({"text/plain": shown}, raw=True)
        return len(text)

    def flush(self) -> None:
        """Nothing is buffered."""


# ---- initialisation, measured -----------------------------------------------------------------
SCHEMES = {
    "ours": "N(0, 1/fan_in): 1/sqrt(d_model) for attention's square matrices (the course's draw)",
    "xavier": "Xavier/Glorot uniform, U(-a, a) with a = sqrt(6 / (fan_in + fan_out))",
    "gpt2": "N(0, 0.02^2) for every weight, whatever the width (GPT-2)",
    "gpt2_scaled": "GPT-2's 0.02, and residual out-projections scaled by 1/sqrt(N residual branches)",
}


def residual_projections(model: nn.Module) -> list[nn.Linear]:
    """The Linear layers that write into a residual stream: attention out_proj, an MLP's last Linear."""
    outs = [m.out_proj for m in model.modules() if isinstance(m, MultiHeadAttention)]
    outs += [b.mlp[-1] for b in model.modules() if isinstance(b, Block) and b.mlp is not None]
    return outs


@torch.no_grad()
def init_weights(model: nn.Module, scheme: str, seed: int = 0) -> nn.Module:
    """Redraw every weight of `model` (a TinyTransformer or a stack of attention layers) by `scheme`.

    Linear weights follow SCHEMES; biases become 0; LayerNorms 1 and 0; embeddings N(0, 1)
    (N(0, 0.02^2) for the GPT-2 schemes, as GPT-2 does). For "gpt2_scaled" the residual
    projections get std 0.02 / sqrt(N), N = len(residual_projections(model)): two per block
    with an MLP, so 0.02 / sqrt(2 L) as in GPT-2. Returns the model.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {sorted(SCHEMES)}, got {scheme!r}")
    g = torch.Generator().manual_seed(seed)
    gpt2 = scheme.startswith("gpt2")
    for m in model.modules():
        if isinstance(m, nn.Linear):
            fan_out, fan_in = m.weight.shape  # nn.Linear stores (out, in)
            if scheme == "ours":
                nn.init.normal_(m.weight, 0.0, 1.0 / math.sqrt(fan_in), generator=g)
            elif scheme == "xavier":
                nn.init.xavier_uniform_(m.weight, generator=g)
            else:
                nn.init.normal_(m.weight, 0.0, 0.02, generator=g)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, 0.02 if gpt2 else 1.0, generator=g)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    if scheme == "gpt2_scaled":
        outs = residual_projections(model)
        for lin in outs:  # each residual branch adds less, so N of them add up to about one
            nn.init.normal_(lin.weight, 0.0, 0.02 / math.sqrt(len(outs)), generator=g)
    return model


class AttentionStack(nn.Module):
    """`depth` attention layers in a row, bare (x -> MHA(x)) or pre-LN residual (x -> x + MHA(LN(x)))."""

    def __init__(self, depth: int, d_model: int, n_heads: int, residual: bool, seed: int = 0):
        super().__init__()
        self.residual = bool(residual)
        self.layers = nn.ModuleList(MultiHeadAttention(d_model, n_heads, seed=seed + i)
                                    for i in range(require_int("depth", depth)))
        self.norms = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(depth if residual else 0))

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """x (B, T, d_model) -> the activations after each layer, depth x (B, T, d_model)."""
        outs = []
        for i, layer in enumerate(self.layers):
            x = x + layer(self.norms[i](x)) if self.residual else layer(x)  # (B, T, d_model)
            outs.append(x)
        return outs


@functools.lru_cache(maxsize=2)
def _stack(depth: int, d_model: int, n_heads: int, residual: bool) -> AttentionStack:
    """One AttentionStack per shape, built once: init_weights redraws all of it on every use."""
    return AttentionStack(depth, d_model, n_heads, residual)


@torch.no_grad()
def stacked_variance(scheme: str, depth: int = 12, d_model: int = 768, n_heads: int = 12,
                     T: int = 32, B: int = 8, residual: bool = False, seed: int = 0
                     ) -> list[float]:
    """Variance of the activations of `depth` stacked attention layers initialised by `scheme`.

    Setup: an AttentionStack, bare (x -> MHA(x)) or, with residual=True, pre-LN residual
    branches (x -> x + MHA(LN(x))). Input x ~ N(0, 1) of shape (B, T, d_model); returns
    depth + 1 numbers: the input's variance, then each layer's output variance (over all
    B * T * d_model entries).
    """
    stack = init_weights(_stack(depth, d_model, n_heads, residual), scheme, seed)
    x = torch.randn(B, T, d_model, generator=torch.Generator().manual_seed(seed + 1))
    return [float(x.var())] + [float(a.var()) for a in stack(x)]
