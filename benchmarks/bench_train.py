"""SPLADE training with the Sparton head against the PyTorch eager head and torch.compile of it, on one GPU.

A training step: a transformer body (random weights from a transformers config, no download) encodes a batch of
queries (16-32 tokens, padded to 32) and of their positive documents (128-256 tokens, padded to 256); the MLM
transform (dense, gelu, LayerNorm) gives the hidden states; the head pools them into SPLADE vectors with the decoder
tied to the word embeddings; the loss is in-batch-negative cross-entropy over q·dᵀ plus the FLOPS regularizer
(λ_q = 3e-4, λ_d = 1e-4); AdamW (fused) steps. Precision: bf16 autocast over fp32 master weights (the usual mixed
precision: the optimizer and the weights stay fp32, matmuls run in bf16). The Sparton head gets bf16 hidden states
and a bf16 copy of the decoder (the cast is in the step, as autocast's is for the eager head's F.linear).

Heads: "sparton" (sparton.splade_max: fused forward recording the argmax, fused backward), "eager" (F.linear →
log1p(relu) → × mask → amax over the sequence, as SPLADE and sentence-transformers do), "compile" (torch.compile of
the eager head, dynamic=False). Bodies: BERT-base (V = 30,522) and XLM-R-base (V = 250,002).

Sections (--sections, default all):
  step    step time at the same batch (median of --steps steps after warm-up), each head;
  memory  the head alone, forward + backward on the step's documents (256 tokens): peak memory beyond its inputs,
          its output, the gradients and (Sparton) the saved argmax (torch.cuda.max_memory_allocated deltas);
  batch   the largest batch whose training step fits the GPU, sparton and eager (doubling, then bisection; capped
          in batch and seconds; an OOM probe empties the cache before the next);
  curves  a tiny BERT (2 layers, H = 128, V = 30,522) trained for --curve-steps steps on synthetic query/document
          pairs with each head from the same initial weights and data: the loss curves must agree within bf16 noise.
Writes results/train_<GPU>.json, .csv and .png, each with its provenance.

    python benchmarks/bench_train.py                     # everything, about 5 minutes on an H100
    python benchmarks/bench_train.py --sections step,curves --quick
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
from collections.abc import Callable
from pathlib import Path

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

SECTIONS = ("step", "memory", "batch", "curves")
QUERY_LEN, DOC_LEN = 32, 256
LAMBDA_Q, LAMBDA_D = 3e-4, 1e-4
# (name, transformers config class name, vocabulary); --step-batches gives each its step-timing batch
BODIES = (("bert-base", "BertConfig", 30_522), ("xlm-r-base", "XLMRobertaConfig", 250_002))


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


def make_config(kind: str, vocab: int, tiny: bool):
    import transformers

    size = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 512} if tiny \
        else {}
    extra = {"max_position_embeddings": 514, "type_vocab_size": 1} if kind == "XLMRobertaConfig" else {}
    return getattr(transformers, kind)(vocab_size=vocab, **size, **extra)


def eager_head(hidden: Tensor, weight: Tensor, bias: Tensor, mask: Tensor) -> Tensor:
    logits = F.linear(hidden, weight, bias)  # [B, L, V]: what the memory goes to
    return (torch.log1p(torch.relu(logits)) * mask.unsqueeze(-1)).amax(dim=1)


def sparton_head(hidden: Tensor, weight: Tensor, bias: Tensor, mask: Tensor) -> Tensor:
    """hidden and weight in one dtype (the kernel's); the step hands it a bf16 decoder made once for both sides."""
    return sparton.splade_max(hidden.to(weight.dtype), weight, bias, mask)


sparton_head.decoder_dtype = torch.bfloat16  # on CUDA; the eager heads get the fp32 decoder (autocast casts it)


def make_heads(device: str, names: tuple[str, ...]) -> dict[str, Callable]:
    heads = {"sparton": sparton_head, "eager": eager_head}
    if "compile" in names:
        heads["compile"] = torch.compile(eager_head, dynamic=False)
    return {name: heads[name] for name in names}


# ---------------------------------------------------------------------------------------------------- data, step


def random_batch(batch: int, vocab: int, device: str, generator: torch.Generator, quick: bool = False):
    """Queries of 16-32 tokens padded to 32, documents of 128-256 padded to 256 (shorter in a CPU smoke run)."""
    qlen, dlen = (8, 16) if quick and device == "cpu" else (QUERY_LEN, DOC_LEN)

    def side(length: int) -> tuple[Tensor, Tensor]:
        ids = torch.randint(5, vocab, (batch, length), generator=generator)
        lengths = torch.randint(length // 2, length + 1, (batch,), generator=generator)
        mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
        return ids.to(device), mask.to(device)

    return side(qlen), side(dlen)


def splade_loss(q: Tensor, d: Tensor) -> Tensor:
    """In-batch negatives: query i's positive is document i, every other document a negative; plus FLOPS."""
    scores = q @ d.T
    ce = F.cross_entropy(scores, torch.arange(q.shape[0], device=q.device))
    flops_q = (q.mean(0) ** 2).sum()
    flops_d = (d.mean(0) ** 2).sum()
    return ce + LAMBDA_Q * flops_q + LAMBDA_D * flops_d


def train_step(model: Splade, head: Callable, optimizer: torch.optim.Optimizer, batch, device: str) -> float:
    (q_ids, q_mask), (d_ids, d_mask) = batch
    decoder = model.decoder
    if device == "cuda" and getattr(head, "decoder_dtype", None) is not None:
        decoder = decoder.to(head.decoder_dtype)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
        q = head(model.hidden(q_ids, q_mask), decoder, model.bias, q_mask)
        d = head(model.hidden(d_ids, d_mask), decoder, model.bias, d_mask)
        loss = splade_loss(q.float(), d.float())
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def make_optimizer(model: nn.Module, device: str, lr: float = 2e-5) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=lr, fused=device == "cuda")


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def is_oom(error: RuntimeError) -> bool:
    """torch's allocator raises OutOfMemoryError; cuBLAS and cuDNN report a failed workspace allocation otherwise."""
    text = str(error)
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in text or "ALLOC_FAILED" in text


def release(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------------- sections


def section_step(model, heads, device, vocab, batch, args, gen) -> list[dict]:
    rows = []
    optimizer = make_optimizer(model, device)
    data = [random_batch(batch, vocab, device, gen, args.quick) for _ in range(3)]
    for name, head in heads.items():
        t0 = time.perf_counter()
        try:
            for i in range(args.warmup):  # compilation and autotuning happen here
                train_step(model, head, optimizer, data[i % 3], device)
            sync(device)
            warm_s = time.perf_counter() - t0
            times = []
            for i in range(args.steps):
                start = time.perf_counter()
                train_step(model, head, optimizer, data[i % 3], device)
                sync(device)
                times.append((time.perf_counter() - start) * 1e3)
        except RuntimeError as error:
            if not is_oom(error):
                raise
            row = {"section": "step", "vocab": vocab, "head": name, "batch": batch, "status": "OOM"}
        else:
            row = {"section": "step", "vocab": vocab, "head": name, "batch": batch, "status": "ok",
                   "ms": statistics.median(times), "ms_min": min(times), "ms_max": max(times),
                   "steps": len(times), "warmup_s": warm_s}
        release(device)
        rows.append(row)
        log(f"  step V={vocab} B={batch} {name:8} " + (f"{row['ms']:8.2f} ms (median of {row['steps']}, "
                                                          f"warm-up {row['warmup_s']:.1f} s)" if row["status"] == "ok"
                                                          else row["status"]))
    del optimizer
    release(device)
    base = {r["head"]: r for r in rows if r["status"] == "ok"}
    for r in rows:
        if r["status"] == "ok" and "sparton" in base and r["head"] != "sparton":
            r["sparton_speedup"] = r["ms"] / base["sparton"]["ms"]
    return rows


def section_memory(heads, device, vocab, hidden_size, batch) -> list[dict]:
    """The head alone, as the step calls it on documents, under autocast: fp32 [B, 256, H] hidden states (the
    LayerNorm's output), the decoder the step hands the head (fp32 for the eager heads, which autocast casts inside;
    the Sparton head's bf16 copy, made by the step before the head), fp32 bias, all requiring grad. The same shapes
    and dtypes as the step, so torch.compile's graphs are reused."""
    rows = []
    if device != "cuda":
        return rows
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name, head in heads.items():
        release(device)
        h = torch.randn(batch, DOC_LEN, hidden_size, device="cuda", generator=gen).requires_grad_()
        w = torch.randn(vocab, hidden_size, device="cuda", generator=gen) * 0.02
        w = w.to(getattr(head, "decoder_dtype", None) or w.dtype).requires_grad_()
        b = torch.zeros(vocab, device="cuda", requires_grad=True)
        mask = (torch.arange(DOC_LEN, device="cuda")[None, :] < torch.randint(128, 257, (batch, 1), device="cuda"))
        mask = mask.long()
        grad = torch.randn(batch, vocab, device="cuda", generator=gen)

        def call(head=head, h=h, w=w, b=b, mask=mask):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return head(h, w, b, mask)

        try:
            call().backward(grad)  # warm-up: compilation, autotuning, lazy workspaces
            h.grad = w.grad = b.grad = None
            release(device)
            sync(device)
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            out = call()
            forward_peak = torch.cuda.max_memory_allocated() - before
            out.backward(grad)
            sync(device)
            peak = torch.cuda.max_memory_allocated() - before
        except RuntimeError as error:
            if not is_oom(error):
                raise
            row = {"section": "memory", "vocab": vocab, "head": name, "batch": batch, "status": "OOM"}
        else:
            out_bytes = out.numel() * out.element_size()
            grads = sum(t.grad.numel() * t.grad.element_size() for t in (h, w, b))
            argmax = 4 * batch * vocab if name == "sparton" else 0  # saved int32 [B, V]
            # the Sparton head's bf16 copy of the hidden states (kept for backward) and its bf16 dH before autograd
            # casts it to the fp32 input's gradient: both are alive at the backward's peak
            cast = 4 * h.numel() if name == "sparton" else 0
            row = {"section": "memory", "vocab": vocab, "head": name, "batch": batch, "status": "ok",
                   "peak_bytes": peak, "forward_peak_bytes": forward_peak, "output_bytes": out_bytes,
                   "grad_bytes": grads, "argmax_bytes": argmax, "hidden_cast_bytes": cast,
                   "extra_bytes": peak - out_bytes - grads - argmax,
                   "kernel_extra_bytes": peak - out_bytes - grads - argmax - cast}
            del out
        rows.append(row)
        log(f"  memory V={vocab} B={batch} {name:8} " + (
            f"peak {row['peak_bytes'] / 2**20:9.1f} MiB, beyond output, gradients and argmax "
            f"{row['extra_bytes'] / 2**20:9.1f} MiB (less the bf16 hidden copies: "
            f"{row['kernel_extra_bytes'] / 2**20:.1f})"
            if row["status"] == "ok" else row["status"]))
        del h, w, b, grad
    release(device)
    return rows


def section_batch(model, heads, device, vocab, args, gen) -> list[dict]:
    """Largest batch whose whole training step fits: doubling from 8, then bisection to ~5%."""
    rows = []
    for name in args.batch_heads:
        if name not in heads:
            continue
        head = heads[name]
        optimizer = make_optimizer(model, device)
        train_step(model, head, optimizer, random_batch(2, vocab, device, gen, args.quick), device)  # Adam state
        deadline = time.perf_counter() + args.batch_seconds
        probes: list[tuple[int, bool]] = []

        def fits(batch: int, head=head, optimizer=optimizer, probes=probes) -> bool:
            release(device)
            try:
                train_step(model, head, optimizer, random_batch(batch, vocab, device, gen, args.quick), device)
                sync(device)
                ok = True
            except RuntimeError as error:
                if not is_oom(error):
                    raise
                ok = False
            optimizer.zero_grad(set_to_none=True)
            release(device)
            probes.append((batch, ok))
            return ok

        low, high, capped = 0, None, False
        batch = 8
        while time.perf_counter() < deadline:
            if batch > args.batch_cap:
                capped = True
                break
            if not fits(batch):
                high = batch
                break
            low, batch = batch, batch * 2
        while high is not None and high - low > max(1, low // 20) and time.perf_counter() < deadline:
            middle = (low + high) // 2
            if fits(middle):
                low = middle
            else:
                high = middle
        row = {"section": "batch", "vocab": vocab, "head": name, "status": "ok", "max_batch": low,
               "first_failing": high, "capped": capped, "timed_out": time.perf_counter() >= deadline,
               "probes": len(probes), "cap": args.batch_cap}
        rows.append(row)
        log(f"  batch V={vocab} {name:8} largest fitting {low}" + (f", {high} did not" if high else "")
            + (" (cap reached)" if capped else "") + (" (time budget reached)" if row["timed_out"] else "")
            + f"; {len(probes)} probes")
        del optimizer
        release(device)
    fit = {r["head"]: r["max_batch"] for r in rows}
    for r in rows:
        if r["head"] == "sparton" and fit.get("eager"):
            r["ratio_to_eager"] = r["max_batch"] / fit["eager"]
    return rows


def synthetic_pairs(n_batches: int, batch: int, vocab: int, device: str, seed: int, quick: bool):
    """Query/document pairs that share terms: a query is 8-16 terms of a topic; its document holds them among other
    terms of the topic and random ones. A model that learns the shared terms ranks the positive first."""
    gen = torch.Generator().manual_seed(seed)
    qlen, dlen = (16, 32) if quick else (QUERY_LEN, 128)
    batches = []
    for _ in range(n_batches):
        q_ids = torch.zeros(batch, qlen, dtype=torch.long)
        d_ids = torch.randint(1000, vocab, (batch, dlen), generator=gen)
        q_mask = torch.zeros(batch, qlen, dtype=torch.long)
        d_mask = torch.ones(batch, dlen, dtype=torch.long)
        for i in range(batch):
            topic = torch.randint(1000, vocab, (24,), generator=gen)
            n = int(torch.randint(qlen // 4, qlen // 2 + 1, (1,), generator=gen))
            q_ids[i, :n] = topic[torch.randperm(24, generator=gen)[:n]]
            q_mask[i, :n] = 1
            where = torch.randperm(dlen, generator=gen)[:24]
            d_ids[i, where] = topic
            cut = int(torch.randint(dlen // 2, dlen + 1, (1,), generator=gen))
            d_mask[i, cut:] = 0
            d_ids[i, where[where >= cut]] = topic[: int((where >= cut).sum())]  # keep the topic inside the document
        batches.append(((q_ids.to(device), q_mask.to(device)), (d_ids.to(device), d_mask.to(device))))
    return batches


def section_curves(device: str, args) -> tuple[list[dict], dict]:
    vocab = 30_522 if device == "cuda" else 2_000  # a CPU smoke run exercises the code, not the scale
    torch.manual_seed(0)
    base = Splade(make_config("BertConfig", vocab, tiny=True)).to(device)
    data = synthetic_pairs(8, 16 if args.quick else 32, vocab, device, 1, args.quick)
    curves = {}
    for name in ("sparton", "eager"):
        torch.manual_seed(1)  # the same dropout masks for both heads
        model = copy.deepcopy(base)
        optimizer = make_optimizer(model, device, lr=1e-4)
        losses = [float(train_step(model, make_heads(device, (name,))[name], optimizer, data[i % len(data)], device))
                  for i in range(args.curve_steps)]
        curves[name] = losses
        log(f"  curves {name:8} loss {losses[0]:.4f} → {losses[-1]:.4f} over {len(losses)} steps")
        del model, optimizer
        release(device)
    rel = [abs(s - e) / max(abs(e), 1e-12) for s, e in zip(curves["sparton"], curves["eager"])]
    summary = {"steps": args.curve_steps, "max_rel_diff": max(rel), "first_rel_diff": rel[0], "final_rel_diff": rel[-1],
               "mean_rel_diff": statistics.mean(rel), "first_loss": curves["eager"][0],
               "last_loss": {k: v[-1] for k, v in curves.items()}}
    log(f"  curves: relative difference of the losses: first step {summary['first_rel_diff']:.2e} (same weights: "
        f"the heads' rounding alone), max {summary['max_rel_diff']:.2e}, mean {summary['mean_rel_diff']:.2e}, "
        f"final {summary['final_rel_diff']:.2e}")
    rows = [{"section": "curves", "vocab": vocab, "head": name, "step": i, "loss": loss}
            for name, losses in curves.items() for i, loss in enumerate(losses)]
    return rows, {"summary": summary, "curves": curves}


# ---------------------------------------------------------------------------------------------------- output


def write_results(out: Path, gpu: str, meta: dict, rows: list[dict], curves: dict | None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    prov = provenance()
    out.mkdir(parents=True, exist_ok=True)
    stem = out / ("train_" + gpu.replace(" ", "_").replace("/", "_"))
    stem.with_suffix(".json").write_text(json.dumps(with_provenance({"meta": meta, "rows": [
        r for r in rows if r["section"] != "curves"], "curves": curves}, prov), indent=1))
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with stem.with_suffix(".csv").open("w", newline="") as f:
        f.write(csv_line(prov))
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    colors = {"sparton": "C0", "eager": "C3", "compile": "C2"}
    if curves:
        for name, losses in curves["curves"].items():
            axes[0].plot(losses, color=colors[name], lw=1, ls="-" if name == "sparton" else "--", label=name)
        axes[0].set_title(f"tiny BERT loss, same weights and data (max rel. diff "
                          f"{curves['summary']['max_rel_diff']:.1e})")
        axes[0].set_xlabel("step")
        axes[0].legend()
    for ax, section, key, title in ((axes[1], "step", "ms", "step time (ms), same batch"),
                                    (axes[2], "batch", "max_batch", "largest batch that fits")):
        ok = [r for r in rows if r["section"] == section and r.get("status") == "ok"]
        labels = [f"V={r['vocab']}\n{r['head']}" + (f"\nB={r['batch']}" if "batch" in r else "") for r in ok]
        ax.bar(range(len(ok)), [r[key] for r in ok], color=[colors.get(r["head"], "C7") for r in ok])
        ax.set_xticks(range(len(ok)), labels, fontsize=7)
        ax.set_title(title)
        if section == "batch":
            ax.set_yscale("log")
    fig.suptitle(f"SPLADE training step, Sparton vs eager heads, {gpu}")
    fig.tight_layout()
    fig.savefig(stem.with_suffix(".png"), dpi=110, metadata=png_metadata(prov))
    plt.close(fig)
    log(f"wrote {stem}.json/.csv/.png")
    return stem


def summarize(rows: list[dict]) -> None:
    log("\nsummary")
    for vocab in sorted({r["vocab"] for r in rows if r["section"] != "curves"}):
        step = {r["head"]: r for r in rows if r["section"] == "step" and r["vocab"] == vocab}
        if "sparton" in step and step["sparton"]["status"] == "ok":
            for name in ("eager", "compile"):
                if name in step:
                    r = step[name]
                    ratio = f"{r['sparton_speedup']:.2f}x" if r["status"] == "ok" else r["status"]
                    log(f"  V={vocab}: sparton step vs {name}: {ratio} at B={r['batch']}")
        fit = {r["head"]: r for r in rows if r["section"] == "batch" and r["vocab"] == vocab}
        if "sparton" in fit and "eager" in fit:
            log(f"  V={vocab}: largest batch sparton {fit['sparton']['max_batch']} vs eager "
                f"{fit['eager']['max_batch']}: {fit['sparton'].get('ratio_to_eager', float('nan')):.1f}x"
                + (" (sparton at the cap)" if fit["sparton"]["capped"] else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {SECTIONS}")
    parser.add_argument("--quick", action="store_true", help="fewer steps and probes (a fast look, or CPU smoke run)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--bodies", default="bert-base,xlm-r-base")
    parser.add_argument("--heads", default="sparton,eager,compile")
    parser.add_argument("--batch-heads", default="sparton,eager")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per head")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch-cap", type=int, default=2048)
    parser.add_argument("--batch-seconds", type=float, default=25.0, help="time budget of one largest-batch search")
    parser.add_argument("--step-batches", default="64,16", help="step-timing batch of each body (one eager fits)")
    parser.add_argument("--curve-steps", type=int, default=300)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    sections = [s for s in args.sections.split(",") if s]
    if unknown := set(sections) - set(SECTIONS):
        parser.error(f"unknown sections {unknown}")
    cpu = args.device == "cpu"
    if args.quick:
        args.steps, args.warmup = min(args.steps, 3), min(args.warmup, 1)
        args.batch_seconds = min(args.batch_seconds, 5.0 if cpu else 15.0)
        args.curve_steps = min(args.curve_steps, 20 if cpu else 100)
    if cpu:
        args.batch_cap = min(args.batch_cap, 16)
    heads_wanted = tuple(h for h in args.heads.split(",") if h and not (cpu and h == "compile"))
    args.batch_heads = [h for h in args.batch_heads.split(",") if h]
    gpu = torch.cuda.get_device_name() if not cpu else "cpu"
    log(f"{gpu}: torch {torch.__version__}; sections {sections}; heads {heads_wanted}; bf16 autocast, fp32 master "
        f"weights, fused AdamW")
    meta = {"gpu": gpu, "device": args.device, "args": {k: str(v) for k, v in vars(args).items()},
            "precision": "bf16 autocast over fp32 weights; sparton head on bf16 hidden states and decoder copy",
            "query_len": QUERY_LEN, "doc_len": DOC_LEN, "lambda_q": LAMBDA_Q, "lambda_d": LAMBDA_D}
    rows: list[dict] = []
    curves = None
    started = time.perf_counter()
    gen = torch.Generator().manual_seed(0)
    wanted = args.bodies.split(",")
    if "curves" in sections:  # first: short, and wanted even when a later section runs out of time
        log("curves")
        curve_rows, curves = section_curves(args.device, args)
        rows += curve_rows
        write_results(args.out, gpu, meta, rows, curves)
    if any(s in sections for s in ("step", "memory", "batch")):
        step_batches = [int(x) for x in args.step_batches.split(",")]
        for (name, kind, vocab), step_batch in zip(BODIES, step_batches):
            if name not in wanted:
                continue
            if cpu:
                vocab, step_batch = {30_522: 1_000, 250_002: 3_001}[vocab], 4
            log(f"{name} (V={vocab}), {time.perf_counter() - started:.0f} s in")
            heads = make_heads(args.device, heads_wanted)
            model = Splade(make_config(kind, vocab, tiny=cpu)).to(args.device)
            if "step" in sections:
                rows += section_step(model, heads, args.device, vocab, step_batch, args, gen)
            if "memory" in sections:
                rows += section_memory(heads, args.device, vocab, model.decoder.shape[1], step_batch)
            if "batch" in sections:
                rows += section_batch(model, heads, args.device, vocab, args, gen)
            del model, heads
            release(args.device)
            write_results(args.out, gpu, meta, rows, curves)  # kept if a later part runs out of time
    meta["seconds"] = time.perf_counter() - started
    write_results(args.out, gpu, meta, rows, curves)
    summarize(rows)
    log(f"done in {meta['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
