"""The split body run once on made-up documents at load: what the encoder must know before its first batch.

A masked LM split at its decoder (models.load_model) is a body transformers never runs as such. Most families give
each real token the same hidden state whatever fills the padding beside it. A few mix the padding in (a
convolution or a pooling over the sequence: ConvBERT, Funnel, FNet, YOSO), so their vectors would depend on which
documents share a batch: such a body gets batches of one length, where nothing is padded. Some bodies cannot run
without their decoder (MobileBERT's transform multiplies by the decoder's weight; BART's head adds a bias after
it), or not in a 16-bit dtype (DeBERTa's attention in bf16): refused here with the reason, not in the first batch.
"""

from __future__ import annotations

import numpy as np
import torch

from .errors import LsrIndexError

PROBE_LENGTH = 8  # tokens of the longer made-up document


def made_up_ids(n: int, body: torch.nn.Module) -> np.ndarray:
    """n token ids inside the body's embedding: past the first 1,000, where most vocabularies keep their special
    tokens, when it has 2,000 rows or more, else any (special ones included: a text may hold them too)."""
    rows = body.get_input_embeddings().weight.shape[0]  # not num_embeddings: I-BERT's quantized one lacks it
    return 1000 + np.arange(n, dtype=np.int64) % 1000 if rows >= 2000 else np.arange(n, dtype=np.int64) % rows


def padding_changes_tokens(body: torch.nn.Module, name: str, pad_id: int, width: int) -> bool:
    """Whether what fills a padded position changes the real tokens' hidden states.

    Two made-up documents, the second padded, go through the body twice: with the padding id at the padded
    positions, then with other ids there, masked the same. A body that masks its padding gives equal states (27
    families of transformers' masked LMs, tried on CPU in float32 and bf16); one that mixes the padding in does not
    (ConvBERT, Funnel, FNet and YOSO there). A body that fails to run, or gives states of another width than the
    decoder's input, is refused."""
    device = next(body.parameters()).device
    positions = getattr(body.config, "max_position_embeddings", None)
    n = max(2, min(PROBE_LENGTH, positions - 2 if positions else PROBE_LENGTH))  # RoBERTa's start at pad + 1
    other = torch.from_numpy(made_up_ids(2 * n, body)).view(2, n)
    mask = torch.ones(2, n, dtype=torch.long)
    mask[1, n // 2:] = 0
    padded = torch.where(mask.bool(), other, pad_id)
    dtype = next(body.parameters()).dtype
    try:
        with torch.inference_mode():
            states = [body(input_ids=ids.to(device), attention_mask=mask.to(device)).logits for ids in (padded, other)]
    except Exception as exc:  # whatever the family's code raises: the run cannot go on with this body
        hint = "; it may run in float32 (--dtype float32)" if dtype != torch.float32 else ""
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise LsrIndexError(f"model {name}: {type(body).__name__} does not run without its decoder in {dtype}: "
                            f"{type(exc).__name__}: {reason}{hint}") from exc
    if states[0].shape[-1] != width:
        raise LsrIndexError(f"model {name}: {type(body).__name__} gives states of width {states[0].shape[-1]} where "
                            f"its decoder takes {width}: its head does more than one linear layer can replace")
    real = mask.to(device).bool()
    a, b = states[0][real].float(), states[1][real].float()
    return bool((a - b).abs().max() > 1e-6 * a.abs().max())
