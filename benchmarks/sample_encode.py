"""Where each thread of an encode spends its time: the stacks of every thread, sampled every 5 ms.

Two modes:
  - synthetic (default): a second in-process run of `encode_corpus` on synthetic documents (the first run warms
    caches). A thread held up by a blocking start of worker processes shows here (docs/performance/encode.md).
  - `--cli "encode ARGS"`: the lsr-index command line in this process, sampled from before its first import, so
    start-up (imports, model load, the input's first pieces) is on the timeline too.

    python benchmarks/sample_encode.py --tokenizer DIR [--docs N] [--arch A] [--device cuda:0|cpu] [--smoke]
    python benchmarks/sample_encode.py --cli "encode corpus.jsonl -o out --device cuda"

Prints samples per thread, the most frequent (thread, lsr-index frames | innermost frame), and a timeline of the
main thread, or of the `--threads` named (its most frequent stack in each `--window` seconds): where the wall clock
goes before the first batch and after the last. Of a deep stack, the lsr-index frames shown are the thread's entry
(outermost two) and where it is now (innermost three). Run it when end to end falls behind model only.
"""

import argparse
import collections
import contextlib
import os
import shlex
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

OURS = ("lsr_index", "kernels", "sparton")


class Sampler:
    """Stacks of every other thread every `every` seconds, also in time order."""

    def __init__(self, every: float = 0.005):
        self.every, self.stacks, self.timeline = every, collections.Counter(), []
        self.cpu: dict[int, tuple[str, float]] = {}  # OS thread id → (label, CPU seconds while sampled)
        self.cpu_before: dict[int, float] = {}  # OS thread id → CPU seconds at its first reading
        self.wall = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _cpu(self, names: dict[int, str]) -> None:
        """CPU seconds so far of each of this process's OS threads, labelled with the Python thread's name (or the
        OS name of a native thread: the tokenizer's pool, torch's). A Python thread runs Python code only while it
        holds the GIL, so the Python threads' sum against the wall clock says how busy the GIL is."""
        tick, first = os.sysconf("SC_CLK_TCK"), not self.cpu_before
        for task in Path("/proc/self/task").iterdir():
            try:
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                label = names.get(int(task.name)) or "native " + (task / "comm").read_text().strip()
            except (OSError, ValueError):
                continue
            seconds = (int(fields[11]) + int(fields[12])) / tick
            # CPU spent before sampling began is left out; a thread started since has spent none before
            self.cpu_before.setdefault(int(task.name), seconds if first else 0.0)
            self.cpu[int(task.name)] = (label, seconds - self.cpu_before[int(task.name)])

    def _run(self) -> None:
        me, t0 = threading.get_ident(), time.perf_counter()
        last_cpu = 0.0
        while not self._stop.is_set():
            names = {t.ident: t.name for t in threading.enumerate()}
            if time.perf_counter() - last_cpu >= 0.2:
                self._cpu({t.native_id: t.name for t in threading.enumerate()})
                last_cpu = time.perf_counter()
            self.wall = time.perf_counter() - t0
            for tid, frame in sys._current_frames().items():
                if tid == me:
                    continue
                chain, f = [], frame
                while f is not None:
                    if any(part in f.f_code.co_filename for part in OURS):
                        chain.append(f"{f.f_code.co_name}:{f.f_lineno}")
                    f = f.f_back
                leaf = f"{frame.f_code.co_name}@{Path(frame.f_code.co_filename).name}:{frame.f_lineno}"
                # the thread's entry (outermost two of our frames) and where it is now (innermost three)
                ours = chain[::-1] if len(chain) <= 5 else [*chain[:-3:-1], "…", *chain[2::-1]]
                stack = ">".join(ours) + " | " + leaf
                name = names.get(tid, "?")
                self.stacks[(name[:14], stack)] += 1
                self.timeline.append((time.perf_counter() - t0, name, stack))
            time.sleep(self.every)

    def report(self, top: int, window: float, threads_shown: tuple[str, ...] = ("MainThread",)) -> None:
        threads = collections.Counter()
        for (thread, _), count in self.stacks.items():
            threads[thread] += count
        print(f"samples per thread ({self.every * 1000:.0f} ms each):", dict(threads))
        cpu: collections.Counter = collections.Counter()
        for label, seconds in self.cpu.values():
            cpu[label[:20]] += seconds
        python = sum(v for k, v in cpu.items() if not k.startswith("native "))
        print(f"CPU seconds per thread over {self.wall:.1f} s sampled (Python threads together: {python:.1f} s, "
              f"{python / max(self.wall, 1e-9):.0%} of the wall clock):")
        print("   " + ", ".join(f"{label} {seconds:.1f}" for label, seconds in cpu.most_common()))
        for (thread, stack), count in self.stacks.most_common(top):
            print(f"{count:7d} {thread:14s} {stack}")
        for shown in threads_shown:
            print(f"thread {shown}, most frequent stack per {window} s (samples in the window):")
            windows: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
            for t, name, stack in self.timeline:
                if name == shown:
                    windows[int(t / window)][stack] += 1
            for w in sorted(windows):
                stack, count = windows[w].most_common(1)[0]
                print(f"{w * window:7.2f} s {count:3d}/{sum(windows[w].values()):3d} {stack}")


def sample_cli(args: argparse.Namespace) -> None:
    with Sampler() as sampler:
        t0 = time.perf_counter()
        from lsr_index.cli import main as cli

        # a command sets its own Ctrl-C and SIGTERM handlers, and ignores both once its output is complete: the
        # report after it is this script's, and stoppable
        handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            cli.main(shlex.split(args.cli), prog_name="lsr-index", standalone_mode=False)
        finally:
            for number, handler in handlers.items():
                signal.signal(number, handler)
            print(f"lsr-index {args.cli}: {time.perf_counter() - t0:.1f} s from before the first import", flush=True)
    sampler.report(args.top, args.window, tuple(args.threads.split(",")))


def sample_synthetic(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_encode import make_model, synthetic_corpus, words_from

    from lsr_index.encode.job import EncodeJob, EncodeOptions
    from lsr_index.encode.run import encode_corpus

    if args.tokenizer is None:
        sys.exit("--tokenizer is required without --cli")
    work = Path(tempfile.mkdtemp(prefix="sample-encode-"))
    corpus = work / "corpus.jsonl"
    texts = synthetic_corpus(corpus, args.docs, words_from(args.tokenizer))
    model = make_model(args.arch, work / args.arch, args.tokenizer, args.device, args.smoke, texts[:256])
    gpu = args.device.startswith("cuda")
    job = EncodeJob(inputs=(str(corpus),), model=str(model), dtype="bfloat16" if gpu else "float32",
                    options=EncodeOptions(max_tokens=131072 if gpu else 16384, shard_docs=32768, overwrite=True,
                                          progress=False))
    for run in ("warm-up", "sampled"):
        sampler = Sampler()
        with sampler if run == "sampled" else contextlib.nullcontext():
            t0 = time.perf_counter()
            manifest = encode_corpus(job, work / "out", (args.device,))
            seconds = time.perf_counter() - t0
        worker = manifest.stats.per_worker[0]
        print(f"{run}: {manifest.docs:,} docs in {seconds:.1f} s = {manifest.docs / seconds:,.0f} docs/s; start-up "
              f"{worker.startup_seconds:.1f} s, then {worker.docs_per_second_after_startup:,.0f}", flush=True)
    sampler.report(args.top, args.window, tuple(args.threads.split(",")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cli", help="sample this lsr-index command line (quoted) instead of a synthetic run")
    parser.add_argument("--tokenizer", type=Path, help="directory with a BERT tokenizer.json (synthetic runs)")
    parser.add_argument("--docs", type=int, default=262144)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--arch", default="bert-base", choices=("bert-base", "xlmr-base"))
    parser.add_argument("--smoke", action="store_true", help="a 2-layer model: checks the script, measures nothing")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--window", type=float, default=0.25, help="seconds per line of a thread's timeline")
    parser.add_argument("--threads", default="MainThread",
                        help="comma list of the threads whose timeline is printed (e.g. MainThread,model-load)")
    args = parser.parse_args()
    sample_cli(args) if args.cli else sample_synthetic(args)


if __name__ == "__main__":
    main()
