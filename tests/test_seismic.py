"""The Seismic engine on real Seismic indexes: built from vectors written by the real ShardWriter, searched, and
compared with the exact integer dot product computed here by brute force."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from lsr_index.engines.seismic import build as seismic_build
from lsr_index.engines.seismic.build import build_files, verify
from lsr_index.engines.seismic.layout import INDEX_FILE, RECORD, crc32_file
from lsr_index.engines.seismic.options import SeismicBuild, SeismicSearch
from lsr_index.engines.seismic.searcher import Searcher
from lsr_index.errors import LsrIndexError
from lsr_index.vectors import shards
from lsr_index.vectors.manifest import Manifest
from lsr_index.vectors.quantize import SparseVectors

pytest.importorskip("seismic")

# Unpruned lists, every list of the query, every block: Seismic is then exact
EXACT_BUILD = SeismicBuild(n_postings=1_000_000, max_fraction=1.0)
EXACT_SEARCH = SeismicSearch(query_cut=100_000, heap_factor=0.0)

Docs = list[tuple[str, dict[str, int]]]


def random_docs(rng: np.random.Generator, n: int, vocab: int, longest: int, top: int, empty: float = 0.05) -> Docs:
    """Documents of 0..longest distinct terms with impacts in 1..top (small: many tied scores)."""
    docs = []
    for i in range(n):
        length = 0 if rng.random() < empty else int(rng.integers(1, longest + 1))
        terms = rng.choice(vocab, length, replace=False)
        docs.append((f"d{i:05d}", {f"t{t}": int(w) for t, w in zip(terms, rng.integers(1, top + 1, length))}))
    return docs


def random_queries(rng: np.random.Generator, n: int, vocab: int, longest: int, top: int) -> Docs:
    return [(f"q{i}", {f"t{t}": int(w) for t, w in zip(rng.choice(vocab, length, replace=False),
                                                          rng.integers(1, top + 1, length))})
            for i, length in enumerate(rng.integers(1, longest + 1, n))]


def write(out: Path, docs: Docs, fmt: str, shard_docs: int = 97) -> Manifest:
    """A vectors directory of `docs` in shards of `shard_docs`, by the real ShardWriter."""
    vocab = sorted({t for _, v in docs for t in v})
    column = {t: i for i, t in enumerate(vocab)}

    def shard(chunk: Docs):
        rows = [sorted((column[t], w) for t, w in v.items()) for _, v in chunk]
        indptr = np.cumsum([0] + [len(r) for r in rows]).astype(np.int64)
        yield [d for d, _ in chunk], SparseVectors(indptr, np.array([t for r in rows for t, _ in r], np.int32),
                                                   np.array([w for r in rows for _, w in r], np.int32))

    return shards.write_vectors(out, vocab, (shard(docs[s:s + shard_docs]) for s in range(0, len(docs), shard_docs)),
                                fmt)


def build(tmp: Path, docs: Docs, fmt: str = "parquet", options: SeismicBuild = EXACT_BUILD, **kwargs) -> Path:
    vectors, work = tmp / f"vectors-{fmt}", tmp / f"index-{fmt}"
    manifest = write(vectors, docs, fmt, **kwargs)
    work.mkdir()
    build_files(vectors, manifest, work, options=options, progress=False)
    return work


def brute_force(docs: Docs, query: dict[str, int]) -> list[tuple[str, float]]:
    """Every document sharing a term with the query: exact score descending, docid ascending."""
    scored = [(d, sum(w * query.get(t, 0) for t, w in v.items())) for d, v in docs if set(v) & set(query)]
    return sorted(((d, float(s)) for d, s in scored), key=lambda hit: (-hit[1], hit[0]))


def assert_ranking(got: list[tuple[str, float]], exact: list[tuple[str, float]], k: int) -> None:
    """The top k of `exact`, up to which of the documents tied at the k-th score are kept (an engine's choice)."""
    expected = exact[:k]
    assert [s for _, s in got] == [s for _, s in expected]
    if not expected:
        return
    cut = expected[-1][1]
    assert [d for d, s in got if s > cut] == [d for d, s in expected if s > cut]
    tied = [d for d, s in got if s == cut]
    assert tied == sorted(tied) and set(tied) <= {d for d, s in exact if s == cut}


@pytest.mark.parametrize("fmt", ["jsonl.gz", "parquet"])
def test_the_exact_setting_finds_the_exact_top_k(tmp_path, seed, fmt):
    """Ids, scores and order against brute force, ties included, for k below, at and above the documents."""
    rng = np.random.default_rng(seed)
    docs = random_docs(rng, 400, vocab=60, longest=12, top=4)
    queries = random_queries(rng, 40, vocab=70, longest=10, top=3)  # t60..t69: terms no document has
    searcher = Searcher(build(tmp_path, docs, fmt), EXACT_SEARCH)
    try:
        assert searcher.documents == 400
        for k in (1, 7, 50, 400, 10_000):
            run = searcher.search(queries, hits=k)
            assert list(run) == [qid for qid, _ in queries]
            for qid, query in queries:
                assert_ranking(run[qid], brute_force(docs, query), k)
            assert searcher.search(queries, hits=k, threads=2) == run
    finally:
        searcher.close()


def test_scores_are_exact_dot_products_at_the_default_setting(tmp_path, seed):
    """Approximate or not, every hit is a document that shares a term with the query, scored exactly, in order."""
    rng = np.random.default_rng(seed)
    docs = random_docs(rng, 3000, vocab=400, longest=60, top=250, empty=0.01)
    queries = random_queries(rng, 30, vocab=400, longest=40, top=300)
    searcher = Searcher(build(tmp_path, docs, options=SeismicBuild(n_postings=40)))
    vectors = dict(docs)
    try:
        run = searcher.search(queries, hits=10)
        found = 0
        for qid, query in queries:
            hits = run[qid]
            assert hits == sorted(hits, key=lambda hit: (-hit[1], hit[0])) and len(hits) <= 10
            for doc, score in hits:
                assert score == sum(w * query.get(t, 0) for t, w in vectors[doc].items()) > 0
            exact = {d for d, _ in brute_force(docs, query)[:10]}
            found += len(exact & {d for d, _ in hits})
        assert found >= 0.5 * 10 * len(queries)  # approximate, but not blind
    finally:
        searcher.close()


def test_a_query_is_scored_exactly_past_float32s_integers(tmp_path):
    """Query impacts over 2²⁴ (float32 rounds them): the hits are rescored in integers."""
    docs = [("a", {"x": 2048, "y": 1}), ("b", {"x": 2047, "y": 3}), ("c", {"y": 2048})]
    searcher = Searcher(build(tmp_path, docs), EXACT_SEARCH)
    query = {"x": 2**31 - 1, "y": 2**30 + 1}
    try:
        assert searcher.search([("q", query)], hits=3)["q"] == brute_force(docs, query)
    finally:
        searcher.close()


def test_unknown_terms_are_ignored_and_hits_capped_at_the_documents(tmp_path, seed):
    rng = np.random.default_rng(seed)
    docs = random_docs(rng, 30, vocab=20, longest=5, top=9, empty=0.0)
    searcher = Searcher(build(tmp_path, docs), EXACT_SEARCH)
    try:
        known = {"t1": 3, "t2": 5}
        run = searcher.search([("mixed", {**known, "unseen": 7, "t999": 1}), ("known", known),
                               ("unknown", {"unseen": 4}), ("empty", {})], hits=1000)
        assert run["mixed"] == run["known"] == brute_force(docs, known)
        assert run["unknown"] == run["empty"] == []
        everything = {f"t{t}": 1 for t in range(20)}
        assert len(searcher.search([("all", everything)], hits=10**9)["all"]) == 30
    finally:
        searcher.close()


def test_empty_vectors_are_counted_never_retrieved(tmp_path):
    docs = [("e0", {}), ("a", {"x": 2}), ("e1", {}), ("b", {"x": 1, "y": 4}), ("e2", {})]
    work = build(tmp_path, docs, shard_docs=2)
    assert verify(work) == 5
    searcher = Searcher(work, EXACT_SEARCH)
    try:
        assert searcher.search([("q", {"x": 3, "y": 1})], hits=10)["q"] == [("b", 7.0), ("a", 6.0)]
    finally:
        searcher.close()


def test_a_corpus_of_empty_vectors_builds_and_finds_nothing(tmp_path):
    work = build(tmp_path, [("e0", {}), ("e1", {})])
    assert verify(work) == 2 and not (work / INDEX_FILE).exists()
    searcher = Searcher(work)
    assert searcher.search([("q", {"x": 1})], hits=5, threads=2) == {"q": []}


def test_ids_map_back_exactly_and_the_directory_can_move(tmp_path):
    """Any id the shards hold (non-ASCII, astral, long) comes back as written, from a renamed directory."""
    names = ["é", "文档", "🙂x", "a" * 3000, "Z", "id\u200b"]
    docs = [(name, {"x": i + 1, f"u{i}": 1}) for i, name in enumerate(names)]
    work = build(tmp_path, docs, fmt="jsonl.gz", shard_docs=4)
    moved = work.rename(tmp_path / "elsewhere")
    searcher = Searcher(moved, EXACT_SEARCH)
    try:
        expected = [(name, float(i + 1)) for i, name in reversed(list(enumerate(names)))]
        assert searcher.search([("q", {"x": 1})], hits=10)["q"] == expected
    finally:
        searcher.close()


def test_a_vocabulary_past_16_bits_uses_seismics_32_bit_index(tmp_path, seed, monkeypatch):
    """The reader starts over into SeismicIndexLV once the terms outgrow 16-bit numbers (a small limit here)."""
    monkeypatch.setattr(seismic_build, "U16_TERMS", 50)
    rng = np.random.default_rng(seed)
    docs = random_docs(rng, 300, vocab=200, longest=10, top=20)
    queries = random_queries(rng, 10, vocab=200, longest=8, top=9)
    work = build(tmp_path, docs, shard_docs=50)
    assert json.loads((work / RECORD).read_text())["components"] == "u32"
    searcher = Searcher(work, EXACT_SEARCH)
    try:
        run = searcher.search(queries, hits=20)
        for qid, query in queries:
            assert_ranking(run[qid], brute_force(docs, query), 20)
    finally:
        searcher.close()


@pytest.mark.parametrize(("impact", "cause"), [(2049, "impact 2049"), (0, "impact 0")])
def test_impacts_seismic_cannot_hold_are_refused(tmp_path, impact, cause):
    vectors = tmp_path / "vectors"
    manifest = shards.write_vectors(vectors, ["x", "y"], [[(["a", "b"], SparseVectors(
        np.array([0, 1, 2], np.int64), np.array([0, 1], np.int32), np.array([5, impact], np.int32)))]], "parquet")
    (tmp_path / "index").mkdir()
    with pytest.raises(LsrIndexError, match=f"document 'b' has {cause} for term 'y'.*from 1 to 2048") as failure:
        build_files(vectors, manifest, tmp_path / "index", progress=False)
    assert "\n" not in str(failure.value)


def test_the_build_needs_an_empty_work_directory(tmp_path):
    vectors = tmp_path / "vectors"
    manifest = write(vectors, [("a", {"x": 1})], "parquet")
    (tmp_path / "index").mkdir()
    (tmp_path / "index" / "stray").write_text("")
    with pytest.raises(LsrIndexError, match="only in an empty directory"):
        build_files(vectors, manifest, tmp_path / "index", progress=False)


def _zero(path: Path) -> None:
    path.write_bytes(bytes(path.stat().st_size))


def _forge(path: Path) -> None:
    """Zeros that the record is edited to vouch for: Seismic loads them as an index of 2⁶⁴−1 documents."""
    _zero(path)
    record_path = path.parent / RECORD
    record = json.loads(record_path.read_text())
    record["files"][path.name]["crc32"] = crc32_file(path)
    record_path.write_text(json.dumps(record))


DAMAGE = {
    "truncated": (lambda d: os.truncate(d / INDEX_FILE, 1000), "is 1,000 bytes"),
    "zeroed": (lambda d: _zero(d / INDEX_FILE), "fails its checksum"),
    "forged": (lambda d: _forge(d / INDEX_FILE), "holds 18446744073709551615 documents"),
    "ids zeroed": (lambda d: _zero(d / "docids.off"), "fails its checksum"),
    "missing": (lambda d: (d / "terms.json").unlink(), "terms.json is missing"),
    "record garbage": (lambda d: (d / RECORD).write_bytes(b"\x00garbage"), "not valid JSON"),
    "record foreign": (lambda d: (d / RECORD).write_text('{"kind": "something else"}'), "not a Seismic index"),
    "no record": (lambda d: (d / RECORD).unlink(), "not a Seismic index"),
    "other release": (lambda d: (d / RECORD).write_text((d / RECORD).read_text().replace(
        '"seismic": "', '"seismic": "0.0.1+')), "built with Seismic"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_or_foreign_index_is_refused_in_one_line(tmp_path, damage):
    docs = [(f"d{i}", {"x": i + 1, f"y{i % 7}": 3}) for i in range(50)]
    work = build(tmp_path, docs)
    change, message = DAMAGE[damage]
    change(work)
    with pytest.raises(LsrIndexError) as failure:
        Searcher(work).close()
    text = str(failure.value)
    assert message in text and str(work) in text and "\n" not in text
    if damage not in ("forged", "other release"):  # verify checks files, not Seismic's own reading or release
        with pytest.raises(LsrIndexError, match=message.split(" ")[0]):
            verify(work)


def test_a_directory_that_is_not_an_index_is_refused(tmp_path):
    (tmp_path / "lucene").mkdir()
    (tmp_path / "lucene" / "segments_1").write_bytes(b"x")
    for directory, message in ((tmp_path / "lucene", "not a Seismic index"), (tmp_path / "nothing", "no index here")):
        with pytest.raises(LsrIndexError, match=message):
            Searcher(directory)


@pytest.mark.parametrize(("options", "name"), [
    (lambda: SeismicBuild(n_postings=0), "n_postings"),
    (lambda: SeismicBuild(n_postings=2.5), "n_postings"),
    (lambda: SeismicBuild(centroid_fraction=0.0), "centroid_fraction"),
    (lambda: SeismicBuild(summary_energy=1.5), "summary_energy"),
    (lambda: SeismicBuild(max_fraction=0.5), "max_fraction"),
    (lambda: SeismicBuild(min_cluster_size=True), "min_cluster_size"),
    (lambda: SeismicBuild(doc_cut=-1), "doc_cut"),
    (lambda: SeismicBuild(threads=0), "threads"),
    (lambda: SeismicSearch(query_cut=0), "query_cut"),
    (lambda: SeismicSearch(heap_factor=float("nan")), "heap_factor"),
    (lambda: SeismicSearch(heap_factor="0.9"), "heap_factor"),
    (lambda: SeismicSearch(first_sorted=1), "first_sorted"),
    (lambda: SeismicSearch.from_dict({"query_kut": 3}), "query_kut"),
])
def test_option_ranges_are_checked_in_one_line(options, name):
    with pytest.raises(LsrIndexError, match=name) as failure:
        options()
    assert "\n" not in str(failure.value)


def test_options_read_back_as_given():
    build = SeismicBuild(n_postings=1000, centroid_fraction=1, threads=2)
    assert build.centroid_fraction == 1.0 and isinstance(build.centroid_fraction, float)
    assert SeismicBuild.from_dict(build.to_dict()) == build
    assert SeismicSearch.from_dict({"query_cut": 3}) == SeismicSearch(query_cut=3)


@pytest.mark.lucene
def test_lucene_and_seismic_return_the_brute_force_run(tmp_path, seed):
    """Both engines on the same shards: Lucene's hits (taken from the JVM in one piece) and Seismic's exact setting
    give the brute-force ranking; ids survive both engines whatever characters they hold."""
    from lsr_index.engines.lucene.build import build_index as build_lucene
    from lsr_index.engines.lucene.searcher import ImpactSearcher

    rng = np.random.default_rng(seed)
    docs = random_docs(rng, 300, vocab=50, longest=10, top=5, empty=0.0)
    docs = [(f"{d}-{'é🙂文'[i % 3]}", v) for i, (d, v) in enumerate(docs)]
    queries = random_queries(rng, 25, vocab=50, longest=12, top=4)
    work = build(tmp_path, docs, fmt="jsonl.gz")
    build_lucene(tmp_path / "vectors-jsonl.gz", tmp_path / "lucene", heap="1g", progress=False)
    lucene, seismic = ImpactSearcher(tmp_path / "lucene"), Searcher(work, EXACT_SEARCH)
    try:
        for k in (5, 1000):
            by_lucene, by_seismic = lucene.search(queries, hits=k), seismic.search(queries, hits=k)
            for qid, query in queries:
                exact = brute_force(docs, query)
                # Lucene keeps the lowest docids tied at the k-th score, and Anserini lowers tied scores by a few
                # float32 steps, in docid order, to make them distinct
                assert [d for d, _ in by_lucene[qid]] == [d for d, _ in exact[:k]]
                assert all(abs(s - e) < 1e-3 for (_, s), (_, e) in zip(by_lucene[qid], exact))
                assert_ranking(by_seismic[qid], exact, k)
    finally:
        lucene.close()
        seismic.close()
    shutil.rmtree(tmp_path / "lucene")
