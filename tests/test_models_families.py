"""Every masked-LM family through the split body + head equals transformers' own full forward with SPLADE pooling.

For each architecture a tiny model with random weights (biases and norms too, so a dropped or misplaced bias
shows) is saved as safetensors and as a pickled state dict, with a tokenizer built here. The reference is computed
independently: AutoModelForMaskedLM's full forward → logits → log1p(relu) → max over real tokens. The CPU path
(backend torch) and the Triton kernel under TRITON_INTERPRET=1 must equal it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch

os.environ["TRITON_INTERPRET"] = "1"

from tiny_models import KINDS, TEXTS, config_for, reference_weights, save_masked_lm, sentence_transformers_dir

import sparton
from lsr_index.errors import LsrIndexError
from lsr_index.model import packed
from lsr_index.model.encoder import SpladeEncoder, made_up_tokens
from lsr_index.model.load import load_model
from lsr_index.model.packed import PACKED_FAMILIES
from lsr_index.model.ref import ModelRef


@pytest.mark.parametrize("kind", KINDS)
def test_untruncated_lengths_come_from_the_one_tokenization(kind, tmp_path):
    """Truncation is reported from the lengths the tokenizer saw before cutting: they must equal an
    untruncated tokenization's, special tokens included, for texts below, at and far past the limit."""
    path, _, tokenizer = save_masked_lm(kind, tmp_path, pickled=False)
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
    path, mlm, tokenizer = save_masked_lm(kind, tmp_path, pickled=pickled)
    model = load_model(str(path))
    protein = tokenizer(" protein", add_special_tokens=False)["input_ids"][0]
    assert model.vocab_size == len(tokenizer) and model.vocab[protein] == tokenizer.convert_ids_to_tokens(protein)
    got = SpladeEncoder(model, max_tokens=40, backend="torch").encode(TEXTS, max_length=24)
    torch.testing.assert_close(got.double(), reference_weights(mlm, tokenizer, TEXTS, 24), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", sorted(PACKED_FAMILIES))
def test_family_packed_body_equals_the_full_masked_lm(kind, tmp_path):
    """The families that run packed on a GPU, run packed here: one sequence of all the batch's documents, position
    ids restarting at each (after the padding index for RoBERTa's kind), attention document by document."""
    path, mlm, tokenizer = save_masked_lm(kind, tmp_path, pickled=False, seed=2)
    model = load_model(str(path))
    assert not model.packed  # on CPU the body stays padded
    packed.pack(model.body)
    packed_model = dataclasses.replace(model, packed=True)
    pad = tokenizer.pad_token  # a literal one in the text: RoBERTa's kind gives it the padding position
    texts = [*TEXTS, "protein binds " * 9, "cancer", "a gene of the older adults in a trial " * 3,
             f"a protein {pad} binds {pad}{pad} the receptor"]
    assert tokenizer.pad_token_id in tokenizer(texts[-1])["input_ids"]
    got = SpladeEncoder(packed_model, max_tokens=64, backend="torch").encode(texts, max_length=24)
    torch.testing.assert_close(got.double(), reference_weights(mlm, tokenizer, texts, 24), rtol=1e-4, atol=1e-4)
    with pytest.raises(RuntimeError, match="without its documents' bounds"):
        packed_model.body(input_ids=torch.tensor([[5, 6, 7]]))


@pytest.mark.parametrize("kind, changes", [
    ("bert", {"hidden_act": "gelu_new"}), ("bert", {"hidden_act": "relu", "type_vocab_size": 1}),
    ("roberta", {"hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-5}), ("xlm-roberta", {"hidden_act": "silu"}),
    ("distilbert", {"activation": "relu"}),
])
def test_the_family_module_runs_each_variant_as_transformers_does(kind, changes, tmp_path):
    """model.family runs BERT, RoBERTa, XLM-R and DistilBERT itself: each activation and setting it reads gives
    transformers' own full forward, padded and packed (RoBERTa's head keeps its GELU whatever the body's)."""
    path, mlm, tokenizer = save_masked_lm(kind, tmp_path, pickled=False, seed=4, **changes)
    model = load_model(str(path))
    assert type(model.body).__name__ == "FamilyMaskedLM"
    expected = reference_weights(mlm, tokenizer, TEXTS, 24)
    got = SpladeEncoder(model, max_tokens=40, backend="torch").encode(TEXTS, max_length=24)
    torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-4)
    packed.pack(model.body)
    got = SpladeEncoder(dataclasses.replace(model, packed=True), max_tokens=40, backend="torch").encode(TEXTS, 24)
    torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind, changes", [
    ("bert", {"position_embedding_type": "relative_key"}), ("bert", {"hidden_act": "quick_gelu"}),
    ("distilbert", {"sinusoidal_pos_embds": True}), ("roberta", {"is_decoder": True}),
])
def test_what_the_family_module_does_not_run_transformers_builds(kind, changes, tmp_path):
    path, mlm, tokenizer = save_masked_lm(kind, tmp_path, pickled=False, seed=5, **changes)
    model = load_model(str(path))
    assert type(model.body).__module__.startswith("transformers.")
    got = SpladeEncoder(model, max_tokens=40, backend="torch").encode(TEXTS, max_length=24)
    torch.testing.assert_close(got.double(), reference_weights(mlm, tokenizer, TEXTS, 24), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("kind", sorted(PACKED_FAMILIES))
def test_the_family_module_gives_transformers_logits_bit_for_bit_on_cpu(kind, dtype, tmp_path):
    """Same operations in the same order as transformers' classes (the embeddings' sum too, whose rounding in 16 bits
    depends on it): the padded forward's logits are equal, not only close."""
    from transformers import AutoModelForMaskedLM

    from lsr_index.model import family
    from lsr_index.model.files import read_state_dict, settings

    path, _, tokenizer = save_masked_lm(kind, tmp_path, pickled=False, seed=6)
    own = family.load(settings(path / "config.json"), read_state_dict(path), dtype)
    theirs = AutoModelForMaskedLM.from_pretrained(path, dtype=dtype).eval()
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        got = own.get_output_embeddings()(own(input_ids=batch["input_ids"],
                                              attention_mask=batch["attention_mask"]).logits)
        want = theirs(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    real = batch["attention_mask"].bool()
    assert torch.equal(got[real], want[real])


def test_a_bert_family_model_loads_and_encodes_without_importing_transformers(tmp_path):
    """transformers' import costs each encoding or searching process seconds: the family's models never pay it."""
    path, _, _ = save_masked_lm("roberta", tmp_path, pickled=True)
    ModelRef.resolve(str(path)).backend()  # the tokenizer's cache entry, as the command that plans a run leaves it
    script = f"""
import sys
from lsr_index.model.encoder import SpladeEncoder
from lsr_index.model.load import load_model
weights = SpladeEncoder(load_model({str(path)!r}), backend="torch").encode(["a protein binds"], 16)
assert weights.shape[0] == 1 and weights.max() > 0
print(sorted(m for m in sys.modules if m.split(".")[0] == "transformers"))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_only_what_the_packed_attention_computes_is_packed():
    """Packed on CUDA in 16-bit only: an encoder of a listed family whose heads flash attention takes. ModernBERT's
    local attention windows, a decoder's causal attention and heads of 18 are not what it computes."""
    from transformers import AutoModelForMaskedLM

    def body(kind: str, **changes) -> torch.nn.Module:
        config = config_for(kind, 100)
        for name, value in changes.items():
            setattr(config, name, value)
        return AutoModelForMaskedLM.from_config(config)

    bert = body("bert")
    assert packed.packs(bert, "cuda", torch.bfloat16) and packed.packs(bert, "cuda:1", torch.float16)
    assert not packed.packs(bert, "cpu", torch.bfloat16) and not packed.packs(bert, "cuda", torch.float32)
    assert all(packed.packs(body(kind), "cuda", torch.bfloat16) for kind in PACKED_FAMILIES)
    assert "modernbert" not in PACKED_FAMILIES and not packed.packs(body("modernbert"), "cuda", torch.bfloat16)
    assert not packed.packs(body("roberta", is_decoder=True), "cuda", torch.bfloat16)
    assert not packed.packs(body("bert", hidden_size=36), "cuda", torch.bfloat16)  # 2 heads of 18


@pytest.mark.slow  # seconds each under the interpreter
@needs_interpreter
@pytest.mark.parametrize("kind", KINDS)
def test_family_triton_kernel_equals_the_full_masked_lm(kind, tmp_path):
    path, mlm, tokenizer = save_masked_lm(kind, tmp_path, pickled=False, seed=1)
    model = load_model(str(path))
    got = SpladeEncoder(model, max_tokens=40, backend="triton").encode(TEXTS, max_length=24)
    torch.testing.assert_close(got.double(), reference_weights(mlm, tokenizer, TEXTS, 24), rtol=3e-4, atol=3e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_the_warm_up_documents_fit_every_family(kind, tmp_path):
    """The warm-up's made-up documents stay inside the model's positions and embedding rows at the longest length a
    run may ask for (here 64 or 66 positions): on a GPU an index past either is a device-side assert that ends the
    process. Their CPU path raises instead, so they are run through it."""
    path, _, _ = save_masked_lm(kind, tmp_path, pickled=False)
    model = load_model(str(path))
    limit = ModelRef.resolve(str(path)).max_length()
    encoder = SpladeEncoder(model, max_tokens=128, backend="torch")
    for length in (limit, 2):
        tokens = made_up_tokens(300, length, model.body)
        assert tokens.lengths.sum() == len(tokens.ids) == 300 and tokens.lengths.min() > 0
        assert tokens.lengths.max() <= min(128, length)
        assert tokens.ids.max() < model.body.get_input_embeddings().num_embeddings
        assert sum(len(positions) for positions, _ in encoder.encode_ids(tokens)) == len(tokens.lengths)


def test_the_warm_up_documents_avoid_the_special_ids_of_a_large_vocabulary(tmp_path):
    """With 2,000 embedding rows or more the made-up ids skip the first 1,000 (where [PAD], [CLS], [MASK] live) and
    stay inside the embedding; the body and head take them."""
    path, _, _ = save_masked_lm("bert", tmp_path, pickled=False, extra_rows=2000)
    model = load_model(str(path))
    tokens = made_up_tokens(1500, 256, model.body)
    assert tokens.ids.min() == 1000 and tokens.ids.max() == 1999 < model.body.get_input_embeddings().num_embeddings
    assert list(tokens.lengths) == [64] * 23 + [28]  # 66 positions: 64 a document
    encoder = SpladeEncoder(model, max_tokens=512, backend="torch")
    assert sum(len(positions) for positions, _ in encoder.encode_ids(tokens)) == 24
    with pytest.raises(ValueError, match="at least one token"):
        made_up_tokens(0, 256, model.body)


def test_decoder_rows_past_the_tokenizer_are_dropped(tmp_path):
    """ModernBERT-style: the decoder is padded past the tokenizer (as 50,368 rows for 50,280 tokens)."""
    path, mlm, tokenizer = save_masked_lm("modernbert", tmp_path, pickled=False, extra_rows=13)
    model = load_model(str(path))
    assert model.vocab_size == len(tokenizer) and len(model.vocab) == model.vocab_size
    got = SpladeEncoder(model, backend="torch").encode(TEXTS, max_length=24)
    torch.testing.assert_close(got.double(), reference_weights(mlm, tokenizer, TEXTS, 24)[:, :len(tokenizer)],
                               rtol=1e-4, atol=1e-4)


def test_decoder_rows_without_a_token_are_never_emitted(tmp_path):
    """A hole inside the tokenizer's range (an id no term maps to) gets a -inf bias, so it weighs 0 whatever its
    logits, and a placeholder term (the index's vocabulary has no empty term)."""
    path, _, _ = save_masked_lm("bert", tmp_path, pickled=False)
    spec = json.loads((path / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    hole = vocab.pop("protein")  # the id stays inside the range, but no term maps to it any more
    (path / "tokenizer.json").write_text(json.dumps(spec))
    model = load_model(str(path))
    assert model.bias[hole] == float("-inf") and model.vocab[hole].startswith("[lsr-index:no-token-")
    assert (SpladeEncoder(model, backend="torch").encode(TEXTS, max_length=24)[:, hole] == 0).all()


def test_token_ids_past_the_decoder_are_refused(tmp_path):
    path, _, tokenizer = save_masked_lm("bert", tmp_path, pickled=False)
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
    path, _, _ = save_masked_lm("bert", tmp_path, pickled=False)
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


@pytest.mark.parametrize(("pooling", "activation"), [("max", "relu"), ("max", "log1p_relu"), ("sum", "relu")])
def test_sentence_transformers_directory_honours_its_pooling(tmp_path, pooling, activation):
    path, mlm, tokenizer = save_masked_lm("distilbert", tmp_path, pickled=False)
    sentence_transformers_dir(path, {"pooling_strategy": pooling, "activation_function": activation,
                                  "word_embedding_dimension": len(tokenizer)})
    model = load_model(str(path))
    ours = "log1p_log1p_relu" if activation == "log1p_relu" else "log1p_relu"
    assert (model.pooling, model.activation) == (pooling, ours)
    got = SpladeEncoder(model, max_tokens=40, backend="torch").encode(TEXTS, max_length=24)
    torch.testing.assert_close(got.double(), reference_weights(mlm, tokenizer, TEXTS, 24, ours, pooling),
                               rtol=1e-4, atol=1e-4)


def test_sentence_transformers_fill_mask_transformer_and_defaults(tmp_path):
    path, mlm, tokenizer = save_masked_lm("roberta", tmp_path, pickled=True)
    sentence_transformers_dir(path, None, transformer="Transformer")
    model = load_model(str(path))
    assert (model.pooling, model.activation) == ("max", "log1p_relu")
    got = SpladeEncoder(model, backend="torch").encode(TEXTS, max_length=24)
    torch.testing.assert_close(got.double(), reference_weights(mlm, tokenizer, TEXTS, 24), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("damage", ["module", "lowercase", "activation", "not fill-mask"])
def test_sentence_transformers_directories_it_cannot_honour_are_refused(tmp_path, damage):
    path, _, _ = save_masked_lm("bert", tmp_path, pickled=False)
    sentence_transformers_dir(path, {"activation_function": "softplus" if damage == "activation" else "relu"},
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


# --- a SparseEncoder directory's own lengths ------------------------------------------------------------------------

LONG_TEXTS = ["Vitamin D and fracture risk in older adults " * 40, "gene mutation of cancer cells " * 30, "a protein"]


def sparse_encoder_reference(directory, mlm, tokenizer, texts: list[str], task: str) -> torch.Tensor:
    """What sentence-transformers' SparseEncoder gives, by its documented rules, with plain transformers:
    encode_document / encode_query truncate at the Transformer module's `document_length` / `query_length`
    (sentence-transformers 6), else at `max_seq_length` (the tokenizer's model_max_length it sets), then the
    MLM's logits pooled by SpladePooling (max of log1p(relu) over the real tokens)."""
    config = json.loads((directory / "sentence_bert_config.json").read_text())
    length = config.get(f"{task}_length") or config["max_seq_length"]
    return reference_weights(mlm, tokenizer, texts, length)


@pytest.mark.parametrize("saved", [{"max_seq_length": 128},
                                   {"max_seq_length": 128, "document_length": 100, "query_length": 16}],
                         ids=["max_seq_length", "document_and_query_lengths"])
def test_a_sparse_encoder_directory_is_encoded_at_its_own_lengths(tmp_path, saved):
    """A SparseEncoder saved with max_seq_length 128 must not be encoded at 256 (--doc-max-length's default), nor its
    document_length / query_length ignored without a word: its own lengths are what `ModelRef.lengths` gives for
    the encode defaults, the vectors at them equal the reference client's, and any other length given is said
    in one line."""
    path, mlm, tokenizer = save_masked_lm("bert", tmp_path, pickled=False, positions=300)
    sentence_transformers_dir(path, {"pooling_strategy": "max", "activation_function": "relu"})
    (path / "sentence_bert_config.json").write_text(json.dumps({"do_lower_case": False, **saved}))
    ref = ModelRef.resolve(str(path))
    lengths = ref.lengths()
    assert (lengths.document, lengths.query) == (saved.get("document_length", 128), saved.get("query_length", 128))
    encoder = SpladeEncoder(load_model(ref), max_tokens=4096, backend="torch")
    for task, length in (("document", lengths.document), ("query", lengths.query)):
        want = sparse_encoder_reference(path, mlm, tokenizer, LONG_TEXTS, task)
        torch.testing.assert_close(encoder.encode(LONG_TEXTS, max_length=length).double(), want, rtol=1e-4,
                                   atol=1e-4)
        assert not torch.allclose(encoder.encode(LONG_TEXTS, max_length=256).double(), want, atol=1e-3)
    assert ref.length_notes(lengths.document, lengths.query) == []
    notes = ref.length_notes(256, 64)
    assert notes[0] == (f"{path}: {path / 'sentence_bert_config.json'} truncates documents at {lengths.document} "
                        "tokens; encoding them at 256 gives other vectors than sentence-transformers (pass "
                        f"--doc-max-length {lengths.document} to match it)")
    assert len(notes) == 2 and notes[1].endswith(f"(pass --query-max-length {lengths.query} to match it)")


def test_a_plain_transformers_directory_says_no_length(tmp_path):
    path, _, _ = save_masked_lm("bert", tmp_path, pickled=False)
    ref = ModelRef.resolve(str(path))
    assert (ref.lengths().document, ref.lengths().query) == (None, None) and ref.length_notes(256, 64) == []


@pytest.mark.parametrize(("config", "what"), [
    ({"prompts": {"query": "query: ", "document": ""}}, "'query: ' before queries"),
    ({"prompts": {"query": "", "passage": "passage: "}}, "'passage: ' before documents"),
    ({"prompts": {"search": "x: "}, "default_prompt_name": "search"}, "'x: ' before queries"),
])
def test_a_sparse_encoder_saved_with_prompts_is_refused_naming_them(tmp_path, config, what):
    path, _, _ = save_masked_lm("bert", tmp_path, pickled=False)
    sentence_transformers_dir(path, None)
    (path / "config_sentence_transformers.json").write_text(json.dumps(config))
    with pytest.raises(LsrIndexError, match=f"config_sentence_transformers.json: sentence-transformers puts the "
                                            f"prompt {what}; lsr-index does not"):
        ModelRef.resolve(str(path))
    (path / "config_sentence_transformers.json").write_text(json.dumps({"prompts": {"query": "", "document": ""}}))
    ModelRef.resolve(str(path))
