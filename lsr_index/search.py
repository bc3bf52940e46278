"""The search stage: encode queries exactly as the index's documents were encoded (or take vectors encoded
elsewhere, quantized by the index's rules), search with the engine the index records, hand back a run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from lsr_index.engines.index import IndexGeneration, IndexRecord, index_record
from lsr_index.errors import LsrIndexError
from lsr_index.runs import Run
from lsr_index.runtime.progress import bar, note
from lsr_index.settings import CHARS_PER_TOKEN
from lsr_index.vectors.manifest import Manifest
from lsr_index.vectors.quantize import INT32_MAX, Quantization, quantize

if TYPE_CHECKING:
    from lsr_index.engines.seismic.options import SeismicSearch

QueryVectors = Sequence[tuple[str, dict[str, int | float]]]


def load_query_encoder(index: Path, model: str | None, device: str, backend: str):
    """The encoder and quantization recorded in the manifest of the index published now."""
    manifest = index_record(index).vectors_manifest
    return (*query_encoder(manifest, index, model, device, backend), manifest)


def query_encoder(manifest: Manifest, index: Path, model: str | None, device: str, backend: str):
    """The query encoder and quantization that `manifest` records (a token-weight table loads no transformer); a
    model other than the recorded one is refused."""
    import torch

    from lsr_index.model.query import encoder_for, load_query_model
    from lsr_index.model.ref import ModelRef

    recorded = manifest.query
    name = model or recorded.name
    ref = ModelRef.resolve(name)
    if ref.sha256 != recorded.sha256:
        raise LsrIndexError(f"query model {name!r} (sha256 {ref.sha256[:12]}…) is not the one that encoded "
                            f"{index}'s queries when it was made (sha256 {recorded.sha256[:12]}…)")
    loaded = load_query_model(ref, device=device, dtype=torch.float32)
    return encoder_for(loaded, backend), Quantization(scale=manifest.quantization.scale)


def encode_queries(encoder, quantization: Quantization, queries: Sequence[tuple[str, str]], max_length: int,
                   batch: int = 256, progress: bool = False) -> list[tuple[str, dict[str, int]]]:
    vocab = encoder.model.vocab
    out = []
    with bar(progress, total=len(queries), desc="encode queries", unit=" q") as encoding:
        for start in range(0, len(queries), batch):
            chunk = queries[start:start + batch]
            vectors = quantize(encoder.encode([text for _, text in chunk], max_length), quantization)
            for i, (qid, _) in enumerate(chunk):
                terms, weights = vectors.row(i)
                out.append((qid, {vocab[t]: int(w) for t, w in zip(terms.tolist(), weights.tolist())}))
            encoding.update(len(chunk))
    return out


def capped_queries(queries: Sequence[tuple[str, str]], max_length: int) -> tuple[list[tuple[str, str]], int]:
    """The queries cut to `max_length` × CHARS_PER_TOKEN characters before tokenizing, as `encode` cuts documents,
    and how many were: a query tokenized whole (a pasted document) took `search` to 1.61 GB for a 5.5 MB line
    (0.76 GB cut), though only `max_length` tokens are kept."""
    limit = max_length * CHARS_PER_TOKEN
    capped = sum(len(text) > limit for _, text in queries)
    return [(qid, text[:limit]) for qid, text in queries] if capped else list(queries), capped


def truncated_queries(encoder, queries: Sequence[tuple[str, str]], max_length: int, capped: int = 0) -> str | None:
    """A line on the queries cut at `max_length` tokens (the index's setting), or None when none was; `capped` of
    them were cut at the character bound first (capped_queries)."""
    if not queries:
        return None
    lengths = encoder.token_counts([text for _, text in queries], max_length)
    cut = int((lengths > max_length).sum())
    if not cut:
        return None
    return (f"{cut:,} of {len(queries):,} queries ({cut / len(queries):.1%}) were cut at the index's "
            f"query_max_length {max_length}; the longest had {int(lengths.max()):,} tokens"
            + (f"; {capped:,} cut at the character bound ({max_length * CHARS_PER_TOKEN:,}) first" if capped else ""))


def open_searcher(generation: IndexGeneration, record: IndexRecord, seismic: SeismicSearch | None = None):
    """The searcher of the engine the index's record names, over that generation's files."""
    if record.engine == "seismic":
        from lsr_index.engines.seismic.searcher import Searcher

        return Searcher(generation, seismic)
    if seismic is not None:
        raise LsrIndexError(f"{generation.index} is a Lucene index, which searches exactly: the Seismic options "
                            "(--query-cut, --heap-factor) do not apply to it")
    from lsr_index.engines.lucene.searcher import ImpactSearcher

    return ImpactSearcher(generation)


def quantized_vectors(vectors: QueryVectors, quantization: Quantization,
                      notice: Callable[[str], object] = lambda text: None) -> list[tuple[str, dict[str, int]]]:
    """Query vectors given as data, in the index's integer impacts. Weights all written as integers are impacts,
    as `encode` writes them, taken as they are; any weight written as a fraction makes the whole set model weights,
    quantized as the index's queries are (impact = round(weight × scale), in float32 like the encoder; those
    under 1 dropped). Either way the ranking of a query does not depend on the reading: impacts and weights differ
    by the one factor `scale`, up to rounding. Zero impacts are dropped; one past 2³¹−1 (Lucene's bound) is refused."""
    fractional = any(isinstance(w, float) for _, vector in vectors for w in vector.values())
    out = []
    for qid, vector in vectors:
        terms = list(vector)
        weights = np.array([vector[t] for t in terms], dtype=np.float64)
        if fractional:
            weights = np.rint(weights.astype(np.float32) * np.float32(quantization.scale)).astype(np.float64)
        if len(weights) and weights.max() > INT32_MAX:
            at = int(weights.argmax())
            raise LsrIndexError(f"query {qid!r}: the impact {weights[at]:.0f} of term {terms[at]!r} is past "
                                f"{INT32_MAX:,}, the largest a query impact can be")
        out.append((qid, {t: int(w) for t, w in zip(terms, weights) if w >= 1}))
    if fractional:
        notice(f"the query vectors hold fractional weights: quantized as the index's queries are (impact = "
               f"round(weight × {quantization.scale:g}))")
    return out


def search(index: Path, queries: Sequence[tuple[str, str]] | None = None, hits: int = 1000, threads: int = 1,
           model: str | None = None, device: str = "cpu", backend: str = "auto", progress: bool = False,
           notice: Callable[[str], object] = lambda text: None, *, vectors: QueryVectors | None = None,
           engine: str | None = None, seismic: SeismicSearch | None = None) -> Run:
    """Search one generation of `index` from start to end: its record and its engine's files are read through one
    open, share-locked directory (see IndexGeneration), so a `build --overwrite` meanwhile changes nothing.
    The engine is the one the record names (`engine`, when given, must be it); `seismic` sets a Seismic index's
    accuracy knobs. The index is opened and verified before the model is loaded: a damaged index fails at once.
    `queries` are texts, encoded by the model the index records; `vectors` instead are queries encoded elsewhere
    (see quantized_vectors). `notice` gets a line when queries were cut at the index's query length."""
    if (queries is None) == (vectors is None):
        raise LsrIndexError("search takes queries (texts) or query vectors, one of the two")
    if vectors is not None and model is not None:
        raise LsrIndexError("--model names the model that encodes query texts; query vectors are encoded already")
    note(f"opening {index}…", progress)
    with IndexGeneration(index) as generation:
        record = generation.record()
        if engine is not None and engine != record.engine:
            raise LsrIndexError(f"{index} is a {record.engine} index (its record says so), not a {engine} one: "
                                f"search it with --engine {record.engine}, or without --engine")
        manifest = record.vectors_manifest
        searcher = open_searcher(generation, record, seismic)
        try:
            if vectors is not None:
                encoded = quantized_vectors(vectors, Quantization(scale=manifest.quantization.scale), notice)
            else:
                note(f"loading the query model {model or manifest.query.name}…", progress)
                encoder, quantization = query_encoder(manifest, index, model, device, backend)
                max_length = manifest.encoder.query_max_length
                queries, capped = capped_queries(queries, max_length)
                if cut := truncated_queries(encoder, queries, max_length, capped):
                    notice(cut)
                encoded = encode_queries(encoder, quantization, queries, max_length, progress=progress)
            with bar(progress, total=len(encoded), desc="search", unit=" q") as searching:
                return searcher.search(encoded, hits=hits, threads=threads, progress=searching.update)
        finally:
            searcher.close()
