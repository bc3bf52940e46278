"""Query encoders: a SPLADE model (the documents' own, or a separate one), or an inference-free token-weight table.

Inference-free models (opensearch-neural-sparse-encoding-doc-*, splade-v3-doc, sentence-transformers routers with a
SparseStaticEmbedding query route) encode documents with a masked LM and queries with no model at all: a query's
vector is the weight of each distinct token it contains, read from a table shipped with the model. Search then
loads no transformer.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lsr_index.errors import LsrIndexError
from lsr_index.model.encoder import SpladeEncoder
from lsr_index.model.load import SpladeModel, load_model
from lsr_index.model.ref import ModelRef, read_tokenizer
from lsr_index.model.tokens import tokenizer_terms
from lsr_index.vectors.manifest import QueryModelRecord

QUERY_TABLES = ("query_token_weights.txt", "idf.json")  # opensearch's two spellings of the same table


@dataclass
class TokenWeights:
    """A query encoder without a model: term id → weight. `vocab` and `vocab_size` match SpladeModel's, so the
    search stage can turn ids into terms the same way."""

    name: str
    path: Path
    sha256: str  # the model's identity (ModelRef.sha256), as for a SpladeModel
    tokenizer: object
    weights: np.ndarray  # float32 [V]
    vocab: list[str]

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)


class TokenWeightEncoder:
    """Queries → [n, V] weights: weight[t] for each distinct token t of the text (no special tokens), as
    sentence-transformers' SparseStaticEmbedding computes them. Same `encode` and `model` as SpladeEncoder."""

    def __init__(self, model: TokenWeights):
        self.model = model
        self._weights = torch.from_numpy(model.weights)

    def token_counts(self, texts: list[str], max_length: int) -> np.ndarray:
        """Each text's length in tokens before truncation at `max_length` (no special tokens, as `encode`)."""
        if not texts:
            return np.zeros(0, np.int64)
        ids = self.model.tokenizer(list(texts), add_special_tokens=False, verbose=False)["input_ids"]
        return np.array([len(i) for i in ids], np.int64)

    def encode(self, texts: list[str], max_length: int) -> torch.Tensor:
        ids = self.model.tokenizer(list(texts), add_special_tokens=False, truncation=True, max_length=max_length,
                                   padding=True, return_tensors="pt")
        present = torch.zeros(len(texts), self.model.vocab_size)
        # amax: a padding position must not clear a real token of the same id (scatter_ keeps an arbitrary write)
        present.scatter_reduce_(1, ids["input_ids"], ids["attention_mask"].float(), reduce="amax")
        return present * self._weights


@dataclass(frozen=True)
class QueryRoute:
    """How the model in a directory encodes queries, read from its files alone (no weights loaded)."""

    kind: str  # "splade": through the masked LM; "token_weights": from a table, no model
    table: Path | None  # idf.json, query_token_weights.txt or a SparseStaticEmbedding folder
    tokenizer: Path  # the directory whose tokenizer splits queries


def query_route(model: ModelRef) -> QueryRoute:
    """A sentence-transformers SparseStaticEmbedding query route, else a table file in the directory, else the
    model itself."""
    path, layout = model.path, model.layout
    if layout is not None and layout.query is not None:
        module = layout.query
        return QueryRoute("token_weights", module, module if (module / "tokenizer.json").is_file() else path)
    table = next((path / name for name in QUERY_TABLES if (path / name).is_file()), None)
    if table is not None:
        return QueryRoute("token_weights", table, path)
    return QueryRoute("splade", None, model.mlm_dir)


def load_query_model(model: str | ModelRef, device: str = "cpu", dtype: torch.dtype | None = None
                     ) -> SpladeModel | TokenWeights:
    """What encodes queries for `model`: its token-weight table when it ships one (a sentence-transformers
    SparseStaticEmbedding query route, query_token_weights.txt or idf.json), else the model itself."""
    model = ModelRef.resolve(model).here()
    route = query_route(model)
    if route.kind == "splade":
        return load_model(model, device=device, dtype=dtype)
    if route.table.is_dir():
        return _static_embedding(model, route)
    tokenizer = _route_tokenizer(model, route)
    vocab, _ = tokenizer_terms(tokenizer)
    weights = np.zeros(len(vocab), np.float32)
    ids = tokenizer.get_vocab()
    for term, weight in _read_table(route.table).items():
        if term in ids:  # a term the tokenizer cannot produce can never weigh in a query
            weights[ids[term]] = weight
    return TokenWeights(name=str(model.path), path=model.path, sha256=model.sha256, tokenizer=tokenizer,
                        weights=weights, vocab=vocab)


def _route_tokenizer(model: ModelRef, route: QueryRoute):
    """The tokenizer that splits the route's queries: the documents' own when it is the same directory."""
    return model.tokenizer() if route.tokenizer == model.mlm_dir else read_tokenizer(route.tokenizer)


def vocab_sha256(vocab: list[str]) -> str:
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()


def query_model_record(query: ModelRef, documents: ModelRef, query_max_length: int) -> QueryModelRecord:
    """The manifest's query_model: what `search` loads to encode queries (`query`: the document model itself unless a
    separate query model is given), its checksum, kind and vocabulary's checksum. A query model whose vocabulary
    differs from the document model's is refused: its term ids would name other terms than the index holds."""
    limit = query.max_length()
    if limit and query_max_length > limit:
        raise LsrIndexError(f"query model {query.name} takes at most {limit} tokens; lower --query-max-length "
                            f"({query_max_length})")
    route = query_route(query)
    vocab = query.terms()[0] if route.tokenizer == query.mlm_dir else tokenizer_terms(_route_tokenizer(query, route))[0]
    doc_vocab = documents.terms()[0]  # the vocabulary the documents went through
    if vocab != doc_vocab:
        raise LsrIndexError(f"query model {query.name}: its vocabulary ({len(vocab):,} terms) differs from the "
                            f"document model's ({len(doc_vocab):,} terms, {documents.name}): its queries' terms would "
                            "not be the index's; a query model must share the document model's tokenizer")
    return QueryModelRecord(query.recorded_name, query.sha256, route.kind, vocab_sha256(vocab))


def encoder_for(model: SpladeModel | TokenWeights, backend: str = "auto") -> SpladeEncoder | TokenWeightEncoder:
    return TokenWeightEncoder(model) if isinstance(model, TokenWeights) else SpladeEncoder(model, backend=backend)


def _static_embedding(model: ModelRef, route: QueryRoute) -> TokenWeights:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    file = route.table / "model.safetensors"
    try:
        weight = load_file(file)["weight"]
    except (OSError, SafetensorError, KeyError) as exc:
        raise LsrIndexError(f"{file}: no readable 'weight' tensor for the SparseStaticEmbedding query route "
                            f"({exc})") from exc
    tokenizer = _route_tokenizer(model, route)
    vocab, _ = tokenizer_terms(tokenizer)
    if weight.dim() != 1 or weight.numel() > len(vocab):
        raise LsrIndexError(f"{file}: query weights of shape {tuple(weight.shape)} do not fit the tokenizer's "
                            f"{len(vocab)} terms")
    weights = np.zeros(len(vocab), np.float32)
    weights[:weight.numel()] = weight.float().numpy()
    if bad := np.flatnonzero(~(weights >= 0) | ~np.isfinite(weights)).tolist():
        raise LsrIndexError(f"{file}: the query weight of {vocab[bad[0]]!r} is {weights[bad[0]]}: a query term "
                            "weighs a finite number, 0 or more")
    return TokenWeights(name=str(model.path), path=model.path, sha256=model.sha256, tokenizer=tokenizer,
                        weights=weights, vocab=vocab)


def _read_table(file: Path) -> dict[str, float]:
    """idf.json ({term: weight}) or query_token_weights.txt (term TAB weight per line)."""
    try:
        if file.suffix == ".json":
            table = json.loads(file.read_text(encoding="utf-8"))
            if not isinstance(table, dict):
                raise ValueError("expected a JSON object of term → weight")
            table = {str(k): float(v) for k, v in table.items()}
        else:
            table = {}
            for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
                if line.strip():
                    term, sep, weight = line.rpartition("\t")
                    if not sep:
                        raise ValueError(f"line {number}: expected term<TAB>weight")
                    table[term] = float(weight)
    except (OSError, ValueError, TypeError) as exc:
        raise LsrIndexError(f"{file}: not a token weight table ({exc})") from exc
    # a NaN, an infinity or a negative weight would end the search, not here, in an error about impacts or in Lucene
    bad = next((term for term, weight in table.items() if not 0 <= weight < float("inf")), None)
    if bad is not None:
        raise LsrIndexError(f"{file}: the weight of {bad!r} is {table[bad]}: a query term weighs a finite number, "
                            "0 or more")
    return table
