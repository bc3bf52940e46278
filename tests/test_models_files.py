"""A model's identity covers every file that changes its vectors; pickled weights load only through PyTorch's
restricted unpickler, and a pickle that would run code is refused without running it."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys

import pytest
import torch
from cli_runner import run_cli
from transformers import AutoTokenizer

from lsr_index.errors import LsrIndexError
from lsr_index.model.files import cache_root, identity, identity_files
from lsr_index.model.load import load_model
from lsr_index.model.ref import ModelRef


@pytest.fixture
def tiny_copy(splade_tiny, tmp_path):
    target = tmp_path / "model"
    shutil.copytree(splade_tiny.path, target)
    return target


def test_identity_covers_tokenizer_and_config_not_readme(tiny_copy):
    before = identity(tiny_copy)[0]
    (tiny_copy / "README.md").write_text("a model card edited after the encoding\n")
    (tiny_copy / "training_log.txt").write_text("epoch 3\n")
    assert identity(tiny_copy)[0] == before
    config = tiny_copy / "tokenizer_config.json"
    settings = json.loads(config.read_text())
    settings["do_lower_case"] = not settings.get("do_lower_case", True)
    config.write_text(json.dumps(settings))
    changed = identity(tiny_copy)[0]
    assert changed != before
    (tiny_copy / "special_tokens_map.json").write_text("{}")  # a file that was not there enters the identity
    assert identity(tiny_copy)[0] not in (before, changed)
    assert "special_tokens_map.json" in identity_files(tiny_copy)


def test_an_encode_identifies_its_model_once_and_hands_the_reference_on(tiny_copy, tmp_path, monkeypatch):
    """Resolved and hashed once per run (each identity file read once), then handed to the plan, the manifest and the
    encoder: no stage resolves the name again."""
    from lsr_index.encode.job import EncodeJob, EncodeOptions
    from lsr_index.encode.run import encode_corpus
    from lsr_index.model import files, ref

    reads, located = [], []
    hash_file, locate = files.sha256_file, ref.locate
    monkeypatch.setattr(files, "sha256_file", lambda path: reads.append(path.name) or hash_file(path))
    monkeypatch.setattr(ref, "locate", lambda name: located.append(name) or locate(name))
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "text": f"protein {i} binds"}) + "\n" for i in range(5)))
    job = EncodeJob(inputs=(str(corpus),), model=str(tiny_copy), options=EncodeOptions(progress=False))
    manifest = encode_corpus(job, tmp_path / "vectors")
    assert located == [str(tiny_copy)]
    assert sorted(reads) == sorted(identity_files(tiny_copy))
    assert manifest.model.sha256 == job.model.sha256 == manifest.query_model.sha256


def test_a_same_size_edit_with_its_time_set_back_changes_the_identity(tiny_copy):
    before = ModelRef.resolve(str(tiny_copy)).sha256
    weights = tiny_copy / "model.safetensors"
    stat = weights.stat()
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # same size, same inode, and the modification time set back as cp -p or rsync -t do
    with open(weights, "r+b") as f:
        f.write(data)
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert ModelRef.resolve(str(tiny_copy)).sha256 != before


def test_a_reference_loads_its_tokenizer_once_and_hands_out_fresh_term_lists(tiny_copy):
    model = ModelRef.resolve(str(tiny_copy))
    first = model.backend()
    assert model.backend() is first  # the manifest's record, then the encoder: one read
    terms, holes = model.terms()
    terms[0] = "changed by a caller"
    hf = AutoTokenizer.from_pretrained(tiny_copy)
    assert model.terms() == ([*hf.convert_ids_to_tokens(list(range(len(hf))))], holes)
    again = pickle.loads(pickle.dumps(model))  # a worker's copy loads its own
    assert again.sha256 == model.sha256 and again.backend() is not first


def _cache_entries() -> list:
    return sorted((cache_root() / "tokenizers").glob("*.json"))


@pytest.mark.parametrize("split_special", [False, True])
def test_the_cached_tokenizer_is_the_one_transformers_builds(tiny_copy, split_special):
    """What a command reads back from the cache is transformers' own Rust tokenizer, byte for byte, with its padding
    id and the setting its JSON leaves out (split_special_tokens: "[MASK]" in a text is plain text); the entry is
    named by the model's identity and the versions that built it."""
    (tiny_copy / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True, "pad_token": "[PAD]",
                                                                 "split_special_tokens": split_special}))
    built = ModelRef.resolve(str(tiny_copy)).backend()  # not cached yet: built through transformers
    model = ModelRef.resolve(str(tiny_copy))
    entry, = [e for e in _cache_entries() if e.name.startswith(model.sha256)]
    assert "transformers-" in entry.name and "tokenizers-" in entry.name
    cached = model.backend()
    hf = AutoTokenizer.from_pretrained(tiny_copy)
    assert cached.tokenizer.to_str() == built.tokenizer.to_str() == hf.backend_tokenizer.to_str()
    assert cached.pad_id == hf.pad_token_id == 0
    text = "Ünïcode TEXT, with   spaces and a [MASK] protein-binding site"
    assert cached.tokenizer.encode(text).ids == built.tokenizer.encode(text).ids == hf(text)["input_ids"]
    assert (hf.mask_token_id in hf(text)["input_ids"]) != split_special


def test_a_damaged_cache_entry_is_built_again_and_a_read_only_cache_only_costs_time(tiny_copy, tmp_path,
                                                                                    monkeypatch):
    model = ModelRef.resolve(str(tiny_copy))
    expected = model.backend().tokenizer.to_str()
    entry, = [e for e in _cache_entries() if e.name.startswith(model.sha256)]
    entry.write_text('{"tokenizer": "{\\"version\\": ')  # cut short, as by a full disk
    assert ModelRef.resolve(str(tiny_copy)).backend().tokenizer.to_str() == expected
    assert json.loads(entry.read_text())["tokenizer"] == expected  # replaced whole
    read_only = tmp_path / "read-only-cache"
    read_only.mkdir()
    read_only.chmod(0o500)
    monkeypatch.setenv("LSR_INDEX_CACHE", str(read_only))
    try:
        assert ModelRef.resolve(str(tiny_copy)).backend().tokenizer.to_str() == expected
        assert os.getuid() == 0 or not any(read_only.iterdir())
    finally:
        read_only.chmod(0o700)


def test_planning_an_output_with_a_cached_tokenizer_does_not_import_transformers(tiny_copy, tmp_path):
    """transformers' import alone takes seconds on a slow file system: planning (the vocabulary, the manifest's
    record of the query model) reads the cached tokenizer instead."""
    ModelRef.resolve(str(tiny_copy)).backend()  # the cache entry, as an earlier command leaves it
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "1", "text": "a protein"}\n')
    script = f"""
import sys
from lsr_index.encode.job import EncodeJob, EncodeOptions
from lsr_index.encode.plan import fresh_manifest
from lsr_index.model.ref import ModelRef
job = EncodeJob(inputs=({str(corpus)!r},), model=ModelRef.resolve({str(tiny_copy)!r}), options=EncodeOptions())
manifest = fresh_manifest(job)
assert len(ModelRef.resolve({str(tiny_copy)!r}).terms()[0]) == 30522
print(sorted(m for m in sys.modules if m.split(".")[0] == "transformers"))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_identity_covers_a_versioned_tokenizer_file(tiny_copy):
    """tokenizer_config.json may name tokenizer.<version>.json for transformers to read instead of tokenizer.json:
    editing it changes the model's identity (and so the tokenizer's cache entry)."""
    shutil.copy(tiny_copy / "tokenizer.json", tiny_copy / "tokenizer.4.0.0.json")
    before = identity(tiny_copy)[0]
    settings = json.loads((tiny_copy / "tokenizer.4.0.0.json").read_text())
    settings["normalizer"]["lowercase"] = not settings["normalizer"]["lowercase"]
    (tiny_copy / "tokenizer.4.0.0.json").write_text(json.dumps(settings))
    assert identity(tiny_copy)[0] != before


def test_identity_covers_sentence_transformers_modules(tiny_copy):
    (tiny_copy / "1_SpladePooling").mkdir()
    pooling = tiny_copy / "1_SpladePooling" / "config.json"
    pooling.write_text(json.dumps({"pooling_strategy": "max", "activation_function": "relu"}))
    before = identity(tiny_copy)[0]
    pooling.write_text(json.dumps({"pooling_strategy": "max", "activation_function": "log1p_relu"}))
    assert identity(tiny_copy)[0] != before
    assert "1_SpladePooling/config.json" in identity_files(tiny_copy)


def test_loaded_model_carries_the_identity(tiny_copy):
    (tiny_copy / "README.md").write_text("card")
    model = load_model(str(tiny_copy))
    assert model.sha256 == identity(tiny_copy)[0]
    (tiny_copy / "tokenizer.json").write_text((tiny_copy / "tokenizer.json").read_text().replace(
        '"lowercase": true', '"lowercase": false'))
    assert load_model(str(tiny_copy)).sha256 != model.sha256


def _as_pickle(directory, state):
    (directory / "model.safetensors").unlink()
    torch.save(state, directory / "pytorch_model.bin")


def test_pickled_state_dict_loads_through_the_restricted_loader(splade_tiny, tiny_copy, capfd):
    from safetensors.torch import load_file

    _as_pickle(tiny_copy, load_file(splade_tiny.path / "model.safetensors"))
    model = load_model(str(tiny_copy))
    assert "torch.load(weights_only=True)" in capfd.readouterr().err
    assert torch.equal(model.weight, splade_tiny.weight) and torch.equal(model.bias, splade_tiny.bias)
    ids = AutoTokenizer.from_pretrained(splade_tiny.path)(["a protein binds"], return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(model.body(**ids).logits, splade_tiny.body(**ids).logits)


class _Hostile:
    """Unpickling this calls os.system, as a hostile checkpoint would."""

    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return os.system, (f"touch {self.target}",)


@pytest.mark.parametrize("legacy", [False, True])
def test_hostile_pickle_is_refused_without_running(tiny_copy, tmp_path, legacy):
    marker = tmp_path / "pwned"
    (tiny_copy / "model.safetensors").unlink()
    payload = {"bert.embeddings.word_embeddings.weight": torch.zeros(2, 2), "x": _Hostile(marker)}
    if legacy:  # a bare pickle stream rather than torch.save's zip archive
        (tiny_copy / "pytorch_model.bin").write_bytes(pickle.dumps(payload))
    else:
        torch.save(payload, tiny_copy / "pytorch_model.bin")
    with pytest.raises(LsrIndexError) as caught:
        load_model(str(tiny_copy))
    assert not marker.exists()
    message = str(caught.value)
    assert "\n" not in message and "refused" in message and "pytorch_model.bin" in message, message


def test_hostile_pickle_through_the_cli_is_one_line(tiny_copy, tmp_path):
    marker = tmp_path / "pwned"
    (tiny_copy / "model.safetensors").unlink()
    torch.save({"w": _Hostile(marker)}, tiny_copy / "pytorch_model.bin")
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "d1", "contents": "a protein"}\n')
    run = run_cli("-w", str(tmp_path / "w"), "encode", str(corpus), "--model", str(tiny_copy))
    assert run.returncode != 0 and not marker.exists()
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "refused" in errors[0] and "Traceback" not in run.stderr, run.stderr


@pytest.mark.parametrize(("data", "what"), [(b"not really a pickle", "not a pickle"),
                                            (pickle.dumps({"w": torch.zeros(2)}, protocol=4), "a plain Python pickle"),
                                            (pickle.dumps({"w": torch.zeros(2)}, protocol=2), "a plain Python pickle")])
def test_a_file_torch_save_did_not_write_is_one_refusal_line(tiny_copy, capfd, data, what):
    """Handed to torch, a plain `pickle.dump` prints two lines of PyTorch's warnings, then "not a readable PyTorch
    weights file (Unsupported operand 149)", which reads as damage: it is a refusal, said once, before torch reads
    it."""
    (tiny_copy / "model.safetensors").unlink()
    (tiny_copy / "pytorch_model.bin").write_bytes(data)
    capfd.readouterr()
    with pytest.raises(LsrIndexError) as caught:
        load_model(str(tiny_copy))
    assert str(caught.value) == (f"{tiny_copy / 'pytorch_model.bin'}: refused: not PyTorch weights ({what}, not a "
                                 "file torch.save wrote); save the state dict with torch.save, or better as "
                                 "safetensors")
    assert "Warning" not in capfd.readouterr().err


def test_no_weights_at_all(tiny_copy):
    (tiny_copy / "model.safetensors").unlink()
    with pytest.raises(LsrIndexError, match="no weights"):
        load_model(str(tiny_copy))
