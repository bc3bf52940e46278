"""A task's input: the job's pieces read, cut, digested and tokenized, in threads or, beside a GPU, in a process of
their own (InputProcess), so that the thread launching the model's kernels keeps the GIL.
"""

from __future__ import annotations

import os
import pickle
import queue
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import BinaryIO

import numpy as np
import pyarrow as pa

from lsr_index.encode.job import Assignment, EncodeJob, Piece, PieceStats, input_digest, pieces
from lsr_index.errors import InputError, LsrIndexError
from lsr_index.inputs.corpus import CorpusReader, string_array
from lsr_index.model.tokens import TextTokenizer, Tokens
from lsr_index.runtime.children import PythonChild, end_with_stdin, send_message
from lsr_index.runtime.threads import Prefetch, put_unless_stopped


def tokenized_pieces(job: EncodeJob, assignment: Assignment, stream: Iterable[Piece], tokenizer: TextTokenizer,
                     after_each: Callable[[], object] = lambda: None
                     ) -> Iterator[tuple[Piece, list[str] | None, Tokens | None, PieceStats]]:
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
                ) -> Iterator[tuple[Piece, list[str] | None, list[str] | None, PieceStats]]:
    """The pieces of `stream` to encode as id and text lists, with their digests and capped counts; a piece with
    nothing left to encode (checkpointed earlier) as (piece, None, None, PieceStats()) when it ends its shard. Pieces of
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
                yield piece, None, None, PieceStats()
            continue
        for part in parts:
            if part.end <= checkpointed:
                continue
            if part.start < checkpointed:  # cut otherwise by the run that checkpointed (another window)
                part = part.part(checkpointed, part.end)
            ids, texts = part.rows.column("id").to_pylist(), part.rows.column("text").to_pylist()
            capped = sum(len(t) >= job.max_chars for t in texts)
            yield part, ids, texts, PieceStats(input_digest(part.start, ids, texts), capped=capped)
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


def tokenize_pieces(items: Iterable[tuple[Piece, list[str] | None, list[str] | None, PieceStats]],
                    tokenizer: TextTokenizer, max_length: int
                    ) -> Iterator[tuple[Piece, list[str] | None, Tokens | None, PieceStats]]:
    """read_pieces' pieces with their texts tokenized, and their truncation counted into their stats."""
    for piece, ids, texts, stats in items:
        tokens = None
        if texts is not None:
            tokens = tokenizer.tokenize(texts, max_length)
            _add_truncation(stats, tokens.full_lengths, max_length)
        yield piece, ids, tokens, stats


def reads_in_a_process(device: str) -> bool:
    """Whether a task reads and tokenizes in a process of its own (InputProcess) rather than in threads."""
    return device.startswith("cuda")


def serialized_tokenizer(tokenizer: TextTokenizer) -> str | None:
    """The Rust tokenizer as JSON for the input process, or None if it holds Python parts (0.3 s of the GIL for
    XLM-R's 250k pieces, taken while the model loads in its own thread)."""
    try:
        return tokenizer.backend.to_str()
    except Exception:  # tokenizers raises a plain Exception for a custom pre-tokenizer
        return None


_INPUT_AHEAD = 3  # pieces the input process may hold ready ahead of the model


class InputProcess(Iterator[tuple[Piece, list[str] | None, "Tokens | None", PieceStats]]):
    """The task's pieces read, digested and tokenized in a process of its own, as `tokenized()` yields them.

    Beside a GPU, the thread that launches the model's kernels is the limit, and reading (JSON parsing, ~12 µs a
    document) and building token lists are Python work that took the GIL from it: on an H100 the GPU idled 2.2 s of
    a 6.7 s BERT-base run, each gap waiting for a late launch while that thread ran Python (benchmarks/gpu_busy.py).
    Here they run on other cores under another GIL (same host, alternated: 20.4k → 26.8k docs/s after start-up).

    Its messages (children.PythonChild): pieces with their rows reduced to the ids, then the stream's end or its
    error, rebuilt here as the same exception."""

    def __init__(self, job: EncodeJob, assignment: Assignment, tokenizer_json: str, child: PythonChild | None = None):
        """`child`: one started ahead (input_child), else one starts now."""
        self.total_docs, self.skipped = 0, []
        self._ended = self._finished = False  # no more items; the child sent the stream's end
        self._items: queue.Queue = queue.Queue(maxsize=_INPUT_AHEAD)
        self._stop = threading.Event()
        self._child = child or input_child()
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
        return put_unless_stopped(self._items, item, self._stop)

    def __next__(self) -> tuple[Piece, list[str] | None, Tokens | None, PieceStats]:
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


def input_child() -> PythonChild:
    return PythonChild("lsr_index.encode.feed:input_main", "the input-reading process")


def input_main(out: BinaryIO) -> None:
    """The input process (see InputProcess): its set-up from stdin, then ("piece", piece with its ids only, tokens,
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


def _add_truncation(stats: PieceStats, full_lengths: np.ndarray, max_length: int) -> None:
    """A piece's truncation counts, from its one tokenization (no text is tokenized twice)."""
    stats.truncated = int((full_lengths > max_length).sum())
    stats.longest = int(full_lengths.max()) if len(full_lengths) else 0
