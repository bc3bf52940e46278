"""A task's input: the units it claims read, numbered by the run's sequencer, cut into pieces, digested and
tokenized, in threads or, beside a GPU, in a process of their own (InputProcess), so that the thread launching the
model's kernels keeps the GIL.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence, Set
from typing import BinaryIO

import numpy as np
import pyarrow as pa

from lsr_index.encode.job import Assignment, EncodeJob, Piece, PieceStats, cut_at_shards, input_digest
from lsr_index.encode.units import Numberings, RemoteUnits, Units
from lsr_index.errors import InputError, LsrIndexError
from lsr_index.inputs.corpus import CorpusReader, ParsedBatch, batch_of, string_array
from lsr_index.model.tokens import TextTokenizer, Tokens
from lsr_index.runtime.children import PythonChild, send_message
from lsr_index.runtime.threads import Prefetch, Stock
from lsr_index.runtime.timeline import mark

Feed = Iterator[tuple[Piece, list[str], "Tokens", PieceStats]]
_PARSED_AHEAD = 16  # parsed batches a task holds ahead of its pieces: about a unit, so its next unit is being parsed


def tokenized_pieces(job: EncodeJob, assignment: Assignment, units: Units | RemoteUnits, tokenizer: TextTokenizer,
                     after_each: Callable[[], object] = lambda: None) -> Feed:
    """The pieces of the units this task claims (read_pieces), tokenized: reading and parsing (Python work under the
    GIL) run in threads of their own while a piece is tokenized (in Rust, on every core, without the GIL)."""
    ahead = Prefetch(read_pieces(job, assignment, units, after_each=after_each), name="read")
    try:
        yield from tokenize_pieces(ahead, tokenizer, job.options.doc_max_length)
    finally:
        ahead.close()


def read_pieces(job: EncodeJob, assignment: Assignment, units: Units | RemoteUnits,
                after_each: Callable[[], object] = lambda: None
                ) -> Iterator[tuple[Piece, list[str], list[str], PieceStats]]:
    """The pieces to encode of the units this task claims, as id and text lists, with their digests and capped
    counts: each unit is parsed (a unit ahead, in a thread), its batches numbered by the run's sequencer, cut at
    shard edges; pieces encoded already (`assignment`) are left out. `after_each` runs after each piece is taken."""
    reader = job.reader()
    numberings = Numberings()
    parsed = Prefetch(_claimed(reader, units, numberings.put), depth=_PARSED_AHEAD, name="parse")
    try:
        for batch in parsed:
            numbered = numberings.get(batch.summary.unit, batch.summary.batch)
            ids, texts = numbered.kept(batch.ids), numbered.kept(batch.texts)
            if not ids:
                continue
            for piece in cut_at_shards(numbered.first, batch_of(ids, texts), job.options.shard_docs):
                if not assignment.covered(piece):
                    yield with_stats(job, piece)
                    after_each()
    finally:
        parsed.close()


def with_stats(job: EncodeJob, piece: Piece) -> tuple[Piece, list[str], list[str], PieceStats]:
    """A piece as the tokenizer takes it: its ids and texts, with its input digest and its count of texts cut at the
    reader's character bound."""
    ids, texts = piece.rows.column("id").to_pylist(), piece.rows.column("text").to_pylist()
    capped = sum(len(t) >= job.max_chars for t in texts)
    return piece, ids, texts, PieceStats(input_digest(piece.start, ids, texts), capped=capped)


def numbered_pieces(job: EncodeJob, units: Units) -> Iterator[Piece]:
    """Every piece of the stream, read here unit after unit (a cluster's driver reads its input this way)."""
    reader = job.reader()
    numberings = Numberings()
    for batch in _claimed(reader, units, numberings.put):
        numbered = numberings.get(batch.summary.unit, batch.summary.batch)
        ids, texts = numbered.kept(batch.ids), numbered.kept(batch.texts)
        if ids:
            yield from cut_at_shards(numbered.first, batch_of(ids, texts), job.options.shard_docs)


def _claimed(reader: CorpusReader, units: Units | RemoteUnits, deliver: Callable) -> Iterator[ParsedBatch]:
    """The batches of every unit this task claims, each submitted for numbering as it is parsed."""
    while (unit := units.claim()) is not None:
        for batch in reader.parse(unit):
            units.submit(batch.summary, deliver)
            yield batch


def tokenize_pieces(items: Iterable[tuple[Piece, list[str], list[str], PieceStats]], tokenizer: TextTokenizer,
                    max_length: int) -> Feed:
    """read_pieces' pieces with their texts tokenized, and their truncation counted into their stats."""
    for piece, ids, texts, stats in items:
        tokens = tokenizer.tokenize(texts, max_length)
        _add_truncation(stats, tokens.full_lengths, max_length)
        yield piece, ids, tokens, stats


def reads_in_a_process(device: str) -> bool:
    """Whether a task reads and tokenizes in a process of its own (InputProcess) rather than in threads."""
    return device.startswith("cuda")


def serialized_tokenizer(tokenizer: TextTokenizer) -> str | None:
    """The Rust tokenizer as JSON for the input process, or None if it holds Python parts (a noticeable fraction of a
    second of the GIL at XLM-R's 250k pieces, taken while the model loads in its own thread)."""
    try:
        return tokenizer.backend.to_str()
    except Exception:  # tokenizers raises a plain Exception for a custom pre-tokenizer
        return None


# Tokens the input process may hold ready ahead of the model (64 MiB of ids). It starts with the task and reads while
# the model loads and warms up, seconds on a GPU host: on real text, where tokenizing is slower than the GPU, what it
# tokenized meanwhile is encoded at the GPU's own rate, and the run ends sooner. Bounded in tokens, not pieces, since a
# piece holds anything from a unit's tail to a window of documents.
_INPUT_AHEAD_TOKENS = 1 << 23


class InputProcess(Iterator[tuple[Piece, list[str], "Tokens", PieceStats]]):
    """The task's pieces read, numbered, digested and tokenized in processes of their own, as `tokenized_pieces`
    yields them, in the order they are ready.

    Beside a GPU, the thread that launches the model's kernels is the limit, and reading (JSON parsing) and building
    token lists are Python work that would take the GIL from it: the GPU then idles, each gap waiting for a late
    launch while that thread runs Python (benchmarks/gpu_busy.py). Here they run on other cores under other GILs:
    one process's Python work (parsing, building token lists) bounds what it reads at a fraction of what its cores
    tokenize, so a task with many cores reads with several (readers_for), each claiming units of its own.

    Each child's messages (children.PythonChild): its claims of units and the summaries of what it parsed, passed to
    this task's `units` (whose answers go back down its stdin), its pieces with their rows reduced to the ids, then
    the end of its units or its error, rebuilt here as the same exception."""

    def __init__(self, job: EncodeJob, assignment: Assignment, units: Units | RemoteUnits, tokenizer_json: str,
                 children: Sequence[PythonChild] = (), threads: int | None = None):
        """`children`: input processes started ahead (input_child), else one starts now. `threads`: the tokenizer's
        threads in each (None: its default, every core)."""
        self._units = units
        self._children = list(children) or [input_child()]
        self._ended = False  # no more items
        self._finished: set[PythonChild] = set()  # the children that sent their end
        self._first_piece = threading.Lock()  # held from the first piece on (for the timeline)
        self._stop = threading.Event()
        self._items = Stock(_INPUT_AHEAD_TOKENS, self._stop)
        self._sending = {child: threading.Lock() for child in self._children}
        try:  # both directions in threads: the set-up (XLM-R's tokenizer is 17 MB) is read once the child runs
            for child in self._children:
                threading.Thread(target=self._send_setup, args=(child, (job, assignment, tokenizer_json, threads)),
                                 name="input-send", daemon=True).start()
                threading.Thread(target=self._receive, args=(child,), name="input-receive", daemon=True).start()
        except BaseException:
            self.close()
            raise

    def _send_setup(self, child: PythonChild, setup: tuple) -> None:
        try:
            self._send(child, setup)
        except (OSError, ValueError):
            return  # it ended already: _receive reports how
        except BaseException as exc:
            child.process.terminate()
            self._put(("error", f"cannot hand the input-reading process its set-up: {type(exc).__name__}: {exc}"))
        # stdin stays open: its end is how the child learns that this process is gone

    def _send(self, child: PythonChild, message: object) -> None:
        with self._sending[child]:
            pickle.dump(message, child.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            child.stdin.flush()

    def _answer(self, child: PythonChild, *message: object) -> None:
        with contextlib.suppress(OSError, ValueError):  # it ended: _receive reports how
            self._send(child, message)

    def _receive(self, child: PythonChild) -> None:
        try:
            while True:
                message = pickle.load(child.messages)
                if message[0] == "claim":
                    self._answer(child, "unit", self._units.claim())
                elif message[0] == "summary":
                    self._units.submit(message[1], lambda numbered: self._answer(child, "numbered", numbered))
                elif message[0] == "piece":
                    if self._first_piece.acquire(blocking=False):  # one reader's thread wins, once
                        mark("first tokenized piece received")
                    if not self._put(message, len(message[2].ids)):
                        return
                else:
                    self._put((message[0], child) if message[0] == "end" else message)
                    return
        except (EOFError, OSError, ValueError, pickle.UnpicklingError):
            self._put(("died", child))
        except InputError as exc:  # a bad record, found in stream order by the run's sequencer
            self._put(("input_error", exc.path, exc.where, exc.reason, exc.hint))
        except LsrIndexError as exc:
            self._put(("error", str(exc)))
        except BaseException as exc:
            self._put(("error", f"lost the input-reading process's stream: {type(exc).__name__}: {exc}"))

    def _put(self, item: tuple, tokens: int = 0) -> bool:
        return self._items.put(item, tokens)

    def __next__(self) -> tuple[Piece, list[str], Tokens, PieceStats]:
        while not self._ended:
            kind, *body = self._items.get()
            if kind == "piece":
                piece, tokens, stats = body
                return piece, piece.rows.column("id").to_pylist(), tokens, stats
            if kind == "end":
                self._finished.add(body[0])
                self._ended = len(self._finished) == len(self._children)
                continue
            self._ended = True
            if kind == "input_error":
                raise InputError(*body)
            if kind == "error":
                raise LsrIndexError(body[0])
            child = body[0]
            child.process.terminate()  # its stream broke while it may still run
            code = child.exit_code(10)
            raise LsrIndexError(f"the input-reading process ended unexpectedly (exit code {code}); rerun the same "
                                "command to resume")
        raise StopIteration

    def close(self) -> None:
        """End the processes (at once unless they finished) and reap them: all are told first, so that none reads
        on while another is reaped."""
        self._stop.set()
        close_all(self._children, finished=self._finished)


def readers_for(cores: int) -> int:
    """Input processes for a task with `cores` host cores: one per 8 (up to 8), so that their Python work keeps
    pace with what their cores tokenize (a process reads at most about as fast as 8-16 cores tokenize real text)."""
    return max(1, min(8, cores // 8))


def input_child() -> PythonChild:
    return PythonChild("lsr_index.encode.feed:input_main", "the input-reading process")


def input_children(n: int) -> list[PythonChild]:
    """`n` input processes, started; none left running if one cannot start."""
    children: list[PythonChild] = []
    try:
        for _ in range(n):
            children.append(input_child())
    except BaseException:
        close_all(children)
        raise
    return children


def close_all(children: Sequence[PythonChild], finished: Set[PythonChild] = frozenset()) -> None:
    """End `children` (at once, unless in `finished`: they exit by themselves) and reap them."""
    for child in children:
        if child not in finished and child.process.poll() is None:
            child.process.terminate()
    for child in children:
        child.close(finished=child in finished)


def input_main(out: BinaryIO) -> None:
    """The input process (see InputProcess): its set-up from stdin, then ("claim",) and ("summary", summary) requests
    answered through stdin, ("piece", piece with its ids only, tokens, stats) per piece, and ("end",), ("input_error",
    path, line, reason, hint) or ("error", one line), pickled to `out`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # not its to handle, even if it reaches this process group
    lock = threading.Lock()  # messages come from its reading thread and from this one

    def send(*message: object) -> None:
        with lock:
            send_message(out, *message)

    try:
        job, assignment, tokenizer_json, threads = pickle.load(sys.stdin.buffer)
    except BaseException:
        os._exit(1)  # the parent ended while sending
    if threads:  # read when the tokenizer first runs in parallel, below
        os.environ["RAYON_NUM_THREADS"] = str(threads)
    units = RemoteUnits(send)
    threading.Thread(target=listen, args=(sys.stdin.buffer, units), daemon=True).start()
    try:
        from tokenizers import Tokenizer

        tokenizer = TextTokenizer(Tokenizer.from_str(tokenizer_json))
        for piece, ids, tokens, stats in tokenized_pieces(job, assignment, units, tokenizer):
            # the ids anew, compact: a slice of the reader's batch would pickle the whole batch's buffers
            rows = pa.RecordBatch.from_arrays([string_array(ids)], ["id"])
            send("piece", Piece(piece.shard, piece.start, rows), tokens, stats)
        send("end")
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


def listen(stdin: BinaryIO, units: RemoteUnits) -> None:
    """A child's stdin after its set-up: the answers to its requests for units, until it ends; its end (the parent
    closed it, or is gone) ends the process."""
    while True:
        try:
            kind, body = pickle.load(stdin)
        except Exception:
            os._exit(1)
        units.receive(kind, body)


def _add_truncation(stats: PieceStats, full_lengths: np.ndarray, max_length: int) -> None:
    """A piece's truncation counts, from its one tokenization (no text is tokenized twice)."""
    stats.truncated = int((full_lengths > max_length).sum())
    stats.longest = int(full_lengths.max()) if len(full_lengths) else 0
