"""Two versions of Sparton's training backward on the same inputs in one process: the working copy's
`sparton/training.py` ("after") against another copy of that file ("before"), each gradient's kernels timed alone
(dW with db, dH) and together, on `bench_train.py`'s shapes: its queries (16-32 tokens) and documents (128-256),
packed, at V = 30,522 and 250,002. Also times the forward and any dH tile configs given, and checks that the two
versions' gradients agree. Prints medians and writes results/ab_backward_<GPU>.json.

    git show REV:sparton/training.py > /tmp/training_before.py
    python benchmarks/ab_backward.py /tmp/training_before.py
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_head import load_kernel_file
from provenance import with_provenance

from sparton import training

RESULTS = Path(__file__).resolve().parent / "results"
HIDDEN = 768
CASES = [  # (vocab, batch, side, shortest, longest)
    (30_522, 64, "queries", 16, 32),
    (30_522, 64, "documents", 128, 256),
    (250_002, 16, "queries", 16, 32),
    (250_002, 16, "documents", 128, 256),
    (250_002, 72, "queries", 16, 32),
    (250_002, 72, "documents", 128, 256),
]


def inputs(vocab: int, batch: int, shortest: int, longest: int, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    lengths = torch.randint(shortest, longest + 1, (batch,), device="cuda", generator=g)
    cu = torch.zeros(batch + 1, dtype=torch.int32, device="cuda")
    cu[1:] = lengths.cumsum(0)
    tokens = torch.randn(int(cu[-1]), HIDDEN, device="cuda", generator=g).to(torch.bfloat16)
    weight = (torch.randn(vocab, HIDDEN, device="cuda", generator=g) / HIDDEN**0.5).to(torch.bfloat16)
    bias = (torch.randn(vocab, device="cuda", generator=g) - 1.0).to(torch.bfloat16)
    out, arg = training.splade_max_packed_argmax_triton(tokens, weight, bias, cu)
    grad = torch.randn(batch, vocab, device="cuda", generator=g) / batch
    return tokens, weight, bias, cu, out, arg, grad


def median_ms(fn, reps: int) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end))
    return statistics.median(times)


def backward_call(module, grad, out, arg, tokens, weight, cu, need: tuple[bool, bool, bool], configs=None):
    """A version's _backward (an earlier one took the rows a document holds, None for packed input)."""
    takes_max_len = "max_len" in inspect.signature(module._backward).parameters
    extra = (None,) if takes_max_len else ()
    kwargs = {"configs": configs} if configs else {}
    return lambda: module._backward(grad, out, arg, tokens, weight, cu, *extra, "log1p_relu", *need, **kwargs)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def measure(vocab: int, batch: int, side: str, shortest: int, longest: int, versions: dict,
            args: argparse.Namespace) -> dict:
    tokens, weight, bias, cu, out, arg, grad = inputs(vocab, batch, shortest, longest)
    row = {"vocab": vocab, "batch": batch, "side": side, "tokens": tokens.shape[0],
           "forward_ms": median_ms(lambda: training.splade_max_packed_argmax_triton(tokens, weight, bias, cu),
                                   args.reps)}
    grads = {}
    for name, module in versions.items():
        for part, need in (("dW+db", (False, True, True)), ("dH", (True, False, False)), ("all", (True, True, True))):
            row[f"{name} {part} ms"] = median_ms(backward_call(module, grad, out, arg, tokens, weight, cu, need),
                                                 args.reps)
        grads[name] = backward_call(module, grad, out, arg, tokens, weight, cu, (True, True, True))()
    for name, a, b in zip(("dH", "dW", "db"), grads["after"], grads["before"]):
        row[f"{name} rel diff"] = rel(a, b)
    for i, config in enumerate(args.hidden_config):
        configs = (training.GRAD_WEIGHT, config)
        row[f"after dH config {i} ms"] = median_ms(
            backward_call(training, grad, out, arg, tokens, weight, cu, (True, False, False), configs), args.reps)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path, help="a copy of sparton/training.py to compare against")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--hidden-config", action="append", default=[], type=json.loads,
                        help='a dH tile config to time beside the default, as JSON (repeatable), e.g. '
                             '\'{"BLOCK_T": 64, "BLOCK_V": 64, "BLOCK_H": 128, "num_warps": 4, "num_stages": 3}\'')
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    versions = {"before": load_kernel_file(args.before), "after": training}
    gpu = torch.cuda.get_device_name()
    rows = []
    for case in CASES:
        rows.append(measure(*case, versions, args))
        print(json.dumps(rows[-1]), flush=True)
        torch.cuda.empty_cache()
    print(f"\n{gpu}: median ms (before → after)")
    for row in rows:
        print(f"  V={row['vocab']:>7} B={row['batch']:>3} {row['side']:9} fwd {row['forward_ms']:6.2f} | "
              + " | ".join(f"{part} {row[f'before {part} ms']:7.2f} → {row[f'after {part} ms']:7.2f}"
                           for part in ("dW+db", "dH", "all"))
              + f" | dH rel diff {row['dH rel diff']:.1e}")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"ab_backward_{gpu.replace(' ', '_')}.json"
    path.write_text(json.dumps(with_provenance({"hidden_configs": args.hidden_config, "rows": rows}), indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
