"""Run files, as `search` writes them and `eval` reads them: TREC (qid Q0 docid rank score tag) or MS MARCO
(qid docid rank), written atomically, never over an input of the search or inside an output of lsr-index.
"""

from __future__ import annotations

import gzip
import math
import os
from pathlib import Path

from lsr_index.engines.index import INDEX_MANIFEST
from lsr_index.errors import InputError, LsrIndexError
from lsr_index.inputs.ids import check_id
from lsr_index.inputs.topics import text_lines
from lsr_index.runtime.durable import atomic_write_bytes, real_path
from lsr_index.vectors.manifest import written_by_encode

Run = dict[str, list[tuple[str, float]]]


RUN_FORMATS = ("trec", "msmarco")


def write_run(path: Path, run: Run, fmt: str = "trec", tag: str = "lsr-index") -> None:
    """Write a run atomically. An id that the format cannot hold (whitespace, a control character: an index built
    before encode refused such ids) is refused: written, it would shift columns or merge with another id."""
    if fmt not in RUN_FORMATS:
        raise LsrIndexError(f"unknown run format {fmt!r}: choose one of {', '.join(RUN_FORMATS)}")
    for qid, ranked in run.items():
        for kind, value in (("query", qid), *(("document", doc) for doc, _ in ranked)):
            problem = check_id(value)
            if problem:
                raise LsrIndexError(f"{path}: not written: {kind} {problem}, which a {fmt} run "
                                    "cannot hold (the index was built by an older lsr-index: re-encode the corpus "
                                    "and rebuild it)")
        # what `read_run` (eval, search --qrels) refuses is never written: the file would be left behind unread
        if len(ranked) != len({doc for doc, _ in ranked}):
            seen: set[str] = set()
            doc = next(doc for doc, _ in ranked if doc in seen or seen.add(doc))
            raise LsrIndexError(f"{path}: not written: document {doc!r} is ranked twice for query {qid!r}: the index "
                                "holds two documents with that id (built before lsr-index refused ids given twice): "
                                "give each document its own id, encode and build again")
        if not all(math.isfinite(score) for _, score in ranked):
            raise LsrIndexError(f"{path}: not written: query {qid!r} has a score that is not a finite number")
    if fmt == "trec":
        lines = (f"{qid} Q0 {doc} {rank} {score:.4f} {tag}\n"
                 for qid, ranked in run.items() for rank, (doc, score) in enumerate(ranked, 1))
    else:
        lines = (f"{qid}\t{doc}\t{rank}\n" for qid, ranked in run.items() for rank, (doc, _) in enumerate(ranked, 1))
    data = "".join(lines).encode()
    atomic_write_bytes(path, gzip.compress(data, mtime=0) if path.name.endswith(".gz") else data)


def check_run_path(path: Path, inputs: list[Path]) -> None:
    """Refuse, before a search, a run path that names one of its inputs (the run would replace the queries or the
    judgments), lies in an index or vectors directory (see `inside_output`) or in a directory that cannot be
    written (found only after the whole search)."""
    real = real_path(path)
    for given in inputs:
        if real == real_path(given):
            raise LsrIndexError(f"--run {path}: that is an input of this search ({given}); write the run elsewhere")
    if owner := inside_output(path):
        raise LsrIndexError(f"--run {path}: that is inside {owner}; write the run elsewhere")
    parent = real.parent
    existing = next(p for p in (parent, *parent.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise LsrIndexError(f"--run {path}: cannot write in {existing}")


def inside_output(path: Path) -> str | None:
    """The index or vectors directory that `path` lies in (directly, or in its shards/), or None. A file written
    there replaces one of its files (`--run index/lsr-index.json` once replaced the record of the index just
    searched) or is deleted with it by the next `--overwrite`."""
    real = real_path(path)
    for directory in (real.parent, *([real.parent.parent] if real.parent.name == "shards" else [])):
        if (directory / INDEX_MANIFEST).is_file():
            return f"the index {directory}"
        if written_by_encode(directory):
            return f"the vectors directory {directory}"
    return None


def read_run(path: Path) -> Run:
    """A run file as `search` writes it: TREC (qid Q0 docid rank score tag) or MS MARCO (qid docid rank).

    Lines and columns are split as the qrels reader splits them; a document listed twice for one query is
    refused (the evaluator would keep only one of them, silently).
    """
    run: Run = {}
    seen: dict[tuple[str, str], int] = {}
    for number, line in text_lines(path):
        cols = line.split()
        if len(cols) not in (6, 3):
            raise InputError(path, number, f"{len(cols)} columns, expected 'qid Q0 docid rank score tag' (TREC) "
                             "or 'qid docid rank' (MS MARCO)")
        try:  # MS MARCO runs carry ranks only: rank r scores -r, which keeps the order
            score = float(cols[4]) if len(cols) == 6 else -float(cols[2])
        except ValueError:
            score = math.nan
        if not math.isfinite(score):
            raise InputError(path, number, f"{'score' if len(cols) == 6 else 'rank'} is not a finite number")
        qid, doc = cols[0], cols[2] if len(cols) == 6 else cols[1]
        if (qid, doc) in seen:
            raise InputError(path, number, f"document {doc!r} listed again for query {qid!r} (first on line "
                             f"{seen[qid, doc]})")
        seen[qid, doc] = number
        run.setdefault(qid, []).append((doc, score))
    return run
