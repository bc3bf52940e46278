"""lsr-index from Python: the stages the command line runs, as functions over the same typed records.

    from lsr_index import api
    manifest = api.encode("corpus.jsonl", "out/vectors")          # → vectors.manifest.Manifest
    record = api.build("out/vectors", "out/index")                # → engines.index.IndexRecord
    api.build("out/vectors", "out/seismic", engine="seismic")     # → the same, for a Seismic index
    run = api.search("out/index", [("q1", "sleep and memory")])   # → {qid: [(docid, score), ...]}
    api.search("out/seismic", vectors=[("q1", {"sleep": 120})])   # → the same, from query vectors
    api.export_ciff("out/vectors", "out/index.ciff")              # → for PISA and other CIFF importers
    api.evaluate(run, api.read_qrels("qrels.tsv"))                # → {"nDCG@10": ..., ...}
    api.encode_texts(["a passage"])                               # → [{term: impact}, ...]

Errors a user can cause raise `LsrIndexError` (one clear line); nothing here prints unless `progress` is set.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from lsr_index.errors import LsrIndexError
from lsr_index.runtime.timeline import mark
from lsr_index.settings import CPU_PIECE_DOCS, DEFAULTS, DTYPE, MAX_TOKENS

if TYPE_CHECKING:
    from lsr_index.engines.seismic.options import SeismicBuild, SeismicSearch
    from lsr_index.model.ref import ModelRef

Run = dict[str, list[tuple[str, float]]]


def devices(spec: str | Sequence[str] = "auto") -> tuple[str, ...]:
    """The devices of an encode: "auto" (every visible GPU, one worker each, else the CPU), "cpu", "cuda:N", or
    several ("cuda:0,cuda:1" or a list)."""
    import torch

    if spec == "auto":
        count = torch.cuda.device_count()
        return tuple(f"cuda:{i}" for i in range(count)) if count else ("cpu",)
    names = [d.strip() for d in (spec.split(",") if isinstance(spec, str) else spec) if d.strip()]
    chosen = []
    for name in names:
        try:
            device = torch.device(name)
        except RuntimeError:
            raise LsrIndexError(f"--device {name!r}: not a device (use auto, cpu, cuda or cuda:N)") from None
        if device.type == "cuda":
            count = torch.cuda.device_count()
            if count == 0 or (device.index or 0) >= count:
                raise LsrIndexError(f"--device {name}: {count} CUDA GPU(s) visible")
            chosen.append(f"cuda:{device.index or 0}")
        elif device.type == "cpu":
            chosen.append("cpu")
        else:
            raise LsrIndexError(f"--device {name}: only cpu and cuda devices are supported")
    if "cpu" in chosen and len(set(chosen)) > 1:  # the run would end with the CPU's last unit, ~100x a GPU's
        raise LsrIndexError(f"--device {spec}: a CPU beside GPUs holds them up (each input unit goes to one worker "
                            "whole, and a CPU encodes one ~100x slower): give the GPUs alone")
    return tuple(chosen) or ("cpu",)


def encode(inputs: str | os.PathLike | Sequence[str | os.PathLike], output: str | os.PathLike, *,
           model: str | ModelRef = DEFAULTS["model"], query_model: str | ModelRef | None = None,
           device: str | Sequence[str] = "auto",
           dtype: str | None = None, doc_max_length: int | None = None, query_max_length: int | None = None,
           max_tokens: int | None = None, shard_docs: int = DEFAULTS["shard_docs"],
           output_format: str = DEFAULTS["output_format"], scale: float = DEFAULTS["scale"], top_k: int | None = None,
           min_weight: float = DEFAULTS["min_weight"], id_field: str | None = None,
           text_fields: Sequence[str] | None = None, on_error: str = "fail",
           checkpoint_seconds: float = DEFAULTS["checkpoint_seconds"], threads: int | None = None,
           backend: str = DEFAULTS["backend"], overwrite: bool = False, progress: bool = False,
           ray: str | None = None, ray_cpus: int = 4, completing: Callable[[], AbstractContextManager] = nullcontext):
    """Encode a corpus (files, directories or globs of JSONL, Arrow or Parquet) into impact vectors in `output`,
    resuming what an earlier run left there; returns the manifest. Lengths left unset are the model's own (a
    SparseEncoder directory's saved lengths), else 256 and 64. `threads`: each worker's compute threads on CPU
    (default: the cores this process may use, divided among the workers). `ray`: a Ray cluster's address ("" for
    the local one) to encode on instead of this machine's devices.

    On a CPU shared with other work, set OMP_WAIT_POLICY=PASSIVE before torch is first imported (the command line
    does): waiting threads then sleep instead of spinning on the cores the work needs."""
    from lsr_index.encode.job import EncodeJob, EncodeOptions
    from lsr_index.encode.run import encode as run_encode
    from lsr_index.inputs.corpus import Fields
    from lsr_index.model.ref import ModelRef
    from lsr_index.vectors.quantize import Quantization

    sources = (inputs,) if isinstance(inputs, (str, os.PathLike)) else tuple(inputs)
    cluster = None
    if ray is not None:  # the cluster's devices replace `device`
        from lsr_index.encode.cluster import RayCluster

        cluster = RayCluster(ray, ray_cpus)
    try:
        chosen = cluster.devices if cluster else devices(device)
        mark(f"devices: {', '.join(chosen)}")
        gpu = chosen[0].startswith("cuda")
        ref = ModelRef.resolve(model)
        query_ref = ModelRef.resolve(query_model) if query_model else None
        own, own_query = ref.lengths(), (query_ref or ref).lengths()
        job = EncodeJob(
            inputs=tuple(map(str, sources)), model=ref, query_model=query_ref,
            dtype=DTYPE["cuda" if gpu else "cpu"] if dtype in (None, "auto") else dtype,
            fields=Fields(id=id_field, text=tuple(text_fields) if text_fields else None), on_error=on_error,
            options=EncodeOptions(
                doc_max_length=doc_max_length or own.document or DEFAULTS["doc_max_length"],
                query_max_length=query_max_length or own_query.query or DEFAULTS["query_max_length"],
                max_tokens=max_tokens or MAX_TOKENS["cuda" if gpu else "cpu"], shard_docs=shard_docs,
                output_format=output_format, checkpoint_seconds=checkpoint_seconds, threads=threads,
                piece_docs=None if gpu else CPU_PIECE_DOCS,
                quantization=Quantization(scale=scale, top_k=top_k, min_weight=min_weight), backend=backend,
                overwrite=overwrite, progress=progress))
        if cluster is None:
            from lsr_index.encode.local import LocalExecutor

            return run_encode(job, Path(output), LocalExecutor(chosen), completing=completing)
        return run_encode(job, Path(output), cluster, completing=completing)
    finally:
        if cluster:
            cluster.shutdown()


def encode_texts(texts: Sequence[str], *, model: str = DEFAULTS["model"], device: str = "cpu",
                 max_length: int = DEFAULTS["doc_max_length"], scale: float = DEFAULTS["scale"],
                 dtype: str = "float32") -> list[dict[str, int]]:
    """The impact vectors (term → impact) of `texts`, as `encode` writes them for documents of this length."""
    import torch

    from lsr_index.model.encoder import SpladeEncoder
    from lsr_index.model.load import load_model
    from lsr_index.vectors.quantize import Quantization, quantize

    loaded = load_model(model, device=device, dtype=getattr(torch, dtype))
    vectors = quantize(SpladeEncoder(loaded).encode(list(texts), max_length), Quantization(scale=scale))
    out = []
    for i in range(len(texts)):
        terms, weights = vectors.row(i)
        out.append({loaded.vocab[t]: int(w) for t, w in zip(terms.tolist(), weights.tolist())})
    return out


def build(vectors: str | os.PathLike, index: str | os.PathLike, *, engine: str = "lucene",
          threads: int | None = None, heap: str = "4g", builder: str = "direct",
          seismic: SeismicBuild | dict | None = None, overwrite: bool = False, progress: bool = False):
    """An index of an encode's vectors, verified and published whole; returns its record. `engine`: "lucene" (an
    exact impact index; `builder` and `heap` are its) or "seismic" (approximate and fast to search; `seismic`
    sets its knobs, a SeismicBuild or a dict of its fields). `threads`: Lucene's writers, or Seismic's build
    threads."""
    if engine == "lucene":
        if seismic is not None:
            raise LsrIndexError("Seismic build options given for a Lucene build: pass engine='seismic'")
        from lsr_index.engines.lucene.build import build_index

        return build_index(Path(vectors), Path(index), threads=threads, heap=heap, overwrite=overwrite,
                           progress=progress, builder=builder)
    if engine == "seismic":
        from lsr_index.engines.seismic.build import build_index
        from lsr_index.engines.seismic.options import SeismicBuild

        options = seismic if isinstance(seismic, SeismicBuild) else \
            SeismicBuild.from_dict(dict(seismic or {}), "seismic build options")
        if threads is not None:
            options = SeismicBuild.from_dict({**options.to_dict(), "threads": threads}, "seismic build options")
        return build_index(Path(vectors), Path(index), options=options, overwrite=overwrite, progress=progress)
    raise LsrIndexError(f"unknown engine {engine!r}: choose lucene or seismic")


def search(index: str | os.PathLike, queries: Sequence[tuple[str, str]] | str | os.PathLike | None = None, *,
           vectors: Sequence[tuple[str, dict[str, float]]] | str | os.PathLike | None = None, hits: int = 1000,
           threads: int = 1, model: str | None = None, device: str = "cpu", engine: str | None = None,
           seismic: SeismicSearch | dict | None = None, progress: bool = False) -> Run:
    """Rank the index's documents for each (qid, text) query (or a queries file), the queries encoded by the model and
    quantization the index records; or for query `vectors` encoded elsewhere ((qid, {term: weight}) pairs, or a
    JSONL file of {"id", "vector"}: integer weights are impacts, fractional ones quantized by the index's scale).
    The engine is the one the index records (`engine`, when given, is checked against it); `seismic` sets a Seismic
    index's accuracy knobs (a SeismicSearch or a dict of its fields). {qid: [(docid, score), ...]}, best first."""
    from lsr_index.inputs.topics import read_queries, read_query_vectors
    from lsr_index.search import search as run_search

    if (queries is None) == (vectors is None):
        raise LsrIndexError("give queries (texts) or vectors (encoded queries), one of the two")
    topics = read_queries(queries) if isinstance(queries, (str, os.PathLike)) else \
        list(queries) if queries is not None else None
    encoded = read_query_vectors(vectors) if isinstance(vectors, (str, os.PathLike)) else \
        list(vectors) if vectors is not None else None
    options = None
    if seismic is not None:
        from lsr_index.engines.seismic.options import SeismicSearch

        options = seismic if isinstance(seismic, SeismicSearch) else \
            SeismicSearch.from_dict(dict(seismic), "seismic search options")
    return run_search(Path(index), topics, hits=hits, threads=threads, model=model, device=device,
                      progress=progress, vectors=encoded, engine=engine, seismic=options)


def export_ciff(vectors: str | os.PathLike, out: str | os.PathLike, *, memory: int = 4 << 30,
                progress: bool = False) -> dict:
    """The vectors as one CIFF file (Common Index File Format: tf = impact), which PISA's ciff2pisa, Terrier and
    other engines import; written whole or not at all, inverted within about `memory` bytes. What was written."""
    from lsr_index.engines.ciff import export_ciff as export

    return export(Path(vectors), Path(out), memory=memory, progress=progress)


def evaluate(run: Run, qrels: dict[str, dict[str, int]] | str | os.PathLike) -> dict[str, float]:
    """nDCG@10, MRR@10 (RR@10), R@100, R@1000, MAP (AP@1000), means over the judged queries."""
    from lsr_index.evaluate import NAMES
    from lsr_index.evaluate import evaluate as run_evaluate
    from lsr_index.inputs.topics import read_qrels

    judged = read_qrels(qrels) if isinstance(qrels, (str, os.PathLike)) else qrels
    return {NAMES.get(name, name): value for name, value in run_evaluate(run, judged).items()}


def read_qrels(path: str | os.PathLike) -> dict[str, dict[str, int]]:
    """Relevance judgments (TREC or BEIR TSV): {qid: {docid: grade}}."""
    from lsr_index.inputs.topics import read_qrels as read

    return read(path)


def read_queries(path: str | os.PathLike) -> list[tuple[str, str]]:
    """Queries (TSV or BEIR JSONL): [(qid, text), ...]."""
    from lsr_index.inputs.topics import read_queries as read

    return read(path)
