"""An encode job: its settings, and how its document stream divides into shards and pieces.

Documents are numbered in stream order; shard k holds documents [k·shard_docs, (k+1)·shard_docs). The reader's
batches (each within one input unit: lsr_index.inputs.units) cut at shard edges are the job's pieces: what is
tokenized, encoded and written together. The pieces depend only on the input and the settings, never on how many
workers share the units or where a run started, so any run encodes exactly the batches an uninterrupted one-worker
run would have (the same vectors, byte for byte).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from hashlib import blake2b
from pathlib import Path

import pyarrow as pa

from lsr_index.errors import LsrIndexError
from lsr_index.inputs.corpus import CorpusReader, Fields
from lsr_index.model.ref import ModelRef
from lsr_index.runtime.durable import real_path
from lsr_index.settings import CHARS_PER_TOKEN, DEFAULTS, DTYPE, MAX_TOKENS, check
from lsr_index.vectors.manifest import Chunk, Part
from lsr_index.vectors.quantize import Quantization

_DIGEST_MOD = 1 << 128


@dataclass(frozen=True)
class EncodeOptions:
    doc_max_length: int = DEFAULTS["doc_max_length"]
    query_max_length: int = DEFAULTS["query_max_length"]
    max_tokens: int = MAX_TOKENS["cpu"]  # padded tokens per forward pass: bounds activation memory, not corpus size
    shard_docs: int = DEFAULTS["shard_docs"]
    output_format: str = DEFAULTS["output_format"]
    quantization: Quantization = field(default_factory=Quantization)
    backend: str = DEFAULTS["backend"]
    overwrite: bool = False
    progress: bool = True
    checkpoint_seconds: float = DEFAULTS["checkpoint_seconds"]  # checkpointed at a piece end before this passes
    piece_docs: int | None = None  # documents encoded together; None: enough to fill a forward pass (a GPU's)
    threads: int | None = None  # compute threads of a task on CPU; None: the cores this process may use

    def __post_init__(self) -> None:
        for name in ("doc_max_length", "query_max_length", "max_tokens", "shard_docs", "output_format", "backend",
                     "checkpoint_seconds", "piece_docs", "threads"):
            check(name, getattr(self, name))
        if not isinstance(self.quantization, Quantization):
            raise LsrIndexError(f"quantization must be a Quantization, got {self.quantization!r}")


@dataclass(frozen=True)
class EncodeJob:
    """Everything a worker process needs to rebuild its reader and model (picklable). A model given by name is
    resolved and identified here, once: workers receive the reference, not the name."""

    inputs: tuple[str, ...]
    model: ModelRef | str = DEFAULTS["model"]
    query_model: ModelRef | str | None = None  # a separate query encoder; None: the document model's own route
    dtype: str = DTYPE["cpu"]
    fields: Fields = field(default_factory=Fields)
    on_error: str = "fail"
    options: EncodeOptions = field(default_factory=EncodeOptions)
    output: str | None = None  # the run's output directory, resolved (for_output): never read back as input

    def __post_init__(self) -> None:
        check("dtype", self.dtype)
        object.__setattr__(self, "model", ModelRef.resolve(self.model))
        if self.query_model is not None:
            object.__setattr__(self, "query_model", ModelRef.resolve(self.query_model))

    def for_output(self, out: Path) -> EncodeJob:
        return replace(self, output=str(real_path(out)))

    @property
    def window(self) -> int:
        """Documents tokenized, bucketed by length and written together (a piece's most). A GPU's fills its
        forward passes; a CPU's is small, because a chunk is checkpointed only at a piece's end (CPU_PIECE_DOCS)."""
        return self.options.piece_docs or min(max(self.options.max_tokens // 16, 256), 16384)

    @property
    def max_chars(self) -> int:
        return self.options.doc_max_length * CHARS_PER_TOKEN

    def reader(self) -> CorpusReader:
        return CorpusReader(list(self.inputs), fields=self.fields, on_error=self.on_error, batch_size=self.window,
                            max_chars=self.max_chars, exclude=Path(self.output) if self.output else None)

    def shard_range(self, shard: int) -> tuple[int, int]:
        """Documents [lo, hi) of a full shard (the stream's last shard may end sooner)."""
        return shard * self.options.shard_docs, (shard + 1) * self.options.shard_docs


@dataclass(frozen=True)
class Piece:
    """Documents [start, start + len(rows)) of shard `shard`."""

    shard: int
    start: int
    rows: pa.RecordBatch

    @property
    def end(self) -> int:
        return self.start + self.rows.num_rows

    def digest(self) -> int:
        return input_digest(self.start, self.rows.column("id").to_pylist(), self.rows.column("text").to_pylist())


def cut_at_shards(first: int, rows: pa.RecordBatch, shard_docs: int) -> list[Piece]:
    """A batch whose first document is number `first`, cut at shard edges."""
    cut, lo, end = [], first, first + rows.num_rows
    while lo < end:
        shard = lo // shard_docs
        hi = min(end, (shard + 1) * shard_docs)
        cut.append(Piece(shard, lo, rows.slice(lo - first, hi - lo)))
        lo = hi
    return cut


def pieces(batches: Iterable[pa.RecordBatch], shard_docs: int) -> Iterator[Piece]:
    """The pieces of a stream of batches numbered from document 0 (a CorpusReader's)."""
    position = 0
    for batch in batches:
        yield from cut_at_shards(position, batch, shard_docs)
        position += batch.num_rows


def input_digest(start: int, ids: Sequence[str], texts: Sequence[str]) -> int:
    """Sum of 128-bit digests of (position, id, text): the digest of a run of documents is the sum of its parts'
    (mod 2¹²⁸), so checkpoints of a shard combine into the shard's own, and any change to a document, or to its
    position, changes it."""
    total = 0
    for position, (doc_id, text) in enumerate(zip(ids, texts), start):
        h = blake2b(f"{position}\0{doc_id}\0".encode(), digest_size=16)
        h.update(text.encode("utf-8", "surrogatepass"))
        total += int.from_bytes(h.digest(), "little")
    return total % _DIGEST_MOD


def digest_hex(value: int) -> str:
    return f"{value % _DIGEST_MOD:032x}"


@dataclass
class PieceStats:
    """What a piece adds to its part's record besides vectors: its input digest and truncation counts."""

    digest: int = 0
    truncated: int = 0
    longest: int = 0
    capped: int = 0

    def add(self, other: PieceStats) -> None:
        self.digest += other.digest
        self.truncated += other.truncated
        self.longest = max(self.longest, other.longest)
        self.capped += other.capped

    @staticmethod
    def of(part: Part) -> PieceStats:
        return PieceStats(int(part.input, 16), part.truncated, part.longest, part.capped)

@dataclass(frozen=True)
class Assignment:
    """What a run has encoded already: the shards published and the chunks recorded (checkpoints), which every task
    of the run leaves out."""

    done: frozenset[int] = frozenset()
    chunks: tuple[Chunk, ...] = ()

    def covered(self, piece: Piece) -> bool:
        """Whether `piece` is encoded already: in a published shard, or inside a recorded chunk."""
        return piece.shard in self.done or any(c.start <= piece.start and piece.end <= c.end for c in self.chunks
                                               if c.shard == piece.shard)
