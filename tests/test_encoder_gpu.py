"""On CUDA the encoder runs the Sparton kernel; its vectors must match the CPU path's (run: pytest -m gpu)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lsr_index.model.encoder import SpladeEncoder
from lsr_index.model.load import load_model
from lsr_index.vectors.manifest import Manifest
from lsr_index.vectors.quantize import Quantization, quantize

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

TEXTS = [f"protein {i} binds the receptor in cells " * (1 + i % 40) for i in range(300)] + ["x", "CRISPR"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_encoder_matches_cpu_encoder(dtype):
    cpu = SpladeEncoder(load_model("splade-tiny", device="cpu"), max_tokens=8192).encode(TEXTS, 256)
    gpu = SpladeEncoder(load_model("splade-tiny", device="cuda", dtype=dtype), max_tokens=8192,
                        backend="triton").encode(TEXTS, 256).cpu()
    rel = ((gpu - cpu).norm() / cpu.norm()).item()
    assert rel < (3e-3 if dtype == torch.float32 else 3e-2), rel
    a, b = quantize(cpu, Quantization()), quantize(gpu, Quantization())
    # nonzero terms may differ only where a weight sits at the rounding boundary (w·100 ≈ k + 0.5)
    agree = sum(len(set(a.row(i)[0]) & set(b.row(i)[0])) for i in range(len(TEXTS)))
    assert agree / max(a.nnz, b.nnz) > (0.995 if dtype == torch.float32 else 0.95)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_warm_up_leaves_the_counts_and_the_vectors_as_they_were(dtype):
    """The warm-up's made-up batches (a size that is not a multiple of its documents, and one past max_tokens) go
    through `then` and are neither counted nor kept; what is encoded after is what a cold encoder gives."""
    model = load_model("splade-tiny", device="cuda", dtype=dtype)
    cold = SpladeEncoder(model, max_tokens=2048).encode(TEXTS, 256)
    warm = SpladeEncoder(model, max_tokens=2048)
    seen = []
    warm.warm_up(40, then=lambda w: seen.append(w.shape) or w, sizes=(300, 5000))
    assert (warm.n_docs, warm.n_tokens) == (0, 0)
    assert sum(rows for rows, _ in seen) == 8 + 125 and {v for _, v in seen} == {model.vocab_size}
    torch.testing.assert_close(warm.encode(TEXTS, 256), cold, rtol=0, atol=0)


def test_a_run_writes_the_same_bytes_with_and_without_its_warm_up(tmp_path, monkeypatch):
    """Through the pipeline, which warms up in the model load's thread and encodes in the caller's, on the last
    visible GPU (cuda:1 where there is one: each thread must launch on it): the shards equal, byte for byte, those
    of a run whose warm-up does nothing."""
    import threading

    from lsr_index.encode.job import EncodeJob, EncodeOptions
    from lsr_index.encode.run import encode_corpus

    sample = Path(__file__).resolve().parents[1] / "data" / "sample" / "corpus.jsonl"
    device = f"cuda:{torch.cuda.device_count() - 1}"
    job = EncodeJob(inputs=(str(sample),), options=EncodeOptions(shard_docs=150, output_format="jsonl",
                                                                   progress=False))
    warm_up, threads = SpladeEncoder.warm_up, []

    def watched(self, *args, **kwargs):
        threads.append(threading.current_thread().name)
        return warm_up(self, *args, **kwargs)

    monkeypatch.setattr(SpladeEncoder, "warm_up", watched)
    warm = encode_corpus(job, tmp_path / "warm", (device,))
    assert threads == ["model-load"]
    monkeypatch.setattr(SpladeEncoder, "warm_up", lambda self, *args, **kwargs: None)
    cold = encode_corpus(job, tmp_path / "cold", (device,))
    assert [s.file for s in warm.shards] == [s.file for s in cold.shards] and len(warm.shards) == 3
    for shard in warm.shards:
        assert (tmp_path / "warm" / shard.file).read_bytes() == (tmp_path / "cold" / shard.file).read_bytes()


def test_stream_of_items_matches_each_item_alone_on_cuda():
    from test_encoder import _stream_vs_items

    _stream_vs_items(SpladeEncoder(load_model("splade-tiny", device="cuda"), max_tokens=512), seed=7)


def test_staged_copies_arrive_whole_while_their_buffers_are_reused():
    """Batch inputs go to the GPU through two page-locked buffers used in turn: every array must arrive exactly,
    whatever its dtype, shape or size (buffers grow), although the buffer it went through is refilled later."""
    import numpy as np

    from lsr_index.model.encoder import _Staging

    rng = np.random.default_rng(11)
    staging, device, sent, got = _Staging(), torch.device("cuda"), [], []
    for _ in range(40):
        rows, cols = int(rng.integers(0, 300)), int(rng.integers(0, 2000))
        arrays = [rng.integers(-2**40, 2**40, (rows, cols)), rng.random((rows, cols)) < 0.5,
                  rng.integers(0, 2**31 - 1, int(rng.integers(0, 5000))).astype(np.int32)]
        sent.append(arrays)
        got.append(staging.upload(arrays, device))
    torch.cuda.synchronize()
    for arrays, tensors in zip(sent, got):
        for a, t in zip(arrays, tensors):
            assert t.device.type == "cuda" and t.shape == a.shape and np.array_equal(t.cpu().numpy(), a)


def test_two_workers_on_one_gpu_write_what_one_writes(tmp_path):
    """Local workers (PythonChild processes, each with its own input process and serializers) on CUDA: the same
    shards as one worker, document for document, whichever worker took which units (a worker that loads its model
    late may find none left: how units divide among workers of any speed is the CPU tests' subject); terms agree
    but where a weight sits at a rounding boundary."""
    from lsr_index.encode.job import EncodeJob, EncodeOptions
    from lsr_index.encode.run import encode_corpus

    job = EncodeJob(inputs=(str(multi_unit_corpus(tmp_path)),),
                    options=EncodeOptions(shard_docs=1500, output_format="jsonl", progress=False))
    one = encode_corpus(job, tmp_path / "one", ("cuda:0",))
    two = encode_corpus(job, tmp_path / "two", ("cuda:0", "cuda:0"))
    assert two.stats.workers == 2 and two.stats.units == 6  # units of 1 MiB, to whichever worker asks first
    assert sum(w.docs for w in two.stats.per_worker) == 4000
    assert_same_shards(tmp_path / "one", one, tmp_path / "two", two)


def multi_unit_corpus(tmp_path: Path) -> Path:
    """The sample ten times over, ids made unique: 4,000 documents, 6.3 MB, six input units."""
    lines = (Path(__file__).resolve().parents[1] / "data" / "sample" / "corpus.jsonl").read_text().splitlines()
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(line.replace('{"id": "', f'{{"id": "{copy}-', 1) + "\n"
                              for copy in range(10) for line in lines))
    return corpus


def assert_same_shards(dir_a: Path, a: Manifest, dir_b: Path, b: Manifest) -> None:
    """The same shards document for document; terms agree but where a weight sits at a rounding boundary."""
    from lsr_index.vectors.shards import read_shard

    assert [(s.file, s.start, s.docs) for s in b.shards] == [(s.file, s.start, s.docs) for s in a.shards]
    same = total = 0
    for shard in a.shards:
        for (id_a, vec_a), (id_b, vec_b) in zip(read_shard(dir_a / shard.file), read_shard(dir_b / shard.file),
                                                strict=True):
            assert id_a == id_b
            same += len(vec_a.items() & vec_b.items())
            total += max(len(vec_a), len(vec_b))
    assert total > 0 and same / total > 0.99, same / total


@pytest.mark.parametrize("kind", ["bert", "distilbert", "roberta", "xlm-roberta"])
def test_packed_families_on_cuda_equal_the_full_masked_lm(kind, tmp_path):
    """On CUDA in 16-bit these families run packed (variable-length flash attention): the weights must be those of
    transformers' own padded forward in float64, for documents of many lengths batched together."""
    from tiny_models import TEXTS, reference_weights, save_masked_lm

    from lsr_index.model.packed import PACKED_FAMILIES

    assert kind in PACKED_FAMILIES
    path, mlm, tokenizer = save_masked_lm(kind, tmp_path, pickled=False, seed=3)
    model = load_model(str(path), device="cuda", dtype=torch.float16)
    assert model.packed
    texts = [*TEXTS, "protein binds " * 9, "cancer", "a gene of the older adults in a trial " * 3] * 7
    # the PyTorch head: the kernel takes hidden sizes from 64 in 16-bit, these bodies are 32 wide
    got = SpladeEncoder(model, max_tokens=256, backend="torch").encode(texts, 24).cpu().double()
    want = reference_weights(mlm.double(), tokenizer, texts, 24)
    rel = ((got - want).norm() / want.norm()).item()
    assert rel < 1e-2, rel


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_weights_converted_on_the_gpu_are_the_hosts_conversion(dtype, tmp_path):
    """A BERT-family checkpoint reaches the GPU in float32 and is converted there (model.family.load): each weight is
    bit for bit what converting it on the host gives, and so is the conversion of odd values (subnormals, ties,
    values past the type's largest)."""
    from tiny_models import save_masked_lm

    from lsr_index.model.family import FamilyMaskedLM
    from lsr_index.model.files import read_state_dict

    path, _, _ = save_masked_lm("bert", tmp_path, pickled=False, seed=7)
    state = read_state_dict(path)
    model = load_model(str(path), device="cuda", dtype=dtype)
    assert isinstance(model.body, FamilyMaskedLM)  # loaded by model.family, not by transformers
    params = dict(model.body.named_parameters())
    compared = [name for name in params if name in state]
    assert len(compared) > 20 and all(state[name].dtype == torch.float32 for name in compared)
    for name in compared:
        assert torch.equal(params[name].cpu(), state[name].to(dtype)), name
    edge = torch.tensor([1e-40, -1e-45, 3.4e38, 65504.0, 65520.0, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -9, float("inf")])
    assert torch.equal(edge.to("cuda").to(dtype).cpu(), edge.to(dtype))


@pytest.mark.parametrize("heads, width", [(12, 64), (4, 128), (3, 32)])
def test_packed_attention_is_the_flash_kernel_of_varlen_attn(heads, width):
    """packed.attend calls the flash kernel as torch.nn.attention.varlen.varlen_attn calls it, without the custom
    op's wrapper: the same values, bit for bit, for documents of odd lengths (one of a single token)."""
    from torch.nn.attention.varlen import varlen_attn

    from lsr_index.model.packed import attend

    g = torch.Generator(device="cuda").manual_seed(width)
    bounds = torch.tensor([0, 1, 18, 201, 202, 777], device="cuda", dtype=torch.int32)
    longest = int((bounds[1:] - bounds[:-1]).max())
    q, k, v = (torch.randn(777, heads, width, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    scale = width ** -0.5
    assert torch.equal(attend(q, k, v, bounds, longest, scale),
                       varlen_attn(q, k, v, bounds, bounds, longest, longest, scale=scale))
