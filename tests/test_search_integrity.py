"""A damaged Lucene index is refused with one line naming what is damaged, never searched into a wrong run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from cli_runner import run_cli
from search_fixtures import SAMPLE, build, query_terms, random_docs, write_vectors

from lsr_index.engines.lucene.checks import check_index
from lsr_index.errors import LsrIndexError
from lsr_index.inputs.topics import read_queries
from lsr_index.search import search

pytestmark = [pytest.mark.lucene, pytest.mark.slow]


@pytest.fixture(scope="module")
def index(splade_tiny, tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("integrity")
    docs = random_docs(query_terms(splade_tiny, 150), docs=300, per_doc=30, max_impact=60, seed=2)
    return build(write_vectors(work / "vectors", splade_tiny, docs), work / "index")


def _flip_a_tim_byte(index: Path) -> str:
    tim = next(index.glob("*.tim"))
    data = bytearray(tim.read_bytes())
    data[len(data) // 2] ^= 0x10  # inside the term blocks: Lucene reads it only when a query needs it
    tim.write_bytes(data)
    return tim.name


def _truncate_the_postings(index: Path) -> str:
    doc = next(index.glob("*.doc"))
    with open(doc, "r+b") as f:
        f.truncate(doc.stat().st_size - 7)
    return doc.name


def _delete_the_segments_file(index: Path) -> str:
    segments = next(index.glob("segments_*"))
    segments.unlink()
    return "segments"


DAMAGE = {"flipped byte": _flip_a_tim_byte, "truncated file": _truncate_the_postings,
          "deleted segments file": _delete_the_segments_file}


@pytest.mark.parametrize("damage", DAMAGE)
def test_search_and_check_index_name_the_damage(index, tmp_path, damage):
    copy = tmp_path / "index"
    shutil.copytree(index, copy)
    named = DAMAGE[damage](copy)
    queries = read_queries(SAMPLE / "queries.tsv")
    for attempt in (lambda: search(copy, queries, hits=100), lambda: check_index(copy, deep=False),
                    lambda: check_index(copy, deep=True)):
        with pytest.raises(LsrIndexError) as caught:
            attempt()
        message = str(caught.value)
        assert message.startswith(f"{copy}: ") and named in message and "\n" not in message, message
        assert "/proc/self/fd" not in message and "rebuild it with `lsr-index build --overwrite`" in message


def test_a_damaged_index_is_one_line_through_the_cli_and_no_run(index, tmp_path):
    copy = tmp_path / "index"
    shutil.copytree(index, copy)
    _flip_a_tim_byte(copy)
    run = tmp_path / "runs" / "q.trec"
    done = run_cli("--quiet", "search", "--index", str(copy), "--queries", str(SAMPLE / "queries.tsv"),
                   "--run", str(run))
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"error: {copy}: the Lucene index is damaged: CorruptIndexException: checksum failed")
    assert not run.parent.exists()


def test_a_sound_index_passes_both_checks(index):
    check_index(index, deep=True)
    check_index(index, deep=False)
