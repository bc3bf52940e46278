"""Two trees of lsr-index against each other on one host: run this once per tree and round, alternating, with the
tree's directory first on PYTHONPATH (this script's own directory supplies the shared benchmark code). For BERT-base
131k and XLM-R base 32k synthetic documents: file → shards end to end (a warm run, then two), then the model-only
rate twice (not with --fresh, which runs each end to end in a new process, as a user's run starts).

    git archive REV lsr_index | tar -x -C /tmp/old
    for round in 1 2; do
        PYTHONPATH=/tmp/old:$PYTHONPATH python benchmarks/ab_trees.py --tokenizer DIR --label old
        python benchmarks/ab_trees.py --tokenizer DIR --label new
    done
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch
from bench_encode import (
    make_model,
    run_lsr_index,
    run_lsr_index_fresh,
    run_lsr_model_only,
    synthetic_corpus,
    words_from,
)

import lsr_index


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", type=Path, required=True, help="directory with a BERT tokenizer.json")
    parser.add_argument("--label", required=True, help="the tree's name in the output")
    parser.add_argument("--work", type=Path, default=Path("/tmp/ab_trees"))
    parser.add_argument("--fresh", action="store_true",
                        help="each run in a new process that has not used CUDA, as a user's run (else in this one)")
    args = parser.parse_args()
    work, device = args.work, "cuda:0"
    work.mkdir(parents=True, exist_ok=True)
    tree = Path(lsr_index.__file__).resolve().parent
    print(args.label, tree.relative_to(Path.cwd()) if tree.is_relative_to(Path.cwd()) else tree, flush=True)
    for arch, n in (("bert-base", 131072), ("xlmr-base", 32768)):
        corpus, model = work / f"{arch}.jsonl", work / arch
        if not (model / "config.json").exists():  # made by the first run, shared by both trees
            texts = synthetic_corpus(corpus, n, words_from(args.tokenizer))
            make_model(arch, model, args.tokenizer, device, False, texts[:64])
        texts = [json.loads(line)["text"] for line in corpus.open()]
        rows = []
        for i in range(3):
            r = (run_lsr_index_fresh if args.fresh else run_lsr_index)(model, corpus, work / f"out-{args.label}",
                                                                       (device,), "bfloat16", 131072)
            w = r["per_worker"][0]
            if i:
                rows.append(f"{r['docs'] / r['seconds']:,.0f} (start-up {w['startup_seconds']:.2f} s, then "
                            f"{w['docs_per_second_after_startup']:,.0f})")
        if not args.fresh:  # a fresh run's comparison is the trees' start, not the model
            alone = [n / run_lsr_model_only(model, texts, device, torch.bfloat16, 131072)["seconds"] for _ in range(2)]
            rows.append(f"model only {alone[0]:,.0f} / {alone[1]:,.0f}")
        print(f"{args.label} {arch}: " + "; ".join(rows), flush=True)


if __name__ == "__main__":
    main()
