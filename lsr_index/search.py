"""The search stage: encode queries exactly as the index's documents were encoded, search, write a run."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .errors import LsrIndexError
from .lucene import ImpactSearcher, index_manifest
from .manifest import atomic_write_bytes
from .quantize import Quantization, quantize

Run = dict[str, list[tuple[str, float]]]
RUN_FORMATS = ("trec", "msmarco")


def load_query_encoder(index: Path, model: str | None, device: str, backend: str):
    """The encoder and quantization recorded in the index's manifest; a different model is refused."""
    import torch

    from .encoder import SpladeEncoder
    from .models import load_model

    _, manifest = index_manifest(index)
    loaded = load_model(model or manifest.model["name"], device=device, dtype=torch.float32)
    if loaded.sha256 != manifest.model["sha256"]:
        raise LsrIndexError(f"model {model or manifest.model['name']!r} (sha256 {loaded.sha256[:12]}…) is not "
                            f"the one that encoded {index} (sha256 {manifest.model['sha256'][:12]}…)")
    q = manifest.quantization
    return SpladeEncoder(loaded, backend=backend), Quantization(scale=q["scale"]), manifest


def encode_queries(encoder, quantization: Quantization, queries: Sequence[tuple[str, str]], max_length: int,
                   batch: int = 256) -> list[tuple[str, dict[str, int]]]:
    vocab = encoder.model.vocab
    out = []
    for start in range(0, len(queries), batch):
        chunk = queries[start:start + batch]
        vectors = quantize(encoder.encode([text for _, text in chunk], max_length), quantization)
        for i, (qid, _) in enumerate(chunk):
            terms, weights = vectors.row(i)
            out.append((qid, {vocab[t]: int(w) for t, w in zip(terms.tolist(), weights.tolist())}))
    return out


def search(index: Path, queries: Sequence[tuple[str, str]], hits: int = 1000, threads: int = 1,
           model: str | None = None, device: str = "cpu", backend: str = "auto") -> Run:
    encoder, quantization, manifest = load_query_encoder(index, model, device, backend)
    vectors = encode_queries(encoder, quantization, queries, manifest.encoder["query_max_length"])
    searcher = ImpactSearcher(index)
    try:
        return searcher.search(vectors, hits=hits, threads=threads)
    finally:
        searcher.close()


def write_run(path: Path, run: Run, fmt: str = "trec", tag: str = "lsr-index") -> None:
    if fmt not in RUN_FORMATS:
        raise LsrIndexError(f"unknown run format {fmt!r}: choose one of {', '.join(RUN_FORMATS)}")
    if fmt == "trec":
        lines = (f"{qid} Q0 {doc} {rank} {score:.4f} {tag}\n"
                 for qid, ranked in run.items() for rank, (doc, score) in enumerate(ranked, 1))
    else:
        lines = (f"{qid}\t{doc}\t{rank}\n" for qid, ranked in run.items() for rank, (doc, _) in enumerate(ranked, 1))
    atomic_write_bytes(path, "".join(lines).encode())


def read_run(path: Path) -> Run:
    """A run file as `search` writes it: TREC (qid Q0 docid rank score tag) or MS MARCO (qid docid rank)."""
    run: Run = {}
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LsrIndexError(f"{path}: cannot read run: {exc}") from None
    for number, line in enumerate(text.splitlines(), 1):
        cols = line.split()
        if not cols:
            continue
        if len(cols) not in (6, 3):
            raise LsrIndexError(f"{path}:{number}: expected 'qid Q0 docid rank score tag' (TREC) or "
                                f"'qid docid rank' (MS MARCO), got {len(cols)} columns")
        try:  # MS MARCO runs carry ranks only: rank r scores -r, which keeps the order
            score = float(cols[4]) if len(cols) == 6 else -float(cols[2])
        except ValueError:
            raise LsrIndexError(f"{path}:{number}: {'score' if len(cols) == 6 else 'rank'} is not a number") \
                from None
        run.setdefault(cols[0], []).append((cols[2] if len(cols) == 6 else cols[1], score))
    return run
