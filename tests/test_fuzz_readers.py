"""Property tests: any valid corpus reads back exactly, and no input makes a reader raise anything but
the project's own errors."""

from __future__ import annotations

import contextlib
import gzip
import tempfile
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lsr_index.corpus import CorpusReader
from lsr_index.errors import LsrIndexError
from lsr_index.topics import read_qrels, read_queries

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

ids = st.text(min_size=1, max_size=20).filter(lambda s: not any(c in s for c in "\n\r\x00"))
# An escaped NUL becomes a space, so a text is blank when it is blank after that replacement.
texts = st.text(min_size=1, max_size=50).filter(lambda s: not s.replace("\x00", " ").isspace())
records = st.lists(st.tuples(ids, texts), min_size=1, max_size=30, unique_by=lambda r: r[0])
FORMATS = ["jsonl", "jsonl.gz", "parquet", "arrow", "ipc"]


def write(path: Path, rows: list[tuple[str, str]]) -> None:
    table = pa.table({"id": [r[0] for r in rows], "text": [r[1] for r in rows]})
    if path.suffix == ".parquet":
        pq.write_table(table, path, row_group_size=4)
    elif path.suffix in (".arrow", ".ipc"):
        new = pa.ipc.new_file if path.suffix == ".arrow" else pa.ipc.new_stream
        with pa.OSFile(str(path), "wb") as sink, new(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=4)
    else:
        data = b"".join(orjson.dumps({"id": i, "text": t}) + b"\n" for i, t in rows)
        path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)


def read_all(path: Path, **options) -> list[tuple[str, str]]:
    return [
        row
        for batch in CorpusReader(path, **options)
        for row in zip(*batch.to_pydict().values(), strict=True)
    ]


@FUZZ
@given(rows=records, fmt=st.sampled_from(FORMATS), batch_size=st.integers(1, 8))
def test_valid_records_read_back_equal(rows, fmt, batch_size):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"corpus.{fmt}"
        write(path, rows)
        assert read_all(path, batch_size=batch_size) == [(i, t.replace("\x00", " ")) for i, t in rows]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats() | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["id", "text", "title"]), inner)
    ),
    max_leaves=6,
)
near_json_lines = st.lists(json_values.map(orjson.dumps), max_size=10)
arbitrary_bytes = st.one_of(
    st.binary(max_size=300),
    near_json_lines.map(b"\n".join),
    st.lists(
        st.sampled_from([b"{", b"}", b'"id"', b'"text"', b":", b",", b'"a"', b"1", b"\n", b"\x00", b"\xff"])
    ).map(b"".join),
)


@FUZZ
@given(data=arbitrary_bytes, name=st.sampled_from(["c.jsonl", "c.jsonl.gz", "c.raw.jsonl.gz"]))
def test_arbitrary_bytes_as_jsonl_raise_only_own_errors(data, name):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        # "raw" writes the bytes under a .gz name uncompressed: not gzip data at all.
        path.write_bytes(gzip.compress(data) if name == "c.jsonl.gz" else data)
        for on_error in ("fail", "skip"):
            with contextlib.suppress(LsrIndexError):  # any other exception fails the test
                read_all(path, on_error=on_error)


@FUZZ
@given(
    fmt=st.sampled_from(["parquet", "arrow", "ipc"]),
    flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), min_size=1, max_size=4),
    keep=st.floats(0.05, 1),
)
def test_damaged_table_files_raise_only_own_errors(fmt, flips, keep):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"c.{fmt}"
        write(path, [(f"d{i}", "text " * i + "x") for i in range(20)])
        data = bytearray(path.read_bytes())
        for where, value in flips:
            data[int(where * len(data))] = value
        path.write_bytes(bytes(data[: max(1, int(keep * len(data)))]))
        for on_error in ("fail", "skip"):
            with contextlib.suppress(LsrIndexError):  # any other exception fails the test
                read_all(path, on_error=on_error)


@FUZZ
@given(data=arbitrary_bytes, name=st.sampled_from(["q.tsv", "q.jsonl", "qrels.txt"]))
def test_arbitrary_bytes_as_topics_raise_only_own_errors(data, name):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_bytes(data)
        with contextlib.suppress(LsrIndexError):
            (read_qrels if name.startswith("qrels") else read_queries)(path)
