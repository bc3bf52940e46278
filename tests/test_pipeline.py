"""Encode → build → search on real components: the real model, real files, a real Lucene index."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_runner import run_cli
from terminal import on_terminal

from lsr_index.encode.job import EncodeJob, EncodeOptions
from lsr_index.encode.run import encode_corpus
from lsr_index.errors import LsrIndexError
from lsr_index.vectors.manifest import Manifest
from lsr_index.vectors.shards import read_shard

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample"

LSR = [sys.executable, "-m", "lsr_index"]


def encode(source: Path, out: Path, devices: tuple[str, ...] = ("cpu",), **options) -> Manifest:
    options = {"doc_max_length": 32, "progress": False, **options}  # quality is not under test here
    return encode_corpus(EncodeJob(inputs=(str(source),), options=EncodeOptions(**options)), out, devices)


def vectors_of(directory: Path) -> dict[str, dict[str, int]]:
    manifest = Manifest.load(directory)
    return {doc: vec for shard in manifest.shards for doc, vec in read_shard(directory / shard.file)}


@pytest.fixture(scope="module")
def encoded(splade_tiny, tmp_path_factory) -> tuple[Path, Manifest]:
    work = tmp_path_factory.mktemp("encoded")
    return work, encode(SAMPLE / "corpus.jsonl", work / "vectors", shard_docs=150, output_format="jsonl")


@pytest.fixture(scope="module")
def built(encoded):
    from lsr_index.engines.lucene.build import build_index

    work, manifest = encoded
    info = build_index(work / "vectors", work / "index", heap="1g", progress=False)
    return work, manifest, info


@pytest.mark.lucene
def test_manifest_records_what_was_made(built):
    work, manifest, info = built
    assert manifest.complete and manifest.docs == 400 == info.documents
    assert [s.docs for s in manifest.shards] == [150, 150, 100]
    assert [s.start for s in manifest.shards] == [0, 150, 300]
    vectors = vectors_of(work / "vectors")
    assert len(vectors) == 400 and sum(len(v) for v in vectors.values()) == manifest.nonzeros
    assert manifest.model.name == "splade-tiny" and manifest.quantization.scale == 100.0
    assert all(w > 0 and isinstance(w, int) for v in vectors.values() for w in v.values())


@pytest.mark.lucene
def test_lucene_topk_equals_exact_integer_dot_product(built, splade_tiny):
    from lsr_index.engines.lucene.searcher import ImpactSearcher
    from lsr_index.inputs.topics import read_queries
    from lsr_index.search import encode_queries, load_query_encoder

    work, _, _ = built
    docs = vectors_of(work / "vectors")
    encoder, quantization, _ = load_query_encoder(work / "index", None, "cpu", "auto")
    queries = encode_queries(encoder, quantization, read_queries(SAMPLE / "queries.tsv"), 64)
    searcher = ImpactSearcher(work / "index")
    lucene = searcher.search(queries, hits=25, threads=2)
    searcher.close()
    compared = 0
    for qid, q in queries:
        scores = {doc: sum(w * v.get(t, 0) for t, w in q.items()) for doc, v in docs.items()}
        exact = sorted(((d, s) for d, s in scores.items() if s > 0), key=lambda x: (-x[1], x[0]))[:25]
        assert [(d, float(s)) for d, s in exact] == lucene[qid], qid
        compared += len(exact)
    assert compared > 60 * 20


@pytest.mark.lucene
def test_build_refuses_a_corrupted_shard(built, tmp_path):
    import shutil

    from lsr_index.engines.lucene.build import build_index

    work, manifest, _ = built
    shutil.copytree(work / "vectors", tmp_path / "vectors")
    shard = tmp_path / "vectors" / manifest.shards[1].file
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(LsrIndexError, match="checksum mismatch"):
        build_index(tmp_path / "vectors", tmp_path / "index", progress=False)
    assert not (tmp_path / "index").exists()


@pytest.mark.lucene
def test_build_never_overwrites_without_permission(built):
    from lsr_index.engines.lucene.build import build_index

    work, _, _ = built
    with pytest.raises(LsrIndexError, match="--overwrite"):
        build_index(work / "vectors", work / "index", progress=False)


@pytest.mark.lucene
def test_search_refuses_another_model(built, splade_tiny, tmp_path):
    import shutil

    from lsr_index.search import search

    work, _, _ = built
    other = tmp_path / "other-model"
    shutil.copytree(splade_tiny.path, other)
    from safetensors.torch import load_file, save_file

    weights = load_file(other / "model.safetensors")
    weights["cls.predictions.bias"] = weights["cls.predictions.bias"] + 0.5
    save_file(weights, other / "model.safetensors")
    with pytest.raises(LsrIndexError, match="is not the one that encoded"):
        search(work / "index", [("1", "protein")], model=str(other))


@pytest.mark.lucene
def test_parquet_shards_build_the_same_index(built, splade_tiny, tmp_path):
    """The writers read Parquet shards directly: the index must search like the JSONL one."""
    from lsr_index.engines.lucene.build import build_index
    from lsr_index.engines.lucene.searcher import ImpactSearcher
    from lsr_index.inputs.topics import read_queries
    from lsr_index.search import encode_queries, load_query_encoder

    work, _, _ = built
    encode(SAMPLE / "corpus.jsonl", tmp_path / "vectors", shard_docs=150, output_format="parquet")
    info = build_index(tmp_path / "vectors", tmp_path / "index", heap="1g", progress=False)
    assert info.documents == 400
    encoder, quantization, _ = load_query_encoder(work / "index", None, "cpu", "auto")
    queries = encode_queries(encoder, quantization, read_queries(SAMPLE / "queries.tsv"), 64)
    results = []
    for index in (work / "index", tmp_path / "index"):
        searcher = ImpactSearcher(index)
        results.append(searcher.search(queries, hits=25, threads=2))
        searcher.close()
    assert results[0] == results[1] and sum(len(hits) for hits in results[0].values()) > 60 * 20


def test_encode_refuses_to_overwrite_a_complete_output(encoded):
    work, _ = encoded
    with pytest.raises(LsrIndexError, match="--overwrite"):
        encode(SAMPLE / "corpus.jsonl", work / "vectors", shard_docs=150, output_format="jsonl")


def test_two_workers_write_what_one_writes(encoded, tmp_path):
    """Workers claim whole shards, whichever reaches one first; the result is the single-worker one, shard for
    shard."""
    _, whole = encoded
    split = encode(SAMPLE / "corpus.jsonl", tmp_path / "vectors", devices=("cpu", "cpu"), shard_docs=150,
                   output_format="jsonl")
    assert split.stats.workers == 2
    # 400 documents in shards of 150, 150 and 100: each worker encodes whole ones
    docs = sorted(w.docs for w in split.stats.per_worker)
    assert docs in ([0, 400], [100, 300], [150, 250]) and [w.device for w in split.stats.per_worker] == \
        ["cpu", "cpu"], split.stats.per_worker
    assert all(0 < w.model_loaded_after_seconds <= w.startup_seconds and w.docs_per_second_after_startup > 0
               for w in split.stats.per_worker if w.docs)
    assert [(s.file, s.start, s.docs, s.sha256) for s in split.shards] == \
        [(s.file, s.start, s.docs, s.sha256) for s in whole.shards]


def _encode_args(corpus: Path, out: Path) -> list[str]:
    return ["--quiet", "encode", str(corpus), "-o", str(out), "--shard-docs", "40", "--doc-max-length", "32",
            "--format", "jsonl"]


def test_sigkill_then_rerun_equals_an_uninterrupted_run(tmp_path):
    """Kill `encode` at several points in a row; each rerun continues; the end result is identical."""
    lines = (SAMPLE / "corpus.jsonl").read_text().splitlines()
    corpus = tmp_path / "corpus.jsonl"  # 1,600 documents: long enough to outlast several once-a-second manifest saves
    corpus.write_text("".join(json.dumps({**json.loads(line), "id": f"{k}-" + json.loads(line)["id"]}) + "\n"
                              for k in range(4) for line in lines))
    assert run_cli(*_encode_args(corpus, tmp_path / "whole")).returncode == 0  # in this process
    out = tmp_path / "killed"
    kills = 0
    for wait_for_shards in (6, 22):  # of 40
        proc = subprocess.Popen([*LSR, *_encode_args(corpus, out)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            try:
                if len(json.loads((out / "manifest.json").read_text())["shards"]) >= wait_for_shards:
                    break
            except (FileNotFoundError, json.JSONDecodeError, KeyError):
                pass
            time.sleep(0.02)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            kills += 1
        proc.wait()
        if Manifest.load(out).complete:
            break
    else:
        done = run_cli(*_encode_args(corpus, out))
        assert done.returncode == 0, done.stderr
    assert kills >= 2
    whole, resumed = Manifest.load(tmp_path / "whole"), Manifest.load(out)
    assert resumed.complete and resumed.docs == whole.docs == 1600
    assert [s.sha256 for s in resumed.shards] == [s.sha256 for s in whole.shards]
    assert vectors_of(out) == vectors_of(tmp_path / "whole")
    assert not list((out / "shards").glob(".*"))


@pytest.mark.lucene
def test_cli_runs_the_whole_pipeline_on_the_sample(tmp_path):
    """The README's main job, on a terminal: every step shows its progress against a known total."""
    work = ["--workdir", str(tmp_path)]
    steps = [["encode", str(SAMPLE / "corpus.jsonl"), "--doc-max-length", "128"], ["build", "--threads", "2"],
             ["search", "--queries", str(SAMPLE / "queries.tsv"), "--qrels", str(SAMPLE / "qrels.tsv"),
              "--hits", "100"]]
    outputs = [on_terminal([*LSR, *work, *step]) for step in steps]
    for step, result in zip(steps, outputs):
        assert result.returncode == 0, (step, result.stderr)
    encoded, built, searched = (result.stderr for result in outputs)
    assert "encode: 100%" in encoded and "400/400" in encoded
    assert "check shards: 100%" in built and "400/400" in built
    assert "opening" in searched and "loading the query model" in searched
    assert "encode queries: 100%" in searched and "search: 100%" in searched and "60/60" in searched
    metrics = dict(zip(*[iter(outputs[-1].stdout.split("\n")[-2].split())] * 2))
    assert float(metrics["nDCG@10"]) > 0.5  # 60 queries over 400 docs; the full collection gives 0.64
    run = (tmp_path / "runs" / "queries.trec").read_text().splitlines()
    assert len(run) == 60 * 100 and run[0].split()[1] == "Q0" and run[0].split()[3] == "1"
    evaluated = subprocess.run([*LSR, "eval", "--run", str(tmp_path / "runs" / "queries.trec"), "--qrels",
                                str(SAMPLE / "qrels.tsv")], capture_output=True, text=True)
    assert evaluated.stdout.split() == outputs[-1].stdout.split("\n")[-2].split()


def test_cli_errors_are_one_clear_line(tmp_path):
    missing = subprocess.run([*LSR, "--workdir", str(tmp_path), "encode", str(tmp_path / "nope.jsonl")],
                             capture_output=True, text=True)
    assert missing.returncode == 1 and "nope.jsonl" in missing.stderr and "Traceback" not in missing.stderr
    no_index = subprocess.run([*LSR, "--workdir", str(tmp_path), "search", "--queries", str(SAMPLE / "queries.tsv")],
                              capture_output=True, text=True)
    assert no_index.returncode == 1 and "lsr-index build" in no_index.stderr and "Traceback" not in no_index.stderr


@pytest.mark.lucene
def test_lucene_indexes_every_gzip_member(tmp_path):
    """A .jsonl.gz shard is a run of gzip members (one per chunk); Anserini must read past the first."""
    import gzip

    from lsr_index.engines.lucene.build import build_index
    from lsr_index.engines.lucene.checks import count_docs

    manifest = encode(SAMPLE / "corpus.jsonl", tmp_path / "vectors", max_tokens=4096, output_format="jsonl.gz",
                      doc_max_length=32)
    shard = tmp_path / "vectors" / manifest.shards[0].file
    assert shard.read_bytes().count(b"\x1f\x8b\x08") >= 2  # several members
    assert len(gzip.decompress(shard.read_bytes()).splitlines()) == 400
    build_index(tmp_path / "vectors", tmp_path / "index", progress=False)
    assert count_docs(tmp_path / "index") == 400
