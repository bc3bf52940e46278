"""A model loaded split at its decoder: the body (masked LM without its decoder) gives hidden states, the head is the
decoder's (W, b), which sparton pools without [batch, seq, vocab] logits.

Weights are read as safetensors, or as pickled PyTorch state dicts through torch.load(weights_only=True) (never a
full unpickle: files.py); remote code is never run.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lsr_index.errors import LsrIndexError
from lsr_index.model.files import read_state_dict, settings
from lsr_index.model.ref import DEFAULT_MODEL, ModelRef, TokenizerRecord, first_line
from lsr_index.model.tokens import tokenizer_terms

if TYPE_CHECKING:
    import torch

@dataclass
class SpladeModel:
    """A masked-LM split at the decoder: the backbone+transform gives hidden states, the head is (W, b).

    Splitting here is what lets the fused head (or the chunked CPU head) replace the [B, L, V] logits.
    Row v of the head is term vocab[v]; a row no token maps to has bias -inf, so its weight is always 0.
    """

    name: str
    path: Path
    sha256: str  # the model's identity (ModelRef.sha256): weights, configs, tokenizer
    tokenizer: object  # its Rust tokenizer (ModelRef.backend)
    pad_id: int  # the id a padded batch fills its padding with
    body: torch.nn.Module  # input_ids, attention_mask -> [B, L, H] hidden states after the MLM transform
    weight: torch.Tensor  # [V, H] decoder weight
    bias: torch.Tensor  # [V] decoder bias, float32
    vocab: list[str]  # term id -> term string written to the index
    pooling: str = "max"  # sparton's pooling and activation (sentence-transformers' SpladePooling options)
    activation: str = "log1p_relu"
    packed: bool = False  # the body runs on packed documents (model.packed), not on padded batches
    unpadded: bool = False  # padding changes this body's real tokens: its batches hold documents of one length

    @property
    def vocab_size(self) -> int:
        return self.weight.shape[0]


def load_model(model: str | ModelRef = DEFAULT_MODEL, device: str = "cpu", dtype: torch.dtype | None = None,
               tokenizer: TokenizerRecord | None = None) -> SpladeModel:
    """A masked-LM directory (BERT, DistilBERT, RoBERTa, XLM-R, ModernBERT, any family transformers has a
    masked-LM class for) or a sentence-transformers SparseEncoder directory, split into body and head.
    `tokenizer`: the model's, if the caller has it already (ModelRef.backend)."""
    import torch

    from lsr_index.model import packed as packed_body
    from lsr_index.model.probe import padding_changes_tokens

    ref = ModelRef.resolve(model).here()
    path, layout, mlm_dir = ref.path, ref.layout, ref.mlm_dir
    tokenizer = tokenizer or ref.backend()
    mlm = _masked_lm(mlm_dir, dtype or torch.float32, device)
    decoder = mlm.get_output_embeddings()
    if not isinstance(decoder, torch.nn.Linear):
        raise LsrIndexError(f"model {mlm_dir}: the decoder of {type(mlm).__name__} is not a linear layer")
    weight = decoder.weight.detach()
    bias = decoder.bias.detach().float() if decoder.bias is not None else torch.zeros(weight.shape[0])
    _replace_module(mlm, decoder, torch.nn.Identity())
    mlm = mlm.to(device).eval().requires_grad_(False)
    packed = packed_body.packs(mlm, device, dtype or torch.float32)
    if packed:
        packed_body.pack(mlm)
    terms = ref.terms() if tokenizer is ref.backend() else tokenizer_terms(tokenizer.tokenizer)
    vocab, weight, bias = _align_vocab(mlm_dir, terms, weight, bias)
    model = SpladeModel(name=ref.name if ref.embedded else str(path), path=path, sha256=ref.sha256,
                        tokenizer=tokenizer.tokenizer, pad_id=tokenizer.pad_id, body=mlm, weight=weight.to(device),
                        vocab=vocab,
                        bias=bias.to(device=device, dtype=torch.float32),
                        pooling=layout.pooling if layout else "max",
                        activation=layout.activation if layout else "log1p_relu", packed=packed)
    if not packed:  # the packed families mask their padding by construction (model.packed)
        model.unpadded = padding_changes_tokens(mlm, str(mlm_dir), model.pad_id, model.weight.shape[1])
        if model.unpadded and mlm_dir not in _noted_unpadded:
            _noted_unpadded.add(mlm_dir)
            print(f"note: model {mlm_dir}: padding changes its tokens' states ({type(mlm).__name__}), so documents are "
                  "batched by length, one length a batch: the vectors stay each document's own, at some speed",
                  file=sys.stderr)
    return model


_noted_unpadded: set[Path] = set()


# transformers builds a model under process-wide settings (the default dtype, the meta device, patched torch
# functions): two builds at once in one process left weights on the meta device in 30 of 30 tries here
_BUILDING = threading.Lock()


def import_model_code(model: ModelRef) -> None:
    """Import what loading this model imports (torch, and transformers with its masked-LM class unless model.family
    runs it) without loading it: the workers forked afterwards start with it (encode.local.run_local_workers)."""
    from lsr_index.model import family

    if family.family_config(settings(model.mlm_dir / "config.json")) is None:
        _masked_lm_class(model.mlm_dir)


def _masked_lm_class(path: Path) -> tuple[object, type]:
    """The model's config and transformers' masked-LM class for it."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING

    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=False)
    except Exception as exc:  # a field of the wrong type fails huggingface_hub's validation, not with a ValueError
        raise LsrIndexError(f"model {path}: cannot read its config.json: {first_line(exc)}") from exc
    if type(config) not in MODEL_FOR_MASKED_LM_MAPPING:
        raise LsrIndexError(f"model {path}: transformers has no masked-LM class for model_type "
                            f"{config.model_type!r}: SPLADE needs a masked language model")
    return config, MODEL_FOR_MASKED_LM_MAPPING[type(config)]


def _masked_lm(path: Path, dtype: torch.dtype, device: str) -> torch.nn.Module:
    """The masked LM with the weights read here: the BERT family's by model.family (on `device` already), any other
    (or a checkpoint that does not fit it exactly) by transformers' own class for it (on the CPU)."""
    from lsr_index.model import family

    state = read_state_dict(path)
    if (own := family.load(settings(path / "config.json"), state, dtype, device)) is not None:
        return own
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    config, masked_lm = _masked_lm_class(path)
    try:
        with _BUILDING:
            mlm, info = masked_lm.from_pretrained(None, config=config, state_dict=state, output_loading_info=True,
                                                  dtype=dtype)
    except Exception as exc:  # a config the layers cannot be built from (an AssertionError in torch, too)
        if "ignore_mismatched_sizes" in str(exc):  # transformers' report of which, above, went to its log
            raise LsrIndexError(f"model {path}: weights whose shapes differ from config.json: the checkpoint is "
                                "another configuration's") from exc
        raise LsrIndexError(f"model {path}: cannot load it as a masked-LM: {type(exc).__name__}: "
                            f"{first_line(exc)}") from exc
    # a name the checkpoint lacks is filled only where it is another name of a tensor that was read (a decoder tied to
    # the embeddings, BERT's bias under two names); else its layer is initialised: an untied decoder, a head's bias
    params = dict(mlm.named_parameters(remove_duplicate=False))
    absent = set(info["missing_keys"])
    read = {id(p) for name, p in params.items() if name not in absent}
    missing = sorted(k for k in absent if k not in params or id(params[k]) not in read)
    if missing:  # randomly initialised layers would silently give a different model
        raise LsrIndexError(f"model {path}: weights missing from the checkpoint: {', '.join(missing[:5])}")
    if info["mismatched_keys"]:
        raise LsrIndexError(f"model {path}: weights whose shapes differ from config.json: "
                            f"{', '.join(sorted(str(k) for k in info['mismatched_keys'])[:5])}")
    return mlm


def _align_vocab(path: Path, terms: tuple[list[str], list[int]], weight: torch.Tensor, bias: torch.Tensor
                 ) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """Match decoder rows to tokenizer terms. Rows past the last token id (a decoder padded to a round size, as
    ModernBERT's 50,368 for 50,280 tokens) are dropped; rows no token maps to inside that range keep a
    placeholder term and a -inf bias, so they always weigh 0 and are never written. A token id past the decoder
    means tokenizer and weights do not belong together: refused."""
    vocab, holes = terms
    rows = len(vocab)
    if rows > weight.shape[0]:
        raise LsrIndexError(f"model {path}: the tokenizer has token {vocab[-1]!r} with id {rows - 1}, but the decoder "
                            f"has only {weight.shape[0]} rows: tokenizer and weights are from different models")
    weight, bias = weight[:rows], bias[:rows].clone()
    bias[holes] = float("-inf")
    return vocab, weight, bias


def _replace_module(root: torch.nn.Module, old: torch.nn.Module, new: torch.nn.Module) -> None:
    for parent in root.modules():
        for child_name, child in parent.named_children():
            if child is old:
                setattr(parent, child_name, new)
                return
    raise LsrIndexError(f"cannot locate the decoder of {type(root).__name__}")
