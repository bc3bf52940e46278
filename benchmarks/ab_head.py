"""Two versions of the Sparton kernel on the same inputs in one process: the working copy's `sparton/splade_head.py`
("after") against another copy of that file ("before"), alternating their order round by round (under a power cap
the one timed second runs at another clock), on the packed and padded shapes of `bench_head.py`. Prints per-round
medians and the SM clock, and writes results/ab_head_<GPU>.json.

    git show REV:sparton/splade_head.py > /tmp/head_before.py
    python benchmarks/ab_head.py /tmp/head_before.py
"""

import argparse
import hashlib
import importlib.util
import json
import statistics
import sys
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_head as bh

SHAPES = [  # (input, V, documents of 256 tokens or their tokens packed, dtype)
    ("packed", 30_522, 128, torch.bfloat16),
    ("packed", 30_522, 128, torch.float16),
    ("packed", 250_002, 128, torch.bfloat16),
    ("packed", 30_522, 512, torch.bfloat16),
    ("packed", 250_002, 512, torch.float16),
    ("padded", 30_522, 128, torch.bfloat16),
    ("padded", 250_002, 128, torch.bfloat16),
]


def load_kernel_file(path: Path):
    """The file as a module of package sparton (its relative imports resolve there). Its custom-op registrations are
    left out: the working copy's module holds those names."""
    source = path.read_text()
    source = source[: source.find("@torch.library.custom_op")] if "@torch.library.custom_op" in source else source
    spec = importlib.util.spec_from_loader("sparton._ab_before", loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__file__ = str(path)
    exec(compile(source, str(path), "exec"), module.__dict__)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path, help="a copy of sparton/splade_head.py to compare against")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", type=Path, default=bh.RESULTS)
    args = parser.parse_args()
    kernels = {"before": load_kernel_file(args.before), "after": bh.sparton.splade_head}
    after_file = Path(kernels["after"].__file__)
    digests = {name: hashlib.sha256(path.read_bytes()).hexdigest() for name, path in
               (("before", args.before), ("after", after_file))}
    if digests["before"] == digests["after"]:
        sys.exit(f"ab_head: {args.before} is the kernel being tested ({after_file}): nothing to compare")
    bh.MONITOR = bh.GpuMonitor()
    gpu = torch.cuda.get_device_name()
    tflops, state = bh.matmul_peak_tflops(warmup_ms=2000)
    print(f"{gpu}: bf16 matmul {tflops:.0f} TFLOP/s warm {bh._state(state)}; torch {torch.__version__}; kernel files "
          f"sha256 before {digests['before'][:12]}, after {digests['after'][:12]}", flush=True)
    rows = []
    for kind, vocab, batch, dtype in SHAPES:
        hidden, weight, bias, mask = bh.make_inputs(batch if kind == "padded" else 1, vocab, dtype)
        if kind == "packed":
            tokens, cu, longest = bh.packed_inputs(batch * bh.SEQ, dtype)
            packed = (tokens, weight, bias, cu, longest)
            fns = {k: partial(m.splade_max_packed_triton, *packed) for k, m in kernels.items()}
            n_tokens = tokens.shape[0]
        else:
            fns = {k: partial(m.splade_max_triton, hidden, weight, bias, mask) for k, m in kernels.items()}
            n_tokens = batch * bh.SEQ
        times: dict[str, list] = {k: [] for k in fns}
        with torch.inference_mode():
            diff = (fns["after"]() - fns["before"]()).abs().max().item()
            for round_ in range(args.rounds):
                for name in list(fns) if round_ % 2 == 0 else list(fns)[::-1]:
                    r = bh.measure(fns[name])
                    times[name].append((r["ms"], r.get("sm_mhz")))
        floor = bh.floor_ms(n_tokens, vocab, tflops)
        print(f"{kind} V={vocab} tokens={n_tokens} {str(dtype)[6:]}: floor {floor:.3f} ms, max |after - before| "
              f"{diff:.2e}", flush=True)
        for name, runs in times.items():
            ms = statistics.median(m for m, _ in runs)
            print(f"  {name:6s} median {ms:8.3f} ms  x{ms / floor:.3f} floor  rounds {[round(m, 3) for m, _ in runs]} "
                  f"MHz {[c for _, c in runs]}", flush=True)
            rows.append({"input": kind, "vocab": vocab, "tokens": n_tokens, "dtype": str(dtype)[6:], "kernel": name,
                         "ms": [m for m, _ in runs], "sm_mhz": [c for _, c in runs], "median_ms": ms,
                         "floor_ms": floor, "max_abs_diff": diff})
        del hidden, weight, bias, mask, fns
    after, state_after = bh.matmul_peak_tflops(warmup_ms=2000)
    print(f"bf16 matmul after: {after:.0f} TFLOP/s {bh._state(state_after)}", flush=True)
    bh.MONITOR.close()
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"gpu": gpu, "torch": torch.__version__, "before_sha256": digests["before"],
            "after_sha256": digests["after"], "rounds": args.rounds, "matmul_bf16_tflops": [tflops, after]}
    tag = gpu.replace(" ", "_")
    (args.out / f"ab_head_{tag}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
