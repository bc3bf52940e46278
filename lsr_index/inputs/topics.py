"""Queries and relevance judgments for evaluation.

These files are small, so they are read whole and validated strictly: any bad line fails with its
file:line, because a silently dropped query or judgment would skew every metric computed from them.
Blank lines (anywhere) are not records and are skipped. Ids follow one rule (`ids.check_id`), which run
files need: their columns are split on any whitespace.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

from lsr_index.errors import InputError
from lsr_index.inputs.decompress import CORRUPT, missing_module, open_decompressed
from lsr_index.inputs.ids import RepeatedField, check_id
from lsr_index.inputs.sources import compression

_QID_KEYS = ("_id", "id", "qid")
_QUERY_TEXT_KEYS = ("text", "query")
_QRELS_HEADER = ("query-id", "corpus-id", "score")  # BEIR's qrels/*.tsv
_QUERIES_HEADER_IDS = ("qid", "query-id", "query_id", "_id", "id")  # a TSV's first line that names its columns
_QUERIES_HEADER_TEXTS = ("text", "query", "query-text", "query_text")
_REPEATED = RepeatedField(_QID_KEYS + _QUERY_TEXT_KEYS)
_INTEGER = re.compile(r"-?[0-9]+")
MAX_RELEVANCE = 1000  # trec_eval sizes its gain tables by the largest grade: 8 bytes per level, 0.8 GB at 10⁸


def read_queries(path: str | Path, notice: Callable[[str], None] | None = None) -> list[tuple[str, str]]:
    """(qid, text) pairs in file order, from a TSV "qid<TAB>text" file or from JSON Lines
    (.jsonl/.json) with "_id"/"id"/"qid" and "text"/"query" like BEIR's queries.jsonl; either may be compressed
    (.gz/.bz2/.xz/.zst).

    A TSV whose first line names its columns ("qid<TAB>text", "query-id<TAB>text", "_id<TAB>query" …) has that
    line skipped, and `notice` is told: searched, it would be a query named "qid". Query ids must pass
    `ids.check_id`.
    """
    path = Path(path)
    as_json = path.name.lower().removesuffix(compression(path) or "").endswith((".jsonl", ".json"))
    queries: list[tuple[str, str]] = []
    first_seen: dict[str, int] = {}
    for record, (line_no, line) in enumerate(text_lines(path)):
        qid, text = _json_query(path, line_no, line) if as_json else _tsv_query(path, line_no, line)
        if record == 0 and not as_json and _is_header(qid, text):
            if notice:
                notice(f"{path}:{line_no}: skipped the header line {qid!r}<TAB>{text!r}")
            continue
        problem = check_id(qid)
        if problem:
            raise InputError(path, line_no, f"query {problem}" if qid else "empty query id",
                             "run and qrels files cannot represent it")
        if not text.strip():
            raise InputError(path, line_no, f"query {qid!r} has empty text")
        if qid in first_seen:
            raise InputError(path, line_no, f"duplicate query id {qid!r} (first on line {first_seen[qid]})")
        first_seen[qid] = line_no
        queries.append((qid, text))
    if not queries:
        raise InputError(path, None, "no queries", "the file is empty")
    return queries


def read_qrels(path: str | Path) -> dict[str, dict[str, int]]:
    """{qid: {docid: relevance}} from TREC "qid 0 docid rel" or BEIR "qid docid rel" lines.

    Columns are whitespace-separated and their count is fixed by the first line. A first line
    "query-id corpus-id score" (BEIR's header) is skipped. A pair judged twice with the same relevance
    is accepted; conflicting relevances fail. Ids must pass `ids.check_id`: one that no query or document
    can have (a control character, over Lucene's length) would be judged but never retrieved, and score 0.
    """
    path = Path(path)
    qrels: dict[str, dict[str, int]] = {}
    n_columns = 0
    for line_no, line in text_lines(path):
        columns = line.split()
        if not n_columns and tuple(c.lower() for c in columns) == _QRELS_HEADER:
            continue
        if len(columns) not in (3, 4) or (n_columns and len(columns) != n_columns):
            expected = n_columns or "4 (qid 0 docid rel) or 3 (qid docid rel)"
            raise InputError(path, line_no, f"{len(columns)} columns, expected {expected}")
        n_columns = len(columns)
        qid, docid, rel = columns[0], columns[-2], columns[-1]
        for kind, value in (("query", qid), ("document", docid)):
            if problem := check_id(value):
                raise InputError(path, line_no, f"{kind} {problem}", "no query or document can have this id")
        if not _INTEGER.fullmatch(rel):
            raise InputError(path, line_no, f"relevance {rel!r} is not an integer")
        if abs(int(rel)) > MAX_RELEVANCE:
            raise InputError(path, line_no, f"relevance {rel} is beyond ±{MAX_RELEVANCE}",
                             "relevance is a small grade; the evaluator's memory grows with the largest one")
        judged = qrels.setdefault(qid, {})
        if judged.setdefault(docid, int(rel)) != int(rel):
            raise InputError(path, line_no, f"({qid}, {docid}) judged {judged[docid]} earlier, now {rel}")
    if not qrels:
        raise InputError(path, None, "no judgments", "the file is empty")
    return qrels


def _is_header(qid: str, text: str) -> bool:
    return qid.strip().lower() in _QUERIES_HEADER_IDS and text.strip().lower() in _QUERIES_HEADER_TEXTS


def text_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Non-blank lines without their line break, decoded strictly as UTF-8 (a leading BOM is dropped; one at the
    start of a later line, where two files were joined, is refused: it would become part of an id), from a plain
    or a .gz/.bz2/.xz/.zst file."""
    suffix = compression(path)
    module = missing_module(suffix) if suffix else None
    if module:
        raise InputError(path, None, f"reading {suffix} files needs the {module} module", f"pip install {module}")
    line_no = 0
    try:
        with open_decompressed(path, suffix) if suffix else open(path, "rb") as f:
            for line_no, raw in enumerate(f, 1):
                try:
                    line = raw.decode("utf-8-sig" if line_no == 1 else "utf-8").rstrip("\r\n")
                except UnicodeDecodeError as e:
                    raise InputError(
                        path,
                        line_no,
                        f"invalid UTF-8 at byte {e.start + 1}",
                        "the file must be UTF-8 encoded",
                    ) from e
                if line.startswith("\ufeff"):
                    raise InputError(path, line_no, "a byte-order mark (U+FEFF) starts the line",
                                     "files joined together? remove it: it would become part of the id")
                if line.strip():
                    yield line_no, line
    except CORRUPT as e:
        reason = getattr(e, "strerror", None)  # set for the system's errors, not for the data's
        if suffix and not reason:
            reason = f"compressed data is truncated or corrupt after line {line_no} ({e})"
        raise InputError(path, None, f"cannot read: {reason or e}") from e


def _tsv_query(path: Path, line_no: int, line: str) -> tuple[str, str]:
    columns = line.split("\t")
    if len(columns) != 2:
        problem = "no text column" if len(columns) == 1 else f"{len(columns)} tab-separated columns"
        raise InputError(
            path, line_no, f"{problem}, expected 2: qid<TAB>text", "a query cannot contain a tab"
        )
    return columns[0], columns[1]


def _json_query(path: Path, line_no: int, line: str) -> tuple[str, str]:
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError as e:
        raise InputError(path, line_no, f"malformed JSON: {e.msg} at column {e.colno}") from e
    if not isinstance(record, dict):
        raise InputError(path, line_no, "expected a JSON object")
    twice = _REPEATED(line.encode(), record)
    if twice:
        raise InputError(path, line_no, f"field {twice!r} appears more than once in the object",
                         "which value is meant? keep one")
    return (
        _json_field(path, line_no, record, _QID_KEYS, (str, int)),
        _json_field(path, line_no, record, _QUERY_TEXT_KEYS, (str,)),
    )


def _json_field(
    path: Path, line_no: int, record: dict[str, Any], keys: tuple[str, ...], kinds: tuple[type, ...]
) -> str:
    key = next((k for k in keys if k in record), None)
    if key is None:
        raise InputError(path, line_no, f"no field {' or '.join(map(repr, keys))}")
    value = record[key]
    if type(value) not in kinds:  # type(), not isinstance: a boolean is no id
        raise InputError(
            path,
            line_no,
            f"field {key!r} is {type(value).__name__}, expected {' or '.join(k.__name__ for k in kinds)}",
        )
    return str(value)


def read_query_vectors(path: str | Path) -> list[tuple[str, dict[str, int | float]]]:
    """(qid, {term: weight}) pairs in file order, from JSON Lines of {"id", "vector": {term: weight}} (the form
    `encode` writes documents in; "_id" or "qid" for the id also do), optionally compressed. Weights are
    non-negative finite numbers, kept as written (an integer stays an int, a fraction a float: the caller decides
    what they are); a name given twice in an object, an id given twice, is refused with its line."""
    import json
    import math

    path = Path(path)
    queries: list[tuple[str, dict[str, int | float]]] = []
    first_seen: dict[str, int] = {}

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: set[str] = set()
        for key, _ in items:
            if key in seen:
                raise ValueError(f"the name {key!r} appears twice in an object")
            seen.add(key)
        return dict(items)

    def constant(name: str) -> None:
        raise ValueError(f"{name} is not a number JSON allows")

    for line_no, line in text_lines(path):
        try:
            record = json.loads(line, object_pairs_hook=pairs, parse_constant=constant)
        except ValueError as e:  # JSONDecodeError is one
            raise InputError(path, line_no, f"not a query vector record: {e}"[:300],
                             'expected {"id": ..., "vector": {term: weight, ...}}') from None
        if not isinstance(record, dict):
            raise InputError(path, line_no, "expected a JSON object")
        qid = _json_field(path, line_no, record, _QID_KEYS, (str, int))
        problem = check_id(qid)
        if problem:
            raise InputError(path, line_no, f"query {problem}" if qid else "empty query id",
                             "run and qrels files cannot represent it")
        vector = record.get("vector")
        if not isinstance(vector, dict):
            raise InputError(path, line_no, f"query {qid!r}: no 'vector' object of term: weight")
        for term, weight in vector.items():
            if type(weight) not in (int, float) or not math.isfinite(weight) or weight < 0:
                raise InputError(path, line_no, f"query {qid!r}: the weight {weight!r} of term {term!r} is not a "
                                 "non-negative number")
        if qid in first_seen:
            raise InputError(path, line_no, f"duplicate query id {qid!r} (first on line {first_seen[qid]})")
        first_seen[qid] = line_no
        queries.append((qid, vector))
    if not queries:
        raise InputError(path, None, "no query vectors", "the file is empty")
    return queries
