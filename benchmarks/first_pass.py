"""A new process's first pass over a corpus's batches against its second: lsr-index's encoder and quantizer alone
on pre-tokenized synthetic documents (bench_encode.py's models), so what a new process pays per kernel, per batch
shape and per CUDA resource shows apart from the pipeline. Run it once to make the model and corpus, then once per
measurement, each in a new process:

    python benchmarks/first_pass.py --tokenizer DIR --model xlmr-base --docs 32768 --make
    python benchmarks/first_pass.py --tokenizer DIR --model xlmr-base --docs 32768 [--profile] [--warm-up default]

`--profile` prints each pass's host-side time by operation (torch.profiler, CPU activities); `--warm-up` runs the
encoder's warm-up after the model's load, as the encode pipeline does, and times it apart."""

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch
from bench_encode import make_model, synthetic_corpus, words_from


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", type=Path, required=True, help="directory with a BERT tokenizer.json")
    parser.add_argument("--model", choices=["bert-base", "xlmr-base"], default="xlmr-base")
    parser.add_argument("--docs", type=int, default=32768)
    parser.add_argument("--work", type=Path, default=Path("/tmp/first_pass"))
    parser.add_argument("--make", action="store_true", help="make the model and the corpus, then stop")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--warm-up", default="", metavar="SIZES",
                        help="run SpladeEncoder.warm_up first with these batch sizes in tokens (comma-separated; "
                             "'default': the encoder's own), timed apart")
    parser.add_argument("--profile-warm-up", action="store_true", help="print the warm-up's cProfile (cumulative)")
    parser.add_argument("--prepare", action="store_true",
                        help="run sparton.prepare in a thread beside the model's load, as the encode pipeline does")
    args = parser.parse_args()
    corpus, model = args.work / f"{args.model}-{args.docs}.jsonl", args.work / args.model
    if args.make:
        args.work.mkdir(parents=True, exist_ok=True)
        texts = synthetic_corpus(corpus, args.docs, words_from(args.tokenizer))
        make_model(args.model, model, args.tokenizer, "cuda:0", False, texts[:64])
        return
    if not corpus.exists() or not (model / "config.json").exists():
        parser.error(f"no model or corpus under {args.work}: run with --make first")
    import sparton
    from lsr_index.encode.task import _expandable_cuda_memory
    from lsr_index.model.encoder import WARM_UP_SIZES, SpladeEncoder
    from lsr_index.model.load import load_model
    from lsr_index.vectors.quantize import Quantization, quantize

    _expandable_cuda_memory()  # the allocator as the CLI sets it
    texts = [json.loads(line)["text"] for line in corpus.open()]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(1) as beside:
        prepared = beside.submit(sparton.prepare) if args.prepare else None
        encoder = SpladeEncoder(load_model(str(model), device="cuda:0", dtype=torch.bfloat16), max_tokens=131072)
        if prepared:
            prepared.result()
    print(f"{args.model} model loaded in {time.perf_counter() - t0:.2f} s", flush=True)
    tokens = encoder.tokenize(texts, 256)

    def then(weights: torch.Tensor) -> object:
        return quantize(weights, Quantization())

    if args.warm_up:
        sizes = WARM_UP_SIZES if args.warm_up == "default" else tuple(int(s) for s in args.warm_up.split(","))
        t0 = time.perf_counter()
        if args.profile_warm_up:
            import cProfile
            import pstats

            with cProfile.Profile() as warm_up_profile:
                encoder.warm_up(256, then, sizes)
        else:
            encoder.warm_up(256, then, sizes)
        print(f"{args.model} warm-up {sizes}: {time.perf_counter() - t0:.2f} s", flush=True)
        if args.profile_warm_up:
            pstats.Stats(warm_up_profile).sort_stats("cumulative").print_stats(40)

    def one_pass() -> int:
        return sum(v.nnz for _, v in encoder.encode_ids(tokens, then=then))

    for number in (1, 2):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if args.profile:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU]) as profiler:
                one_pass()
                torch.cuda.synchronize()
        else:
            one_pass()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        print(f"{args.model} pass {number}: {len(texts) / seconds:,.0f} docs/s ({seconds:.2f} s)"
              f"{' (profiled)' if args.profile else ''}", flush=True)
        if args.profile:
            print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=14,
                                                max_name_column_width=60), flush=True)


if __name__ == "__main__":
    main()
