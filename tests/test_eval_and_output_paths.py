"""`build`, `search`, `eval` and `inspect` at their edges: metrics as trec_eval computes them whatever the grades and
scores, and outputs that never land in (or delete) another command's files. Real Lucene indexes, real model, the real
CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import run_cli
from search_fixtures import SAMPLE, build, write_vectors

from lsr_index.errors import LsrIndexError

LSR = [sys.executable, "-m", "lsr_index", "--quiet"]


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


# --- eval: trec_eval's metrics ------------------------------------------------------------------------

def test_a_query_judged_only_below_minus_one_is_scored_not_a_segfault(tmp_path):
    """pytrec_eval sizes a table by each query's largest grade: after a query judged 1, one judged only -2 makes it
    write past its memory, which would end `eval` by SIGSEGV with no message. trec_eval counts a negative grade as
    judged and not relevant (gain 0, as grade 0): q2 scores 0, q1 1."""
    qrels, run = tmp_path / "qrels.txt", tmp_path / "run.trec"
    qrels.write_text("q1 0 d1 1\nq2 0 d2 -2\nq2 0 d3 -5\n")
    run.write_text("q1 Q0 d1 1 2.0 t\nq2 Q0 d2 1 2.0 t\nq2 Q0 d3 2 1.0 t\n")
    done = subprocess.run([*LSR, "eval", "--run", str(run), "--qrels", str(qrels)], capture_output=True, text=True,
                          timeout=120)  # a process of its own: a segfault must not end the test run
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert done.stdout == "nDCG@10 0.5000  MRR@10 0.5000  R@100 0.5000  R@1000 0.5000  MAP 0.5000\n"


@pytest.mark.parametrize("scores", [(1.00000002, 1.00000001), (16777217.0, 16777216.0), (2e39, 1e39)])
def test_scores_equal_as_32_bit_floats_tie_as_in_trec_eval(tmp_path, scores):
    """trec_eval holds a score in a C float: 1.00000002 and 1.00000001 tie there and rank by id descending (b before
    a), so the relevant `a` is second. Ranked by the exact scores it would be first: MRR@10 1.0 where trec_eval says
    0.5."""
    import pytrec_eval

    from lsr_index.evaluate import evaluate
    from lsr_index.runs import read_run

    path = tmp_path / "run.trec"
    path.write_text(f"q1 Q0 a 1 {scores[0]!r} t\nq1 Q0 b 2 {scores[1]!r} t\n")
    run, qrels = read_run(path), {"q1": {"a": 1, "b": 0}}
    want = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recip_rank"}).evaluate(
        {q: dict(ranked) for q, ranked in run.items()})["q1"]
    got = evaluate(run, qrels)
    assert (got["RR@10"], got["nDCG@10"]) == (want["recip_rank"], pytest.approx(want["ndcg_cut_10"], abs=1e-12))
    assert got["RR@10"] == 0.5


# --- outputs never land in another command's directory ------------------------------------------------

@pytest.fixture(scope="module")
def made(splade_tiny, tmp_path_factory) -> tuple[Path, Path]:
    work = tmp_path_factory.mktemp("made")
    vectors = write_vectors(work / "vectors", splade_tiny, {"d0": {"cancer": 50}, "d1": {"sleep": 30, "memory": 9}})
    return vectors, build(vectors, work / "index")


@pytest.mark.lucene
@pytest.mark.parametrize("where", ["index/lsr-index.json", "index/segments_1", "index/run.trec",
                                   "vectors/manifest.json", "vectors/shards/run.trec"])
def test_a_run_path_inside_an_index_or_vectors_is_refused_before_the_search(made, where):
    """`search --run index/lsr-index.json` would replace the record of the index it had just searched, and the index
    would be gone ('not valid JSON; rebuild the index'); `--run vectors/manifest.json` the vectors' manifest."""
    vectors, index = made
    before = _tree(index.parent)
    path = index.parent / where
    done = run_cli("--quiet", "search", "--index", str(index), "--queries", str(SAMPLE / "queries.tsv"),
                   "--run", str(path))
    owner = f"the index {index}" if where.startswith("index") else f"the vectors directory {vectors}"
    assert done.returncode == 1 and done.stderr == f"error: --run {path}: that is inside {owner}; write the run " \
                                                   "elsewhere\n"
    assert _tree(index.parent) == before


@pytest.mark.parametrize("where", ["manifest.json", "shards/stats.png"])
def test_png_inside_the_vectors_is_refused_and_the_manifest_kept(made, where):
    """`inspect --png vectors/manifest.json` would replace the manifest it had just read with the picture: every
    shard unlisted ('unreadable manifest'), an encode lost."""
    pytest.importorskip("matplotlib")
    vectors, _ = made
    before = _tree(vectors)
    done = run_cli("--quiet", "inspect", "--vectors", str(vectors), "--png", str(vectors / where))
    assert done.returncode == 1 and done.stderr == f"error: --png {vectors / where}: that is inside the vectors " \
                                                   f"directory {vectors}; write the picture elsewhere\n"
    assert _tree(vectors) == before


@pytest.mark.lucene
def test_overwrite_refuses_an_index_holding_files_it_did_not_write(made, tmp_path):
    """A run saved in the index directory (or any file or folder put there) would go, without a word, with the old
    generation that `build --overwrite` deletes: the build is refused, the index kept whole and nothing deleted."""
    from lsr_index.engines.lucene.build import build_index

    vectors, _ = made
    index = tmp_path / "index"
    build_index(vectors, index, heap="1g", progress=False)
    (index / "runs").mkdir()
    (index / "runs" / "dev.trec").write_text("q Q0 d0 1 1.0 x\n")
    before = _tree(index)
    with pytest.raises(LsrIndexError, match=f"^{index} holds 'runs', which lsr-index build did not write; "
                                            "--overwrite would delete it with the old index: move it out, or "
                                            "choose another --index$"):
        build_index(vectors, index, overwrite=True, heap="1g", progress=False)
    assert _tree(index) == before
    (index / "runs" / "dev.trec").unlink()
    (index / "runs").rmdir()
    assert build_index(vectors, index, overwrite=True, heap="1g", progress=False).documents == 2


@pytest.mark.lucene
def test_build_index_dot_from_inside_the_index_replaces_it(made, tmp_path, monkeypatch):
    """`cd index && lsr-index build --index . --overwrite` keeps its lock and work directory beside the index, not
    inside it ('..lock', '..building-PID'), where the build would fail ('Device or resource busy' through the CLI)
    and leave the lock file in the index."""
    from lsr_index.engines.lucene.build import build_index

    vectors, _ = made
    index = tmp_path / "index"
    build_index(vectors, index, heap="1g", progress=False)
    monkeypatch.chdir(index)
    assert build_index(vectors, Path("."), overwrite=True, heap="1g", progress=False).documents == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [".index.lock", "index"]
    assert not [p.name for p in index.iterdir() if p.name.startswith(".")]
