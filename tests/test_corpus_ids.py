"""Document ids the output formats cannot hold are refused at the reader: run and qrels
files are whitespace-separated, and Lucene cannot index a term over 32,766 UTF-8 bytes."""

from __future__ import annotations

import sys
import unicodedata

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lsr_index.errors import InputError, LsrIndexError
from lsr_index.inputs.corpus import CorpusReader, Fields
from lsr_index.inputs.ids import MAX_ID_BYTES, check_id

# Ids that would be written into a run file as more (or fewer) columns than they are.
SPLIT_IDS = {
    "space": "a b",
    "tab": "a\tb",
    "no-break space": "a\u00a0b",
    "line separator": "a\u2028b",
    "next line": "a\u0085b",
    "unit separator": "a\u001fb",
    "leading space": " rel",
    "trailing space": "rel ",
    "ideographic space": "a\u3000b",
    "paragraph separator": "a\u2029b",
    "control": "a\u0001b",
    "delete": "a\u007fb",
}


def test_check_id_refuses_exactly_whitespace_controls_and_surrogates():
    for code in range(sys.maxunicode + 1):
        char = chr(code)
        expected = char.isspace() or unicodedata.category(char) in ("Cc", "Cs")
        assert (check_id(f"x{char}y") is not None) is expected, f"U+{code:04X}"


@pytest.mark.parametrize("doc_id", list(SPLIT_IDS.values()), ids=list(SPLIT_IDS))
def test_check_id_names_the_character_and_its_place(doc_id):
    problem = check_id(doc_id)
    position = next(i for i, c in enumerate(doc_id, 1) if c.isspace() or unicodedata.category(c) == "Cc")
    assert f"(U+{ord(doc_id[position - 1]):04X} at character {position})" in problem
    assert problem.startswith(f"id {doc_id!r} contains ") and "\n" not in problem


def test_check_id_at_lucenes_term_limit():
    assert check_id("x" * MAX_ID_BYTES) is None
    assert "32,767 UTF-8 bytes, over Lucene's limit of 32,766" in check_id("x" * (MAX_ID_BYTES + 1))
    three_byte = "日" * (MAX_ID_BYTES // 3)  # 32,766 bytes in 10,922 characters
    assert check_id(three_byte) is None and check_id(three_byte + "a") is not None
    assert len(check_id("x" * 10**6)) < 200  # the message quotes the start of the id only


def test_check_id_accepts_ordinary_and_format_characters():
    for doc_id in ["d1", "MED-10", "naïve-日本-🙂", 'q"uote', "zero\u200bwidth", "\ufeffbom", "a,b;c"]:
        assert check_id(doc_id) is None, doc_id
    assert check_id("") == "id '' is empty"


def write(tmp_path, kind: str, ids: list[str]):
    if kind == "jsonl":
        path = tmp_path / "c.jsonl"
        path.write_bytes(b"".join(orjson.dumps({"id": i, "text": "t"}) + b"\n" for i in ids))
    else:
        path = tmp_path / "c.parquet"
        pq.write_table(pa.table({"id": ids, "text": ["t"] * len(ids)}), path)
    return path


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
@pytest.mark.parametrize("doc_id", list(SPLIT_IDS.values()), ids=list(SPLIT_IDS))
def test_an_id_a_run_file_cannot_hold_fails_with_file_and_row(tmp_path, kind, doc_id):
    path = write(tmp_path, kind, ["first", doc_id, "last"])
    with pytest.raises(InputError) as caught:
        list(CorpusReader(path))
    assert (caught.value.path, caught.value.where) == (str(path), 2)
    assert caught.value.reason == check_id(doc_id)
    assert "whitespace-separated run and qrels files" in caught.value.hint and "--on-error skip" in caught.value.hint


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_refused_ids_are_skipped_and_listed(tmp_path, kind):
    """An id with whitespace ("rel " would merge with "rel" in a run file and change nDCG@10) and one over Lucene's
    limit are skipped and listed with their line."""
    path = write(tmp_path, kind, ["rel", "mid", "rel ", "x" * (MAX_ID_BYTES + 1)])
    reader = CorpusReader(path, on_error="skip")
    assert [i for b in reader for i in b.column("id").to_pylist()] == ["rel", "mid"]
    assert [(s.where, s.doc_id) for s in reader.skipped] == [(3, None), (4, None)]
    assert "whitespace (U+0020 at character 4)" in reader.skipped[0].reason
    assert "over Lucene's limit" in reader.skipped[1].reason


def test_empty_field_names_are_a_project_error():
    """The CLI turns LsrIndexError into one line: `--id-field ''` must not be a traceback."""
    for bad in ({"id": ""}, {"text": ("",)}, {"text": ()}):
        with pytest.raises(LsrIndexError, match="field names must be non-empty"):
            Fields(**bad)
