"""Property tests: any valid corpus reads back exactly, and no input makes a reader raise anything but
the project's own errors."""

from __future__ import annotations

import bz2
import contextlib
import gzip
import lzma
import os
import tempfile
import unicodedata
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lsr_index.errors import LsrIndexError
from lsr_index.inputs.corpus import CorpusReader, Fields, check_id
from lsr_index.inputs.topics import read_qrels, read_queries

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

ids = st.text(min_size=1, max_size=20).filter(lambda s: check_id(s) is None)
# An escaped NUL becomes a space, so a text is blank when it is blank after that replacement.
texts = st.text(min_size=1, max_size=50).filter(lambda s: not s.replace("\x00", " ").isspace())
records = st.lists(st.tuples(ids, texts), min_size=1, max_size=30, unique_by=lambda r: r[0])
FORMATS = ["jsonl", "jsonl.gz", "jsonl.bz2", "jsonl.xz", "ndjson", "parquet", "arrow", "ipc"]
COMPRESS = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress}


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
        path.write_bytes(COMPRESS[path.suffix](data) if path.suffix in COMPRESS else data)


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


NAMES = [f"c.{ext}" for ext in ["jsonl", "ndjson", "parquet", "arrow", "ipc", "feather"]] + [
    f"c.{raw}jsonl{suffix}" for suffix in COMPRESS for raw in ("", "raw.")
]


@FUZZ
@given(data=arbitrary_bytes, name=st.sampled_from(NAMES), cut=st.floats(0, 1))
def test_arbitrary_bytes_in_any_format_raise_only_own_errors(data, name, cut):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        # "raw" writes the bytes under a compressed name uncompressed; others are compressed, then cut.
        packed = COMPRESS[path.suffix](data) if path.suffix in COMPRESS and ".raw." not in name else data
        path.write_bytes(packed if cut > 0.5 else packed[: int(cut * 2 * len(packed))])
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


def _array(kind: str, values: list) -> pa.Array:
    """A column of ``kind`` (wrong ones included) holding ``values`` (texts; None is a null)."""
    if kind in ("string", "large_string", "binary", "large_binary"):
        cast = (lambda v: v.encode("utf-8", "surrogatepass")) if "binary" in kind else (lambda v: v)
        return pa.array([None if v is None else cast(v) for v in values], getattr(pa, kind)())
    if kind == "dictionary<string>":
        return pa.array(values, pa.string()).dictionary_encode()
    numbers = [None if v is None else len(v) for v in values]
    if kind == "dictionary<int>":
        return pa.array(numbers, pa.int64()).dictionary_encode()
    if kind in ("int8", "uint64", "float64", "bool_", "int32"):
        return pa.array(numbers, pa.int64()).cast(getattr(pa, kind)(), safe=False)
    if kind == "null":
        return pa.nulls(len(values))
    if kind == "list<string>":
        return pa.array([None if v is None else [v] for v in values], pa.list_(pa.string()))
    assert kind == "struct", kind
    return pa.array([None if v is None else {"id": v} for v in values], pa.struct([("id", pa.string())]))


KINDS = ["string", "large_string", "binary", "large_binary", "dictionary<string>", "dictionary<int>", "int8",
         "uint64", "float64", "bool_", "null", "int32", "list<string>", "struct"]


@FUZZ
@given(
    values=st.lists(st.none() | st.text(max_size=8), max_size=12),
    id_kind=st.sampled_from(KINDS),
    text_kind=st.sampled_from(KINDS),
    fmt=st.sampled_from(["parquet", "arrow", "ipc"]),
    id_field=st.sampled_from([None, "id", "meta.id", "meta"]),
)
def test_any_column_types_raise_only_own_errors(values, id_kind, text_kind, fmt, id_field):
    """Wrong types (binary, lists, structs, dictionaries of ints, …), nulls, nested fields, zero rows."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"c.{fmt}"
        table = pa.table({"id": _array(id_kind, values), "text": _array(text_kind, values[::-1]),
                          "meta": _array("struct", values)})
        write_table(path, table)
        for on_error in ("fail", "skip"):
            with contextlib.suppress(LsrIndexError):
                read_all(path, on_error=on_error, fields=Fields(id=id_field))


def write_table(path: Path, table: pa.Table) -> None:
    if path.suffix == ".parquet":
        pq.write_table(table, path, row_group_size=4)
    else:
        new = pa.ipc.new_file if path.suffix == ".arrow" else pa.ipc.new_stream
        with pa.OSFile(str(path), "wb") as sink, new(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=4)


file_names = st.binary(min_size=1, max_size=12).filter(lambda b: b"/" not in b and b"\x00" not in b)


@FUZZ
@given(stem=file_names, ext=st.sampled_from([".jsonl", ".JSONL.GZ", ".parquet", ".txt", ""]))
@example(stem="\xa0À".encode(), ext=".jsonl")  # a no-break space: a fine name, always tried
@example(stem="a\u2028b".encode(), ext=".jsonl")  # a line separator: refused like a line break
def test_any_file_name_raises_only_own_errors_and_an_accepted_one_can_be_recorded(stem, ext):
    with tempfile.TemporaryDirectory() as tmp:
        name = stem + ext.encode()
        if name in (b".", b".."):
            return
        path = Path(os.fsdecode(os.fsencode(tmp) + b"/" + name))
        plain = Path(tmp) / f"plain{ext.lower()}"  # pyarrow cannot write to a name that is not UTF-8
        write(plain, [("d1", "text")])
        os.rename(plain, path)
        for source in (path, tmp, os.path.join(tmp, "*")):
            try:
                files = CorpusReader(source).files
            except LsrIndexError as e:
                assert "\n" not in str(e)  # one line
                continue
            for f in files:  # what the manifest and the skipped report will record
                orjson.dumps(str(f))
                assert len(f"<{f}>".splitlines()) == 1  # one line in a message or a report
                assert not any(unicodedata.category(c) == "Cc" for c in str(f))  # no terminal control
