"""The encoder equals SPLADE's literal pooling on the real model, whatever the bucketing."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from lsr_index.model.encoder import SpladeEncoder, length_buckets
from lsr_index.model.tokens import _restore

TEXTS = ["Alpha-synuclein aggregates in neurons of patients with Parkinson's disease.",
         "x",
         "BRCA1 mutations raise the lifetime risk of breast cancer " * 12,
         "Vitamin D supplementation and fracture risk in older adults: a randomized trial.",
         "CRISPR"]


def literal_splade(model, texts: list[str], max_length: int) -> torch.Tensor:
    """As SPLADE, Pyserini and sentence-transformers compute it: full logits, log1p(relu), mask, max."""
    tokenizer = AutoTokenizer.from_pretrained(model.path)
    batch = tokenizer(texts, truncation=True, max_length=max_length, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model.body(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        logits = hidden.double() @ model.weight.double().T + model.bias.double()
    return (torch.log1p(torch.relu(logits)) * batch["attention_mask"][..., None]).amax(dim=1)


@pytest.mark.parametrize("max_tokens", [64, 100_000])
def test_encoder_matches_literal_pooling(splade_tiny, max_tokens):
    encoder = SpladeEncoder(splade_tiny, max_tokens=max_tokens)
    got = encoder.encode(TEXTS, max_length=48)
    expected = literal_splade(splade_tiny, TEXTS, 48)
    torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-4)
    assert encoder.n_tokens == int(encoder.tokenize(TEXTS, 48).lengths.sum())


def test_max_length_truncates(splade_tiny):
    encoder = SpladeEncoder(splade_tiny)
    assert encoder.tokenize(TEXTS, 16).lengths.max() == 16
    torch.testing.assert_close(encoder.encode(TEXTS[2:3], 16).double(), literal_splade(splade_tiny, TEXTS[2:3], 16),
                               rtol=1e-4, atol=1e-4)


def test_fast_tokenization_equals_the_transformers_tokenizer(splade_tiny):
    encoder = SpladeEncoder(splade_tiny)
    hf = AutoTokenizer.from_pretrained(splade_tiny.path)
    for max_length in (16, 64, 512):
        tokens = encoder.tokenize(TEXTS, max_length)
        expected = hf(TEXTS, truncation=True, max_length=max_length)["input_ids"]
        assert [tokens.ids[a:b].tolist() for a, b in zip(tokens.offsets[:-1], tokens.offsets[1:])] == expected
        order = np.array([3, 0, 2])
        assert tokens.gather(order).tolist() == [t for i in order for t in expected[i]]


def test_tokenizing_leaves_the_shared_tokenizer_as_it_was(splade_tiny):
    """The encoder tokenizes through the model's Rust tokenizer, setting its truncation and padding for the call: they
    are put back, so the tokenizer's other users see no change."""
    backend = splade_tiny.tokenizer
    shared = backend.truncation, backend.padding  # the model every test shares: left as found
    backend.enable_truncation(40, stride=3)
    backend.enable_padding(pad_id=0, pad_token="[PAD]", length=50)
    try:
        before = backend.truncation, backend.padding, [e.ids for e in backend.encode_batch(TEXTS)]
        tokens = SpladeEncoder(splade_tiny).tokenize(TEXTS, 16)
        assert tokens.lengths.max() == 16 and tokens.full_lengths.max() > 40  # its own settings, not the backend's
        assert (backend.truncation, backend.padding, [e.ids for e in backend.encode_batch(TEXTS)]) == before
    finally:
        _restore(backend, *shared)


def test_length_buckets_cover_each_position_once_within_budget(seed):
    lengths = np.random.default_rng(seed).integers(1, 300, size=257)
    buckets = length_buckets(lengths, max_tokens=1000)
    seen = np.concatenate(buckets)
    assert sorted(seen.tolist()) == list(range(257))
    for b in buckets:
        assert len(b) == 1 or len(b) * lengths[b].max() <= 1000


def _stream_vs_items(encoder, seed: int) -> None:
    """encode_stream over several items (one batch kept queued across their edges on CUDA) gives each item what
    encode_ids gives it alone, each bucket once, and each item's end marker after its buckets, in item order."""
    import random

    rng = random.Random(seed)
    items = [[f"cell {i} " * rng.randint(1, 60) for i in range(rng.randint(1, 40))] for _ in range(5)]
    tokens = [encoder.tokenize(texts, 64) for texts in items]
    seen, ended = {k: {} for k in range(len(items))}, []
    for key, positions, weights in encoder.encode_stream(enumerate(tokens)):
        assert key not in ended and all(k in ended for k in range(key))
        if positions is None:
            ended.append(key)
            continue
        for p, row in zip(positions.tolist(), weights.cpu()):
            assert p not in seen[key]
            seen[key][p] = row
    assert ended == list(range(len(items)))
    for key, toks in enumerate(tokens):
        alone = dict(pair for positions, w in encoder.encode_ids(toks)
                     for pair in zip(positions.tolist(), w.cpu()))
        assert sorted(seen[key]) == sorted(alone) == list(range(len(items[key])))
        assert all(torch.equal(seen[key][p], alone[p]) for p in alone)


def test_stream_of_items_matches_each_item_alone(splade_tiny, seed):
    _stream_vs_items(SpladeEncoder(splade_tiny, max_tokens=512), seed)


def test_cuda_memory_grows_in_segments_unless_the_user_chose(monkeypatch):
    """The GPU allocator's setting is the user's when given; otherwise segments grow, for the buckets' many shapes."""
    from lsr_index.encode.task import _expandable_cuda_memory

    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    _expandable_cuda_memory()
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")
    _expandable_cuda_memory()
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128"
