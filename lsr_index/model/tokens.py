"""Texts → token ids, flat in NumPy arrays, through a model's Rust tokenizer: no torch here, so that a process that
only reads and tokenizes (beside a GPU: encode.feed) starts in a fraction of a second."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np


@dataclass
class Tokens:
    """Token ids of n texts, flat: text i is ids[offsets[i]:offsets[i+1]]. No per-token Python objects."""

    ids: np.ndarray  # int64 [total tokens]
    offsets: np.ndarray  # int64 [n + 1]
    full_lengths: np.ndarray  # int64 [n]: each text's length before truncation, special tokens included

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def gather(self, positions: np.ndarray) -> np.ndarray:
        """The ids of texts `positions`, concatenated in that order."""
        lengths = self.lengths[positions]
        starts = np.repeat(self.offsets[positions] - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
        return self.ids[starts + np.arange(lengths.sum())]


class TextTokenizer:
    """Texts → Tokens through a model's Rust tokenizer, truncating at a given length."""

    # The Rust tokenizer is transformers', shared by every user of the model's tokenizer object in this process:
    # a call sets its truncation and padding and restores them after, as transformers' own calls do, under this lock.
    # (A private copy, made through the tokenizer's JSON, holds the GIL for a noticeable fraction of a second at a
    # 250k vocabulary, while the model loads in another thread: docs/performance/encode.md, "Changes kept".)
    _lock = threading.Lock()

    def __init__(self, tokenizer: object):
        # the model's transformers tokenizer, or its Rust tokenizer itself (a process that does not import transformers)
        self.backend = getattr(tokenizer, "backend_tokenizer", tokenizer)

    def tokenize(self, texts: Sequence[str], max_length: int) -> Tokens:
        """Through the Rust tokenizer directly: it runs on every core without the GIL and skips the
        per-text Python objects of the transformers wrapper (a gain that grows with the cores)."""
        backend = self.backend
        encode = getattr(backend, "encode_batch_fast", backend.encode_batch)  # _fast: no offsets (tokenizers ≥ 0.20)
        with self._lock:
            truncation, padding = backend.truncation, backend.padding
            backend.enable_truncation(max_length)
            backend.no_padding()
            try:
                encodings = encode(list(texts), add_special_tokens=True)
                special = backend.num_special_tokens_to_add(False)
            finally:
                _restore(backend, truncation, padding)
        # Python work under the GIL that the model's driver thread waits for: building the id lists costs microseconds
        # a text, so it is kept to one pass over C iterators (a generator over every id costs as much again)
        lists = [e.ids for e in encodings]
        lengths = np.fromiter(map(len, lists), np.int64, len(lists))
        offsets = np.zeros(len(lists) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        ids = np.fromiter(chain.from_iterable(lists), np.int64, int(offsets[-1]))
        # the tokenizer reads a whole text before truncating it and keeps the rest as overflow pieces (stride 0),
        # each with its own special tokens: the untruncated length comes free, with no second tokenization
        full = lengths.copy()
        for i in np.flatnonzero(lengths >= max_length):
            full[i] += sum(len(o) - special for o in encodings[i].overflowing)
        return Tokens(ids, offsets, full)

    def token_counts(self, texts: Sequence[str], max_length: int) -> np.ndarray:
        """Each text's length in tokens before truncation at `max_length` (special tokens included)."""
        return self.tokenize(texts, max_length).full_lengths


def _restore(backend: object, truncation: dict | None, padding: dict | None) -> None:
    """Put back a Rust tokenizer's truncation and padding settings as read from it."""
    if truncation is None:
        backend.no_truncation()
    else:
        backend.enable_truncation(**truncation)
    if padding is None:
        backend.no_padding()
    else:
        backend.enable_padding(**{k: v for k, v in padding.items() if k != "pad_to_multiple_of" or v is not None})


def tokenizer_terms(tokenizer) -> tuple[list[str], list[int]]:
    """Term of each token id up to the largest, and the ids no term maps to (given a placeholder term, as the
    index's vocabulary has no empty term)."""
    ids = tokenizer.get_vocab()
    vocab: list[str | None] = [None] * (max(ids.values()) + 1)
    for term, idx in ids.items():
        vocab[idx] = term
    holes = [i for i, term in enumerate(vocab) if term is None]
    return [term if term is not None else f"[lsr-index:no-token-{i}]" for i, term in enumerate(vocab)], holes
