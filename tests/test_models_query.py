"""Query encoders: a model's own token-weight table (inference-free models) or the model itself."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from tiny_models import TEXTS, save_masked_lm, sentence_transformers_dir

from lsr_index.errors import LsrIndexError
from lsr_index.model.files import identity
from lsr_index.model.load import SpladeModel, load_model
from lsr_index.model.query import (
    TokenWeightEncoder,
    TokenWeights,
    encoder_for,
    load_query_model,
    query_model_record,
    vocab_sha256,
)
from lsr_index.model.ref import ModelRef
from lsr_index.vectors.manifest import QueryModelRecord


def _by_hand(tokenizer, weights: dict[str, float], text: str) -> dict[str, float]:
    """Each distinct token of the text (no special tokens) at its table weight."""
    return {t: weights[t] for t in set(tokenizer.tokenize(text)) if weights.get(t)}


def _as_terms(model, row: torch.Tensor) -> dict[str, float]:
    return {model.vocab[i]: float(row[i]) for i in torch.nonzero(row).flatten().tolist()}


@pytest.mark.parametrize("table", ["idf.json", "query_token_weights.txt"])
def test_token_weight_table_encodes_queries_without_a_model(tmp_path, table):
    path, _, tokenizer = save_masked_lm("bert", tmp_path, pickled=False)
    terms = sorted(tokenizer.get_vocab(), key=tokenizer.get_vocab().get)
    weights = {term: round(0.5 + i / 7, 3) for i, term in enumerate(terms) if i % 3}
    if table == "idf.json":
        (path / table).write_text(json.dumps({**weights, "not-a-token": 9.0}))
    else:
        (path / table).write_text("".join(f"{t}\t{w}\n" for t, w in weights.items()))
    query = load_query_model(str(path))
    assert isinstance(query, TokenWeights) and query.sha256 == identity(path)[0]
    got = encoder_for(query).encode(TEXTS, max_length=32)
    assert got.shape == (len(TEXTS), len(query.vocab))
    for text, row in zip(TEXTS, got):
        assert _as_terms(query, row) == pytest.approx(_by_hand(tokenizer, weights, text))
    counts = encoder_for(query).token_counts(TEXTS, max_length=4)  # what truncation at 4 would cut
    assert counts.tolist() == [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in TEXTS]
    assert encoder_for(query).token_counts([], max_length=4).tolist() == []


def test_sentence_transformers_router_with_static_query_route(tmp_path):
    """The inference-free router layout: documents through MLMTransformer (in the root) + SpladePooling, queries
    through SparseStaticEmbedding (its own folder: weights and tokenizer)."""
    path, _, tokenizer = save_masked_lm("distilbert", tmp_path, pickled=False)
    sentence_transformers_dir(path, {"pooling_strategy": "max", "activation_function": "log1p_relu"})
    (path / "1_SpladePooling").rename(path / "document_1_SpladePooling")
    (path / "modules.json").write_text(json.dumps(
        [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Router"}]))
    (path / "router_config.json").write_text(json.dumps({
        "types": {"query_0_SparseStaticEmbedding": "sentence_transformers.sparse_encoder.models.SparseStaticEmbedding",
                  "document_0_MLMTransformer": "sentence_transformers.sparse_encoder.models.MLMTransformer",
                  "document_1_SpladePooling": "sentence_transformers.sparse_encoder.models.SpladePooling"},
        "structure": {"query": ["query_0_SparseStaticEmbedding"],
                      "document": ["document_0_MLMTransformer", "document_1_SpladePooling"]},
        "parameters": {"default_route": "document", "allow_empty_key": True}}))
    module = path / "query_0_SparseStaticEmbedding"
    module.mkdir()
    tokenizer.save_pretrained(module)
    table = torch.rand(len(tokenizer)) * (torch.arange(len(tokenizer)) % 2)
    save_file({"weight": table}, module / "model.safetensors")
    (module / "config.json").write_text(json.dumps({"frozen": False}))

    documents = load_model(str(path))
    assert isinstance(documents, SpladeModel) and documents.activation == "log1p_log1p_relu"
    query = load_query_model(str(path))
    assert isinstance(query, TokenWeights) and query.sha256 == documents.sha256
    assert query.vocab == documents.vocab
    weights = {t: float(table[i]) for t, i in tokenizer.get_vocab().items()}
    got = TokenWeightEncoder(query).encode(TEXTS, max_length=32)
    for text, row in zip(TEXTS, got):
        assert _as_terms(query, row) == pytest.approx(_by_hand(tokenizer, weights, text))
    save_file({"weight": torch.rand(len(tokenizer) + 3)}, module / "model.safetensors")
    with pytest.raises(LsrIndexError, match="do not fit the tokenizer"):
        load_query_model(str(path))


def test_a_model_without_a_table_encodes_its_own_queries(tmp_path):
    path, _, _ = save_masked_lm("bert", tmp_path, pickled=False)
    assert isinstance(load_query_model(str(path)), SpladeModel)


def test_a_malformed_table_is_one_line(tmp_path):
    path, _, _ = save_masked_lm("bert", tmp_path, pickled=False)
    (path / "query_token_weights.txt").write_text("protein 1.5\n")
    with pytest.raises(LsrIndexError, match=r"line 1: expected term<TAB>weight"):
        load_query_model(str(path))


def _record(model, query_model=None, query_max_length=16) -> dict:
    """The record an encode of `model` (with `query_model` for queries) writes in its manifest."""
    documents = ModelRef.resolve(str(model))
    query = ModelRef.resolve(str(query_model)) if query_model else documents
    return query_model_record(query, documents, query_max_length)


def test_the_record_names_the_query_route_of_each_layout(tmp_path):
    plain, _, _ = save_masked_lm("bert", tmp_path / "plain", pickled=False)
    record = _record(plain)
    assert record == QueryModelRecord(str(plain.resolve()), identity(plain)[0], "splade",
                                      vocab_sha256(load_model(str(plain)).vocab))
    (plain / "idf.json").write_text(json.dumps({"protein": 2.0}))
    table = _record(plain)
    assert table.kind == "token_weights" and table.sha256 == identity(plain)[0] != record.sha256
    assert table.vocab_sha256 == record.vocab_sha256
    separate, _, _ = save_masked_lm("bert", tmp_path / "separate", pickled=True, seed=5)
    chosen = _record(plain, separate)
    assert chosen.name == str(separate.resolve()) and chosen.kind == "splade"
    with pytest.raises(LsrIndexError, match=r"query model .* takes at most 66 tokens; lower --query-max-length"):
        _record(plain, separate, query_max_length=100)


def test_a_query_model_of_another_vocabulary_is_refused(tmp_path):
    bert, _, _ = save_masked_lm("bert", tmp_path, pickled=False)
    roberta, _, _ = save_masked_lm("roberta", tmp_path, pickled=False)
    with pytest.raises(LsrIndexError, match=r"vocabulary \(\d+ terms\) differs from the document model's"):
        _record(bert, roberta)


def _manifest(**query_model) -> dict:
    return {"kind": "lsr-index/vectors", "version": 2, "model": {"name": "m", "sha256": "0" * 64},
            "encoder": {"doc_max_length": 32, "query_max_length": 16, "dtype": "float32", "backend": "auto"},
            "quantization": {"scale": 100.0, "top_k": None, "min_weight": 0.0}, "input": {},
            "output_format": "jsonl", "shard_docs": 10, "shards": [], **query_model}


def test_the_manifest_reads_its_query_model_or_defaults_to_the_document_model():
    from dataclasses import asdict

    from lsr_index.vectors.manifest import Manifest

    assert asdict(Manifest.from_dict(_manifest(), "m.json").query) == {"name": "m", "sha256": "0" * 64}
    record = {"name": "q", "sha256": "1" * 64, "kind": "token_weights", "vocab_sha256": "2" * 64}
    assert asdict(Manifest.from_dict(_manifest(query_model=record), "m.json").query) == record
    for bad, message in [({**record, "kind": "onnx"}, "'query_model.kind' must be one of splade, token_weights"),
                         ({"name": "q"}, "'query_model' must be an object with exactly name, sha256, kind"),
                         ({**record, "sha256": 5}, "'query_model' values must be strings"),
                         ("q", "'query_model' must be an object")]:
        with pytest.raises(LsrIndexError, match=f"m.json: malformed manifest: {message}"):
            Manifest.from_dict(_manifest(query_model=bad), "m.json")
