"""Run files: what `search` writes, `eval` reads back, in either format."""

from __future__ import annotations


def test_eval_reads_both_run_formats_that_search_writes(tmp_path):
    from lsr_index.evaluate import evaluate
    from lsr_index.search import read_run, write_run

    run = {"q1": [("d3", 9.0), ("d1", 7.0), ("d2", 1.0)], "q2": [("d2", 4.0), ("d9", 2.0)]}
    qrels = {"q1": {"d1": 1}, "q2": {"d9": 1, "d2": 0}}
    scores = []
    for fmt in ("trec", "msmarco"):
        write_run(tmp_path / f"run.{fmt}", run, fmt)
        back = read_run(tmp_path / f"run.{fmt}")
        assert [[d for d, _ in back[q]] for q in run] == [[d for d, _ in run[q]] for q in run]
        scores.append(evaluate(back, qrels))
    assert scores[0] == scores[1] and 0 < scores[0]["nDCG@10"] < 1
