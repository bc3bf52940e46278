"""The encode stage: corpus reader → encoder → quantizer → shard writer, resumable shard by shard.

Documents are numbered in stream order. Shard k holds documents [k·shard_docs, (k+1)·shard_docs), so a
rerun that finds shards 0..k-1 in the manifest (with the same input, model and settings) skips that
many documents and continues: the result is the same as an uninterrupted run.
"""

from __future__ import annotations

import queue
import resource
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np
import orjson
import pyarrow as pa

from .corpus import CorpusReader
from .encoder import SpladeEncoder
from .errors import LsrIndexError
from .manifest import Manifest, atomic_write_bytes, exclusive_lock
from .quantize import Quantization, SparseVectors, quantize
from .writers import ShardWriter, check_vocab

T = TypeVar("T")
SHARDS = "shards"
SKIPPED_REPORT = "skipped.jsonl"  # JSON lines: ids may hold tabs or quotes


@dataclass(frozen=True)
class EncodeOptions:
    doc_max_length: int = 256
    query_max_length: int = 64
    max_tokens: int = 16384  # padded tokens per forward pass: bounds activation memory, not corpus size
    shard_docs: int = 100_000
    output_format: str = "jsonl.gz"
    quantization: Quantization = field(default_factory=Quantization)
    backend: str = "auto"
    overwrite: bool = False
    progress: bool = True


def prefetch(items: Iterable[T], depth: int = 2) -> Iterator[T]:
    """Run an iterator in a background thread so reading/tokenizing overlaps the model."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    done = object()

    def work() -> None:
        try:
            for item in items:
                q.put(item)
        except BaseException as exc:  # re-raised in the consumer, with its own traceback
            q.put(exc)
        q.put(done)

    threading.Thread(target=work, daemon=True).start()
    while (item := q.get()) is not done:
        if isinstance(item, BaseException):
            raise item
        yield item


def _describe_input(reader: CorpusReader) -> dict:
    return {"files": [{"name": str(p), "bytes": p.stat().st_size} for p in reader.files],
            "fields": {"id": reader.fields.id, "text": list(reader.fields.text or []) or None},
            "on_error": reader.on_error}


def _open_output(out: Path, fresh: Manifest, overwrite: bool) -> Manifest:
    """Start, resume or refuse, depending on what the directory already holds."""
    if not (out / "manifest.json").exists():
        if any(p.name != ".lock" for p in out.iterdir()) and not overwrite:
            raise LsrIndexError(f"{out} exists and is not an lsr-index output; choose another directory "
                                "or pass --overwrite")
        return fresh
    old = Manifest.load(out)
    if overwrite:
        for shard in old.shards:
            (out / shard.file).unlink(missing_ok=True)
        return fresh
    if old.complete:
        raise LsrIndexError(f"{out} already holds a complete encoding ({old.docs} documents); "
                            "pass --overwrite to replace it")
    if old.fingerprint() != fresh.fingerprint():
        raise LsrIndexError(f"{out} holds a partial encoding made with other inputs or settings; "
                            "pass --overwrite to start over")
    return old


def _slices(batches: Iterable[pa.RecordBatch], skip: int) -> Iterator[pa.RecordBatch]:
    """Drop the first `skip` documents of the stream (already encoded by an earlier run)."""
    for batch in batches:
        if skip >= batch.num_rows:
            skip -= batch.num_rows
            continue
        yield batch.slice(skip)
        skip = 0


def encode_corpus(reader: CorpusReader, encoder: SpladeEncoder, out: Path, options: EncodeOptions,
                  on_progress: Callable[[int, int], None] | None = None) -> Manifest:
    model = encoder.model
    check_vocab(model.vocab)
    vocab = np.array(model.vocab, dtype=object)
    fresh = Manifest(
        model={"name": model.name, "sha256": model.sha256, "vocab_size": model.vocab_size},
        encoder={"doc_max_length": options.doc_max_length, "query_max_length": options.query_max_length,
                 "dtype": str(model.weight.dtype).removeprefix("torch."), "backend": options.backend},
        quantization=options.quantization.to_dict(), input=_describe_input(reader),
        output_format=options.output_format)
    out.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(out):
        manifest = _open_output(out, fresh, options.overwrite)
        (out / SHARDS).mkdir(exist_ok=True)
        for stale in (out / SHARDS).glob(".*.tmp"):  # partial shards of a killed run
            stale.unlink()
        manifest.complete = False
        manifest.save(out)
        return _run(reader, encoder, out, options, manifest, vocab, on_progress)


def _run(reader: CorpusReader, encoder: SpladeEncoder, out: Path, options: EncodeOptions,
         manifest: Manifest, vocab: np.ndarray, on_progress: Callable[[int, int], None] | None) -> Manifest:
    from tqdm import tqdm

    start_doc = manifest.docs
    position = start_doc
    writer: ShardWriter | None = None
    t0 = time.perf_counter()
    tokens0 = encoder.n_tokens
    bar = tqdm(desc="encode", unit=" doc", initial=start_doc, dynamic_ncols=True,
               disable=None if options.progress else True)

    def tokenized() -> Iterator[tuple[list[str], list[list[int]]]]:
        for batch in _slices(reader, start_doc):
            texts = batch.column("text").to_pylist()
            yield batch.column("id").to_pylist(), encoder.tokenize(texts, options.doc_max_length)

    try:
        for ids, token_ids in prefetch(tokenized()):
            parts = []
            for pos, weights in encoder.encode_ids(token_ids):
                parts.append((pos, quantize(weights, options.quantization)))
                bar.update(len(pos))
                elapsed = max(time.perf_counter() - t0, 1e-9)
                bar.set_postfix_str(f"{(encoder.n_tokens - tokens0) / elapsed:,.0f} tok/s", refresh=False)
            vectors = SparseVectors.stack(parts, len(ids))
            done = 0
            while done < len(ids):
                if writer is None:
                    index = position // options.shard_docs
                    writer = ShardWriter(out / SHARDS / f"part-{index:05d}.{options.output_format}",
                                         options.output_format, vocab)
                take = min(len(ids) - done, options.shard_docs - writer.docs)
                rows = slice(done, done + take)
                lo, hi = vectors.indptr[done], vectors.indptr[done + take]
                writer.add(ids[rows], SparseVectors(vectors.indptr[done:done + take + 1] - lo,
                                                    vectors.terms[lo:hi], vectors.weights[lo:hi]))
                done += take
                position += take
                if writer.docs == options.shard_docs:
                    manifest.shards.append(writer.finish(position - writer.docs, out))
                    manifest.save(out)
                    writer = None
            if on_progress:
                on_progress(position, manifest.docs)
        if writer is not None and writer.docs:
            manifest.shards.append(writer.finish(position - writer.docs, out))
            writer = None
    finally:
        bar.close()
        if writer is not None:
            writer.abort()
    if manifest.docs == 0:
        raise LsrIndexError("the corpus yielded no documents to encode")
    atomic_write_bytes(out / SKIPPED_REPORT, b"".join(
        orjson.dumps({"file": s.path, "line": s.where, "id": s.doc_id, "reason": s.reason}) + b"\n"
        for s in reader.skipped))
    elapsed = time.perf_counter() - t0
    new_docs = manifest.docs - start_doc
    manifest.skipped = len(reader.skipped)
    manifest.stats = {
        "seconds": round(elapsed, 3), "docs_this_run": new_docs, "resumed_at": start_doc,
        "docs_per_second": round(new_docs / max(elapsed, 1e-9), 1),
        "tokens_per_second": round((encoder.n_tokens - tokens0) / max(elapsed, 1e-9), 1),
        "nonzeros_per_doc": round(manifest.nonzeros / manifest.docs, 2),
        "peak_host_memory_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    manifest.complete = True
    manifest.save(out)
    return manifest
