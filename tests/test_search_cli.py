"""`search --qrels` and `eval` of the run it wrote print the same metrics; options are bounded; ids a run cannot
hold are refused by name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cli_runner import run_cli
from search_fixtures import SAMPLE, build, query_terms, random_docs, write_vectors
from transformers import AutoTokenizer

from lsr_index.inputs.topics import read_queries


def lsr(*args: str):
    return run_cli("--quiet", *args)


@pytest.mark.parametrize(("option", "value"), [("--hits", "2147483648"), ("--hits", "0"), ("--threads", "0"),
                                               ("--threads", "100000")])
def test_search_options_out_of_range_are_one_clear_line(tmp_path, option, value):
    done = lsr("search", "--queries", str(SAMPLE / "queries.tsv"), "--index", str(tmp_path), option, value)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"Invalid value for '{option}': {value} is not in the range" in done.stderr


@pytest.fixture(scope="module")
def judged_index(splade_tiny, tmp_path_factory) -> tuple[Path, Path]:
    """A real index and qrels judging three of its documents for each sample query."""
    work = tmp_path_factory.mktemp("judged")
    docs = random_docs(query_terms(splade_tiny, 150), docs=300, per_doc=30, max_impact=60, seed=4)
    index = build(write_vectors(work / "vectors", splade_tiny, docs), work / "index")
    rng = np.random.default_rng(4)
    qrels = work / "qrels.txt"
    qrels.write_text("".join(f"{qid} 0 d{d} {rng.integers(1, 3)}\n" for qid, _ in read_queries(SAMPLE / "queries.tsv")
                             for d in rng.choice(len(docs), 3, replace=False)))
    return index, qrels


@pytest.mark.lucene
@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["trec", "msmarco"])
def test_search_prints_the_metrics_that_eval_of_its_run_prints(judged_index, tmp_path, fmt):
    index, qrels = judged_index
    run = tmp_path / f"run.{fmt}"
    searched = lsr("search", "--index", str(index), "--queries", str(SAMPLE / "queries.tsv"), "--qrels", str(qrels),
                   "--run", str(run), "--format", fmt, "--hits", "100")
    assert searched.returncode == 0, searched.stderr
    evaluated = lsr("eval", "--run", str(run), "--qrels", str(qrels))
    assert evaluated.returncode == 0, evaluated.stderr
    metrics = searched.stdout.splitlines()[-1]
    assert metrics == evaluated.stdout.strip()
    names = metrics.split()[::2]
    assert names == ["nDCG@10", "MRR@10", "R@100", "R@1000", "MAP"] and float(metrics.split()[1]) > 0


@pytest.mark.lucene
@pytest.mark.slow
def test_an_old_index_holding_ids_a_run_cannot_hold_is_refused_by_name(splade_tiny, tmp_path):
    """Documents 'rel', 'mid', 'rel ' (trailing space) in an index built by a version of lsr-index whose encode took
    such ids. Written, 'rel ' would merge with 'rel': search would print nDCG@10 1.0000, eval of its run 0.6309."""
    terms = query_terms(splade_tiny, 40)
    docs = {"rel": {t: 50 for t in terms[:20]}, "mid": {t: 30 for t in terms[:20]},
            "rel ": {t: 40 for t in terms[:20]}}
    index = build(write_vectors(tmp_path / "vectors", splade_tiny, docs), tmp_path / "index")
    queries = tmp_path / "q.tsv"
    queries.write_text("".join(f"q{k}\t{text}\n" for k, (_, text) in enumerate(read_queries(SAMPLE / "queries.tsv"))))
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("q1 0 rel 1\n")
    run = tmp_path / "runs" / "q.trec"
    done = lsr("search", "--index", str(index), "--queries", str(queries), "--qrels", str(qrels), "--run", str(run))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"error: {run}: not written: document id 'rel ' contains whitespace (U+0020 at character 4)")
    assert not run.parent.exists() and "nDCG" not in done.stdout


@pytest.mark.lucene
def test_queries_cut_at_the_index_query_length_are_reported(splade_tiny, judged_index, tmp_path):
    """The index's query_max_length cuts long queries: search says how many, their share and the longest."""
    from lsr_index.search import search

    queries = read_queries(SAMPLE / "queries.tsv")
    tokenizer = AutoTokenizer.from_pretrained(splade_tiny.path)
    lengths = [len(ids) for ids in tokenizer([text for _, text in queries])["input_ids"]]
    assert max(lengths) <= 64  # the judged index keeps every sample query whole: nothing to say
    said: list[str] = []
    search(judged_index[0], queries, hits=10, notice=said.append)
    assert said == []
    docs = random_docs(query_terms(splade_tiny, 50), docs=40, per_doc=10, max_impact=60, seed=5)
    index = build(write_vectors(tmp_path / "vectors", splade_tiny, docs, query_max_length=12), tmp_path / "index")
    cut = sum(n > 12 for n in lengths)
    assert 0 < cut < len(queries)
    search(index, queries, hits=10, notice=said.append)
    assert said == [f"{cut} of {len(queries)} queries ({cut / len(queries):.1%}) were cut at the index's "
                    f"query_max_length 12; the longest had {max(lengths)} tokens"]


@pytest.mark.lucene
def test_a_huge_query_is_cut_at_the_character_bound_before_tokenizing(splade_tiny, tmp_path):
    """Tokenized whole, a query line of megabytes (a pasted document) would take hundreds of bytes of memory per
    character, though only query_max_length tokens are kept. It is cut to query_max_length × 100 characters first, as
    documents are, the note says so, and its hits are those of the cut text."""
    from lsr_index.search import search

    docs = random_docs(query_terms(splade_tiny, 50), docs=40, per_doc=10, max_impact=60, seed=7)
    index = build(write_vectors(tmp_path / "vectors", splade_tiny, docs, query_max_length=12), tmp_path / "index")
    words = " ".join(query_terms(splade_tiny, 50))
    huge = (words + " ") * (20_000 // len(words) + 1)
    said: list[str] = []
    whole = search(index, [("big", huge), ("small", "sleep memory")], hits=10, notice=said.append)
    cut = search(index, [("big", huge[:1200]), ("small", "sleep memory")], hits=10)
    assert whole == cut and whole["big"]
    assert len(said) == 1 and said[0].endswith("; 1 cut at the character bound (1,200) first"), said


@pytest.mark.lucene
@pytest.mark.parametrize("target", ["queries", "qrels"])
def test_a_run_path_naming_an_input_is_refused_before_the_search(judged_index, tmp_path, target):
    """`-o queries.tsv` would replace the queries with the run; `--run qrels --qrels qrels` the judgments."""
    index, qrels = judged_index
    queries = tmp_path / "queries.tsv"
    queries.write_bytes((SAMPLE / "queries.tsv").read_bytes())
    inputs = {"queries": queries, "qrels": qrels}
    before = {name: path.read_bytes() for name, path in inputs.items()}
    done = lsr("search", "--index", str(index), "--queries", str(queries), "--qrels", str(qrels),
               "--run", str(inputs[target]))
    assert done.returncode == 1 and done.stderr.strip() == \
        f"error: --run {inputs[target]}: that is an input of this search ({inputs[target]}); write the run elsewhere"
    assert {name: path.read_bytes() for name, path in inputs.items()} == before


@pytest.mark.lucene
@pytest.mark.slow
def test_a_run_named_gz_is_gzipped_and_eval_reads_it(judged_index, tmp_path):
    import gzip

    index, qrels = judged_index
    plain, packed = tmp_path / "run.trec", tmp_path / "run.trec.gz"
    for run in (plain, packed):
        done = lsr("search", "--index", str(index), "--queries", str(SAMPLE / "queries.tsv"), "--qrels", str(qrels),
                   "--run", str(run), "--hits", "50")
        assert done.returncode == 0, done.stderr
    assert gzip.decompress(packed.read_bytes()) == plain.read_bytes()
    evaluated = lsr("eval", "--run", str(packed), "--qrels", str(qrels))
    assert evaluated.returncode == 0 and evaluated.stdout == done.stdout.splitlines()[-1] + "\n"
