"""encode → build → search through the CLI with a separate query model, and with an inference-free token-weight
query encoder: tiny random models saved by the test, a real Lucene index, and search in a process of its own (which
reports the model classes it imported).

Each run is checked against an independent computation: the query vectors from the query model's own full forward
(or from the table by hand), integer dot products over the documents' vectors as the shards hold them.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_runner import run_cli
from tiny_models import WORDS, reference_weights, save_masked_lm

from lsr_index.model.files import identity
from lsr_index.runs import read_run
from lsr_index.search import encode_queries, load_query_encoder
from lsr_index.vectors.manifest import Manifest
from lsr_index.vectors.shards import read_shard

# The CLI, reporting at exit which modules of transformer bodies the process imported (stderr's last line): lsr-index's
# own BERT family, transformers' model classes (modeling_auto, the name → class table, defines none)
LSR = [sys.executable, "-c", "import atexit, sys; atexit.register(lambda: print('modeling:', *sorted(m for m in "
       "sys.modules if m == 'lsr_index.model.family' or m.startswith('transformers.models.') and '.modeling_' in m "
       "and '.auto.' not in m), file=sys.stderr)); "
       "from lsr_index.cli import main; main()", "--quiet"]
QUERIES = ["protein receptor binds", "vitamin fracture risk", "cancer gene mutation", "randomized trial of adults",
           "neurons and disease"]
SCALE = 100
HITS = 8


def _lsr(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*LSR, *args], capture_output=True, text=True, timeout=300)


def _modeling_modules(stderr: str) -> set[str]:
    """The modules of transformers' model classes that the process imported, as LSR reports them."""
    return set(stderr.splitlines()[-1].removeprefix("modeling:").split())


def _corpus(root: Path) -> tuple[Path, Path]:
    rng = random.Random(7)
    corpus, queries = root / "corpus.jsonl", root / "queries.tsv"
    corpus.write_text("".join(json.dumps({"id": f"d{i:02d}", "text": " ".join(rng.sample(WORDS, 5))}) + "\n"
                              for i in range(30)))
    queries.write_text("".join(f"q{i}\t{text}\n" for i, text in enumerate(QUERIES)))
    return corpus, queries


def _encode_build_search(root: Path, model: Path, *extra: str) -> tuple[Manifest, dict, dict, str]:
    """The manifest, the documents' vectors, the run, and the search process's stderr."""
    corpus, queries = _corpus(root)
    encoded = run_cli("--quiet", "encode", str(corpus), "-o", str(root / "vectors"), "--model", str(model),
                      "--doc-max-length", "32", "--query-max-length", "16", "--format", "jsonl", "--device", "cpu",
                      *extra)
    assert encoded.returncode == 0, encoded.stderr[-2000:]
    built = run_cli("--quiet", "build", "--vectors", str(root / "vectors"), "--index", str(root / "index"))
    assert built.returncode == 0, built.stderr[-2000:]
    searched = _lsr("search", "--queries", str(queries), "--index", str(root / "index"), "--run", str(root / "run"),
                    "--hits", str(HITS))
    assert searched.returncode == 0, searched.stderr[-2000:]
    manifest = Manifest.load(root / "vectors")
    docs = {doc: vector for shard in manifest.shards for doc, vector in read_shard(root / "vectors" / shard.file)}
    return manifest, docs, read_run(root / "run"), searched.stderr


def _exact(queries: list[dict[str, int]], docs: dict[str, dict[str, int]]) -> dict[str, list[tuple[str, float]]]:
    """Top hits by integer dot product, ties by document id (as Lucene breaks them on these indexes)."""
    run = {}
    for i, query in enumerate(queries):
        scores = {doc: sum(w * vector.get(t, 0) for t, w in query.items()) for doc, vector in docs.items()}
        ranked = sorted(((d, s) for d, s in scores.items() if s > 0), key=lambda x: (-x[1], x[0]))[:HITS]
        run[f"q{i}"] = [(d, float(s)) for d, s in ranked]
    return {qid: ranked for qid, ranked in run.items() if ranked}


def _splade_queries(mlm, tokenizer) -> list[dict[str, int]]:
    """Query vectors from the model's full forward (transformers' own), pooled and quantized here."""
    weights = reference_weights(mlm, tokenizer, QUERIES, 16)
    vocab = {i: t for t, i in tokenizer.get_vocab().items()}
    return [{vocab[i]: round(float(row[i]) * SCALE) for i in torch.nonzero(row * SCALE >= 0.5).flatten().tolist()}
            for row in weights]


def _close(got: list[dict[str, int]], want: list[dict[str, int]]) -> bool:
    """Equal impacts up to one unit (the reference runs in float64: an impact may round the other way)."""
    return all(abs(g.get(t, 0) - w.get(t, 0)) <= 1 for g, w in zip(got, want) for t in g.keys() | w.keys())


@pytest.mark.slow
@pytest.mark.lucene
def test_separate_query_model_end_to_end(tmp_path):
    documents, _, _ = save_masked_lm("bert", tmp_path / "doc", pickled=False, seed=0)
    query_path, query_mlm, tokenizer = save_masked_lm("bert", tmp_path / "query", pickled=True, seed=3)
    doc_mlm = save_masked_lm("bert", tmp_path / "doc-again", pickled=False, seed=0)[1]
    manifest, docs, run, stderr = _encode_build_search(tmp_path, documents, "--query-model", str(query_path))
    assert manifest.query_model.name == str(query_path.resolve())
    assert manifest.query_model.sha256 == identity(query_path)[0] != manifest.model.sha256
    assert manifest.query_model.kind == "splade"
    assert _modeling_modules(stderr) == {"lsr_index.model.family"}  # BERT's body, run without transformers

    encoder, quantization, _ = load_query_encoder(tmp_path / "index", None, "cpu", "torch")
    sent = [vector for _, vector in encode_queries(encoder, quantization, list(enumerate(QUERIES)), 16)]
    ours, theirs = _splade_queries(query_mlm, tokenizer), _splade_queries(doc_mlm, tokenizer)
    assert _close(sent, ours) and not _close(sent, theirs)  # the query model's vectors, not the document model's
    assert run == _exact(sent, docs)
    assert run != _exact(theirs, docs)  # … so another run than the document model's queries would give


@pytest.mark.slow
@pytest.mark.lucene
def test_token_weight_queries_end_to_end_load_no_transformer(tmp_path):
    documents, _, tokenizer = save_masked_lm("bert", tmp_path / "doc", pickled=False, seed=0)
    vocab = sorted(tokenizer.get_vocab(), key=tokenizer.get_vocab().get)  # id order: get_vocab's order varies by run
    weights = {term: round(0.3 + (i % 11) / 4, 2) for i, term in enumerate(vocab) if i % 4}
    (documents / "idf.json").write_text(json.dumps(weights))
    manifest, docs, run, stderr = _encode_build_search(tmp_path, documents)
    assert manifest.query_model.kind == "token_weights"
    assert manifest.query_model.sha256 == manifest.model.sha256 == identity(documents)[0]
    assert not _modeling_modules(stderr), "search loaded a transformer for token-weight queries"

    by_hand = [{t: round(weights[t] * SCALE) for t in set(tokenizer.tokenize(text)) if t in weights}
               for text in QUERIES]
    exact = _exact(by_hand, docs)
    assert run == exact and sum(map(len, exact.values())) >= 20


def test_query_model_with_another_vocabulary_is_refused_in_one_line(tmp_path):
    documents = save_masked_lm("bert", tmp_path / "doc", pickled=False)[0]
    query = save_masked_lm("roberta", tmp_path / "query", pickled=False)[0]
    corpus, _ = _corpus(tmp_path)
    refused = run_cli("--quiet", "encode", str(corpus), "-o", str(tmp_path / "vectors"), "--model", str(documents),
                      "--query-model", str(query), "--doc-max-length", "32", "--device", "cpu")
    errors = refused.stderr.splitlines()
    assert refused.returncode == 1 and len(errors) == 1, refused.stderr[-2000:]
    assert "differs from the document model's" in errors[0] and "Traceback" not in refused.stderr
    assert not (tmp_path / "vectors").exists()
