"""The one encode task: "encode the shards assigned to me of this job" (ShardEncoder.run), run in-process, in a local
worker process, or by a cluster's actor (which loads the model once and runs the task once per shard). It encodes
the pieces of its shards that are not checkpointed yet, and reports each checkpoint (a Chunk) and each finished
shard (a Shard) through `emit`; it never touches the manifest.

Within a task, reading+tokenizing, the model, and serializing+writing run in three threads; beside a GPU, reading
and tokenizing run in a process of their own instead (_InputProcess), and serializing in a pool of processes
(serializers.SerializerPool).
"""

from __future__ import annotations

import ctypes
import os
import pickle
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import BinaryIO, TypeVar

import numpy as np
import pyarrow as pa

from lsr_index.encode_job import EncodeJob, Piece, digest_hex, input_digest, pieces
from lsr_index.errors import InputError, LsrIndexError
from lsr_index.inputs.corpus import CorpusReader, string_array
from lsr_index.model.tokens import TextTokenizer, Tokens
from lsr_index.runtime.children import PythonChild, end_with_stdin, send_message
from lsr_index.runtime.durable import create_new
from lsr_index.vectors.manifest import Chunk, Part, Shard
from lsr_index.vectors.quantize import SparseVectors, quantize
from lsr_index.vectors.serializers import SerializerPool
from lsr_index.vectors.shards import ShardWriter, blocks, check_vocab, chunk_file, concatenate, shard_file

T = TypeVar("T")


@dataclass(frozen=True)
class Assignment:
    """The shards one task encodes: those not published yet, each resuming after the chunks already checkpointed for
    it. The workers of one machine share them by claims: the first whose reader reaches a shard takes it, so a faster
    device takes more shards. A fixed split (k mod W) kept the faster of two unequal GPUs idle while the other
    finished its share: on one host whose two H100s ran 25.5k and 29k docs/s, two GPUs gave 1.59x one."""

    done: frozenset[int] = frozenset()
    chunks: dict[int, tuple[Chunk, ...]] = field(default_factory=dict)
    worker: int = 0
    workers: int = 1
    claims: str | None = None  # the run's claims directory (shards.claims_dir), shared by its workers

    def mine(self, shard: int) -> bool:
        """Whether to encode `shard`: ask once per shard (a claim, when shared, is taken for good)."""
        if shard in self.done:
            return False
        if self.claims is None:
            return True
        try:  # one file per shard, created by exactly one worker (O_EXCL)
            os.close(create_new(Path(self.claims) / f"{shard:05d}"))
        except FileExistsError:
            return False
        return True

    def split(self, workers: int, claims: Path) -> list[Assignment]:
        return [Assignment(self.done, self.chunks, w, workers, str(claims)) for w in range(workers)]


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
    cores: int = 0  # the host cores it was given (its serializers, torch's threads, the tokenizer's)
    serializers: int = 0  # processes serializing its vectors beside it
    started: str = "in process"  # or "fork", "new interpreter", "ray actor": how its process started


@dataclass
class _Stats:
    """What a piece adds to its part's record besides vectors: its input digest and truncation counts."""

    digest: int = 0
    truncated: int = 0
    longest: int = 0
    capped: int = 0

    def add(self, other: _Stats) -> None:
        self.digest += other.digest
        self.truncated += other.truncated
        self.longest = max(self.longest, other.longest)
        self.capped += other.capped

    @staticmethod
    def of(part: Part) -> _Stats:
        return _Stats(int(part.input, 16), part.truncated, part.longest, part.capped)


def _put_unless_stopped(items: queue.Queue, item: object, stop: threading.Event) -> bool:
    """Queue `item` unless the consumer closed the stream first (False: stop)."""
    while not stop.is_set():
        try:
            items.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


class Prefetch(Iterator[T]):
    """Run an iterator in a background thread, started at once, so that it overlaps the consumer (and whatever the
    consumer does before its first item). `close` ends the thread when the consumer stops early."""

    def __init__(self, items: Iterable[T], depth: int = 2, name: str | None = None):
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = object()
        threading.Thread(target=self._work, args=(items,), name=name, daemon=True).start()

    def _work(self, items: Iterable[T]) -> None:
        try:
            for item in items:
                if not self._put(item):
                    return
        except BaseException as exc:  # re-raised in the consumer
            if not self._put(exc):
                return
        finally:
            if callable(close := getattr(items, "close", None)):  # a generator's own clean-up runs in this thread
                close()
        self._put(self._done)

    def _put(self, item: object) -> bool:
        return _put_unless_stopped(self._queue, item, self._stop)

    def __next__(self) -> T:
        item = self._queue.get()
        if item is self._done:
            self._queue.put(item)  # a later call ends the same way
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        """Stop the thread (within 0.1 s, or after the item it is reading); the stream is not read after this."""
        self._stop.set()


@dataclass
class _Open:
    """A shard being written: its earlier checkpoints, and the writer of the piece run since the last one."""

    chunks: list[Chunk]
    writer: ShardWriter | None = None
    start: int = 0  # first document of the writer's run
    opened: float = 0.0
    stats: _Stats = field(default_factory=_Stats)


class _ShardSink:
    """Writes on its own thread, in piece order; checkpoints a shard at the first piece end past
    `checkpoint_seconds` and publishes it with its last piece.

    With a `pool` (its encoder's serializer processes), JSON/gzip serialization runs there, each piece's blocks
    (shards.blocks) side by side: it is per-document Python work that would otherwise hold the GIL the encoder
    needs. The writer thread appends their bytes in order.
    """

    def __init__(self, out: Path, job: EncodeJob, vocab: np.ndarray, emit: Callable[[Part], None],
                 pool: SerializerPool | None, serializers: int, assignment: Assignment):
        self.out, self.job, self.vocab, self.emit, self.assignment = out, job, vocab, emit, assignment
        self.fmt = job.options.output_format
        self.pool = pool
        self.queue: queue.Queue = queue.Queue(maxsize=2 * serializers + 4)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._work, daemon=True)
        self.thread.start()

    def put(self, piece: Piece, ids: list[str] | None, vectors: SparseVectors | None, stats: _Stats) -> None:
        """Queue a piece's vectors; `ids=None`: the piece was checkpointed earlier, only its shard's end is news."""
        if self.error:
            raise self.error
        payload = [(self.pool.submit(block_ids, block, self.fmt), len(block_ids), block.nnz)
                   for block_ids, block in blocks(ids, vectors)] if self.pool and ids else None
        self.queue.put((piece.shard, piece.start, piece.last, ids, vectors, payload, stats))

    def close(self, wait: bool = True) -> None:
        self.queue.put(None)
        self.thread.join()
        if self.error and wait:
            raise self.error

    def _work(self) -> None:
        shards: dict[int, _Open] = {}
        try:
            while (item := self.queue.get()) is not None:
                self._write(shards, *item)
        except BaseException as exc:
            self.error = exc
            while self.queue.get() is not None:  # drain so the producer never blocks
                pass
        finally:
            for state in shards.values():  # incomplete: never published
                if state.writer:
                    state.writer.abort()

    def _write(self, shards: dict[int, _Open], shard: int, start: int, last: bool, ids: list[str] | None,
               vectors: SparseVectors | None, payload: list[tuple[Future, int, int]] | None, stats: _Stats) -> None:
        state = shards.setdefault(shard, _Open(list(self.assignment.chunks.get(shard, ()))))
        if ids is not None:
            if state.writer is None:
                state.writer = ShardWriter(self.out / shard_file(shard, self.fmt), self.fmt, self.vocab)
                state.start, state.opened, state.stats = start, time.monotonic(), _Stats()
            if payload is not None:
                for block, docs, nonzeros in payload:
                    state.writer.add_serialized(block.result(), docs, nonzeros)
            else:
                state.writer.add(ids, vectors)
            state.stats.add(stats)
        if last:
            self.emit(self._publish(shard, shards.pop(shard)))
        elif state.writer and time.monotonic() - state.opened >= self.job.options.checkpoint_seconds:
            chunk = self._checkpoint(shard, state)
            state.chunks.append(chunk)
            self.emit(chunk)

    def _checkpoint(self, shard: int, state: _Open) -> Chunk:
        writer, state.writer = state.writer, None
        sha = writer.finish(self.out / chunk_file(shard, state.start, self.fmt))
        s = state.stats
        return Chunk(file=chunk_file(shard, state.start, self.fmt), start=state.start, docs=writer.docs,
                     nonzeros=writer.nonzeros, sha256=sha, input=digest_hex(s.digest), truncated=s.truncated,
                     longest=s.longest, capped=s.capped, shard=shard)

    def _publish(self, shard: int, state: _Open) -> Shard:
        path = self.out / shard_file(shard, self.fmt)
        if not state.chunks:  # the shard was written in one run: its one file is the shard
            writer = state.writer
            sha = writer.finish()
            stats, docs, nonzeros = state.stats, writer.docs, writer.nonzeros
        else:
            tail = [self._checkpoint(shard, state)] if state.writer else []
            state.chunks += tail
            sha = concatenate([self.out / c.file for c in state.chunks], path, self.fmt)
            for chunk in tail:  # never recorded: the planner deletes the recorded chunks once the shard is listed
                (self.out / chunk.file).unlink()
            stats = _Stats()
            for chunk in state.chunks:
                stats.add(_Stats.of(chunk))
            docs, nonzeros = sum(c.docs for c in state.chunks), sum(c.nonzeros for c in state.chunks)
        return Shard(file=shard_file(shard, self.fmt), start=self.job.shard_range(shard)[0], docs=docs,
                     nonzeros=nonzeros, sha256=sha, input=digest_hex(stats.digest), truncated=stats.truncated,
                     longest=stats.longest, capped=stats.capped)


class ShardEncoder:
    """The model on one device, loaded once: a local worker runs it once, a cluster's actor once per shard.

    The weights load in a background thread while `run` already reads and tokenizes the first pieces (the
    tokenizer and the vocabulary come first, from the tokenizer files): ~1 s of model load and ~1 s of the first
    piece used to follow each other before the first batch."""

    def __init__(self, job: EncodeJob, device: str, cores: int, reads_input: bool = True):
        """`reads_input=False`: every run gets its pieces from the caller (a cluster's driver reads the input)."""
        if not device.startswith("cuda"):
            _reuse_freed_memory()
        self.pool: SerializerPool | None = None
        # the input process starts first: its interpreter and imports (~0.4 s) pass while the tokenizer, the
        # vocabulary and the serializers are made here; `run` hands it its work
        self._input_child = _input_child() if reads_input and _reads_in_a_process(device) else None
        try:
            self._setup(job, device, cores)
        except BaseException:
            self.close()
            raise

    def _setup(self, job: EncodeJob, device: str, cores: int) -> None:
        from lsr_index.model.load import load_tokenizer, tokenizer_terms

        tokenizer = load_tokenizer(job.model)
        vocab = tokenizer_terms(tokenizer)[0]  # what the model's vocabulary will be: its tokenizer's terms
        check_vocab(vocab)
        self.job, self.device, self.cores, self.loaded_at = job, device, cores, 0.0
        self.vocab = np.array(vocab, dtype=object)
        self.tokenizer = TextTokenizer(tokenizer)
        self._encoder: Future = Future()
        threading.Thread(target=self._load, args=(tokenizer,), name="model-load", daemon=True).start()
        # a GPU outpaces the JSON/gzip serialization of its vectors: half its host cores serialize beside it, in
        # processes started once (a cluster's encoder runs the task once per shard)
        self.serializers = min(8, max(1, cores // 2)) if device.startswith("cuda") else 0
        self.pool = SerializerPool(self.serializers, vocab) if self.serializers and \
            job.options.output_format != "parquet" else None

    def _load(self, tokenizer: object) -> None:
        try:  # whatever fails here is raised where the encoder is first used: nothing waits forever for it
            if self.device.startswith("cuda"):
                _expandable_cuda_memory()
            import torch

            import sparton
            from lsr_index.model.encoder import SpladeEncoder
            from lsr_index.model.load import load_model

            with ThreadPoolExecutor(1, thread_name_prefix="kernel-prepare") as beside:
                prepared = None
                if self.device.startswith("cuda"):
                    torch.cuda.set_device(self.device)
                    if self.job.options.backend != "torch":  # the Triton head will run: its key beside the load
                        prepared = beside.submit(sparton.prepare)
                model = load_model(self.job.model, device=self.device, dtype=getattr(torch, self.job.dtype),
                                   tokenizer=tokenizer)
                if prepared:
                    prepared.result()
            self.loaded_at = time.time()
            encoder = SpladeEncoder(model, max_tokens=self.job.options.max_tokens, backend=self.job.options.backend,
                                    tokenizer=self.tokenizer)
            encoder.warm_up(self.job.options.doc_max_length, partial(quantize, q=self.job.options.quantization))
            self._encoder.set_result(encoder)
        except BaseException as exc:
            self._encoder.set_exception(exc)

    @property
    def encoder(self):
        """The SpladeEncoder, once the model has loaded (its loading error, if it failed)."""
        encoder = self._encoder.result()
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.set_device(self.device)  # Triton launches on the calling thread's current device
        return encoder

    def close(self) -> None:
        """End the serializer processes (after a success they have no work left: `run` collects every result) and an
        input process that no run took, then wait for a model load still under way: transformers builds a model under
        process-wide settings (the default dtype, patched torch functions), so a load left running after a failed run
        broke the caller's next model load (weights left on the meta device: model.load._BUILDING)."""
        if self.pool:
            self.pool.close()
        if self._input_child:
            self._input_child.close()
        if loading := getattr(self, "_encoder", None):
            wait([loading])

    def run(self, out: Path, assignment: Assignment, emit: Callable[[Part], None],
            progress: Callable[[int, int], None], source: Iterable[Piece] | None = None) -> WorkerResult:
        """Encode the shards of `assignment` into `out`; `emit` receives each checkpoint and each finished shard, in
        order. Without `source` the task reads the whole stream itself (to number documents, skipping the pieces of
        other shards); with one (pieces a driver read, all of them to encode) it reads nothing, and the stream's
        total and skipped records are the driver's to report."""
        job, options = self.job, self.job.options
        ready_at = 0.0
        # a tokenizer that cannot be serialized (a custom Python pre-tokenizer) keeps to threads
        tokenizer_json = _serialized(self.tokenizer) if source is None and _reads_in_a_process(self.device) else None
        child = tokenizer_json is not None
        reader = job.reader() if source is None and not child else None

        pending: dict[int, tuple[Piece, list[str] | None, Tokens | None, _Stats, list]] = {}  # read, not yet sunk
        sink: _ShardSink | None = None
        spare, self._input_child = self._input_child, None  # a cluster's actor runs again: a new one then
        if spare and not child:
            spare.close()
        # reading and tokenizing begin now, while the model loads. In threads, one piece is read beside the load, no
        # more: the load is Python work too, and reading further ahead took the GIL from it (BERT-base ready at
        # 1.1-1.4 s instead of 0.4-0.6 s on an H200)
        stream = _InputProcess(job, assignment, tokenizer_json, spare) if child else Prefetch(tokenized_pieces(
            job, assignment, pieces(reader, options.shard_docs) if source is None else source, self.tokenizer,
            after_each=lambda: wait([self._encoder])), name="tokenize")

        def to_encode() -> Iterator[tuple[int, Tokens]]:
            """The pieces with documents to encode, numbered; all pieces wait in `pending` for their turn."""
            nonlocal ready_at
            for n, (piece, ids, tokens, stats) in enumerate(stream):
                ready_at = ready_at or time.time()
                pending[n] = (piece, ids, tokens, stats, [])
                if ids is not None:
                    yield n, tokens

        def sink_until(n: int | None) -> None:
            """Hand the sink the pieces before n (None: all) that had nothing to encode (checkpointed earlier)."""
            for k in sorted(k for k in pending if n is None or k < n):
                piece, *_ = pending.pop(k)
                sink.put(piece, None, None, _Stats())

        try:
            encoder = self.encoder
            docs0, tokens0 = encoder.n_docs, encoder.n_tokens
            sink = _ShardSink(out, job, self.vocab, emit, self.pool, self.serializers, assignment)
            quantizer = partial(quantize, q=options.quantization)
            for n, positions, part in encoder.encode_stream(to_encode(), quantizer):
                piece, ids, tokens, stats, parts = pending[n]
                if positions is not None:
                    parts.append((positions, part))
                    progress(len(positions), int(tokens.lengths[positions].sum()))
                    continue
                sink_until(n)
                del pending[n]
                sink.put(piece, ids, SparseVectors.stack(parts, len(ids)), stats)
            sink_until(None)
        except BaseException:
            stream.close()
            if sink is not None:
                sink.close(wait=False)
            raise
        stream.close()
        sink.close()
        total, skipped = (stream.total_docs, stream.skipped) if child else \
            (reader.n_docs, skipped_records(reader)) if reader else (0, [])
        return WorkerResult(total_docs=total, tokens=encoder.n_tokens - tokens0, skipped=skipped,
                            worker=assignment.worker, device=self.device, docs=encoder.n_docs - docs0,
                            loaded_at=self.loaded_at, ready_at=ready_at or time.time(), done_at=time.time(),
                            cores=self.cores, serializers=self.serializers)


def tokenized_pieces(job: EncodeJob, assignment: Assignment, stream: Iterable[Piece], tokenizer: TextTokenizer,
                     after_each: Callable[[], object] = lambda: None
                     ) -> Iterator[tuple[Piece, list[str] | None, Tokens | None, _Stats]]:
    """The pieces of `stream` read (read_pieces) in a thread of their own and tokenized: reading and parsing piece
    i+1 (Python work under the GIL) runs while piece i is tokenized (in Rust, on every core, without the GIL). In
    one thread the two added up: ~12 µs a document to read and ~20 to tokenize on 16 cores
    (benchmarks/NOTES_encode.md)."""
    ahead = Prefetch(read_pieces(job, assignment, stream, after_each=after_each), name="read")
    try:
        yield from tokenize_pieces(ahead, tokenizer, job.options.doc_max_length)
    finally:
        ahead.close()


def read_pieces(job: EncodeJob, assignment: Assignment, stream: Iterable[Piece],
                after_each: Callable[[], object] = lambda: None
                ) -> Iterator[tuple[Piece, list[str] | None, list[str] | None, _Stats]]:
    """The pieces of `stream` to encode as id and text lists, with their digests and capped counts; a piece with
    nothing left to encode (checkpointed earlier) as (piece, None, None, _Stats()) when it ends its shard. Pieces of
    other shards are read (to count) only. `after_each` runs after each piece is taken."""
    resume_at = {k: chunks[-1].end for k, chunks in assignment.chunks.items() if chunks}
    cut = _Ramp(job.window)
    shard, encoding = -1, False
    for piece in stream:
        if piece.shard != shard:  # asked as its first piece is read, so the claim goes to the reader that is ahead
            shard, encoding = piece.shard, assignment.mine(piece.shard)
        if not encoding:  # another worker's, or published: read (to count) only
            continue
        checkpointed = resume_at.get(piece.shard, 0)
        parts = list(cut(piece))  # cut even where checkpointed: the cuts, and so the bytes, are an uninterrupted run's
        if piece.end <= checkpointed:
            if piece.last:
                yield piece, None, None, _Stats()
            continue
        for part in parts:
            if part.end <= checkpointed:
                continue
            if part.start < checkpointed:  # cut otherwise by the run that checkpointed (another window)
                part = part.part(checkpointed, part.end)
            ids, texts = part.rows.column("id").to_pylist(), part.rows.column("text").to_pylist()
            capped = sum(len(t) >= job.max_chars for t in texts)
            yield part, ids, texts, _Stats(input_digest(part.start, ids, texts), capped=capped)
            after_each()


class _Ramp:
    """Cuts each shard's first documents into growing parts, window/8 first, each next ×1.5, none shorter than the
    one before (for a window of 8,192 and shards that start a reader's batch: 1,024, 1,536, 2,304, 3,328, 3,456,
    4,736, then whole pieces). The model starts on the first part instead of waiting for a whole window to be read
    and tokenized (~0.3 s on a 16-core GPU host), and the input keeps ahead while the parts grow: it reads and
    tokenizes ~1.3× as fast as an H100 encodes BERT-base. The cuts depend only on the shard's pieces, so a resumed
    run cuts where the first did; they cost each later shard a few part-filled batches (BERT-base 131k in shards of
    32,768: −2 % after start-up)."""

    def __init__(self, window: int):
        self.window, self.shard, self.size = window, -1, window

    def __call__(self, piece: Piece) -> Iterator[Piece]:
        if piece.shard != self.shard:
            self.shard, self.size = piece.shard, max(1, self.window // 8)
        lo = piece.start
        while self.size < self.window and piece.end - lo >= 2 * self.size:
            yield piece.part(lo, lo + self.size)
            lo, self.size = lo + self.size, -(-self.size * 3 // 2)
        if lo == piece.start:  # a piece no cut fits: the ramp is over
            self.size = self.window
            yield piece
            return
        yield piece.part(lo, piece.end)
        self.size = max(self.size, piece.end - lo)  # the next part no shorter than this one


def tokenize_pieces(items: Iterable[tuple[Piece, list[str] | None, list[str] | None, _Stats]],
                    tokenizer: TextTokenizer, max_length: int
                    ) -> Iterator[tuple[Piece, list[str] | None, Tokens | None, _Stats]]:
    """read_pieces' pieces with their texts tokenized, and their truncation counted into their stats."""
    for piece, ids, texts, stats in items:
        tokens = None
        if texts is not None:
            tokens = tokenizer.tokenize(texts, max_length)
            _add_truncation(stats, tokens.full_lengths, max_length)
        yield piece, ids, tokens, stats


def _reads_in_a_process(device: str) -> bool:
    """Whether a task reads and tokenizes in a process of its own (_InputProcess) rather than in threads."""
    return device.startswith("cuda")


def _serialized(tokenizer: TextTokenizer) -> str | None:
    """The Rust tokenizer as JSON for the input process, or None if it holds Python parts (0.3 s of the GIL for
    XLM-R's 250k pieces, taken while the model loads in its own thread)."""
    try:
        return tokenizer.backend.to_str()
    except Exception:  # tokenizers raises a plain Exception for a custom pre-tokenizer
        return None


_INPUT_AHEAD = 3  # pieces the input process may hold ready ahead of the model


class _InputProcess(Iterator[tuple[Piece, list[str] | None, "Tokens | None", _Stats]]):
    """The task's pieces read, digested and tokenized in a process of its own, as `tokenized()` yields them.

    Beside a GPU, the thread that launches the model's kernels is the limit, and reading (JSON parsing, ~12 µs a
    document) and building token lists are Python work that took the GIL from it: on an H100 the GPU idled 2.2 s of
    a 6.7 s BERT-base run, each gap waiting for a late launch while that thread ran Python (benchmarks/gpu_busy.py).
    Here they run on other cores under another GIL (same host, alternated: 20.4k → 26.8k docs/s after start-up).

    Its messages (children.PythonChild): pieces with their rows reduced to the ids, then the stream's end or its
    error, rebuilt here as the same exception."""

    def __init__(self, job: EncodeJob, assignment: Assignment, tokenizer_json: str, child: PythonChild | None = None):
        """`child`: one started ahead (_input_child), else one starts now."""
        self.total_docs, self.skipped = 0, []
        self._ended = self._finished = False  # no more items; the child sent the stream's end
        self._items: queue.Queue = queue.Queue(maxsize=_INPUT_AHEAD)
        self._stop = threading.Event()
        self._child = child or _input_child()
        try:  # both directions in threads: the set-up (XLM-R's tokenizer is 17 MB) is read once the child runs
            threading.Thread(target=self._send, args=((job, assignment, tokenizer_json),), name="input-send",
                             daemon=True).start()
            threading.Thread(target=self._receive, name="input-receive", daemon=True).start()
        except BaseException:
            self.close()
            raise

    def _send(self, setup: tuple) -> None:
        try:
            pickle.dump(setup, self._child.stdin)
            self._child.stdin.flush()
        except (OSError, ValueError):
            return  # it ended already: _receive reports how
        except BaseException as exc:
            self._child.process.terminate()
            self._put(("error", f"cannot hand the input-reading process its set-up: {type(exc).__name__}: {exc}"))
        # stdin stays open: its end is how the child learns that this process is gone

    def _receive(self) -> None:
        try:
            while True:
                message = pickle.load(self._child.messages)
                if not self._put(message) or message[0] != "piece":
                    return
        except (EOFError, OSError, ValueError, pickle.UnpicklingError):
            self._put(("died",))
        except BaseException as exc:
            self._put(("error", f"lost the input-reading process's stream: {type(exc).__name__}: {exc}"))

    def _put(self, item: tuple) -> bool:
        return _put_unless_stopped(self._items, item, self._stop)

    def __next__(self) -> tuple[Piece, list[str] | None, Tokens | None, _Stats]:
        if self._ended:
            raise StopIteration
        kind, *body = self._items.get()
        if kind == "piece":
            piece, tokens, stats = body
            return piece, None if tokens is None else piece.rows.column("id").to_pylist(), tokens, stats
        self._ended = True
        if kind == "end":
            self.total_docs, self.skipped = body
            self._finished = True
            raise StopIteration
        if kind == "input_error":
            raise InputError(*body)
        if kind == "error":
            raise LsrIndexError(body[0])
        self._child.process.terminate()  # its stream broke while it may still run
        code = self._child.exit_code(10)
        raise LsrIndexError(f"the input-reading process ended unexpectedly (exit code {code}); rerun the same "
                            "command to resume")

    def close(self) -> None:
        """End the process (at once unless it already finished) and reap it."""
        self._stop.set()
        self._child.close(finished=self._finished)


def _input_child() -> PythonChild:
    return PythonChild("lsr_index.encode_shard:input_main", "the input-reading process")


def input_main(out: BinaryIO) -> None:
    """The input process (see _InputProcess): its set-up from stdin, then ("piece", piece with its ids only, tokens,
    stats) per piece, and ("end", documents in the stream, skipped records), ("input_error", path, line, reason, hint)
    or ("error", one line), pickled to `out`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # not its to handle, even if it reaches this process group

    send = partial(send_message, out)
    try:
        job, assignment, tokenizer_json = pickle.load(sys.stdin.buffer)
    except BaseException:
        os._exit(1)  # the parent ended while sending
    threading.Thread(target=end_with_stdin, daemon=True).start()
    try:
        from tokenizers import Tokenizer

        tokenizer = TextTokenizer(Tokenizer.from_str(tokenizer_json))
        reader = job.reader()
        for piece, ids, tokens, stats in tokenized_pieces(job, assignment, pieces(reader, job.options.shard_docs),
                                                          tokenizer):
            # the ids anew, compact: a slice of the reader's batch would pickle the whole batch's buffers
            rows = piece.rows.select([]) if ids is None else pa.RecordBatch.from_arrays([string_array(ids)], ["id"])
            send("piece", Piece(piece.shard, piece.start, rows, piece.last), tokens, stats)
        send("end", reader.n_docs, skipped_records(reader))
    except BrokenPipeError:
        os._exit(1)  # the parent stopped reading: nobody to tell
    except InputError as exc:
        send("input_error", exc.path, exc.where, exc.reason, exc.hint)
    except LsrIndexError as exc:
        send("error", str(exc))
    except BaseException as exc:  # one line for the parent, whatever it was
        send("error", f"reading the input failed: {type(exc).__name__}: {exc}")
    if sys.stderr:
        sys.stderr.flush()
    os._exit(0)  # not through the interpreter's shutdown, which a thread blocked on stdin would abort


def skipped_records(reader: CorpusReader) -> list[dict]:
    """The records a reader skipped, as the skipped report lists them."""
    return [{"file": s.path, "line": s.where, "id": s.doc_id, "reason": s.reason} for s in reader.skipped]


def _expandable_cuda_memory() -> None:
    """Let PyTorch's CUDA allocator grow segments instead of caching fixed-size blocks, unless the user set its
    options. Every length bucket has its own shape, and so do its activations and its [batch, vocabulary] output:
    fixed blocks fragment, and the allocator frees and allocates (cudaFree waits for the GPU). Same H200 host, two
    rounds: BERT-base 131k end to end 17,988 / 17,477 → 19,759 / 18,666 docs/s (benchmarks/NOTES_encode.md). Read at
    the allocator's first use: a process that used CUDA memory before keeps its settings."""
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")


def _reuse_freed_memory() -> None:
    """On CPU each batch allocates and frees blocks of tens of MB (the body's activations; the LM head's [tokens,
    vocabulary chunk] blocks of up to 256 MB did too, before they were cut to cache size: kernels/reference.py). glibc
    serves blocks past 32 MB with mmap and unmaps them on free, so each block faulted in ~65,000 fresh zeroed pages:
    a quarter to a third of CPU encode time was system time (SciFact, 300 documents on 2 cores: 2.5 M minor faults,
    7.5 s system of 30 s). Serving large blocks from the heap and keeping it across frees reuses those pages
    (1.07 M faults, 3.8 s system, the same user time and bytes; set at process start through MALLOC_MMAP_MAX_=0 the
    same tuning gave 0.41 M and 2.0 s; all measured with the head's old blocks)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc: nothing to tune
        return
    mallopt(-4, 0)  # M_MMAP_MAX: no block served by mmap
    mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD: keep up to 1 GiB of freed heap instead of returning it at once


def _add_truncation(stats: _Stats, full_lengths: np.ndarray, max_length: int) -> None:
    """A piece's truncation counts, from its one tokenization (no text is tokenized twice)."""
    stats.truncated = int((full_lengths > max_length).sum())
    stats.longest = int(full_lengths.max()) if len(full_lengths) else 0
