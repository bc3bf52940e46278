"""Corpus reading: JSONL / Arrow IPC / Parquet shards streamed as (id, text) Arrow record batches.

Every record either becomes a document or is reported: with ``on_error="fail"`` as an InputError that
names the file and the 1-based line (JSONL) or row (Arrow/Parquet), with ``on_error="skip"`` as a
``Skipped`` entry. Problems with a whole file (unreadable, corrupt, truncated, wrong columns) always
fail, because skipping them would drop an unknown number of documents. docs/bad-input.md lists every case.
"""

from __future__ import annotations

import codecs
import os
from collections.abc import Collection, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from hashlib import blake2b
from pathlib import Path
from typing import Any, Literal

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from lsr_index.errors import InputError, LsrIndexError
from lsr_index.inputs.decompress import CORRUPT, open_decompressed
from lsr_index.inputs.ids import MAX_ID_BYTES, RepeatedField, check_id
from lsr_index.inputs.sequence import BatchSummary, Rejected, Sequencer, Skipped
from lsr_index.inputs.sources import compression, describe, file_format, resolve
from lsr_index.inputs.units import Unit, plan_units

SCHEMA = pa.schema([("id", pa.string()), ("text", pa.string())])

_ID_KEYS = ("id", "_id", "docid")
_TITLE_TEXT = ("title", "text")
_TEXT_KEYS = ("title", "text", "contents")
_ID_HINT = (
    f"an id becomes a column of whitespace-separated run and qrels files and a Lucene term: "
    f"no whitespace, no control characters, at most {MAX_ID_BYTES:,} UTF-8 bytes"
)
# A line this long is not a document but a binary or newline-less file: reading it whole would defeat
# constant memory.
_MAX_LINE_BYTES = 64 << 20
# Flush a batch early past this many characters, so that huge documents can neither exhaust memory nor
# overflow Arrow's 2 GiB limit on one string array (4 bytes per character at most).
_MAX_BATCH_CHARS = 1 << 28
# How much of a JSONL file's content is read to estimate its lines, and for how many files; the others are
# estimated from their size at the density measured on files compressed alike.
_SAMPLE_BYTES = 4 << 20
_SAMPLED_FILES = 8
_IPC_MAGIC = b"ARROW1"
# The end-of-stream marker: a continuation token and a zero length (before Arrow 0.15 the length alone).
_IPC_EOS = (b"\xff\xff\xff\xff\x00\x00\x00\x00", b"\x00\x00\x00\x00")
_IPC_UNREADABLE = "cannot read this Arrow IPC file"
_RECREATE = "re-create or re-download the file"


class FieldsError(LsrIndexError, ValueError):
    """Field names the reader cannot use (an empty --id-field or --text-field)."""


@dataclass(frozen=True)
class Fields:
    """Which record fields hold the id and the text.

    ``id=None`` takes the first present of "id", "_id", "docid". ``text=None`` takes "title" and "text"
    joined by one space (the title is optional) when "text" exists, else "contents". Listed text fields
    must exist; null or empty values add nothing to the join.
    """

    id: str | None = None
    text: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.text, str):  # Fields(text="body") would otherwise iterate characters
            object.__setattr__(self, "text", (self.text,))
        if self.id == "" or (self.text is not None and (not self.text or not all(self.text))):
            raise FieldsError(f"field names must be non-empty, got id={self.id!r} text={self.text!r}")
        if self.text is not None and len(set(self.text)) < len(self.text):  # a typo that would double the text
            raise FieldsError(f"a text field is named twice: {self.text!r}")

    def names(self) -> tuple[str, ...]:
        """Every field name the id or the text may be read from."""
        return ((self.id,) if self.id is not None else _ID_KEYS) + (self.text or _TEXT_KEYS)


class _Bad(Exception):
    """A bad record: raised and caught inside the reader, never escapes it."""

    def __init__(self, reason: str, doc_id: str | None = None, hint: str | None = None):
        super().__init__(reason)
        self.reason, self.doc_id, self.hint = reason, doc_id, hint


class CorpusReader:
    """Streams (id, text) Arrow record batches from JSONL (.jsonl/.ndjson/.json, plain or .gz/.bz2/.xz/.zst),
    Arrow IPC (.arrow/.feather/.ipc, file or stream format) and Parquet (.parquet) shards in constant memory.

    ``source`` is a file, a directory (its files, sorted by name), a glob pattern (``**`` recurses;
    sorted), or a list of these, read in the order given; lsr_index.inputs.sources says which files a source
    names, and ``passed_over`` lists the directory entries its rules leave out (``exclude``: an output
    directory). The files are read unit by unit (lsr_index.inputs.units), each cut into batches of at most
    ``batch_size`` rows, so the batches are those that any division of the work among readers gives (parse_unit,
    sequence.Sequencer). Ids must pass ``check_id`` and be unique across all shards; each iteration starts afresh
    (``skipped`` and ``n_docs`` are reset). Memory is bounded by one batch, one JSONL line, and for Parquet by one
    row group (Parquet decodes column chunks whole).
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        fields: Fields = Fields(),
        on_error: Literal["fail", "skip"] = "fail",
        batch_size: int = 1024,
        max_chars: int | None = None,
        exclude: Path | None = None,
    ):
        if on_error not in ("fail", "skip"):
            raise ValueError(f"on_error must be 'fail' or 'skip', not {on_error!r}")
        if batch_size < 1 or (max_chars is not None and max_chars < 1):
            raise ValueError(f"batch_size and max_chars must be positive: {batch_size}, {max_chars}")
        sources = [source] if isinstance(source, (str, os.PathLike)) else list(source)
        if not sources:
            raise ValueError("no corpus source given")
        self.fields, self.on_error, self.batch_size, self.max_chars = fields, on_error, batch_size, max_chars
        self.files, self.passed_over = resolve(sources, exclude)
        self.label = str(sources[0]) if len(sources) == 1 else f"{sources[0]} (+{len(sources) - 1} more)"
        self.skipped: list[Skipped] = []
        self.n_docs = 0

    def units(self) -> list[Unit]:
        return plan_units(self.files)

    def sequencer(self, units: list[Unit]) -> Sequencer:
        return Sequencer(units, self.on_error, self.label)

    def parse(self, unit: Unit) -> Iterator[ParsedBatch]:
        """The unit's documents in batches, before numbering (see parse_unit)."""
        return parse_unit(unit, self.fields, self.batch_size, self.max_chars)

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        self.skipped, self.n_docs = [], 0
        units = self.units()
        sequencer = self.sequencer(units)
        self.skipped = sequencer.skipped
        for unit in units:
            for parsed in self.parse(unit):
                [numbered] = sequencer.add(parsed.summary)
                self.n_docs = sequencer.n_docs
                ids, texts = numbered.kept(parsed.ids), numbered.kept(parsed.texts)
                if ids:
                    yield batch_of(ids, texts)
        sequencer.finish()

    def estimate_docs(self) -> tuple[int, bool]:
        """How many documents the input holds, for a progress bar: (count, exact). Parquet and Arrow files give
        their row counts, a JSONL file its lines (estimated from a sample unless read whole within it). Skipped
        records and blank lines make any count an upper bound; a file that cannot be read counts as empty here
        (reading it reports why)."""
        total, exact = 0, True
        density: dict[str | None, list[float]] = {}  # lines per byte on disk, by compression
        for path in self.files:
            try:
                if file_format(path) != "JSONL":
                    total += _table_rows(path)
                    continue
                kind = compression(path)
                if len(density.get(kind, ())) >= _SAMPLED_FILES:
                    measured = density[kind]
                    total += round(path.stat().st_size * sum(measured) / len(measured))
                    exact = False
                    continue
                lines, whole, consumed = _sample_lines(path, kind)
                total += lines if whole else round(lines * path.stat().st_size / consumed)
                exact = exact and whole
                density.setdefault(kind, []).append(lines / max(consumed, 1))
            except (LsrIndexError, pa.ArrowException, *CORRUPT):
                exact = False
        return total, exact



@dataclass
class ParsedBatch:
    """Documents of one unit, parsed and checked one by one, not yet numbered: the texts stay with the reader, the
    summary goes to the sequencer."""

    summary: BatchSummary
    texts: list[str]

    @property
    def ids(self) -> list[str]:
        return self.summary.ids


def batch_of(ids: list[str], texts: list[str]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([string_array(ids), string_array(texts)], schema=SCHEMA)


def id_hashes(ids: Sequence[str]) -> np.ndarray:
    """64-bit blake2b digests of the ids (not hash(): the same in every process, so any reader may compute them)."""
    return np.fromiter((int.from_bytes(blake2b(i.encode(), digest_size=8).digest(), "little") for i in ids),
                       np.uint64, len(ids))


def parse_unit(unit: Unit, fields: Fields, batch_size: int, max_chars: int | None) -> Iterator[ParsedBatch]:
    """A unit's documents in batches of at most `batch_size` (fewer where their texts reach _MAX_BATCH_CHARS), each
    with the records refused since the previous one; the last batch (possibly empty) says so. A file that cannot be
    read on ends the unit with its failure, after the documents read before it."""
    ids: list[str] = []
    texts: list[str] = []
    wheres: list[int] = []
    rejects: list[Rejected] = []
    chars = batch = 0
    counter = _Lines()
    failure = None
    try:
        for where, record in _records(unit, fields, batch_size, counter):
            try:
                doc_id, text = _document(fields, max_chars, record)
            except _Bad as bad:
                rejects.append(Rejected(where, bad.doc_id, bad.reason, bad.hint))
                continue
            ids.append(doc_id)
            texts.append(text)
            wheres.append(where)
            chars += len(text)
            if len(ids) == batch_size or chars >= _MAX_BATCH_CHARS:
                yield ParsedBatch(BatchSummary(unit.index, batch, ids, id_hashes(ids), wheres, rejects), texts)
                ids, texts, wheres, rejects, chars, batch = [], [], [], [], 0, batch + 1
    except InputError as exc:
        failure = exc
    yield ParsedBatch(BatchSummary(unit.index, batch, ids, id_hashes(ids), wheres, rejects, last=True,
                                   lines=counter.lines, failure=failure), texts)


class _Lines:
    """The lines a JSONL unit's reading has gone through (the next unit of the file numbers its lines after them)."""

    lines = 0


def _records(unit: Unit, fields: Fields, batch_size: int, counter: _Lines) -> Iterator[tuple[int, Any]]:
    """(where, record) pairs of one unit: a dict, or a _Bad for a record that could not be parsed."""
    path = unit.path
    try:
        if unit.fmt == "JSONL":
            yield from _jsonl_records(unit, RepeatedField(fields.names()), counter)
        else:
            yield from _table_records(unit, fields, batch_size)
    except (OSError, EOFError, UnicodeDecodeError, pa.ArrowException) as e:
        raise InputError(path, None, f"cannot read this {unit.fmt} file: {describe(e)}") from e


def _document(fields: Fields, max_chars: int | None, record: Any) -> tuple[str, str]:
    if isinstance(record, _Bad):
        raise record
    if not isinstance(record, dict):
        raise _Bad(f"expected a JSON object, got {_kind(record)}")
    id_key = _id_field(fields, record)
    if id_key is None:
        raise _Bad(f"no id field (expected {_id_expectation(fields)})")
    value = record[id_key]
    if type(value) is int:  # not bool, which is an int too
        doc_id = str(value)
    elif type(value) is str:
        doc_id = value
        problem = check_id(doc_id)
        if problem:  # doc_id left out of the report: the formats the id would go to cannot hold it
            raise _Bad(problem, hint=_ID_HINT)
    else:
        raise _Bad(f"id field {id_key!r} is {_kind(value)}, expected a string or an integer")
    text_keys, optional = _text_fields(fields, record)
    if not text_keys:
        raise _Bad(f"no text field (expected {_text_expectation(fields)})", doc_id)
    parts = []
    for key in text_keys:
        if key not in record:
            if key in optional:
                continue
            raise _Bad(f"no text field {key!r}", doc_id)
        value = record[key]
        if type(value) is str:
            if value:
                parts.append(value)
        elif value is not None:
            raise _Bad(f"text field {key!r} is {_kind(value)}, expected a string", doc_id)
    text = parts[0] if len(parts) == 1 else " ".join(parts)
    # An escaped \u0000 is legal JSON but an extraction artefact that C-level tools choke on.
    if "\x00" in text:
        text = text.replace("\x00", " ")
    if not text or text.isspace():
        raise _Bad("empty text" if not text else "text is only whitespace", doc_id)
    if max_chars is not None and len(text) > max_chars:
        text = text[:max_chars]
    return doc_id, text


def string_array(values: Sequence[str]) -> pa.Array:
    """Python strings as an Arrow string array, from their UTF-8 bytes. `pa.array` on a list would do the same, but
    its first call imports pandas (to ask whether the list is a pandas object): a noticeable fraction of a second
    inside the first batch of every run, on the path to the first forward pass, wherever pandas is installed
    (Pyserini installs it)."""
    if all(map(str.isascii, values)):  # characters are bytes: lengths come free, one encode of the whole batch
        data, parts = "".join(values).encode(), values
    else:
        parts = [value.encode() for value in values]
        data = b"".join(parts)
    offsets = np.zeros(len(values) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, parts), np.int64, len(values)), out=offsets[1:])
    if offsets[-1] >= 2**31:  # not from the reader: its batches end at _MAX_BATCH_CHARS, its lines at _MAX_LINE_BYTES
        raise ValueError(f"{offsets[-1]} bytes of text in one batch: more than an Arrow string array holds")
    return pa.Array.from_buffers(pa.string(), len(values), [None, pa.py_buffer(offsets.astype(np.int32)),
                                                            pa.py_buffer(data)])


def _jsonl_records(unit: Unit, repeated: RepeatedField, counter: _Lines) -> Iterator[tuple[int, Any]]:
    """(line, record) pairs of a JSONL unit, lines numbered from its start (the sequencer adds the file's lines
    before it); ``repeated`` finds an object naming a field it reads twice (which value is meant?)."""
    path = unit.path
    line_no = 0
    suffix = compression(path)
    stop = unit.stop if unit.stop is not None else float("inf")
    with open_decompressed(path, suffix) if suffix else open(path, "rb") as f:
        if unit.start:
            f.seek(unit.start)
        position = unit.start
        try:
            while position < stop and (line := f.readline(_MAX_LINE_BYTES)):
                position += len(line)
                line_no += 1
                counter.lines = line_no
                # Before parsing: the first _MAX_LINE_BYTES of a longer line may be valid JSON on their own
                # (an object, then spaces), and the rest would be read as another line.
                if len(line) == _MAX_LINE_BYTES and not line.endswith(b"\n") and (rest := f.readline(1)):
                    position += len(rest)
                    while rest and not rest.endswith(b"\n"):
                        rest = f.readline(_MAX_LINE_BYTES)
                        position += len(rest)
                    yield line_no, _Bad(f"line longer than {_MAX_LINE_BYTES} bytes")
                    continue
                if line_no == 1 and unit.starts_file and line.startswith(codecs.BOM_UTF8):
                    line = line[3:]
                try:
                    record = orjson.loads(line)
                except orjson.JSONDecodeError as e:
                    if line.strip():  # blank lines separate nothing and are not records
                        yield line_no, _json_problem(line, e)
                    continue
                # RepeatedField's first test, here too: a function call per line is a cost the reader's loop can see
                twice = type(record) is dict and line.count(b":") > len(record) and repeated(line, record)
                if twice:
                    yield line_no, _Bad(f"field {twice!r} appears more than once in the object",
                                        hint="which value is meant? keep one")
                else:
                    yield line_no, record
        except CORRUPT as e:
            if not suffix:
                raise
            raise InputError(
                path,
                None,
                f"compressed data is truncated or corrupt after line {line_no} ({describe(e)})",
                _RECREATE,
            ) from e


def _sample_lines(path: Path, kind: str | None) -> tuple[int, bool, int]:
    """(lines in the first _SAMPLE_BYTES of content, whether that was all of it, bytes on disk read for it);
    a file read whole counts its non-blank lines, its records."""
    with open(path, "rb") as raw:
        content = open_decompressed(raw, kind) if kind else raw
        sample = content.read(_SAMPLE_BYTES)
        whole = not content.read(1)
        if whole:  # every record: blank lines hold none
            return sum(1 for line in sample.split(b"\n") if line.strip()), True, raw.tell()
        return sample.count(b"\n"), False, raw.tell()


def _table_rows(path: Path) -> int:
    """The rows of a Parquet file (its footer) or of an Arrow IPC file or stream (its batches' headers)."""
    if file_format(path) == "Parquet":
        with pq.ParquetFile(path) as parquet:
            return parquet.metadata.num_rows
    with pa.memory_map(os.fspath(path)) as source:
        _, batches = _ipc_batches(path, source)
        return sum(batch.num_rows for batch in batches)


def _json_problem(line: bytes, error: orjson.JSONDecodeError) -> _Bad:
    if b"\x00" in line:
        return _Bad(f"raw NUL byte at byte {line.index(0) + 1}", hint="the file may be binary or UTF-16")
    try:
        line.decode("utf-8")
    except UnicodeDecodeError as e:
        return _Bad(f"invalid UTF-8 at byte {e.start + 1}", hint="the file must be UTF-8 encoded")
    return _Bad(
        f"malformed JSON: {error.msg} at column {error.colno}", hint="each line must be one JSON object"
    )


def _table_records(unit: Unit, fields: Fields, batch_size: int) -> Iterator[tuple[int, Any]]:
    """(row, record) pairs of a Parquet unit's row groups or of an Arrow IPC file, rows numbered in the file."""
    path = unit.path
    with ExitStack() as stack:
        if unit.fmt == "Parquet":
            parquet = stack.enter_context(pq.ParquetFile(path))
            columns = _columns(path, parquet.schema_arrow, fields)
            groups = range(unit.start, unit.stop if unit.stop is not None else parquet.num_row_groups)
            batches: Iterator[pa.RecordBatch] = parquet.iter_batches(batch_size=batch_size, row_groups=list(groups),
                                                                     columns=columns)
        else:
            schema, batches = _ipc_batches(path, stack.enter_context(pa.memory_map(os.fspath(path))))
            columns = _columns(path, schema, fields)
        row = unit.first_row
        for batch in batches:
            for record in _rows(batch.select(columns)):
                row += 1
                yield row, record


def _ipc_batches(path: Path, source: pa.MemoryMappedFile) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """The batches of an Arrow IPC file or stream, read in order as a stream (the file format holds one
    between its leading magic and its footer), so that the stream's end can be checked: see _ipc_end."""
    size = source.size()
    end = size
    if source.read(8)[: len(_IPC_MAGIC)] == _IPC_MAGIC:  # file format: magic, stream, footer, its length, magic
        tail = source.read_at(10, size - 10) if size >= 18 else b""
        if tail[-len(_IPC_MAGIC) :] != _IPC_MAGIC:
            raise InputError(path, None, f"{_IPC_UNREADABLE}: file format without a footer (truncated?)", _RECREATE)
        end = size - 10 - int.from_bytes(tail[:4], "little", signed=True)
        if not 8 <= end <= size - 10:
            raise InputError(path, None, f"{_IPC_UNREADABLE}: its footer length is corrupt", _RECREATE)
    else:
        source.seek(0)
    stream = pa.ipc.open_stream(source)
    return stream.schema, _ipc_end(path, source, stream, end)


def _ipc_end(path: Path, source: pa.MemoryMappedFile, stream: Any, end: int) -> Iterator[pa.RecordBatch]:
    """``stream``'s batches, then a check of how it ended. pyarrow's reader stops without a word at the end
    of the data, so a stream cut at a batch boundary (no end-of-stream marker) and a second stream or file
    joined after the first would both be read in part."""
    rows = 0
    last = source.tell()
    for batch in stream:
        last = source.tell()
        rows += batch.num_rows
        yield batch
    stop = source.tell()
    if source.read_at(stop - last, last) not in _IPC_EOS:
        raise InputError(
            path, None, f"{_IPC_UNREADABLE}: no end-of-stream marker after row {rows} (truncated?)", _RECREATE
        )
    if stop != end:
        raise InputError(
            path,
            None,
            f"{_IPC_UNREADABLE}: {end - stop} bytes after the end of its stream at byte {stop} would be ignored",
            "two files or streams joined into one? write one stream per file",
        )


def _columns(path: Path, schema: pa.Schema, fields: Fields) -> list[str]:
    """The columns to read; a missing or mistyped column fails the whole file."""
    names = set(schema.names)
    hint = f"columns: {', '.join(schema.names)}"
    id_key = _id_field(fields, names)
    if id_key is None:
        raise InputError(path, None, f"no id column (expected {_id_expectation(fields)})", hint)
    text_keys, optional = _text_fields(fields, names)
    if not text_keys:
        raise InputError(path, None, f"no text column (expected {_text_expectation(fields)})", hint)
    missing = [k for k in text_keys if k not in names and k not in optional]
    if missing:
        raise InputError(path, None, f"no text column {missing[0]!r}", hint)
    columns = [id_key, *(k for k in text_keys if k in names)]
    for key in columns:
        if schema.get_all_field_indices(key)[1:]:  # which one is meant? Arrow cannot select it by name either
            raise InputError(path, None, f"column {key!r} appears {len(schema.get_all_field_indices(key))} times",
                             "rename the duplicates")
        kind = schema.field(key).type
        ok = _is_string(kind) or (pa.types.is_integer(kind) if key == id_key else pa.types.is_null(kind))
        if not ok:
            expected = "string or integer" if key == id_key else "string"
            raise InputError(path, None, f"column {key!r} has type {kind}, expected {expected}")
    return columns


def _rows(batch: pa.RecordBatch) -> list[Any]:
    # Full validation checks offsets and UTF-8 before any conversion touches the buffers; a failure is
    # then pinned to its rows.
    try:
        batch.validate(full=True)
        return batch.to_pylist()
    except pa.ArrowInvalid:
        return [_row(batch.slice(i, 1)) for i in range(batch.num_rows)]


def _row(row: pa.RecordBatch) -> Any:
    for name, column in zip(row.schema.names, row.columns, strict=True):
        try:
            column.validate(full=True)
        except pa.ArrowInvalid as e:
            return _Bad(f"column {name!r} holds invalid data: {e}", hint="strings must be valid UTF-8")
    return row.to_pylist()[0]


def _is_string(kind: pa.DataType) -> bool:
    if pa.types.is_dictionary(kind):
        return _is_string(kind.value_type)
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or str(kind) == "string_view"


def _id_field(fields: Fields, keys: Collection[str]) -> str | None:
    if fields.id is not None:
        return fields.id if fields.id in keys else None
    return next((k for k in _ID_KEYS if k in keys), None)


def _text_fields(fields: Fields, keys: Collection[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(text fields to join, those of them that may be absent); no fields when none can be found."""
    if fields.text is not None:
        return fields.text, ()
    if "text" in keys:
        return _TITLE_TEXT, ("title",)
    return (("contents",), ()) if "contents" in keys else ((), ())


def _id_expectation(fields: Fields) -> str:
    return repr(fields.id) if fields.id is not None else " or ".join(map(repr, _ID_KEYS))


def _text_expectation(fields: Fields) -> str:
    return "'text' (and optionally 'title') or 'contents'" if fields.text is None else repr(fields.text)


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")
