"""Retrieval metrics through ir_measures, averaged over every judged query.

Documents are ordered as trec_eval orders them (score as the C float it holds, so scores equal in 32 bits tie; then
document id descending) before any measure sees the run: ir_measures sends RR@10 to its msmarco provider, which keeps
the run's order, and the others to pytrec_eval, which sorts ties by id, so a relevant document tied with another
counted as rank 1 for nDCG and rank 2 for MRR.
"""

from __future__ import annotations

import numpy as np

from lsr_index.errors import LsrIndexError, install_hint

MEASURES = ("nDCG@10", "RR@10", "R@100", "R@1000", "AP@1000")
NAMES = {"RR@10": "MRR@10", "AP@1000": "MAP"}  # the names users know (and the README's table) for two of them
LEGEND = "MRR@10 = mean RR@10, MAP = mean AP@1000 (ir_measures; a judged query without results scores 0)"


def evaluate(run: dict[str, list[tuple[str, float]]], qrels: dict[str, dict[str, int]],
             measures: tuple[str, ...] = MEASURES) -> dict[str, float]:
    """Mean over the judged queries; a judged query the run lacks counts as 0, not as absent."""
    try:
        import ir_measures
    except ImportError:
        raise LsrIndexError(f"evaluation needs ir_measures: {install_hint('lucene')}") from None
    parsed = [ir_measures.parse_measure(m) for m in measures]
    scored = {qid: _untied(ranked) for qid, ranked in run.items() if ranked}
    totals = dict.fromkeys(parsed, 0.0)
    for metric in ir_measures.iter_calc(parsed, _graded(qrels), scored):
        if metric.query_id in qrels:
            totals[metric.measure] += metric.value
    return {str(m): totals[m] / max(len(qrels), 1) for m in parsed}


def _graded(qrels: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """Negative grades as 0. trec_eval counts a negative grade as judged, not relevant, gain 0 (what 0 is to these
    measures), but sizes a table by each query's largest grade: a query whose grades are all -2 or less made
    pytrec_eval write past its memory (a segfault, no message)."""
    return {qid: {doc: max(rel, 0) for doc, rel in judged.items()} for qid, judged in qrels.items()}


def _untied(ranked: list[tuple[str, float]]) -> dict[str, float]:
    """Distinct scores in trec_eval's order (score as a 32-bit float, then document id, both descending): every
    provider then ranks the documents alike. trec_eval keeps a score in a C float, so 1.00000002 and 1.00000001 tie
    there."""
    with np.errstate(over="ignore"):  # beyond a float's range: inf, as in trec_eval
        scores = np.array([score for _, score in ranked], dtype=np.float64).astype(np.float32).tolist()
    order = sorted(zip(scores, (doc for doc, _ in ranked)), reverse=True)
    return {doc: float(len(order) - rank) for rank, (_, doc) in enumerate(order)}


def format_metrics(metrics: dict[str, float]) -> str:
    """'nDCG@10 0.6436  MRR@10 0.6159  R@100 0.8930  R@1000 0.9733  MAP 0.6072'."""
    return "  ".join(f"{NAMES.get(name, name)} {value:.4f}" for name, value in metrics.items())
