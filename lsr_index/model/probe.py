"""The split body run once on made-up documents at load: what the encoder must know before its first batch.

A masked LM split at its decoder (load.load_model) is a body transformers never runs as such. Most families give
each real token the same hidden state whatever fills the padding beside it and however long it is. A few mix the
padding in (a convolution or a pooling over the sequence: ConvBERT, Funnel, FNet, YOSO) or count it (Reformer's
chunks, positions counted from the end), so their vectors would depend on which documents share a batch: such a
body gets batches of one length, where nothing is padded. Some bodies cannot run without their decoder (MobileBERT's
transform multiplies by the decoder's weight; BART's head adds a bias after it), or not in a 16-bit dtype (DeBERTa's
attention in bf16): refused here with the reason, not in the first batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch

from lsr_index.errors import LsrIndexError

PROBE_LENGTH = 8  # tokens of the longer made-up document


def made_up_ids(n: int, body: torch.nn.Module) -> np.ndarray:
    """n token ids inside the body's embedding: past the first 1,000, where most vocabularies keep their special
    tokens, when it has 2,000 rows or more, else any (special ones included: a text may hold them too)."""
    rows = body.get_input_embeddings().weight.shape[0]  # not num_embeddings: I-BERT's quantized one lacks it
    return 1000 + np.arange(n, dtype=np.int64) % 1000 if rows >= 2000 else np.arange(n, dtype=np.int64) % rows


def padding_changes_tokens(body: torch.nn.Module, name: str, pad_id: int, width: int) -> bool:
    """Whether the padding beside a document, what fills it or how much of it there is, changes the real tokens'
    hidden states.

    Two made-up documents, the second padded, go through the body with the padding id at the padded positions; then
    again, masked the same, with other ids there and more padding after both (twice the width). A body that masks
    its padding gives equal states (27 families of transformers' masked LMs, tried on CPU in float32 and bf16); one
    that mixes the padding in does not (ConvBERT, Funnel, FNet and YOSO there), nor one that counts the padding
    (Reformer with chunks shorter than the probe). The second run's other width changes the rounding (by up to 1e-5
    of the states in float32 here, 1e-1 in bf16), so a 16-bit body is compared at one width in its dtype and across
    widths upcast to float32 for that run. A body that fails to run, or gives states of another width than the
    decoder's input, is refused."""
    device = next(body.parameters()).device
    positions = getattr(body.config, "max_position_embeddings", None)
    room = positions - 2 if positions else 2 * PROBE_LENGTH  # RoBERTa's start at pad + 1
    n = max(2, min(PROBE_LENGTH, room))
    wide = max(n, min(2 * n, room))
    other = torch.from_numpy(made_up_ids(2 * wide, body)).view(2, wide)
    mask = torch.zeros(2, wide, dtype=torch.long)
    mask[0, :n] = 1
    mask[1, :n // 2] = 1
    padded = torch.where(mask.bool(), other, pad_id)[:, :n]
    dtype = next(body.parameters()).dtype

    def states(ids: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            hidden = body(input_ids=ids.to(device), attention_mask=mask[:, :ids.shape[1]].to(device)).logits
        if hidden.shape[-1] != width:
            raise LsrIndexError(f"model {name}: {type(body).__name__} gives states of width {hidden.shape[-1]} where "
                                f"its decoder takes {width}: its head does more than one linear layer can replace")
        return hidden[:, :n][mask[:, :n].to(device).bool()].float()

    try:
        if dtype == torch.float32:
            return _differ(states(padded), states(other), 1e-4)
        if _differ(states(padded), states(other[:, :n]), 1e-6):
            return True
        with _in_float32(body):
            return _differ(states(padded), states(other), 1e-4)
    except LsrIndexError:
        raise
    except Exception as exc:  # whatever the family's code raises: the run cannot go on with this body
        hint = "; it may run in float32 (--dtype float32)" if dtype != torch.float32 else ""
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise LsrIndexError(f"model {name}: {type(body).__name__} does not run without its decoder in {dtype}: "
                            f"{type(exc).__name__}: {reason}{hint}") from exc


def _differ(a: torch.Tensor, b: torch.Tensor, tolerance: float) -> bool:
    return bool((a - b).abs().max() > tolerance * a.abs().max())


@contextlib.contextmanager
def _in_float32(body: torch.nn.Module) -> Iterator[None]:
    """The body's floating tensors in float32 for a while, then their own storage again: the same values, and a
    weight shared with the head (a decoder tied to the embeddings) still shared, not copied."""
    tensors = [t for t in (*body.parameters(), *body.buffers()) if t.is_floating_point() and t.dtype != torch.float32]
    kept = [t.data for t in tensors]
    try:
        for t in tensors:
            t.data = t.data.float()
        yield
    finally:
        for t, data in zip(tensors, kept, strict=True):
            t.data = data
