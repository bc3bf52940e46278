"""Texts → SPLADE weights: tokenize, bucket by length under a token budget, run the body, pool with the head.

The head is `sparton.splade_max_packed`: the fused Triton kernel on CUDA, a vocabulary-chunked PyTorch
path on CPU. Only real tokens are packed into it, so padding costs nothing in the LM head (the
bottleneck: on splade-tiny the head is ~30× the transformer layers' FLOPs).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch

import sparton

from .models import SpladeModel


def length_buckets(lengths: np.ndarray, max_tokens: int) -> list[np.ndarray]:
    """Split positions, longest first, into batches whose padded size (rows × longest) fits max_tokens."""
    order = np.argsort(-lengths, kind="stable")
    batches, start = [], 0
    while start < len(order):
        longest = int(lengths[order[start]])
        rows = max(1, max_tokens // max(longest, 1))
        batches.append(order[start:start + rows])
        start += rows
    return batches


class SpladeEncoder:
    def __init__(self, model: SpladeModel, max_tokens: int = 16384, backend: str = "auto"):
        self.model = model
        self.max_tokens = max_tokens
        self.backend = backend
        self.device = model.weight.device
        self.n_tokens = 0  # real (unpadded) tokens encoded so far, for throughput reports

    def tokenize(self, texts: Sequence[str], max_length: int) -> list[list[int]]:
        return self.model.tokenizer(list(texts), truncation=True, max_length=max_length,
                                    add_special_tokens=True, return_attention_mask=False,
                                    return_token_type_ids=False)["input_ids"]

    @torch.inference_mode()
    def encode_ids(self, ids: list[list[int]]) -> Iterator[tuple[np.ndarray, torch.Tensor]]:
        """Yield (positions in `ids`, float32 weights [len(positions), V] on the model's device)."""
        lengths = np.fromiter((len(x) for x in ids), np.int64, len(ids))
        pad = self.model.tokenizer.pad_token_id or 0
        cuda = self.device.type == "cuda"
        for positions in length_buckets(lengths, self.max_tokens):
            seq_lens = lengths[positions]
            longest = int(seq_lens[0])
            mask = np.arange(longest) < seq_lens[:, None]
            input_ids = np.full((len(positions), longest), pad, np.int64)
            input_ids[mask] = np.concatenate([ids[p] for p in positions])
            # the packed rows of the real tokens, computed on the host: no device sync to find them
            packed = np.flatnonzero(mask.ravel())
            cu_seqlens = np.zeros(len(positions) + 1, np.int32)
            np.cumsum(seq_lens, out=cu_seqlens[1:])
            host = [torch.from_numpy(a) for a in (input_ids, mask, packed, cu_seqlens)]
            if cuda:
                host = [t.pin_memory() for t in host]
            input_ids, mask, packed, cu_seqlens = (t.to(self.device, non_blocking=True) for t in host)
            hidden = self.model.body(input_ids=input_ids, attention_mask=mask.long()).logits
            tokens = hidden.reshape(-1, hidden.shape[-1]).index_select(0, packed)
            weights = sparton.splade_max_packed(tokens, self.model.weight, self.model.bias, cu_seqlens,
                                                max_seqlen=longest, backend=self.backend)
            self.n_tokens += int(seq_lens.sum())
            yield positions, weights

    def encode(self, texts: Sequence[str], max_length: int) -> torch.Tensor:
        """Dense [n, V] float32 weights in input order; for small inputs (queries, tests)."""
        out = torch.zeros(len(texts), self.model.vocab_size, device=self.device)
        for positions, weights in self.encode_ids(self.tokenize(texts, max_length)):
            out[torch.from_numpy(positions).to(self.device)] = weights
        return out
