"""Every masked-LM family through the split body + head equals transformers' own full forward with SPLADE pooling.

For each architecture a tiny model with random weights (biases and norms too, so a dropped or misplaced bias
shows) is saved as safetensors and as a pickled state dict, with a tokenizer built here. The reference is computed
independently: AutoModelForMaskedLM's full forward → logits → log1p(relu) → max over real tokens. The CPU path
(backend torch) and the Triton kernel under TRITON_INTERPRET=1 must equal it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

os.environ["TRITON_INTERPRET"] = "1"

import sparton
from lsr_index.encoder import SpladeEncoder
from lsr_index.errors import LsrIndexError
from lsr_index.models import load_model

WORDS = ["protein", "receptor", "binds", "cells", "gene", "cancer", "risk", "trial", "vitamin", "fracture", "neurons",
         "disease", "mutation", "the", "a", "of", "in", "and", "with", "to", "patients", "older", "adults",
         "randomized"]
TEXTS = ["a protein binds the receptor", "x", "Vitamin D and fracture risk in older adults " * 4,
         "gene mutation of cancer cells", "the"]
BERT_LIKE = ("bert", "distilbert")


def _tokenizer(kind: str):
    """A small WordPiece ([CLS] … [SEP]) or byte-level BPE (<s> … </s>) tokenizer, built offline."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if kind in BERT_LIKE:
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        letters = sorted(set("".join(WORDS)) | set("xdD"))
        vocab = list(dict.fromkeys([*specials, *WORDS, *letters, *(f"##{c}" for c in letters)]))
        tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2),
                                                                                                    ("[SEP]", 3)])
        return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]",
                                       cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([" ".join(WORDS)] * 4 + TEXTS, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0),
                                                                                           ("</s>", 2)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", pad_token="<pad>", eos_token="</s>",
                                   unk_token="<unk>", mask_token="<mask>", cls_token="<s>", sep_token="</s>")


def _config(kind: str, vocab: int):
    from transformers import BertConfig, DistilBertConfig, ModernBertConfig, RobertaConfig, XLMRobertaConfig

    common = {"vocab_size": vocab, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
              "intermediate_size": 48, "max_position_embeddings": 66}
    if kind == "bert":
        return BertConfig(**common)
    if kind == "distilbert":
        return DistilBertConfig(vocab_size=vocab, dim=32, n_layers=2, n_heads=2, hidden_dim=48,
                                max_position_embeddings=64)
    if kind == "roberta":
        return RobertaConfig(**common, pad_token_id=1, bos_token_id=0, eos_token_id=2)
    if kind == "xlm-roberta":
        return XLMRobertaConfig(**common, pad_token_id=1, bos_token_id=0, eos_token_id=2)
    return ModernBertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
                            intermediate_size=48, max_position_embeddings=64, global_attn_every_n_layers=2,
                            local_attention=8, pad_token_id=1, bos_token_id=0, eos_token_id=2, cls_token_id=0,
                            sep_token_id=2, decoder_bias=True)


KINDS = ("bert", "distilbert", "roberta", "xlm-roberta", "modernbert")


def _save(kind: str, root, *, pickled: bool, extra_rows: int = 0, seed: int = 0):
    """A random masked LM of `kind` with its tokenizer in root/kind-{safetensors|bin}; returns the directory."""
    from safetensors.torch import save_file
    from transformers import AutoModelForMaskedLM

    tokenizer = _tokenizer(kind)
    torch.manual_seed(seed)
    mlm = AutoModelForMaskedLM.from_config(_config(kind, len(tokenizer) + extra_rows)).eval()
    with torch.no_grad():
        for p in mlm.parameters():  # biases and norms random too: a lost bias or transform must show
            p.copy_(torch.randn_like(p) * (0.5 if p.dim() == 1 else 0.2))
    target = root / f"{kind}-{'bin' if pickled else 'safetensors'}"
    mlm.config.save_pretrained(target)
    tokenizer.save_pretrained(target)
    state = {k: v.contiguous() for k, v in mlm.state_dict().items()}
    if pickled:
        torch.save(state, target / "pytorch_model.bin")
    else:  # shared (tied) tensors stored once per name, as save_pretrained writes them
        save_file({k: v.clone() for k, v in state.items()}, target / "model.safetensors")
    return target, mlm, tokenizer


def _reference(mlm, tokenizer, texts, max_length, activation="log1p_relu", pooling="max"):
    batch = tokenizer(texts, truncation=True, max_length=max_length, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = mlm(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.double()
    weights = torch.log1p(torch.relu(logits))
    if activation == "log1p_log1p_relu":
        weights = torch.log1p(weights)
    weights = weights * batch["attention_mask"][..., None]
    return weights.sum(dim=1) if pooling == "sum" else weights.amax(dim=1)


@pytest.mark.parametrize("kind", KINDS)
def test_untruncated_lengths_come_from_the_one_tokenization(kind, tmp_path):
    """Truncation is reported from the lengths the tokenizer saw before cutting: they must equal an
    untruncated tokenization's, special tokens included, for texts below, at and far past the limit."""
    path, _, tokenizer = _save(kind, tmp_path, pickled=False)
    encoder = SpladeEncoder(load_model(str(path)), backend="torch")
    texts = [*TEXTS, "protein " * 9, "Vitamin D and fracture risk in older adults " * 40, ""]
    for limit in (3, 8, 24, 4096):
        tokens = encoder.tokenize(texts, limit)
        whole = [len(ids) for ids in tokenizer(texts, add_special_tokens=True)["input_ids"]]
        assert tokens.full_lengths.tolist() == whole
        assert tokens.lengths.tolist() == [min(n, limit) for n in whole]


needs_interpreter = pytest.mark.skipif(
    sparton.splade_head is None or not sparton.splade_head.INTERPRETED,
    reason="triton missing, or imported before TRITON_INTERPRET=1: the subprocess test covers these")


@pytest.mark.parametrize("pickled", [False, True], ids=["safetensors", "bin"])
@pytest.mark.parametrize("kind", KINDS)
def test_family_cpu_path_equals_the_full_masked_lm(kind, pickled, tmp_path):
    path, mlm, tokenizer = _save(kind, tmp_path, pickled=pickled)
    model = load_model(str(path))
    protein = tokenizer(" protein", add_special_tokens=False)["input_ids"][0]
    assert model.vocab_size == len(tokenizer) and model.vocab[protein] == tokenizer.convert_ids_to_tokens(protein)
    got = SpladeEncoder(model, max_tokens=40, backend="torch").encode(TEXTS, max_length=24)
    torch.testing.assert_close(got.double(), _reference(mlm, tokenizer, TEXTS, 24), rtol=1e-4, atol=1e-4)


@pytest.mark.slow  # about 7 s each under the interpreter
@needs_interpreter
@pytest.mark.parametrize("kind", KINDS)
def test_family_triton_kernel_equals_the_full_masked_lm(kind, tmp_path):
    path, mlm, tokenizer = _save(kind, tmp_path, pickled=False, seed=1)
    model = load_model(str(path))
    got = SpladeEncoder(model, max_tokens=40, backend="triton").encode(TEXTS, max_length=24)
    torch.testing.assert_close(got.double(), _reference(mlm, tokenizer, TEXTS, 24), rtol=3e-4, atol=3e-4)


def test_decoder_rows_past_the_tokenizer_are_dropped(tmp_path):
    """ModernBERT-style: the decoder is padded past the tokenizer (as 50,368 rows for 50,280 tokens)."""
    path, mlm, tokenizer = _save("modernbert", tmp_path, pickled=False, extra_rows=13)
    model = load_model(str(path))
    assert model.vocab_size == len(tokenizer) and len(model.vocab) == model.vocab_size
    got = SpladeEncoder(model, backend="torch").encode(TEXTS, max_length=24)
    torch.testing.assert_close(got.double(), _reference(mlm, tokenizer, TEXTS, 24)[:, :len(tokenizer)],
                               rtol=1e-4, atol=1e-4)


def test_decoder_rows_without_a_token_are_never_emitted(tmp_path):
    """A hole inside the tokenizer's range (an id no term maps to) gets a -inf bias, so it weighs 0 whatever its
    logits, and a placeholder term (the index's vocabulary has no empty term)."""
    path, _, _ = _save("bert", tmp_path, pickled=False)
    spec = json.loads((path / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    hole = vocab.pop("protein")  # the id stays inside the range, but no term maps to it any more
    (path / "tokenizer.json").write_text(json.dumps(spec))
    model = load_model(str(path))
    assert model.bias[hole] == float("-inf") and model.vocab[hole].startswith("[lsr-index:no-token-")
    assert (SpladeEncoder(model, backend="torch").encode(TEXTS, max_length=24)[:, hole] == 0).all()


def test_token_ids_past_the_decoder_are_refused(tmp_path):
    path, _, tokenizer = _save("bert", tmp_path, pickled=False)
    config = json.loads((path / "config.json").read_text())
    config["vocab_size"] -= 5
    (path / "config.json").write_text(json.dumps(config))
    from safetensors.torch import load_file, save_file

    state = load_file(path / "model.safetensors")
    save_file({k: v[:-5].clone() if v.shape[:1] == (len(tokenizer),) else v for k, v in state.items()},
              path / "model.safetensors")
    with pytest.raises(LsrIndexError, match="tokenizer and weights are from different models"):
        load_model(str(path))


def test_not_a_masked_lm_is_refused(tmp_path):
    path, _, _ = _save("bert", tmp_path, pickled=False)
    config = json.loads((path / "config.json").read_text())
    config["model_type"] = "gpt2"
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(LsrIndexError, match="masked-LM"):
        load_model(str(path))


@pytest.mark.slow
@pytest.mark.skipif(sparton.splade_head is None or sparton.splade_head.INTERPRETED,
                    reason="the interpreter tests ran in this process (or triton is missing)")
def test_interpreter_tests_in_subprocess():
    env = dict(os.environ, TRITON_INTERPRET="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k", "triton"]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]


# ---------------------------------------------------------------- sentence-transformers SparseEncoder directories


def _sentence_transformers(path, pooling: dict | None, transformer: str = "MLMTransformer"):
    """Turn a masked-LM directory into a SparseEncoder directory: the transformer saved in the root, as
    sentence-transformers saves it, and SpladePooling in a subfolder."""
    base = "sentence_transformers.sparse_encoder.models" if transformer == "MLMTransformer" else \
        "sentence_transformers.models"
    modules = [{"idx": 0, "name": "0", "path": "", "type": f"{base}.{transformer}"},
               {"idx": 1, "name": "1", "path": "1_SpladePooling",
                "type": "sentence_transformers.sparse_encoder.models.SpladePooling"}]
    (path / "modules.json").write_text(json.dumps(modules))
    (path / "sentence_bert_config.json").write_text(json.dumps(
        {"max_seq_length": 64, "do_lower_case": False,
         **({"transformer_task": "fill-mask"} if transformer == "Transformer" else {})}))
    (path / "1_SpladePooling").mkdir()
    (path / "1_SpladePooling" / "config.json").write_text(json.dumps(pooling or {}))


@pytest.mark.parametrize(("pooling", "activation"), [("max", "relu"), ("max", "log1p_relu"), ("sum", "relu")])
def test_sentence_transformers_directory_honours_its_pooling(tmp_path, pooling, activation):
    path, mlm, tokenizer = _save("distilbert", tmp_path, pickled=False)
    _sentence_transformers(path, {"pooling_strategy": pooling, "activation_function": activation,
                                  "word_embedding_dimension": len(tokenizer)})
    model = load_model(str(path))
    ours = "log1p_log1p_relu" if activation == "log1p_relu" else "log1p_relu"
    assert (model.pooling, model.activation) == (pooling, ours)
    got = SpladeEncoder(model, max_tokens=40, backend="torch").encode(TEXTS, max_length=24)
    torch.testing.assert_close(got.double(), _reference(mlm, tokenizer, TEXTS, 24, ours, pooling),
                               rtol=1e-4, atol=1e-4)


def test_sentence_transformers_fill_mask_transformer_and_defaults(tmp_path):
    path, mlm, tokenizer = _save("roberta", tmp_path, pickled=True)
    _sentence_transformers(path, None, transformer="Transformer")
    model = load_model(str(path))
    assert (model.pooling, model.activation) == ("max", "log1p_relu")
    got = SpladeEncoder(model, backend="torch").encode(TEXTS, max_length=24)
    torch.testing.assert_close(got.double(), _reference(mlm, tokenizer, TEXTS, 24), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("damage", ["module", "lowercase", "activation", "not fill-mask"])
def test_sentence_transformers_directories_it_cannot_honour_are_refused(tmp_path, damage):
    path, _, _ = _save("bert", tmp_path, pickled=False)
    _sentence_transformers(path, {"activation_function": "softplus" if damage == "activation" else "relu"},
                           transformer="Transformer" if damage == "not fill-mask" else "MLMTransformer")
    if damage == "module":
        modules = json.loads((path / "modules.json").read_text())
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (path / "modules.json").write_text(json.dumps(modules))
    if damage == "lowercase":
        (path / "sentence_bert_config.json").write_text(json.dumps({"do_lower_case": True}))
    if damage == "not fill-mask":
        (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 64}))
    with pytest.raises(LsrIndexError) as caught:
        load_model(str(path))
    assert "\n" not in str(caught.value)
    assert {"module": "Normalize", "lowercase": "do_lower_case", "activation": "softplus",
            "not fill-mask": "Transformer (.) is not supported"}[damage] in str(caught.value)
