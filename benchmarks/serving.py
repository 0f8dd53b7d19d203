"""Serving many requests: paged memory, continuous against static batching, a shared prefix. One run.

    python benchmarks/serving.py           # the three figures (a few minutes on 2 cores)
    python benchmarks/serving.py --quick   # smaller workloads, a smoke run (writes nothing)

All on the tiny model of 17_generation.ipynb as torch runs it (`mha.training.train.TinyTransformer`,
float32, SDPA, one thread: d_model 32, 2 layers, h 4, h_kv 2, RoPE), the paged cache of
`mha.inference.paged` in blocks of 16 (vLLM's default) and the scheduler of
`mha.inference.serving`. Every figure comes from a real run, and each run's tokens are checked
equal across the ways compared.

(a) Memory: at every step of a continuous-batching run over mixed prompt (16..512) and output
    (16..256) lengths, the fraction of reserved cache slots that hold a real token: paged
    (blocks in use x 16) against a contiguous reservation per running request of max_len (the
    longest prompt + the longest output the workload allows, as 13_kv_cache.ipynb counts it) or
    of its own prompt + the longest output. Issue 30's goal: paged >= 95%.
(b) Throughput: generated tokens per second, continuous batching against static batching
    (each batch of 8 waits for its longest request) at the same max batch of 8, output lengths
    varying 4x (16..64): uniform, and a skewed mix (most short, a few long). Static batching
    twice: `generate` with a dense cache, and the same paged scheduler with no refill (same
    kernels, only the policy differs). min / median / max over interleaved repeats; ratios of
    medians within this run. Model calls too: they do not depend on the machine.
(c) Prefix sharing: the cache bytes 32 requests with a common 256-token system prompt hold at
    their peak, the prefix stored once (forked) against a copy per request.

Writes benchmarks/results/serving.md and serving.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import statistics

import numpy as np
import torch
from tqdm.auto import tqdm

from mha.inference import paged, serving
from mha.inference.serving import Request, Scheduler
from mha.perf import bench
from mha.training import train

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
BLOCK = 16  # slots per block, vLLM's default
MAX_BATCH = 8
VOCAB = 64
CONT = "continuous batching (paged)"
CONT_MIXED = "continuous batching (paged, mixed: one call a step)"
PAGED_STATIC = "static batching (paged, no refill)"
DENSE = "static batching (generate, dense cache)"


def tiny() -> train.TinyTransformer:
    """The tiny decoder of 17_generation.ipynb (random weights: speed and memory ignore them)."""
    model = train.TinyTransformer(vocab=VOCAB, T=16, d_model=32, n_heads=4, n_layers=2,
                                  causal=True, seed=0, n_kv_heads=2, rope="half")
    return model.eval()


def workload(seed: int, n: int, prompt: tuple[int, int], out: list[int] | tuple[int, int],
             ) -> list[Request]:
    """n requests, all arriving at step 0: prompt lengths uniform in `prompt`; output lengths
    uniform in `out` (a (lo, hi) tuple) or drawn from the list `out` (a skewed mix)."""
    rng = np.random.default_rng(seed)
    reqs = []
    for i in range(n):
        length = int(rng.integers(prompt[0], prompt[1] + 1))
        n_new = int(rng.integers(out[0], out[1] + 1)) if isinstance(out, tuple) else \
            int(rng.choice(out))
        reqs.append(Request(i, rng.integers(0, VOCAB, length).tolist(), n_new))
    return reqs


def scheduler(model, reqs: list[Request], n_blocks: int, max_batch: int, chunk: int,
              prefix: list[int] | None = None, refill: bool = True,
              mixed: bool = False) -> Scheduler:
    """A scheduler on a fresh pool with the requests queued."""
    pool = paged.TorchBlockPool.for_model(model, n_blocks, BLOCK)
    s = Scheduler(model, pool, max_batch=max_batch, chunk=chunk, prefix=prefix, refill=refill,
                  mixed=mixed)
    for r in reqs:
        s.add(r.prompt, r.n_new, r.arrival)
    return s


def blocks_for(reqs: list[Request], max_batch: int) -> int:
    """A pool that holds the max_batch longest requests at once: nothing is ever preempted."""
    sizes = sorted(math.ceil((len(r.prompt) + r.n_new - 1) / BLOCK) for r in reqs)
    return sum(sizes[-max_batch:])


# ---- (a) memory -------------------------------------------------------------------------------
def memory(model, quick: bool) -> dict:
    """Slot use at every step of a continuous-batching run: paged against contiguous."""
    max_batch = 16
    reqs = workload(1, 24 if quick else 64, (16, 512), (16, 256))
    s = scheduler(model, reqs, blocks_for(reqs, max_batch), max_batch, chunk=128)
    s.run(progress=True)
    max_len = 512 + 256  # the longest prompt + the longest output the workload allows
    own = {r.rid: len(r.prompt) + 256 for r in reqs}
    steps = [rec for rec in s.timeline if rec.running]
    ways = {f"contiguous, max_len = {max_len} each": [len(rec.running) * max_len for rec in steps],
            "contiguous, own prompt + 256 each": [sum(own[i] for i in rec.running) for rec in steps],
            f"paged, blocks of {BLOCK}": [rec.blocks_in_use * BLOCK for rec in steps]}
    held = [rec.tokens_held for rec in steps]
    rows = {}
    for way, slots in ways.items():
        per_step = [h / n for h, n in zip(held, slots, strict=True)]
        rows[way] = dict(overall=sum(held) / sum(slots), min=min(per_step),
                         median=statistics.median(per_step), max=max(per_step))
    return dict(requests=len(reqs), max_batch=max_batch, steps=len(steps), rows=rows,
                mean_tokens=statistics.mean(len(r.prompt) + r.n_new - 1 for r in reqs))


# ---- (b) throughput ---------------------------------------------------------------------------
def throughput(model, reqs: list[Request], repeats: int) -> dict:
    """Tokens per second and model calls: continuous, static (dense generate), static (paged)."""
    n_blocks = blocks_for(reqs, MAX_BATCH)
    chunk = max(len(r.prompt) for r in reqs)  # each prompt in one prefill call, as static does

    def continuous() -> tuple[dict, int]:
        """The brief's scheduler: one prefill call per admitted prompt, ONE decode call."""
        s = scheduler(model, reqs, n_blocks, MAX_BATCH, chunk)
        return s.run(progress=False), s.model_calls

    def continuous_mixed() -> tuple[dict, int]:
        """Prefill chunks in the decode call: one model call a step."""
        s = scheduler(model, reqs, n_blocks, MAX_BATCH, chunk, mixed=True)
        return s.run(progress=False), s.model_calls

    def static_paged() -> tuple[dict, int]:
        """The same paged scheduler, admitting only into an empty batch."""
        s = scheduler(model, reqs, n_blocks, MAX_BATCH, chunk, refill=False)
        return s.run(progress=False), s.model_calls

    def static_dense() -> tuple[dict, int]:
        """generate with a dense cache, batch by batch."""
        return serving.static_batching(model, reqs, MAX_BATCH)

    fns = {CONT: continuous, CONT_MIXED: continuous_mixed, PAGED_STATIC: static_paged,
           DENSE: static_dense}
    results = {name: fn() for name, fn in fns.items()}  # untimed: the tokens must agree
    first = next(iter(results.values()))[0]
    for name, (out, _) in results.items():
        assert out == first, f"{name} gave other tokens than continuous batching"
    timings = bench.time_interleaved(fns, repeats=repeats, warmup=0)
    tokens = sum(r.n_new for r in reqs)
    rows = {name: dict(calls=results[name][1], tokens_per_s=[tokens / t.max_s, tokens / t.median_s,
                                                             tokens / t.min_s])
            for name, t in timings.items()}
    return dict(requests=len(reqs), tokens=tokens, rows=rows,
                n_new=sorted(r.n_new for r in reqs))


# ---- (c) prefix sharing -----------------------------------------------------------------------
def prefix_sharing(model, n: int = 32, prefix_len: int = 256, rest: int = 16,
                   n_new: int = 16) -> dict:
    """Peak cache bytes of n requests that start with one prefix: shared (forked) against not."""
    rng = np.random.default_rng(2)
    prefix = rng.integers(0, VOCAB, prefix_len).tolist()
    reqs = [Request(i, prefix + rng.integers(0, VOCAB, rest).tolist(), n_new) for i in range(n)]
    n_blocks = n * math.ceil((prefix_len + rest + n_new - 1) / BLOCK) + 1
    out = {}
    for way, pre in (("a copy per request", None), ("shared (forked, refcounted)", prefix)):
        s = scheduler(model, reqs, n_blocks, n, chunk=prefix_len + rest, prefix=pre)
        tokens = s.run(progress=False)
        peak = max(rec.blocks_in_use for rec in s.timeline)
        per_block = s.pool.nbytes // s.pool.n_blocks
        out[way] = dict(blocks=peak, bytes=peak * per_block, tokens=tokens)
    a, b = out.values()
    assert a["tokens"] == b["tokens"], "sharing the prefix changed the tokens"
    for v in out.values():
        del v["tokens"]
    return dict(requests=n, prefix=prefix_len, rest=rest, n_new=n_new, rows=out,
                bytes_per_block=per_block, prefix_blocks=math.ceil(prefix_len / BLOCK))


# ---- the report -------------------------------------------------------------------------------
def pct(x: float) -> str:
    """0.978 -> '97.8%'."""
    return f"{100 * x:.1f}%"


def report(mem: dict, thr: dict, pre: dict, machine: str, load: float) -> str:
    """Markdown for benchmarks/results/serving.md."""
    out = ["# Serving: paged memory, continuous batching, a shared prefix", "",
           f"Machine: {machine}, one thread; load average {load:.1f} when the run started "
           f"(a shared machine: compare the ratios within this run, not the times). Model: "
           f"the tiny decoder of 17_generation.ipynb as "
           f"torch runs it (TinyTransformer, float32, SDPA; d_model 32, 2 layers, h 4, h_kv 2, "
           f"RoPE, vocab {VOCAB}), random weights; paged cache in blocks of {BLOCK}. Every "
           f"figure is from a real run; the tokens agree across the ways compared (asserted).", "",
           "## (a) Memory: reserved cache slots that hold a real token", "",
           f"{mem['requests']} requests, prompts 16..512 and outputs 16..256 tokens (uniform; "
           f"{mem['mean_tokens']:.0f} tokens fed per request on average), continuous batching "
           f"with up to {mem['max_batch']} running, {mem['steps']} steps. At every step: tokens the "
           f"running requests hold / slots reserved for them. 'overall' sums both over the run; "
           f"min / median / max are over the steps. Goal: paged >= 95%.", "",
           "| reservation | overall | min / median / max over steps |", "|---|---|---|"]
    for way, r in mem["rows"].items():
        out.append(f"| {way} | {pct(r['overall'])} | {pct(r['min'])} / {pct(r['median'])} / "
                   f"{pct(r['max'])} |")
    paged_use = mem["rows"][f"paged, blocks of {BLOCK}"]["overall"]
    out += ["", f"Paged: {pct(paged_use)} of the slots it reserves hold a token (goal 95%: "
            f"{'met' if paged_use >= 0.95 else 'NOT met'}); a sequence wastes at most "
            f"{BLOCK - 1} slots, its last block's unfilled part.", "",
            "## (b) Throughput: continuous against static batching", "",
            f"Generated tokens per second, max batch {MAX_BATCH} for all, prompts 8..32 tokens "
            f"(each prefilled in one call), every request arriving at once. Static batching: "
            f"batches of {MAX_BATCH} in arrival order, each running until its longest request "
            f"is done (finished rows keep computing). tokens/s min / median / max over "
            f"interleaved repeats; ratios of medians within this run.", ""]
    for name, t in thr.items():
        rows = t["rows"]
        out += [f"### {name}: {t['requests']} requests, {t['tokens']} tokens to generate", "",
                "| way | model calls | ms per call (median) | tokens/s min / median / max | "
                "continuous / this, tokens/s (mixed) |", "|---|---|---|---|---|"]
        best = rows[CONT_MIXED]["tokens_per_s"][1]
        for way, r in rows.items():
            lo, med, hi = r["tokens_per_s"]
            out.append(f"| {way} | {r['calls']} | {1e3 * t['tokens'] / med / r['calls']:.2f} | "
                       f"{lo:,.0f} / {med:,.0f} / {hi:,.0f} | "
                       f"{rows[CONT]['tokens_per_s'][1] / med:.2f}x ({best / med:.2f}x) |")
        out.append("")
    out += thr_note(thr)
    rows = pre["rows"]
    a, b = rows["a copy per request"], rows["shared (forked, refcounted)"]
    out += [f"## (c) Prefix sharing: {pre['requests']} requests with a common "
            f"{pre['prefix']}-token prefix", "",
            f"{pre['requests']} requests, each the {pre['prefix']}-token prefix + {pre['rest']} "
            f"tokens of its own, {pre['n_new']} new tokens, all running at once; peak blocks in "
            f"use x {pre['bytes_per_block']:,} bytes a block (K and V, both layers).", "",
            "| prefix stored | peak blocks | bytes |", "|---|---|---|",
            f"| a copy per request | {a['blocks']} | {a['bytes']:,} |",
            f"| shared (forked, refcounted) | {b['blocks']} | {b['bytes']:,} |", "",
            f"Sharing stores {a['bytes'] / b['bytes']:.1f}x less ({a['blocks']} blocks against "
            f"{b['blocks']}: the prefix's {pre['prefix_blocks']} blocks once, then "
            f"{(b['blocks'] - pre['prefix_blocks']) / pre['requests']:g} of each request's own, "
            f"against {a['blocks'] / pre['requests']:g} each unshared). The ratio is the same for "
            f"any model: the bytes of a block are 2 x layers x h_kv x {BLOCK} x d_k x bytes per "
            f"number.", ""]
    return "\n".join(out)


def thr_note(thr: dict) -> list[str]:
    """What the throughput figures say, against issue 30's goal of 2x (all numbers from this run)."""
    lines = []
    for name, t in thr.items():
        rows = t["rows"]
        med = {way: r["tokens_per_s"][1] for way, r in rows.items()}
        calls = {way: r["calls"] for way, r in rows.items()}
        per_call = {way: t["tokens"] / med[way] / calls[way] for way in rows}
        full = math.ceil(t["tokens"] / MAX_BATCH)
        for cont in (CONT, CONT_MIXED):
            lines.append(
                f"- {name}, {cont}: {calls[cont]} model calls against static batching's "
                f"{calls[DENSE]} ({calls[DENSE] / calls[cont]:.2f}x fewer; a full batch at every "
                f"call would need {full}); tokens per second {med[cont] / med[DENSE]:.2f}x "
                f"static batching with `generate` (goal 2x: "
                f"{'met' if med[cont] >= 2 * med[DENSE] else 'not met'}) and "
                f"{med[cont] / med[PAGED_STATIC]:.2f}x static batching on the same paged kernels.")
        lines.append(f"- {name}: a paged call costs {per_call[CONT_MIXED] / per_call[DENSE]:.2f}x a "
                     f"dense-cache call here ({1e3 * per_call[CONT_MIXED]:.2f} against "
                     f"{1e3 * per_call[DENSE]:.2f} ms, medians).")
    lines += ["", "Why: on this tiny model a call costs about the same at any batch up to 8 "
              "(Python and per-layer overhead, not arithmetic), so tokens per second follow the "
              "number of calls, times what each call costs. Static batching pays max(n_new) "
              "calls per batch of 8 and keeps computing the rows that finished; continuous "
              "batching refills them, so it approaches a full batch at every call. With outputs "
              "uniform in 16..64 the longest of 8 is about 59 and the mean 40, so even a perfect "
              "scheduler saves at most about 1.5x: the 2x goal cannot be met on that mix at this "
              "batch size, by any scheduler. The skewed mix (most answers short, a few long, as "
              "chat traffic is; chosen for that, and stated) nearly always puts a long answer in "
              "each static batch, and the saving in calls reaches about 2x. Without `mixed`, each "
              "admitted prompt costs one more call of its own (the brief's design: the lesson's "
              "timeline shows it), which eats part of the saving; `mixed=True` puts the prefill "
              "chunks in the decode call, left-padded, as vLLM's chunked prefill does. What is "
              "left between calls saved and tokens per second is the paged cache's cost per call "
              "on the host (writing through the block tables and gathering every row's blocks, "
              "in Python, per layer) against the dense cache's one slice.", ""]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small workloads, a smoke run")
    args = parser.parse_args()
    torch.set_num_threads(1)
    load = os.getloadavg()[0]
    model = tiny()
    n = 16 if args.quick else 64
    cases = {"outputs uniform in 16..64": workload(3, n, (8, 32), (16, 64)),
             "skewed: outputs 16 (80%) or 64 (20%)": workload(4, n, (8, 32), [16] * 4 + [64])}
    with torch.no_grad():
        mem = memory(model, args.quick)
        thr = {name: throughput(model, reqs, repeats=2 if args.quick else 5)
               for name, reqs in tqdm(cases.items(), desc="throughput")}
        pre = prefix_sharing(model, n=8 if args.quick else 32)
    machine = bench.machine_line()
    text = report(mem, thr, pre, machine, load)
    print(text)
    if not args.quick:
        (RESULTS / "serving.md").write_text(text)
        data = dict(machine=machine, load_average=load, memory=mem, throughput=thr, prefix=pre)
        (RESULTS / "serving.json").write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
