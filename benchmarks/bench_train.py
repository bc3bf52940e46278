"""SPLADE training with the Sparton head against the PyTorch eager head and torch.compile of it, on one GPU.

A training step: a transformer body (random weights from a transformers config, no download) encodes a batch of
queries (16-32 tokens, padded to 32) and of their positive documents (128-256 tokens, padded to 256); the MLM
transform (dense, gelu, LayerNorm) gives the hidden states; the head pools them into SPLADE vectors with the decoder
tied to the word embeddings; the loss is in-batch-negative cross-entropy over q·dᵀ plus the FLOPS regularizer
(λ_q = 3e-4, λ_d = 1e-4); AdamW (fused) steps. Precision: bf16 autocast over fp32 master weights (the optimizer and
the weights stay fp32, matmuls run in bf16). The step casts the decoder to bf16 once for both heads of a step (what
autocast's weight cache does inside F.linear).

Heads: "sparton" (sparton.splade_max_packed on the real tokens only, gathered with the index and cu_seqlens a collator
builds with the batch: fused forward recording the argmax, fused backward), "eager" (F.linear → log1p(relu) → × mask
→ amax over the padded sequence, as SPLADE and sentence-transformers do), "compile" (torch.compile of the eager head,
dynamic=False). Bodies: BERT-base (V = 30,522) and XLM-R-base (V = 250,002).

Sections (--sections, default all; per body in this order; the compiled head's after every body's others):
  step    step time at --step-batches (median of --steps after a warm-up over every batch of the timed data), each
          head, with a breakdown: CUDA events at the phase marks (body and head forward of queries and documents,
          loss, head and body backward through tensor hooks, the decoder's cast and gradient, optimizer) and the host's
          clock at the same marks, and one profiled step whose kernel times, cut at marker kernels, give each phase's
          busy time: a phase whose event time exceeds its busy time had the device waiting for the host;
  head    the head alone, forward + backward on the step's hidden states (queries and documents), against the bf16
          FLOP floor of the real tokens (2·T·H·V forward, 4·T·H·V backward) at the bf16 8192³ matmul rate of this run;
  memory  peak memory of the head's forward + backward on the step's documents beyond its inputs (hidden states and
          decoder as the caller passes them), its [B, V] output, the inputs' gradients and (Sparton) the int32 argmax
          (4·B·V bytes, reported); for Sparton also the op alone on its bf16 packed tokens: the kernels' own memory;
  batch   the largest batch whose training step fits the GPU, sparton and eager (doubling, then bisection to 5%;
          capped in batch and seconds), eager probed at Sparton's largest batch, then the step timed at the batch of
          the rule "eager's largest batch less 10%, a multiple of 8" (sparton and eager);
  curves  (first, once) a tiny BERT (2 layers, H = 128, V = 30,522) trained --curve-steps steps on synthetic
          query/document pairs from the same initial weights, data and dropout masks with the Sparton head, the eager
          head and the eager head in fp32 (autocast off inside it): Sparton against eager next to the noise floor of
          bf16 rounding, fp32 eager against eager, per step and on curves smoothed over --smooth steps.
--checkpoint-body recomputes the body's activations in the backward (transformers' gradient checkpointing, for every
head): a body's activations otherwise bound the largest batch of a head that needs little memory, as Sparton's does.
Writes results/train_<GPU>.json, .csv and .png (train_<GPU>_checkpointed.* with --checkpoint-body), each with its
provenance.

    python benchmarks/bench_train.py                     # everything, a few minutes on one GPU
    python benchmarks/bench_train.py --sections step,curves --quick
    python benchmarks/bench_train.py --sections batch --checkpoint-body --batch-cap 8192
    python benchmarks/bench_train.py --device cpu --quick --out /tmp/x   # smoke run of the code paths (reference head)
"""

from __future__ import annotations

import argparse
import copy
import csv
import gc
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
for path in (ROOT, ROOT / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.append(str(path))

from provenance import csv_line, png_metadata, provenance, with_provenance  # noqa: E402

import sparton  # noqa: E402

SECTIONS = ("step", "head", "memory", "batch", "curves")
QUERY_LEN, DOC_LEN = 32, 256
LAMBDA_Q, LAMBDA_D = 3e-4, 1e-4
# (name, transformers config class name, vocabulary); --step-batches gives each its step-timing batch
BODIES = (("bert-base", "BertConfig", 30_522), ("xlm-r-base", "XLMRobertaConfig", 250_002))
# phase marks of a step, in issue order for the forward; the backward's follow the autograd engine's order
COARSE = {"decoder cast": "decoder", "body fwd q": "body fwd", "head fwd q": "head fwd", "body fwd d": "body fwd",
          "head fwd d": "head fwd", "loss fwd": "loss", "loss bwd": "loss", "head bwd d": "head bwd",
          "body bwd d": "body bwd", "head bwd q": "head bwd", "body bwd q": "body bwd", "decoder grad": "decoder",
          "optimizer": "optimizer"}
COARSE_ORDER = ("body fwd", "head fwd", "loss", "head bwd", "body bwd", "decoder", "optimizer")
MARKER_CYCLES = 1000  # a spin kernel of ~1 µs marks a phase in the profiler's kernel list


def log(*parts: object) -> None:
    print(*parts, flush=True)


# ---------------------------------------------------------------------------------------------------- model


class Splade(nn.Module):
    """Body → MLM transform → hidden states; the decoder is the word embedding matrix (tied, as in BERT's and
    XLM-R's MLM heads), plus a bias."""

    def __init__(self, config) -> None:
        from transformers import AutoModel

        super().__init__()
        self.body = AutoModel.from_config(config, add_pooling_layer=False)
        size = config.hidden_size
        self.dense = nn.Linear(size, size)
        self.norm = nn.LayerNorm(size, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    @property
    def decoder(self) -> Tensor:
        return self.body.get_input_embeddings().weight

    def hidden(self, ids: Tensor, mask: Tensor) -> Tensor:
        h = self.body(input_ids=ids, attention_mask=mask).last_hidden_state
        return self.norm(F.gelu(self.dense(h)))


def checkpoint_body(body: nn.Module) -> None:
    """Activation checkpointing of every layer, non-reentrant (activation_checkpointing_enable, or its older name
    where a transformers release lacks it)."""
    enable = getattr(body, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        body.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def make_config(kind: str, vocab: int, tiny: bool):
    import transformers

    size = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 512} if tiny \
        else {}
    extra = {"max_position_embeddings": 514, "type_vocab_size": 1} if kind == "XLMRobertaConfig" else {}
    return getattr(transformers, kind)(vocab_size=vocab, **size, **extra)


class Side(NamedTuple):
    """One side of a batch (queries or documents), as a collator hands it over."""

    ids: Tensor  # [B, L]
    mask: Tensor  # [B, L] int64, a prefix of each row
    index: Tensor  # [T] int64: flat positions b·L + s of the real tokens, in order (the packed head's rows)
    cu: Tensor  # [B+1] int32 cu_seqlens of the real tokens
    length: int  # L, the packed head's max_seqlen hint

    @property
    def tokens(self) -> int:
        return self.index.numel()


def make_side(ids: Tensor, lengths: Tensor, device: str) -> Side:
    seq = ids.shape[1]
    mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = lengths.cumsum(0)
    return Side(ids.to(device), mask.to(device), mask.reshape(-1).nonzero().squeeze(1).to(device), cu.to(device), seq)


# ---------------------------------------------------------------------------------------------------- heads


def eager_core(hidden: Tensor, weight: Tensor, bias: Tensor, mask: Tensor) -> Tensor:
    logits = F.linear(hidden, weight, bias)  # [B, L, V]: what the memory goes to
    return (torch.log1p(torch.relu(logits)) * mask.unsqueeze(-1)).amax(dim=1)


class Head:
    """A head as the step calls it: (hidden [B, L, H] fp32, decoder, bias fp32, side) → [B, V] fp32. fp32_decoder:
    it takes the fp32 master decoder instead of the step's bf16 copy."""

    def __init__(self, name: str, fn: Callable, fp32_decoder: bool = False) -> None:
        self.name, self.fn, self.fp32_decoder = name, fn, fp32_decoder

    def __call__(self, hidden: Tensor, weight: Tensor, bias: Tensor, side: Side) -> Tensor:
        return self.fn(hidden, weight, bias, side)


def sparton_fn(hidden: Tensor, weight: Tensor, bias: Tensor, side: Side) -> Tensor:
    """The real tokens only, in the decoder's dtype (the kernel takes one dtype for both): the gather and the cast
    are the step's; their backward (index_add: no sort, no host sync) scatters dH into the padded hidden states'
    gradient."""
    tokens = hidden.reshape(-1, hidden.shape[-1]).index_select(0, side.index).to(weight.dtype)
    return sparton.splade_max_packed(tokens, weight, bias, side.cu, side.length)


def eager_fn(hidden: Tensor, weight: Tensor, bias: Tensor, side: Side) -> Tensor:
    return eager_core(hidden, weight, bias, side.mask)


def eager32_fn(hidden: Tensor, weight: Tensor, bias: Tensor, side: Side) -> Tensor:
    with torch.autocast("cuda", enabled=False):
        return eager_core(hidden.float(), weight.float(), bias.float(), side.mask)


def make_heads(names: tuple[str, ...]) -> dict[str, Head]:
    heads = {}
    for name in names:
        if name == "sparton":
            heads[name] = Head(name, sparton_fn)
        elif name == "eager":
            heads[name] = Head(name, eager_fn)
        elif name == "eager32":
            heads[name] = Head(name, eager32_fn, fp32_decoder=True)
        elif name == "compile":
            compiled = torch.compile(eager_core, dynamic=False)
            heads[name] = Head(name, lambda h, w, b, side, c=compiled: c(h, w, b, side.mask))
        else:
            raise ValueError(f"unknown head {name!r}")
    return heads


# ---------------------------------------------------------------------------------------------------- data, step


def random_batch(batch: int, vocab: int, device: str, generator: torch.Generator, quick: bool = False):
    """Queries of 16-32 tokens padded to 32, documents of 128-256 padded to 256 (shorter in a CPU smoke run)."""
    qlen, dlen = (8, 16) if quick and device == "cpu" else (QUERY_LEN, DOC_LEN)

    def side(length: int) -> Side:
        ids = torch.randint(5, vocab, (batch, length), generator=generator)
        return make_side(ids, torch.randint(length // 2, length + 1, (batch,), generator=generator), device)

    return side(qlen), side(dlen)


def splade_loss(q: Tensor, d: Tensor) -> Tensor:
    """In-batch negatives: query i's positive is document i, every other document a negative; plus FLOPS."""
    scores = q @ d.T
    ce = F.cross_entropy(scores, torch.arange(q.shape[0], device=q.device))
    flops_q = (q.mean(0) ** 2).sum()
    flops_d = (d.mean(0) ** 2).sum()
    return ce + LAMBDA_Q * flops_q + LAMBDA_D * flops_d


class Phases:
    """The marks of one step: at each, a CUDA event (the device's timeline: a phase's event time includes the
    device's idle gaps, where it waits for the host) and the host's clock; with markers, a spin kernel that locates
    the mark among the profiler's kernels. A mark starts the phase of its name; backward marks come from tensor
    hooks, which run on the autograd engine's thread just before the node that takes the tensor's gradient."""

    def __init__(self, device: str, markers: bool = False) -> None:
        self.cuda = device == "cuda"
        self.markers = markers and self.cuda
        self.marks: list[tuple[str, object, float]] = []

    def __call__(self, name: str) -> None:
        event = None
        if self.cuda:
            if self.markers:
                torch.cuda._sleep(MARKER_CYCLES)
            event = torch.cuda.Event(enable_timing=True)
            event.record()
        self.marks.append((name, event, time.perf_counter()))

    def hook(self, tensor: Tensor, name: str) -> None:
        if tensor.requires_grad and tensor.grad_fn is not None:  # a leaf's hook would outlive the step
            tensor.register_hook(lambda _grad: self(name))

    def durations(self) -> dict[str, dict]:
        """{phase: {"gpu_ms", "host_ms"}}, after a synchronize; the last mark ends the step."""
        out: dict[str, dict] = {}
        for (name, event, host), (_, next_event, next_host) in zip(self.marks, self.marks[1:]):
            row = out.setdefault(name, {"gpu_ms": 0.0, "host_ms": 0.0})
            row["host_ms"] += (next_host - host) * 1e3
            if event is not None:
                row["gpu_ms"] += event.elapsed_time(next_event)
        return out


def no_phases(_name: str) -> None:
    pass


no_phases.hook = lambda tensor, name: None


def train_step(model: Splade, head: Head, optimizer: torch.optim.Optimizer, batch, device: str,
               phases: Phases | None = None) -> Tensor:
    mark = phases or no_phases
    q_side, d_side = batch
    mark("decoder cast")
    decoder = model.decoder
    if device == "cuda" and not head.fp32_decoder:
        decoder = decoder.to(torch.bfloat16)
        mark.hook(decoder, "decoder grad")
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
        mark("body fwd q")
        hq = model.hidden(q_side.ids, q_side.mask)
        mark("head fwd q")
        q = head(hq, decoder, model.bias, q_side)
        mark("body fwd d")
        hd = model.hidden(d_side.ids, d_side.mask)
        mark("head fwd d")
        d = head(hd, decoder, model.bias, d_side)
        mark("loss fwd")
        loss = splade_loss(q.float(), d.float())
    for tensor, name in ((hq, "body bwd q"), (q, "head bwd q"), (hd, "body bwd d"), (d, "head bwd d")):
        mark.hook(tensor, name)
    mark("loss bwd")
    loss.backward()
    mark("optimizer")
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    mark("end")
    return loss.detach()


def make_optimizer(model: nn.Module, device: str, lr: float = 2e-5) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=lr, fused=device == "cuda")


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def is_oom(error: BaseException) -> bool:
    """torch's allocator raises OutOfMemoryError; cuBLAS and cuDNN report a failed workspace allocation otherwise."""
    text = str(error)
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in text or "ALLOC_FAILED" in text


def release(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def failed(row: dict, error: BaseException) -> dict:
    """A row for a measurement that raised: OOM is a result; anything else is logged and the run goes on (a GPU run
    is too dear to lose to one section), and main() exits non-zero."""
    if is_oom(error):
        return {**row, "status": "OOM"}
    traceback.print_exc()
    return {**row, "status": "error", "error": repr(error)[:500]}


# ---------------------------------------------------------------------------------------------------- profiling


_MARKER_NAME: list[str] = []


def _device_events(prof) -> list[tuple[float, float, str]]:
    """(start µs, end µs, name) of every kernel, copy and set the profiler saw on the device, by start."""
    device_type = torch.autograd.DeviceType.CUDA
    spans = [(e.time_range.start, e.time_range.end, e.name) for e in prof.events()
             if e.device_type == device_type and not getattr(e, "is_user_annotation", False)]
    return sorted(spans)


def marker_name() -> str | None:
    """The name the profiler gives torch.cuda._sleep's kernel, read once from a profiled call (kernels only: the
    parse of a step's host ops takes seconds)."""
    if not _MARKER_NAME:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            torch.cuda._sleep(MARKER_CYCLES)
            torch.cuda.synchronize()
        names = {name for _, _, name in _device_events(prof)}
        _MARKER_NAME.append(names.pop() if len(names) == 1 else "")
    return _MARKER_NAME[0] or None


def profiled_step(model, head, optimizer, batch, device) -> dict:
    """One step under the profiler with marker kernels: {"busy_ms": total, "phases": {phase: busy ms}} (phases
    empty where the markers were not found one for one)."""
    from torch.profiler import ProfilerActivity, profile

    name = marker_name()
    phases = Phases(device, markers=True)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        train_step(model, head, optimizer, batch, device, phases)
        sync(device)
    spans = _device_events(prof)
    if not spans:  # no device activity recorded (CUPTI unavailable): no busy times rather than zeros
        log("  (the profiler recorded no device activity)")
        return {}
    busy, per_phase = busy_by_phase(spans, name, [mark for mark, _, _ in phases.marks])
    return {"busy_ms": busy, "phases": per_phase}


def busy_by_phase(spans: list[tuple[float, float, str]], marker: str | None,
                  marks: list[str]) -> tuple[float, dict[str, float]]:
    """(busy ms, {phase: busy ms}) from the device's (start µs, end µs, name) spans: the marker kernels, one per
    mark in order, cut the others into phases (empty where they are not one per mark: the total stands alone)."""
    work = [(s, e) for s, e, n in spans if n != marker]
    starts = [s for s, _, n in spans if n == marker]
    if not marker or len(starts) != len(marks):
        return _union_ms(work), {}
    per_phase: dict[str, float] = {}
    for phase, lo, hi in zip(marks, starts, starts[1:]):
        per_phase[phase] = per_phase.get(phase, 0.0) + _union_ms([(s, e) for s, e in work if lo <= s < hi])
    return _union_ms([(s, e) for s, e in work if starts[0] <= s < starts[-1]]), per_phase


def _union_ms(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for s, e in sorted(spans):
        if e > end:
            total += e - max(s, end)
            end = e
    return total / 1e3


# ---------------------------------------------------------------------------------------------------- sections


def section_step(model, heads, device, vocab, batch, args, gen, rule: str = "") -> list[dict]:
    rows = []
    optimizer = make_optimizer(model, device)
    data = [random_batch(batch, vocab, device, gen, args.quick) for _ in range(args.batches)]
    tokens = {"q_tokens": sum(s.tokens for s, _ in data) / len(data), "d_tokens": sum(s.tokens for _, s in data)
              / len(data), "q_padded": batch * data[0][0].length, "d_padded": batch * data[0][1].length,
              "hidden": model.decoder.shape[1]}
    for name, head in heads.items():
        base = {"section": "step", "vocab": vocab, "head": name, "batch": batch, "rule": rule, **tokens}
        t0 = time.perf_counter()
        try:
            # every batch of the data once at least: compilation, autotuning, the allocator's pool, the Adam state
            for i in range(max(args.warmup, len(data))):
                train_step(model, head, optimizer, data[i % len(data)], device)
            sync(device)
            warm_s = time.perf_counter() - t0
            times, marks = [], []
            for i in range(args.steps):
                phases = Phases(device)
                start = time.perf_counter()
                train_step(model, head, optimizer, data[i % len(data)], device, phases)
                sync(device)
                times.append((time.perf_counter() - start) * 1e3)
                marks.append(phases.durations())
            prof = {}
            if device == "cuda" and not args.no_profile:
                try:
                    prof = profiled_step(model, head, optimizer, data[0], device)
                except Exception as error:  # the breakdown without busy times still stands
                    log(f"  (profiled step failed: {error!r})")
        except Exception as error:
            row = failed(base, error)
        else:
            phases = {p: {k: statistics.median(m[p][k] for m in marks if p in m) for k in ("gpu_ms", "host_ms")}
                      for p in marks[0]}
            for p, busy in prof.get("phases", {}).items():
                if p in phases:
                    phases[p]["busy_ms"] = busy
            row = {**base, "status": "ok", "ms": statistics.median(times), "ms_min": min(times),
                   "ms_max": max(times), "steps": len(times), "warmup_s": warm_s,
                   "gpu_ms": statistics.median(sum(v["gpu_ms"] for v in m.values()) for m in marks),
                   "host_ms": statistics.median(sum(v["host_ms"] for v in m.values()) for m in marks),
                   "busy_ms": prof.get("busy_ms"), "phases": phases, "coarse": coarse(phases)}
        release(device)
        rows.append(row)
        if row["status"] == "ok":
            busy = f", device busy {row['busy_ms']:.1f} ms" if row["busy_ms"] is not None else ""
            log(f"  step V={vocab} B={batch} {name:8} {row['ms']:8.2f} ms (median of {row['steps']}, warm-up "
                f"{row['warmup_s']:.1f} s; host {row['host_ms']:.1f} ms{busy})")
            log_phases(row)
        else:
            log(f"  step V={vocab} B={batch} {name:8} {row['status']}")
    del optimizer
    release(device)
    return rows


def speedups(rows: list[dict]) -> None:
    """Each step row's time over Sparton's at the same vocabulary and batch (wall, and device busy)."""
    steps = [r for r in rows if r["section"] == "step" and r["status"] == "ok"]
    sparton_rows = {(r["vocab"], r["batch"]): r for r in steps if r["head"] == "sparton"}
    for r in steps:
        s = sparton_rows.get((r["vocab"], r["batch"]))
        if s is not None and r is not s:
            r["sparton_speedup"] = r["ms"] / s["ms"]
            if r.get("busy_ms") and s.get("busy_ms"):
                r["sparton_busy_speedup"] = r["busy_ms"] / s["busy_ms"]


def coarse(phases: dict[str, dict]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for name, values in phases.items():
        group = out.setdefault(COARSE.get(name, name), {})
        for key, value in values.items():
            group[key] = group.get(key, 0.0) + value
    return {k: out[k] for k in COARSE_ORDER if k in out}


def log_phases(row: dict) -> None:
    """Per coarse phase: device (event) ms, busy ms where profiled, host ms."""
    parts = []
    for name, v in row["coarse"].items():
        busy = f"/{v['busy_ms']:.1f}" if "busy_ms" in v else ""
        parts.append(f"{name} {v['gpu_ms']:.1f}{busy}/{v['host_ms']:.1f}")
    log("      phases, device" + ("/busy" if row.get("busy_ms") is not None else "") + "/host ms: " + ", ".join(parts))


def step_hidden(model: Splade, batch, device: str) -> tuple[Tensor, Tensor]:
    """The step's hidden states for one batch (fp32 LayerNorm outputs under autocast), detached leaves."""
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
        hq = model.hidden(batch[0].ids, batch[0].mask)
        hd = model.hidden(batch[1].ids, batch[1].mask)
    return hq.float().requires_grad_(), hd.float().requires_grad_()


def head_inputs(model: Splade, head: Head, device: str) -> tuple[Tensor, Tensor]:
    weight = model.decoder.detach()
    if device == "cuda" and not head.fp32_decoder:
        weight = weight.to(torch.bfloat16)
    return weight.clone().requires_grad_(), model.bias.detach().clone().requires_grad_()


def timed_ms(fn: Callable[[], object], device: str, min_ms: float = 300.0, reps: tuple[int, int] = (5, 30)) -> float:
    """Mean over enough calls for ~min_ms of work (CUDA events), after one call that sizes them."""
    start = time.perf_counter()
    fn()
    sync(device)
    once = (time.perf_counter() - start) * 1e3
    n = int(min(max(min_ms / max(once, 1e-3), reps[0]), reps[1]))
    if device != "cuda":  # a smoke run: the code path, not the timing
        n = 2
        start = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - start) * 1e3 / n
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(n):
        fn()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / n


_MATMUL: list[float] = []


def matmul_tflops(device: str) -> float | None:
    """bf16 8192³ cuBLAS rate after 1.5 s of warm-up (the power cap settles within ~100 ms; bench_head.py measures
    the same floor), once a run."""
    if device != "cuda":
        return None
    if not _MATMUL:
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        deadline = time.perf_counter() + 1.5
        while time.perf_counter() < deadline:
            a @ b
            sync(device)
        ms = timed_ms(lambda: a @ b, device, min_ms=500, reps=(20, 200))
        _MATMUL.append(2 * 8192**3 / ms / 1e9)
        del a, b
        release(device)
    return _MATMUL[0]


def section_head(model, heads, device, vocab, batch, args, gen) -> list[dict]:
    """Each head alone on one batch's hidden states, queries and documents as the step calls it: forward, and
    forward + backward (autograd.grad: no accumulation into .grad), against the FLOP floor of the real tokens."""
    rows = []
    data = random_batch(batch, vocab, device, gen, args.quick)
    hq, hd = step_hidden(model, data, device)
    hidden = hq.shape[-1]
    real = data[0].tokens + data[1].tokens
    padded = batch * (data[0].length + data[1].length)
    try:
        tflops = matmul_tflops(device)
    except Exception as error:
        log(f"  (the bf16 matmul rate could not be measured: {error!r})")
        tflops = None
    g = torch.Generator(device=device).manual_seed(1)
    grads = [torch.randn(batch, vocab, device=device, generator=g) / batch for _ in range(2)]
    calls = dict(heads)
    if "sparton" in heads:  # the op alone on the packed tokens it is handed: the kernels without the gather and cast
        calls["sparton op"] = Head("sparton op", lambda tokens, w, b, side: sparton.splade_max_packed(
            tokens, w, b, side.cu, side.length))
    for name, head in calls.items():
        base = {"section": "head", "vocab": vocab, "head": name, "batch": batch, "tokens": real,
                "padded_tokens": padded}
        try:
            weight, bias = head_inputs(model, head, device)
            inputs = [hq, hd]
            if name == "sparton op":
                inputs = [h.detach().reshape(-1, hidden).index_select(0, side.index).to(weight.dtype)
                          .requires_grad_() for h, side in zip(inputs, data)]
            leaves = [*inputs, weight, bias]

            def forward(head=head, weight=weight, bias=bias, inputs=inputs):
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
                    return head(inputs[0], weight, bias, data[0]), head(inputs[1], weight, bias, data[1])

            def forward_backward(forward=forward, leaves=leaves):
                torch.autograd.grad(forward(), leaves, grads)

            forward_backward()  # compilation, autotuning
            sync(device)
            fwd = timed_ms(forward, device)
            total = timed_ms(forward_backward, device)
        except Exception as error:
            row = failed(base, error)
        else:
            row = {**base, "status": "ok", "fwd_ms": fwd, "bwd_ms": total - fwd, "ms": total}
            if tflops:
                floor = 2 * real * hidden * vocab / (tflops * 1e9)  # forward, ms; backward twice that
                row.update(tflops=tflops, floor_fwd_ms=floor, floor_ms=3 * floor, x_floor=total / (3 * floor),
                           x_floor_fwd=fwd / floor, x_floor_bwd=(total - fwd) / (2 * floor),
                           x_floor_padded=total / (3 * floor * padded / real))
        release(device)
        rows.append(row)
        if row["status"] == "ok":
            floor = (f" = {row['x_floor']:.2f}x the real tokens' floor {row['floor_ms']:.2f} ms (fwd "
                     f"{row['x_floor_fwd']:.2f}x, bwd {row['x_floor_bwd']:.2f}x)") if "x_floor" in row else ""
            log(f"  head V={vocab} B={batch} {name:10} fwd {row['fwd_ms']:7.2f} + bwd {row['bwd_ms']:7.2f} = "
                f"{row['ms']:7.2f} ms{floor}")
        else:
            log(f"  head V={vocab} B={batch} {name:10} {row['status']}")
    return rows


def section_memory(model, heads, device, vocab, batch, args, gen) -> list[dict]:
    """Peak memory of the head's forward + backward on one batch of documents (torch.cuda.max_memory_allocated
    beyond what was allocated before), less its output, the inputs' gradients and Sparton's saved argmax: what
    the head needs of its own. For Sparton, also the op alone on the bf16 packed tokens it is handed, for the
    documents and for the queries."""
    rows = []
    if device != "cuda":
        return rows
    q_side, side = random_batch(batch, vocab, device, gen, args.quick)
    q_hidden, hidden = step_hidden(model, (q_side, side), device)
    grad = torch.randn(batch, vocab, device=device) / batch
    argmax = 4 * batch * vocab

    def measure(call, leaves) -> tuple[int, int, int]:
        call().backward(grad)  # warm-up: compilation, lazy workspaces
        for t in leaves:
            t.grad = None
        release(device)
        sync(device)
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = call()
        forward = torch.cuda.max_memory_allocated() - before
        out.backward(grad)
        sync(device)
        peak = torch.cuda.max_memory_allocated() - before
        grads = sum(t.grad.numel() * t.grad.element_size() for t in leaves)
        out_bytes = out.numel() * out.element_size()
        for t in leaves:
            t.grad = None
        return peak, forward, out_bytes + grads

    for name, head in heads.items():
        base = {"section": "memory", "vocab": vocab, "head": name, "batch": batch, "tokens": side.tokens}
        try:
            weight, bias = head_inputs(model, head, device)

            def call(head=head, weight=weight, bias=bias):
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    return head(hidden, weight, bias, side)

            peak, forward, owned = measure(call, [hidden, weight, bias])
            row = {**base, "status": "ok", "peak_bytes": peak, "forward_peak_bytes": forward, "owned_bytes": owned,
                   "argmax_bytes": argmax if name == "sparton" else 0}
            row["extra_bytes"] = peak - owned - row["argmax_bytes"]
            if name == "sparton":  # the op alone, documents and queries
                for key, h, s in (("op", hidden, side), ("op_queries", q_hidden, q_side)):
                    tokens = h.detach().reshape(-1, h.shape[-1])[s.index].to(weight.dtype).requires_grad_()
                    op_peak, _, op_owned = measure(
                        lambda tokens=tokens, weight=weight, bias=bias, s=s: sparton.splade_max_packed(
                            tokens, weight, bias, s.cu, s.length), [tokens, weight, bias])
                    row.update({f"{key}_peak_bytes": op_peak, f"{key}_extra_bytes": op_peak - op_owned - argmax})
                    del tokens
            del weight, bias
        except Exception as error:
            row = failed(base, error)
        rows.append(row)
        if row["status"] == "ok":
            op = (f"; the op alone on its bf16 packed tokens {row['op_extra_bytes'] / 2**20:.2f} MiB (queries "
                  f"{row['op_queries_extra_bytes'] / 2**20:.2f} MiB)" if "op_extra_bytes" in row else "")
            arg = f", argmax {argmax / 2**20:.1f} MiB" if name == "sparton" else ""
            log(f"  memory V={vocab} B={batch} {name:8} peak {row['peak_bytes'] / 2**20:9.1f} MiB; beyond output, "
                f"input gradients{' and argmax' if arg else ''}: {row['extra_bytes'] / 2**20:9.2f} MiB{arg}{op}")
        else:
            log(f"  memory V={vocab} B={batch} {name:8} {row['status']}")
        release(device)
    return rows


def section_batch(model, heads, device, vocab, args, gen) -> list[dict]:
    """Largest batch whose whole training step fits: doubling from 8, then bisection to ~5%; eager is then probed at
    Sparton's largest batch."""
    rows = []

    def fits(head, optimizer, batch: int) -> tuple[bool, int]:
        release(device)
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        try:
            train_step(model, head, optimizer, random_batch(batch, vocab, device, gen, args.quick), device)
            sync(device)
            ok = True
        except RuntimeError as error:
            if not is_oom(error):
                raise
            ok = False
        peak = torch.cuda.max_memory_allocated() if device == "cuda" else 0
        optimizer.zero_grad(set_to_none=True)
        release(device)
        return ok, peak

    for name in args.batch_heads:
        if name not in heads:
            continue
        head = heads[name]
        base = {"section": "batch", "vocab": vocab, "head": name, "cap": args.batch_cap}
        try:
            optimizer = make_optimizer(model, device)
            train_step(model, head, optimizer, random_batch(2, vocab, device, gen, args.quick), device)  # Adam state
            deadline = time.perf_counter() + args.batch_seconds
            probes, peaks = [], {}
            low, high, capped = 0, None, False
            batch = 8
            while time.perf_counter() < deadline:
                if batch > args.batch_cap:
                    capped = True
                    break
                ok, peak = fits(head, optimizer, batch)
                probes.append((batch, ok))
                if not ok:
                    high = batch
                    break
                peaks[batch] = peak
                low, batch = batch, batch * 2
            while high is not None and high - low > max(1, low // 20) and time.perf_counter() < deadline:
                middle = (low + high) // 2
                ok, peak = fits(head, optimizer, middle)
                probes.append((middle, ok))
                if ok:
                    low, peaks[middle] = middle, peak
                else:
                    high = middle
            row = {**base, "status": "ok", "max_batch": low, "first_failing": high, "capped": capped,
                   "timed_out": time.perf_counter() >= deadline, "probes": len(probes),
                   "peak_bytes_at_max": peaks.get(low)}
            if len(peaks) >= 2:  # memory a document pair adds, from the two largest fitting probes
                (b0, p0), (b1, p1) = sorted(peaks.items())[-2:]
                row["bytes_per_pair"] = (p1 - p0) / (b1 - b0)
            del optimizer
        except Exception as error:
            row = failed(base, error)
        rows.append(row)
        release(device)
        if row["status"] == "ok":
            per = f", {row['bytes_per_pair'] / 2**20:.0f} MiB a pair" if "bytes_per_pair" in row else ""
            log(f"  batch V={vocab} {name:8} largest fitting {row['max_batch']}"
                + (f", {row['first_failing']} did not" if row["first_failing"] else "")
                + (" (cap reached)" if row["capped"] else "") + (" (time budget reached)" if row["timed_out"] else "")
                + f"; {row['probes']} probes{per}")
        else:
            log(f"  batch V={vocab} {name:8} {row['status']}")
    fit = {r["head"]: r for r in rows if r["status"] == "ok"}
    if "sparton" in fit and "eager" in fit and fit["eager"]["max_batch"]:
        sparton_row, eager_row = fit["sparton"], fit["eager"]
        sparton_row["ratio_to_eager"] = sparton_row["max_batch"] / eager_row["max_batch"]
        if sparton_row["max_batch"] > eager_row["max_batch"] and "eager" in heads:
            optimizer = make_optimizer(model, device)
            try:
                ok, _ = fits(heads["eager"], optimizer, sparton_row["max_batch"])
            except Exception as error:
                ok = failed({}, error)["status"]
            sparton_row["eager_at_this_batch"] = "fits" if ok is True else "OOM" if ok is False else ok
            log(f"  batch V={vocab} eager at Sparton's largest batch {sparton_row['max_batch']}: "
                f"{sparton_row['eager_at_this_batch']}")
            del optimizer
            release(device)
    return rows


def comparison_batch(rows: list[dict], vocab: int) -> int | None:
    """The rule for the step comparison at the larger batch: eager's largest fitting batch less 10% (headroom for
    the allocator over repeated steps), a multiple of 8."""
    for r in rows:
        if r["section"] == "batch" and r["vocab"] == vocab and r["head"] == "eager" and r["status"] == "ok":
            return max(8, int(r["max_batch"] * 0.9) // 8 * 8) if r["max_batch"] >= 8 else None
    return None


def synthetic_pairs(n_batches: int, batch: int, vocab: int, device: str, seed: int, quick: bool):
    """Query/document pairs that share terms: a query is 8-16 terms of a topic; its document holds them among other
    terms of the topic and random ones. A model that learns the shared terms ranks the positive first."""
    gen = torch.Generator().manual_seed(seed)
    qlen, dlen = (16, 32) if quick else (QUERY_LEN, 128)
    batches = []
    for _ in range(n_batches):
        q_ids = torch.zeros(batch, qlen, dtype=torch.long)
        d_ids = torch.randint(1000, vocab, (batch, dlen), generator=gen)
        q_len = torch.zeros(batch, dtype=torch.long)
        d_len = torch.zeros(batch, dtype=torch.long)
        for i in range(batch):
            topic = torch.randint(1000, vocab, (24,), generator=gen)
            n = int(torch.randint(qlen // 4, qlen // 2 + 1, (1,), generator=gen))
            q_ids[i, :n] = topic[torch.randperm(24, generator=gen)[:n]]
            q_len[i] = n
            where = torch.randperm(dlen, generator=gen)[:24]
            d_ids[i, where] = topic
            cut = int(torch.randint(dlen // 2, dlen + 1, (1,), generator=gen))
            d_len[i] = cut
            d_ids[i, where[where >= cut]] = topic[: int((where >= cut).sum())]  # keep the topic inside the document
        batches.append((make_side(q_ids, q_len, device), make_side(d_ids, d_len, device)))
    return batches


def smoothed(values: list[float], window: int) -> list[float]:
    """Trailing mean over `window` steps."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def rel_diff(a: list[float], b: list[float]) -> list[float]:
    return [abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b)]


def diff_summary(a: list[float], b: list[float], window: int) -> dict:
    raw, smooth = rel_diff(a, b), rel_diff(smoothed(a, window), smoothed(b, window))
    return {"first": raw[0], "max": max(raw), "mean": statistics.mean(raw), "final": raw[-1],
            "smoothed_max": max(smooth), "smoothed_mean": statistics.mean(smooth), "smoothed_final": smooth[-1]}


def section_curves(device: str, args) -> tuple[list[dict], dict]:
    vocab = 30_522 if device == "cuda" else 2_000  # a CPU smoke run exercises the code, not the scale
    torch.manual_seed(0)
    base = Splade(make_config("BertConfig", vocab, tiny=True)).to(device)
    data = synthetic_pairs(8, 16 if args.quick else 32, vocab, device, 1, args.quick)
    names = ("sparton", "eager", "eager32")
    curves = {}
    for name, head in make_heads(names).items():
        torch.manual_seed(1)  # the same dropout masks for every head (no head draws random numbers)
        model = copy.deepcopy(base)
        optimizer = make_optimizer(model, device, lr=1e-4)
        start = time.perf_counter()
        losses = [float(train_step(model, head, optimizer, data[i % len(data)], device))
                  for i in range(args.curve_steps)]
        curves[name] = losses
        log(f"  curves {name:8} loss {losses[0]:.4f} → {losses[-1]:.4f} over {len(losses)} steps "
            f"({time.perf_counter() - start:.1f} s)")
        del model, optimizer
        release(device)
    window = min(args.smooth, max(1, args.curve_steps // 4))
    summary = {"steps": args.curve_steps, "smooth_window": window, "first_loss": curves["eager"][0],
               "last_loss": {k: v[-1] for k, v in curves.items()},
               "sparton_vs_eager": diff_summary(curves["sparton"], curves["eager"], window)}
    if "eager32" in curves:
        summary["eager32_vs_eager"] = diff_summary(curves["eager32"], curves["eager"], window)
        summary["sparton_vs_eager32"] = diff_summary(curves["sparton"], curves["eager32"], window)
    for key in ("sparton_vs_eager", "eager32_vs_eager", "sparton_vs_eager32"):
        if key in summary:
            s = summary[key]
            log(f"  curves {key:18}: relative loss difference first {s['first']:.2e}, max {s['max']:.2e}, mean "
                f"{s['mean']:.2e}, final {s['final']:.2e}; smoothed ({window} steps) max {s['smoothed_max']:.2e}, "
                f"mean {s['smoothed_mean']:.2e}")
    if "eager32_vs_eager" in summary and device == "cuda":  # on CPU every head computes in fp32: no floor
        s, floor = summary["sparton_vs_eager"], summary["eager32_vs_eager"]
        summary["within_noise"] = s["smoothed_mean"] <= 2 * floor["smoothed_mean"] and \
            s["smoothed_max"] <= 2 * floor["smoothed_max"]
        log(f"  curves: Sparton against eager is {'within' if summary['within_noise'] else 'OUTSIDE'} twice the bf16 "
            f"noise floor (fp32 eager against eager) on the smoothed curves")
    rows = [{"section": "curves", "vocab": vocab, "head": name, "step": i, "loss": loss}
            for name, losses in curves.items() for i, loss in enumerate(losses)]
    return rows, {"summary": summary, "curves": curves}


# ---------------------------------------------------------------------------------------------------- output


def bounds(rows: list[dict]) -> list[dict]:
    """What the step ratio can be, from this run's numbers: the device time of everything but the head (body,
    loss, decoder cast and gradient, optimizer: the step's busy time less its head phases) is the same for both
    heads; with Sparton's head at its measured time and at its FLOP floor, against eager's measured head."""
    out = []
    steps = [r for r in rows if r["section"] == "step" and r["status"] == "ok" and r.get("busy_ms")]
    for key in sorted({(r["vocab"], r["batch"]) for r in steps}):
        by = {r["head"]: r for r in steps if (r["vocab"], r["batch"]) == key}
        if "sparton" not in by or "eager" not in by or \
                any("busy_ms" not in v for r in by.values() for v in r["coarse"].values()):
            continue  # per-phase busy times missing (markers not found one for one)
        heads = {n: sum(r["coarse"].get(p, {}).get("busy_ms", 0.0) for p in ("head fwd", "head bwd"))
                 for n, r in by.items()}
        rest = by["eager"]["busy_ms"] - heads["eager"]
        row = {"vocab": key[0], "batch": key[1], "rest_busy_ms": rest, "eager_head_busy_ms": heads["eager"],
               "sparton_head_busy_ms": heads["sparton"], "wall_ratio": by["eager"]["ms"] / by["sparton"]["ms"],
               "busy_ratio": by["eager"]["busy_ms"] / by["sparton"]["busy_ms"],
               "host_ms": {n: r["host_ms"] for n, r in by.items()}}
        if _MATMUL:  # forward 2·T·H·V and backward 4·T·H·V on the real tokens
            r = by["sparton"]
            floor = 6 * (r["q_tokens"] + r["d_tokens"]) * r["hidden"] * r["vocab"] / (_MATMUL[0] * 1e9)
            row["sparton_head_floor_ms"] = floor
            row["ratio_at_floor"] = (rest + heads["eager"]) / (rest + floor)
        row["ratio_head_free"] = (rest + heads["eager"]) / rest if rest > 0 else None
        out.append(row)
    return out


def write_results(out: Path, gpu: str, meta: dict, rows: list[dict], curves: dict | None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    prov = provenance()
    out.mkdir(parents=True, exist_ok=True)
    tag = "_checkpointed" if meta.get("checkpoint_body") else ""
    stem = out / ("train_" + gpu.replace(" ", "_").replace("/", "_") + tag)
    table = [r for r in rows if r["section"] != "curves"]
    stem.with_suffix(".json").write_text(json.dumps(with_provenance(
        {"meta": meta, "rows": table, "bounds": bounds(rows), "curves": curves}, prov), indent=1))
    flat = []
    for r in rows:
        f = {k: v for k, v in r.items() if k not in ("phases", "coarse")}
        for phase, values in r.get("coarse", {}).items():
            for k, v in values.items():
                f[f"{phase} {k}"] = v
        flat.append(f)
    fields = list(dict.fromkeys(k for r in flat for k in r))
    with stem.with_suffix(".csv").open("w", newline="") as f:
        f.write(csv_line(prov))
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(flat)
    try:
        plot(stem, gpu, rows, curves, prov)
    except Exception:  # the JSON and CSV stand without the figure
        traceback.print_exc()
    log(f"wrote {stem}.json/.csv/.png")
    return stem


def plot(stem: Path, gpu: str, rows: list[dict], curves: dict | None, prov: dict) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(22, 5))
    colors = {"sparton": "C0", "eager": "C3", "compile": "C2", "eager32": "C1"}
    if curves:
        for name, losses in curves["curves"].items():
            axes[0].plot(losses, color=colors[name], lw=1, ls="-" if name == "sparton" else "--", label=name)
        axes[0].set_yscale("log")
        axes[0].set_title("tiny BERT loss, same weights, data and dropout")
        axes[0].set_xlabel("step")
        axes[0].legend()
        window = curves["summary"]["smooth_window"]
        c = curves["curves"]
        pairs = [("sparton", "eager", "C0"), ("eager32", "eager", "C1")]
        for a, b, color in pairs:
            if a in c and b in c:
                axes[1].plot(rel_diff(c[a], c[b]), color=color, lw=0.6, alpha=0.5, label=f"{a} vs {b}")
                axes[1].plot(rel_diff(smoothed(c[a], window), smoothed(c[b], window)), color=color, lw=1.5,
                             label=f"{a} vs {b}, smoothed ({window})")
        axes[1].set_yscale("log")
        axes[1].set_title("relative loss difference (eager32 vs eager: the bf16 noise floor)")
        axes[1].set_xlabel("step")
        axes[1].legend(fontsize=7)
    steps = [r for r in rows if r["section"] == "step" and r.get("status") == "ok"]
    phase_colors = {p: f"C{i}" for i, p in enumerate(COARSE_ORDER)}
    for i, r in enumerate(steps):
        bottom = 0.0
        for phase, values in r["coarse"].items():
            value = values.get("busy_ms", values["gpu_ms"] or values["host_ms"])
            axes[2].bar(i, value, bottom=bottom, color=phase_colors[phase], label=phase if i == 0 else None)
            bottom += value
        if r.get("busy_ms") is not None:
            axes[2].bar(i, max(r["ms"] - bottom, 0), bottom=bottom, color="0.85", label="idle" if i == 0 else None)
        axes[2].plot([i - 0.4, i + 0.4], [r["ms"], r["ms"]], color="k", lw=1)
    axes[2].set_xticks(range(len(steps)), [f"V={r['vocab']}\n{r['head']}\nB={r['batch']}" for r in steps],
                       fontsize=6)
    axes[2].set_title("step ms: device busy per phase, idle, wall (line)")
    if steps:
        axes[2].legend(fontsize=6)
    ok = [r for r in rows if r["section"] == "batch" and r.get("status") == "ok"]
    axes[3].bar(range(len(ok)), [r["max_batch"] for r in ok], color=[colors.get(r["head"], "C7") for r in ok])
    axes[3].set_xticks(range(len(ok)), [f"V={r['vocab']}\n{r['head']}" for r in ok], fontsize=7)
    axes[3].set_yscale("log")
    axes[3].set_title("largest batch whose step fits")
    fig.suptitle(f"SPLADE training step, Sparton vs eager heads, {gpu}")
    fig.tight_layout()
    fig.savefig(stem.with_suffix(".png"), dpi=110, metadata=png_metadata(prov))
    plt.close(fig)


def summarize(rows: list[dict]) -> None:
    log("\nsummary")
    for vocab in sorted({r["vocab"] for r in rows if r["section"] != "curves"}):
        for batch in sorted({r["batch"] for r in rows if r["section"] == "step" and r["vocab"] == vocab}):
            step = {r["head"]: r for r in rows if r["section"] == "step" and r["vocab"] == vocab
                    and r["batch"] == batch}
            if "sparton" not in step or step["sparton"]["status"] != "ok":
                continue
            for name in ("eager", "compile"):
                if name in step:
                    r = step[name]
                    ratio = f"{r['sparton_speedup']:.2f}x" if r["status"] == "ok" else r["status"]
                    busy = f" (device busy: {r['sparton_busy_speedup']:.2f}x)" if "sparton_busy_speedup" in r else ""
                    rule = f" [{step['sparton']['rule']}]" if step["sparton"].get("rule") else ""
                    log(f"  V={vocab} B={batch}{rule}: sparton step vs {name}: {ratio}{busy}")
        heads = {r["head"]: r for r in rows if r["section"] == "head" and r["vocab"] == vocab and r["status"] == "ok"}
        for name, r in heads.items():
            if "x_floor" in r:
                log(f"  V={vocab}: head alone, fwd+bwd, {name}: {r['ms']:.2f} ms, {r['x_floor']:.2f}x the floor of the "
                    f"real tokens ({r['floor_ms']:.2f} ms), {r['x_floor_padded']:.2f}x the padded tokens'")
        if "sparton" in heads:
            for name in ("eager", "compile"):
                if name in heads:
                    log(f"  V={vocab}: head alone, fwd+bwd: sparton {heads['sparton']['ms']:.2f} ms vs {name} "
                        f"{heads[name]['ms']:.2f} ms: {heads[name]['ms'] / heads['sparton']['ms']:.2f}x")
        fit = {r["head"]: r for r in rows if r["section"] == "batch" and r["vocab"] == vocab and r["status"] == "ok"}
        if "sparton" in fit and "eager" in fit:
            log(f"  V={vocab}: largest batch sparton {fit['sparton']['max_batch']} vs eager "
                f"{fit['eager']['max_batch']}: {fit['sparton'].get('ratio_to_eager', float('nan')):.1f}x"
                + (" (sparton at the cap)" if fit["sparton"]["capped"] else "")
                + (f"; eager at Sparton's batch: {fit['sparton']['eager_at_this_batch']}"
                   if "eager_at_this_batch" in fit["sparton"] else ""))
    for b in bounds(rows):
        at_floor = f", with Sparton's head at its floor {b['ratio_at_floor']:.2f}x" if "ratio_at_floor" in b else ""
        head_free = f", with a head of no cost {b['ratio_head_free']:.2f}x" if b["ratio_head_free"] else ""
        log(f"  V={b['vocab']} B={b['batch']}: device busy, everything but the head {b['rest_busy_ms']:.1f} ms, "
            f"eager head {b['eager_head_busy_ms']:.1f} ms, Sparton head {b['sparton_head_busy_ms']:.1f} ms: "
            f"ratio {b['busy_ratio']:.2f}x busy, {b['wall_ratio']:.2f}x wall{at_floor}{head_free}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {SECTIONS}")
    parser.add_argument("--quick", action="store_true", help="fewer steps and probes (a fast look, or CPU smoke run)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--bodies", default="bert-base,xlm-r-base")
    parser.add_argument("--heads", default="sparton,eager,compile")
    parser.add_argument("--batch-heads", default="sparton,eager")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per head")
    parser.add_argument("--warmup", type=int, default=3, help="warm-up steps (at least one per batch of --batches)")
    parser.add_argument("--batches", type=int, default=3, help="distinct batches the timed steps cycle through")
    parser.add_argument("--no-profile", action="store_true", help="skip the profiled step (device busy times)")
    parser.add_argument("--checkpoint-body", action="store_true",
                        help="recompute the body's activations in the backward (gradient checkpointing), every head")
    parser.add_argument("--batch-cap", type=int, default=2048)
    parser.add_argument("--batch-seconds", type=float, default=20.0, help="time budget of one largest-batch search")
    parser.add_argument("--step-batches", default="64,16", help="step-timing batch of each body (one eager fits)")
    parser.add_argument("--curve-steps", type=int, default=300)
    parser.add_argument("--smooth", type=int, default=20, help="steps of the loss curves' trailing mean")
    parser.add_argument("--budget", type=float, default=0.0,
                        help="seconds: parts not yet started past this are skipped, and said so (0: no limit)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    sections = [s for s in args.sections.split(",") if s]
    if unknown := set(sections) - set(SECTIONS):
        parser.error(f"unknown sections {unknown}")
    cpu = args.device == "cpu"
    if cpu:
        args.batch_cap = min(args.batch_cap, 16)
        args.batches = min(args.batches, 2)
    if args.quick:
        args.steps = min(args.steps, 3)
        args.warmup = min(args.warmup, args.batches)
        args.batch_seconds = min(args.batch_seconds, 5.0 if cpu else 10.0)
        args.curve_steps = min(args.curve_steps, 20 if cpu else 100)
    heads_wanted = tuple(h for h in args.heads.split(",") if h and not (cpu and h == "compile"))
    args.batch_heads = [h for h in args.batch_heads.split(",") if h]
    gpu = torch.cuda.get_device_name() if not cpu else "cpu"
    log(f"{gpu}: torch {torch.__version__}; sections {sections}; heads {heads_wanted}; bf16 autocast, fp32 master "
        f"weights, fused AdamW")
    meta = {"gpu": gpu, "device": args.device, "args": {k: str(v) for k, v in vars(args).items()},
            "precision": "bf16 autocast over fp32 weights; one bf16 decoder copy a step for every head; the Sparton "
                         "head on the real tokens (packed), cast to bf16",
            "query_len": QUERY_LEN, "doc_len": DOC_LEN, "lambda_q": LAMBDA_Q, "lambda_d": LAMBDA_D,
            "checkpoint_body": args.checkpoint_body}
    rows: list[dict] = []
    curves = None
    started = time.perf_counter()
    gen = torch.Generator().manual_seed(0)
    wanted = args.bodies.split(",")
    if "curves" in sections:  # first: short, and wanted even when a later section runs out of time
        log("curves")
        try:
            curve_rows, curves = section_curves(args.device, args)
            rows += curve_rows
        except Exception as error:
            rows.append(failed({"section": "curves", "vocab": 0, "head": "all"}, error))
        write_results(args.out, gpu, meta, rows, curves)
    def within_budget(part: str) -> bool:
        if args.budget and time.perf_counter() - started > args.budget:
            log(f"  {part}: skipped, past the time budget of {args.budget:.0f} s")
            meta.setdefault("skipped", []).append(part)
            return False
        return True

    if any(s in sections for s in ("step", "head", "memory", "batch")):
        step_batches = [int(x) for x in args.step_batches.split(",")]
        # torch.compile's head after every body's other measurements: its compilation is the slowest part
        for names in ([h for h in heads_wanted if h != "compile"], [h for h in heads_wanted if h == "compile"]):
            for (name, kind, vocab), step_batch in zip(BODIES, step_batches):
                if not names or name not in wanted:
                    continue
                if cpu:
                    vocab, step_batch = {30_522: 1_000, 250_002: 3_001}[vocab], 4
                label = f"V={vocab} {'+'.join(names)}"
                if not within_budget(label):
                    continue
                log(f"{name} (V={vocab}), {'+'.join(names)}, {time.perf_counter() - started:.0f} s in")
                heads = make_heads(tuple(names))
                model = Splade(make_config(kind, vocab, tiny=cpu)).to(args.device)
                if args.checkpoint_body:
                    checkpoint_body(model.body)
                if "step" in sections and within_budget(f"{label} step"):
                    rows += section_step(model, heads, args.device, vocab, step_batch, args, gen)
                if "head" in sections and within_budget(f"{label} head"):
                    rows += section_head(model, heads, args.device, vocab, step_batch, args, gen)
                if "memory" in sections and within_budget(f"{label} memory"):
                    rows += section_memory(model, heads, args.device, vocab, step_batch, args, gen)
                if "batch" in sections and "compile" not in heads and within_budget(f"{label} batch"):
                    rows += section_batch(model, heads, args.device, vocab, args, gen)
                    larger = comparison_batch(rows, vocab)
                    if "step" in sections and larger and larger != step_batch and \
                            within_budget(f"{label} step at the comparison batch {larger}"):
                        pair = {n: h for n, h in heads.items() if n in ("sparton", "eager")}
                        log(f"  step at the comparison batch {larger} (eager's largest less 10%, a multiple of 8)")
                        rows += section_step(model, pair, args.device, vocab, larger, args, gen,
                                             rule="eager's largest batch less 10%")
                speedups(rows)
                del model, heads
                release(args.device)
                write_results(args.out, gpu, meta, rows, curves)  # kept if a later part runs out of time
    meta["seconds"] = time.perf_counter() - started
    meta["matmul_bf16_tflops"] = _MATMUL[0] if _MATMUL else None
    write_results(args.out, gpu, meta, rows, curves)
    try:
        summarize(rows)
    except Exception:
        traceback.print_exc()
    errors = [r for r in rows if r.get("status") == "error"]
    log(f"done in {meta['seconds']:.0f} s" + (f"; {len(errors)} measurements failed" if errors else ""))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
