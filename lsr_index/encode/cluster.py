"""The encode stage on a Ray cluster: the driver reads and plans, one encoder actor per GPU (or per N cores) encodes.

- Reading is cheap next to encoding, so the driver reads the corpus once, in stream order (so documents are numbered
  exactly as on one machine, skipped records included), and ships each pending shard's (id, text) Arrow batches
  through the object store, cut where one machine cuts them: every forward pass holds the same documents, so the
  vectors are the same bytes. Actors never open the inputs; only the output directory must be on a file system
  that every node mounts at the same path.
- Exactly once: each dispatch of a shard (an attempt) writes into its own directory shards/.attempt-…, which the
  driver creates. The driver alone moves the first finished attempt to the shard's final name and records it in
  the manifest; every other attempt's directory is deleted, and an attempt whose actor died is deleted at once, so
  a late writer finds no directory to write or rename into. Ray's own retries are off: the manifest decides.
- A lost actor (its process or its node killed) is dropped and its shards go back to the queue; a shard that takes
  down MAX_LOSSES actors stops the run. Any other remote failure stops it as one line naming the node and shard.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import re
import shutil
import signal
import socket
import sys
import threading
import time
import uuid
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lsr_index.encode.feed import numbered_pieces, with_stats
from lsr_index.encode.job import Assignment, EncodeJob, Piece
from lsr_index.encode.plan import Plan, publish_shard
from lsr_index.encode.task import ShardEncoder, WorkerResult
from lsr_index.encode.units import Units
from lsr_index.errors import LsrIndexError, install_hint
from lsr_index.runtime.durable import fsync_directory
from lsr_index.runtime.threads import Prefetch
from lsr_index.vectors.manifest import Chunk, NodeStats, Shard
from lsr_index.vectors.shards import SHARDS, attempt_dir, shard_file

INSTALL = install_hint("ray")
QUEUED_PER_ACTOR = 2  # one encoding, one whose documents are already on their way
READ_AHEAD = 4  # shards read and cut ahead of dispatch (the driver's memory: ~(2·actors + 4) shards of text)
MAX_LOSSES = 3  # actors a shard may take down before it is blamed (a document that exhausts memory)
CONNECT_SECONDS = 10  # how long the cluster's address may take to answer before the run gives up on it
_ADDRESS = re.compile(r"^(auto|local|ray://\S+|[\w.\-]+:\d+|\[[0-9a-fA-F:]+\]:\d+)$")


def check_address(address: str) -> str | None:
    """The --ray value: '' (the flag alone) → None: the local cluster `ray start` left, else a new one."""
    if not address:
        return None
    if not _ADDRESS.match(address):
        raise LsrIndexError(f"--ray {address!r}: not a Ray address (auto, local, ray://host:port or host:port); "
                            "an input path? Put --ray after the inputs, or write --ray=ADDRESS")
    return address


def _reachable(address: str | None) -> None:
    """Refuse at once an address where nothing listens: ray.init retries it for minutes (20 tries of ~35 s), printing
    Ray's connection warnings. A TCP connect to the cluster's GCS port, the address ray.init would use (found with
    Ray's private functions: a Ray without them skips this check, not the run)."""
    try:
        from ray._private.services import canonicalize_bootstrap_address, parse_address
    except ImportError:
        return
    if address and address.startswith("ray://"):
        return  # Ray Client: its own protocol and timeouts
    try:
        bootstrap = canonicalize_bootstrap_address(address)  # RAY_ADDRESS, `auto`, or the one `ray start` left
    except (ConnectionError, ValueError) as exc:
        raise LsrIndexError(f"--ray {address or '(local)'}: cannot connect to the Ray cluster: {exc}") from None
    if bootstrap is None:
        return  # a new local cluster
    host, port = parse_address(bootstrap)
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_SECONDS).close()
    except OSError as exc:
        why = exc.strerror or str(exc) or "timed out"
        raise LsrIndexError(f"--ray {address or '(local)'}: cannot connect to the Ray cluster at {bootstrap}: {why}; "
                            "is the cluster running (`ray status`)?") from None


@contextlib.contextmanager
def _signals_held(ray: Any) -> Iterator[list[int]]:
    """Ctrl-C and SIGTERM wait for the block's end, then reach the caller's handlers (a second one acts at once).

    ray.init and ray.shutdown start and stop a local cluster's processes: interrupted inside them, they left its
    agents running a minute after the driver had ended. ray.init also puts its own SIGTERM handler in place of the
    caller's for good (sys.exit(15): exit status 15, no word of how to resume); it is kept out. The block sees the
    signals caught so far (to undo what it started before they act)."""
    if threading.current_thread() is not threading.main_thread():
        yield []
        return
    caught: list[int] = []
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def restore() -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    def deliver(signum: int) -> None:
        handler = previous[signum]
        if callable(handler):
            handler(signum, None)
        elif handler == signal.SIG_DFL:
            os.kill(os.getpid(), signum)

    def hold(signum: int, frame: Any) -> None:
        caught.append(signum)
        if len(caught) > 1:  # insisted
            restore()
            deliver(signum)

    for signum in previous:
        signal.signal(signum, hold)
    utils = getattr(getattr(ray, "_private", None), "utils", None)
    ray_sets = getattr(utils, "set_sigterm_handler", None)
    if ray_sets:
        utils.set_sigterm_handler = lambda handler: None
    try:
        yield caught
    finally:
        if ray_sets:
            utils.set_sigterm_handler = ray_sets
        restore()  # also over the handler Ray's C++ core installs for SIGTERM (it prints a stack dump)
        if len(caught) == 1:
            deliver(caught[0])


class EncoderActor:
    """One encoder on one device of one node. Failures come back as one line naming the node and the shard."""

    def __init__(self, job: EncodeJob, device: str, threads: int, node: str):
        os.environ["RAYON_NUM_THREADS"] = str(threads)  # the tokenizer's pool, before its first use
        self.node, self.device, self.error, self.task, self.job = node, device, None, None, job
        try:
            self.task = ShardEncoder(job, device, threads, reads_input=False)
            self.task.encoder  # noqa: B018 (waits for the model to load: ready() reports it, or why it failed)
        except Exception as exc:  # raised by ready(), where the driver waits for it
            self.error = f"{self.node}: cannot start an encoder on {device}: {_describe(exc)}"

    def ready(self) -> dict:
        if self.error:
            raise LsrIndexError(self.error)
        return {"loaded_at": self.task.loaded_at}

    def encode(self, shard: int, source: list[Piece], directory: str) -> dict:
        """Encode one shard from the driver's pieces into its attempt directory: the shard task of one machine,
        with `directory` as its output directory."""
        began = time.time()
        if not (Path(directory) / SHARDS).is_dir():  # the driver made it: this node does not see the output
            raise LsrIndexError(f"{self.node}, shard {shard}: {directory} is not visible here; the output directory "
                                "must be on a file system every node mounts at the same path")
        chunks: list[Chunk] = []  # checkpointing is off: one chunk, the whole shard
        try:
            items = (with_stats(self.job, piece) for piece in source)
            result = self.task.run(Path(directory), Assignment(), None, chunks.append, lambda docs, tokens: None,
                                   source=items)
            record = publish_shard(Path(directory), shard, chunks, self.job.options.output_format, chunks[0].start)
        except Exception as exc:
            raise LsrIndexError(f"{self.node}, shard {shard}: {_describe(exc)}") from None
        return {"shard": record, "tokens": result.tokens, "began": began, "ended": time.time()}


def _describe(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, LsrIndexError) else f"{type(exc).__name__}: {exc}"


@dataclass
class _Encoder:
    handle: Any
    device: str
    node_id: str
    name: str  # the node, as messages name it
    ready: bool = False
    inflight: list = field(default_factory=list)  # ObjectRefs of encode(), in execution order
    lost: bool = False
    docs: int = 0
    tokens: int = 0
    loaded_at: float = 0.0
    began: float = 0.0
    ended: float = 0.0


@dataclass
class _Attempt:
    shard: int
    source: Any  # ObjectRef of the shard's list of Pieces
    losses: int = 0  # actors lost while encoding it
    directory: Path | None = None
    encoder: _Encoder | None = None


class RayCluster:
    """A connection to a Ray cluster and its encoder plan: one actor per GPU, or per `cpus_per_actor` cores
    on a cluster without GPUs (GPU clusters use only their GPUs: a CPU encoder would hold up the last shards)."""

    def __init__(self, address: str, cpus_per_actor: int = 4):
        try:
            import ray
        except ImportError:
            raise LsrIndexError(f"--ray needs Ray, which is not installed: {INSTALL}") from None
        import logging

        self.ray = ray
        checked = check_address(address)
        _reachable(checked)
        with _signals_held(ray) as caught:
            try:
                ray.init(address=checked, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
            except (ConnectionError, ValueError, RuntimeError) as exc:
                raise LsrIndexError(f"--ray {address or '(local)'}: cannot connect to the Ray cluster: {exc}") \
                    from None
            if caught:  # stop what ray.init started before the signal ends the run
                ray.shutdown()
        self.plan: list[tuple[str, str, int, dict]] = []  # (node id, device, threads, resources per actor)
        self.names: dict[str, str] = {}  # node id → how messages name it
        nodes = [n for n in ray.nodes() if n["Alive"]]
        gpus = any(n["Resources"].get("GPU", 0) >= 1 for n in nodes)
        for node in nodes:
            self.names[node["NodeID"]] = f"node {node['NodeManagerAddress']} ({node['NodeManagerHostname']}, " \
                                         f"{node['NodeID'][:8]})"
            cpus, node_gpus = int(node["Resources"].get("CPU", 0)), int(node["Resources"].get("GPU", 0))
            if gpus:
                for _ in range(node_gpus):  # Ray shows each GPU actor only its own GPU, as cuda:0
                    self.plan.append((node["NodeID"], "cuda:0", max(1, cpus // node_gpus), {"num_gpus": 1}))
            elif cpus:
                for _ in range(max(1, cpus // cpus_per_actor)):
                    share = min(cpus, cpus_per_actor)
                    self.plan.append((node["NodeID"], "cpu", share, {"num_cpus": share}))
        if not self.plan:
            self.shutdown()
            raise LsrIndexError(f"--ray {address or '(local)'}: the cluster has no GPU and no CPU to encode on")
        self.devices = ("cuda",) if gpus else ("cpu",)

    def run(self, job: EncodeJob, plan: Plan, units: Units, progress: Callable[[int, int], None]
            ) -> list[WorkerResult]:
        """Encode every shard not published yet into plan.out (shared by every node); the driver reads the input."""
        self._run = _Run(self, job, plan.out.resolve(), plan, units, progress)
        try:
            return self._run.go()
        finally:
            self.shutdown()

    def node_stats(self, seconds: float) -> list[NodeStats]:
        return self._run.per_node(seconds)

    def shutdown(self) -> None:
        """End this job's actors; stop the cluster if ray.init started it (Ctrl-C and SIGTERM wait for the end)."""
        with _signals_held(self.ray):
            self.ray.shutdown()


class _Run:
    def __init__(self, cluster: RayCluster, job: EncodeJob, out: Path, plan: Plan, units: Units,
                 progress: Callable[[int, int], None]):
        self.cluster, self.ray, self.job, self.out, self.plan = cluster, cluster.ray, job, out, plan
        self.units, self.progress = units, progress
        self.done = plan.assignment().done
        # a shard checkpointed by a one-machine run is encoded whole again here: only published shards are resumed
        self.resumed_at = plan.manifest.docs
        self.published = set(self.done)
        self.queue: deque[_Attempt] = deque()
        self.inflight: dict[Any, _Attempt] = {}  # encode() ref → its attempt
        self.starting: dict[Any, _Encoder] = {}  # ready() ref → its encoder
        self.encoders: list[_Encoder] = []
        errors = self.ray.exceptions
        # what a call on an encoder raises when the encoder is gone: its process or node died, or its node left the
        # cluster before it was placed (Ray lists a node alive until it has missed a few health checks, so a run
        # started just after a node left still plans an encoder there)
        self.lost_errors = (errors.RayActorError, errors.WorkerCrashedError, errors.ActorUnschedulableError)
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        actor = self.ray.remote(max_restarts=0, max_task_retries=0)(EncoderActor)
        # no checkpoints: they would die with their attempt's directory (a lost shard restarts on another actor),
        # so on a cluster a shard is the unit of resume (the largest finite setting: never)
        job = dataclasses.replace(job, options=dataclasses.replace(job.options, checkpoint_seconds=sys.float_info.max))
        for node_id, device, threads, resources in cluster.plan:
            handle = actor.options(**resources, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
                                   ).remote(job, device, threads, cluster.names[node_id])
            encoder = _Encoder(handle, device, node_id, cluster.names[node_id])
            self.encoders.append(encoder)
            self.starting[handle.ready.remote()] = encoder

    def go(self) -> list[WorkerResult]:
        shards = itertools.groupby(numbered_pieces(self.job, self.units), key=lambda piece: piece.shard)
        stream = Prefetch(((k, list(group)) for k, group in shards if k not in self.done), READ_AHEAD, "read")
        started_at = time.time()
        read_all = False
        try:
            while True:
                live = [e for e in self.encoders if e.ready and not e.lost]
                slots = sum(QUEUED_PER_ACTOR - len(e.inflight) for e in live)
                while not read_all and len(self.queue) < slots:
                    item = next(stream, None)
                    if item is None:
                        read_all = True
                    else:
                        self.queue.append(_Attempt(item[0], self.ray.put(item[1])))
                self._dispatch(live)
                if read_all and not self.queue and not self.inflight:
                    break
                if not live and not self.starting:
                    raise LsrIndexError("every encoder on the Ray cluster was lost; rerun the same command to "
                                        "resume once the cluster has nodes again")
                ready, _ = self.ray.wait([*self.inflight, *self.starting], num_returns=1, timeout=1.0)
                for ref in ready:
                    if ref in self.starting:
                        self._started(ref)
                    else:
                        self._finished(ref)
                self.plan.flush_if_due()
        finally:
            stream.close()
            for attempt in self.inflight.values():
                self._retire(attempt)
        # every shard is published: the cluster is let go before the manifest says complete, so that a signal while
        # a local cluster stops (seconds) finds a run that a rerun completes, not one it refuses as complete
        self.cluster.shutdown()
        return [WorkerResult(tokens=e.tokens, worker=i, device=f"{e.device} on {e.name}", docs=e.docs,
                             loaded_at=e.loaded_at or started_at, ready_at=e.began or started_at,
                             done_at=e.ended or started_at, started="ray actor")
                for i, e in enumerate(self.encoders)]

    def _dispatch(self, live: list[_Encoder]) -> None:
        for encoder in sorted(live, key=lambda e: len(e.inflight)):
            while self.queue and len(encoder.inflight) < QUEUED_PER_ACTOR:
                attempt = self.queue.popleft()
                attempt.directory = self.out / attempt_dir(attempt.shard, uuid.uuid4().hex[:12])
                (attempt.directory / SHARDS).mkdir(parents=True)
                attempt.encoder = encoder
                ref = encoder.handle.encode.remote(attempt.shard, attempt.source, str(attempt.directory))
                encoder.inflight.append(ref)
                self.inflight[ref] = attempt

    def _started(self, ref: Any) -> None:
        encoder = self.starting.pop(ref)
        try:
            info = self.ray.get(ref)
        except self.ray.exceptions.RayTaskError as exc:
            raise _remote_error(exc) from None
        except self.lost_errors as exc:
            self._lost(encoder, exc)
            return
        encoder.ready, encoder.loaded_at = True, info["loaded_at"]

    def _finished(self, ref: Any) -> None:
        attempt = self.inflight[ref]
        encoder = attempt.encoder
        try:
            result = self.ray.get(ref)
        except self.ray.exceptions.RayTaskError as exc:
            raise _remote_error(exc) from None
        except self.lost_errors as exc:
            self._lost(encoder, exc)
            return
        del self.inflight[ref]
        encoder.inflight.remove(ref)
        self._publish(attempt, result["shard"])
        encoder.docs += result["shard"].docs
        encoder.tokens += result["tokens"]
        encoder.began = encoder.began or result["began"]
        encoder.ended = result["ended"]

    def _lost(self, encoder: _Encoder, exc: Exception) -> None:
        """Its process or node died: drop it; its shards go back to the front of the queue."""
        encoder.lost = True
        with contextlib.suppress(Exception):
            self.ray.kill(encoder.handle)  # should it still run somewhere, it must not go on writing
        requeued = []
        for position, ref in enumerate(encoder.inflight):
            attempt = self.inflight.pop(ref)
            self._retire(attempt)
            attempt.losses += position == 0  # the one it was encoding
            if attempt.losses >= MAX_LOSSES:
                raise LsrIndexError(f"shard {attempt.shard} took down {attempt.losses} encoders (the last on "
                                    f"{encoder.name}); a document in it may exhaust memory: see the node's Ray "
                                    "logs, lower --max-tokens or --doc-max-length, then rerun")
            requeued.append(attempt)
        encoder.inflight.clear()
        self.queue.extendleft(reversed(requeued))
        held = f" holding shard(s) {', '.join(str(a.shard) for a in requeued)}" if requeued else ""
        print(f"lost the encoder on {encoder.device} of {encoder.name}{held} ({type(exc).__name__}); "
              f"{sum(not e.lost for e in self.encoders)} encoder(s) left", file=sys.stderr)

    def _retire(self, attempt: _Attempt) -> None:
        """Delete an attempt's directory: the rename first, so that a late writer cannot create or publish there."""
        if attempt.directory is None:
            return
        dead = attempt.directory.with_name(attempt.directory.name + ".dead")
        with contextlib.suppress(FileNotFoundError):
            os.replace(attempt.directory, dead)
        shutil.rmtree(dead, ignore_errors=True)
        attempt.directory = attempt.encoder = None

    def _publish(self, attempt: _Attempt, shard: Shard) -> None:
        """The first finished attempt of a shard takes its final name and enters the manifest."""
        if attempt.shard in self.published:  # a late duplicate: never published
            self._retire(attempt)
            return
        self.published.add(attempt.shard)
        name = shard_file(attempt.shard, self.job.options.output_format)  # the same name inside the attempt
        os.replace(attempt.directory / name, self.out / name)
        fsync_directory((self.out / name).parent)
        self.plan.publish(shard)
        self._retire(attempt)
        self.progress(shard.docs, 0)

    def per_node(self, seconds: float) -> list[NodeStats]:
        nodes: dict[str, list[_Encoder]] = defaultdict(list)
        for encoder in self.encoders:
            nodes[encoder.name].append(encoder)
        return [NodeStats(node=node, encoders=len(group), docs=sum(e.docs for e in group),
                          docs_per_second=round(sum(e.docs for e in group) / max(seconds, 1e-9), 1))
                for node, group in sorted(nodes.items())]


def _remote_error(exc: Exception) -> LsrIndexError:
    """A failure inside a remote call, as the one line the actor made of it."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, LsrIndexError):
        return cause
    return LsrIndexError(f"an encoder failed: {_describe(cause) if cause else str(exc).splitlines()[0]}")
