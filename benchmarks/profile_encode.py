"""Where the encoder's time goes: a random-weight BERT (decoder bias calibrated to ~200 nonzeros per document)
over synthetic ~57-token documents, on a GPU or the CPU.

Prints model-only docs/s (a first pass over new batch shapes and a second one over the same shapes), one
length bucket stage by stage (body, Sparton head on the packed real tokens, quantization), the GEMM rates at
the body's shapes, a torch.profiler table of the body, and on CUDA the attention backends side by side and,
with --compile, torch.compile of the body. What it shows: docs/performance/encode.md ("One batch").

    python benchmarks/profile_encode.py [--tokenizer DIR] [--device cuda|cpu] [--docs N] [--compile] [--smoke]

--tokenizer defaults to the embedded splade-tiny's WordPiece tokenizer (fetched once into the cache); --smoke
profiles a 2-layer, hidden-64 BERT on 256 documents (a minute on a CPU: checks the script, measures nothing).
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
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_encode import make_model, synthetic_corpus, words_from

import sparton
from lsr_index.model.encoder import SpladeEncoder, length_buckets
from lsr_index.model.load import load_model, resolve_model
from lsr_index.vectors.quantize import Quantization, quantize


def timer(device: torch.device) -> Callable[[Callable[[], object]], float]:
    """Median ms of 5 calls after a warm-up call: CUDA events on a GPU, the wall clock on the CPU."""

    def cuda_ms(fn: Callable[[], object]) -> float:
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        return float(np.median(times))

    def cpu_ms(fn: Callable[[], object]) -> float:
        fn()
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return float(np.median(times))

    return cuda_ms if device.type == "cuda" else cpu_ms


def rate(flop: float, ms: float) -> str:
    per_second = flop / ms * 1e3
    return f"{per_second / 1e12:.0f} TFLOP/s" if per_second >= 1e12 else f"{per_second / 1e9:.1f} GFLOP/s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", type=Path, help="directory with a BERT tokenizer.json [splade-tiny's]")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--docs", type=int, help="synthetic documents [32768 on CUDA, 2048 on CPU, 256 smoke]")
    parser.add_argument("--budget", type=int, help="padded tokens per batch [131072 on CUDA, 16384 on CPU]")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile of the body (~40 s)")
    parser.add_argument("--smoke", action="store_true", help="tiny model and corpus: checks that the script runs")
    args = parser.parse_args()
    device = torch.device(args.device)
    gpu = device.type == "cuda"
    n_docs = args.docs or (256 if args.smoke else 32768 if gpu else 2048)
    budget = args.budget or (131072 if gpu else 16384)
    dtype = torch.bfloat16 if gpu else torch.float32
    ms = timer(device)
    sync = torch.cuda.synchronize if gpu else lambda: None
    tokenizer = args.tokenizer or resolve_model("splade-tiny")

    work = Path(tempfile.mkdtemp())
    texts = synthetic_corpus(work / "docs.jsonl", n_docs, words_from(tokenizer))
    model_dir = make_model("bert-base", work / "bert", tokenizer, str(device), args.smoke, texts[:256])
    model = load_model(str(model_dir), device=str(device), dtype=dtype)
    config = model.body.config
    hidden_size = config.hidden_size
    print(f"{torch.cuda.get_device_name(device) if gpu else 'CPU'}, torch {torch.__version__}, {dtype}: "
          f"BERT {config.num_hidden_layers} layers, hidden {hidden_size}, V {model.vocab_size:,}; {n_docs:,} docs, "
          f"budget {budget:,} tokens", flush=True)
    encoder = SpladeEncoder(model, max_tokens=budget)
    tokens = encoder.tokenize(texts, 256)

    def model_only() -> float:
        sync()
        t0 = time.perf_counter()
        for _ in encoder.encode_ids(tokens, then=lambda w: quantize(w, Quantization())):
            pass
        sync()
        return len(texts) / (time.perf_counter() - t0)

    first = model_only()  # compiles, tunes, and meets every batch shape once
    print(f"model only: first pass {first:,.0f} docs/s, second pass over the same shapes {model_only():,.0f} docs/s",
          flush=True)

    # the largest length bucket (most padded tokens), stage by stage, built as the encoder builds its inputs
    positions = max(length_buckets(tokens.lengths, budget), key=lambda p: len(p) * int(tokens.lengths[p].max()))
    lengths = tokens.lengths[positions]
    mask = np.arange(int(lengths.max())) < lengths[:, None]
    ids = np.zeros(mask.shape, np.int64)
    ids[mask] = tokens.gather(positions)
    ids_t, mask_t = torch.from_numpy(ids).to(device), torch.from_numpy(mask).long().to(device)
    packed = torch.from_numpy(np.flatnonzero(mask.ravel())).to(device)
    cu = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)).to(device)
    longest, real_tokens = int(lengths.max()), int(lengths.sum())
    body_tokens = real_tokens if model.packed else ids.size  # the tokens the body computes
    with torch.inference_mode():
        if model.packed:  # the encoder's path for this family on this device (packed_body)
            p_ids, p_pos, p_cu = (torch.from_numpy(a).to(device)
                                  for a in packed.inputs(tokens, positions, model.body))
            body = lambda: packed.forward(model.body, p_ids, p_pos, p_cu, longest)
            real = body()
        else:
            body = lambda: model.body(input_ids=ids_t, attention_mask=mask_t).logits
            real = body().reshape(-1, hidden_size).index_select(0, packed)
        head = lambda: sparton.splade_max_packed(real, model.weight, model.bias, cu, max_seqlen=longest)
        weights = head()
        t_body, t_head = ms(body), ms(head)
        t_quant = ms(lambda: quantize(weights, Quantization()))
        per_layer = 4 * hidden_size**2 + 2 * hidden_size * config.intermediate_size
        flop = 2 * body_tokens * config.num_hidden_layers * per_layer
        print(f"batch: {len(positions)} docs x {longest} = {ids.size} padded, {real_tokens} real tokens; body "
              f"{'packed' if model.packed else 'padded'}\n"
              f"  body {t_body:.2f} ms ({rate(flop, t_body)} on the tokens it computes) | head {t_head:.2f} ms "
              f"({rate(2 * real_tokens * hidden_size * model.vocab_size, t_head)}) | "
              f"quantize {t_quant:.2f} ms", flush=True)
        inner = config.intermediate_size
        for k, n in ((hidden_size, hidden_size), (hidden_size, 3 * hidden_size), (hidden_size, inner),
                     (inner, hidden_size)):
            a = torch.randn(body_tokens, k, device=device, dtype=dtype)
            w = torch.randn(n, k, device=device, dtype=dtype)
            t = ms(lambda a=a, w=w: F.linear(a, w))
            print(f"  linear [{body_tokens},{k}]x[{k},{n}]: {t:.3f} ms, {rate(2 * body_tokens * k * n, t)}")
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
        with profile(activities=activities) as prof:
            body()
            sync()
        print(prof.key_averages().table(sort_by="cuda_time_total" if gpu else "cpu_time_total", row_limit=22,
                                        max_name_column_width=70))
        if gpu and not model.packed:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            for name, backend in (("efficient", SDPBackend.EFFICIENT_ATTENTION),
                                  ("cudnn", SDPBackend.CUDNN_ATTENTION), ("math", SDPBackend.MATH)):
                with sdpa_kernel([backend]):
                    print(f"sdpa {name}: body {ms(body):.2f} ms", flush=True)
        if args.compile:
            t0 = time.perf_counter()
            compiled = torch.compile(body, dynamic=True)
            compiled()
            sync()
            print(f"compile took {time.perf_counter() - t0:.1f} s; compiled body {ms(compiled):.2f} ms", flush=True)


if __name__ == "__main__":
    main()
