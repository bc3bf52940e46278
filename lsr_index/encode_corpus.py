"""The encode stage: corpus reader → encoder → quantizer → shard writer, resumable shard by shard.

Documents are numbered in stream order; shard k holds documents [k·shard_docs, (k+1)·shard_docs). Work
is the set of shards the manifest does not list yet, so a rerun after a crash encodes only what is
missing, and W workers (one per GPU) split it as shards k ≡ w (mod W). Every worker reads the whole
stream (reading runs at >100k docs/s, far above encoding) and encodes only its shards; the parent alone
writes the manifest. Within a worker, reading+tokenizing, the model, and serializing run in three threads.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import resource
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np
import orjson

from .corpus import CorpusReader, Fields
from .errors import LsrIndexError
from .manifest import Manifest, Shard, atomic_write_bytes, exclusive_lock
from .quantize import Quantization, SparseVectors, quantize
from .writers import ShardWriter, check_vocab, serialize_in_worker, serializer_init

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


@dataclass(frozen=True)
class EncodeJob:
    """Everything a worker process needs to rebuild its reader and model (picklable)."""

    inputs: tuple[str, ...]
    model: str = "splade-tiny"
    dtype: str = "float32"
    fields: Fields = field(default_factory=Fields)
    on_error: str = "fail"
    options: EncodeOptions = field(default_factory=EncodeOptions)

    @property
    def window(self) -> int:
        """Documents tokenized together and bucketed by length: large enough to fill a forward pass."""
        return min(max(self.options.max_tokens // 16, 256), 16384)

    def reader(self) -> CorpusReader:
        return CorpusReader(list(self.inputs), fields=self.fields, on_error=self.on_error, batch_size=self.window)


@dataclass
class WorkerResult:
    total_docs: int  # documents in the whole stream
    tokens: int
    skipped: list = field(default_factory=list)
    worker: int = 0
    device: str = "cpu"
    docs: int = 0  # documents this worker encoded
    loaded_at: float = 0.0  # time.time() when its model was on the device (process start, imports, load)
    ready_at: float = 0.0  # time.time() when its first batch started (model loaded, first tokens read)
    done_at: float = 0.0


def prefetch(items: Iterable[T], depth: int = 2) -> Iterator[T]:
    """Run an iterator in a background thread, so that it overlaps the consumer."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    done = object()

    def work() -> None:
        try:
            for item in items:
                q.put(item)
        except BaseException as exc:  # re-raised in the consumer
            q.put(exc)
        q.put(done)

    threading.Thread(target=work, daemon=True).start()
    while (item := q.get()) is not done:
        if isinstance(item, BaseException):
            raise item
        yield item


class _ShardSink:
    """Writes on its own thread; shards are published in the order they fill.

    With `serializers` > 0, JSON/gzip serialization of each chunk runs in that many processes (it is
    per-document Python work that would otherwise hold the GIL the encoder needs); the writer thread
    appends their bytes in order.
    """

    def __init__(self, out: Path, job: EncodeJob, vocab: np.ndarray, emit: Callable[[Shard], None],
                 serializers: int):
        self.out, self.job, self.vocab, self.emit = out, job, vocab, emit
        self.pool = None
        if serializers and job.options.output_format != "parquet":
            self.pool = ProcessPoolExecutor(serializers, mp_context=mp.get_context("spawn"),
                                            initializer=serializer_init, initargs=(vocab.tolist(),))
        self.queue: queue.Queue = queue.Queue(maxsize=2 * serializers + 4)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._work, daemon=True)
        self.thread.start()

    def put(self, index: int, ids: list[str], vectors: SparseVectors, last: bool) -> None:
        if self.error:
            raise self.error
        payload = self.pool.submit(serialize_in_worker, ids, vectors, self.job.options.output_format) \
            if self.pool and ids else None
        self.queue.put((index, ids, vectors, payload, last))

    def close(self, wait: bool = True) -> None:
        self.queue.put(None)
        self.thread.join()
        if self.pool:
            self.pool.shutdown(wait=wait, cancel_futures=not wait)
        if self.error and wait:
            raise self.error

    def _work(self) -> None:
        writers: dict[int, ShardWriter] = {}
        options = self.job.options
        try:
            while (item := self.queue.get()) is not None:
                index, ids, vectors, payload, last = item
                if index not in writers:
                    path = self.out / SHARDS / f"part-{index:05d}.{options.output_format}"
                    writers[index] = ShardWriter(path, options.output_format, self.vocab)
                if payload is not None:
                    writers[index].add_serialized(payload.result(), len(ids), vectors.nnz)
                elif ids:
                    writers[index].add(ids, vectors)
                if last:
                    self.emit(writers.pop(index).finish(index * options.shard_docs, self.out))
        except BaseException as exc:
            self.error = exc
            while self.queue.get() is not None:  # drain so the producer never blocks
                pass
        finally:
            for writer in writers.values():  # incomplete: never published
                writer.abort()


def _encode_shards(job: EncodeJob, out: Path, device: str, worker: int, workers: int, done: frozenset[int],
                   emit: Callable[[Shard], None], progress: Callable[[int, int], None]) -> WorkerResult:
    """Encode the pending shards k ≡ worker (mod workers); `emit` receives each finished shard."""
    import torch

    from .encoder import SpladeEncoder, Tokens
    from .models import load_model

    options = job.options
    ready_at = 0.0
    if device.startswith("cuda"):
        torch.cuda.set_device(device)  # Triton launches on the current device, not the tensors'
    model = load_model(job.model, device=device, dtype=getattr(torch, job.dtype))
    check_vocab(model.vocab)
    loaded_at = time.time()
    encoder = SpladeEncoder(model, max_tokens=options.max_tokens, backend=options.backend)
    reader = job.reader()
    mine = lambda shard: shard % workers == worker and shard not in done

    def tokenized() -> Iterator[tuple[int, list[str], Tokens]]:
        position = 0
        for batch in reader:
            start, position = position, position + batch.num_rows
            for shard in range(start // options.shard_docs, (position - 1) // options.shard_docs + 1):
                if not mine(shard):  # another worker's: read (to count documents) but not encoded
                    continue
                lo = max(start, shard * options.shard_docs) - start
                hi = min(position, (shard + 1) * options.shard_docs) - start
                rows = batch.slice(lo, hi - lo)
                texts = rows.column("text").to_pylist()
                yield start + lo, rows.column("id").to_pylist(), encoder.tokenize(texts, options.doc_max_length)

    cores = max(1, (os.cpu_count() or 1) // (2 * workers))
    sink = _ShardSink(out, job, np.array(model.vocab, dtype=object), emit,
                      serializers=min(8, cores) if device.startswith("cuda") else 0)
    try:
        for start, ids, token_ids in prefetch(tokenized()):
            ready_at = ready_at or time.time()
            parts = []
            for pos, vectors in encoder.encode_ids(token_ids, then=lambda w: quantize(w, options.quantization)):
                parts.append((pos, vectors))
                progress(len(pos), int(token_ids.lengths[pos].sum()))
            vectors = SparseVectors.stack(parts, len(ids))
            # each item lies in one shard (tokenized() cuts at shard edges); the shard ends with its last document
            sink.put(start // options.shard_docs, ids, vectors, last=(start + len(ids)) % options.shard_docs == 0)
    except BaseException:
        sink.close(wait=False)
        raise
    # the stream's last shard is short: publish it now that the stream has ended
    total = reader.n_docs
    final = (total - 1) // options.shard_docs if total else -1
    if total % options.shard_docs and mine(final):
        sink.put(final, [], SparseVectors(np.zeros(1, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int32)),
                 last=True)
    sink.close()
    skipped = [{"file": s.path, "line": s.where, "id": s.doc_id, "reason": s.reason} for s in reader.skipped]
    return WorkerResult(total_docs=total, tokens=encoder.n_tokens, skipped=skipped, worker=worker, device=device,
                        docs=encoder.n_docs, loaded_at=loaded_at, ready_at=ready_at or time.time(),
                        done_at=time.time())


def _worker_main(job, out, device, worker, workers, done, messages) -> None:
    """Process entry point: everything goes back to the parent as messages."""
    parent = mp.parent_process()  # a worker must not outlive its parent and write beside a rerun
    # the Rust tokenizer's thread pool takes every core by default: W workers would oversubscribe them W times
    os.environ.setdefault("RAYON_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))
    threading.Thread(target=lambda: (parent.join(), os._exit(1)), daemon=True).start()
    try:
        result = _encode_shards(job, out, device, worker, workers, done,
                                emit=lambda shard: messages.put(("shard", shard)),
                                progress=lambda docs, tokens: messages.put(("progress", (docs, tokens))))
        messages.put(("done", result))
    except LsrIndexError as exc:
        messages.put(("error", str(exc)))
    except BaseException as exc:
        messages.put(("error", f"worker on {device} failed: {type(exc).__name__}: {exc}"))


def _describe_input(job: EncodeJob) -> dict:
    reader = job.reader()
    files = [(p.resolve(), p.stat()) for p in reader.files]  # an edited input must not resume stale vectors
    return {"files": [{"path": str(p), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns} for p, st in files],
            "fields": {"id": reader.fields.id, "text": list(reader.fields.text or []) or None},
            "on_error": job.on_error}


def _open_output(out: Path, fresh: Manifest, overwrite: bool) -> Manifest:
    """Start, resume or refuse, depending on what the directory already holds."""
    if not (out / "manifest.json").exists():
        ours = lambda p: p.name == ".lock" or (p.name.startswith(".manifest.json.") and p.name.endswith(".tmp")) \
            or (p.name == SHARDS and p.is_dir() and all(q.name.startswith(".") for q in p.iterdir()))
        if not all(ours(p) for p in out.iterdir()) and not overwrite:
            raise LsrIndexError(f"{out} exists and is not an lsr-index output; choose another directory "
                                "or pass --overwrite")
        return fresh
    if overwrite:  # even over a damaged manifest: delete every shard file, listed or not
        fresh.save(out)  # first: a kill below must not leave a complete manifest over deleted shards
        for stale in (out / SHARDS).glob("part-*"):
            stale.unlink()
        return fresh
    old = Manifest.load(out)
    if not old.shards:  # nothing encoded yet (e.g. the first run stopped at a bad record): start afresh
        return fresh
    if old.complete:
        raise LsrIndexError(f"{out} already holds a complete encoding ({old.docs} documents); "
                            "pass --overwrite to replace it")
    if old.fingerprint() != fresh.fingerprint():
        changed = sorted(k for k, v in old.fingerprint().items() if fresh.fingerprint()[k] != v)
        raise LsrIndexError(f"{out} holds a partial encoding made with other {', '.join(changed)} (an input file "
                            "changed, or another setting); pass --overwrite to start over")
    return old


def encode_corpus(job: EncodeJob, out: Path, devices: tuple[str, ...] = ("cpu",)) -> Manifest:
    """Encode `job` into `out`, resuming whatever an earlier run left; one worker per device."""
    from tqdm import tqdm

    from .model_files import model_sha256
    from .models import EMBEDDED, max_length, resolve_model

    options = job.options
    model_path = resolve_model(job.model)
    limit = max_length(model_path)
    if limit and max(options.doc_max_length, options.query_max_length) > limit:
        raise LsrIndexError(f"model {job.model} takes at most {limit} tokens; lower --doc-max-length "
                            f"({options.doc_max_length}) or --query-max-length ({options.query_max_length})")
    fresh = Manifest(
        model={"name": job.model if job.model in EMBEDDED else str(model_path.resolve()),
               "sha256": model_sha256(model_path)},
        encoder={"doc_max_length": options.doc_max_length, "query_max_length": options.query_max_length,
                 "dtype": job.dtype, "backend": options.backend},
        quantization=options.quantization.to_dict(), input=_describe_input(job), output_format=options.output_format,
        shard_docs=options.shard_docs)
    out.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(out):
        manifest = _open_output(out, fresh, options.overwrite)
        (out / SHARDS).mkdir(exist_ok=True)
        for stale in [*(out / SHARDS).glob(".*.tmp"), *out.glob(".manifest.json.*.tmp")]:  # left by a kill
            stale.unlink()
        manifest.complete = False
        manifest.save(out)
        done = frozenset(s.start // options.shard_docs for s in manifest.shards)
        resumed_at = manifest.docs
        t0, started_at = time.perf_counter(), time.time()
        bar = tqdm(desc="encode", unit=" doc", initial=resumed_at, dynamic_ncols=True,
                   disable=None if options.progress else True)
        tokens = 0

        def on_shard(shard: Shard) -> None:
            manifest.shards.append(shard)
            manifest.shards.sort(key=lambda s: s.start)
            manifest.save(out)

        def on_progress(docs: int, new_tokens: int) -> None:
            nonlocal tokens
            tokens += new_tokens
            bar.update(docs)
            bar.set_postfix_str(f"{tokens / max(time.perf_counter() - t0, 1e-9):,.0f} tok/s", refresh=False)

        try:
            if len(devices) == 1:
                results = [_encode_shards(job, out, devices[0], 0, 1, done, on_shard, on_progress)]
            else:
                results = _run_workers(job, out, devices, done, on_shard, on_progress)
        finally:
            bar.close()
        return _finish(out, manifest, results, resumed_at, time.perf_counter() - t0, started_at)


def _run_workers(job: EncodeJob, out: Path, devices: tuple[str, ...], done: frozenset[int],
                 on_shard: Callable[[Shard], None], on_progress: Callable[[int, int], None]) -> list[WorkerResult]:
    context = mp.get_context("spawn")  # CUDA cannot be forked
    messages = context.Queue()
    # not daemonic: a worker starts its own serializer pool; the finally below ends them on any failure
    procs = [context.Process(target=_worker_main, args=(job, out, d, w, len(devices), done, messages))
             for w, d in enumerate(devices)]
    for p in procs:
        p.start()
    results: list[WorkerResult] = []
    try:
        while len(results) < len(procs):
            if any(p.exitcode not in (None, 0) for p in procs):
                raise LsrIndexError("an encoding worker died; rerun the same command to resume")
            try:
                kind, body = messages.get(timeout=1.0)
            except queue.Empty:
                continue
            if kind == "shard":
                on_shard(body)
            elif kind == "progress":
                on_progress(*body)
            elif kind == "done":
                results.append(body)
            else:
                raise LsrIndexError(body)
    finally:
        for p in procs:
            if p.is_alive() and len(results) < len(procs):
                p.terminate()
            p.join()
    return sorted(results, key=lambda r: r.worker)


def _finish(out: Path, manifest: Manifest, results: list[WorkerResult], resumed_at: int,
            seconds: float, started_at: float) -> Manifest:
    total = results[0].total_docs
    expected = 0
    for shard in manifest.shards:  # the shards must tile [0, total) exactly
        if shard.start != expected:
            raise LsrIndexError(f"{out}: shards do not cover documents {expected}..{shard.start - 1}; "
                                "rerun to resume, or --overwrite")
        expected += shard.docs
    if expected != total:
        raise LsrIndexError(f"{out}: shards hold {expected} documents but the input has {total}; the input changed "
                            "since the first run? Use --overwrite")
    atomic_write_bytes(out / SKIPPED_REPORT, b"".join(orjson.dumps(s) + b"\n" for s in results[0].skipped))
    tokens = sum(r.tokens for r in results)
    new_docs = total - resumed_at
    manifest.skipped = len(results[0].skipped)
    manifest.stats = {
        "seconds": round(seconds, 3), "docs_this_run": new_docs, "resumed_at": resumed_at,
        "workers": len(results), "docs_per_second": round(new_docs / max(seconds, 1e-9), 1),
        "tokens_per_second": round(tokens / max(seconds, 1e-9), 1),
        "nonzeros_per_doc": round(manifest.nonzeros / manifest.docs, 2),
        "peak_host_memory_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        # start-up (process, model load, first read) apart from the encoding rate that follows it
        "per_worker": [{"device": r.device, "docs": r.docs, "startup_seconds": round(r.ready_at - started_at, 3),
                        "model_loaded_after_seconds": round(r.loaded_at - started_at, 3),
                        "docs_per_second_after_startup": round(r.docs / max(r.done_at - r.ready_at, 1e-9), 1)}
                       for r in results],
    }
    manifest.complete = True
    manifest.save(out)
    return manifest
