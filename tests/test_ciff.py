"""CIFF export: the file read back (by a decoder written from the format's definition, and by protobuf's own
parser where it is installed) holds exactly the shards' documents, terms and impacts."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from lsr_index.engines.ciff import export_ciff
from lsr_index.vectors import shards
from lsr_index.vectors.quantize import SparseVectors


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        shift += 7
        if not byte & 0x80:
            return value, at


def _fields(data: bytes) -> list[tuple[int, object]]:
    """A message's (field number, value) pairs: varints as ints, 64-bit as doubles, length-delimited as bytes."""
    out, at = [], 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(data, at)
        elif wire == 1:
            value, at = struct.unpack("<d", data[at:at + 8])[0], at + 8
        elif wire == 2:
            size, at = _varint(data, at)
            value, at = data[at:at + size], at + size
        else:
            raise AssertionError(f"wire type {wire}")
        out.append((number, value))
    return out


def _messages(data: bytes) -> list[bytes]:
    out, at = [], 0
    while at < len(data):
        size, at = _varint(data, at)
        out.append(data[at:at + size])
        at += size
    return out


def read_ciff(path: Path) -> tuple[dict, dict[str, list[tuple[int, int]]], list[tuple[int, str, int]], dict]:
    """(header, {term: [(docid, tf)]} with gaps undone, [(docid, id, length)], {term: (df, cf)})."""
    messages = _messages(path.read_bytes())
    header = dict(_fields(messages[0]))
    lists, stats = {}, {}
    for message in messages[1:1 + header.get(2, 0)]:
        fields = _fields(message)
        term = next(v for n, v in fields if n == 1).decode()
        postings, doc = [], 0
        for number, value in fields:
            if number == 4:
                posting = dict(_fields(value))
                doc += posting.get(1, 0)
                postings.append((doc, posting[2]))
        stats[term] = (dict(fields).get(2, 0), dict(fields).get(3, 0))
        lists[term] = postings
    records = []
    for message in messages[1 + header.get(2, 0):]:
        fields = dict(_fields(message))
        records.append((fields.get(1, 0), fields.get(2, b"").decode(), fields.get(3, 0)))
    assert len(records) == header.get(3, 0)
    return header, lists, records, stats


def _corpus(rng: np.random.Generator) -> list[tuple[str, dict[str, int]]]:
    vocab = [f"t{i}" for i in range(40)] + ["é", "文", "🙂", "Z"]
    docs = []
    for i in range(230):
        length = 0 if i % 17 == 3 else int(rng.integers(1, 15))
        terms = rng.choice(len(vocab), length, replace=False)
        docs.append((f"doc-{i}-{'ü🙂'[i % 2]}", {vocab[t]: int(w) for t, w in
                                               zip(terms, rng.integers(1, 300_000, length))}))
    return docs


def _write(out: Path, docs, fmt: str) -> None:
    vocab = sorted({t for _, v in docs for t in v})
    column = {t: i for i, t in enumerate(vocab)}

    def shard(chunk):
        rows = [sorted((column[t], w) for t, w in v.items()) for _, v in chunk]
        indptr = np.cumsum([0] + [len(r) for r in rows]).astype(np.int64)
        yield [d for d, _ in chunk], SparseVectors(indptr, np.array([t for r in rows for t, _ in r], np.int32),
                                                   np.array([w for r in rows for _, w in r], np.int32))

    shards.write_vectors(out, vocab, (shard(docs[s:s + 60]) for s in range(0, len(docs), 60)), fmt)


@pytest.mark.parametrize(("fmt", "memory"), [("parquet", 4 << 30), ("jsonl.gz", 12_000)])
def test_ciff_holds_exactly_the_shards(tmp_path, seed, fmt, memory):
    """One reading, or several term ranges (a small memory): the same postings, terms in UTF-8 order."""
    docs = _corpus(np.random.default_rng(seed))
    _write(tmp_path / "vectors", docs, fmt)
    info = export_ciff(tmp_path / "vectors", tmp_path / "out.ciff", memory=memory)
    assert (info["passes"] > 1) == (memory < 1 << 20)
    header, lists, records, stats = read_ciff(tmp_path / "out.ciff")
    expected: dict[str, list[tuple[int, int]]] = {}
    for k, (_, vector) in enumerate(docs):
        for term, impact in vector.items():
            expected.setdefault(term, []).append((k, impact))
    assert lists == expected
    assert list(lists) == sorted(expected, key=lambda t: t.encode())
    assert all(stats[t] == (len(p), sum(w for _, w in p)) for t, p in expected.items())
    lengths = [sum(v.values()) for _, v in docs]
    assert records == [(k, d, lengths[k]) for k, (d, _) in enumerate(docs)]
    assert header[1] == 1 and header[2] == header[4] == len(expected) and header[3] == header[5] == len(docs)
    assert header[6] == sum(lengths) and header[7] == pytest.approx(sum(lengths) / len(docs))
    assert not list(tmp_path.glob(".out.ciff*"))


def test_protobuf_reads_the_ciff_file(tmp_path, seed):
    """The file parsed by protobuf itself, from the format's .proto definition."""
    pytest.importorskip("google.protobuf")
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    from google.protobuf.internal.decoder import _DecodeVarint

    field = descriptor_pb2.FieldDescriptorProto
    definition = descriptor_pb2.FileDescriptorProto(name="ciff.proto", package="ciff", syntax="proto3")
    for name, spec in {"Header": [("version", 1, "INT32"), ("num_postings_lists", 2, "INT32"),
                                  ("num_doc_records", 3, "INT32"), ("total_postings_lists", 4, "INT32"),
                                  ("total_docs", 5, "INT32"), ("total_terms_in_collection", 6, "INT64"),
                                  ("average_doclength", 7, "DOUBLE"), ("description", 8, "STRING")],
                       "Posting": [("docid", 1, "INT32"), ("tf", 2, "INT32")],
                       "PostingsList": [("term", 1, "STRING"), ("df", 2, "INT64"), ("cf", 3, "INT64"),
                                        ("postings", 4, "MESSAGE")],
                       "DocRecord": [("docid", 1, "INT32"), ("collection_docid", 2, "STRING"),
                                     ("doclength", 3, "INT32")]}.items():
        message = definition.message_type.add(name=name)
        for fname, number, kind in spec:
            message.field.add(name=fname, number=number, type=getattr(field, f"TYPE_{kind}"),
                              label=field.LABEL_REPEATED if kind == "MESSAGE" else field.LABEL_OPTIONAL,
                              type_name=".ciff.Posting" if kind == "MESSAGE" else None)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(definition)
    classes = {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"ciff.{n}"))
               for n in ("Header", "PostingsList", "DocRecord")}
    docs = _corpus(np.random.default_rng(seed))
    _write(tmp_path / "vectors", docs, "parquet")
    export_ciff(tmp_path / "vectors", tmp_path / "out.ciff")
    data, at, parsed = (tmp_path / "out.ciff").read_bytes(), 0, []
    header = None
    while at < len(data):
        size, at = _DecodeVarint(data, at)
        kind = "Header" if header is None else "PostingsList" if len(parsed) < header.num_postings_lists \
            else "DocRecord"
        message = classes[kind].FromString(data[at:at + size])
        at += size
        if header is None:
            header = message
        else:
            parsed.append(message)
    lists, records = parsed[:header.num_postings_lists], parsed[header.num_postings_lists:]
    assert header.num_doc_records == len(records) == len(docs)
    assert [r.collection_docid for r in records] == [d for d, _ in docs]
    by_term = {pl.term: np.cumsum([p.docid for p in pl.postings]).tolist() for pl in lists}
    assert by_term == {t: [k for k, (_, v) in enumerate(docs) if t in v] for pl in lists for t in [pl.term]}
    assert sum(p.tf for pl in lists for p in pl.postings) == header.total_terms_in_collection


def test_the_python_api_writes_the_same_ciff_file(tmp_path, seed):
    from lsr_index import api

    _write(tmp_path / "vectors", _corpus(np.random.default_rng(seed)), "parquet")
    info = api.export_ciff(tmp_path / "vectors", tmp_path / "api.ciff")
    export_ciff(tmp_path / "vectors", tmp_path / "direct.ciff")
    assert info["bytes"] > 0 and (tmp_path / "api.ciff").read_bytes() == (tmp_path / "direct.ciff").read_bytes()
