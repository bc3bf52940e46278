"""CPU encode on an idle and on a shared machine: the command's rate after start-up, idle and with every core
already busy, for the thread settings a user can choose.

Each row runs `lsr-index encode` on the same documents in a new process. "Loaded" rows first start one busy loop
per usable core (load ≈ 2× the cores once the encode's own threads run), so the encode's fair share is about
half the machine. Conditions alternate run by run (idle and loaded, every variant), and each figure is the median
of `--repeats`. The figure of merit is the rate per core of CPU time the encode obtained, loaded against idle:
a run whose threads spin or wait on each other spends its share without encoding.

    python benchmarks/bench_cpu_load.py --docs 400 --repeats 3
    # → benchmarks/results/cpu_load_<cores>core.{json,csv}

Variants: `default` is the command as shipped; `active` sets OMP_WAIT_POLICY=ACTIVE (threads spin while they
wait: OpenMP's behaviour when nothing says otherwise is close to it); `threads=1` passes --threads 1.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import csv_line, provenance, with_provenance

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "sample" / "corpus.jsonl"
VARIANTS = {"default": ({}, []), "active": ({"OMP_WAIT_POLICY": "ACTIVE"}, []), "threads=1": ({}, ["--threads", "1"])}


def usable_cores() -> int:
    sys.path.insert(0, str(ROOT))
    from lsr_index.runtime.threads import host_cores

    return host_cores()


def busy_loops(n: int) -> list[subprocess.Popen]:
    """n processes that each keep one core busy until killed."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def encode_once(corpus: Path, work: Path, env_extra: dict, args: list[str], model: str) -> dict:
    """One encode in a new process: its rate after start-up (the manifest's), whole time and CPU seconds."""
    out = work / "vectors"
    env = {**os.environ, **env_extra}
    env.pop("OMP_NUM_THREADS", None)
    before = os.times()
    started = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "lsr_index", "--quiet", "encode", str(corpus), "-o", str(out),
                          "--model", model, "--device", "cpu", "--overwrite", *args],
                         env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = os.times()
    if run.returncode != 0:
        raise SystemExit(f"encode failed ({run.returncode}): {run.stderr[-2000:]}")
    stats = json.loads((out / "manifest.json").read_text())["stats"]
    worker = stats["per_worker"][0]
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return {"docs": stats["docs_this_run"], "docs_per_second_after_startup": worker["docs_per_second_after_startup"],
            "encode_seconds": stats["seconds"], "command_seconds": round(wall, 3), "cpu_seconds": round(cpu, 3),
            "cores_obtained": round(cpu / wall, 3), "threads": worker["cores"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=400, help="documents of the shipped sample to encode")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="splade-tiny")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    cores = usable_cores()
    prov = provenance()
    variants = args.variants.split(",")
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="lsr-cpu-load-") as tmp:
        work = Path(tmp)
        corpus = work / "corpus.jsonl"
        lines = SAMPLE.read_text().splitlines(keepends=True)
        corpus.write_text("".join((lines * (args.docs // len(lines) + 1))[:args.docs]))
        encode_once(corpus, work, {}, [], args.model)  # the model fetched and the page cache warm: not timed
        for repeat in range(args.repeats):
            for load in (("idle", "loaded") if repeat % 2 == 0 else ("loaded", "idle")):
                for variant in (variants if repeat % 2 == 0 else variants[::-1]):
                    hogs = busy_loops(cores) if load == "loaded" else []
                    try:
                        time.sleep(1.0 if hogs else 0.0)  # the loops running before the encode starts
                        result = encode_once(corpus, work, *VARIANTS[variant], args.model)
                    finally:
                        for hog in hogs:
                            hog.kill()
                            hog.wait()
                    rows.append({"variant": variant, "load": load, "busy_loops": len(hogs), "repeat": repeat,
                                 **result})
                    print(f"{variant:10} {load:6} rate {result['docs_per_second_after_startup']:8.1f} docs/s  "
                          f"cores obtained {result['cores_obtained']:.2f}  whole {result['command_seconds']:.1f} s",
                          flush=True)
    summary = {}
    for variant in variants:
        medians = {}
        for load in ("idle", "loaded"):
            picked = [r for r in rows if r["variant"] == variant and r["load"] == load]
            rate = statistics.median(r["docs_per_second_after_startup"] for r in picked)
            obtained = statistics.median(r["cores_obtained"] for r in picked)
            medians[load] = {"docs_per_second": rate, "cores_obtained": obtained,
                             "docs_per_second_per_core": rate / max(obtained, 1e-9)}
        summary[variant] = {**medians, "loaded_over_idle": medians["loaded"]["docs_per_second"]
                            / medians["idle"]["docs_per_second"],
                            "per_core_loaded_over_idle": medians["loaded"]["docs_per_second_per_core"]
                            / medians["idle"]["docs_per_second_per_core"]}
    baseline = summary.get("default", {}).get("idle", {}).get("docs_per_second")
    result = {"cores": cores, "docs": args.docs, "model": args.model, "repeats": args.repeats, "summary": summary,
              "default_idle_docs_per_second": baseline, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"cpu_load_{cores}core"
    stem.with_suffix(".json").write_text(json.dumps(with_provenance(result, prov), indent=1) + "\n")
    with open(stem.with_suffix(".csv"), "w", newline="") as f:
        f.write(csv_line(prov))
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    for variant, s in summary.items():
        print(f"{variant:10} idle {s['idle']['docs_per_second']:7.1f}  loaded {s['loaded']['docs_per_second']:7.1f} "
              f"docs/s ({s['loaded_over_idle']:.2f}×; per core obtained {s['per_core_loaded_over_idle']:.2f}×)")
    print(f"wrote {stem}.json and .csv")


if __name__ == "__main__":
    main()
