"""Benchmark the Sparton fused SPLADE head against PyTorch eager and torch.compile on one GPU.

Times (triton.testing.do_bench medians; it flushes L2 between runs) the kernel on padded and packed input,
the eager head (F.linear -> log1p(relu) -> x mask -> amax over the sequence, as SPLADE / sentence-transformers
do), the same under torch.compile, and the FLOP floor 2·tokens·H·V at the bf16 matmul rate (8192³) measured
warm in this run: the higher of a reading before and one after the timings.
Every timing runs after at least 300 ms of warm-up calls, so it sees the clock a long job sees: under sustained
tensor-core load a Hopper GPU holds its 700 W power cap by lowering the SM clock well below its cold clock
(docs/performance/sparton-head.md, "Power cap and clocks"). nvidia-smi samples the SM clock, the
board power (power.draw, which the driver averages over about a second) and the power-cap flag every 50 ms; each
row records the medians over its timed window (sm_mhz, watts) and the share of samples at the cap (power_capped).
Peak memory is torch.cuda.max_memory_allocated during the call minus what was allocated before it (inputs,
weights). Also finds the largest batch whose whole head (weights, inputs, output, temporaries) fits a 16 GiB
budget, for the kernel and for eager. Writes results/head_<GPU>.json / .csv / .png.

    python benchmarks/bench_head.py              # full run, a few minutes
    python benchmarks/bench_head.py --sweep      # time every kernel config at a few shapes; SASS check
"""

import argparse
import csv
import json
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

HIDDEN, SEQ = 768, 256
VOCABS = (30_522, 250_002)
BATCHES = (16, 32, 64, 128, 256, 512)
COMPILE_AT = {30_522: (128, 512), 250_002: (128,)}  # torch.compile costs ~10-30 s per shape
FP16_AT = (128,)
BUDGET = 16 * 2**30
ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def load_sparton():
    """`import sparton`: the installed package, else the repository's own."""
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))
    import sparton

    return sparton


sparton = load_sparton()


def eager_head(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    logits = F.linear(hidden, weight, bias)  # [B, L, V] in the model dtype: the memory problem
    return (torch.log1p(torch.relu(logits)) * mask.unsqueeze(-1)).amax(dim=1)


class GpuMonitor:
    """SM clock, board power and the power-cap flag of this process's GPU, sampled by nvidia-smi in the
    background; `window` summarises the samples of one timed interval. Without nvidia-smi it records nothing."""

    POWER_CAP = 0x4  # clocks_throttle_reasons.active bit: software power cap

    def __init__(self, period_ms: int = 50, start_timeout_s: float = 5.0) -> None:
        self.samples: list[tuple[float, float, float, int]] = []
        self._first = threading.Event()
        uuid = f"GPU-{torch.cuda.get_device_properties(torch.cuda.current_device()).uuid}"
        query = "clocks.sm,power.draw,clocks_throttle_reasons.active"
        try:
            self.proc = subprocess.Popen(
                ["nvidia-smi", f"--id={uuid}", f"--query-gpu={query}", "--format=csv,noheader,nounits",
                 f"-lms={period_ms}"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            )
        except OSError:
            self.proc = None
            return
        threading.Thread(target=self._read, daemon=True).start()
        # nvidia-smi takes a moment to start: wait for its first sample, so no timing begins before one can exist
        self._first.wait(start_timeout_s)

    def _read(self) -> None:
        try:
            for line in self.proc.stdout:
                try:
                    mhz, watts, reasons = (x.strip() for x in line.split(","))
                    self.samples.append((time.time(), float(mhz), float(watts), int(reasons, 16)))
                    self._first.set()
                except ValueError:  # "[N/A]" fields
                    continue
        finally:  # nvidia-smi ended (e.g. an unsupported query): nothing more to wait for
            self._first.set()

    def window(self, t0: float, t1: float) -> dict:
        return window_state(self.samples, t0, t1)

    def close(self) -> None:
        if self.proc is not None:
            self.proc.terminate()


def window_state(samples: list[tuple[float, float, float, int]], t0: float, t1: float) -> dict:
    """Medians of the samples taken in [t0, t1]; null fields when there are none (no nvidia-smi, or a timing
    shorter than the sampling period on a slow-starting sampler): a row is never short of its keys."""
    inside = [s for s in samples if t0 <= s[0] <= t1]
    if not inside:
        return dict.fromkeys(STATE_KEYS)
    return {
        "sm_mhz": statistics.median(s[1] for s in inside),
        "watts": statistics.median(s[2] for s in inside),
        "power_capped": sum(bool(s[3] & GpuMonitor.POWER_CAP) for s in inside) / len(inside),
    }


STATE_KEYS = ("sm_mhz", "watts", "power_capped")
MONITOR: GpuMonitor | None = None  # set by benchmark()
WARMUP_MS = 300  # long enough for the power cap to settle (it acts within ~100 ms)


def _timed(fn: Callable[[], object], warmup: float, rep: float) -> tuple[float, dict]:
    """do_bench median of fn and the GPU state during its timed calls."""
    t0 = time.time()
    ms = do_bench(fn, warmup=warmup, rep=rep, return_mode="median")
    return ms, MONITOR.window(t0 + warmup / 1e3, time.time()) if MONITOR else dict.fromkeys(STATE_KEYS)


def matmul_peak_tflops(warmup_ms: float = WARMUP_MS, dtype: torch.dtype = torch.bfloat16) -> tuple[float, dict]:
    """Rate of an 8192³ cuBLAS matmul (bf16: the floor). A GPU that idled before runs its first second above the
    power cap's sustained clock, and reads several percent faster (docs/performance/sparton-head.md, "Power cap and
    clocks"): benchmark() warms it for 2 s first, so the floor is read in the state the timings run in."""
    a = torch.randn(8192, 8192, device="cuda", dtype=dtype)
    b = torch.randn(8192, 8192, device="cuda", dtype=dtype)
    ms, state = _timed(lambda: a @ b, warmup=warmup_ms, rep=500)
    return 2 * 8192**3 / ms / 1e9, state


def measure(fn: Callable[[], object], rep: int = 200) -> dict:
    """Median time, extra peak memory and GPU state of fn, or {'status': 'OOM'}."""
    try:
        fn()  # warm-up: autotuning (with do_bench's 256 MB L2-flush buffer) and compilation happen here
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        once = (time.perf_counter() - start) * 1e3
        peak = torch.cuda.max_memory_allocated() - before
        # do_bench runs about rep / (its own estimate) timed calls: at least ~15, or a 100 ms call gets a median of 2
        ms, state = _timed(fn, warmup=max(WARMUP_MS, 3 * once), rep=max(rep, 15 * once))
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return {"status": "OOM"}
    return {"status": "ok", "ms": ms, "peak_bytes": peak, **state}


def make_inputs(batch: int, vocab: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    weight = torch.randn(vocab, HIDDEN, device="cuda", generator=g, dtype=dtype) / HIDDEN**0.5
    bias = torch.randn(vocab, device="cuda", generator=g, dtype=dtype) - 1.0
    hidden = torch.randn(batch, SEQ, HIDDEN, device="cuda", generator=g, dtype=dtype)
    mask = torch.ones(batch, SEQ, device="cuda", dtype=dtype)
    return hidden, weight, bias, mask


def packed_inputs(n_tokens: int, dtype: torch.dtype, seed: int = 1):
    """Short documents (20..100 tokens, ~60 on average, like MS MARCO passages) totalling about n_tokens."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(20, 101, (n_tokens // 20,), generator=g)
    lengths = lengths[: int((lengths.cumsum(0) <= n_tokens).sum())]
    cu = torch.zeros(lengths.numel() + 1, dtype=torch.int32)
    cu[1:] = lengths.cumsum(0)
    tokens = torch.randn(int(cu[-1]), HIDDEN, device="cuda", dtype=dtype)
    return tokens, cu.cuda(), int(lengths.max())


def floor_ms(tokens: int, vocab: int, tflops: float) -> float:
    return 2 * tokens * HIDDEN * vocab / (tflops * 1e12) * 1e3


def fit_batch(kind: str, vocab: int, probe: tuple[int, int]) -> dict:
    """Largest batch whose whole head (weights, inputs, output, temporaries) fits BUDGET: total memory is
    linear in the batch, so two probes give the line; the prediction is then run to check it."""

    def total(batch: int) -> int | None:
        torch.cuda.empty_cache()
        try:
            inputs = make_inputs(batch, vocab, torch.bfloat16)
            torch.cuda.reset_peak_memory_stats()
            with torch.inference_mode():
                (sparton.splade_max if kind == "kernel" else eager_head)(*inputs)
            torch.cuda.synchronize()
        except torch.OutOfMemoryError:
            return None
        finally:
            inputs = None
        return torch.cuda.max_memory_allocated()

    m0, m1 = total(probe[0]), total(probe[1])
    slope = (m1 - m0) / (probe[1] - probe[0])
    batch = int((BUDGET - (m0 - slope * probe[0])) // slope)
    seen = total(batch)
    while seen is None or seen > BUDGET:  # the linear model was a little optimistic
        batch = int(batch * 0.97)
        seen = total(batch)
    return {"max_batch": batch, "bytes_at_max": seen, "bytes_per_doc": slope}


def benchmark(out: Path) -> None:
    global MONITOR
    MONITOR = GpuMonitor()
    gpu = torch.cuda.get_device_name()
    cold, cold_state = matmul_peak_tflops()
    tflops, state = matmul_peak_tflops(warmup_ms=2000)
    print(
        f"{gpu}: bf16 matmul 8192³ {cold:.0f} TFLOP/s cold {_state(cold_state)}, {tflops:.0f} TFLOP/s warm "
        f"{_state(state)}; torch {torch.__version__}, triton {triton.__version__}"
    )
    meta = {
        "gpu": gpu,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "matmul_bf16_tflops": tflops,
        "matmul_state": state,
        "matmul_bf16_tflops_cold": cold,
        "matmul_state_cold": cold_state,
        "warmup_ms": WARMUP_MS,
        "hidden": HIDDEN,
        "seq": SEQ,
        "budget_bytes": BUDGET,
    }
    rows = []
    compiled = torch.compile(eager_head, dynamic=False)
    torch._dynamo.config.cache_size_limit = 64
    t_start = time.time()
    for vocab in VOCABS:
        for batch in BATCHES:
            for dtype in (torch.bfloat16, torch.float16):
                if dtype == torch.float16 and batch not in FP16_AT:
                    continue
                hidden, weight, bias, mask = make_inputs(batch, vocab, dtype)
                base = {"vocab": vocab, "batch": batch, "seq": SEQ, "dtype": str(dtype).split(".")[-1]}
                floor = floor_ms(batch * SEQ, vocab, tflops)
                out_bytes = 4 * batch * vocab
                inputs = (hidden, weight, bias, mask)
                variants = {
                    "kernel": partial(sparton.splade_max, *inputs),
                    "eager": partial(eager_head, *inputs),
                }
                if dtype == torch.bfloat16 and batch in COMPILE_AT[vocab]:
                    variants["compile"] = partial(compiled, *inputs)
                for name, fn in variants.items():
                    with torch.inference_mode():
                        r = measure(fn)
                    rows.append({**base, "variant": name, "tokens": batch * SEQ, "floor_ms": floor, **r})
                n_rows = len(variants) + 1
                del hidden, mask, inputs, variants
                tokens, cu, longest = packed_inputs(batch * SEQ, dtype)
                with torch.inference_mode():
                    r = measure(partial(sparton.splade_max_packed, tokens, weight, bias, cu, longest))
                n_docs = cu.numel() - 1
                rows.append(
                    {
                        **base,
                        "batch": n_docs,
                        "variant": "kernel_packed",
                        "tokens": tokens.shape[0],
                        "floor_ms": floor_ms(tokens.shape[0], vocab, tflops),
                        **r,
                    }
                )
                del tokens, weight, bias
                for row in rows[-n_rows:]:
                    if row["status"] == "ok":
                        row["x_floor"] = row["ms"] / row["floor_ms"]
                        out_b = 4 * row["batch"] * vocab if row["variant"] == "kernel_packed" else out_bytes
                        row["extra_bytes_beyond_output"] = row["peak_bytes"] - out_b
                    print(_fmt(row), flush=True)
    print(f"timings took {time.time() - t_start:.0f} s", flush=True)
    # The warm rate moves between machine starts and a little within a run: measure it again and hold every row
    # to the higher of the two warm readings, so no ratio profits from a slow moment.
    again, state = matmul_peak_tflops()
    meta["matmul_bf16_tflops_after"] = again
    meta["matmul_state_after"] = state
    # fp16 operands cost the tensor cores more energy than bf16 ones: at the power cap cuBLAS runs them slower too
    fp16, fp16_state = matmul_peak_tflops(dtype=torch.float16)
    meta["matmul_fp16_tflops"] = fp16
    meta["matmul_fp16_state"] = fp16_state
    print(f"fp16 matmul 8192³ after the timings: {fp16:.0f} TFLOP/s {_state(fp16_state)}", flush=True)
    for row in rows:
        if row["dtype"] == "float16" and row["status"] == "ok" and row["variant"].startswith("kernel"):
            row["x_fp16_floor"] = row["ms"] / floor_ms(row["tokens"], row["vocab"], fp16)
            print(f"  {row['variant']} V={row['vocab']} B={row['batch']} fp16: {row['x_fp16_floor']:.2f}x fp16 floor")
    if again > tflops:
        meta["matmul_bf16_tflops"] = tflops = again
        for row in rows:
            row["floor_ms"] = floor_ms(row["tokens"], row["vocab"], tflops)
            if row["status"] == "ok":
                row["x_floor"] = row["ms"] / row["floor_ms"]
    print(f"bf16 matmul after the timings: {again:.0f} TFLOP/s {_state(state)}; floors use {tflops:.0f}", flush=True)
    write_results(gpu, meta, rows, {}, out)  # in case the fit search runs out of time
    fits = {}
    for vocab in VOCABS:
        fits[vocab] = {
            "kernel": fit_batch("kernel", vocab, (256, 512)),
            "eager": fit_batch("eager", vocab, (8, 16)),
        }
        ratio = fits[vocab]["kernel"]["max_batch"] / fits[vocab]["eager"]["max_batch"]
        fits[vocab]["ratio"] = ratio
        print(
            f"16 GiB fit V={vocab}: kernel {fits[vocab]['kernel']['max_batch']}, "
            f"eager {fits[vocab]['eager']['max_batch']}, ratio {ratio:.1f}x",
            flush=True,
        )
    tuned = getattr(sparton.splade_head, "_splade_max_tuned", None)  # private: may move with the kernel
    meta["autotuned_configs"] = {str(k): str(v) for k, v in getattr(tuned, "cache", {}).items()}
    write_results(gpu, meta, rows, fits, out)
    summary(rows, fits)


def _state(state: dict) -> str:
    """'@ 1560 MHz 699 W (capped 100%)', or '' for a row without GPU samples."""
    if state.get("sm_mhz") is None:
        return ""
    return f"@ {state['sm_mhz']:.0f} MHz {state['watts']:.0f} W (capped {state['power_capped']:.0%})"


def _fmt(row: dict) -> str:
    head = f"V={row['vocab']:>7} B={row['batch']:>4} {row['dtype']:>8} {row['variant']:>13}"
    if row["status"] != "ok":
        return f"{head}  {row['status']}"
    return (
        f"{head} {row['ms']:9.3f} ms  {row['x_floor']:5.2f}x floor  peak {row['peak_bytes'] / 2**20:9.1f} MiB"
        f"  (+{row['extra_bytes_beyond_output'] / 2**20:8.1f} MiB beyond output) {_state(row)}"
    )


def write_results(gpu: str, meta: dict, rows: list[dict], fits: dict, out: Path = RESULTS) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tag = gpu.replace("NVIDIA", "").split()[0]
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"head_{tag}"
    stem.with_suffix(".json").write_text(
        json.dumps({"meta": meta, "rows": rows, "fit_16GiB": fits}, indent=1)
    )
    fields = sorted(
        {k for r in rows for k in r}, key=lambda k: list(rows[0]).index(k) if k in rows[0] else 99
    )
    with stem.with_suffix(".csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for vocab, style in zip(VOCABS, ("-", "--")):
        for variant, color in (("kernel", "C0"), ("eager", "C3"), ("compile", "C2")):
            pts = [
                r
                for r in rows
                if r["vocab"] == vocab and r["variant"] == variant and r["dtype"] == "bfloat16"
            ]
            ok = [r for r in pts if r["status"] == "ok"]
            for ax, key, scale in ((axes[0], "ms", 1), (axes[1], "peak_bytes", 2**-30)):
                ax.plot(
                    [r["batch"] for r in ok],
                    [r[key] * scale for r in ok],
                    style,
                    color=color,
                    marker="o",
                    label=f"{variant} V={vocab}",
                )
            for r in pts:
                if r["status"] == "OOM":
                    axes[0].annotate("OOM", (r["batch"], axes[0].get_ylim()[1]), color=color, fontsize=7)
        floor = [
            r for r in rows if r["vocab"] == vocab and r["variant"] == "kernel" and r["dtype"] == "bfloat16"
        ]
        axes[0].plot(
            [r["batch"] for r in floor],
            [r["floor_ms"] for r in floor],
            style,
            color="k",
            lw=1,
            label=f"FLOP floor V={vocab}",
        )
    for ax, title in ((axes[0], "time (ms)"), (axes[1], "peak memory of the call, inputs excluded (GiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch (documents of 256 tokens)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(
        f"SPLADE head, H={HIDDEN}, bf16, {gpu} ({meta['matmul_bf16_tflops']:.0f} TFLOP/s bf16 matmul, warm)"
    )
    fig.tight_layout()
    fig.savefig(stem.with_suffix(".png"), dpi=120)
    shown = stem.resolve().relative_to(ROOT) if stem.resolve().is_relative_to(ROOT) else stem
    print(f"wrote {shown}.json/.csv/.png")  # repository-relative where possible: logs get committed


def summary(rows: list[dict], fits: dict) -> None:
    """Short table, printed last: kernel vs floor, eager and compile at each measured point."""
    print("\nV        B     dtype     kernel ms  x floor  eager/k  compile/k  packed x floor  extra MiB")
    for r in rows:
        if r["variant"] != "kernel":
            continue
        same = {
            x["variant"]: x
            for x in rows
            if (x["vocab"], x["dtype"]) == (r["vocab"], r["dtype"])
            and x["batch"] == r["batch"]
            and x["variant"] in ("eager", "compile")
        }
        packed = next(x for x in rows[rows.index(r) :] if x["variant"] == "kernel_packed")

        def ratio(name: str, same: dict = same, r: dict = r) -> str:
            x = same.get(name)
            if x is None:
                return "-"
            return "OOM" if x["status"] != "ok" else f"{x['ms'] / r['ms']:.2f}"

        if r["status"] != "ok":
            print(f"{r['vocab']:<8} {r['batch']:<5} {r['dtype']:<9} {r['status']}")
            continue
        px = f"{packed['x_floor']:.2f}" if packed["status"] == "ok" else packed["status"]
        print(
            f"{r['vocab']:<8} {r['batch']:<5} {r['dtype']:<9} {r['ms']:9.3f} {r['x_floor']:8.2f} "
            f"{ratio('eager'):>8} {ratio('compile'):>10} {px:>15} "
            f"{r['extra_bytes_beyond_output'] / 2**20:10.1f}"
        )
    for vocab, f in fits.items():
        print(
            f"16 GiB budget V={vocab}: kernel {f['kernel']['max_batch']} docs, "
            f"eager {f['eager']['max_batch']} "
            f"docs: {f['ratio']:.1f}x"
        )


# Candidates timed by --sweep besides the tuned list: a tall tile (128 × 256, 32-column slabs) for long documents,
# other slab widths and groupings, a deeper pipeline, longer K steps.
SWEEP_EXTRA = [
    sparton.splade_head._config(128, 256, 64, 8, 3, group=16, slab=32),
    sparton.splade_head._config(256, 128, 64, 8, 3, group=64, slab=32),
    sparton.splade_head._config(256, 128, 64, 8, 3, group=32, slab=16),
    sparton.splade_head._config(256, 128, 64, 8, 4, group=64, slab=16),
    sparton.splade_head._config(256, 128, 128, 8, 2, group=64, slab=16),
]


def sweep() -> None:
    """Every config of the autotuning list at a few shapes, plus the SASS of each compiled variant."""
    head = sparton.splade_head
    tflops, _ = matmul_peak_tflops()
    print(f"{torch.cuda.get_device_name()}: {tflops:.0f} TFLOP/s bf16; triton {triton.__version__}")
    shapes = [
        ("padded", 128, 30_522),
        ("padded", 128, 250_002),
        ("packed", 128, 30_522),
        ("packed", 128, 250_002),
    ]
    seen: set = set()
    for kind, batch, vocab in shapes:
        hidden, weight, bias, mask = make_inputs(batch, vocab, torch.bfloat16)
        tokens, cu, _ = packed_inputs(batch * SEQ, torch.bfloat16)
        n_tok = batch * SEQ if kind == "padded" else tokens.shape[0]
        ref = None
        for cfg in [head._CONFIG_16, *SWEEP_EXTRA]:
            config = {**cfg.kwargs, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
            if kind == "padded":
                fn = partial(head.splade_max_triton, hidden, weight, bias, mask, config=config)
            else:
                fn = partial(head.splade_max_packed_triton, tokens, weight, bias, cu, config=config)
            try:
                out = fn()
            except Exception as e:  # a config that does not fit this GPU
                print(f"{kind} V={vocab} {config}: {type(e).__name__}: {e}")
                continue
            ref = out if ref is None else ref
            same = torch.allclose(out, ref, rtol=1e-4, atol=1e-5)
            ms = do_bench(fn, warmup=25, rep=200, return_mode="median")
            fl = floor_ms(n_tok, vocab, tflops)
            print(
                f"{kind:6} V={vocab:>7} tok={n_tok:>6} {config}: {ms:8.3f} ms {ms / fl:5.2f}x floor "
                f"{2 * n_tok * HIDDEN * vocab / ms / 1e9:5.0f} TFLOP/s agree={same}",
                flush=True,
            )
            for key, compiled in _compiled_kernels(head._splade_max_kernel):
                if key not in seen:
                    seen.add(key)
                    print("    " + _describe(compiled))


def _compiled_kernels(kernel) -> list:
    """(key, CompiledKernel) pairs in a JITFunction's cache (layout of Triton 3.x's device_caches)."""
    return [kv for cache in getattr(kernel, "device_caches", {}).values() for kv in cache[0].items()]


def _describe(compiled) -> str:
    try:
        sass = compiled.asm["sass"]
    except Exception as e:  # cuobjdump missing
        sass = f"no sass: {e}"
    mma = sorted({w for w in sass.split() if w.startswith(("HGMMA", "HMMA"))})
    md = compiled.metadata
    return (
        f"compiled: warps={md.num_warps} stages={md.num_stages} shared={md.shared} regs={compiled.n_regs} "
        f"spills={compiled.n_spills} mma={mma[:3]}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sweep", action="store_true", help="time each kernel config instead of the full run"
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory for head_<GPU>.json/.csv/.png")
    args = parser.parse_args()
    try:
        if args.sweep:
            sweep()
        else:
            benchmark(args.out)
    finally:
        if MONITOR is not None:
            MONITOR.close()
