"""A model's identity covers every file that changes its vectors; pickled weights load only through PyTorch's
restricted unpickler, and a pickle that would run code is refused without running it."""

from __future__ import annotations

import json
import os
import pickle
import shutil

import pytest
import torch
from cli_runner import run_cli

from lsr_index.errors import LsrIndexError
from lsr_index.model.files import identity, identity_files
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
    first = model.tokenizer()
    assert model.tokenizer() is first  # the manifest's record, then the encoder: one read
    terms, holes = model.terms()
    terms[0] = "changed by a caller"
    assert model.terms() == ([*first.convert_ids_to_tokens(list(range(len(first))))], holes)
    again = pickle.loads(pickle.dumps(model))  # a worker's copy loads its own
    assert again.sha256 == model.sha256 and again.tokenizer() is not first


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
    ids = splade_tiny.tokenizer(["a protein binds"], return_tensors="pt")
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
