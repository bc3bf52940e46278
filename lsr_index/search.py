"""The search stage: encode queries exactly as the index's documents were encoded, search, write a run."""

from __future__ import annotations

import gzip
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from lsr_index.encode.job import CHARS_PER_TOKEN
from lsr_index.engines.index import INDEX_MANIFEST, IndexGeneration, index_manifest
from lsr_index.engines.lucene.searcher import ImpactSearcher
from lsr_index.errors import InputError, LsrIndexError
from lsr_index.inputs.ids import check_id
from lsr_index.inputs.topics import text_lines
from lsr_index.runtime.durable import atomic_write_bytes, real_path
from lsr_index.runtime.progress import bar, note
from lsr_index.vectors.manifest import Manifest, written_by_encode
from lsr_index.vectors.quantize import Quantization, quantize

Run = dict[str, list[tuple[str, float]]]
RUN_FORMATS = ("trec", "msmarco")


def load_query_encoder(index: Path, model: str | None, device: str, backend: str):
    """The encoder and quantization recorded in the manifest of the index published now."""
    _, manifest = index_manifest(index)
    return (*query_encoder(manifest, index, model, device, backend), manifest)


def query_encoder(manifest: Manifest, index: Path, model: str | None, device: str, backend: str):
    """The query encoder and quantization that `manifest` records (a token-weight table loads no transformer); a
    model other than the recorded one is refused."""
    import torch

    from lsr_index.model.query import encoder_for, load_query_model

    recorded = manifest.query
    name = model or recorded["name"]
    loaded = load_query_model(name, device=device, dtype=torch.float32)
    if loaded.sha256 != recorded["sha256"]:
        raise LsrIndexError(f"query model {name!r} (sha256 {loaded.sha256[:12]}…) is not the one that encoded "
                            f"{index}'s queries when it was made (sha256 {recorded['sha256'][:12]}…)")
    return encoder_for(loaded, backend), Quantization(scale=manifest.quantization["scale"])


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


def search(index: Path, queries: Sequence[tuple[str, str]], hits: int = 1000, threads: int = 1,
           model: str | None = None, device: str = "cpu", backend: str = "auto", progress: bool = False,
           notice: Callable[[str], object] = lambda text: None) -> Run:
    """Search one generation of `index` from start to end: its record and its Lucene files are read through one
    open, share-locked directory (see IndexGeneration), so a `build --overwrite` meanwhile changes nothing.
    Lucene is opened and verified before the model is loaded: a damaged index fails at once. `notice` gets a
    line when queries were cut at the index's query length."""
    note(f"opening {index}…", progress)
    with IndexGeneration(index) as generation:
        _, manifest = generation.record()
        searcher = ImpactSearcher(generation)
        try:
            note(f"loading the query model {model or manifest.query['name']}…", progress)
            encoder, quantization = query_encoder(manifest, index, model, device, backend)
            max_length = manifest.encoder["query_max_length"]
            queries, capped = capped_queries(queries, max_length)
            if cut := truncated_queries(encoder, queries, max_length, capped):
                notice(cut)
            vectors = encode_queries(encoder, quantization, queries, max_length, progress=progress)
            with bar(progress, total=len(vectors), desc="search", unit=" q") as searching:
                return searcher.search(vectors, hits=hits, threads=threads, progress=searching.update)
        finally:
            searcher.close()


def write_run(path: Path, run: Run, fmt: str = "trec", tag: str = "lsr-index") -> None:
    """Write a run atomically. An id that the format cannot hold (whitespace, a control character: an index built
    before encode refused such ids) is refused: written, it would shift columns or merge with another id."""
    if fmt not in RUN_FORMATS:
        raise LsrIndexError(f"unknown run format {fmt!r}: choose one of {', '.join(RUN_FORMATS)}")
    for qid, ranked in run.items():
        for kind, value in (("query", qid), *(("document", doc) for doc, _ in ranked)):
            problem = check_id(value)
            if problem:
                raise LsrIndexError(f"{path}: not written: {kind} {problem}, which a {fmt} run "
                                    "cannot hold (the index was built by an older lsr-index: re-encode the corpus "
                                    "and rebuild it)")
    if fmt == "trec":
        lines = (f"{qid} Q0 {doc} {rank} {score:.4f} {tag}\n"
                 for qid, ranked in run.items() for rank, (doc, score) in enumerate(ranked, 1))
    else:
        lines = (f"{qid}\t{doc}\t{rank}\n" for qid, ranked in run.items() for rank, (doc, _) in enumerate(ranked, 1))
    data = "".join(lines).encode()
    atomic_write_bytes(path, gzip.compress(data, mtime=0) if path.name.endswith(".gz") else data)


def check_run_path(path: Path, inputs: list[Path]) -> None:
    """Refuse, before a search, a run path that names one of its inputs (the run would replace the queries or the
    judgments), lies in an index or vectors directory (see `inside_output`) or in a directory that cannot be
    written (found only after the whole search)."""
    real = real_path(path)
    for given in inputs:
        if real == real_path(given):
            raise LsrIndexError(f"--run {path}: that is an input of this search ({given}); write the run elsewhere")
    if owner := inside_output(path):
        raise LsrIndexError(f"--run {path}: that is inside {owner}; write the run elsewhere")
    parent = real.parent
    existing = next(p for p in (parent, *parent.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise LsrIndexError(f"--run {path}: cannot write in {existing}")


def inside_output(path: Path) -> str | None:
    """The index or vectors directory that `path` lies in (directly, or in its shards/), or None. A file written
    there replaces one of its files (`--run index/lsr-index.json` once replaced the record of the index just
    searched) or is deleted with it by the next `--overwrite`."""
    real = real_path(path)
    for directory in (real.parent, *([real.parent.parent] if real.parent.name == "shards" else [])):
        if (directory / INDEX_MANIFEST).is_file():
            return f"the index {directory}"
        if written_by_encode(directory):
            return f"the vectors directory {directory}"
    return None


def read_run(path: Path) -> Run:
    """A run file as `search` writes it: TREC (qid Q0 docid rank score tag) or MS MARCO (qid docid rank).

    Lines and columns are split as the qrels reader splits them; a document listed twice for one query is
    refused (the evaluator would keep only one of them, silently).
    """
    run: Run = {}
    seen: dict[tuple[str, str], int] = {}
    for number, line in text_lines(path):
        cols = line.split()
        if len(cols) not in (6, 3):
            raise InputError(path, number, f"{len(cols)} columns, expected 'qid Q0 docid rank score tag' (TREC) "
                             "or 'qid docid rank' (MS MARCO)")
        try:  # MS MARCO runs carry ranks only: rank r scores -r, which keeps the order
            score = float(cols[4]) if len(cols) == 6 else -float(cols[2])
        except ValueError:
            score = math.nan
        if not math.isfinite(score):
            raise InputError(path, number, f"{'score' if len(cols) == 6 else 'rank'} is not a finite number")
        qid, doc = cols[0], cols[2] if len(cols) == 6 else cols[1]
        if (qid, doc) in seen:
            raise InputError(path, number, f"document {doc!r} listed again for query {qid!r} (first on line "
                             f"{seen[qid, doc]})")
        seen[qid, doc] = number
        run.setdefault(qid, []).append((doc, score))
    return run
