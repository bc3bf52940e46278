"""Is the GPU idle, or busier, when lsr-index encodes end to end than when the model runs alone?

One process: a random-weight BERT-base (as bench_encode.py makes it) over synthetic ~57-token documents; a warm
end-to-end run first (Triton, cuDNN and cuBLAS caches), then under torch.profiler (CUDA activity only) the end-to-end
run (file → shards) and the model-only run (pre-tokenized, sorted at once). For each it reports from the kernels'
own timestamps: the wall clock, the GPU's busy time (the union of kernel intervals), the sum of kernel times by
kind, the idle time before the first kernel, between kernels (gaps by size) and after the last one. Each gap of
1 ms or more is then placed on the host: was the next kernel launched late (and what the launching thread was in
meanwhile: its outermost torch ops, or none = Python), or launched in time but queued behind something else.

    python benchmarks/gpu_busy.py --tokenizer DIR [--docs 131072] [--arch bert-base] [--out benchmarks/results]

Writes gpu_busy_<GPU>.json. A GPU-only tool: the question it answers does not arise on a CPU.
"""

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_encode import make_model, run_lsr_index, run_lsr_model_only, synthetic_corpus, words_from

GAPS_US = (10, 100, 1_000, 10_000, 100_000)  # idle gaps are counted and summed per size class, in µs
MARK_CYCLES = 1_000  # torch.cuda._sleep marks the start and the end of a run on the GPU's own clock


def kind(name: str) -> str:
    """Coarse kernel classes: enough to see where extra GPU time goes."""
    low = name.lower()
    for key, label in (("spin_kernel", "mark"), ("splade", "sparton head"), ("gemm", "gemm"), ("cutlass", "gemm"),
                       ("sm90", "gemm"), ("flash", "attention"),
                       ("fmha", "attention"), ("attention", "attention"), ("softmax", "softmax"),
                       ("layer_norm", "layer norm"), ("norm", "layer norm"), ("memcpy", "copy"), ("copy", "copy"),
                       ("elementwise", "elementwise"), ("reduce", "reduce"), ("index", "index/scatter"),
                       ("scatter", "index/scatter"), ("sort", "sort")):
        if key in low:
            return label
    return "other"


def outermost(ops: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """The ops of one thread not nested in another (sorted by start)."""
    top: list[tuple[float, float, str]] = []
    for start, stop, name in sorted(ops, key=lambda o: (o[0], -o[1])):
        if not top or start >= top[-1][1]:
            top.append((start, stop, name))
    return top


def host_side(gaps: list[tuple[float, float, int]], launches: dict[int, tuple[float, int]],
              ops: dict[int, list[tuple[float, float, str]]], origin: float) -> dict:
    """For each idle gap (start, end, correlation id of the kernel after it): late launch or queued; for late ones
    the launching thread's outermost ops over [gap start, launch], by name (µs → s)."""
    late, queued, by_op, largest = 0.0, 0.0, defaultdict(float), []
    for start, end, corr in gaps:
        launch, tid = launches.get(corr, (start, -1))
        window = (start, min(launch, end))
        if launch <= start:
            queued += end - start
            names = "queued (launched before the GPU went idle)"
        else:
            late += window[1] - window[0]
            covered, names = 0.0, []
            for a, b, name in ops.get(tid, ()):
                overlap = min(b, window[1]) - max(a, window[0])
                if overlap > 0:
                    by_op[name] += overlap
                    covered += overlap
                    names.append(name)
            by_op["(no torch op: Python)"] += window[1] - window[0] - covered
            names = ", ".join(dict.fromkeys(names)) or "(no torch op: Python)"
        largest.append((end - start, start, names))
    largest.sort(reverse=True)
    return {"late_launch_s": round(late / 1e6, 3), "queued_s": round(queued / 1e6, 3),
            "late_by_host_op_s": {k: round(v / 1e6, 3) for k, v in sorted(by_op.items(), key=lambda x: -x[1])[:15]},
            "largest": [{"at_s": round((t - origin) / 1e6, 3), "idle_ms": round(d / 1e3, 2), "host": n}
                        for d, t, n in largest[:12]]}


def profiled(run) -> dict:
    """Kernel intervals of `run()` between two GPU marks, and its wall clock."""
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        torch.cuda._sleep(MARK_CYCLES)
        t0 = time.perf_counter()
        result = run()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        torch.cuda._sleep(MARK_CYCLES)
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        trace = json.loads(Path(f.name).read_text())
    return summarize(trace, wall, result)


def summarize(trace: dict, wall: float, result: dict) -> dict:
    """The report of one run from its Chrome trace (times in µs), its wall clock and its result row."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    kernels = sorted((e["ts"], e["ts"] + e["dur"], e["name"], e.get("args", {}).get("correlation", -1))
                     for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    launches = {e["args"]["correlation"]: (e["ts"], e["tid"]) for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    ops: dict[int, list] = defaultdict(list)
    for e in events:
        if e.get("cat") == "cpu_op":
            ops[e["tid"]].append((e["ts"], e["ts"] + e["dur"], e["name"]))
    ops = {tid: outermost(v) for tid, v in ops.items()}
    marks = [k for k in kernels if "spin_kernel" in k[2]]
    if len(marks) < 2:
        raise SystemExit(f"the profile holds {len(marks)} of the 2 marks (torch.cuda._sleep): cannot place the run")
    work = [k for k in kernels if "spin_kernel" not in k[2] and marks[0][1] <= k[0] <= marks[-1][0]]
    by_kind: dict[str, float] = defaultdict(float)
    gaps = {f"<{g}us": [0, 0.0] for g in GAPS_US} | {f">={GAPS_US[-1]}us": [0, 0.0]}
    busy, end, long_gaps = 0.0, work[0][0], []
    for start, stop, name, corr in work:
        by_kind[kind(name)] += stop - start
        if start > end:
            gap = start - end
            if gap >= 1_000:
                long_gaps.append((end, start, corr))
            label = next((f"<{g}us" for g in GAPS_US if gap < g), f">={GAPS_US[-1]}us")
            gaps[label][0] += 1
            gaps[label][1] += gap / 1e6
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
    span = (work[-1][1] - work[0][0]) / 1e6
    first = work[0]
    long_gaps.insert(0, (marks[0][1], first[0], first[3]))  # before the first kernel
    return {"wall_s": round(wall, 3), "docs": result["docs"], "docs_per_second": round(result["docs"] / wall, 1),
            "kernels": len(work), "distinct_kernels": len({k[2] for k in work}),
            "gpu_busy_s": round(busy / 1e6, 3), "busy_share_of_wall": round(busy / 1e6 / wall, 3),
            "first_kernel_after_s": round((work[0][0] - marks[0][1]) / 1e6, 3),
            "idle_after_last_kernel_s": round((marks[-1][0] - work[-1][1]) / 1e6, 3),
            "kernel_span_s": round(span, 3), "busy_share_of_span": round(busy / 1e6 / span, 3),
            "kernel_seconds_by_kind": {k: round(v / 1e6, 3) for k, v in sorted(by_kind.items(), key=lambda x: -x[1])},
            "idle_gaps": {k: {"count": c, "seconds": round(s, 3)} for k, (c, s) in gaps.items()},
            "gaps_from_1ms_and_the_first": host_side(long_gaps, launches, ops, marks[0][1]),
            "run": {k: v for k, v in result.items() if k in ("per_worker", "cpu_user_seconds", "seconds")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", type=Path, required=True, help="directory with a BERT tokenizer.json")
    parser.add_argument("--docs", type=int, default=131072)
    parser.add_argument("--arch", default="bert-base", choices=("bert-base", "xlmr-base"))
    parser.add_argument("--max-tokens", type=int, default=131072)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_busy.py measures a GPU: no CUDA device here")
    device, dtype = "cuda:0", torch.bfloat16
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        corpus = work / "corpus.jsonl"
        texts = synthetic_corpus(corpus, args.docs, words_from(args.tokenizer))
        model = make_model(args.arch, work / args.arch, args.tokenizer, device, False, texts[:256])
        end_to_end = lambda: run_lsr_index(model, corpus, work / "out", (device,), "bfloat16", args.max_tokens)
        end_to_end()  # warm: compile and autotune caches, the tokenizer and the model's identity kept per process
        rows = {"end to end (file → shards)": profiled(end_to_end),
                "model only (no I/O)": profiled(lambda: run_lsr_model_only(model, texts, device, dtype,
                                                                           args.max_tokens))}
    gpu = torch.cuda.get_device_name(0)
    meta = {"gpu": gpu, "host": platform.node(), "cores": os.cpu_count(), "torch": torch.__version__,
            "arch": args.arch, "docs": args.docs, "max_tokens": args.max_tokens,
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    for name, row in rows.items():
        print(f"{name}: {json.dumps(row, ensure_ascii=False)}")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"gpu_busy_{gpu.replace(' ', '_')}.json"
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
