"""Bodies transformers never runs split at the decoder: those that mix padding into real tokens' states still give
each document its own vectors (batches of one length), and those that cannot run split are refused at load.

Each family is a tiny random model saved as a user's is (save_pretrained, a tokenizer built here). The reference is
transformers' own full forward on each document alone, so padding cannot enter it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_models import TEXTS, reference_weights, tokenizer_for
from transformers import AutoConfig, AutoModelForMaskedLM, BertConfig, BertForMaskedLM

from lsr_index.errors import LsrIndexError
from lsr_index.model.encoder import SpladeEncoder, length_buckets
from lsr_index.model.load import load_model

SIZES = {"vocab_size": None, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
         "intermediate_size": 48, "max_position_embeddings": 66}
FAMILIES = {  # the sizes each family takes beyond SIZES (Funnel names its own)
    "bert": {}, "electra": {"embedding_size": 16}, "convbert": {"embedding_size": 32},
    "funnel": {"d_model": 32, "n_head": 2, "d_head": 16, "d_inner": 48, "block_sizes": [1, 1],
               "max_position_embeddings": 66},
    "fnet": {}, "yoso": {}, "mobilebert": {"embedding_size": 16, "intra_bottleneck_size": 32},
    "nystromformer": {"num_landmarks": 4, "segment_means_seq_len": 8}, "deberta": {},
    "bart": {"d_model": 32, "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 2,
             "decoder_attention_heads": 2, "encoder_ffn_dim": 48, "decoder_ffn_dim": 48},
    "reformer": {"attention_head_size": 16, "attn_layers": ["local", "lsh"], "is_decoder": False,
                 "axial_pos_shape": [8, 8], "axial_pos_embds_dim": [16, 16], "max_position_embeddings": 64,
                 "feed_forward_size": 48, "local_attn_chunk_length": 4, "lsh_attn_chunk_length": 4,
                 "num_buckets": 4, "hash_seed": 0},  # chunks shorter than the probe's documents
}


def save_family(kind: str, root):
    tokenizer = tokenizer_for("bert")
    torch.manual_seed(0)
    sizes = {} if kind == "funnel" else SIZES
    config = AutoConfig.for_model(kind, **{**sizes, "vocab_size": len(tokenizer), **FAMILIES[kind]})
    mlm = AutoModelForMaskedLM.from_config(config).eval()
    with torch.no_grad():
        for p in mlm.parameters():  # biases and norms random too
            p.copy_(torch.randn_like(p) * (0.5 if p.dim() == 1 else 0.2))
    mlm.save_pretrained(root / kind)
    tokenizer.save_pretrained(root / kind)
    return root / kind, mlm, tokenizer


MIXED_LENGTHS = [*TEXTS, "protein binds " * 5, "cancer risk", "a gene of the older adults in a trial"]


def assert_batched_by_length(model, mlm, tokenizer, err: str) -> None:
    """The model is recognised as needing batches of one length, says so, and gives each document its own vectors."""
    assert model.unpadded
    assert "padding changes its tokens' states" in err
    got = SpladeEncoder(model, max_tokens=64, backend="torch").encode(MIXED_LENGTHS, max_length=24)
    alone = torch.cat([reference_weights(mlm, tokenizer, [t], 24) for t in MIXED_LENGTHS])
    torch.testing.assert_close(got.double(), alone, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["convbert", "funnel", "fnet", "yoso"])
def test_a_body_that_mixes_padding_in_gives_each_document_its_own_vectors(kind, tmp_path, capsys):
    """Batched with padding, these families' vectors differed from the document's own by up to 0.12."""
    path, mlm, tokenizer = save_family(kind, tmp_path)
    model = load_model(str(path))
    assert_batched_by_length(model, mlm, tokenizer, capsys.readouterr().err)


def test_a_body_that_counts_the_padding_gives_each_document_its_own_vectors(tmp_path, capsys):
    """Reformer attends within chunks of the padded length: what fills the padding does not change a document's
    states, how much of it there is does (by a tenth of their largest here), so it needs batches of one length too."""
    path, mlm, tokenizer = save_family("reformer", tmp_path)
    ids = torch.tensor([tokenizer("a protein binds the receptor")["input_ids"]])  # 7 tokens

    def beside(fill: int, pads: int) -> torch.Tensor:  # the document's states, `pads` ids `fill` masked after it
        mask = torch.tensor([[1] * ids.shape[1] + [0] * pads])
        with torch.inference_mode():
            return mlm(input_ids=torch.cat([ids, torch.full((1, pads), fill)], 1), attention_mask=mask).logits[:, :7]

    alone = beside(0, 0)
    torch.testing.assert_close(beside(0, 7), beside(30, 7), rtol=0, atol=0)
    assert (beside(0, 7) - alone).abs().max() > 0.05 * alone.abs().max()
    model = load_model(str(path))
    assert_batched_by_length(model, mlm, tokenizer, capsys.readouterr().err)


class FromEndConfig(BertConfig):
    model_type = "lsr-test-bert-from-end"


class FromEndForMaskedLM(BertForMaskedLM):
    """BERT whose positions count back from the input's last column: a real token's position moves with the padding
    after it, while what fills that padding changes nothing (a family installed beside transformers' own)."""

    config_class = FromEndConfig

    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        length = input_ids.shape[1]
        positions = torch.arange(length - 1, -1, -1, device=input_ids.device).expand_as(input_ids)
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, **kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_body_whose_positions_count_from_the_end_gives_each_document_its_own_vectors(dtype, tmp_path):
    """The padding's length alone moves its states; in a 16-bit dtype that is looked for in float32 (two widths'
    rounding differs by more than some bodies change) and the body is left as it was after, in its dtype and
    sharing the tied decoder's storage."""
    AutoConfig.register(FromEndConfig.model_type, FromEndConfig, exist_ok=True)
    AutoModelForMaskedLM.register(FromEndConfig, FromEndForMaskedLM, exist_ok=True)
    tokenizer = tokenizer_for("bert")
    torch.manual_seed(0)
    mlm = FromEndForMaskedLM(FromEndConfig(**{**SIZES, "vocab_size": len(tokenizer)})).eval()
    with torch.no_grad():
        for p in mlm.parameters():
            p.copy_(torch.randn_like(p) * (0.5 if p.dim() == 1 else 0.2))
    mlm.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    model = load_model(str(tmp_path), dtype=dtype)
    assert model.unpadded
    assert {p.dtype for p in model.body.parameters()} == {dtype}
    # the decoder tied to the embeddings still shares their storage: converting back had copied V × H
    assert model.weight.data_ptr() == model.body.get_input_embeddings().weight.data_ptr()
    got = SpladeEncoder(model, max_tokens=64, backend="torch").encode(MIXED_LENGTHS, max_length=24).double()
    alone = torch.cat([reference_weights(mlm, tokenizer, [t], 24) for t in MIXED_LENGTHS])
    assert ((got - alone).norm() / alone.norm()).item() < (1e-5 if dtype == torch.float32 else 2e-2)


@pytest.mark.parametrize("kind", ["bert", "electra"])
def test_a_body_that_masks_its_padding_keeps_padded_batches(kind, tmp_path):
    path, mlm, tokenizer = save_family(kind, tmp_path)
    model = load_model(str(path))
    assert not model.unpadded
    got = SpladeEncoder(model, max_tokens=64, backend="torch").encode(TEXTS, max_length=24)
    alone = torch.cat([reference_weights(mlm, tokenizer, [t], 24) for t in TEXTS])
    torch.testing.assert_close(got.double(), alone, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind, dtype, reason", [
    ("mobilebert", torch.float32, "AttributeError"),  # its transform multiplies by the decoder's weight
    ("bart", torch.float32, "RuntimeError"),  # its head adds a bias after the decoder
    ("nystromformer", torch.float32, "RuntimeError"),  # its landmarks want other lengths
    ("deberta", torch.bfloat16, "float32"),  # its attention mixes dtypes in bf16: the message says what runs
])
def test_a_body_that_cannot_run_split_is_refused_at_load(kind, dtype, reason, tmp_path):
    path, _, _ = save_family(kind, tmp_path)
    with pytest.raises(LsrIndexError, match=f"model {path}: .* does not run without its decoder") as refused:
        load_model(str(path), dtype=dtype)
    assert reason in str(refused.value) and "\n" not in str(refused.value)


def test_one_length_buckets_cover_every_document_once_within_the_budget():
    rng = np.random.default_rng(3)
    for _ in range(50):
        lengths = rng.integers(1, 40, rng.integers(1, 300))
        budget = int(rng.integers(1, 400))
        batches = length_buckets(lengths, budget, one_length=True)
        assert np.array_equal(np.sort(np.concatenate(batches)), np.arange(len(lengths)))
        for batch in batches:
            assert len(set(lengths[batch].tolist())) == 1
            assert len(batch) == 1 or len(batch) * lengths[batch[0]] <= budget
        # the same documents in at most one batch more per distinct length than the padded buckets
        assert len(batches) <= len(length_buckets(lengths, budget)) + len(set(lengths.tolist()))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind, dtype, mixes", [
    ("bert", torch.float32, False), ("electra", torch.bfloat16, False), ("modernbert", torch.bfloat16, False),
    ("convbert", torch.bfloat16, True), ("fnet", torch.float32, True),
])
def test_on_cuda_the_probe_tells_the_same_bodies_apart(kind, dtype, mixes, tmp_path):
    """On the GPU two forwards of one shape must agree exactly for a body that masks its padding (else it would get
    one-length batches for nothing), and a body that mixes padding in still gets each document's own vectors."""
    from tiny_models import save_masked_lm

    path, mlm, tokenizer = save_masked_lm(kind, tmp_path, pickled=False) if kind == "modernbert" else \
        save_family(kind, tmp_path)
    model = load_model(str(path), device="cuda", dtype=dtype)
    assert not model.packed and model.unpadded == mixes
    texts = MIXED_LENGTHS * 3
    got = SpladeEncoder(model, max_tokens=64, backend="torch").encode(texts, max_length=24).cpu().double()
    alone = torch.cat([reference_weights(mlm.double(), tokenizer, [t], 24) for t in texts])
    rel = ((got - alone).norm() / alone.norm()).item()
    assert rel < (1e-4 if dtype == torch.float32 else 2e-2), rel
