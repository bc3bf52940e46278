"""A model's identity covers every file that changes its vectors; pickled weights load only through PyTorch's
restricted unpickler, and a pickle that would run code is refused without running it."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import time

import pytest
import torch
from cli_runner import run_cli

from lsr_index.errors import LsrIndexError
from lsr_index.model.files import identity_files, model_sha256
from lsr_index.model.load import load_model


@pytest.fixture
def tiny_copy(splade_tiny, tmp_path):
    target = tmp_path / "model"
    shutil.copytree(splade_tiny.path, target)
    return target


def test_identity_covers_tokenizer_and_config_not_readme(tiny_copy):
    before = model_sha256(tiny_copy)
    (tiny_copy / "README.md").write_text("a model card edited after the encoding\n")
    (tiny_copy / "training_log.txt").write_text("epoch 3\n")
    assert model_sha256(tiny_copy) == before
    config = tiny_copy / "tokenizer_config.json"
    settings = json.loads(config.read_text())
    settings["do_lower_case"] = not settings.get("do_lower_case", True)
    config.write_text(json.dumps(settings))
    changed = model_sha256(tiny_copy)
    assert changed != before
    (tiny_copy / "special_tokens_map.json").write_text("{}")  # a file that was not there enters the identity
    assert model_sha256(tiny_copy) not in (before, changed)
    assert "special_tokens_map.json" in identity_files(tiny_copy)


def test_identity_is_hashed_once_per_process_and_a_same_size_edit_is_still_seen(tiny_copy, monkeypatch):
    from lsr_index.model import files

    reads = []
    hash_file = files.sha256_file
    monkeypatch.setattr(files, "sha256_file", lambda path: reads.append(path.name) or hash_file(path))
    later = type("Clock", (), {"time_ns": staticmethod(lambda: time.time_ns() + 3_000_000_000)})
    monkeypatch.setattr(files, "time", later)  # the files are past the freshness window
    before = model_sha256(tiny_copy)
    hashed = len(reads)
    assert model_sha256(tiny_copy) == before and len(reads) == hashed  # a run asks twice: read once
    weights = tiny_copy / "model.safetensors"
    stat = weights.stat()
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # same size, same inode, and the modification time set back as cp -p or rsync -t do
    with open(weights, "r+b") as f:
        f.write(data)
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    monkeypatch.setattr(files, "time", time)  # now: the edit is fresh, so its answer is not kept
    changed = model_sha256(tiny_copy)
    assert changed != before
    assert model_sha256(tiny_copy) == changed
    assert reads.count("model.safetensors") == 3


def test_identity_is_recorded_for_later_processes_until_a_file_changes(tiny_copy, tmp_path, monkeypatch):
    from lsr_index.model import files

    monkeypatch.setenv("LSR_INDEX_CACHE", str(tmp_path / "cache"))
    reads = []
    hash_file = files.sha256_file
    monkeypatch.setattr(files, "sha256_file", lambda path: reads.append(path.name) or hash_file(path))

    def new_process() -> str:
        monkeypatch.setattr(files, "_kept", {})
        return model_sha256(tiny_copy)

    fresh = new_process()
    assert not list((tmp_path / "cache").glob("identity/*"))  # files written just now are not recorded yet
    later = type("Clock", (), {"time_ns": staticmethod(lambda: time.time_ns() + 3_000_000_000)})
    monkeypatch.setattr(files, "time", later)
    assert new_process() == fresh
    hashed = len(reads)
    assert new_process() == fresh and len(reads) == hashed  # read from the record: no file read
    weights = tiny_copy / "model.safetensors"
    stat = weights.stat()
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # same size and inode, the modification time set back: the change time still moves
    with open(weights, "r+b") as f:
        f.write(data)
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    monkeypatch.setattr(files, "time", type("Clock", (), {"time_ns": staticmethod(
        lambda: time.time_ns() + 6_000_000_000)}))
    changed = new_process()
    assert changed != fresh and len(reads) > hashed
    for record in (tmp_path / "cache").glob("identity/*"):
        record.write_text("{not json")  # a damaged record is hashed over, never trusted or fatal
    assert new_process() == changed
    for record in (tmp_path / "cache").glob("identity/*"):  # another state's record is not trusted either
        record.write_text(json.dumps({"path": str(tiny_copy.resolve()), "stamps": [], "sha256": "0" * 64}))
    assert new_process() == changed
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    monkeypatch.setenv("LSR_INDEX_CACHE", str(blocked))  # a cache that cannot be written: the right answer still
    assert new_process() == changed


def test_the_tokenizer_is_read_once_per_process_until_its_files_change(tiny_copy, monkeypatch):
    from lsr_index.model import files, load

    later = type("Clock", (), {"time_ns": staticmethod(lambda: time.time_ns() + 3_000_000_000)})
    monkeypatch.setattr(files, "time", later)
    first = load.tokenizer_at(tiny_copy)
    assert load.tokenizer_at(tiny_copy) is first  # the manifest's record, then the encoder: one read
    terms, holes = load.tokenizer_terms(first)
    terms[0] = "changed by a caller"
    assert load.tokenizer_terms(first) == ([*first.convert_ids_to_tokens(list(range(len(first))))], holes)
    spec = json.loads((tiny_copy / "tokenizer.json").read_text())
    spec["model"]["vocab"]["zzz-new-term"] = len(spec["model"]["vocab"])
    (tiny_copy / "tokenizer.json").write_text(json.dumps(spec))
    again = load.tokenizer_at(tiny_copy)
    assert again is not first and load.tokenizer_terms(again)[0][-1] == "zzz-new-term"


def test_identity_covers_sentence_transformers_modules(tiny_copy):
    (tiny_copy / "1_SpladePooling").mkdir()
    pooling = tiny_copy / "1_SpladePooling" / "config.json"
    pooling.write_text(json.dumps({"pooling_strategy": "max", "activation_function": "relu"}))
    before = model_sha256(tiny_copy)
    pooling.write_text(json.dumps({"pooling_strategy": "max", "activation_function": "log1p_relu"}))
    assert model_sha256(tiny_copy) != before
    assert "1_SpladePooling/config.json" in identity_files(tiny_copy)


def test_loaded_model_carries_the_identity(tiny_copy):
    (tiny_copy / "README.md").write_text("card")
    model = load_model(str(tiny_copy))
    assert model.sha256 == model_sha256(tiny_copy)
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


def test_unreadable_pickle_is_one_line(tiny_copy):
    (tiny_copy / "model.safetensors").unlink()
    (tiny_copy / "pytorch_model.bin").write_bytes(b"not really a pickle")
    with pytest.raises(LsrIndexError, match=r"pytorch_model\.bin: not a readable PyTorch weights file"):
        load_model(str(tiny_copy))


def test_no_weights_at_all(tiny_copy):
    (tiny_copy / "model.safetensors").unlink()
    with pytest.raises(LsrIndexError, match="no weights"):
        load_model(str(tiny_copy))
