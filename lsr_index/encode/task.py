"""The one encode task: "encode the units I claim of this job" (ShardEncoder.run), run in-process, in a local worker
process, or by a cluster's actor (which loads the model once and runs the task once per shard, on pieces its driver
read). It encodes the pieces not encoded yet and reports each chunk it writes through `emit`; it never touches the
manifest.

Within a task, reading+tokenizing (feed.py), the model, and serializing+writing (sink.py) run side by side: in
threads, or beside a GPU with reading and tokenizing in a process of their own and serializing in a pool of
processes (vectors.serializers).
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from lsr_index.encode.feed import (
    Feed,
    InputProcess,
    close_all,
    input_children,
    readers_for,
    reads_in_a_process,
    serialized_tokenizer,
    tokenize_pieces,
    tokenized_pieces,
)
from lsr_index.encode.job import Assignment, EncodeJob, Piece, PieceStats
from lsr_index.encode.sink import ChunkSink
from lsr_index.encode.units import RemoteUnits, Units
from lsr_index.model.tokens import TextTokenizer, Tokens
from lsr_index.runtime.threads import Prefetch
from lsr_index.runtime.timeline import mark
from lsr_index.vectors.manifest import Chunk
from lsr_index.vectors.quantize import SparseVectors, quantize
from lsr_index.vectors.serializers import SerializerPool
from lsr_index.vectors.shards import check_vocab


@dataclass
class WorkerResult:
    tokens: int
    worker: int = 0
    device: str = "cpu"
    docs: int = 0  # documents this worker encoded
    loaded_at: float = 0.0  # time.time() when its model was on the device (process start, imports, load)
    ready_at: float = 0.0  # time.time() when its first batch started (model loaded, first tokens read)
    done_at: float = 0.0
    cores: int = 0  # the host cores it was given (its serializers, torch's threads, the tokenizer's)
    serializers: int = 0  # processes serializing its vectors beside it
    readers: int = 0  # processes reading and tokenizing its input beside it (0: threads of its own process)
    started: str = "in process"  # or "fork", "new interpreter", "ray actor": how its process started
    input_wait: float = 0.0  # seconds after its first piece that the model waited for the next tokenized piece
    output_wait: float = 0.0  # seconds it waited for the writer to take a piece's vectors (serializers behind)




class ShardEncoder:
    """The model on one device, loaded once: a local worker runs it once, a cluster's actor once per shard.

    The weights load in a background thread while `run` already reads and tokenizes the first pieces (the
    tokenizer and the vocabulary come first, from the tokenizer files): the model's load and the first piece's
    reading, each about as long, overlap instead of adding up before the first batch."""

    def __init__(self, job: EncodeJob, device: str, cores: int, reads_input: bool = True, name: str | None = None):
        """`reads_input=False`: every run gets its pieces from the caller (a cluster's driver reads the input).
        `name`: the device as the caller knows it, for the timeline and the result (a worker that sees only its own
        GPU runs on cuda:0)."""
        self.name = name or device
        if not device.startswith("cuda"):
            _reuse_freed_memory()
        self.pool: SerializerPool | None = None
        # the input processes start first: their interpreter and imports (a fraction of a second) pass while the
        # tokenizer, the vocabulary and the serializers are made here; `run` hands them their work
        self.input_children = input_children(readers_for(cores)) if reads_input and reads_in_a_process(device) \
            else []
        try:
            self._setup(job, device, cores)
        except BaseException:
            self.close()
            raise

    def _setup(self, job: EncodeJob, device: str, cores: int) -> None:
        self.model = model = job.model.here()
        tokenizer = model.backend()
        vocab = model.terms()[0]  # what the model's vocabulary will be: its tokenizer's terms
        check_vocab(vocab)
        self.job, self.device, self.cores, self.loaded_at = job, device, cores, 0.0
        self.vocab = np.array(vocab, dtype=object)
        self.tokenizer = TextTokenizer(tokenizer.tokenizer)
        self._encoder: Future = Future()
        threading.Thread(target=self._load, args=(tokenizer,), name="model-load", daemon=True).start()
        # a GPU outpaces the JSON/gzip serialization of its vectors: half its host cores serialize beside it, in
        # processes started once (a cluster's encoder runs the task once per shard)
        self.serializers = min(8, max(1, cores // 2)) if device.startswith("cuda") else 0
        self.pool = SerializerPool(self.serializers, vocab) if self.serializers and \
            job.options.output_format != "parquet" else None
        mark(f"tokenizer and {self.serializers} serializer(s) ready for {self.name}")

    def _load(self, tokenizer: object) -> None:
        try:  # whatever fails here is raised where the encoder is first used: nothing waits forever for it
            if self.device.startswith("cuda"):
                _expandable_cuda_memory()
            import torch

            import sparton
            from lsr_index.model.encoder import SpladeEncoder
            from lsr_index.model.load import load_model

            # torch's own default is every core of the machine, not the cores this process may use: threads beyond
            # those wait on each other at every parallel region
            torch.set_num_threads(self.cores)
            cuda = self.device.startswith("cuda")
            with ThreadPoolExecutor(1, thread_name_prefix="kernel-prepare") as beside:
                # the Triton head will run: its cache key (a hash of Triton's library) from the start, beside CUDA's
                # set-up and the load
                prepared = beside.submit(sparton.prepare) if cuda and self.job.options.backend != "torch" else None
                if cuda:
                    torch.cuda.set_device(self.device)
                    mark(f"CUDA ready on {self.name}")
                model = load_model(self.model, device=self.device, dtype=getattr(torch, self.job.dtype),
                                   tokenizer=tokenizer)
                mark(f"weights on {self.name}")
                if prepared:
                    prepared.result()
            self.loaded_at = time.time()
            mark(f"model on {self.name}")
            encoder = SpladeEncoder(model, max_tokens=self.job.options.max_tokens, backend=self.job.options.backend,
                                    tokenizer=self.tokenizer)
            encoder.warm_up(self.job.options.doc_max_length, partial(quantize, q=self.job.options.quantization))
            mark(f"model warmed up on {self.name}")
            self._encoder.set_result(encoder)
        except BaseException as exc:
            self._encoder.set_exception(exc)

    @property
    def encoder(self):
        """The SpladeEncoder, once the model has loaded (its loading error, if it failed)."""
        encoder = self._encoder.result()
        import torch

        if self.device.startswith("cuda"):
            torch.cuda.set_device(self.device)  # Triton launches on the calling thread's current device
        else:  # OpenMP keeps a thread count per thread: the load's setting does not reach the thread that encodes
            torch.set_num_threads(self.cores)
        return encoder

    def close(self) -> None:
        """End the serializer processes (after a success they have no work left: `run` collects every result) and an
        input process that no run took, then wait for a model load still under way: transformers builds a model under
        process-wide settings (the default dtype, patched torch functions), so a load left running after a failed run
        broke the caller's next model load (weights left on the meta device: model.load._BUILDING)."""
        if self.pool:
            self.pool.close()
        close_all(self.input_children)
        if loading := getattr(self, "_encoder", None):
            wait([loading])

    def run(self, out: Path, assignment: Assignment, units: Units | RemoteUnits | None, emit: Callable[[Chunk], None],
            progress: Callable[[int, int], None], source: Iterable[Feed] | None = None, worker: int = 0
            ) -> WorkerResult:
        """Encode the units this task claims from `units` into `out`, leaving out what `assignment` has encoded
        already; `emit` receives each chunk written. With `source` instead (pieces a driver read and numbered, with
        their ids and texts), it reads nothing."""
        job, options = self.job, self.job.options
        ready_at = 0.0
        # a tokenizer that cannot be serialized (a custom Python pre-tokenizer) keeps to threads
        in_a_process = source is None and reads_in_a_process(self.device)
        tokenizer_json = serialized_tokenizer(self.tokenizer) if in_a_process else None
        child = tokenizer_json is not None
        sink: ChunkSink | None = None
        spare, self.input_children = self.input_children, []  # a cluster's actor runs again: new ones then
        if not child:
            close_all(spare)
        # reading and tokenizing begin now, while the model loads. In threads, one piece is read beside the load, no
        # more: the load is Python work too, and reading further ahead took the GIL from it
        if child:
            spare = spare or input_children(readers_for(self.cores))
            stream = InputProcess(job, assignment, units, tokenizer_json, spare,
                                  threads=max(1, self.cores // len(spare)))
        elif source is not None:
            stream = Prefetch(tokenize_pieces(source, self.tokenizer, options.doc_max_length), name="tokenize")
        else:
            stream = Prefetch(tokenized_pieces(job, assignment, units, self.tokenizer,
                                               after_each=lambda: wait([self._encoder])), name="tokenize")
        pending: dict[int, tuple[Piece, list[str], Tokens, PieceStats, list, float]] = {}
        waits = {"input": 0.0, "output": 0.0}

        def to_encode() -> Iterator[tuple[int, Tokens]]:
            nonlocal ready_at
            asked = time.perf_counter()
            for n, (piece, ids, tokens, stats) in enumerate(stream):
                if ready_at:
                    waits["input"] += time.perf_counter() - asked
                else:
                    ready_at = time.time()
                    mark(f"first piece on {self.name}")
                pending[n] = (piece, ids, tokens, stats, [], time.monotonic())
                yield n, tokens
                asked = time.perf_counter()

        try:
            encoder = self.encoder
            docs0, tokens0 = encoder.n_docs, encoder.n_tokens
            sink = ChunkSink(out, job, self.vocab, emit, self.pool, self.serializers)
            quantizer = partial(quantize, q=options.quantization)
            for n, positions, part in encoder.encode_stream(to_encode(), quantizer):
                piece, ids, tokens, stats, parts, started = pending[n]
                if positions is not None:
                    parts.append((positions, part))
                    progress(len(positions), int(tokens.lengths[positions].sum()))
                    continue
                del pending[n]
                vectors = SparseVectors.stack(parts, len(ids))
                handed = time.perf_counter()
                sink.put(piece, ids, vectors, stats, started)
                waits["output"] += time.perf_counter() - handed
        except BaseException:
            stream.close()
            if sink is not None:
                sink.close(wait=False)
            raise
        mark(f"last batch encoded on {self.name}")
        stream.close()
        sink.close()
        mark(f"vectors written on {self.name}")
        return WorkerResult(tokens=encoder.n_tokens - tokens0, worker=worker, device=self.name,
                            docs=encoder.n_docs - docs0, loaded_at=self.loaded_at, ready_at=ready_at or time.time(),
                            done_at=time.time(), cores=self.cores, serializers=self.serializers,
                            readers=len(spare) if child else 0,
                            input_wait=round(waits["input"], 3), output_wait=round(waits["output"], 3))


def _expandable_cuda_memory() -> None:
    """Let PyTorch's CUDA allocator grow segments instead of caching fixed-size blocks, unless the user set its
    options. Every length bucket has its own shape, and so do its activations and its [batch, vocabulary] output:
    fixed blocks fragment, and the allocator frees and allocates (cudaFree waits for the GPU); what growing segments
    gain end to end: docs/performance/encode.md, "Changes kept". Read at the allocator's first use: a process that
    used CUDA memory before keeps its settings."""
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")


def _reuse_freed_memory() -> None:
    """On CPU each batch allocates and frees blocks of tens of MB (the body's activations). glibc serves blocks past
    32 MB with mmap and unmaps them on free, so every such block faults in thousands of fresh zeroed pages, and system
    time becomes a large share of a CPU encode. Serving large blocks from the heap and keeping it across frees reuses
    those pages, for the same user time and bytes (tests/test_encode_robustness.py counts the faults).
    MALLOC_MMAP_MAX_=0 in the environment does the same from process start, and saves more."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc: nothing to tune
        return
    mallopt(-4, 0)  # M_MMAP_MAX: no block served by mmap
    mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD: keep up to 1 GiB of freed heap instead of returning it at once
