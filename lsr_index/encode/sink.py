"""Where a task's vectors go: chunk files, written in piece order on a thread of their own, each a run of consecutive
documents of one shard. A chunk ends at its shard's end, where the task's next piece does not follow it (another task,
or another of its input processes, encodes what lies between), and at the last piece end before `checkpoint_seconds`
pass since its first document began encoding (what a crash or Ctrl-C can lose); each finished chunk is reported, and
the plan publishes a shard once its chunks cover it (shards.concatenate gives the bytes one uninterrupted writer
would have).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lsr_index.encode.job import EncodeJob, Piece, PieceStats, digest_hex
from lsr_index.vectors.manifest import Chunk
from lsr_index.vectors.quantize import SparseVectors
from lsr_index.vectors.serializers import SerializerPool
from lsr_index.vectors.shards import ShardWriter, blocks, chunk_file


@dataclass
class _Open:
    """A chunk being written: its shard, its first document, when its first piece began encoding, and what its pieces
    add to its record."""

    shard: int
    start: int
    writer: ShardWriter
    began: float
    stats: PieceStats = field(default_factory=PieceStats)

    @property
    def end(self) -> int:
        return self.start + self.writer.docs


class ChunkSink:
    """Writes pieces on its own thread, in the order they are put, into chunk files; `emit` gets each finished chunk.

    With a `pool` (its encoder's serializer processes), JSON/gzip serialization runs there, each piece's blocks
    (shards.blocks) side by side: it is per-document Python work that would otherwise hold the GIL the encoder
    needs. The writer thread appends their bytes in order."""

    def __init__(self, out: Path, job: EncodeJob, vocab: np.ndarray, emit: Callable[[Chunk], None],
                 pool: SerializerPool | None, serializers: int):
        self.out, self.job, self.vocab, self.emit = out, job, vocab, emit
        self.fmt = job.options.output_format
        self.pool = pool
        self.queue: queue.Queue = queue.Queue(maxsize=2 * serializers + 4)
        self.error: BaseException | None = None
        self.last_done = 0.0  # when the last piece was put: pieces overlap, so a piece takes from then or its start
        self.thread = threading.Thread(target=self._work, name="sink", daemon=True)
        self.thread.start()

    def put(self, piece: Piece, ids: list[str], vectors: SparseVectors, stats: PieceStats, started: float) -> None:
        """Queue a piece's vectors; `started`: when its encoding began (time.monotonic)."""
        if self.error:
            raise self.error
        payload = [(self.pool.submit(block_ids, block, self.fmt), len(block_ids), block.nnz)
                   for block_ids, block in blocks(ids, vectors)] if self.pool else None
        now = time.monotonic()
        timing = (started, now, now - max(started, self.last_done))
        self.last_done = now
        self.queue.put((piece, ids, vectors, payload, stats, timing))

    def close(self, wait: bool = True) -> None:
        """After the last piece: the open chunk is finished and reported (`wait`), or dropped (a failed run)."""
        self.queue.put(None if wait else False)
        self.thread.join()
        if self.error and wait:
            raise self.error

    def _work(self) -> None:
        chunk: _Open | None = None
        try:
            while item := self.queue.get():
                chunk = self._write(chunk, *item)
            if item is None and chunk is not None:
                self.emit(self._finish(chunk))
                chunk = None
        except BaseException as exc:
            self.error = exc
            while self.queue.get():  # drain so the producer never blocks
                pass
        finally:
            if chunk is not None:  # unfinished: never reported
                chunk.writer.abort()

    def _write(self, chunk: _Open | None, piece: Piece, ids: list[str], vectors: SparseVectors,
               payload: list[tuple[Future, int, int]] | None, stats: PieceStats,
               timing: tuple[float, float, float]) -> _Open | None:
        started, done, took = timing
        if chunk is not None and (chunk.shard != piece.shard or chunk.end != piece.start):
            self.emit(self._finish(chunk))  # the piece does not follow it: another task or reader has what lies between
            chunk = None
        if chunk is None:
            writer = ShardWriter(self.out / chunk_file(piece.shard, piece.start, self.fmt), self.fmt, self.vocab)
            chunk = _Open(piece.shard, piece.start, writer, started)
        if payload is not None:
            for block, docs, nonzeros in payload:
                chunk.writer.add_serialized(block.result(), docs, nonzeros)
        else:
            chunk.writer.add(ids, vectors)
        chunk.stats.add(stats)
        shard_end = (piece.shard + 1) * self.job.options.shard_docs
        # checkpointed now if the next piece, taking as long as this one, would end past the bound
        if piece.end == shard_end or done + took - chunk.began >= self.job.options.checkpoint_seconds:
            self.emit(self._finish(chunk))
            return None
        return chunk

    def _finish(self, chunk: _Open) -> Chunk:
        name = chunk_file(chunk.shard, chunk.start, self.fmt)
        sha = chunk.writer.finish()
        s = chunk.stats
        return Chunk(file=name, start=chunk.start, docs=chunk.writer.docs, nonzeros=chunk.writer.nonzeros, sha256=sha,
                     input=digest_hex(s.digest), truncated=s.truncated, longest=s.longest, capped=s.capped,
                     shard=chunk.shard)
