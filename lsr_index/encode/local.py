"""Executors only schedule: each runs the one encode task (encode.task.ShardEncoder) on its devices and hands
every event back to the planner, which alone writes the manifest (cluster.py is the cluster's executor)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import queue
import shutil
import signal
import sys
import threading
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import BinaryIO

from lsr_index.encode.job import Assignment, EncodeJob
from lsr_index.encode.task import ShardEncoder, WorkerResult
from lsr_index.errors import LsrIndexError
from lsr_index.runtime.children import PythonChild, end_with_stdin, relay, send_message
from lsr_index.vectors.manifest import Part
from lsr_index.vectors.shards import claims_dir


def run_in_process(job: EncodeJob, out: Path, devices: tuple[str, ...], assignment: Assignment,
                   on_part: Callable[[Part], None], on_progress: Callable[[int, int], None]) -> list[WorkerResult]:
    with closing(ShardEncoder(job, devices[0], os.cpu_count() or 1)) as encoder:
        return [encoder.run(out, assignment, on_part, on_progress)]


def worker_main(out: BinaryIO) -> None:
    """A local encoding worker (a PythonChild): (job, output, device, assignment) from stdin, then its events as
    ("part", Part), ("progress", (docs, tokens)), ("done", WorkerResult) or ("error", one line)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and ends its workers
    lock = threading.Lock()  # parts and progress come from the encoder's threads

    def send(*message: object) -> None:
        with lock:
            send_message(out, *message)

    try:
        job, output, device, assignment = pickle.load(sys.stdin.buffer)
    except EOFError:
        os._exit(1)  # the parent ended while sending
    except Exception as exc:  # e.g. a class the job holds, defined in the script run: not importable here
        send("error", f"{sys.argv[3]} could not read its job ({type(exc).__name__}: {exc}): what a job holds must "
                      "be importable, not defined in the script that runs")
        os._exit(1)
    threading.Thread(target=end_with_stdin, daemon=True).start()
    cores = max(1, (os.cpu_count() or 1) // assignment.workers)
    # the Rust tokenizer's thread pool and torch's take every core by default: W workers would oversubscribe them
    os.environ.setdefault("RAYON_NUM_THREADS", str(cores))
    import torch

    torch.set_num_threads(cores)
    try:
        with closing(ShardEncoder(job, device, cores)) as encoder:
            result = encoder.run(output, assignment, emit=lambda part: send("part", part),
                                 progress=lambda docs, tokens: send("progress", (docs, tokens)))
        send("done", result)
    except BrokenPipeError:
        os._exit(1)  # the parent stopped reading: nobody to tell
    except LsrIndexError as exc:
        send("error", str(exc))
    except BaseException as exc:
        send("error", f"worker on {device} failed: {type(exc).__name__}: {exc}")


def _record_queued(inbox: queue.SimpleQueue, on_part: Callable[[Part], None]) -> None:
    """The parts workers published before one failed, still queued: recorded, so that a rerun keeps them."""
    while True:
        try:
            kind, body = inbox.get_nowait()
        except queue.Empty:
            return
        if kind == "part":
            on_part(body)


def _forks_workers(devices: tuple[str, ...]) -> bool:
    """Whether the workers start as forks of this process (PythonChild(fork=True)): GPU workers on Linux, while this
    process runs no other thread (a fork copies only the calling thread: a lock another one held would stay locked in
    the child) and has not initialized CUDA (a forked child cannot use it then). CPU workers start afresh: a fork
    after torch's OpenMP pool has run can hang in the child's first parallel region."""
    if sys.platform != "linux" or not all(d.startswith("cuda") for d in devices) or threading.active_count() > 1:
        return False
    try:  # CUDA's driver, asked without initializing it: torch.cuda.is_available() would have, and so might a caller
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False  # no driver to load here: the workers will say so from a fresh start
    count = ctypes.c_int()
    return cuda.cuDeviceGetCount(ctypes.byref(count)) == _CUDA_ERROR_NOT_INITIALIZED


_CUDA_ERROR_NOT_INITIALIZED = 3


def run_local_workers(job: EncodeJob, out: Path, devices: tuple[str, ...], assignment: Assignment,
                      on_part: Callable[[Part], None], on_progress: Callable[[int, int], None],
                      on_idle: Callable[[], None]) -> list[WorkerResult]:
    """One process per device, sharing the shards by claims (Assignment.mine) in a directory of this run. Each is a
    PythonChild, forked where that is safe (_forks_workers) with the model's code imported here first, else a new
    interpreter: multiprocessing's spawn would run the caller's script again in each (twice the encode, from a script
    without a main guard)."""
    claims = out / claims_dir(str(os.getpid()))
    claims.mkdir()
    try:
        return _run_workers(job, out, devices, assignment.split(len(devices), claims), on_part, on_progress, on_idle)
    finally:  # the workers have ended: no claim is made after this
        shutil.rmtree(claims, ignore_errors=True)


def _run_workers(job: EncodeJob, out: Path, devices: tuple[str, ...], assignments: list[Assignment],
                 on_part: Callable[[Part], None], on_progress: Callable[[int, int], None],
                 on_idle: Callable[[], None]) -> list[WorkerResult]:
    workers: list[PythonChild] = []
    results: list[WorkerResult] = []
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    fork = _forks_workers(devices)
    if fork:  # once here instead of once in each worker
        from lsr_index.model import encoder  # noqa: F401 (torch, triton and the kernel, imported for the forks)
        from lsr_index.model.load import import_model_code

        import_model_code(job.model.here())
        fork = _forks_workers(devices)  # again: what was imported may have started a thread or CUDA
    try:
        for device, part in zip(devices, assignments):
            worker = PythonChild("lsr_index.encode.local:worker_main", f"the encoding worker on {device}", fork=fork)
            workers.append(worker)
            with contextlib.suppress(OSError):  # dead already: its relay says so
                pickle.dump((job, out, device, part), worker.stdin)
                worker.stdin.flush()
        for worker in workers:  # once all are forked: a relay running beside a fork would make it unsafe
            threading.Thread(target=relay, args=(worker, inbox), daemon=True).start()
        while len(results) < len(workers):
            try:
                kind, body = inbox.get(timeout=1.0)
            except queue.Empty:
                on_idle()
                continue
            if kind == "part":
                on_part(body)
            elif kind == "progress":
                on_progress(*body)
            elif kind == "done":
                body.started = "fork" if fork else "new interpreter"
                results.append(body)
            else:
                _record_queued(inbox, on_part)
                if kind == "gone":
                    raise LsrIndexError(f"{body.what} died (exit code {body.exit_code(5)}); rerun the same command "
                                        "to resume")
                raise LsrIndexError(body)
    finally:
        for worker in workers:
            worker.close(finished=len(results) == len(workers))
    return sorted(results, key=lambda r: r.worker)
