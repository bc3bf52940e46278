"""The local executor: the run's tasks on this machine's devices, in this process for one device, one worker
process per device for several. Every task claims input units from the plan's `Units` (a faster device claims
more), and every event comes back to the planner, which alone writes the manifest (cluster.py is the cluster's
executor)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import queue
import signal
import sys
import threading
from collections.abc import Callable
from contextlib import closing
from typing import BinaryIO

from lsr_index.encode.feed import listen
from lsr_index.encode.job import EncodeJob
from lsr_index.encode.plan import Plan
from lsr_index.encode.task import ShardEncoder, WorkerResult
from lsr_index.encode.units import RemoteUnits, Units
from lsr_index.errors import InputError, LsrIndexError
from lsr_index.runtime.children import PythonChild, relay, send_message
from lsr_index.runtime.threads import host_cores
from lsr_index.runtime.timeline import mark
from lsr_index.vectors.manifest import Chunk


class LocalExecutor:
    """A run's tasks on `devices` of this machine: one task in this process, or one worker process per device."""

    def __init__(self, devices: tuple[str, ...]):
        self.devices = devices

    def run(self, job: EncodeJob, plan: Plan, units: Units, progress: Callable[[int, int], None]
            ) -> list[WorkerResult]:
        assignment = plan.assignment()
        if len(self.devices) == 1:
            with closing(ShardEncoder(job, self.devices[0], job.options.threads or host_cores())) as encoder:
                return [encoder.run(plan.out, assignment, units, plan.record, progress)]
        return _run_workers(job, plan, units, self.devices, progress)

    def node_stats(self, seconds: float) -> None:
        return None


def worker_main(out: BinaryIO) -> None:
    """A local encoding worker (a PythonChild): (job, output, device, assignment, worker number, workers) from stdin,
    then the answers to its claims of units; its events as ("claim", worker), ("summary", worker, summary),
    ("part", Chunk), ("progress", (docs, tokens)), ("done", WorkerResult) or ("error", one line)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and ends its workers
    lock = threading.Lock()  # parts and progress come from the encoder's threads

    def send(*message: object) -> None:
        with lock:
            send_message(out, *message)

    try:
        job, output, device, assignment, worker, workers = pickle.load(sys.stdin.buffer)
    except EOFError:
        os._exit(1)  # the parent ended while sending
    except Exception as exc:  # e.g. a class the job holds, defined in the script run: not importable here
        send("error", f"{sys.argv[3]} could not read its job ({type(exc).__name__}: {exc}): what a job holds must "
                      "be importable, not defined in the script that runs")
        os._exit(1)
    units = RemoteUnits(lambda kind, *body: send(kind, worker, *body))
    threading.Thread(target=listen, args=(sys.stdin.buffer, units), daemon=True).start()
    cores = job.options.threads or max(1, host_cores() // workers)
    # the Rust tokenizer's thread pool takes every core by default: W workers would oversubscribe them (torch's
    # threads are set where the model loads: ShardEncoder)
    os.environ.setdefault("RAYON_NUM_THREADS", str(cores))
    try:
        with closing(ShardEncoder(job, only_its_gpu(device), cores, name=device)) as encoder:
            result = encoder.run(output, assignment, units, emit=lambda part: send("part", part),
                                 progress=lambda docs, tokens: send("progress", (docs, tokens)), worker=worker)
        send("done", result)
    except BrokenPipeError:
        os._exit(1)  # the parent stopped reading: nobody to tell
    except LsrIndexError as exc:
        send("error", str(exc))
    except BaseException as exc:
        send("error", f"worker on {device} failed: {type(exc).__name__}: {exc}")


def only_its_gpu(device: str) -> str:
    """A GPU worker's process sees only its own GPU: CUDA_VISIBLE_DEVICES is set here, before CUDA starts in this
    process (a fork of a process that has not started it, or a new interpreter), so that CUDA's set-up covers one
    device instead of each of the host's. Returns the device's name in this process (cuda:0). A CUDA_VISIBLE_DEVICES
    inherited from the caller keeps its meaning: cuda:k is its k-th entry."""
    if not device.startswith("cuda"):
        return device
    index = int(device.partition(":")[2] or 0)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    entries = [entry.strip() for entry in visible.split(",")] if visible is not None else None
    if entries is not None and not 0 <= index < len(entries):
        return device  # not a device of this host: CUDA says so where it is used
    os.environ["CUDA_VISIBLE_DEVICES"] = entries[index] if entries is not None else str(index)
    return "cuda:0"


def _record_queued(inbox: queue.SimpleQueue, on_part: Callable[[Chunk], None]) -> None:
    """The chunks workers wrote before one failed, still queued: recorded, so that a rerun keeps them."""
    while True:
        try:
            kind, *body = inbox.get_nowait()
        except queue.Empty:
            return
        if kind == "part":
            on_part(body[0])


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


def _run_workers(job: EncodeJob, plan: Plan, units: Units, devices: tuple[str, ...],
                 progress: Callable[[int, int], None]) -> list[WorkerResult]:
    """One worker process per device. Each is a PythonChild, forked where that is safe (_forks_workers) with the
    model's code imported here first, else a new interpreter: multiprocessing's spawn would run the caller's script
    again in each (twice the encode, from a script without a main guard). This process answers their claims of units
    and numbers what they parse, in the order of their messages."""
    workers: list[PythonChild] = []
    results: list[WorkerResult] = []
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    fork = _forks_workers(devices)
    if fork:  # once here instead of once in each worker
        from lsr_index.model import encoder  # noqa: F401 (torch, triton and the kernel, imported for the forks)
        from lsr_index.model.load import import_model_code

        import_model_code(job.model.here())
        fork = _forks_workers(devices)  # again: what was imported may have started a thread or CUDA

    def tell(k: int, *message: object) -> None:
        with contextlib.suppress(OSError, ValueError):  # it died: its relay says so
            pickle.dump(message, workers[k].stdin, protocol=pickle.HIGHEST_PROTOCOL)
            workers[k].stdin.flush()

    assignment = plan.assignment()
    try:
        for k, device in enumerate(devices):
            worker = PythonChild("lsr_index.encode.local:worker_main", f"the encoding worker on {device}", fork=fork)
            workers.append(worker)
            tell(k, job, plan.out, device, assignment, k, len(devices))
        for worker in workers:  # once all are forked: a relay running beside a fork would make it unsafe
            threading.Thread(target=relay, args=(worker, inbox), daemon=True).start()
        while len(results) < len(workers):
            try:
                kind, *body = inbox.get(timeout=1.0)
            except queue.Empty:
                plan.flush_if_due()
                continue
            if kind == "claim":
                tell(body[0], "unit", units.claim())
            elif kind == "summary":
                units.submit(body[1], lambda numbered, k=body[0]: tell(k, "numbered", numbered))
            elif kind == "part":
                plan.record(body[0])
            elif kind == "progress":
                progress(*body[0])
            elif kind == "done":
                body[0].started = "fork" if fork else "new interpreter"
                results.append(body[0])
                if len(results) == len(workers):
                    mark("every worker done")
            else:
                _record_queued(inbox, plan.record)
                if kind == "gone":
                    raise LsrIndexError(f"{body[0].what} died (exit code {body[0].exit_code(5)}); rerun the same "
                                        "command to resume")
                raise LsrIndexError(body[0])
    except InputError:
        _record_queued(inbox, plan.record)
        raise
    finally:
        for worker in workers:
            worker.close(finished=len(results) == len(workers))
    mark("workers ended")
    return sorted(results, key=lambda r: r.worker)
