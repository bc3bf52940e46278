"""CorpusReader on real files of every format, and on every kind of bad input in both error modes."""

from __future__ import annotations

import gzip
import random
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lsr_index.errors import InputError
from lsr_index.inputs import corpus
from lsr_index.inputs.corpus import SCHEMA, CorpusReader, Fields, Skipped

# Ids that run files and index files can hold even though they look awkward (a zero-width space is Cf).
ODD_IDS = ["plain", 'quote"d', "it's", "naïve-日本-🙂", "zero\u200bwidth", "a,b;c", "x" * 8000]


def write_jsonl(path: Path, records: Sequence[dict | bytes]) -> Path:
    """Dicts become JSON lines; bytes are written as they are (a line terminator is added)."""
    data = b"".join((r if isinstance(r, bytes) else orjson.dumps(r)) + b"\n" for r in records)
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def write_table(path: Path, table: pa.Table, kind: str) -> Path:
    if kind == "parquet":
        pq.write_table(table, path, row_group_size=7)
    elif kind == "feather":
        feather.write_feather(table, path, chunksize=7)
    else:
        new = pa.ipc.new_file if kind == "arrow-file" else pa.ipc.new_stream
        with pa.OSFile(str(path), "wb") as sink, new(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=7)
    return path


TABLE_KINDS = {"parquet": ".parquet", "feather": ".feather", "arrow-file": ".arrow", "arrow-stream": ".ipc"}


def write_records(directory: Path, kind: str, records: list[dict], name: str = "corpus") -> Path:
    """The same records in any supported format."""
    if kind in TABLE_KINDS:
        return write_table(directory / f"{name}{TABLE_KINDS[kind]}", pa.Table.from_pylist(records), kind)
    return write_jsonl(directory / f"{name}.{kind}", records)


def read(reader: CorpusReader) -> list[tuple[str, str]]:
    docs = []
    for batch in reader:
        assert batch.schema == SCHEMA
        docs += zip(batch.column("id").to_pylist(), batch.column("text").to_pylist(), strict=True)
    return docs


ALL_KINDS = ["jsonl", "json", "jsonl.gz", *TABLE_KINDS]


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_every_format_round_trips_ids_and_texts_exactly(tmp_path, kind):
    texts = [f"text {i} ünïcödé\n second line\t and a tab" for i in range(len(ODD_IDS))]
    records = [{"id": i, "text": t} for i, t in zip(ODD_IDS, texts, strict=True)]
    reader = CorpusReader(write_records(tmp_path, kind, records), batch_size=3)
    assert read(reader) == list(zip(ODD_IDS, texts, strict=True))
    assert reader.n_docs == len(ODD_IDS) and reader.skipped == []


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "arrow-file"])
def test_integer_ids_become_strings(tmp_path, kind):
    path = write_records(tmp_path, kind, [{"docid": 7, "text": "a"}, {"docid": -3, "text": "b"}])
    assert read(CorpusReader(path)) == [("7", "a"), ("-3", "b")]


@pytest.mark.parametrize("id_key", ["id", "_id", "docid"])
def test_default_id_field(tmp_path, id_key):
    path = write_jsonl(tmp_path / "c.jsonl", [{id_key: "d1", "text": "x"}])
    assert read(CorpusReader(path)) == [("d1", "x")]


def test_default_id_field_prefers_id_over_underscore_id(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [{"_id": "b", "id": "a", "text": "x"}])
    assert read(CorpusReader(path)) == [("a", "x")]


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_default_text_joins_title_and_text(tmp_path, kind):
    records = [
        {"id": "1", "title": "Title", "text": "body"},
        {"id": "2", "title": "", "text": "no title"},
        {"id": "3", "title": None, "text": "null title"},
    ]
    got = read(CorpusReader(write_records(tmp_path, kind, records)))
    assert got == [("1", "Title body"), ("2", "no title"), ("3", "null title")]


def test_default_text_without_title_field(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [{"id": "1", "text": "only text"}])
    assert read(CorpusReader(path)) == [("1", "only text")]


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "arrow-stream"])
def test_default_text_falls_back_to_contents(tmp_path, kind):
    path = write_records(tmp_path, kind, [{"id": "1", "contents": "Pyserini style"}])
    assert read(CorpusReader(path)) == [("1", "Pyserini style")]


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "arrow-file"])
def test_custom_fields(tmp_path, kind):
    records = [
        {"pid": "p1", "head": "H", "body": "B", "text": "ignored"},
        {"pid": "p2", "head": None, "body": "B2"},
    ]
    reader = CorpusReader(
        write_records(tmp_path, kind, records), fields=Fields(id="pid", text=("head", "body"))
    )
    assert read(reader) == [("p1", "H B"), ("p2", "B2")]


def test_fields_accepts_a_single_name_and_rejects_empty_ones():
    assert Fields(text="body").text == ("body",)  # type: ignore[arg-type]
    for bad in ({"text": ()}, {"text": ("",)}, {"id": ""}):
        with pytest.raises(ValueError):
            Fields(**bad)


def test_directory_reads_its_files_sorted_and_passes_over_hidden_ones(tmp_path):
    for name in ["b.jsonl", "a.parquet", "c.jsonl.gz"]:
        write_records(tmp_path, name.split(".", 1)[1], [{"id": name, "text": "x"}], name=name.split(".")[0])
    write_jsonl(tmp_path / ".hidden.jsonl", [{"id": "hidden", "text": "x"}])
    (tmp_path / "_SUCCESS").write_bytes(b"")
    (tmp_path / ".git").mkdir()
    reader = CorpusReader(tmp_path)
    assert [p.name for p in reader.files] == ["a.parquet", "b.jsonl", "c.jsonl.gz"]
    assert [p.name for p in reader.passed_over] == [".git", ".hidden.jsonl", "_SUCCESS"]
    assert [i for i, _ in read(reader)] == ["a.parquet", "b.jsonl", "c.jsonl.gz"]


def test_glob_is_sorted_and_recursive_with_double_star(tmp_path):
    (tmp_path / "x").mkdir()
    for path in [tmp_path / "b.jsonl", tmp_path / "a.jsonl", tmp_path / "x" / "c.jsonl"]:
        write_jsonl(path, [{"id": path.name, "text": "t"}])
    assert [p.name for p in CorpusReader(str(tmp_path / "*.jsonl")).files] == ["a.jsonl", "b.jsonl"]
    assert [p.name for p in CorpusReader(str(tmp_path / "**" / "*.jsonl")).files] == [
        "a.jsonl",
        "b.jsonl",
        "c.jsonl",
    ]


def test_list_of_sources_keeps_the_order_given(tmp_path):
    b = write_jsonl(tmp_path / "b.jsonl", [{"id": "b1", "text": "t"}, {"id": "b2", "text": "t"}])
    a = write_records(tmp_path, "parquet", [{"id": "a1", "text": "t"}], name="a")
    assert [i for i, _ in read(CorpusReader([b, str(a)], batch_size=2))] == ["b1", "b2", "a1"]


def test_a_file_listed_twice_is_refused(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [{"id": "1", "text": "t"}])
    with pytest.raises(InputError, match="listed twice"):
        CorpusReader([path, tmp_path])


@pytest.mark.parametrize("batch_size", [1, 3, 10, 1024])
def test_batches_respect_batch_size_and_end_with_each_unit(tmp_path, batch_size):
    """A batch never spans two units (here two files): any division of the units among readers gives the same
    batches."""
    first = write_jsonl(tmp_path / "a.jsonl", [{"id": f"a{i}", "text": "t"} for i in range(7)])
    second = write_records(tmp_path, "parquet", [{"id": f"b{i}", "text": "t"} for i in range(6)], name="b")
    batches = list(CorpusReader([first, second], batch_size=batch_size))
    assert all(0 < b.num_rows <= batch_size for b in batches)
    assert [b.num_rows for b in batches] == [min(batch_size, 7 - k) for k in range(0, 7, batch_size)] + \
        [min(batch_size, 6 - k) for k in range(0, 6, batch_size)]


def test_batches_are_flushed_early_when_texts_are_huge(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus, "_MAX_BATCH_CHARS", 250)
    path = write_jsonl(tmp_path / "a.jsonl", [{"id": str(i), "text": "x" * 100} for i in range(5)])
    assert [b.num_rows for b in CorpusReader(path)] == [3, 2]


def test_max_chars_cuts_long_texts_and_a_megabyte_document_is_fine(tmp_path):
    big = "word " * 200_000
    path = write_jsonl(tmp_path / "a.jsonl", [{"id": "big", "text": big}, {"id": "small", "text": "abc"}])
    assert read(CorpusReader(path, max_chars=10)) == [("big", big[:10]), ("small", "abc")]
    assert read(CorpusReader(path))[0][1] == big


def test_blank_lines_bom_and_crlf_are_handled_and_lines_keep_their_numbers(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"id": "1", "text": "a"}\r\n\r\n  \n{"id": "2", "text": "b"}\n\n{"id": 3}')
    reader = CorpusReader(path, on_error="skip")
    assert read(reader) == [("1", "a"), ("2", "b")]
    assert reader.skipped == [
        Skipped(str(path), 6, "3", "no text field (expected 'text' (and optionally 'title') or 'contents')")
    ]


def test_escaped_nul_in_text_becomes_a_space(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [{"id": "1", "text": "a\x00b"}, {"id": "2", "text": "\x00"}])
    reader = CorpusReader(path, on_error="skip")
    assert read(reader) == [("1", "a b")]
    assert [(s.where, s.reason) for s in reader.skipped] == [(2, "text is only whitespace")]


def test_iterating_again_starts_afresh(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [{"id": "1", "text": "a"}, {"id": "1", "text": "dup"}])
    reader = CorpusReader(path, on_error="skip")
    assert read(reader) == read(reader) == [("1", "a")]
    assert reader.n_docs == 1 and len(reader.skipped) == 1


def test_invalid_arguments_are_programming_errors(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [{"id": "1", "text": "a"}])
    for kwargs in ({"on_error": "ignore"}, {"batch_size": 0}, {"max_chars": 0}):
        with pytest.raises(ValueError):
            CorpusReader(path, **kwargs)
    with pytest.raises(ValueError):
        CorpusReader([])


# --- bad records: (line bytes, reason fragment, doc_id recorded in skip mode) ---------------------

BAD_LINES = {
    "malformed JSON": (b'{"id": "x", "text": ', "malformed JSON", None),
    "not an object": (b'["x", "text"]', "expected a JSON object, got an array", None),
    "a bare string": (b'"just a string"', "expected a JSON object, got a string", None),
    "missing id": (b'{"text": "t"}', "no id field (expected 'id' or '_id' or 'docid')", None),
    "null id": (b'{"id": null, "text": "t"}', "id field 'id' is null", None),
    "float id": (b'{"id": 1.5, "text": "t"}', "id field 'id' is a number", None),
    "boolean id": (b'{"id": true, "text": "t"}', "id field 'id' is a boolean", None),
    "list id": (b'{"id": ["a"], "text": "t"}', "id field 'id' is an array", None),
    "empty id": (b'{"id": "", "text": "t"}', "id '' is empty", None),
    "id with newline": (b'{"id": "a\\nb", "text": "t"}', "contains whitespace (U+000A at character 2)", None),
    "id with carriage return": (b'{"id": "a\\rb", "text": "t"}', "contains whitespace (U+000D", None),
    "id with a space": (b'{"id": "a b", "text": "t"}', "id 'a b' contains whitespace (U+0020", None),
    "missing text": (b'{"id": "x", "title": "t"}', "no text field", "x"),
    "non-string text": (b'{"id": "x", "text": 5}', "text field 'text' is a number", "x"),
    "non-string title": (b'{"id": "x", "title": {}, "text": "t"}', "text field 'title' is an object", "x"),
    "empty text": (b'{"id": "x", "text": ""}', "empty text", "x"),
    "null text": (b'{"id": "x", "text": null}', "empty text", "x"),
    "whitespace text": (b'{"id": "x", "title": " ", "text": "\\n\\t "}', "only whitespace", "x"),
    "invalid UTF-8": (b'{"id": "x", "text": "caf\xe9"}', "invalid UTF-8 at byte 25", None),
    "raw NUL": (b'{"id": "x", "text": "a\x00b"}', "raw NUL byte at byte 23", None),
    "lone surrogate": (b'{"id": "x", "text": "\\ud800"}', "malformed JSON", None),
    "duplicate id": (b'{"id": "first", "text": "again"}', "duplicate id 'first'", "first"),
}


@pytest.fixture(params=list(BAD_LINES), ids=list(BAD_LINES))
def bad_corpus(request, tmp_path):
    line, reason, doc_id = BAD_LINES[request.param]
    good = [orjson.dumps({"id": "first", "text": "ok"}), orjson.dumps({"id": "last", "text": "ok"})]
    return write_jsonl(tmp_path / "shard-7.jsonl", [good[0], line, good[1]]), reason, doc_id


def test_bad_record_fails_naming_file_and_line(bad_corpus):
    path, reason, _ = bad_corpus
    with pytest.raises(InputError) as caught:
        read(CorpusReader(path))
    assert caught.value.where == 2 and reason in caught.value.reason
    assert str(caught.value).startswith(f"{path}:2: ") and "--on-error skip" in str(caught.value)


def test_bad_record_is_skipped_and_reported(bad_corpus):
    path, reason, doc_id = bad_corpus
    reader = CorpusReader(path, on_error="skip")
    assert read(reader) == [("first", "ok"), ("last", "ok")]
    [skipped] = reader.skipped
    assert (skipped.path, skipped.where, skipped.doc_id) == (str(path), 2, doc_id)
    assert reason in skipped.reason


def test_custom_text_field_missing(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [{"id": "1", "text": "t"}])
    with pytest.raises(InputError, match=r"a.jsonl:1: no text field 'body'"):
        read(CorpusReader(path, fields=Fields(text=("text", "body"))))


def test_duplicate_id_across_shards(tmp_path):
    first = write_jsonl(tmp_path / "a.jsonl", [{"id": "d1", "text": "a"}, {"id": "d2", "text": "a"}])
    second = write_records(
        tmp_path, "parquet", [{"id": "d3", "text": "b"}, {"id": "d1", "text": "b"}], name="b"
    )
    with pytest.raises(InputError, match=r"b\.parquet:2: duplicate id 'd1'"):
        read(CorpusReader(tmp_path))
    reader = CorpusReader([first, second], on_error="skip")
    assert read(reader) == [("d1", "a"), ("d2", "a"), ("d3", "b")]
    assert reader.skipped == [Skipped(str(second), 2, "d1", "duplicate id 'd1': an earlier record has it")]


def test_an_integer_id_duplicates_its_string_form(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [{"id": 5, "text": "a"}, {"id": "5", "text": "b"}])
    with pytest.raises(InputError, match="duplicate id '5'"):
        read(CorpusReader(path))


def test_overlong_line_is_a_bad_record_and_reading_resumes_after_it(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus, "_MAX_LINE_BYTES", 64)
    path = write_jsonl(
        tmp_path / "a.jsonl",
        [{"id": "1", "text": "a"}, {"id": "2", "text": "x" * 500}, {"id": "3", "text": "c"}],
    )
    reader = CorpusReader(path, on_error="skip")
    assert read(reader) == [("1", "a"), ("3", "c")]
    assert [(s.where, s.reason) for s in reader.skipped] == [(2, "line longer than 64 bytes")]


# --- whole-file problems: always fail, in both modes ----------------------------------------------


@pytest.mark.parametrize("on_error", ["fail", "skip"])
def test_truncated_gzip_names_the_last_good_line(tmp_path, on_error):
    path = tmp_path / "a.jsonl.gz"
    data = b"".join(orjson.dumps({"id": str(i), "text": f"text {i} " * 20}) + b"\n" for i in range(300))
    path.write_bytes(gzip.compress(data)[:-200])
    reader = CorpusReader(path, on_error=on_error)
    with pytest.raises(InputError, match=r"truncated or corrupt after line \d+") as caught:
        read(reader)
    last_good = int(caught.value.reason.split("after line ")[1].split()[0])
    assert 0 < last_good < 300 and caught.value.path == str(path)


def test_gz_name_on_plain_data(tmp_path):
    path = tmp_path / "a.jsonl.gz"
    path.write_bytes(b'{"id": "1", "text": "t"}\n')
    with pytest.raises(InputError, match=r"a.jsonl.gz: compressed data is truncated or corrupt after line 0"):
        read(CorpusReader(path))


@pytest.mark.parametrize("on_error", ["fail", "skip"])
def test_empty_corpus_fails_at_the_end(tmp_path, on_error):
    (tmp_path / "empty.jsonl").write_bytes(b"\n\n")
    with pytest.raises(InputError, match="no documents"):
        list(CorpusReader(tmp_path / "empty.jsonl", on_error=on_error))


def test_an_empty_shard_among_others_is_fine(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(b"")
    write_jsonl(tmp_path / "b.jsonl", [{"id": "1", "text": "t"}])
    reader = CorpusReader(tmp_path)
    assert read(reader) == [("1", "t")] and reader.skipped == []


def test_a_corpus_of_only_bad_records_fails_at_the_end_even_when_skipping(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [b"nope", b"{}"])
    with pytest.raises(InputError, match="no documents: all 2 records were skipped"):
        list(CorpusReader(path, on_error="skip"))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "missing.jsonl", "no such file or directory"),
        (lambda d: d, "directory holds no corpus files"),
        (lambda d: str(d / "*.jsonl"), "pattern matches nothing"),
        (lambda d: (d / "notes.txt").write_text("x") and str(d / "*"), "pattern matches this unsupported file"),
        (lambda d: (d / "c.csv").write_text("id,text") and d / "c.csv", "unsupported file type"),
    ],
    ids=[
        "missing file",
        "empty directory",
        "glob matching nothing",
        "glob of unsupported",
        "unsupported type",
    ],
)
def test_bad_sources_fail_when_the_reader_is_made(tmp_path, make, message):
    with pytest.raises(InputError, match=message):
        CorpusReader(make(tmp_path))


def test_directory_with_only_hidden_files(tmp_path):
    (tmp_path / ".README.md").write_text("x")
    with pytest.raises(InputError, match="directory holds no corpus files") as caught:
        CorpusReader(tmp_path)
    assert ".parquet" in caught.value.hint


@pytest.mark.parametrize("kind", list(TABLE_KINDS))
@pytest.mark.parametrize(
    ("columns", "fields", "message"),
    [
        ({"text": ["t"]}, Fields(), r"no id column \(expected 'id' or '_id' or 'docid'\)"),
        ({"id": ["1"], "body": ["t"]}, Fields(), "no text column"),
        ({"id": ["1"], "text": ["t"]}, Fields(text=("text", "body")), "no text column 'body'"),
        ({"id": [["1"]], "text": ["t"]}, Fields(), "column 'id' has type list<.*>, expected string or int"),
        ({"id": ["1"], "text": [5]}, Fields(), "column 'text' has type int64, expected string"),
        ({"id": [1.5], "text": ["t"]}, Fields(), "column 'id' has type double"),
        ({"id": ["1"], "title": [3], "text": ["t"]}, Fields(), "column 'title' has type int64"),
    ],
    ids=["no id", "no text", "no custom text", "list id", "int text", "float id", "int title"],
)
def test_table_with_missing_or_mistyped_columns(tmp_path, kind, columns, fields, message):
    path = write_table(tmp_path / f"c{TABLE_KINDS[kind]}", pa.table(columns), kind)
    for on_error in ("fail", "skip"):
        with pytest.raises(InputError, match=message) as caught:
            read(CorpusReader(path, fields=fields, on_error=on_error))
        assert caught.value.path == str(path) and caught.value.where is None


@pytest.mark.parametrize("kind", list(TABLE_KINDS))
def test_table_bad_rows_are_numbered_across_batches(tmp_path, kind):
    ids = [f"d{i}" for i in range(20)]
    texts = ["t"] * 20
    ids[9], texts[15] = None, "   "
    path = write_table(tmp_path / f"c{TABLE_KINDS[kind]}", pa.table({"id": ids, "text": texts}), kind)
    with pytest.raises(InputError, match=r":10: id field 'id' is null"):
        read(CorpusReader(path))
    reader = CorpusReader(path, on_error="skip", batch_size=4)
    assert len(read(reader)) == 18
    assert [(s.where, s.doc_id) for s in reader.skipped] == [(10, None), (16, "d15")]


@pytest.mark.parametrize("kind", ["parquet", "arrow-file", "arrow-stream"])
def test_invalid_utf8_in_a_table_is_a_bad_row(tmp_path, kind):
    offsets = pa.py_buffer(b"".join(n.to_bytes(4, "little") for n in (0, 1, 3, 4)))
    text = pa.Array.from_buffers(pa.string(), 3, [None, offsets, pa.py_buffer(b"a\xff\xfeb")])
    path = write_table(
        tmp_path / f"c{TABLE_KINDS[kind]}", pa.table({"id": ["1", "2", "3"], "text": text}), kind
    )
    with pytest.raises(InputError, match=r":2: column 'text' holds invalid data"):
        read(CorpusReader(path))
    reader = CorpusReader(path, on_error="skip")
    assert read(reader) == [("1", "a"), ("3", "b")] and [s.where for s in reader.skipped] == [2]


def test_dictionary_encoded_and_large_string_columns(tmp_path):
    table = pa.table(
        {"id": pa.array(["1", "2"]).dictionary_encode(), "text": pa.array(["a", "b"], pa.large_string())}
    )
    path = write_table(tmp_path / "c.arrow", table, "arrow-file")
    assert read(CorpusReader(path)) == [("1", "a"), ("2", "b")]


@pytest.mark.parametrize("suffix", [".parquet", ".arrow", ".feather", ".ipc"])
@pytest.mark.parametrize(
    "content",
    [b"", b"PAR1 garbage PAR1", b"ARROW1\x00\x00" + random.Random(0).randbytes(200)],
    ids=["empty", "magic", "random"],
)
def test_corrupt_table_files_raise_input_error(tmp_path, suffix, content):
    path = tmp_path / f"c{suffix}"
    path.write_bytes(content)
    with pytest.raises(InputError, match="cannot read this") as caught:
        read(CorpusReader(path))
    assert caught.value.path == str(path)


@pytest.mark.parametrize("kind", ["parquet", "arrow-file"])
def test_truncated_table_file(tmp_path, kind):
    path = write_records(tmp_path, kind, [{"id": str(i), "text": "t" * 50} for i in range(100)])
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(InputError, match="cannot read this"):
        read(CorpusReader(path))


def test_os_errors_become_input_errors(tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "a.jsonl", [{"id": "1", "text": "t"}])

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(corpus, "open", denied, raising=False)
    with pytest.raises(InputError, match=r"a.jsonl: cannot read this JSONL file: Permission denied"):
        read(CorpusReader(path))


def test_scifact_corpus(scifact):
    reader = CorpusReader(scifact / "corpus.jsonl")
    docs = read(reader)
    assert len(docs) == reader.n_docs == 5183
    assert len({doc_id for doc_id, _ in docs}) == 5183 and reader.skipped == []
    assert all(text and not text.isspace() for _, text in docs)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(st.characters(exclude_categories=("Cs",)), max_size=40), max_size=30))
def test_string_array_holds_exactly_the_strings_pa_array_would(values):
    """The reader's batches are built from UTF-8 bytes (no pandas import): the same array, ASCII or not."""
    array = corpus.string_array(values)
    array.validate(full=True)
    assert array.type == pa.string() and array.to_pylist() == values
    assert array.equals(pa.array(values, pa.string()))


def test_reading_a_corpus_does_not_import_pandas(tmp_path):
    """pyarrow imports pandas at its first conversion of a Python list, wherever pandas is installed: a noticeable
    fraction of a second on the path to an encode's first batch."""
    path = write_jsonl(tmp_path / "c.jsonl", [{"id": "a", "text": "x"}, {"id": "b", "text": "é"}])
    code = ("import sys; from lsr_index.inputs.corpus import CorpusReader; "
            f"assert [b.num_rows for b in CorpusReader({str(path)!r})] == [2]; print('pandas' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout == "False\n"
