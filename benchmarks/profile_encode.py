"""Where the encoder's GPU time goes: BERT-base (random weights, bias calibrated), 32k synthetic ~57-token docs.

Prints model-only docs/s, one 131k-token batch stage by stage (body, packing, Sparton head, quantization), the
GEMM rates at the body's shapes, a torch.profiler table of the body, the attention backends side by side and,
with --compile, torch.compile of the body. A run's output: benchmarks/results/profile_encode_H100.log.

    python benchmarks/profile_encode.py --tokenizer DIR [--compile]
"""

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_encode import make_model, synthetic_corpus, words_from

import sparton
from lsr_index.encoder import SpladeEncoder, length_buckets
from lsr_index.models import load_model
from lsr_index.quantize import Quantization, quantize

BUDGET = 131072


def gpu_ms(fn: Callable[[], object], n: int = 5) -> float:
    """Median of n CUDA-event timings after one warm-up call."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(n):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", type=Path, required=True, help="directory with a BERT tokenizer.json")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile of the body (~40 s)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp())
    texts = synthetic_corpus(work / "docs.jsonl", 32768, words_from(args.tokenizer))
    model = load_model(str(make_model("bert-base", work / "bert", args.tokenizer, "cuda", False, texts[:256])),
                       device="cuda", dtype=torch.bfloat16)
    encoder = SpladeEncoder(model, max_tokens=BUDGET)
    tokens = encoder.tokenize(texts, 256)

    def model_only() -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in encoder.encode_ids(tokens, then=lambda w: quantize(w, Quantization())):
            pass
        torch.cuda.synchronize()
        return len(texts) / (time.perf_counter() - t0)

    model_only()  # first pass: compiles, tunes, and meets every batch shape once
    print(f"model only: {model_only():,.0f} docs/s (second pass over the same shapes)", flush=True)

    # one batch, stage by stage
    positions = length_buckets(tokens.lengths, BUDGET)[1]
    lengths = tokens.lengths[positions]
    mask = np.arange(int(lengths.max())) < lengths[:, None]
    ids = np.zeros(mask.shape, np.int64)
    ids[mask] = tokens.gather(positions)
    ids_t, mask_t = torch.from_numpy(ids).cuda(), torch.from_numpy(mask).long().cuda()
    packed = torch.from_numpy(np.flatnonzero(mask.ravel())).cuda()
    cu = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)).cuda()
    longest = int(lengths.max())
    with torch.inference_mode():
        body = lambda: model.body(input_ids=ids_t, attention_mask=mask_t).logits
        real = body().reshape(-1, 768).index_select(0, packed)
        head = lambda: sparton.splade_max_packed(real, model.weight, model.bias, cu, max_seqlen=longest)
        weights = head()
        t_body, t_head = gpu_ms(body), gpu_ms(head)
        t_quant = gpu_ms(lambda: quantize(weights, Quantization()))
        flop = 2 * ids.size * 12 * (4 * 768 * 768 + 2 * 768 * 3072)
        print(f"batch: {len(positions)} docs x {longest} = {ids.size} padded, {int(lengths.sum())} real tokens\n"
              f"  body {t_body:.2f} ms ({flop / t_body / 1e9:.0f} TFLOP/s on padded tokens) | head {t_head:.2f} ms "
              f"({2 * int(lengths.sum()) * 768 * model.vocab_size / t_head / 1e9:.0f} TFLOP/s) | "
              f"quantize {t_quant:.2f} ms", flush=True)
        for k, n in ((768, 768), (768, 2304), (768, 3072), (3072, 768)):
            a = torch.randn(ids.size, k, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
            t = gpu_ms(lambda a=a, w=w: F.linear(a, w))
            print(f"  linear [{ids.size},{k}]x[{k},{n}]: {t:.3f} ms, {2 * ids.size * k * n / t / 1e9:.0f} TFLOP/s")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            body()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=22, max_name_column_width=70))
        for name, backend in (("efficient", SDPBackend.EFFICIENT_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                              ("math", SDPBackend.MATH)):
            with sdpa_kernel([backend]):
                print(f"sdpa {name}: body {gpu_ms(body):.2f} ms", flush=True)
        if args.compile:
            t0 = time.perf_counter()
            compiled = torch.compile(model.body, dynamic=True)
            compiled(input_ids=ids_t, attention_mask=mask_t)
            torch.cuda.synchronize()
            print(f"compile took {time.perf_counter() - t0:.1f} s; compiled body "
                  f"{gpu_ms(lambda: compiled(input_ids=ids_t, attention_mask=mask_t).logits):.2f} ms", flush=True)


if __name__ == "__main__":
    main()
