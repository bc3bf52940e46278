"""The embedded default resolves from the registry, is checksummed, and splits into body + head exactly."""

from __future__ import annotations

import shutil

import pytest
import torch
from transformers import AutoTokenizer

from lsr_index.errors import LsrIndexError
from lsr_index.model.files import identity
from lsr_index.model.load import load_model
from lsr_index.model.ref import EMBEDDED, locate
from lsr_index.runtime.durable import sha256_file


def test_embedded_model_is_verified_and_cached(splade_tiny):
    assert splade_tiny.sha256 == identity(splade_tiny.path)[0]
    assert sha256_file(splade_tiny.path / "model.safetensors") == EMBEDDED["splade-tiny"].sha256
    assert splade_tiny.weight.shape == (30522, 128) and splade_tiny.bias.shape == (30522,)
    assert locate("splade-tiny") == splade_tiny.path  # found in the cache, not fetched again
    assert splade_tiny.vocab[splade_tiny.tokenizer.token_to_id("protein")] == "protein"


def test_body_plus_head_equals_the_masked_lm(splade_tiny):
    from transformers import AutoModelForMaskedLM

    reference = AutoModelForMaskedLM.from_pretrained(splade_tiny.path, use_safetensors=True).eval()
    batch = AutoTokenizer.from_pretrained(splade_tiny.path)(["a protein binds the receptor", "x"], return_tensors="pt",
                                                            padding=True)
    with torch.no_grad():
        expected = reference(**batch).logits
        hidden = splade_tiny.body(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    got = hidden @ splade_tiny.weight.T + splade_tiny.bias
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)


def test_legacy_gamma_beta_names_are_loaded_not_reinitialised(splade_tiny):
    from safetensors.torch import load_file

    raw = load_file(splade_tiny.path / "model.safetensors")
    assert "bert.embeddings.LayerNorm.gamma" in raw  # the shipped file uses the old names
    loaded = dict(splade_tiny.body.named_parameters())
    torch.testing.assert_close(loaded["bert.embeddings.LayerNorm.weight"], raw["bert.embeddings.LayerNorm.gamma"])


def test_corrupted_cache_is_detected(splade_tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("LSR_INDEX_CACHE", str(tmp_path))
    target = tmp_path / "models" / f"splade-tiny-{EMBEDDED['splade-tiny'].sha256[:12]}"
    shutil.copytree(splade_tiny.path, target)
    with open(target / "model.safetensors", "r+b") as f:
        f.seek(4096)
        f.write(b"\x00" * 16)
    with pytest.raises(LsrIndexError, match="checksum mismatch"):
        load_model("splade-tiny")


def test_unknown_model_name_is_a_clear_error():
    with pytest.raises(LsrIndexError, match="no such directory"):
        locate("./no/such/model")


def test_two_loads_at_once_in_one_process_each_give_the_whole_model(splade_tiny):
    """transformers builds a model under process-wide settings; two lsr-index loads at once (a worker thread beside
    the caller's) must still each get the checkpoint's weights, none left on the meta device."""
    import threading

    models = []

    def load() -> None:
        for _ in range(3):
            models.append(load_model("splade-tiny"))

    threads = [threading.Thread(target=load) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    reference = dict(splade_tiny.body.state_dict())
    assert len(models) == 6
    for model in models:
        state = model.body.state_dict()
        assert all(t.device.type == "cpu" for t in state.values())
        assert state.keys() == reference.keys() and all(torch.equal(state[k], reference[k]) for k in reference)
        assert torch.equal(model.weight, splade_tiny.weight)


def test_a_closed_encoder_leaves_no_model_load_running(monkeypatch):
    """A task that ends before its background model load does (an input error, Ctrl-C) waits for that load in
    close(): a load still running after the call returned would build under transformers' process-wide settings
    beside the caller's next model load."""
    import time

    from lsr_index.encode.job import EncodeJob, EncodeOptions
    from lsr_index.encode.task import ShardEncoder
    from lsr_index.model import load as models_module

    real, finished = models_module.load_model, []

    def slow_load(*args, **kwargs):
        time.sleep(1.0)
        model = real(*args, **kwargs)
        finished.append(time.monotonic())
        return model

    monkeypatch.setattr(models_module, "load_model", slow_load)
    encoder = ShardEncoder(EncodeJob(inputs=("unused",), options=EncodeOptions(progress=False)), "cpu", 1)
    encoder.close()
    assert finished and finished[0] <= time.monotonic()
