"""Tiny masked LMs of every family lsr-index loads, with random weights and a tokenizer built offline, and the
reference SPLADE weights of transformers' own full forward: for the family tests on CPU and on a GPU."""

from __future__ import annotations

import json

import torch

WORDS = ["protein", "receptor", "binds", "cells", "gene", "cancer", "risk", "trial", "vitamin", "fracture", "neurons",
         "disease", "mutation", "the", "a", "of", "in", "and", "with", "to", "patients", "older", "adults",
         "randomized"]
TEXTS = ["a protein binds the receptor", "x", "Vitamin D and fracture risk in older adults " * 4,
         "gene mutation of cancer cells", "the"]
BERT_LIKE = ("bert", "distilbert")


def tokenizer_for(kind: str):
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


def config_for(kind: str, vocab: int, positions: int = 66):
    from transformers import BertConfig, DistilBertConfig, ModernBertConfig, RobertaConfig, XLMRobertaConfig

    common = {"vocab_size": vocab, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
              "intermediate_size": 48, "max_position_embeddings": positions}
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


def save_masked_lm(kind: str, root, *, pickled: bool, extra_rows: int = 0, seed: int = 0, positions: int = 66,
                   **changes):
    """A random masked LM of `kind` with its tokenizer in root/kind-{safetensors|bin}; returns the directory.
    `positions`: BERT-like families' position embeddings (the default keeps the models tiny); `changes`: config
    settings that differ from the family's defaults."""
    from safetensors.torch import save_file
    from transformers import AutoModelForMaskedLM

    tokenizer = tokenizer_for(kind)
    torch.manual_seed(seed)
    config = config_for(kind, len(tokenizer) + extra_rows, positions)
    for name, value in changes.items():
        setattr(config, name, value)
    mlm = AutoModelForMaskedLM.from_config(config).eval()
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


def reference_weights(mlm, tokenizer, texts, max_length, activation="log1p_relu", pooling="max"):
    batch = tokenizer(texts, truncation=True, max_length=max_length, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = mlm(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.double()
    weights = torch.log1p(torch.relu(logits))
    if activation == "log1p_log1p_relu":
        weights = torch.log1p(weights)
    weights = weights * batch["attention_mask"][..., None]
    return weights.sum(dim=1) if pooling == "sum" else weights.amax(dim=1)


def sentence_transformers_dir(path, pooling: dict | None, transformer: str = "MLMTransformer"):
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
