"""The direct impact builder: the same search results as Anserini's fake-word index, every vocabulary, and
`--overwrite` that replaces only what it owns. Real Lucene indexes, real model, real processes throughout."""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from terminal import on_terminal

from lsr_index.encode.job import EncodeJob, EncodeOptions
from lsr_index.encode.run import encode_corpus
from lsr_index.engines.lucene import build
from lsr_index.errors import LsrIndexError
from lsr_index.vectors import shards
from lsr_index.vectors.manifest import Manifest
from lsr_index.vectors.quantize import SparseVectors
from lsr_index.vectors.shards import DELIMITER, FORM, free_form

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample"
LSR = [sys.executable, "-m", "lsr_index", "--quiet"]
INT32_MAX = 2**31 - 1

pytestmark = pytest.mark.lucene


def write_vectors(out: Path, vocab: list[str], docs: list[tuple[str, dict[int, int]]], fmt: str,
                  shard_docs: int = 3) -> Manifest:
    """A complete vectors directory from (id, {term index: impact}) rows, by the real ShardWriter."""
    def shard(chunk):
        indptr = np.cumsum([0] + [len(v) for _, v in chunk])
        terms = np.array([t for _, v in chunk for t in sorted(v)], np.int32)
        weights = np.array([v[t] for _, v in chunk for t in sorted(v)], np.int32)
        yield [d for d, _ in chunk], SparseVectors(indptr.astype(np.int64), terms, weights)

    return shards.write_vectors(out, vocab, (shard(docs[s:s + shard_docs]) for s in range(0, len(docs), shard_docs)),
                                 fmt, encoder={"query_max_length": 16})


def search(index: Path, queries: list[tuple[str, dict[str, int]]], hits: int = 1000) -> dict:
    from lsr_index.engines.lucene.searcher import ImpactSearcher

    searcher = ImpactSearcher(index)
    try:
        return searcher.search(queries, hits=hits, threads=2)
    finally:
        searcher.close()


# --- identical search: direct vs Anserini on the sample ----------------------------------------------

@pytest.fixture(scope="module")
def sample_queries(splade_tiny, tmp_path_factory):
    """The sample encoded once per shard format; its 60 queries encoded as the index's records say."""
    from lsr_index.inputs.topics import read_queries
    from lsr_index.search import encode_queries, load_query_encoder

    work = tmp_path_factory.mktemp("sample")
    for fmt in ("jsonl.gz", "parquet"):
        encode_corpus(EncodeJob(inputs=(str(SAMPLE / "corpus.jsonl"),), options=EncodeOptions(
            doc_max_length=96, shard_docs=150, output_format=fmt, progress=False)), work / fmt)
    build.build_index(work / "jsonl.gz", work / "anserini", builder="anserini", threads=2, heap="1g",
                      progress=False)
    encoder, quantization, _ = load_query_encoder(work / "anserini", None, "cpu", "auto")
    queries = encode_queries(encoder, quantization, read_queries(SAMPLE / "queries.tsv"), 64)
    return work, queries, search(work / "anserini", queries)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["jsonl.gz", "parquet"])
@pytest.mark.parametrize("writers", [1, 2])
def test_direct_index_searches_exactly_like_anserinis(sample_queries, tmp_path, fmt, writers):
    """Top-1000 ids, order and scores of all 60 sample queries; two writers merge into the same results."""
    work, queries, expected = sample_queries
    info = build.build_index(work / fmt, tmp_path / "index", threads=writers, heap="1g", progress=False)
    assert (info.builder, info.writers, info.documents) == ("direct", writers, 400)
    assert search(tmp_path / "index", queries) == expected
    assert len(expected) == 60 and sum(len(hits) for hits in expected.values()) > 60 * 300


# --- every vocabulary -------------------------------------------------------------------------------

VOCAB = ["plain", DELIMITER, f"a{DELIMITER}b", "|", "a|b", "##x", "naïve", "日本語", "😀", "x" * 5000,
         "é" * 16_000, "\x02\x03\x04\x05\x06\x07\x08\x0e\x0f\x10|^~", "max"]
DOCS = [("one-term", {0: 7}), ("delims", {1: 3, 2: 4, 3: 5, 4: 6}), ("pieces", {5: 2, 6: 9, 7: 11, 8: 13}),
        ("long", {9: 17, 10: 19}), ("all-spares", {11: 21, 0: 2}), ("largest", {12: INT32_MAX}),
        ("mixed", {0: 1, 3: 2, 6: 3, 9: 4, 12: 5})]


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz", "parquet"])
def test_every_term_is_indexed_with_its_impact(tmp_path, fmt):
    """Delimiter candidates inside terms, `|`, `##x`, non-ASCII, emoji, terms of 5,000 and 32,000 bytes,
    one-term documents and the largest impact: each term query scores exactly impact × weight (no ties:
    Anserini nudges tied scores apart)."""
    write_vectors(tmp_path / "vectors", VOCAB, DOCS, fmt)
    build.build_index(tmp_path / "vectors", tmp_path / "index", progress=False)
    queries = [(f"q{t}", {term: 1}) for t, term in enumerate(VOCAB)] + [("q-all", {term: 2 for term in VOCAB[:9]})]
    ranked = search(tmp_path / "index", queries)
    for qid, query in queries:
        scores = {d: sum(w * v.get(VOCAB.index(t), 0) for t, w in query.items()) for d, v in DOCS}
        exact = sorted(((d, float(np.float32(s))) for d, s in scores.items() if s), key=lambda x: (-x[1], x[0]))
        assert ranked[qid] == exact, (qid, query)
    assert ranked["q12"] == [("largest", float(np.float32(INT32_MAX))), ("mixed", 5.0)]


def test_no_more_writer_processes_than_cores(tmp_path, monkeypatch):
    """Each writer is a JVM: --threads above the cores available starts one per core (not one per document range,
    up to one per document), and the index holds every document."""
    monkeypatch.setattr(build, "host_cores", lambda: 2)
    write_vectors(tmp_path / "vectors", VOCAB, DOCS, "jsonl")
    info = build.build_index(tmp_path / "vectors", tmp_path / "index", threads=len(DOCS), progress=False)
    assert (info.writers, info.threads, info.documents) == (2, len(DOCS), len(DOCS))


def test_a_free_form_avoids_every_character_the_terms_use():
    assert free_form(["plain", "a|b"]) == FORM
    assert free_form(["a b", "c\x01d"]) == "\x02\x03"
    spares = "\x02\x03\x04\x05\x06\x07\x08\x0e\x0f\x10|^~"
    assert free_form([spares, " \x01", "\ue000"]) == "\ue001\ue002"


@pytest.mark.parametrize(("vector", "message"), [
    ({0: 3}, r"holds the term 'ééé.* of 40,000 UTF-8 bytes, over Lucene's limit of 32,766, which Lucene cannot "
             "index"),
    ({1: INT32_MAX, 2: 1}, r"cannot be indexed: .*too many tokens"),  # impacts summing past 2^31 - 1
    ({3: 4}, r"holds the empty term, which Lucene cannot index"),
])
@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_record_lucene_cannot_hold_is_named_with_its_place(tmp_path, vector, message, fmt):
    write_vectors(tmp_path / "vectors", ["é" * 20_000, "a", "b", ""], [("fine", {1: 1}), ("bad", vector)], fmt)
    place = re.escape(f"{tmp_path / 'vectors' / 'shards' / f'part-00000.{fmt}'}" + (":2" if fmt == "jsonl" else
                                                                                     ": row 2"))
    with pytest.raises(LsrIndexError, match=rf"^{place}: record 'bad' {message}.*; nothing was published$"):
        build.build_index(tmp_path / "vectors", tmp_path / "index", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".index.lock", "vectors"]  # nothing else


def test_empty_vectors_are_indexed_by_direct_and_named_by_anserini(tmp_path):
    """An empty vector is a document no query retrieves: direct indexes its id; Anserini skips it, and the
    error names that document instead of only the counts."""
    write_vectors(tmp_path / "vectors", ["a", "b"], [("d0", {0: 2}), ("empty", {}), ("d2", {1: 3})], "jsonl.gz")
    info = build.build_index(tmp_path / "vectors", tmp_path / "direct", progress=False)
    assert info.documents == 3
    assert search(tmp_path / "direct", [("q", {"a": 1, "b": 1})])["q"] == [("d2", 3.0), ("d0", 2.0)]
    with pytest.raises(LsrIndexError, match=r"holds 2 documents but the manifest lists 3; not publishing it: "
                                            r"document 'empty' in .*part-00000.jsonl.gz has an empty vector, "
                                            "which the anserini builder skips; build with --builder direct"):
        build.build_index(tmp_path / "vectors", tmp_path / "anserini", builder="anserini", progress=False)


# --- --overwrite replaces only what the build owns -----------------------------------------------

def _build_cli(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*LSR, "-w", str(workdir), "build", *args], capture_output=True, text=True, timeout=300)


def _tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if not p.name.endswith(".lock"))


def test_overwrite_never_replaces_the_directory_holding_the_vectors(tmp_path):
    """`lsr-index -w r build --index r --overwrite` names the work directory as the index: replacing it would delete
    r/vectors, r/runs and all of r."""
    work = tmp_path / "r"
    write_vectors(work / "vectors", ["a", "b"], [("d0", {0: 1}), ("d1", {1: 2})], "jsonl")
    (work / "runs").mkdir()
    (work / "runs" / "q.trec").write_text("q Q0 d0 1 1.0 x\n")
    before = _tree(work)
    for index in (work, work / "vectors"):
        done = _build_cli(work, "--index", str(index), "--overwrite")
        assert done.returncode == 1 and "Traceback" not in done.stderr
        assert done.stderr.strip() == f"error: {index} holds the input vectors ({work / 'vectors'}); --overwrite " \
                                      "never replaces them: choose another --index"
        assert _tree(work) == before


def test_overwrite_replaces_only_an_index_or_an_empty_directory(tmp_path):
    vectors = tmp_path / "vectors"
    write_vectors(vectors, ["a", "b"], [("d0", {0: 1}), ("d1", {1: 2})], "jsonl")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "lsr-index.json").write_text("{}")
    (tmp_path / "link").symlink_to(target)
    for index, message in [(mine, f"{mine} is not an lsr-index index (no lsr-index.json) and not empty"),
                           (tmp_path / "link", f"{tmp_path / 'link'} is a symbolic link")]:
        with pytest.raises(LsrIndexError, match=re.escape(message)):
            build.build_index(vectors, index, overwrite=True, progress=False)
    assert (mine / "notes.txt").read_text() == "keep" and _tree(target) == ["lsr-index.json"]
    (tmp_path / "empty").mkdir()
    for index in (tmp_path / "empty", tmp_path / "empty"):  # an empty directory, then the index built there
        assert build.build_index(vectors, index, overwrite=True, progress=False).documents == 2


def test_a_replaced_index_held_by_a_search_is_retired_then_removed(tmp_path):
    """A search holds a shared flock on the index directory: `--overwrite` publishes the new index but keeps
    the old generation (hidden) until the search ends; a later build removes it."""
    vectors, index = tmp_path / "vectors", tmp_path / "index"
    write_vectors(vectors, ["a", "b"], [("d0", {0: 1}), ("d1", {1: 2})], "jsonl")
    build.build_index(vectors, index, progress=False)
    first = json.loads((index / "lsr-index.json").read_text())
    held = os.open(index, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(held, fcntl.LOCK_SH)
    try:
        done = _build_cli(tmp_path, "--vectors", str(vectors), "--index", str(index), "--overwrite")
        assert done.returncode == 0, done.stderr
        (retired,) = [p for p in tmp_path.iterdir() if p.name.startswith(".index.retired-")]
        assert json.loads((retired / "lsr-index.json").read_text()) == first  # the old generation, whole
        assert os.path.samestat(os.fstat(held), retired.stat())
        assert "segments_1" in os.listdir(held)  # the search reads on
        build.build_index(vectors, index, overwrite=True, progress=False)  # still held: kept
        assert retired.exists()
    finally:
        os.close(held)
    build.build_index(vectors, index, overwrite=True, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".index.lock", "index", "vectors"]


@pytest.mark.slow
def test_the_progress_bar_counts_documents_against_the_manifest(tmp_path):
    """On a terminal, the direct builder shows documents done / total (from the manifest), docs/s and ETA."""
    from test_faults import synthetic_vectors

    synthetic_vectors(tmp_path / "vectors", docs=6000, terms=30, shard_docs=3000)
    built = on_terminal([sys.executable, "-m", "lsr_index", "build", "--vectors", str(tmp_path / "vectors"),
                         "--index", str(tmp_path / "index"), "--heap", "1g"], columns=120)
    text = built.stderr
    assert built.returncode == 0, text
    assert "check shards: 100%" in text and "2/2 [" in text
    assert "index (1 writer): 100%" in text and "6000/6000 [" in text and " doc/s]" in text, text
    assert "indexed 6,000 documents into" in built.stdout + text


@pytest.mark.parametrize("fmt", ["jsonl.gz", "parquet"])
def test_a_manifest_that_miscounts_a_shard_is_refused_not_indexed_short(tmp_path, fmt):
    """The checksum proves a shard is the file encode wrote, not that the manifest's count of its records is: a
    last shard listed with 1 document of its 3 would be indexed as 1 (the other 2 dropped without a word)."""
    out = tmp_path / "vectors"
    write_vectors(out, ["a", "b"], [(f"d{i}", {0: 5, 1: i + 1}) for i in range(9)], fmt)
    body = json.loads((out / "manifest.json").read_text())
    body["shards"][-1]["docs"], body["docs"] = 1, 7
    (out / "manifest.json").write_text(json.dumps(body))
    with pytest.raises(LsrIndexError, match=re.escape(f"{out / body['shards'][-1]['file']}: holds ") +
                       r"(more than 1|3) records where its manifest lists 1: the manifest was edited"):
        build.build_index(out, tmp_path / "index", heap="256m", progress=False)
    assert not (tmp_path / "index").exists()
    body["docs"] = 9  # the total no longer the shards' sum: refused when the manifest is read
    (out / "manifest.json").write_text(json.dumps(body))
    with pytest.raises(LsrIndexError, match="its shards hold 7 documents but it records 9: it was edited"):
        build.build_index(out, tmp_path / "index", heap="256m", progress=False)


@pytest.mark.parametrize("heap", ["512", "1m", "abc", "1.5g", "", "4g ", "100000000000000t"])
def test_a_heap_the_jvm_cannot_take_is_one_line_before_any_writer(tmp_path, heap):
    """`--heap 512` (bytes, as java reads it): the JVM's refusal comes on its stdout, where a writer's progress counts
    come, and read as one it would end in a ValueError traceback."""
    out = tmp_path / "vectors"
    write_vectors(out, ["a"], [("d0", {0: 5})], "jsonl")
    done = subprocess.run([*LSR, "build", "--vectors", str(out), "--index", str(tmp_path / "index"), "--heap", heap],
                          capture_output=True, text=True)
    assert done.returncode == 1 and done.stderr.startswith(f"error: --heap {heap!r}: "), done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "index").exists()


def test_what_a_jvm_prints_on_a_writers_stdout_is_not_a_progress_count(tmp_path):
    out = tmp_path / "vectors"
    write_vectors(out, ["a", "b"], [(f"d{i}", {0: 5, 1: i + 1}) for i in range(5)], "jsonl")
    done = subprocess.run([*LSR, "build", "--vectors", str(out), "--index", str(tmp_path / "index"), "--heap", "256m"],
                          capture_output=True, text=True,
                          env={**os.environ, "JAVA_TOOL_OPTIONS": "-XX:+PrintCommandLineFlags"})
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "index" / "lsr-index.json").read_text())["documents"] == 5
