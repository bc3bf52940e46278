"""One reading of a vector record for every reader: a record that names a term twice (`{"a": 1, "a": 2}`: JSON
parsers keep the last, Lucene adds the two up) is refused with its file and line (or Parquet row) by the fast and
the general jsonl paths, `read_shard`, Parquet, and both builders; so is a record that names one of its own fields
twice. Ids given twice across shards are refused by `build` before any Lucene write, naming both places."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_build import write_vectors

from lsr_index.engines.lucene import build
from lsr_index.errors import LsrIndexError
from lsr_index.runtime.durable import sha256_file
from lsr_index.vectors import unique
from lsr_index.vectors.shards import PARQUET_SCHEMA, ShardError, ShardRange, read_joined, read_shard

COMPACT = b'{"id":"twice","contents":"","vector":{"a":1,"b":5,"a":2}}\n'  # as json_vector_line spaces it
SPACED = b'{"id": "twice", "contents": "", "vector": {"a": 1, "b": 5, "a": 2}}\n'
ESCAPED = b'{"id":"twice","contents":"","vector":{"a":1,"\\u0062":5,"\\u0061":2}}\n'  # the same name, spelled apart
FIELDS = b'{"id":"twice","contents":"","vector":{"a":1},"vector":{"a":2}}\n'
GOOD = b'{"id":"fine","contents":"","vector":{"a:b":3,"c,d":4,"e\\"f":5}}\n'  # colons, commas, quotes in terms


def raw_vectors(out: Path, lines: list[bytes] | None = None, rows: list[tuple[str, list[str], list[int]]] | None = None
                ) -> Path:
    """A vectors directory whose one shard holds these lines (jsonl) or rows (Parquet) as written, its manifest
    listing their count and checksum."""
    count = len(lines if lines is not None else rows)
    fmt = "jsonl" if lines is not None else "parquet"
    write_vectors(out, ["a"], [(f"p{i}", {0: 1}) for i in range(count)], fmt, shard_docs=count)
    shard = out / "shards" / f"part-00000.{fmt}"
    if lines is not None:
        shard.write_bytes(b"".join(lines))
    else:
        pq.write_table(pa.table({"id": [r[0] for r in rows], "terms": [r[1] for r in rows],
                                 "weights": [r[2] for r in rows]}, schema=PARQUET_SCHEMA), shard)
    body = json.loads((out / "manifest.json").read_text())
    body["shards"][0]["sha256"] = sha256_file(shard)
    (out / "manifest.json").write_text(json.dumps(body))
    return shard


def refused(line: str, place: str, name: str = "the term 'a'") -> None:
    assert line.startswith(f"{place}: record 'twice' names {name} twice: which impact is meant cannot be told"), line


@pytest.mark.parametrize("line", [SPACED, ESCAPED, FIELDS])
def test_the_general_path_refuses_a_name_given_twice(tmp_path, line):
    shard = raw_vectors(tmp_path / "v", [GOOD, line])
    with pytest.raises(ShardError) as caught:
        list(read_joined(ShardRange(str(shard), 0, 2, 2)))
    refused(str(caught.value), f"{shard}:2", "'vector'" if line is FIELDS else "the term 'a'")


@pytest.mark.parametrize("line", [COMPACT, SPACED, ESCAPED, FIELDS])
def test_read_shard_refuses_a_name_given_twice(tmp_path, line):
    shard = raw_vectors(tmp_path / "v", [GOOD, line])
    with pytest.raises(ShardError) as caught:
        list(read_shard(shard))
    refused(str(caught.value), f"{shard}:2", "'vector'" if line is FIELDS else "the term 'a'")


def test_a_record_with_colons_commas_and_quotes_in_its_terms_is_read_whole(tmp_path):
    shard = raw_vectors(tmp_path / "v", [GOOD])
    assert list(read_shard(shard)) == [("fine", {"a:b": 3, "c,d": 4, 'e"f': 5})]


def test_parquet_refuses_a_term_given_twice(tmp_path):
    shard = raw_vectors(tmp_path / "v", rows=[("fine", ["a", "b"], [1, 2]), ("twice", ["a", "b", "a"], [1, 5, 2])])
    with pytest.raises(ShardError) as caught:
        list(read_shard(shard))
    refused(str(caught.value), f"{shard}: row 2")


@pytest.mark.lucene
@pytest.mark.parametrize("builder", ["direct", "anserini"])
@pytest.mark.parametrize("line", [COMPACT, SPACED, ESCAPED, FIELDS, "parquet"])
def test_both_builders_refuse_a_record_naming_a_term_twice(tmp_path, builder, line):
    """The compact line is what the direct builder's fast path reads without a parse (unchecked, it would sum the two
    impacts, 3, where the spaced line reads 2): the postings it makes are checked against the records' term counts."""
    if line == "parquet":
        shard = raw_vectors(tmp_path / "v", rows=[("fine", ["a"], [1]), ("twice", ["a", "b", "a"], [1, 5, 2])])
        place = f"{shard}: row 2"
    else:
        shard = raw_vectors(tmp_path / "v", [GOOD, line])
        place = f"{shard}:2"
    with pytest.raises(LsrIndexError) as caught:
        build.build_index(tmp_path / "v", tmp_path / "index", builder=builder, heap="1g", progress=False)
    refused(str(caught.value), place, "'vector'" if line is FIELDS else "the term 'a'")
    assert str(caught.value).endswith("; nothing was published") and not (tmp_path / "index").exists()


# --- ids given twice ---------------------------------------------------------------------------------------------

@pytest.mark.lucene
@pytest.mark.parametrize("builder", ["direct", "anserini"])
@pytest.mark.parametrize("fmt", ["jsonl.gz", "parquet"])
def test_an_id_in_two_shards_is_refused_before_any_lucene_write(tmp_path, monkeypatch, builder, fmt):
    """Both places named (file and line, or Parquet row); no writer is handed its work, Anserini never starts."""
    monkeypatch.setattr(build._Writers, "send", lambda self, jobs: pytest.fail("a writer got its work"))
    monkeypatch.setattr(build, "_stage_input", lambda *a: pytest.fail("Anserini's input was staged"))
    docs = [("d0", {0: 1}), ("x", {0: 2}), ("d2", {1: 3}), ("d3", {0: 4}), ("x", {1: 5})]
    write_vectors(tmp_path / "v", ["a", "b"], docs, fmt, shard_docs=3)
    shards = tmp_path / "v" / "shards"
    first, second = ((f"{shards / f'part-00000.{fmt}'}:2", f"{shards / f'part-00001.{fmt}'}:2") if fmt != "parquet"
                     else (f"{shards / 'part-00000.parquet'}: row 2", f"{shards / 'part-00001.parquet'}: row 2"))
    said = re.escape(f"document id 'x' is given twice, at {first} and at {second}: ")
    with pytest.raises(LsrIndexError, match=f"^{said}a run could not tell the two documents apart; .*; nothing was "
                                            "published$"):
        build.build_index(tmp_path / "v", tmp_path / "index", builder=builder, heap="1g", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".index.lock", "v"]


def test_ids_whose_hashes_collide_are_compared_exactly(tmp_path, monkeypatch):
    """Every id hashed alike: the exact recheck finds no id given twice, then the real one."""
    from lsr_index.vectors.manifest import Manifest

    write_vectors(tmp_path / "v", ["a"], [(f"d{i}", {0: 1}) for i in range(7)], "jsonl", shard_docs=3)
    monkeypatch.setattr(unique, "hash", lambda doc_id: 7, raising=False)
    assert unique.repeated_id(tmp_path / "v", Manifest.load(tmp_path / "v")) is None
    write_vectors(tmp_path / "w", ["a"], [("d0", {0: 1}), ("d\u00e9", {0: 1}), ("d\u00e9", {0: 1})], "jsonl")
    assert unique.repeated_id(tmp_path / "w", Manifest.load(tmp_path / "w")).startswith(
        f"document id 'dé' is given twice, at {tmp_path / 'w' / 'shards' / 'part-00000.jsonl'}:2 and at ")


def test_an_escaped_id_is_the_same_id(tmp_path):
    """The id pass reads ids without a parse where no escape is in them: "\\u0078" is still x."""
    from lsr_index.vectors.manifest import Manifest

    raw_vectors(tmp_path / "v", [b'{"id":"x","contents":"","vector":{"a":1}}\n',
                                 b'{"id":"\\u0078","contents":"","vector":{"a":2}}\n'])
    assert "document id 'x' is given twice" in unique.repeated_id(tmp_path / "v", Manifest.load(tmp_path / "v"))


def test_inspect_refuses_a_term_given_twice_in_one_line(tmp_path):
    from lsr_index.inspect import documents

    shard = raw_vectors(tmp_path / "v", [GOOD, COMPACT])
    with pytest.raises(LsrIndexError) as caught:
        documents(tmp_path / "v", ["twice"], 5)
    refused(str(caught.value), f"{shard}:2")
