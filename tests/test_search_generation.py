"""A search sees one index generation from start to end, whatever `build --overwrite` publishes meanwhile."""

from __future__ import annotations

import fcntl
import os
import shutil

import pytest
from search_fixtures import SAMPLE, build, query_terms, random_docs, write_vectors

from lsr_index.engines.index import IndexGeneration
from lsr_index.engines.lucene.searcher import ImpactSearcher
from lsr_index.engines.publish import publish as _publish
from lsr_index.engines.publish import remove_retired as _remove_retired
from lsr_index.inputs.topics import read_queries
from lsr_index.search import search
from lsr_index.vectors.manifest import Manifest

pytestmark = [pytest.mark.lucene, pytest.mark.slow]


@pytest.fixture(scope="module")
def generations(splade_tiny, tmp_path_factory):
    """Two real indexes of the same documents, recorded with different scales (as two builds would be)."""
    work = tmp_path_factory.mktemp("generations")
    docs = random_docs(query_terms(splade_tiny, 150), docs=300, per_doc=30, max_impact=60, seed=1)
    old = build(write_vectors(work / "old-vectors", splade_tiny, docs, scale=100.0), work / "old")
    rescaled = {doc: {t: max(1, w * 3 // 10) for t, w in vector.items()} for doc, vector in docs.items()}
    new = build(write_vectors(work / "new-vectors", splade_tiny, rescaled, scale=30.0), work / "new")
    return old, new


def test_a_publish_between_reading_the_record_and_opening_lucene_changes_nothing(generations, tmp_path,
                                                                                 monkeypatch):
    """The swap lands right after `search` has read the record (model, scale) of the old generation and before
    it opens Lucene, by build's own `_publish`: the old generation, held by the search, is retired, not deleted."""
    old, new = generations
    queries = read_queries(SAMPLE / "queries.tsv")[:20]
    expected = search(old, queries, hits=50)
    assert expected != search(new, queries, hits=50)  # the two generations answer differently: mixing shows
    index = tmp_path / "index"
    shutil.copytree(old, index)
    work = tmp_path / ".index.building-1"
    shutil.copytree(new, work / "index")
    record = Manifest.from_dict
    published = []

    def publish_after_reading(*args):  # the index record has just been read
        manifest = record(*args)
        if not published:
            _publish(work / "index", index, work)
            published.append(sorted(p.name for p in tmp_path.iterdir() if ".retired-" in p.name))
        return manifest

    monkeypatch.setattr(Manifest, "from_dict", publish_after_reading)
    run = search(index, queries, hits=50)
    monkeypatch.undo()
    assert len(published[0]) == 1  # held by the search when it was replaced: kept aside, not deleted under it
    assert run == expected  # all of it from the old generation: its model, its scale, its postings
    _remove_retired(index)  # what the next build does first: the search has ended, its generation goes
    assert not any(".retired-" in p.name for p in tmp_path.iterdir())
    assert search(index, queries, hits=50) == search(new, queries, hits=50)  # the next search sees the new one


def test_the_search_holds_a_shared_lock_on_its_generation(generations):
    """The lock the builder waits on before deleting a replaced generation: held while the index is open."""
    old, _ = generations
    probe = os.open(old, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with IndexGeneration(old), pytest.raises(BlockingIOError):
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released with the generation
    finally:
        os.close(probe)


def test_without_proc_a_swapped_index_is_refused_not_mixed(generations, tmp_path):
    """Where /proc is missing Lucene opens the path itself: a generation swapped in after the record was read is
    detected (Lucene resolved the path to another directory) and refused."""
    from lsr_index.errors import LsrIndexError

    old, new = generations
    index = tmp_path / "index"
    shutil.copytree(old, index)
    work = tmp_path / ".index.building-1"
    shutil.copytree(new, work / "index")
    with IndexGeneration(index) as generation:
        generation.lucene_path = str(index)  # what __init__ chooses when /proc/self/fd is unavailable
        generation.record()
        _publish(work / "index", index, work)
        with pytest.raises(LsrIndexError, match="replaced while it was being opened; rerun"):
            ImpactSearcher(generation)
