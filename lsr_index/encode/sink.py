"""Where a task's vectors go: shard files written in piece order on a thread of their own, checkpointed as hidden
chunks every `checkpoint_seconds`, and published whole (one file, or its chunks concatenated) with the shard's last
piece.
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

from lsr_index.encode.job import Assignment, EncodeJob, Piece, PieceStats, digest_hex
from lsr_index.vectors.manifest import Chunk, Part, Shard
from lsr_index.vectors.quantize import SparseVectors
from lsr_index.vectors.serializers import SerializerPool
from lsr_index.vectors.shards import ShardWriter, blocks, chunk_file, concatenate, shard_file


@dataclass
class _Open:
    """A shard being written: its earlier checkpoints, and the writer of the piece run since the last one."""

    chunks: list[Chunk]
    writer: ShardWriter | None = None
    start: int = 0  # first document of the writer's run
    opened: float = 0.0
    stats: PieceStats = field(default_factory=PieceStats)


class ShardSink:
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

    def put(self, piece: Piece, ids: list[str] | None, vectors: SparseVectors | None, stats: PieceStats) -> None:
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
               vectors: SparseVectors | None, payload: list[tuple[Future, int, int]] | None, stats: PieceStats) -> None:
        state = shards.setdefault(shard, _Open(list(self.assignment.chunks.get(shard, ()))))
        if ids is not None:
            if state.writer is None:
                state.writer = ShardWriter(self.out / shard_file(shard, self.fmt), self.fmt, self.vocab)
                state.start, state.opened, state.stats = start, time.monotonic(), PieceStats()
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
            stats = PieceStats()
            for chunk in state.chunks:
                stats.add(PieceStats.of(chunk))
            docs, nonzeros = sum(c.docs for c in state.chunks), sum(c.nonzeros for c in state.chunks)
        return Shard(file=shard_file(shard, self.fmt), start=self.job.shard_range(shard)[0], docs=docs,
                     nonzeros=nonzeros, sha256=sha, input=digest_hex(stats.digest), truncated=stats.truncated,
                     longest=stats.longest, capped=stats.capped)
