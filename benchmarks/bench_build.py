"""Build benchmark: the direct impact builder against Anserini's fake-word IndexCollection, on the same vectors.

The vectors are synthetic, fitted to real ones: the shipped sample (data/sample, 400 documents) encoded with
splade-tiny (`--fit`, encoded here when not given) gives the distribution of terms per document, of the terms
(document frequencies over the terms it uses) and of impacts (at scale 100); documents are drawn from those.
×10 divides the impacts by 10 (at least 1). Shards are jsonl.gz, as `encode` writes them; the small set is
cut in two shards so that Anserini (one thread per input file) can use two threads.

Two sets: the large one (`--docs`, ×100) is built by the direct builder on one thread and on every core,
`--rounds` times each, alternated (ratios compare medians; the PNG shows the median runs); the small one
(`--small-docs`, ×100 and ×10) by both builders, since Anserini's fake words take ~20× longer.
Every row has wall-clock and CPU-time rates (the CPU time of this process and its children): on a machine
shared with other work the CPU-time rate is the one that compares.

    python benchmarks/bench_build.py --fit VECTORS          # 200k + 12k docs; --million 1000000 adds 1M

Writes benchmarks/results/build_<tag>.{json,csv,png}.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lsr_index.engines.lucene.build import build_index  # noqa: E402
from lsr_index.engines.lucene.jvm import anserini_jar, jvm  # noqa: E402
from lsr_index.engines.lucene.searcher import ImpactSearcher  # noqa: E402
from lsr_index.runtime.threads import host_cores  # noqa: E402
from lsr_index.vectors.manifest import Manifest  # noqa: E402
from lsr_index.vectors.quantize import SparseVectors  # noqa: E402
from lsr_index.vectors.shards import read_shard, write_vectors  # noqa: E402


def fit(vectors: Path) -> dict:
    docs = [v for s in Manifest.load(vectors).shards for _, v in read_shard(vectors / s.file)]
    vocab = sorted({t for v in docs for t in v})
    index = {t: i for i, t in enumerate(vocab)}
    df = np.zeros(len(vocab))
    for v in docs:
        df[[index[t] for t in v]] += 1
    return {"vocab": np.array(vocab, dtype=object), "df": df / df.sum(),
            "lengths": np.array([len(v) for v in docs]), "weights": np.array([w for v in docs for w in v.values()])}


def draw(model: dict, n: int, rng: np.random.Generator, divide: int = 1) -> SparseVectors:
    lengths = rng.choice(model["lengths"], n)
    drawn = rng.choice(len(model["df"]), (n, 2 * int(lengths.max())), p=model["df"])
    terms = []
    for row, length in zip(drawn, lengths):  # distinct terms by document frequency, in the order drawn
        _, first = np.unique(row, return_index=True)
        terms.append(np.sort(row[np.sort(first)][:length]))
    lengths = np.array([len(t) for t in terms])
    weights = rng.choice(model["weights"], int(lengths.sum()))
    if divide > 1:
        weights = np.maximum(1, np.rint(weights / divide))
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=indptr[1:])
    return SparseVectors(indptr, np.concatenate(terms).astype(np.int32), weights.astype(np.int32))


def synthesize(model: dict, out: Path, docs: int, divide: int, seed: int = 1, shard_docs: int = 100_000) -> None:
    rng = np.random.default_rng(seed)

    def shard(start: int, n: int):
        for lo in range(0, n, 10_000):
            m = min(10_000, n - lo)
            yield [f"doc{start + lo + i}" for i in range(m)], draw(model, m, rng, divide)

    write_vectors(out, model["vocab"], (shard(s, min(shard_docs, docs - s)) for s in range(0, docs, shard_docs)),
                  "jsonl.gz", model={"name": "synthetic (fitted to splade-tiny on data/sample)", "sha256": "0" * 64},
                  scale=100.0 / divide)


def queries(model: dict, n: int = 500) -> list[tuple[str, dict[str, int]]]:
    rng = np.random.default_rng(99)
    q = draw({**model, "lengths": np.minimum(model["lengths"], 40)}, n, rng)
    vocab = model["vocab"]
    return [(f"q{i}", {vocab[t]: int(w) for t, w in zip(*q.row(i))}) for i in range(n)]


def cpu_seconds() -> float:
    import resource

    return sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for f in ("ru_utime", "ru_stime"))


def size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fit", type=Path, help="vectors directory to fit (default: encode data/sample)")
    parser.add_argument("--docs", type=int, default=200_000, help="the large set (direct builder only)")
    parser.add_argument("--small-docs", type=int, default=12_000, help="the set both builders build")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each thread count on the large set")
    parser.add_argument("--million", type=int, default=0, help="documents for direct runs on 1 and all cores; 0: skip")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "lsr-bench-build")
    parser.add_argument("--tag", default=f"{host_cores()}core")
    args = parser.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    if args.fit is None:
        from lsr_index.encode.job import EncodeJob, EncodeOptions
        from lsr_index.encode.run import encode_corpus

        args.fit = args.work / "sample-vectors"
        encode_corpus(EncodeJob(inputs=(str(ROOT / "data/sample/corpus.jsonl"),), model="splade-tiny",
                                options=EncodeOptions(progress=False)), args.fit)
    model = fit(args.fit)
    cores = host_cores()
    rows = []

    def run(vectors: Path, builder: str, threads: int, scale: str) -> Path:
        index = args.work / f"index-{builder}-{threads}-{scale}-{vectors.name}"
        cpu0 = cpu_seconds()
        info = build_index(vectors, index, threads=threads, heap="3g", progress=False, builder=builder, overwrite=True)
        cpu = cpu_seconds() - cpu0
        manifest = Manifest.load(vectors)
        row = {"builder": builder, "threads": threads, "scale": scale, "docs": info.documents,
               "writers": info.writers, "seconds": info.build_seconds,
               "docs_per_s": round(info.documents / info.build_seconds, 1), "cpu_seconds": round(cpu, 1),
               "docs_per_cpu_s": round(info.documents / cpu, 1),
               "terms_per_doc": round(manifest.nonzeros / manifest.docs, 1), "index_bytes": size(index),
               "load_average": round(os.getloadavg()[0], 1)}
        rows.append(row)
        print(json.dumps(row), flush=True)
        return index

    vectors = {}
    for scale, divide in (("x100", 1), ("x10", 10)):
        vectors[scale] = args.work / f"small-{scale}"
        synthesize(model, vectors[scale], args.small_docs, divide, shard_docs=(args.small_docs + 1) // 2)
    indexes = {}
    for builder in ("direct", "anserini"):
        for threads in sorted({1, cores}):
            indexes[builder, threads, "x100"] = run(vectors["x100"], builder, threads, "x100")
        run(vectors["x10"], builder, 1, "x10")
    large = args.work / "large-x100"
    synthesize(model, large, args.docs, 1)
    for _ in range(args.rounds):  # alternated, so that a passing disturbance hits both alike; medians compared
        for threads in sorted({1, cores}):
            run(large, "direct", threads, "x100")
    shutil.rmtree(large)
    if args.million:
        big = args.work / "vectors-1M"
        synthesize(model, big, args.million, 1)
        for threads in sorted({1, cores}):
            run(big, "direct", threads, "x100")
        shutil.rmtree(big)

    search = {}
    topics = queries(model)
    searchers = {b: ImpactSearcher(indexes[b, cores, "x100"]) for b in ("direct", "anserini")}
    for b, searcher in searchers.items():
        search[b] = {"ranked": searcher.search(topics[:100], hits=1000, threads=1), "seconds": []}  # warm-up
    for _ in range(3):  # alternate, keep each one's best: the machine may be shared
        for b, searcher in searchers.items():
            t0 = time.perf_counter()
            search[b]["ranked"] = searcher.search(topics, hits=1000, threads=1)
            search[b]["seconds"].append(time.perf_counter() - t0)
    for b, searcher in searchers.items():
        search[b]["queries_per_s"] = round(len(topics) / min(search[b]["seconds"]), 1)
        searcher.close()
    identical = search["direct"]["ranked"] == search["anserini"]["ranked"]

    def rate(builder: str, threads: int, scale: str, docs: int, key: str) -> float:
        return float(np.median([r[key] for r in rows if (r["builder"], r["threads"], r["scale"], r["docs"]) == (
            builder, threads, scale, docs)]))

    ratios = {}
    for key in ("docs_per_s", "docs_per_cpu_s"):
        small, big = args.small_docs, args.docs
        ratios[key] = {
            "direct_1thread_vs_anserini_1thread_x100": rate("direct", 1, "x100", small, key)
            / rate("anserini", 1, "x100", small, key),
            "direct_vs_anserini_all_cores_x100": rate("direct", cores, "x100", small, key)
            / rate("anserini", cores, "x100", small, key),
            "direct_all_cores_vs_1thread_x100_large": rate("direct", cores, "x100", big, key)
            / rate("direct", 1, "x100", big, key),
            **({"direct_all_cores_vs_1thread_x100_million": rate("direct", cores, "x100", args.million, key)
                / rate("direct", 1, "x100", args.million, key)} if args.million else {}),
            "anserini_all_cores_vs_1thread_x100": rate("anserini", cores, "x100", small, key)
            / rate("anserini", 1, "x100", small, key),
            "direct_x10_vs_x100_1thread": rate("direct", 1, "x10", small, key) / rate("direct", 1, "x100", small, key),
            "anserini_x10_vs_x100_1thread": rate("anserini", 1, "x10", small, key)
            / rate("anserini", 1, "x100", small, key),
        }
    autoclass = jvm()
    result = {
        "machine": {"cpu": next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text()
                                 .splitlines() if line.startswith("model name")), platform.processor()),
                    "cores": cores, "python": platform.python_version(),
                    "anserini_jar": anserini_jar().name,
                    "lucene": autoclass("org.apache.lucene.util.Version").LATEST.toString(),
                    "java": autoclass("java.lang.System").getProperty("java.version"),
                    "load_average_at_end": os.getloadavg()},
        "vectors": f"synthetic, fitted to splade-tiny vectors of data/sample ({len(model['vocab'])} distinct terms, "
                   f"{model['lengths'].mean():.0f} terms/doc, impacts at x100: median "
                   f"{int(np.median(model['weights']))}, max {int(model['weights'].max())}); jsonl.gz shards: "
                   f"large set of 100,000 documents each, small set in two",
        "rows": rows, "ratios": {k: {n: round(v, 3) for n, v in r.items()} for k, r in ratios.items()},
        "search": {"queries": len(topics), "hits": 1000, "threads": 1, "identical_rankings": identical,
                   **{f"{b}_queries_per_s": search[b]["queries_per_s"] for b in search}},
    }
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"build_{args.tag}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    with open(stem.with_suffix(".csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, stem.with_suffix(".png"), result["machine"])
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=2))
    print(f"wrote {stem.relative_to(ROOT)}.{{json,csv,png}}")


def plot(rows: list[dict], path: Path, machine: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_config: dict[tuple, list[dict]] = {}
    for r in rows:
        by_config.setdefault((r["builder"], r["threads"], r["scale"], r["docs"]), []).append(r)
    rows = [sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2] for runs in by_config.values()]  # medians
    fig, ax = plt.subplots(figsize=(8, 4.5))
    labels = [f"{r['builder']}\n{r['threads']} thr {r['scale']}\n{r['docs'] // 1000}k" for r in rows]
    colors = ["tab:blue" if r["builder"] == "direct" else "tab:orange" for r in rows]
    x = np.arange(len(rows))
    ax.bar(x - 0.2, [r["docs_per_s"] for r in rows], 0.4, color=colors, label="per wall-clock second")
    ax.bar(x + 0.2, [r["docs_per_cpu_s"] for r in rows], 0.4, color=colors, alpha=0.45, label="per CPU second")
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("documents / s")
    ax.legend(fontsize=7)
    ax.set_title(f"lsr-index build: direct vs Anserini fake words ({machine['cores']} cores, {machine['cpu']})",
                 fontsize=9)
    for i, r in enumerate(rows):
        ax.text(i - 0.2, r["docs_per_s"], f"{r['docs_per_s']:,.0f}", ha="center", va="bottom", fontsize=6)
        ax.text(i + 0.2, r["docs_per_cpu_s"], f"{r['docs_per_cpu_s']:,.0f}", ha="center", va="bottom", fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
