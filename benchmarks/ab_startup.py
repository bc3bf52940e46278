"""A new process's start-up, step by step, for two trees of lsr-index on one GPU, rounds alternated: BERT-base over
synthetic documents run as a user's run starts (a new process that has imported lsr-index and not used CUDA), and,
with --scifact, the command a user types on real text (splade-tiny, SciFact x20, default flags).

    git archive REV lsr_index sparton | tar -x -C /tmp/before
    python benchmarks/ab_startup.py --tokenizer DIR --before /tmp/before [--scifact DIR] [--rounds 3]

Each run records its timeline (LSR_INDEX_TIMELINE: CUDA set up, weights on the device, first tokenized piece,
warm-up...), the worker's start-up and its rate after it. --sample adds a run of the script's own checkout whose
threads are sampled every 5 ms, printed as spans of one stack: where the time before the first batch goes.
Writes ab_startup_<GPU>[_<name>].json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_encode import _FRESH, make_model, real_corpus, run_cli, synthetic_corpus, timeline_of, words_from
from provenance import provenance, with_provenance

HERE = Path(__file__).resolve().parents[1]

# put before bench_encode's own new-process run (_FRESH) when asked: samples every thread each 5 ms from the start
# of run_lsr_index, and prints the spans of one stack per thread to stderr at exit
SAMPLER = r"""
import atexit, collections, json, os, sys, threading, time, traceback
sys.path.insert(0, sys.argv[1])
import bench_encode

samples = []

def sample(t0: float, seconds: float) -> None:
    me = threading.get_ident()
    while time.time() - t0 < seconds:
        names = {t.ident: t.name for t in threading.enumerate()}
        for ident, frame in sys._current_frames().items():
            if ident != me:
                where = [f"{os.path.basename(f.filename)}:{f.name}:{f.lineno}" for f in traceback.extract_stack(frame)]
                samples.append((time.time() - t0, names.get(ident, "?"), " < ".join(reversed(where[-4:]))))
        time.sleep(0.005)

def spans() -> None:
    by_thread = collections.defaultdict(list)
    for now, name, where in samples:
        if name in ("MainThread", "model-load") or name.startswith("input"):
            rows = by_thread[name]
            if rows and rows[-1][2] == where:
                rows[-1][1] = now
            else:
                rows.append([now, now, where])
    kept = {name: [r for r in rows if r[1] - r[0] >= 0.02] for name, rows in by_thread.items()}
    print("SAMPLED", json.dumps(kept), file=sys.stderr, flush=True)

run = bench_encode.run_lsr_index

def sampled_run(*args, **kwargs):
    threading.Thread(target=sample, args=(time.time(), float(os.environ["PROBE_SAMPLE"])), daemon=True).start()
    return run(*args, **kwargs)

bench_encode.run_lsr_index = sampled_run
atexit.register(spans)
"""


def python_path(tree: Path) -> str:
    """PYTHONPATH with `tree` first (its lsr_index), then what the caller had (packages installed beside)."""
    return os.pathsep.join([str(tree), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])


def fresh_run(tree: Path, args: dict, sample: float = 0.0) -> dict:
    env = {**os.environ, "LSR_INDEX_TIMELINE": "1", "PYTHONPATH": python_path(tree)}
    if sample:
        env["PROBE_SAMPLE"] = str(sample)
    script = (SAMPLER if sample else "") + _FRESH
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-P", "-c", script, str(Path(__file__).parent), json.dumps(args)],
                          capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"the run in {tree} failed ({done.returncode}): {done.stderr[-2000:]}")
    result = json.loads(done.stdout.rsplit("RESULT ", 1)[1])
    # several when the run was given several devices: the last one's start counts, and their rates add up
    workers = [w for w in result["per_worker"] if w["docs"]]
    return {"process_seconds": round(time.perf_counter() - t0, 3), "encode_seconds": round(result["seconds"], 3),
            "docs": result["docs"], "docs_per_second": round(result["docs"] / result["seconds"], 1),
            "startup_seconds": max(w["startup_seconds"] for w in workers),
            "model_loaded_after_seconds": max(w["model_loaded_after_seconds"] for w in workers),
            "docs_per_second_after_startup": sum(w["docs_per_second_after_startup"] for w in workers),
            "timeline": timeline_of(done.stderr),
            "sampled": json.loads(done.stderr.rsplit("SAMPLED ", 1)[1]) if sample else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", type=Path, required=True, help="directory with a BERT tokenizer.json")
    parser.add_argument("--before", type=Path, required=True, help="the other tree (a directory holding lsr_index)")
    parser.add_argument("--scifact", type=Path, help="BEIR SciFact directory: also the CLI on SciFact x20")
    parser.add_argument("--docs", type=int, default=300_000, help="synthetic documents of the BERT-base runs")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sample", action="store_true",
                        help="one more run of the script's own checkout, its threads sampled")
    parser.add_argument("--out", type=Path, default=HERE / "benchmarks" / "results")
    parser.add_argument("--device", default="",
                        help="the runs' devices (default: the first GPU); e.g. cuda:0,cuda:0 runs two worker "
                             "processes on one GPU, to time what several workers add to the start and the end")
    parser.add_argument("--name", default="", help="appended to the file's name: ab_startup_<GPU>_<name>.json")
    args = parser.parse_args()
    import torch

    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    devices = args.device.split(",") if args.device else [device]
    options = ("--device", args.device) if args.device else ()
    gpus = 1 + max((int(d.partition(":")[2] or 0) for d in devices if d.startswith("cuda")), default=0)
    gpu = torch.cuda.get_device_name(0) if device != "cpu" else "cpu"
    trees = {"before": args.before.resolve(), "after": HERE}
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="ab-startup-") as tmp:
        work = Path(tmp)
        words = words_from(args.tokenizer)
        texts = synthetic_corpus(work / "calibration.jsonl", 4096, words)
        bert = make_model("bert-base", work / "bert-base", args.tokenizer, device, device == "cpu", texts[:256])
        corpus = work / "synthetic.jsonl"
        synthetic_corpus(corpus, args.docs, words, seed=3)
        run = {"model_dir": str(bert), "corpus": str(corpus), "out": str(work / "out"), "devices": devices,
               "dtype": "bfloat16" if device != "cpu" else "float32",
               "max_tokens": 131072 if device != "cpu" else 16384}
        fresh_run(HERE, dict(run))  # Triton's caches and the page cache warm, as on a machine in use
        sci20 = None
        if args.scifact:
            sci20 = work / "sci20.jsonl"
            real_corpus(sci20, args.scifact, 100_000)
            run_cli(sci20, work / "cli", gpus, options=options)
        for round_ in range(args.rounds):
            for label, tree in trees.items():
                row = {"tree": label, "round": round_, "workload": f"bert-base, {args.docs:,} synthetic docs",
                       **fresh_run(tree, dict(run))}
                rows.append(row)
                print(f"{label} round {round_} bert-base: start-up {row['startup_seconds']:.2f} s (model loaded at "
                      f"{row['model_loaded_after_seconds']:.2f} s), then {row['docs_per_second_after_startup']:,.0f} "
                      f"docs/s; end to end {row['docs_per_second']:,.0f} docs/s", flush=True)
                if sci20:
                    # -P: `-m` would put the working directory (the newer checkout) ahead of PYTHONPATH
                    command = ("env", f"PYTHONPATH={python_path(tree)}", sys.executable, "-P", "-m", "lsr_index")
                    r = run_cli(sci20, work / "cli", gpus, command, options)
                    row = {"tree": label, "round": round_, "workload": "CLI, splade-tiny, SciFact x20",
                           "process_seconds": round(r["seconds"], 3), "encode_seconds": r["encode_seconds"],
                           "docs": r["docs"], "startup_seconds": r["startup_seconds"],
                           "docs_per_second_after_startup": r["docs_per_second_after_startup"],
                           "timeline": r["timeline"]}
                    rows.append(row)
                    print(f"{label} round {round_} CLI: command {row['process_seconds']:.2f} s, start-up "
                          f"{row['startup_seconds']:.2f} s, then {row['docs_per_second_after_startup']:,.0f} docs/s",
                          flush=True)
        if args.sample:
            sampled = {"tree": "after", "round": "sampled", "workload": f"bert-base, {args.docs:,} synthetic docs",
                       **fresh_run(HERE, dict(run), sample=6.0)}
            rows.append(sampled)
            for name, spans in sampled["sampled"].items():
                print(f"-- {name}")
                for lo, hi, where in spans:
                    print(f"   {lo:6.3f}-{hi:6.3f} {where[:200]}")
    medians = {}
    for workload in dict.fromkeys(r["workload"] for r in rows):
        for label in trees:
            runs = [r for r in rows if r["workload"] == workload and r["tree"] == label and r["round"] != "sampled"]
            medians[f"{workload}: {label}"] = {key: statistics.median(r[key] for r in runs) for key in
                                               ("startup_seconds", "docs_per_second_after_startup", "process_seconds",
                                                "encode_seconds")}
    for name, m in medians.items():
        print(f"{name}: start-up {m['startup_seconds']:.2f} s, after it {m['docs_per_second_after_startup']:,.0f} "
              f"docs/s, encode {m['encode_seconds']:.2f} s, process {m['process_seconds']:.2f} s (medians)")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"ab_startup_{gpu.replace(' ', '_')}{'_' + args.name if args.name else ''}.json"
    path.write_text(json.dumps(with_provenance({"rows": rows, "medians": medians}, provenance()), indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
