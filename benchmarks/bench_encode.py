"""End-to-end encoding throughput: lsr-index against what users run today, same model, same documents.

Peers (compute only: they write nothing, which favours them):
  - sentence-transformers SparseEncoder (MLMTransformer + SpladePooling), batch 64 and 256;
  - a plain transformers forward, batches sorted by length, eager SPLADE pooling, batch 256.
lsr-index: `encode_corpus` from a JSONL file to gzipped JsonVector shards on disk, model load included.

Models are random-weight BERT-base (V = 30,522) and XLM-R-base (V = 250,002) architectures whose decoder bias
is calibrated so that documents get ~200 nonzero impacts, like real SPLADE (random weights otherwise give
thousands and misrepresent the output stage). Workloads: synthetic ~60-token documents; real text
(SciFact repeated, ~240 tokens after truncation); optionally 1M documents with host memory sampled.

    python benchmarks/bench_encode.py --tokenizer DIR [--scifact DIR] [--sections ...] [--smoke]
writes benchmarks/results/encode_<GPU>.{json,csv,png} (encode_<GPU>_x<N> where `multi` runs on N GPUs).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import random
import resource
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from host_use import HostUse  # noqa: E402
from provenance import csv_line, png_metadata, provenance, with_provenance  # noqa: E402

PROVENANCE = provenance()  # before CUDA is initialized: read from nvidia-smi
TARGET_NNZ = 200


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def reset_peak(device: str) -> None:
    """Not in a process that has not used CUDA yet (run_lsr_index_fresh): nothing to reset, and CUDA initialized
    here would take its set-up out of lsr-index's start-up, which a user's run pays."""
    if device.startswith("cuda") and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_gb(device: str) -> float | None:
    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if device.startswith("cuda") else None


# ---------------------------------------------------------------- models and data

def make_tokenizer(source: Path, target: Path, vocab_size: int) -> None:
    """The BERT WordPiece tokenizer, its vocabulary padded with unused terms up to vocab_size."""
    target.mkdir(parents=True, exist_ok=True)
    spec = json.loads((source / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    for i in range(len(vocab), vocab_size):
        vocab[f"unused-term-{i}"] = i
    (target / "tokenizer.json").write_text(json.dumps(spec))
    shutil.copy(source / "tokenizer_config.json", target / "tokenizer_config.json")


def make_model(arch: str, target: Path, tokenizer: Path, device: str, smoke: bool, calib_texts: list[str]) -> Path:
    from transformers import AutoModelForMaskedLM, AutoTokenizer, BertConfig, XLMRobertaConfig

    size = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256) if smoke else \
        dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
    if arch == "bert-base":
        config = BertConfig(vocab_size=30522, **size)
    else:  # XLM-R base shape; pad id 0 to match the WordPiece tokenizer used for it here
        config = XLMRobertaConfig(vocab_size=250002, max_position_embeddings=514, type_vocab_size=1,
                                  pad_token_id=0, bos_token_id=2, eos_token_id=3, **size)
    make_tokenizer(tokenizer, target, config.vocab_size)
    torch.manual_seed(0)
    model = AutoModelForMaskedLM.from_config(config).to(device).eval()
    # calibrate: bias such that max_s logit + bias ≥ 0.005 (one impact unit) for ~TARGET_NNZ terms per document
    tok = AutoTokenizer.from_pretrained(target)
    batch = tok(calib_texts, truncation=True, max_length=256, padding=True, return_tensors="pt").to(device)
    decoder = model.get_output_embeddings()
    with torch.no_grad():
        decoder.bias.zero_()
        logits = model(**batch).logits.float().masked_fill(~batch["attention_mask"].bool()[..., None], -1e9)
        peaks = logits.amax(dim=1)  # [n, V]
        threshold = torch.quantile(peaks.flatten()[:2**24], 1 - TARGET_NNZ / config.vocab_size).item()
        decoder.bias.fill_(0.005 - threshold)
    model.save_pretrained(target, safe_serialization=True)
    return target


def words_from(tokenizer: Path) -> list[str]:
    vocab = json.loads((tokenizer / "tokenizer.json").read_text())["model"]["vocab"]
    return [w for w in vocab if w.isalpha() and w.isascii() and len(w) > 2]


def synthetic_corpus(path: Path, n: int, words: list[str], seed: int = 0) -> list[str]:
    """~60-token documents of random vocabulary words (most are one token)."""
    rng = random.Random(seed)
    texts = [" ".join(rng.choices(words, k=rng.randint(40, 70))) for _ in range(n)]
    with open(path, "w") as f:
        for i, text in enumerate(texts):
            f.write(json.dumps({"id": f"d{i}", "text": text}) + "\n")
    return texts


def real_corpus(path: Path, scifact: Path, min_docs: int) -> list[str]:
    docs = [json.loads(line) for line in (scifact / "corpus.jsonl").open()]
    texts = []
    with open(path, "w") as f:
        for rep in range(-(-min_docs // len(docs))):
            for d in docs:
                f.write(json.dumps({"id": f"{d['id']}-{rep}", "title": d["title"], "text": d["text"]}) + "\n")
                texts.append(f"{d['title']} {d['text']}")
    return texts


# ---------------------------------------------------------------- systems

def run_sentence_transformers(model_dir: Path, texts: list[str], batch: int, device: str, dtype) -> dict:
    from sentence_transformers.sparse_encoder import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    mlm = MLMTransformer(str(model_dir), max_seq_length=256, model_kwargs={"dtype": dtype})
    model = SparseEncoder(modules=[mlm, SpladePooling("max")], device=device)
    model.encode_document(texts[:batch], batch_size=batch, show_progress_bar=False)  # warm-up
    reset_peak(device)
    sync(device)
    t0 = time.perf_counter()
    model.encode_document(texts, batch_size=batch, show_progress_bar=False, convert_to_sparse_tensor=True)
    sync(device)
    seconds = time.perf_counter() - t0
    return {"docs": len(texts), "seconds": seconds, "peak_gpu_gb": peak_gb(device)}


def run_plain(model_dir: Path, texts: list[str], batch: int, device: str, dtype) -> dict:
    """A plain transformers forward: sorted by length, full logits, log1p(relu), mask, max."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForMaskedLM.from_pretrained(model_dir, dtype=dtype, use_safetensors=True).to(device).eval()

    def encode(subset: list[str]) -> int:
        lengths = [len(x) for x in tok(subset, truncation=True, max_length=256)["input_ids"]]
        order = sorted(range(len(subset)), key=lambda i: -lengths[i])
        nnz = 0
        with torch.inference_mode():
            for i in range(0, len(order), batch):
                enc = tok([subset[j] for j in order[i:i + batch]], truncation=True, max_length=256, padding=True,
                          return_tensors="pt").to(device)
                logits = model(**enc).logits
                w = (torch.log1p(torch.relu(logits)) * enc["attention_mask"][..., None]).amax(dim=1)
                nnz += int((torch.round(w.float() * 100) > 0).sum())
        return nnz

    encode(texts[:batch])
    reset_peak(device)
    sync(device)
    t0 = time.perf_counter()
    nnz = encode(texts)
    sync(device)
    seconds = time.perf_counter() - t0
    return {"docs": len(texts), "seconds": seconds, "peak_gpu_gb": peak_gb(device),
            "nonzeros_per_doc": nnz / len(texts)}


def run_lsr_model_only(model_dir: Path, texts: list[str], device: str, dtype, max_tokens: int) -> dict:
    """lsr-index's encoder and quantizer alone on pre-tokenized text: the ceiling the I/O stages must feed."""
    from lsr_index.model.encoder import SpladeEncoder
    from lsr_index.model.load import load_model
    from lsr_index.vectors.quantize import Quantization, quantize

    encoder = SpladeEncoder(load_model(str(model_dir), device=device, dtype=dtype), max_tokens=max_tokens)
    tokens = encoder.tokenize(texts, 256)
    reset_peak(device)
    sync(device)
    t0 = time.perf_counter()
    nnz = sum(v.nnz for _, v in encoder.encode_ids(tokens, then=lambda w: quantize(w, Quantization())))
    sync(device)
    return {"docs": len(texts), "seconds": time.perf_counter() - t0, "peak_gpu_gb": peak_gb(device),
            "nonzeros_per_doc": nnz / len(texts)}


class HostMemory:
    """Samples this process's resident memory once a second (to show it stays flat while streaming)."""

    def __init__(self):
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        t0 = time.perf_counter()
        while not self._stop.wait(1.0):
            with open("/proc/self/statm") as f:
                rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
            self.samples.append((round(time.perf_counter() - t0, 1), round(rss, 1)))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def shards_filesystem(path: Path) -> str:
    """The filesystem type under `path` (ext4, overlay, tmpfs...), from the longest mount point above it."""
    path.mkdir(parents=True, exist_ok=True)
    best, kind = "", "unknown"
    for line in Path("/proc/mounts").read_text().splitlines():
        point, fstype = line.split()[1:3]
        if str(path.resolve()).startswith(point) and len(point) > len(best):
            best, kind = point, fstype
    return kind


def run_lsr_index(model_dir: Path, corpus: Path, out: Path, devices: tuple[str, ...], dtype: str,
                  max_tokens: int, track_memory: bool = False) -> dict:
    from lsr_index.encode.job import EncodeJob, EncodeOptions
    from lsr_index.encode.run import encode_corpus

    in_process = len(devices) == 1  # else the workers' memory is theirs, and this process must not use CUDA
    if in_process:
        reset_peak(devices[0])
    memory = HostMemory() if track_memory else None
    usage0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()  # the model's resolution and identity are part of a run, as a user's run pays them
    job = EncodeJob(inputs=(str(corpus),), model=str(model_dir), dtype=dtype,
                    options=EncodeOptions(max_tokens=max_tokens, shard_docs=32768, overwrite=True, progress=False))
    if memory:
        with memory:
            manifest = encode_corpus(job, out, devices)
    else:
        manifest = encode_corpus(job, out, devices)
    seconds = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_SELF)  # this process's threads (not the serializer processes)
    result = {"docs": manifest.docs, "seconds": seconds, "peak_gpu_gb": peak_gb(devices[0]) if in_process else None,
              "cpu_user_seconds": round(usage.ru_utime - usage0.ru_utime, 1),
              "cpu_system_seconds": round(usage.ru_stime - usage0.ru_stime, 1),
              "nonzeros_per_doc": manifest.stats.nonzeros_per_doc,
              "per_worker": [asdict(w) for w in manifest.stats.per_worker],
              "bytes_on_disk": sum((out / s.file).stat().st_size for s in manifest.shards)}
    if memory:
        result["host_rss_mb"] = memory.samples
    shutil.rmtree(out)
    return result


_FRESH = """
import json, sys
sys.path.insert(0, sys.argv[1])
import bench_encode
from lsr_index.model.load import import_model_code
import lsr_index.model.encoder
args = json.loads(sys.argv[2])
args["devices"] = tuple(args["devices"])
from lsr_index.model.ref import ModelRef
import_model_code(ModelRef.resolve(args["model_dir"]))
paths = [bench_encode.Path(args.pop(k)) for k in ("model_dir", "corpus", "out")]
result = bench_encode.run_lsr_index(*paths, **args)
print("RESULT", json.dumps(result))
"""


def run_lsr_index_fresh(model_dir: Path, corpus: Path, out: Path, devices: tuple[str, ...], dtype: str,
                        max_tokens: int) -> dict:
    """run_lsr_index in a new process, as a user's run is: one that has imported lsr-index and its model's code (as
    the CLI has when it starts encoding; this one had for the rows above) and not used CUDA, so that the workers of
    several GPUs start as its forks (lsr_index.encode.local._forks_workers). One GPU runs the same way, side by side."""
    import subprocess

    args = {"model_dir": str(model_dir), "corpus": str(corpus), "out": str(out), "devices": list(devices),
            "dtype": dtype, "max_tokens": max_tokens}
    # -P: the tree on PYTHONPATH, not a checkout in the working directory (ab_trees.py --fresh runs two trees)
    run = subprocess.Popen([sys.executable, "-P", "-c", _FRESH, str(Path(__file__).parent), json.dumps(args)],
                           stdout=subprocess.PIPE, text=True)
    with HostUse(run.pid) as use:
        stdout, _ = run.communicate()
    if run.returncode:
        raise RuntimeError(f"lsr-index on {', '.join(devices)} failed ({run.returncode})")
    return {**json.loads(stdout.rsplit("RESULT ", 1)[1]), "host_use": use.summary()}


def timeline_of(stderr: str) -> list[tuple[float, str]]:
    """The steps a process printed with LSR_INDEX_TIMELINE set: (seconds since its start, step)."""
    import re

    return [(float(m[1]), m[2]) for m in re.finditer(r"timeline ([\d.]+) s: (.*)", stderr)]


def run_cli(corpus: Path, out: Path, gpus: int, command: Sequence[str] = (sys.executable, "-m", "lsr_index"),
            options: Sequence[str] = ()) -> dict:
    """`lsr-index encode CORPUS` as a user types it (the default model and flags) on the first `gpus` GPUs, timed
    from the command's start to its exit, with the summary's rates and the start-up's steps (LSR_INDEX_TIMELINE).
    `command`: what runs lsr-index's command line; `options`: flags added to the encode's."""
    import subprocess

    env = {**os.environ, "LSR_INDEX_TIMELINE": "1", "CUDA_VISIBLE_DEVICES": ",".join(map(str, range(gpus)))}
    t0 = time.perf_counter()
    proc = subprocess.Popen([*command, "-q", "encode", str(corpus), "-o", str(out), "--overwrite", *options],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    with HostUse(proc.pid) as use:
        stdout, stderr = proc.communicate()
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"lsr-index encode failed ({proc.returncode}): {stderr[-2000:]}")
    manifest = json.loads((out / "manifest.json").read_text())
    stats = manifest["stats"]
    started = max((w["startup_seconds"] for w in stats["per_worker"] if w["docs"]), default=0.0)
    timeline = timeline_of(stderr)
    shutil.rmtree(out)
    return {"docs": manifest["docs"], "seconds": seconds, "encode_seconds": stats["seconds"],
            "docs_per_second_encode_clock": stats["docs_per_second"],
            "docs_per_second_after_startup": round(stats["docs_this_run"] / max(stats["seconds"] - started, 1e-9), 1),
            "startup_seconds": started, "units": stats.get("units"),
            "per_worker": stats["per_worker"], "timeline": timeline, "summary": stdout.strip(),
            "host_use": use.summary()}


# ---------------------------------------------------------------- driver

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", type=Path, help="directory with a BERT tokenizer.json (required to measure)")
    parser.add_argument("--scifact", type=Path, help="BEIR SciFact directory (corpus.jsonl) for the real-text rows")
    parser.add_argument("--sections", default="bert,real,xlmr",
                        help="comma list of bert, real, xlmr, million, multi (1, 2 and every GPU), cli (the command "
                             "on SciFact x20 with 1, 2 and every GPU), cpu (splade-tiny on SciFact)")
    parser.add_argument("--smoke", action="store_true", help="tiny models and corpora: check the script on a CPU")
    parser.add_argument("--multi-docs", type=int, default=2_000_000,
                        help="documents for the multi-GPU rows (one GPU against all of them, on one stream)")
    parser.add_argument("--shards-dir", type=Path,
                        help="where the multi-GPU rows write their shards (default: a temporary directory); a tmpfs "
                             "such as /dev/shm takes the host's disk out of the measure")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--replot", type=Path, help="only redraw the PNG of an existing results JSON")
    args = parser.parse_args()
    if args.replot:
        saved = json.loads(args.replot.read_text())
        plot(saved["rows"], saved["meta"], args.replot.with_suffix(".png"))
        return
    if args.tokenizer is None:
        parser.error("--tokenizer is required to measure")
    sections = set(args.sections.split(","))
    from lsr_index.encode.task import _expandable_cuda_memory

    # before any CUDA memory is used: every system here then runs with the allocator an lsr-index run sets for itself
    _expandable_cuda_memory()
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    gpu = torch.cuda.get_device_name(0) if device != "cpu" else platform.processor() or "cpu"
    dtype, dtype_name = (torch.bfloat16, "bfloat16") if device != "cpu" else (torch.float32, "float32")
    scale = 64 if args.smoke else 1
    n_peer, n_lsr = 16384 // scale, 131072 // scale
    max_tokens = 131072 if device != "cpu" else 16384
    work = Path(tempfile.mkdtemp(prefix="bench-encode-"))
    import transformers
    import triton

    meta = {"device": gpu, "torch": torch.__version__, "transformers": transformers.__version__,
            "triton": triton.__version__, "python": sys.version.split()[0], "smoke": args.smoke,
            "max_tokens": max_tokens, "host_cores": os.cpu_count(), "gpus": torch.cuda.device_count(),
            "cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
            # set on GPU hosts whose packages ship without bytecode: unless a pycache prefix holds it (as a pip
            # install's own), every Python child compiles its imports anew, seconds for torch alone
            # (docs/performance/encode.md, "Start-up")
            "python_dont_write_bytecode": os.environ.get("PYTHONDONTWRITEBYTECODE"),
            "python_pycache_prefix": sys.pycache_prefix}
    name = "".join(c if c.isalnum() else "_" for c in gpu).strip("_") + ("_smoke" if args.smoke else "")
    if "multi" in sections and torch.cuda.device_count() >= 2:  # a host of several GPUs: its rows apart
        name += f"_x{torch.cuda.device_count()}"
    words = words_from(args.tokenizer)
    rows: list[dict] = []

    def record(workload: str, model: str, system: str, result: dict, **extra) -> None:
        row = {"workload": workload, "model": model, "system": system, **result, **extra,
               "docs_per_second": round(result["docs"] / result["seconds"], 1)}
        rows.append(row)
        save(rows, meta, args.out, name)
        workers = "".join(f" | {w['device']}: start-up {w['startup_seconds']:.1f} s (model loaded at "
                          f"{w['model_loaded_after_seconds']:.1f} s), then "
                          f"{w['docs_per_second_after_startup']:,.0f} docs/s (waited "
                          f"{w.get('input_wait_seconds', 0):.1f} s "
                          f"for input, {w.get('output_wait_seconds', 0):.1f} s for the writer)"
                          for w in row.get("per_worker", []))
        print(f"{workload:>10} {model:>10} {system:<34} {row['docs_per_second']:>10,.0f} docs/s  "
              f"peak GPU {row.get('peak_gpu_gb')} GB{workers}", flush=True)
        if use := row.get("host_use"):
            roles = ", ".join(f"{name} x{r['processes']} {r['cores_busy']} cores (busiest thread {r['busiest_thread']})"
                              for name, r in sorted(use["roles"].items()))
            print(f"{'':>10} host: {roles}; GPUs busy {use['gpus']} %", flush=True)

    def compare(workload: str, model: str, model_dir: Path, corpus: Path, texts: list[str], peers: bool = True,
                st_batches: tuple[int, ...] = (64, 256), n_peers: int = n_peer, plain_batch: int = 256) -> None:
        if device != "cpu":  # Triton's autotuning and compile caches (nothing to warm on a CPU)
            run_lsr_index(model_dir, corpus, work / "warm", (device,), dtype_name, max_tokens)
        record(workload, model, "lsr-index (file → shards)",
               run_lsr_index(model_dir, corpus, work / "out", (device,), dtype_name, max_tokens))
        record(workload, model, "lsr-index model only (no I/O)",
               run_lsr_model_only(model_dir, texts, device, dtype, max_tokens))
        if peers:
            for b in st_batches:
                record(workload, model, f"sentence-transformers b{b}",
                       run_sentence_transformers(model_dir, texts[:n_peers], b, device, dtype))
            record(workload, model, f"transformers sorted eager b{plain_batch}",
                   run_plain(model_dir, texts[:n_peers], plain_batch, device, dtype))

    synthetic = work / "synthetic.jsonl"
    texts = synthetic_corpus(synthetic, n_lsr, words)
    if sections & {"bert", "real", "million", "multi"}:
        bert = make_model("bert-base", work / "bert-base", args.tokenizer, device, args.smoke, texts[:256])
    if "bert" in sections:
        compare("synthetic", "bert-base", bert, synthetic, texts)
    if "real" in sections and args.scifact:
        real = work / "real.jsonl"
        real_texts = real_corpus(real, args.scifact, 100_000 // scale)
        compare("scifact", "bert-base", bert, real, real_texts, n_peers=4096 // scale, st_batches=(64,))
    if "xlmr" in sections:
        xlmr = make_model("xlmr-base", work / "xlmr-base", args.tokenizer, device, args.smoke, texts[:64])
        small = work / "synthetic-32k.jsonl"
        small_texts = synthetic_corpus(small, 32768 // scale, words, seed=1)
        compare("synthetic", "xlmr-base", xlmr, small, small_texts, n_peers=4096 // scale)
    if "multi" in sections and torch.cuda.device_count() >= 2:
        devices = tuple(f"cuda:{i}" for i in range(torch.cuda.device_count()))
        large = work / "synthetic-multi.jsonl"
        synthetic_corpus(large, args.multi_docs // scale, words, seed=3)
        run_lsr_index(bert, synthetic, work / "warm", (device,), dtype_name, max_tokens)
        shards = args.shards_dir or work
        counts = sorted({1, 2, len(devices)})  # one GPU, two, every one of the host: one stream, one call
        for used in (devices[:n] for n in counts):
            record(f"{args.multi_docs // scale:,} docs", "bert-base", f"lsr-index x{len(used)} GPU (file → shards)",
                   run_lsr_index_fresh(bert, large, shards / "out", used, dtype_name, max_tokens),
                   shards_on=shards_filesystem(shards))
    if "cli" in sections and args.scifact:  # the command a user runs: splade-tiny on real text, default flags
        sci20 = work / "sci20.jsonl"
        real_corpus(sci20, args.scifact, 100_000 // scale)
        counts = sorted({1, 2, max(1, torch.cuda.device_count())})
        run_cli(sci20, work / "cli", 1)  # Triton's caches and the page cache warm, as on a machine in use
        for n in counts:
            record(f"scifact x{-(-100_000 // scale // 5183)}", "splade-tiny", f"lsr-index CLI x{n} GPU",
                   run_cli(sci20, work / "cli", n))
    if "cpu" in sections and args.scifact:  # the real embedded model on real text, for CPU-only machines
        from lsr_index.model.ref import locate

        tiny = locate("splade-tiny")
        sample = work / "scifact.jsonl"  # lsr-index on the whole collection, the peers on its first 1,024 documents
        sample_texts = real_corpus(sample, args.scifact, 1)[:5183 // scale]
        with open(sample) as f:
            lines = f.readlines()[:len(sample_texts)]
        sample.write_text("".join(lines))
        compare("scifact", "splade-tiny", tiny, sample, sample_texts, st_batches=(32,), n_peers=1024 // scale,
                plain_batch=32)
    if "million" in sections:
        million = work / "million.jsonl"
        synthetic_corpus(million, 1_000_000 // scale, words, seed=2)
        record("1M stream", "bert-base", "lsr-index (file → shards)",
               run_lsr_index(bert, million, work / "out", (device,), dtype_name, max_tokens, track_memory=True))
    shutil.rmtree(work, ignore_errors=True)
    plot(rows, meta, args.out / f"encode_{name}.png")


def save(rows: list[dict], meta: dict, out: Path, name: str) -> None:
    """Rewritten after every row, so a run cut short still leaves what it measured."""
    meta["peak_host_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"encode_{name}.json").write_text(json.dumps(with_provenance({"meta": meta, "rows": rows}, PROVENANCE),
                                                         indent=2))
    with open(out / f"encode_{name}.csv", "w", newline="") as f:
        f.write(csv_line(PROVENANCE))
        fields = ["workload", "model", "system", "docs", "seconds", "docs_per_second", "peak_gpu_gb",
                  "nonzeros_per_doc", "bytes_on_disk", "cpu_user_seconds", "cpu_system_seconds"]
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def plot(rows: list[dict], meta: dict, path: Path) -> None:
    """Bars from zero, one panel per (workload, model); redraw from a results file with --replot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["workload"], r["model"]) for r in rows}, key=lambda g: [(r["workload"], r["model"])
                                                                                 for r in rows].index(g))
    fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 4), squeeze=False)
    for ax, (workload, model) in zip(axes[0], groups):
        sub = [r for r in rows if (r["workload"], r["model"]) == (workload, model)]
        ax.barh([r["system"] for r in sub], [r["docs_per_second"] for r in sub],
                color=["tab:red" if r["system"].startswith("lsr-index") else "tab:gray" for r in sub])
        ax.set_xlim(0, 1.25 * max(r["docs_per_second"] for r in sub))
        ax.set_xlabel("documents / s")
        ax.set_title(f"{model}, {workload}")
        for i, r in enumerate(sub):
            ax.text(r["docs_per_second"], i, f" {r['docs_per_second']:,.0f}", va="center", fontsize=8)
    fig.suptitle(f"SPLADE encoding throughput on {meta['device']} (torch {meta['torch']}, triton {meta['triton']})")
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata=png_metadata(PROVENANCE))


if __name__ == "__main__":
    main()
