"""Model directories that are damaged, inconsistent or hostile: each is refused in one line naming what is wrong, or
loaded as transformers would load it, never silently turned into another model.

Each case starts from a tiny random BERT saved as a user's model is (tests/tiny_models.py) and changes its files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import TEXTS, reference_weights, save_masked_lm

from lsr_index.errors import LsrIndexError
from lsr_index.model.encoder import SpladeEncoder
from lsr_index.model.load import load_model
from lsr_index.model.query import load_query_model
from lsr_index.model.ref import ModelRef


def edit_json(file, **changes) -> None:
    settings = json.loads(file.read_text())
    settings.update(changes)
    file.write_text(json.dumps(settings))


def drop_weights(path, *names) -> None:
    state = load_file(path / "model.safetensors")
    for name in names:
        del state[name]
    save_file(state, path / "model.safetensors")


def refusal(path) -> str:
    with pytest.raises(LsrIndexError) as refused:
        load_model(str(path))
    assert "\n" not in str(refused.value)
    return str(refused.value)


def test_a_head_missing_from_the_checkpoint_is_refused_unless_tied_to_what_was_read(tmp_path):
    """A name the checkpoint lacks is filled only where another name of the same tensor was read: the decoder tied
    to the embeddings, BERT's bias stored under one of its two names. An untied decoder, or the bias under neither
    name, would be drawn at random, giving vectors far from the model's."""
    path, mlm, tokenizer = save_masked_lm("bert", tmp_path, pickled=False)
    drop_weights(path, "cls.predictions.decoder.weight", "cls.predictions.decoder.bias")
    got = SpladeEncoder(load_model(str(path)), backend="torch").encode(TEXTS, max_length=24)
    torch.testing.assert_close(got.double(), reference_weights(mlm, tokenizer, TEXTS, 24), rtol=1e-4, atol=1e-4)
    drop_weights(path, "cls.predictions.bias")
    assert "weights missing from the checkpoint: cls.predictions.bias, cls.predictions.decoder.bias" in refusal(path)
    untied, _, _ = save_masked_lm("bert", tmp_path / "untied", pickled=False)
    edit_json(untied / "config.json", tie_word_embeddings=False)
    drop_weights(untied, "cls.predictions.decoder.weight")
    assert "weights missing from the checkpoint: cls.predictions.decoder.weight" in refusal(untied)


@pytest.mark.parametrize("kind", ["bert", "roberta"])
def test_a_checkpoint_holding_two_different_head_biases_gives_the_decoders_as_transformers_does(kind, tmp_path):
    """The head's bias has two names (BERT: cls.predictions.bias and its decoder's; RoBERTa: lm_head's). Where a
    checkpoint holds both with different values, the logits transformers computes from it use the decoder's."""
    from transformers import AutoConfig, BertForMaskedLM, RobertaForMaskedLM

    path, _, tokenizer = save_masked_lm(kind, tmp_path, pickled=False)
    head = "cls.predictions" if kind == "bert" else "lm_head"
    state = load_file(path / "model.safetensors")
    state[f"{head}.decoder.bias"] = torch.randn_like(state[f"{head}.bias"])
    save_file(state, path / "model.safetensors")
    masked_lm = BertForMaskedLM if kind == "bert" else RobertaForMaskedLM
    reference = masked_lm.from_pretrained(None, config=AutoConfig.from_pretrained(path),
                                          state_dict=load_file(path / "model.safetensors")).eval()
    got = SpladeEncoder(load_model(str(path)), backend="torch").encode(TEXTS, max_length=24)
    torch.testing.assert_close(got.double(), reference_weights(reference, tokenizer, TEXTS, 24), rtol=1e-4,
                               atol=1e-4)


def test_a_tokenizer_longer_than_the_positions_is_held_to_them(tmp_path):
    """A tokenizer_config copied from a larger model claims 512 tokens where the body has 66 positions: held to the
    claim, a document past the positions would fail in the middle of the run."""
    path, _, _ = save_masked_lm("bert", tmp_path, pickled=False)
    edit_json(path / "tokenizer_config.json", model_max_length=512)
    assert ModelRef.resolve(str(path)).max_length() == 66


@pytest.mark.parametrize("file, changes, says", [
    ("config.json", {"vocab_size": "76"}, "expected int, got str"),
    ("config.json", {"hidden_size": None}, "expected int, got NoneType"),
    ("config.json", {"pad_token_id": 10**6}, "Padding_idx must be within num_embeddings"),
    ("config.json", {"vocab_size": 10**10}, "weights whose shapes differ from config.json"),
    ("config.json", {"hidden_act": ["gelu"]}, "Field 'hidden_act' expected str, got list"),
    ("config.json", {"model_type": ["bert"]}, "unhashable type: 'list'"),
    ("config.json", {"type_vocab_size": 0}, "weights whose shapes differ from config.json"),
    ("tokenizer_config.json", None, "cannot load its tokenizer"),
])
def test_config_oddities_are_one_line(file, changes, says, tmp_path):
    path, _, _ = save_masked_lm("bert", tmp_path, pickled=False)
    if changes is None:
        (path / file).write_text("[1, 2]")
    else:
        edit_json(path / file, **changes)
    assert ModelRef.resolve(str(path)).max_length() in (66, None)
    assert says in refusal(path)


def test_a_missing_tokenizer_is_one_line(tmp_path):
    path, _, _ = save_masked_lm("bert", tmp_path, pickled=False)
    (path / "tokenizer.json").unlink()
    assert "cannot load its tokenizer" in refusal(path)


def shard(path, state) -> list[str]:
    """The state dict as two safetensors shards with their index, as save_pretrained writes a large model."""
    names = sorted(state)
    halves = {f"model-0000{i + 1}-of-00002.safetensors": names[i::2] for i in range(2)}
    for file, keys in halves.items():
        save_file({k: state[k] for k in keys}, path / file)
    (path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: file for file, keys in halves.items() for k in keys}}))
    return list(halves)


def test_a_sharded_checkpoint_reads_the_files_its_index_names(tmp_path):
    """A stray file beside the shards (an old copy, another run's) holds the same names: read too, it would override
    the shards."""
    path, mlm, tokenizer = save_masked_lm("bert", tmp_path, pickled=False)
    state = load_file(path / "model.safetensors")
    (path / "model.safetensors").unlink()
    shard(path, state)
    save_file({k: torch.zeros_like(v) for k, v in state.items()}, path / "model-old.safetensors")
    got = SpladeEncoder(load_model(str(path)), backend="torch").encode(TEXTS, max_length=24)
    torch.testing.assert_close(got.double(), reference_weights(mlm, tokenizer, TEXTS, 24), rtol=1e-4, atol=1e-4)


def test_a_shard_the_index_names_must_be_there(tmp_path):
    path, _, _ = save_masked_lm("bert", tmp_path, pickled=False)
    state = load_file(path / "model.safetensors")
    (path / "model.safetensors").unlink()
    gone = shard(path, state)[1]
    (path / gone).unlink()
    assert f"names the shard {gone!r}, which is not a file of" in refusal(path)


def test_two_unindexed_weight_files_holding_one_name_are_refused(tmp_path):
    path, _, _ = save_masked_lm("bert", tmp_path, pickled=False)
    state = load_file(path / "model.safetensors")
    (path / "model.safetensors").unlink()
    save_file(state, path / "a.safetensors")
    save_file({"bert.pooler.dense.bias": torch.zeros(32), **{k: v for k, v in state.items() if "layer.1" in k}},
              path / "b.safetensors")
    assert "b.safetensors and another weight file both hold" in refusal(path)


@pytest.mark.parametrize("weight", ["-2.0", "NaN", "Infinity"])
def test_a_query_table_weight_that_no_search_can_use_is_refused(weight, tmp_path):
    """A negative weight would end the search inside Lucene ("queryCount = 3 is not equal to completedTaskCount = 2"),
    a NaN or infinite one in an error blaming bf16 and the scale: the table is refused as it is read."""
    path, _, _ = save_masked_lm("bert", tmp_path, pickled=False)
    (path / "idf.json").write_text(f'{{"protein": 1.5, "cells": {weight}}}')
    with pytest.raises(LsrIndexError, match=r"idf.json: the weight of 'cells' is .*: a query term weighs a finite"):
        load_query_model(str(path))


def test_a_model_file_or_an_unreachable_hub_is_said_in_one_line(tmp_path):
    path, _, _ = save_masked_lm("bert", tmp_path, pickled=False)
    (tmp_path / "c.jsonl").write_text('{"id": "1", "text": "protein"}\n')
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    for model, says in ((path / "config.json", "is a file: pass the directory that holds the model's files"),
                        ("lsr-test/no-such-model", "the hub cannot be reached (no network, or HF_HUB_OFFLINE is set)")):
        run = subprocess.run([sys.executable, "-m", "lsr_index", "-w", str(tmp_path / "out"), "encode",
                              str(tmp_path / "c.jsonl"), "--model", str(model)], capture_output=True, text=True,
                             env=env)
        assert run.returncode == 1 and says in run.stderr and run.stderr.count("\n") == 1, run.stderr
