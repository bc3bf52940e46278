"""Where each thread of an in-process encode spends its time: the stacks of every thread, sampled every 5 ms, over a
second run of `encode_corpus` on synthetic documents (the first run warms caches). It found the serializer pool's
blocking start (benchmarks/NOTES_encode.md, 2026-11-25); run it when end to end falls behind model only.

    python benchmarks/sample_encode.py --tokenizer DIR [--docs N] [--device cuda:0|cpu] [--smoke]

Prints each run's rate, samples per thread and the most frequent (thread, lsr-index frames | innermost frame).
"""

import argparse
import collections
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_encode import make_model, synthetic_corpus, words_from

from lsr_index.encode_corpus import EncodeJob, EncodeOptions, encode_corpus

OURS = ("lsr_index", "kernels", "sparton")


def sample(stacks: collections.Counter, stop: threading.Event, every: float = 0.005) -> None:
    me = threading.get_ident()
    while not stop.is_set():
        names = {t.ident: t.name for t in threading.enumerate()}
        for tid, frame in sys._current_frames().items():
            if tid == me:
                continue
            chain, f = [], frame
            while f is not None:
                if any(part in f.f_code.co_filename for part in OURS):
                    chain.append(f"{f.f_code.co_name}:{f.f_lineno}")
                f = f.f_back
            leaf = f"{frame.f_code.co_name}@{Path(frame.f_code.co_filename).name}:{frame.f_lineno}"
            stacks[(names.get(tid, "?")[:14], ">".join(reversed(chain[:4])) + " | " + leaf)] += 1
        time.sleep(every)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", type=Path, required=True, help="directory with a BERT tokenizer.json")
    parser.add_argument("--docs", type=int, default=262144)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--smoke", action="store_true", help="a 2-layer model: checks the script, measures nothing")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sample-encode-"))
    corpus = work / "corpus.jsonl"
    texts = synthetic_corpus(corpus, args.docs, words_from(args.tokenizer))
    model = make_model("bert-base", work / "bert-base", args.tokenizer, args.device, args.smoke, texts[:256])
    gpu = args.device.startswith("cuda")
    job = EncodeJob(inputs=(str(corpus),), model=str(model), dtype="bfloat16" if gpu else "float32",
                    options=EncodeOptions(max_tokens=131072 if gpu else 16384, shard_docs=32768, overwrite=True,
                                          progress=False))
    for run in ("warm-up", "sampled"):
        stacks, stop = collections.Counter(), threading.Event()
        sampler = threading.Thread(target=sample, args=(stacks, stop), daemon=True)
        if run == "sampled":
            sampler.start()
        t0 = time.perf_counter()
        manifest = encode_corpus(job, work / "out", (args.device,))
        seconds = time.perf_counter() - t0
        stop.set()
        worker = manifest.stats["per_worker"][0]
        print(f"{run}: {manifest.docs:,} docs in {seconds:.1f} s = {manifest.docs / seconds:,.0f} docs/s; start-up "
              f"{worker['startup_seconds']:.1f} s, then {worker['docs_per_second_after_startup']:,.0f}", flush=True)
    threads = collections.Counter()
    for (thread, _), count in stacks.items():
        threads[thread] += count
    print("samples per thread (5 ms each):", dict(threads))
    for (thread, stack), count in stacks.most_common(args.top):
        print(f"{count:7d} {thread:14s} {stack}")


if __name__ == "__main__":
    main()
