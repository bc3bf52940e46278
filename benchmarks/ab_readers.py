"""The command a user runs on real text (splade-tiny, SciFact x20, default flags) with 1, 2, 4... input processes
per GPU, rounds interleaved, on one GPU: how many readers a GPU's share of the host needs. The default
(feed.readers_for of the host's cores) is one of the rows.

    python benchmarks/ab_readers.py --scifact DIR [--readers 1,2,4] [--rounds 2] [--out DIR]

Each run is the CLI in a new process, its readers set through task.readers_for, the one place they are chosen.
Writes ab_readers_<GPU>.json (rows: readers, round, whole command, encode clock, start-up, rate after it, input
wait, host use).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_encode import real_corpus, run_cli
from provenance import provenance, with_provenance

from lsr_index.encode.feed import readers_for
from lsr_index.runtime.threads import host_cores

LAUNCH = ("from lsr_index.encode import task; task.readers_for = lambda cores: {readers}; "
          "from lsr_index.cli import main; main(prog_name='lsr-index')")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scifact", type=Path, required=True, help="BEIR SciFact directory (corpus.jsonl)")
    parser.add_argument("--readers", default="1,2,4", help="comma list of input processes per GPU")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    default = readers_for(host_cores())
    counts = sorted({*map(int, args.readers.split(",")), default})
    rows = []
    with tempfile.TemporaryDirectory(prefix="ab-readers-") as tmp:
        work = Path(tmp)
        corpus = work / "sci20.jsonl"
        real_corpus(corpus, args.scifact, 100_000)
        run_cli(corpus, work / "out", 1)  # Triton's caches and the page cache warm, as on a machine in use
        for round_ in range(args.rounds):
            for readers in counts:
                r = run_cli(corpus, work / "out", 1, (sys.executable, "-c", LAUNCH.format(readers=readers)))
                w = r["per_worker"][0]
                row = {"readers": readers, "default": readers == default, "round": round_, "docs": r["docs"],
                       "seconds": round(r["seconds"], 3), "encode_seconds": r["encode_seconds"],
                       "startup_seconds": r["startup_seconds"],
                       "docs_per_second_after_startup": r["docs_per_second_after_startup"],
                       "input_wait_seconds": w["input_wait_seconds"], "worker_readers": w.get("readers"),
                       "host_use": r["host_use"]}
                rows.append(row)
                print(f"readers {readers}{' (default)' if row['default'] else ''} round {round_}: command "
                      f"{row['seconds']:.2f} s, start-up {row['startup_seconds']:.2f} s, then "
                      f"{row['docs_per_second_after_startup']:,.0f} docs/s, input wait "
                      f"{row['input_wait_seconds']:.2f} s", flush=True)
    summary = {n: {"seconds_median": statistics.median(r["seconds"] for r in rows if r["readers"] == n),
                   "after_startup_median": statistics.median(r["docs_per_second_after_startup"]
                                                             for r in rows if r["readers"] == n)} for n in counts}
    for n, m in summary.items():
        print(f"readers {n}: command {m['seconds_median']:.2f} s, after start-up {m['after_startup_median']:,.0f} "
              "docs/s (medians)")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"ab_readers_{gpu.replace(' ', '_')}.json"
    path.write_text(json.dumps(with_provenance({"host_cores": host_cores(), "default_readers": default,
                                                "rows": rows, "medians": summary}, provenance()), indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
