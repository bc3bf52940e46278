"""How long a user waits for the short commands: a one-query search on the shipped sample's index, and `--help`.

A search of one query is all start-up: the interpreter, torch, the query model, the engine. Each run is a new
process, timed from its start to its exit; the variants alternate run by run and each figure is the median of
`--repeats`. The sample's vectors and Lucene index are made first, in a temporary work directory (or `--workdir`
if it holds them already). The process's own steps (`LSR_INDEX_TIMELINE=1`) are kept from the last run.

    python benchmarks/bench_startup.py --repeats 7
    # → benchmarks/results/startup_<cores>core.{json,csv}
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import csv_line, provenance, with_provenance

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "sample"
LSR = [sys.executable, "-m", "lsr_index"]


def timed(args: list[str], env: dict | None = None) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run([*LSR, *args], capture_output=True, text=True, env={**os.environ, **(env or {})})
    seconds = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"lsr-index {' '.join(args)} failed ({done.returncode}): {done.stderr[-1500:]}")
    return seconds, done.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--workdir", type=Path, help="a work directory holding the sample's index (else made)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        work = args.workdir or Path(tmp) / "work"
        if not (work / "index").is_dir():
            timed(["-q", "-w", str(work), "encode", str(SAMPLE / "corpus.jsonl"), "--device", "cpu"])
            timed(["-q", "-w", str(work), "build"])
        query = Path(tmp) / "one.tsv"
        query.write_text("q1\tdoes sleep deprivation impair memory\n")
        variants = {"search, one query": ["-q", "-w", str(work), "search", "--queries", str(query),
                                          "--run", str(Path(tmp) / "run.trec")],
                    "--help": ["--help"]}
        timed(variants["search, one query"])  # the query model's tokenizer cached, the page cache warm
        seconds: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.repeats):
            for name, command in variants.items():
                seconds[name].append(timed(command)[0])
        _, stderr = timed(variants["search, one query"], {"LSR_INDEX_TIMELINE": "1"})
    timeline = [(float(m[1]), m[2]) for m in re.finditer(r"timeline ([\d.]+) s: (.*)", stderr)]
    rows = [{"command": name, "median_seconds": round(statistics.median(s), 3), "min_seconds": round(min(s), 3),
             "max_seconds": round(max(s), 3), "runs": [round(x, 3) for x in s]} for name, s in seconds.items()]
    for row in rows:
        print(f"{row['command']:<20} median {row['median_seconds']:.2f} s  "
              f"(min {row['min_seconds']:.2f}, max {row['max_seconds']:.2f}, {len(row['runs'])} runs)")
    prov = provenance()
    name = f"startup_{os.cpu_count()}core"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps(with_provenance({"rows": rows, "search_timeline": timeline},
                                                                      prov), indent=2))
    with open(args.out / f"{name}.csv", "w", newline="") as f:
        f.write(csv_line(prov))
        writer = csv.DictWriter(f, fieldnames=["command", "median_seconds", "min_seconds", "max_seconds"],
                                extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
