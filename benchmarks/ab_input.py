"""A GPU task's input in threads against in a process of its own (feed.InputProcess), alternated in one
process on one host: XLM-R base 32k and BERT-base 131k synthetic documents, file → shards, a warm run of each first;
then the 1M-document stream once each. Prints start-up (model load apart) and the rate after it for each run.

    python benchmarks/ab_input.py --tokenizer DIR [--rounds 4]

The variant is chosen through task.reads_in_a_process, the one switch between the two paths.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_encode import make_model, run_lsr_index, synthetic_corpus, words_from

from lsr_index.encode import task

VARIANTS = (("threads", lambda device: False), ("process", task.reads_in_a_process))


def show(label: str, variant: str, name: str, r: dict) -> None:
    w = r["per_worker"][0]
    print(f"{label} {variant:8s} {name:9s} {r['docs'] / r['seconds']:8,.0f} docs/s  start-up "
          f"{w['startup_seconds']:.2f} s (model {w['model_loaded_after_seconds']:.2f}) then "
          f"{w['docs_per_second_after_startup']:,.0f}  cpu {r['cpu_user_seconds']} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", type=Path, required=True, help="directory with a BERT tokenizer.json")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--work", type=Path, default=Path("/tmp/ab_input"))
    args = parser.parse_args()
    work, device = args.work, "cuda:0"
    work.mkdir(parents=True, exist_ok=True)
    words = words_from(args.tokenizer)
    texts = synthetic_corpus(work / "bert.jsonl", 131072, words)
    synthetic_corpus(work / "xlmr.jsonl", 32768, words, seed=1)
    make_model("bert-base", work / "bert-base", args.tokenizer, device, False, texts[:256])
    make_model("xlmr-base", work / "xlmr-base", args.tokenizer, device, False, texts[:64])
    runs = (("xlmr-base", "xlmr.jsonl"), ("bert-base", "bert.jsonl"))
    for name, corpus in runs:  # warm: Triton's compile and autotune caches, cuDNN and cuBLAS
        for _, rule in VARIANTS:
            task.reads_in_a_process = rule
            run_lsr_index(work / name, work / corpus, work / "warm", (device,), "bfloat16", 131072)
    for rnd in range(args.rounds):
        for variant, rule in VARIANTS if rnd % 2 == 0 else VARIANTS[::-1]:
            task.reads_in_a_process = rule
            for name, corpus in runs:
                show(str(rnd), variant, name,
                     run_lsr_index(work / name, work / corpus, work / "out", (device,), "bfloat16", 131072))
    synthetic_corpus(work / "million.jsonl", 1_000_000, words, seed=2)
    for variant, rule in VARIANTS:
        task.reads_in_a_process = rule
        show("1M", variant, "bert-base",
             run_lsr_index(work / "bert-base", work / "million.jsonl", work / "out", (device,), "bfloat16", 131072))


if __name__ == "__main__":
    main()
