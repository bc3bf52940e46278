"""Texts → SPLADE weights: tokenize, bucket by length under a token budget, run the body (on packed documents where
the family allows it: model.packed), pool with the head.

The head is `sparton.splade_max_packed`: the fused Triton kernel on CUDA, a vocabulary-chunked PyTorch
path on CPU. Only real tokens are packed into it, so padding costs nothing in the LM head (the
bottleneck: on splade-tiny the head is ~30× the transformer layers' FLOPs).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TypeVar

import numpy as np
import torch

import sparton
from lsr_index.model import packed as packed_body
from lsr_index.model.load import SpladeModel
from lsr_index.model.probe import made_up_ids
from lsr_index.model.tokens import TextTokenizer, Tokens

T = TypeVar("T")
K = TypeVar("K")

WARM_UP_SIZES = (512,)  # tokens per warm-up batch (SpladeEncoder.warm_up)


def _identity(weights: torch.Tensor) -> torch.Tensor:
    return weights


def made_up_tokens(size: int, max_length: int, body: torch.nn.Module) -> Tokens:
    """`size` tokens in documents of up to 128 tokens, no longer than max_length or the body's positions allow (the
    last one shorter), with probe.made_up_ids."""
    if size < 1:
        raise ValueError(f"a warm-up batch needs at least one token, not {size}")
    positions = getattr(body.config, "max_position_embeddings", None)
    length = min(128, max_length, positions - 2 if positions else 128)  # RoBERTa's positions start at pad + 1
    lengths = np.full(-(-size // length), length, np.int64)
    lengths[-1] = size - length * (len(lengths) - 1)
    return Tokens(made_up_ids(size, body), np.concatenate([[0], np.cumsum(lengths)]), lengths)


def length_buckets(lengths: np.ndarray, max_tokens: int, one_length: bool = False) -> list[np.ndarray]:
    """Split positions, longest first, into batches whose padded size (rows × longest) fits max_tokens; with
    `one_length`, each batch's documents also share one length (nothing padded: SpladeModel.unpadded)."""
    order = np.argsort(-lengths, kind="stable")
    batches, start = [], 0
    while start < len(order):
        longest = int(lengths[order[start]])
        rows = max(1, max_tokens // max(longest, 1))
        if one_length:  # sorted longest first: the run of this length ends where a shorter one begins
            rows = min(rows, int(np.searchsorted(-lengths[order[start:]], -longest, side="right")))
        batches.append(order[start:start + rows])
        start += rows
    return batches


class _Staging:
    """Two page-locked host buffers, used in turn: each batch's arrays are packed into one and copied in one piece.
    A buffer is refilled only once its last copy has finished (two batches later, long done)."""

    ALIGN = 16  # bytes: every array starts aligned for its dtype in the packed buffer

    def __init__(self):
        self.buffers: list[torch.Tensor | None] = [None, None]
        self.copied: list[torch.cuda.Event | None] = [None, None]
        self.turn = 0

    def upload(self, arrays: Sequence[np.ndarray], device: torch.device) -> list[torch.Tensor]:
        starts, size = [], 0
        for a in arrays:
            starts.append(size)
            size += -(-a.nbytes // self.ALIGN) * self.ALIGN
        k, self.turn = self.turn, 1 - self.turn
        if self.copied[k] is not None:
            self.copied[k].synchronize()
        if self.buffers[k] is None or self.buffers[k].numel() < size:
            self.buffers[k] = torch.empty(max(size, 1 << 21), dtype=torch.uint8, pin_memory=True)
        host = self.buffers[k].numpy()
        for a, start in zip(arrays, starts):
            host[start:start + a.nbytes] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
        packed = self.buffers[k][:size].to(device, non_blocking=True)
        self.copied[k] = torch.cuda.Event()
        self.copied[k].record(torch.cuda.current_stream(device))
        return [packed[start:start + a.nbytes].view(torch.from_numpy(a[:0]).dtype).view(a.shape)
                for a, start in zip(arrays, starts)]


class SpladeEncoder:
    def __init__(self, model: SpladeModel, max_tokens: int = 16384, backend: str = "auto",
                 tokenizer: TextTokenizer | None = None):
        self.model = model
        self.max_tokens = max_tokens
        self.backend = backend
        self.device = model.weight.device
        self.tokenizer = tokenizer or TextTokenizer(model.tokenizer)
        self.n_tokens = 0  # real (unpadded) tokens encoded so far, for throughput reports
        self.n_docs = 0  # texts encoded so far
        self._side: torch.cuda.Stream | None = None  # where post-processing runs on CUDA
        self._staging: _Staging | None = None  # page-locked buffers for the inputs' copies to the GPU

    def tokenize(self, texts: Sequence[str], max_length: int) -> Tokens:
        return self.tokenizer.tokenize(texts, max_length)

    def token_counts(self, texts: Sequence[str], max_length: int) -> np.ndarray:
        return self.tokenizer.token_counts(texts, max_length)

    def encode_ids(self, tokens: Tokens, then: Callable[[torch.Tensor], T] = _identity
                   ) -> Iterator[tuple[np.ndarray, T]]:
        """Yield (positions of texts, then(float32 weights [len(positions), V] on the model's device))."""
        for _, positions, part in self.encode_stream([(None, tokens)], then):
            if positions is not None:
                yield positions, part

    @torch.inference_mode()
    def encode_stream(self, items: Iterable[tuple[K, Tokens]], then: Callable[[torch.Tensor], T] = _identity
                      ) -> Iterator[tuple[K, np.ndarray | None, T | None]]:
        """For each (key, tokens) item in order, yield (key, positions, then(weights)) per length bucket, then
        (key, None, None) once the item is complete.

        On CUDA, `then` (e.g. quantization, which must wait for the GPU to learn how many nonzeros there are)
        runs one batch behind, on a side stream: while the host waits for batch i's weights and post-processes
        them, batch i+1's forward is already queued, so the GPU does not idle between batches, nor between items
        (the next item's first batch is queued before the last one of this item is waited for).
        """
        pending: tuple | None = None  # (key, positions, weights, done event, last batch of its item)
        items = iter(items)
        while True:
            try:
                key, tokens = next(items)
            except StopIteration:
                break
            except BaseException:  # the input failed or was interrupted: the finished batch is handed over first
                if pending is not None:
                    yield from self._finish(*pending, then)
                raise
            buckets = length_buckets(tokens.lengths, self.max_tokens, one_length=self.model.unpadded)
            for i, positions in enumerate(buckets):
                weights = self._forward(tokens, positions)
                last = i == len(buckets) - 1
                if self.device.type != "cuda":
                    yield key, positions, then(weights)
                    continue
                done = torch.cuda.Event()
                done.record(torch.cuda.current_stream(self.device))  # the model's GPU, not the thread's current one
                if pending is not None:
                    yield from self._finish(*pending, then)
                pending = (key, positions, weights, done, last)
            if self.device.type != "cuda" or not buckets:
                if pending is not None:  # an earlier item's last batch: it ends before this one
                    yield from self._finish(*pending, then)
                    pending = None
                yield key, None, None
        if pending is not None:
            yield from self._finish(*pending, then)

    def warm_up(self, max_length: int, then: Callable[[torch.Tensor], object] = _identity,
                sizes: Sequence[int] = WARM_UP_SIZES) -> None:
        """On CUDA, run made-up batches (`sizes` tokens each) through the body, the head and `then` once, so that a new
        process pays its first calls here, in the model load's thread, and not inside its first batches: Triton's
        first launch of the head, each CUDA kernel's lazy load, cuBLAS's set-up, PyTorch's stream pool. A new
        process's first pass then runs at the warm rate. It lengthens the start-up by about what the first pass saves,
        so end to end it pays where first calls cost most (a 250k vocabulary's head) and is even elsewhere
        (docs/performance/encode.md, "A new process's first pass")."""
        if self.device.type != "cuda":
            return
        counts = self.n_docs, self.n_tokens
        for size in sizes:
            for _ in self.encode_stream([(None, made_up_tokens(size, max_length, self.model.body))], then):
                pass
        torch.cuda.synchronize(self.device)
        self.n_docs, self.n_tokens = counts

    def _finish(self, key: K, positions: np.ndarray, weights: torch.Tensor, done: torch.cuda.Event, last: bool,
                then: Callable[[torch.Tensor], T]) -> Iterator[tuple[K, np.ndarray | None, T | None]]:
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)
        with torch.cuda.stream(self._side):
            self._side.wait_event(done)
            weights.record_stream(self._side)  # allocated on the main stream, last used here
            part = then(weights)
        yield key, positions, part
        if last:
            yield key, None, None

    def _attention(self) -> AbstractContextManager:
        """Attention without cuDNN's kernel on CUDA. Each length bucket is a new (batch, length) shape, and cuDNN
        builds an execution plan for every shape it has not seen (tens to hundreds of milliseconds a plan with this
        same transformers SDPA call: modelscope/FunASR#3704, flashinfer-ai/flashinfer#5245), so a first pass over
        new shapes runs far slower than a second, while warm the memory-efficient kernel runs the body as fast as
        cuDNN's (docs/performance/encode.md, "One batch"). Its end-to-end gain has not been measured."""
        if self.device.type != "cuda":
            return nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])

    def _forward(self, tokens: Tokens, positions: np.ndarray) -> torch.Tensor:
        """One length bucket through the body and the head (queued, not waited for, on CUDA)."""
        seq_lens = tokens.lengths[positions]
        longest = int(seq_lens[0])
        if self.model.packed:
            input_ids, position_ids, cu_seqlens = self._upload(packed_body.inputs(tokens, positions, self.model.body))
            real = packed_body.forward(self.model.body, input_ids, position_ids, cu_seqlens, longest)
        else:
            real, cu_seqlens = self._padded_body(tokens, positions, seq_lens, longest)
        weights = sparton.splade_max_packed(real, self.model.weight, self.model.bias, cu_seqlens, max_seqlen=longest,
                                            backend=self.backend, pooling=self.model.pooling,
                                            activation=self.model.activation)
        self.n_tokens += int(seq_lens.sum())
        self.n_docs += len(positions)
        return weights

    def _padded_body(self, tokens: Tokens, positions: np.ndarray, seq_lens: np.ndarray, longest: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """Hidden states of the real tokens [tokens, H], packed after a padded forward, and the cumulative lengths."""
        mask = np.arange(longest) < seq_lens[:, None]
        input_ids = np.full((len(positions), longest), self.model.pad_id, np.int64)
        input_ids[mask] = tokens.gather(positions)
        # the packed rows of the real tokens, computed on the host: no device sync to find them
        packed = np.flatnonzero(mask.ravel())
        cu_seqlens = np.zeros(len(positions) + 1, np.int32)
        np.cumsum(seq_lens, out=cu_seqlens[1:])
        input_ids, mask, packed, cu_seqlens = self._upload((input_ids, mask, packed, cu_seqlens))
        with self._attention():
            hidden = self.model.body(input_ids=input_ids, attention_mask=mask.long()).logits
        return hidden.reshape(-1, hidden.shape[-1]).index_select(0, packed), cu_seqlens

    def _upload(self, arrays: Sequence[np.ndarray]) -> list[torch.Tensor]:
        """The batch's input arrays on the model's device. On CUDA in one asynchronous copy through page-locked host
        memory, so the copy does not wait for the GPU to finish the last batch (transformers' attention-mask check
        still does, once a forward: docs/performance/encode.md, "Changes rejected"). A copy from pageable memory
        waits for the stream (PyTorch syncs after it, and with non_blocking the driver still does: sampled, that copy
        was the main thread's most frequent stack), and pinning each batch's arrays anew costs more than it saves
        (page-locking is slow, and the main thread would pay it for four arrays a batch)."""
        if self.device.type != "cuda":
            return [torch.from_numpy(a) for a in arrays]
        if self._staging is None:
            self._staging = _Staging()
        return self._staging.upload(arrays, self.device)

    def encode(self, texts: Sequence[str], max_length: int) -> torch.Tensor:
        """Dense [n, V] float32 weights in input order; for small inputs (queries, tests)."""
        out = torch.zeros(len(texts), self.model.vocab_size, device=self.device)
        for positions, weights in self.encode_ids(self.tokenize(texts, max_length)):
            out[torch.from_numpy(positions).to(self.device)] = weights
        return out
