"""Two GPUs of one host (run: pytest -m gpu tests/test_two_gpus.py on a machine with two): the kernel, the encoder
and the local workers each work on the device their tensors or their worker name, never on the calling thread's
current device (cuda:0 unless set), and write what one GPU writes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from test_encoder_gpu import assert_same_shards, multi_unit_corpus

import sparton
from lsr_index.encode.job import EncodeJob, EncodeOptions
from lsr_index.encode.run import encode_corpus
from lsr_index.model.encoder import SpladeEncoder
from lsr_index.model.load import load_model
from lsr_index.vectors.manifest import Manifest

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                 reason="needs two CUDA GPUs")]

TEXTS = [f"protein {i} binds the receptor in cells " * (1 + i % 40) for i in range(300)] + ["x", "CRISPR"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_kernel_runs_on_its_inputs_gpu_not_the_current_one(dtype, seed):
    torch.cuda.set_device(0)
    g = torch.Generator(device="cuda:1").manual_seed(seed)
    vocab, hidden = 30_522, 768
    w = (torch.randn(vocab, hidden, device="cuda:1", generator=g) / hidden**0.5).to(dtype)
    b = (torch.randn(vocab, device="cuda:1", generator=g) - 1.0).to(dtype)
    lengths = torch.randint(1, 200, (37,), device="cuda:1", generator=g)
    cu = torch.zeros(38, dtype=torch.int32, device="cuda:1")
    cu[1:] = lengths.cumsum(0)
    h = torch.randn(int(cu[-1]), hidden, device="cuda:1", generator=g).to(dtype)
    before = torch.cuda.memory_allocated(0)
    with torch.inference_mode():
        out = sparton.splade_max_packed(h, w, b, cu, backend="triton")
        torch.cuda.synchronize(1)
        assert torch.cuda.current_device() == 0 and torch.cuda.memory_allocated(0) == before  # nothing on cuda:0
        ref = sparton.splade_max_packed_reference(h.double(), w.double(), b.double(), cu)
    assert out.device == torch.device("cuda:1") and torch.isfinite(out).all()
    rel = ((out.double() - ref).norm() / ref.norm()).item()
    assert rel < (1e-3 if dtype != torch.float32 else 3e-4), f"rel err {rel:.2e} (seed {seed})"

def test_an_encoder_on_the_second_gpu_writes_what_one_on_the_first_writes():
    """What `search --device cuda:1` runs: the model, its copies, its events and its post-processing on cuda:1 while
    the thread's current device is cuda:0 (an event recorded on cuda:0's stream would let the side stream read
    weights before they exist)."""
    torch.cuda.set_device(0)
    first = SpladeEncoder(load_model("splade-tiny", device="cuda:0"), max_tokens=4096).encode(TEXTS, 256).cpu()
    before = torch.cuda.memory_allocated(0)
    second = SpladeEncoder(load_model("splade-tiny", device="cuda:1"), max_tokens=4096)
    for _ in range(3):  # several batches in flight, in turn through both staging buffers
        got = second.encode(TEXTS, 256)
        assert got.device == torch.device("cuda:1")
        torch.testing.assert_close(got.cpu(), first, rtol=1e-5, atol=1e-6)  # the same GPU model, the same kernels
    assert torch.cuda.current_device() == 0 and torch.cuda.memory_allocated(0) == before


def job(tmp_path: Path) -> EncodeJob:
    return EncodeJob(inputs=(str(multi_unit_corpus(tmp_path)),),
                     options=EncodeOptions(shard_docs=1500, output_format="jsonl", progress=False))


def test_two_workers_on_two_gpus_write_what_one_writes(tmp_path):
    """Started afresh: this process has used CUDA, so its workers cannot be its forks."""
    one = encode_corpus(job(tmp_path), tmp_path / "one", ("cuda:0",))
    two = encode_corpus(job(tmp_path), tmp_path / "two", ("cuda:0", "cuda:1"))
    assert [(w.device, w.started) for w in two.stats.per_worker] == \
        [("cuda:0", "new interpreter"), ("cuda:1", "new interpreter")]
    assert all(w.docs for w in two.stats.per_worker) and sum(w.docs for w in two.stats.per_worker) == 4000
    assert_same_shards(tmp_path / "one", one, tmp_path / "two", two)


FRESH = textwrap.dedent("""
    import sys
    from pathlib import Path
    from lsr_index.encode.job import EncodeJob, EncodeOptions
    from lsr_index.encode.run import encode_corpus
    options = EncodeOptions(shard_docs=1500, output_format="jsonl", progress=False)
    manifest = encode_corpus(EncodeJob(inputs=(sys.argv[1],), options=options), Path(sys.argv[2]), ("cuda:0", "cuda:1"))
    print(*[w.started for w in manifest.stats.per_worker])
""")


def test_the_workers_of_a_process_without_cuda_are_its_forks_and_write_what_one_gpu_writes(tmp_path):
    """As the CLI runs them: torch and transformers imported once, here, and not again in each worker."""
    corpus = multi_unit_corpus(tmp_path)
    run = subprocess.run([sys.executable, "-c", FRESH, str(corpus), str(tmp_path / "forked")], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    assert run.stdout.split() == ["fork", "fork"], run.stdout
    one = encode_corpus(job(tmp_path), tmp_path / "one", ("cuda:0",))
    assert_same_shards(tmp_path / "one", one, tmp_path / "forked", Manifest.load(tmp_path / "forked"))
