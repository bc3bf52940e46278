"""An encode run: the output planned (started, resumed or refused), the input's units handed to an executor's tasks,
and the manifest finished. Executors only schedule tasks: on this machine (local.LocalExecutor) or on a Ray cluster
(cluster.RayCluster); the plan alone writes the manifest."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Protocol

from lsr_index.encode.job import EncodeJob
from lsr_index.encode.plan import Plan, planned
from lsr_index.encode.task import WorkerResult
from lsr_index.encode.units import Units
from lsr_index.runtime.progress import EncodeBar
from lsr_index.runtime.timeline import mark
from lsr_index.vectors.manifest import Manifest, NodeStats


class Executor(Protocol):
    devices: tuple[str, ...]

    def run(self, job: EncodeJob, plan: Plan, units: Units, progress: Callable[[int, int], None]
            ) -> list[WorkerResult]:
        """Run the tasks until every unit is encoded; each chunk written goes to plan.record."""

    def node_stats(self, seconds: float) -> list[NodeStats] | None:
        """Per-node figures of a run over several machines, or None."""


def encode(job: EncodeJob, out: Path, executor: Executor,
           completing: Callable[[], AbstractContextManager] = nullcontext) -> Manifest:
    """Encode `job` into `out` with `executor`, resuming whatever an earlier run left. `completing`: a context the
    manifest is marked complete in (the CLI holds Ctrl-C and SIGTERM back there: once complete, a signal has nothing
    left to stop)."""
    job = job.for_output(out)
    with planned(job, out) as plan:
        mark("output planned")
        resumed_at = plan.manifest.docs + sum(c.docs for c in plan.manifest.chunks)
        reader = job.reader()
        planned_units = reader.units()
        units = Units(planned_units, reader.sequencer(planned_units))
        mark(f"input cut into {len(planned_units)} unit(s)")
        bar = EncodeBar(reader.estimate_docs, resumed_at, job.options.progress)
        t0, started_at = time.perf_counter(), time.time()
        tokens = 0

        def progress(docs: int, new_tokens: int) -> None:
            nonlocal tokens
            tokens += new_tokens
            bar.update(docs, f"{tokens / max(time.perf_counter() - t0, 1e-9):,.0f} tok/s")
            plan.flush_if_due()

        try:
            results = executor.run(job, plan, units, progress)
        finally:
            bar.close()
        seconds = time.perf_counter() - t0
        mark("every unit encoded")
        return plan.finish(results, units.sequencer, resumed_at, seconds, started_at,
                           nodes=executor.node_stats(seconds), completing=completing)


def encode_corpus(job: EncodeJob, out: Path, devices: tuple[str, ...] = ("cpu",)) -> Manifest:
    """Encode `job` into `out` on this machine's `devices` (one task per device)."""
    from lsr_index.encode.local import LocalExecutor

    return encode(job, out, LocalExecutor(devices))
