"""Executors only schedule: each runs the one encode task (encode_shard.ShardEncoder) on its devices and hands
every event back to the planner, which alone writes the manifest (ray_executor.py is the cluster's executor)."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

from .children import end_with_parent
from .encode_job import EncodeJob
from .encode_shard import Assignment, ShardEncoder, WorkerResult
from .errors import LsrIndexError
from .manifest import Part


def run_in_process(job: EncodeJob, out: Path, devices: tuple[str, ...], assignment: Assignment,
                   on_part: Callable[[Part], None], on_progress: Callable[[int, int], None]) -> list[WorkerResult]:
    with closing(ShardEncoder(job, devices[0], os.cpu_count() or 1)) as encoder:
        return [encoder.run(out, assignment, on_part, on_progress)]


def _worker_main(job, out, device, assignment, messages) -> None:
    """Process entry point: everything goes back to the parent as messages."""
    end_with_parent()
    cores = max(1, (os.cpu_count() or 1) // assignment.workers)
    # the Rust tokenizer's thread pool takes every core by default: W workers would oversubscribe them W times
    os.environ.setdefault("RAYON_NUM_THREADS", str(cores))
    try:
        with closing(ShardEncoder(job, device, cores)) as encoder:
            result = encoder.run(out, assignment, emit=lambda part: messages.put(("part", part)),
                                 progress=lambda docs, tokens: messages.put(("progress", (docs, tokens))))
        messages.put(("done", result))
    except LsrIndexError as exc:
        messages.put(("error", str(exc)))
    except BaseException as exc:
        messages.put(("error", f"worker on {device} failed: {type(exc).__name__}: {exc}"))


def run_local_workers(job: EncodeJob, out: Path, devices: tuple[str, ...], assignment: Assignment,
                      on_part: Callable[[Part], None], on_progress: Callable[[int, int], None],
                      on_idle: Callable[[], None]) -> list[WorkerResult]:
    """One process per device; worker w encodes shards k ≡ w (mod W)."""
    context = mp.get_context("spawn")  # CUDA cannot be forked
    messages = context.Queue()
    # not daemonic: a worker starts its own serializer pool; the finally below ends them on any failure
    procs = [context.Process(target=_worker_main, args=(job, out, d, a, messages))
             for d, a in zip(devices, assignment.split(len(devices)))]
    for p in procs:
        p.start()
    results: list[WorkerResult] = []
    try:
        while len(results) < len(procs):
            if any(p.exitcode not in (None, 0) for p in procs):
                raise LsrIndexError("an encoding worker died; rerun the same command to resume")
            try:
                kind, body = messages.get(timeout=1.0)
            except queue.Empty:
                on_idle()
                continue
            if kind == "part":
                on_part(body)
            elif kind == "progress":
                on_progress(*body)
            elif kind == "done":
                results.append(body)
            else:
                raise LsrIndexError(body)
    finally:
        for p in procs:
            if p.is_alive() and len(results) < len(procs):
                p.terminate()
            p.join()
    return sorted(results, key=lambda r: r.worker)
