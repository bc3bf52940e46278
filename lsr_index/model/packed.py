"""The transformer body on packed documents: a batch's real tokens as one sequence, attention kept inside each
document by variable-length flash attention (`torch.nn.attention.varlen`).

Why: a padded batch computes every layer on its padding too (a few percent of the tokens even with each 8,192-document
piece sorted by length: docs/performance/encode.md, "GPU idle time end to end"), and transformers checks a padded
batch's attention mask on the host, which waits for the GPU once a forward. Packed, the body does only the real tokens'
work, and the head already takes them packed (`sparton.splade_max_packed`).

Families are admitted by name, each checked against its padded body (tests/test_models_families.py): their layers
mix tokens only in attention, which goes through transformers' attention interface, and they take position ids.
"""

from __future__ import annotations

import importlib.util
import itertools

import numpy as np
import torch
import torch.nn.functional as F

from lsr_index.model.tokens import Tokens

PACKED_FAMILIES = frozenset({"bert", "distilbert", "roberta", "xlm-roberta"})
_POSITIONS_AFTER_PADDING = frozenset({"roberta", "xlm-roberta"})  # their positions start at padding_idx + 1
_NAME = "lsr_index_packed"  # this module's entry in transformers' attention interface


def packs(mlm: torch.nn.Module, device: str | torch.device, dtype: torch.dtype) -> bool:
    """Whether `mlm` on `device` in `dtype` runs packed: a family above as an encoder (a decoder's causal attention
    is not what the packed attention computes), whose transformers class takes custom attention (from transformers
    5; 4.x's BERT does not), on CUDA in 16-bit with heads flash attention takes (sizes a multiple of 8, up to 256),
    and a PyTorch that has variable-length attention."""
    config = mlm.config
    if torch.device(device).type != "cuda" or dtype not in (torch.float16, torch.bfloat16):
        return False
    if config.model_type not in PACKED_FAMILIES or getattr(config, "is_decoder", False):
        return False
    if not getattr(type(mlm), "_supports_attention_backend", False):
        return False
    heads = getattr(config, "num_attention_heads", None) or config.n_heads  # DistilBERT's name
    width = getattr(config, "hidden_size", None) or config.dim
    if width % heads or (width // heads) % 8 or width // heads > 256:
        return False
    # looked up, not imported: importing it imports torch._dynamo (from torch 2.13; at its first call before), seconds
    # of a new process's start-up
    return importlib.util.find_spec("torch.nn.attention.varlen") is not None


def pack(mlm: torch.nn.Module) -> None:
    """Route `mlm`'s attention through the packed attention; from then on call it only through `forward`."""
    from lsr_index.model.family import FamilyMaskedLM

    if isinstance(mlm, FamilyMaskedLM):  # its own attention takes the documents' bounds
        mlm.packed = True
        return
    from transformers import AttentionInterface

    AttentionInterface.register(_NAME, _packed_attention)
    mlm.set_attn_implementation(_NAME)


def inputs(tokens: Tokens, positions: np.ndarray, mlm: torch.nn.Module) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(token ids, position ids, cumulative lengths) of texts `positions`, packed in that order. Position ids are
    what the family computes for a padded row: 0, 1, ... for BERT's kind; for RoBERTa's, padding_idx + 1, ... counting
    only tokens that are not the padding id, which keep padding_idx (a text may hold a literal "<pad>")."""
    lengths = tokens.lengths[positions]
    cu_seqlens = np.zeros(len(positions) + 1, np.int32)
    np.cumsum(lengths, out=cu_seqlens[1:])
    ids = tokens.gather(positions).astype(np.int64)
    starts = np.repeat(cu_seqlens[:-1].astype(np.int64), lengths)
    if mlm.config.model_type not in _POSITIONS_AFTER_PADDING:
        return ids, np.arange(len(ids), dtype=np.int64) - starts, cu_seqlens
    pad = mlm.config.pad_token_id
    counted = ids != pad
    before = np.concatenate([[0], np.cumsum(counted)])  # counted tokens before each packed token
    position_ids = np.where(counted, before[1:] - before[starts] + pad, pad)
    return ids, position_ids, cu_seqlens


def forward(mlm: torch.nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor, cu_seqlens: torch.Tensor,
            longest: int) -> torch.Tensor:
    """Hidden states [tokens, H] of the packed documents (`inputs`, on the model's device)."""
    extra = {"token_type_ids": torch.zeros_like(input_ids[None])} if getattr(mlm.config, "type_vocab_size", 0) else {}
    return mlm(input_ids=input_ids[None], position_ids=position_ids[None], cu_seq_lens_q=cu_seqlens,
               cu_seq_lens_k=cu_seqlens, max_length_q=longest, max_length_k=longest, **extra).logits[0]


def _packed_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                      **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention interface on one packed sequence: [1, heads, T, d] in, [1, T, heads, d] out."""
    cu_seqlens = kwargs.get("cu_seq_lens_q")
    if cu_seqlens is None:
        raise RuntimeError("a packed model was called without its documents' bounds: use packed.forward")
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [T, heads, d]: the projections' own layout
    return attend(q, k, v, cu_seqlens, kwargs.get("max_length_q"), scaling)[None], None


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, longest: int | None,
           scale: float | None) -> torch.Tensor:
    """Attention inside each packed document: [T, heads, d] in and out."""
    if q.is_cuda:
        # the flash kernel `torch.nn.attention.varlen.varlen_attn` runs, called as it calls it, without its module
        # and custom-op wrapper, which import torch._dynamo and SymPy: seconds of a new process's start-up
        return torch.ops.aten._flash_attention_forward(q, k, v, cu_seqlens, cu_seqlens, longest, longest, 0.0, False,
                                                       False, scale=scale)[0]
    out = torch.empty_like(q)  # document by document: where flash attention is not (the tests' CPU check)
    bounds = cu_seqlens.tolist()
    for lo, hi in itertools.pairwise(bounds):
        out[lo:hi] = F.scaled_dot_product_attention(*(t[lo:hi].transpose(0, 1) for t in (q, k, v)),
                                                    scale=scale).transpose(0, 1)
    return out
