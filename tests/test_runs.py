"""Run files: what `search` writes, `eval` reads back, in either format."""

from __future__ import annotations

import re

import pytest

from lsr_index.errors import InputError, LsrIndexError


def test_eval_reads_both_run_formats_that_search_writes(tmp_path):
    from lsr_index.evaluate import evaluate
    from lsr_index.runs import read_run, write_run

    run = {"q1": [("d3", 9.0), ("d1", 7.0), ("d2", 1.0)], "q2": [("d2", 4.0), ("d9", 2.0)]}
    qrels = {"q1": {"d1": 1}, "q2": {"d9": 1, "d2": 0}}
    scores = []
    for fmt in ("trec", "msmarco"):
        write_run(tmp_path / f"run.{fmt}", run, fmt)
        back = read_run(tmp_path / f"run.{fmt}")
        assert [[d for d, _ in back[q]] for q in run] == [[d for d, _ in run[q]] for q in run]
        scores.append(evaluate(back, qrels))
    assert scores[0] == scores[1] and 0 < scores[0]["nDCG@10"] < 1


@pytest.mark.parametrize("relevant", ["a", "b", "c"])
def test_every_measure_breaks_score_ties_as_trec_eval_does(relevant):
    """Tied documents rank by id descending for every measure, as trec_eval (pytrec_eval) ranks them: a measure that
    keeps the run's order while the others sort the ties would give one relevant document two ranks."""
    import pytrec_eval

    from lsr_index.evaluate import evaluate

    run = {"q1": [("a", 10.0), ("b", 10.0), ("c", 10.0), ("d", 5.0)], "q2": [("x", 3.0), ("y", 3.0)]}
    qrels = {"q1": {relevant: 1}, "q2": {"x": 2, "y": 1}}
    got = evaluate(run, qrels, ("nDCG@10", "RR@10", "AP@1000"))
    want = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recip_rank", "map"}).evaluate(
        {q: dict(ranked) for q, ranked in run.items()})
    for ours, theirs in (("nDCG@10", "ndcg_cut_10"), ("RR@10", "recip_rank"), ("AP@1000", "map")):
        assert got[ours] == pytest.approx(sum(v[theirs] for v in want.values()) / 2, abs=1e-12), ours
    rank = {"c": 1, "b": 2, "a": 3}[relevant]  # ids descending among the three tied at 10.0
    assert got["RR@10"] == pytest.approx((1 / rank + 1) / 2)


HOSTILE = ["rel ", " rel", "a b", "a\tb", "a\u00a0b", "a\u2028b", "a\u0085b", "a\u001fb", "a\x00b", "a\x7fb", ""]


@pytest.mark.parametrize("fmt", ["trec", "msmarco"])
@pytest.mark.parametrize("doc", HOSTILE)
def test_write_run_refuses_an_id_the_format_cannot_hold(tmp_path, fmt, doc):
    """Written, such an id shifts the columns or merges with another id ('rel ' → 'rel') in `eval`."""
    from lsr_index.runs import write_run

    path = tmp_path / f"run.{fmt}"
    with pytest.raises(LsrIndexError, match=re.escape(f"document id {doc!r} ")):
        write_run(path, {"q1": [("rel", 3.0), (doc, 2.0), ("mid", 1.0)]}, fmt)
    assert list(tmp_path.iterdir()) == []


def test_every_line_search_writes_has_the_columns_of_its_format(tmp_path):
    from lsr_index.runs import read_run, write_run

    run = {"q1": [("ünï-cødé", 2.0), ("x\u200by", 1.0), ("a'b\"c", 0.5)]}  # not whitespace: kept exactly
    for fmt, columns in (("trec", 6), ("msmarco", 3)):
        write_run(tmp_path / fmt, run, fmt)
        lines = (tmp_path / fmt).read_text().split("\n")[:-1]
        assert [len(line.split()) for line in lines] == [columns] * 3
        assert [d for d, _ in read_run(tmp_path / fmt)["q1"]] == [d for d, _ in run["q1"]]


@pytest.mark.parametrize(("content", "line", "message"), [
    ("q1 Q0 d1 1 2.0 t\nq1 Q0 d1 2 1.0 t\n", 2, "document 'd1' listed again for query 'q1' (first on line 1)"),
    ("q1 Q0 d1 1 nan t\n", 1, "score is not a finite number"),
    ("q1 Q0 d1 1 2.0 t\nq1 Q0 d\u00a0x 2 1.0 t\n", 2, "7 columns"),
    ("q1\td1\tfirst\n", 1, "rank is not a finite number"),
])
def test_read_run_refuses_what_would_skew_the_metrics(tmp_path, content, line, message):
    from lsr_index.runs import read_run

    path = tmp_path / "run.txt"
    path.write_text(content)
    with pytest.raises(InputError, match=re.escape(message)) as caught:
        read_run(path)
    assert caught.value.where == line


@pytest.mark.parametrize("fmt", ["trec", "msmarco"])
@pytest.mark.parametrize(("ranked", "message"), [
    ([("x", 3.0), ("y", 2.0), ("x", 1.0)], "document 'x' is ranked twice for query 'q1': the index holds two "
                                           "documents with that id"),
    ([("x", float("nan"))], "query 'q1' has a score that is not a finite number"),
])
def test_a_run_that_eval_would_refuse_is_never_written(tmp_path, fmt, ranked, message):
    """`search --qrels` reads back what it wrote: a run it could not read would be left behind with the error, so it
    is refused before a byte is written, and an older run under that name is kept."""
    from lsr_index.runs import write_run

    path = tmp_path / f"q.{fmt}.gz"
    with pytest.raises(LsrIndexError, match=re.escape(f"{path}: not written: {message}")):
        write_run(path, {"q0": [("a", 1.0)], "q1": ranked}, fmt)
    assert list(tmp_path.iterdir()) == []
    path.write_text("kept\n")
    with pytest.raises(LsrIndexError):
        write_run(path, {"q1": ranked}, fmt)
    assert [p.name for p in tmp_path.iterdir()] == [path.name] and path.read_text() == "kept\n"
