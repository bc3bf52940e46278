"""Search benchmark: Seismic against Lucene's exact impact search, side by side, on real and synthetic SPLADE vectors.

Each dataset is indexed by both engines from the same shards: Lucene by the direct builder (every core), Seismic
by `engines.seismic.build_index` at a few build settings. Build rows: wall time, index bytes, peak memory (the
resident memory of this process's children, summed, sampled every 0.2 s), and the memory searching adds to this
process (Seismic's index loaded; Lucene's JVM and what it maps). Search rows, one thread, `--k` hits:
queries/s by wall clock and by CPU time (the machine may be shared), and recall@k against Lucene's run, which is
exact for integer impacts: the share of the exact top k that a run finds, counting a document tied with the exact
k-th score as found (Lucene keeps the lowest docids of a tie, Seismic any of them). With judgments, nDCG@10.

Datasets:
  real       --vectors DIR (an encode output) --queries FILE (query vectors, JSONL {"id", "vector"}, or queries
             `qid<TAB>text`, encoded here with the model the vectors record) [--qrels FILE]
  synthetic  --docs documents and --synthetic-queries queries (0: skip), drawn from statistics fitted to real
             splade-tiny vectors (--fit DIR, default --vectors, else data/sample encoded here): terms per document,
             impacts (×100), query lengths and impacts, and term popularity as a Zipf law over a 30,522-term
             vocabulary. Independent draws would make documents share nothing but frequent terms; real ones share
             topics, which is what Seismic's clustered lists exploit. So each document draws half its terms from a
             topic (two mixed, out of docs/15) and gives them its highest impacts; each query draws 70% of its
             terms from one topic. Written as Parquet shards, streamed (never all in memory).

    python benchmarks/bench_search.py --vectors V --queries Q.tsv --qrels R.tsv     # SciFact + 1M synthetic
    python benchmarks/bench_search.py --quick                                       # a smoke run, minutes

Writes benchmarks/results/search_<tag>.{json,csv,png} (PNG: recall@k against queries/s).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_build import fit  # noqa: E402
from provenance import csv_line, png_metadata, provenance, with_provenance  # noqa: E402

from lsr_index.engines.lucene.build import build_index as build_lucene  # noqa: E402
from lsr_index.engines.seismic.build import build_index as build_seismic  # noqa: E402
from lsr_index.engines.seismic.options import SeismicBuild, SeismicSearch  # noqa: E402
from lsr_index.engines.seismic.searcher import Searcher  # noqa: E402
from lsr_index.runtime.threads import host_cores as available_cores  # noqa: E402
from lsr_index.vectors.manifest import Manifest  # noqa: E402
from lsr_index.vectors.quantize import SparseVectors  # noqa: E402
from lsr_index.vectors.shards import write_vectors  # noqa: E402

VOCAB = 30_522
Queries = list[tuple[str, dict[str, int]]]


# --- memory -----------------------------------------------------------------------------------------------------

class ChildrenMemory:
    """Peak resident memory of this process's descendants, summed over those alive at each sample. A child caught
    between its fork and its exec still shows this process's command line and resident pages (gigabytes, with the
    JVM and torch loaded): it is left out."""

    def __init__(self, every: float = 0.2):
        self.every, self.peak = every, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ChildrenMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        page = os.sysconf("SC_PAGE_SIZE")
        own = Path(f"/proc/{os.getpid()}/cmdline").read_bytes()
        while not self._stop.wait(self.every):
            parents = {}
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    try:
                        stat = Path(f"/proc/{entry}/stat").read_text()
                        parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
                    except (OSError, ValueError, IndexError):
                        continue
            mine, frontier = set(), {os.getpid()}
            while frontier:
                frontier = {pid for pid, parent in parents.items() if parent in frontier} - mine
                mine |= frontier
            total = 0
            for pid in mine:
                try:
                    if Path(f"/proc/{pid}/cmdline").read_bytes() == own:
                        continue
                    total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
                except (OSError, ValueError, IndexError):
                    continue
            self.peak = max(self.peak, total)


# --- synthetic vectors ------------------------------------------------------------------------------------------

def fit_queries(queries: Queries) -> dict:
    return {"lengths": np.array([len(v) for _, v in queries]),
            "weights": np.array([w for _, v in queries for w in v.values()])}


def zipf_exponent(df: np.ndarray) -> float:
    """The slope of log document frequency against log rank over the fitted vocabulary's head."""
    counts = np.sort(df)[::-1]
    counts = counts[counts > 0][:5000]
    ranks = np.arange(1, len(counts) + 1)
    return float(-np.polyfit(np.log(ranks), np.log(counts), 1)[0])


class Generator:
    """Documents and queries with the fitted marginals and a topic structure (see the module's docstring)."""

    def __init__(self, docs_fit: dict, queries_fit: dict, docs: int, seed: int = 7, docs_per_topic: int = 15,
                 topic_terms: int = 300, concentration: float = 0.8, doc_share: float = 0.5, query_share: float = 0.7):
        rng = np.random.default_rng(seed)
        self.exponent = zipf_exponent(docs_fit["df"])
        popularity = np.arange(1, VOCAB + 1, dtype=np.float64) ** -self.exponent
        self.popularity = popularity / popularity.sum()
        self.table = _inverse_cdf(self.popularity, 1 << 22)  # a uniform index → a term, by popularity
        self.topics = max(20, docs // docs_per_topic)
        # each topic: `topic_terms` distinct terms, drawn more from the middle of the vocabulary than its head
        flat = _inverse_cdf(popularity ** 0.5, 1 << 22)
        self.topic_terms = np.empty((self.topics, topic_terms), np.int32)
        for t in range(self.topics):
            drawn = flat[rng.integers(0, len(flat), 3 * topic_terms)]
            _, first = np.unique(drawn, return_index=True)
            self.topic_terms[t] = drawn[np.sort(first)[:topic_terms]]
        self.doc_share, self.query_share = doc_share, query_share
        inside = np.arange(1, topic_terms + 1, dtype=np.float64) ** -concentration
        self.inside_table = _inverse_cdf(inside / inside.sum(), 1 << 16)  # → a place in a topic's term list
        self.docs_fit, self.queries_fit = docs_fit, queries_fit
        self.vocab = np.array([f"w{i:05d}" for i in range(VOCAB)], dtype=object)

    def _vectors(self, rng, lengths: np.ndarray, topics: np.ndarray, share: float, weights: np.ndarray,
                 second: np.ndarray | None = None) -> SparseVectors:
        """Rows of about `lengths` distinct terms: `share` of them the topic's (30% of those from `second`), the
        rest drawn by popularity; the row's impacts, drawn from `weights`, go in descending order to its topical
        terms first, rarer before more common, then to the others alike (SPLADE weighs rare terms up).
        Vectorized over rows: draws with replacement, then one sort of (row, term) keys keeps one of each."""
        n = len(lengths)
        topical = np.rint(share * lengths).astype(np.int64)
        from_second = np.rint(0.3 * topical).astype(np.int64) if second is not None else np.zeros(n, np.int64)
        keys = []
        for t, count in ((topics, topical - from_second), (second, from_second)):
            if t is not None:
                rows = np.repeat(np.arange(n), np.ceil(1.3 * count).astype(np.int64))
                places = self.inside_table[rng.integers(0, len(self.inside_table), len(rows))]
                keys.append(_keys(rows, self.topic_terms[t[rows], places], 0))
        rows = np.repeat(np.arange(n), np.ceil(1.3 * lengths - topical).astype(np.int64) + 8)
        keys.append(_keys(rows, self.table[rng.integers(0, len(self.table), len(rows))], 1))
        key = np.sort(np.concatenate(keys))
        key = key[np.r_[True, (key[1:] >> 1) != (key[:-1] >> 1)]]  # one of each (row, term), topical first
        rows, terms, tier = key >> 1 >> 15, (key >> 1) & 0x7FFF, key & 1
        # thin each row's other terms to its length, each kept with the same chance (no bias by term)
        tops = np.bincount(rows[tier == 0], minlength=n)
        others = np.bincount(rows[tier == 1], minlength=n)
        chance = np.maximum(lengths - tops, 0) / np.maximum(others, 1)
        keep = (tier == 0) | (rng.random(len(rows)) < chance[rows])
        rows, terms, tier = rows[keep], terms[keep], tier[keep]
        counts = np.bincount(rows, minlength=n)
        indptr = np.zeros(n + 1, np.int64)
        np.cumsum(counts, out=indptr[1:])
        # rank of each term in its row: topical ones first, within a tier the larger term number (rarer) first
        tops = np.bincount(rows[tier == 0], minlength=n)
        index_in_tier = np.empty(len(rows), np.int64)
        for t in (0, 1):  # the entry's place among its row's entries of its tier, terms ascending
            seen = np.cumsum(tier == t)
            index_in_tier[tier == t] = (seen - np.r_[0, seen][indptr[:-1]][rows] - 1)[tier == t]
        size_of_tier = np.where(tier == 0, tops[rows], counts[rows] - tops[rows])
        rank = np.where(tier == 0, 0, tops[rows]) + size_of_tier - 1 - index_in_tier
        # the row's impacts in descending order, without sorting: quantiles at sorted uniforms (exponential spacings)
        spacing = rng.exponential(size=len(rows) + n)
        ends = indptr + np.arange(n + 1)  # each row has counts + 1 spacings
        running = np.cumsum(spacing)
        start = np.r_[0.0, running][ends[:-1]]
        total = running[ends[1:] - 1] - start
        position = ends[:-1][rows] + rank
        uniform = (running[position] - start[rows]) / total[rows]
        ranked = np.sort(weights)[::-1]
        values = ranked[np.minimum((uniform * len(ranked)).astype(np.int64), len(ranked) - 1)]
        return SparseVectors(indptr, terms.astype(np.int32), values.astype(np.int32))

    def documents(self, out: Path, docs: int, seed: int, shard_docs: int = 100_000, block: int = 10_000) -> None:
        rng = np.random.default_rng(seed)

        def shard(start: int, n: int):
            for lo in range(0, n, block):
                m = min(block, n - lo)
                lengths = rng.choice(self.docs_fit["lengths"], m)
                topics = rng.integers(0, self.topics, m)
                second = rng.integers(0, self.topics, m)
                yield ([f"doc{start + lo + i}" for i in range(m)],
                       self._vectors(rng, lengths, topics, self.doc_share, self.docs_fit["weights"], second))

        write_vectors(out, list(self.vocab), (shard(s, min(shard_docs, docs - s)) for s in range(0, docs, shard_docs)),
                      "parquet", model={"name": "synthetic (fitted to splade-tiny)", "sha256": "0" * 64})

    def queries(self, n: int, seed: int) -> Queries:
        rng = np.random.default_rng(seed)
        lengths = rng.choice(self.queries_fit["lengths"], n)
        vectors = self._vectors(rng, lengths, rng.integers(0, self.topics, n), self.query_share,
                               self.queries_fit["weights"])
        return [(f"q{i}", {self.vocab[t]: int(w) for t, w in zip(*vectors.row(i))}) for i in range(n)]


def _inverse_cdf(p: np.ndarray, size: int) -> np.ndarray:
    """A table whose entry at a uniform random index is i with probability ≈ p[i] (one gather per draw)."""
    cdf = np.cumsum(p)
    return np.minimum(np.searchsorted(cdf / cdf[-1], (np.arange(size) + 0.5) / size, side="right"),
                      len(p) - 1).astype(np.int32)


def _keys(rows: np.ndarray, terms: np.ndarray, tier: int) -> np.ndarray:
    """(row, term, tier) in one sortable integer: rows, then terms (15 bits), then tier (topical first)."""
    return ((rows.astype(np.int64) << 15 | terms.astype(np.int64)) << 1) | tier


def stats(vectors: Path, queries: Queries) -> dict:
    """What the vectors look like, to set beside what they were fitted to."""
    manifest = Manifest.load(vectors)
    import pyarrow.parquet as pq

    lengths, weights = [], []
    for shard in manifest.shards[:1]:
        table = pq.read_table(vectors / shard.file, columns=["weights"])
        column = table.column("weights")
        lengths.append(np.array([len(x) for x in column.to_pylist()]))
        weights.append(column.combine_chunks().flatten().to_numpy())
    lengths, weights = np.concatenate(lengths), np.concatenate(weights)
    query_weights = np.array([w for _, v in queries for w in v.values()])
    return {"documents": manifest.docs, "terms_per_doc": _summary(lengths), "impacts": _summary(weights),
            "query_terms": _summary(np.array([len(v) for _, v in queries])), "query_impacts": _summary(query_weights)}


def _summary(x: np.ndarray) -> dict:
    return {"mean": round(float(x.mean()), 1), "median": float(np.median(x)), "p5": float(np.percentile(x, 5)),
            "p95": float(np.percentile(x, 95)), "max": float(x.max())}


# --- real vectors and queries -----------------------------------------------------------------------------------

def read_query_vectors(path: Path, vectors: Path) -> Queries:
    """Query vectors from JSONL ({"id", "vector"}, as `search --query-vectors` reads them), or queries
    `qid<TAB>text` encoded with the vectors' model, as `search` encodes them."""
    from lsr_index.search import encode_queries, quantized_vectors, query_encoder
    from lsr_index.vectors.quantize import Quantization

    manifest = Manifest.load(vectors)
    if path.name.endswith((".jsonl", ".jsonl.gz")):
        from lsr_index.inputs.topics import read_query_vectors as read

        return quantized_vectors(read(path), Quantization(scale=manifest.quantization.scale))
    from lsr_index.inputs.topics import read_queries

    encoder, quantization = query_encoder(manifest, vectors, None, "cpu", "auto")
    return encode_queries(encoder, quantization, read_queries(path), manifest.encoder.query_max_length)


def sample_fit(work: Path) -> tuple[Path, Path]:
    """data/sample encoded with splade-tiny: the vectors and the queries file to fit when no --vectors is given."""
    from lsr_index.encode.job import EncodeJob, EncodeOptions
    from lsr_index.encode.run import encode_corpus

    out = work / "sample-vectors"
    if not (out / "manifest.json").exists():
        encode_corpus(EncodeJob(inputs=(str(ROOT / "data/sample/corpus.jsonl"),), model="splade-tiny",
                                options=EncodeOptions(progress=False)), out)
    return out, ROOT / "data/sample/queries.tsv"


# --- measuring --------------------------------------------------------------------------------------------------

def timed(search, queries: Queries, rounds: int) -> tuple[dict, float, float]:
    """The run, and the best wall and CPU seconds over `rounds` (after a warm-up of a few queries)."""
    import resource

    def cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    search(queries[:16])
    best_wall = best_cpu = float("inf")
    run = {}
    for _ in range(rounds):
        w0, c0 = time.perf_counter(), cpu()
        run = search(queries)
        best_wall, best_cpu = min(best_wall, time.perf_counter() - w0), min(best_cpu, cpu() - c0)
    return run, best_wall, best_cpu


def recall(run: dict, exact: dict, k: int) -> float:
    """Share of the exact top k found; a document whose exact score ties the k-th counts as found."""
    found = total = 0
    for qid, hits in exact.items():
        if not hits:
            continue
        want = min(k, len(hits))
        cut = round(hits[want - 1][1])  # Lucene's tied scores are lowered by a few float32 steps: round them back
        found += min(want, sum(1 for _, score in run.get(qid, [])[:k] if score >= cut))
        total += want
    return found / max(total, 1)


def ndcg(run: dict, qrels: dict | None) -> float | None:
    if qrels is None:
        return None
    from lsr_index.evaluate import evaluate

    return round(evaluate(run, qrels, ("nDCG@10",))["nDCG@10"], 4)


def resident() -> int:
    """This process's resident memory now (bytes)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# --- Lucene: hits taken from the JVM one field at a time, or in one piece ----------------------------------------

def per_hit_search(searcher, queries: Queries, hits: int) -> dict:
    """ImpactSearcher.search as it was: the same batches and Java search, each hit's docid and score read from its
    ScoredDoc through JNI (the reference the bulk transfer is measured and checked against)."""
    ranked = {}
    for start in range(0, len(queries), 32):
        chunk = queries[start:start + 32]
        jqueries, jqids = searcher._list(), searcher._list()
        for qid, vector in chunk:
            jquery = searcher._hashmap()
            for term, weight in vector.items():
                jquery.put(term, searcher._int(int(weight)))
            jqueries.add(jquery)
            jqids.add(qid)
        results = searcher._searcher.batch_search(jqueries, jqids, int(hits), 1)
        for entry in results.entrySet().toArray():
            ranked[entry.getKey()] = [(h.docid, float(h.score)) for h in entry.getValue()]
    return {qid: ranked.get(qid, []) for qid, _ in queries}


def lucene_hits_ab(vectors: Path, queries: Queries, work: Path, rounds: int = 3) -> dict:
    """Queries/s of both ways on one Lucene index, alternated, best of `rounds`; and whether the run files they
    write are the same bytes."""
    from lsr_index.engines.lucene.searcher import ImpactSearcher
    from lsr_index.runs import write_run

    index = work / "ab-lucene"
    shutil.rmtree(index, ignore_errors=True)
    build_lucene(vectors, index, threads=available_cores(), heap="3g", progress=False)
    searcher = ImpactSearcher(index)
    result = {"queries": len(queries)}
    try:
        for hits in (1000, 10):
            ways = {"per_hit": lambda q, h=hits: per_hit_search(searcher, q, h),
                    "bulk": lambda q, h=hits: searcher.search(q, hits=h, threads=1)}
            best, runs = dict.fromkeys(ways, float("inf")), {}
            for way in ways.values():
                way(queries[:32])
            for _ in range(rounds):
                for name, way in ways.items():
                    t0 = time.perf_counter()
                    runs[name] = way(queries)
                    best[name] = min(best[name], time.perf_counter() - t0)
            files = {}
            for name, run in runs.items():
                files[name] = work / f"ab-{name}.trec"
                write_run(files[name], run)
            result[f"hits_{hits}"] = {
                **{f"{name}_qps": round(len(queries) / best[name], 2) for name in ways},
                "speedup": round(best["per_hit"] / best["bulk"], 2),
                "identical_run_files": files["per_hit"].read_bytes() == files["bulk"].read_bytes()}
            print(json.dumps({"lucene_hits": result}), flush=True)
    finally:
        searcher.close()
        shutil.rmtree(index, ignore_errors=True)
    return result


# --- one dataset ------------------------------------------------------------------------------------------------

def bench_dataset(name: str, vectors: Path, queries: Queries, qrels: dict | None, work: Path, args,
                  builds: list[SeismicBuild], searches: list[SeismicSearch], rows: list[dict]) -> None:
    from lsr_index.engines.lucene.searcher import ImpactSearcher

    manifest = Manifest.load(vectors)
    big = manifest.docs >= 100_000
    rounds = 1 if big else 3  # Lucene's: a round of a large set takes minutes; Seismic's take seconds, so 3 always
    base = {"dataset": name, "documents": manifest.docs, "queries": len(queries), "k": args.k}

    def emit(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)

    lucene_dir = work / f"{name}-lucene"
    shutil.rmtree(lucene_dir, ignore_errors=True)
    with ChildrenMemory() as memory:
        t0 = time.perf_counter()
        build_lucene(vectors, lucene_dir, threads=available_cores(), heap="3g", progress=False)
        seconds = time.perf_counter() - t0
    lucene = {"engine": "lucene", "setting": "exact (direct builder)", "build_seconds": round(seconds, 2),
              "index_bytes": tree_bytes(lucene_dir), "build_memory_bytes": memory.peak}
    before = resident()
    searcher = ImpactSearcher(lucene_dir)
    try:
        exact, wall, cpu = timed(lambda q: searcher.search(q, hits=args.k, threads=1), queries, rounds)
        lucene["search_memory_bytes"] = resident() - before  # the JVM, the first time, and what it maps
        emit({**base, **lucene, "hits": args.k, "recall": 1.0, "qps": round(len(queries) / wall, 2),
              "qps_cpu": round(len(queries) / cpu, 2), "ndcg@10": ndcg(exact, qrels)})
        if not big:  # a full run (1,000 hits), as `lsr-index search` writes it
            _, wall, cpu = timed(lambda q: searcher.search(q, hits=1000, threads=1), queries, rounds)
            emit({**base, **lucene, "hits": 1000, "recall": None, "qps": round(len(queries) / wall, 2),
                  "qps_cpu": round(len(queries) / cpu, 2), "ndcg@10": None})
    finally:
        searcher.close()
    shutil.rmtree(lucene_dir, ignore_errors=True)
    lucene_qps, lucene_qps_cpu = next((r["qps"], r["qps_cpu"]) for r in rows
                                      if r["dataset"] == name and r["engine"] == "lucene")

    for b, options in enumerate(builds):
        index = work / f"{name}-seismic-{b}"
        shutil.rmtree(index, ignore_errors=True)
        with ChildrenMemory() as memory:  # the build as `lsr-index build --engine seismic` runs it
            t0 = time.perf_counter()
            record = build_seismic(vectors, index, options=options, progress=False)
            seconds = time.perf_counter() - t0
        info = record.settings
        built = {"engine": "seismic", "build": _short(options, SeismicBuild()), "build_seconds": round(seconds, 2),
                 "index_bytes": tree_bytes(index), "build_memory_bytes": max(memory.peak,
                                                                             info["peak_memory_bytes"])}
        print(json.dumps({"dataset": name, **built, "seismic_build": info}), flush=True)
        before = resident()
        searcher = Searcher(index)  # loaded once: each setting below is the same index searched otherwise
        built["search_memory_bytes"] = resident() - before
        try:
            for options_search in searches:
                searcher.options = options_search
                run, wall, cpu = timed(lambda q, s=searcher: s.search(q, hits=args.k, threads=1), queries, 3)
                row = {**base, **built, "setting": _short(options_search, SeismicSearch()), "hits": args.k,
                       "recall": round(recall(run, exact, args.k), 4), "qps": round(len(queries) / wall, 2),
                       "qps_cpu": round(len(queries) / cpu, 2), "ndcg@10": ndcg(run, qrels),
                       "default": options == SeismicBuild() and options_search == SeismicSearch()}
                row["speedup"] = round(row["qps"] / lucene_qps, 1)
                row["speedup_cpu"] = round(row["qps_cpu"] / lucene_qps_cpu, 1)
                emit(row)
                if row["default"] and not big:
                    _, wall, cpu = timed(lambda q, s=searcher: s.search(q, hits=1000, threads=1), queries, rounds)
                    emit({**row, "hits": 1000, "recall": None, "ndcg@10": None,
                          "qps": round(len(queries) / wall, 2), "qps_cpu": round(len(queries) / cpu, 2),
                          "speedup": None, "speedup_cpu": None})
        finally:
            searcher.close()
        shutil.rmtree(index, ignore_errors=True)


def _short(options, default) -> str:
    """The options that differ from the defaults ('default' when none does)."""
    changed = {k: v for k, v in options.to_dict().items() if v != default.to_dict()[k]}
    return " ".join(f"{k}={v}" for k, v in changed.items()) or "default"


# --- the whole run ----------------------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vectors", type=Path, help="real vectors (an encode output), e.g. SciFact's")
    parser.add_argument("--queries", type=Path, help="its queries: JSONL {id, vector} or qid<TAB>text")
    parser.add_argument("--qrels", type=Path, help="its judgments (TREC qrels): nDCG@10")
    parser.add_argument("--fit", type=Path, help="vectors the synthetic set is fitted to (default: --vectors)")
    parser.add_argument("--docs", type=int, default=1_000_000, help="synthetic documents (0: none)")
    parser.add_argument("--synthetic-queries", type=int, default=500, help="synthetic queries")
    parser.add_argument("--k", type=int, default=10, help="hits per query for recall@k and queries/s")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 20k synthetic documents, a small sweep")
    parser.add_argument("--builds", help="Seismic build settings to compare, ';'-separated, each 'default' or "
                        "'name=value,...' (default: the defaults and two variants of n_postings; on the synthetic "
                        "set, whose builds take long, the defaults alone)")
    parser.add_argument("--cuts", help="query_cut values to sweep, comma-separated")
    parser.add_argument("--factors", help="heap_factor values to sweep, comma-separated")
    parser.add_argument("--lucene-hits", action="store_true", help="also time Lucene's hits read per hit against "
                        "in one piece, on the real set (1,000 and 10 hits)")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "lsr-bench-search")
    parser.add_argument("--tag", default=f"{available_cores()}core")
    args = parser.parse_args()
    if args.quick:
        args.docs, args.synthetic_queries = min(args.docs, 20_000), min(args.synthetic_queries, 100)
    if bool(args.vectors) != bool(args.queries):
        parser.error("--vectors and --queries go together")
    args.work.mkdir(parents=True, exist_ok=True)
    prov = provenance()

    if args.builds:
        builds = [SeismicBuild.from_dict({} if spec.strip() == "default" else
                                         {k: json.loads(v) for k, v in (kv.split("=") for kv in spec.split(","))})
                  for spec in args.builds.split(";")]
    else:
        builds = [SeismicBuild()] if args.quick else [SeismicBuild(), SeismicBuild(n_postings=300),
                                                      SeismicBuild(n_postings=3000)]
    synthetic_builds = builds if args.builds else builds[:1]
    cuts = [int(c) for c in args.cuts.split(",")] if args.cuts else \
        (3, 5, 10, 20) if args.quick else (3, 5, 8, 10, 15, 20, 30)
    factors = [float(f) for f in args.factors.split(",")] if args.factors else \
        (0.7, 0.9, 1.0) if args.quick else (0.6, 0.7, 0.8, 0.9, 1.0)
    searches = [SeismicSearch(query_cut=c, heap_factor=h) for c in cuts for h in factors]
    if SeismicSearch() not in searches:
        searches.append(SeismicSearch())

    rows: list[dict] = []
    datasets: dict = {}
    if args.vectors:
        from lsr_index.inputs.topics import read_qrels

        real = read_query_vectors(args.queries, args.vectors)
        qrels = read_qrels(args.qrels) if args.qrels else None
        datasets["real"] = {"vectors": str(args.vectors), "queries": len(real), "qrels": bool(qrels)}
        if args.lucene_hits:
            datasets["real"]["lucene_hits"] = lucene_hits_ab(args.vectors, real, args.work)
        bench_dataset("real", args.vectors, real, qrels, args.work, args, builds, searches, rows)
    if args.docs:
        fitted = args.fit or args.vectors
        query_file, query_vectors = (args.queries, args.vectors) if args.vectors else sample_fit(args.work)[::-1]
        fitted = fitted or query_vectors
        docs_fit = fit(fitted)
        queries_fit = fit_queries(read_query_vectors(query_file, query_vectors))
        generator = Generator(docs_fit, queries_fit, args.docs)
        synthetic = args.work / f"synthetic-{args.docs}"
        spec = {"docs": args.docs, "fit": str(fitted), "exponent": generator.exponent, "topics": generator.topics,
                "version": 1}
        t0 = time.perf_counter()
        if not (synthetic / "spec.json").exists() or json.loads((synthetic / "spec.json").read_text()) != spec:
            shutil.rmtree(synthetic, ignore_errors=True)
            generator.documents(synthetic, args.docs, seed=1)
            (synthetic / "spec.json").write_text(json.dumps(spec))
        queries = generator.queries(args.synthetic_queries, seed=2)
        datasets["synthetic"] = {**spec, "generate_seconds": round(time.perf_counter() - t0, 1),
                                 "fitted": {"terms_per_doc": _summary(docs_fit["lengths"]),
                                            "impacts": _summary(docs_fit["weights"]),
                                            "query_terms": _summary(queries_fit["lengths"]),
                                            "query_impacts": _summary(queries_fit["weights"])},
                                 "drawn": stats(synthetic, queries)}
        print(json.dumps({"synthetic": datasets["synthetic"]}), flush=True)
        bench_dataset("synthetic", synthetic, queries, None, args.work, args, synthetic_builds, searches, rows)

    summary = summarize(rows)
    result = {"datasets": datasets, "summary": summary, "rows": rows,
              "defaults": {"build": SeismicBuild().to_dict(), "search": SeismicSearch().to_dict()}}
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"search_{args.tag}"
    stem.with_suffix(".json").write_text(json.dumps(with_provenance(result, prov), indent=1) + "\n")
    columns = ["dataset", "engine", "build", "setting", "hits", "recall", "qps", "qps_cpu", "speedup", "speedup_cpu",
               "ndcg@10",
               "build_seconds", "index_bytes", "build_memory_bytes", "search_memory_bytes", "documents", "queries",
               "default"]
    with open(stem.with_suffix(".csv"), "w", newline="") as f:
        f.write(csv_line(prov))
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, stem.with_suffix(".png"), prov)
    print(json.dumps(summary, indent=1))
    print(f"wrote {stem.relative_to(ROOT)}.{{json,csv,png}}")


def summarize(rows: list[dict]) -> dict:
    """Per dataset: Lucene's row, Seismic's default, and the fastest Seismic settings at recall ≥ 0.97 and ≥ 0.99."""
    summary = {}
    for name in dict.fromkeys(r["dataset"] for r in rows):
        mine = [r for r in rows if r["dataset"] == name and r["hits"] == rows[0]["k"]]
        lucene = next(r for r in mine if r["engine"] == "lucene")
        seismic = [r for r in mine if r["engine"] == "seismic"]
        entry = {"lucene": lucene, "default": next((r for r in seismic if r.get("default")), None)}
        if entry["default"] and lucene.get("ndcg@10") is not None:
            entry["ndcg@10_default_minus_lucene"] = round(entry["default"]["ndcg@10"] - lucene["ndcg@10"], 4)
        for floor in (0.97, 0.99):
            good = [r for r in seismic if r["recall"] >= floor]
            entry[f"fastest_at_{floor}"] = max(good, key=lambda r: r["qps"]) if good else None
        summary[name] = entry
    return summary


def plot(rows: list[dict], path: Path, prov: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["dataset"] for r in rows))
    fig, axes = plt.subplots(1, len(names), figsize=(6.5 * len(names), 4.8), squeeze=False)
    for ax, name in zip(axes[0], names):
        mine = [r for r in rows if r["dataset"] == name and r["recall"] is not None]
        for b, build in enumerate(dict.fromkeys(r["build"] for r in mine if r["engine"] == "seismic")):
            points = sorted((r["qps"], r["recall"]) for r in mine if r.get("build") == build)
            ax.scatter(*zip(*points), s=14, color=f"C{b}", label=f"Seismic, build: {build}")
        for r in mine:
            if r.get("default"):
                ax.scatter([r["qps"]], [r["recall"]], s=90, facecolors="none", edgecolors="black",
                           label="Seismic, default settings")
            if r["engine"] == "lucene":
                ax.scatter([r["qps"]], [1.0], marker="s", s=50, color="black", label="Lucene (exact)")
        ax.axhline(0.97, color="grey", lw=0.6, ls="--")
        ax.axhline(0.99, color="grey", lw=0.6, ls=":")
        ax.set_xscale("log")
        ax.set_xlabel("queries/s, one thread")
        ax.set_ylabel(f"recall@{rows[0]['k']} against the exact run")
        ax.set_title(f"{name}: {mine[0]['documents']:,} documents, {mine[0]['queries']} queries", fontsize=9)
        ax.set_ylim(max(0.0, min(r["recall"] for r in mine) - 0.02), 1.005)
        ax.legend(fontsize=6, loc="lower left")
    fig.suptitle(f"Seismic vs Lucene ({prov['machine']['cpu']}, {prov['machine'].get('usable_cores')} cores)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata=png_metadata(prov))


if __name__ == "__main__":
    main()
