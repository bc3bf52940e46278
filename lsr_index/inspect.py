"""See inside the vectors: a document's top terms, a query's expansion, statistics over a whole corpus.

SPLADE vectors are readable (terms with integer impacts), so this reads them back from the shards as they are
stored. Corpus statistics stream over the shards once and keep only counters keyed by integer values and
terms, so memory is bounded by the vocabulary, never by the number of documents.
"""

from __future__ import annotations

import io
import json
import zlib
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lsr_index.errors import LsrIndexError, install_hint
from lsr_index.runtime.durable import atomic_write_bytes
from lsr_index.runtime.progress import bar
from lsr_index.vectors.manifest import Manifest
from lsr_index.vectors.shards import ShardError, read_shard

QUANTILES = (("p5", 0.05), ("p25", 0.25), ("median", 0.5), ("p75", 0.75), ("p95", 0.95))


def quantile(counts: Mapping[int, int], q: float) -> int:
    """The smallest value whose cumulative share reaches q (numpy's "inverted_cdf"): exact from a histogram."""
    total = sum(counts.values())
    seen = 0
    for value in sorted(counts):
        seen += counts[value]
        if seen >= q * total:
            return value
    raise ValueError("quantile of an empty histogram")


def summarize(counts: Mapping[int, int]) -> dict:
    """Count, mean, quantiles and extremes of the values a histogram {value: occurrences} holds."""
    total = sum(counts.values())
    if not total:
        return {"count": 0}
    return {"count": total, "mean": round(sum(v * n for v, n in counts.items()) / total, 3), "min": min(counts),
            **{name: quantile(counts, q) for name, q in QUANTILES}, "max": max(counts)}


def _vectors(directory: Path, manifest: Manifest, progress: bool = False) -> Iterator[tuple[str, str, dict]]:
    """(shard file, id, {term: impact}) for every document, shard by shard in document order."""
    with bar(progress, desc="read", unit=" doc", total=manifest.docs) as reading:
        for shard in sorted(manifest.shards, key=lambda s: s.start):
            path = directory / shard.file
            try:
                for doc_id, vector in read_shard(path):
                    yield shard.file, doc_id, vector
                    reading.update()
            except ShardError as exc:  # a record no reader takes (a term named twice): its place is in the message
                raise LsrIndexError(str(exc)) from None
            except (OSError, EOFError, ValueError, KeyError, zlib.error) as exc:
                raise LsrIndexError(f"{path}: cannot read the shard ({type(exc).__name__}: {exc}); it is damaged: "
                                    "rerun `lsr-index encode --overwrite`") from None


def _top(vector: Mapping[str, int], top: int) -> list[tuple[str, int]]:
    """The largest impacts first; equal impacts by term, so the listing is reproducible."""
    return sorted(vector.items(), key=lambda item: (-item[1], item[0]))[:top]


def documents(directory: Path, ids: Sequence[str], top: int, progress: bool = False) -> list[dict]:
    """Each requested document's top terms; the scan stops as soon as every id has been found."""
    manifest = Manifest.load(directory)
    wanted, found, scanned = set(ids), {}, 0
    for shard, doc_id, vector in _vectors(directory, manifest, progress):
        scanned += 1
        if doc_id in wanted and doc_id not in found:
            found[doc_id] = {"id": doc_id, "shard": shard, "terms": len(vector),
                             "impact_sum": sum(vector.values()), "top": _top(vector, top)}
            if len(found) == len(wanted):
                break
    missing = [doc_id for doc_id in ids if doc_id not in found]
    if missing:
        raise LsrIndexError(f"{directory}: no document with id {', '.join(map(repr, missing[:5]))} among its "
                            f"{scanned:,} documents")
    return [found[doc_id] for doc_id in dict.fromkeys(ids)]


def queries(index: Path, texts: Sequence[str], top: int, model: str | None, device: str) -> list[dict]:
    """Each query's vector as `search` sends it to Lucene; `in_query` marks terms of its own tokens."""
    from lsr_index.search import encode_queries, load_query_encoder

    encoder, quantization, manifest = load_query_encoder(index, model, device, "auto")
    numbered = [(str(i), text) for i, text in enumerate(texts)]
    vectors = encode_queries(encoder, quantization, numbered, manifest.encoder.query_max_length)
    out = []
    for text, (_, vector) in zip(texts, vectors):
        own = set(encoder.model.tokenizer.encode(text, add_special_tokens=False).tokens)
        out.append({"query": text, "model": manifest.query.name, "terms": len(vector),
                    "expansion_terms": sum(term not in own for term in vector),
                    "top": [(term, impact, term in own) for term, impact in _top(vector, top)]})
    return out


@dataclass
class CorpusStats:
    """Histograms gathered in one pass: memory is the number of distinct values and terms, not of documents."""

    directory: Path
    manifest: Manifest
    documents: int = 0
    nonzeros: Counter = field(default_factory=Counter)  # nonzeros per document → documents
    impacts: Counter = field(default_factory=Counter)  # impact → occurrences
    df: Counter = field(default_factory=Counter)  # term → documents that use it

    def report(self, top: int) -> dict:
        vocab_size = _vocab_size(self.manifest)
        frequent = sorted(self.df.items(), key=lambda item: (-item[1], item[0]))[:top]
        return {
            "vectors": str(self.directory), "complete": self.manifest.complete, "documents": self.documents,
            "model": self.manifest.model.name, "scale": self.manifest.quantization.scale,
            "nonzeros_per_doc": summarize(self.nonzeros), "impacts": summarize(self.impacts),
            "truncation": _truncation(self.manifest),
            "vocabulary": {"terms_used": len(self.df), "vocab_size": vocab_size,
                           "coverage": round(len(self.df) / vocab_size, 4) if vocab_size else None,
                           "top_df": [(term, n, round(n / self.documents, 4)) for term, n in frequent]},
        }


def corpus_stats(directory: Path, progress: bool = False) -> CorpusStats:
    manifest = Manifest.load(directory)
    stats = CorpusStats(directory, manifest)
    for _, _, vector in _vectors(directory, manifest, progress):
        stats.documents += 1
        stats.nonzeros[len(vector)] += 1
        stats.impacts.update(vector.values())
        stats.df.update(vector.keys())
    return stats


def _truncation(manifest: Manifest) -> dict:
    """Documents cut at doc_max_length, as the encoder recorded them shard by shard (manifest format 2)."""
    return {"doc_max_length": manifest.encoder.doc_max_length, **asdict(manifest.truncation)}


def _vocab_size(manifest: Manifest) -> int | None:
    """The model's vocabulary size from its config.json, without loading the model; None if unavailable."""
    from lsr_index.model.ref import locate

    try:
        config = json.loads((locate(manifest.model.name) / "config.json").read_text())
    except (LsrIndexError, OSError, ValueError):
        return None
    size = config.get("vocab_size")
    return size if isinstance(size, int) else None


def require_matplotlib() -> None:
    """Fail before a long scan, not after it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise LsrIndexError(f"--png needs matplotlib: pip install matplotlib, or {install_hint('bench')}") from None


def write_png(stats: CorpusStats, path: Path) -> None:
    """Histograms of nonzeros per document and of impacts, written atomically; never into an index or vectors
    directory (`--png vectors/manifest.json` once replaced the manifest it had just read)."""
    from lsr_index.runs import inside_output

    if owner := inside_output(path):
        raise LsrIndexError(f"--png {path}: that is inside {owner}; write the picture elsewhere")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    for ax, counts, what in ((left, stats.nonzeros, "nonzeros per document"), (right, stats.impacts, "impact")):
        values = sorted(counts)
        if values:
            ax.hist(values, weights=[counts[v] for v in values], bins=min(60, len(values)), color="#3b6ea8")
            median = quantile(counts, 0.5)
            ax.axvline(median, color="#c0392b", linestyle="--", label=f"median {median}")
            ax.legend()
        ax.set_xlabel(what)
        ax.set_ylabel("documents" if counts is stats.nonzeros else "occurrences")
    right.set_yscale("log")
    fig.suptitle(f"{stats.directory}: {stats.documents:,} documents, {stats.manifest.model.name}")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())


def render(report: dict) -> str:
    """The report as text for a terminal."""
    lines = []
    for doc in report.get("documents", []):
        lines.append(f"document {doc['id']} ({doc['shard']}): {doc['terms']} terms, impacts sum to "
                     f"{doc['impact_sum']:,}")
        lines += [f"  {impact:>6}  {term}" for term, impact in doc["top"]]
    for query in report.get("queries", []):
        lines.append(f"query {query['query']!r} ({query['model']}): {query['terms']} terms, "
                     f"{query['expansion_terms']} not in its own tokens (+)")
        lines += [f"  {impact:>6}  {term}{'' if own else '  +'}" for term, impact, own in query["top"]]
    corpus = report.get("corpus")
    if corpus:
        lines += _render_corpus(corpus)
    return "\n".join(lines)


def _render_corpus(c: dict) -> list[str]:
    describe = lambda s: (f"mean {s['mean']:,}, median {s['median']:,}, p5 {s['p5']:,}, p95 {s['p95']:,}, "
                          f"max {s['max']:,}") if s["count"] else "none"
    vocab = c["vocabulary"]
    size = f"{vocab['vocab_size']:,} ({vocab['coverage']:.1%})" if vocab["vocab_size"] else "unknown"
    lines = [f"{c['vectors']}: {c['documents']:,} documents{'' if c['complete'] else ' (encoding incomplete)'}, "
             f"model {c['model']}, impacts = round(weight × {c['scale']:g})",
             f"  nonzeros per document: {describe(c['nonzeros_per_doc'])}",
             f"  impacts ({c['impacts']['count']:,}): {describe(c['impacts'])}",
             f"  truncated at doc_max_length: {_describe_truncation(c['truncation'])}",
             f"  vocabulary: {vocab['terms_used']:,} distinct terms used of {size}",
             "  highest document frequency: " + ", ".join(f"{t} {share:.0%}" for t, _, share in vocab["top_df"])]
    return lines


def _describe_truncation(t: dict) -> str:
    line = f"{t['documents']:,} documents ({t['share']:.1%}) at {t['doc_max_length']} tokens"
    if t["documents"]:
        line += f"; the longest had {t['longest_tokens']:,} tokens"
    if t["cut_at_characters"]:
        line += f"; {t['cut_at_characters']:,} cut at the reader's character bound first"
    return line
