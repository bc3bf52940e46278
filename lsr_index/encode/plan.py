"""The encode stage's planner and only manifest writer: start, resume or refuse; what is encoded already; record each
chunk the tasks write and publish each shard its chunks cover; finish. The encoding itself is the task of
encode.task, scheduled by an executor (encode.run).

A rerun after a crash encodes only what the manifest does not record; recorded parts whose documents changed since
(checked by each part's input digest) are re-encoded, the rest are kept. The manifest is saved at most once a second
while chunks stream in, and a chunk or shard is recorded only once its file is durable: after a kill, files the
manifest does not list are this command's own leftovers, deleted and encoded again.
"""

from __future__ import annotations

import os
import resource
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path

import orjson

from lsr_index.encode.job import Assignment, EncodeJob, PieceStats, digest_hex, pieces
from lsr_index.encode.task import WorkerResult
from lsr_index.errors import LsrIndexError
from lsr_index.inputs.sequence import Sequencer
from lsr_index.runtime.durable import atomic_write_bytes, exclusive_lock, fsync_directory, refuse_symlink, sha256_file
from lsr_index.runtime.timeline import mark
from lsr_index.vectors.manifest import (
    MANIFEST,
    Chunk,
    EncoderSettings,
    EncodeStats,
    InputFields,
    InputRecord,
    Manifest,
    ModelRecord,
    NodeStats,
    Part,
    Shard,
    WorkerStats,
    written_by_encode,
)
from lsr_index.vectors.shards import SHARDS, concatenate, is_attempt, is_ours, is_temporary, shard_file

SKIPPED_REPORT = "skipped.jsonl"  # JSON lines: ids may hold tabs or quotes
SAVE_EVERY = 1.0  # seconds between manifest saves while shards stream in
_MOD = 1 << 128


class Plan:
    """The manifest of one output directory, held under its lock for a whole run.

    `record` may come from a writer thread while the driver's progress calls `flush_if_due`: one lock keeps a save,
    its clean flag and its deletions about one state (else a save could delete chunk files the manifest it just
    wrote still lists, and a kill there would leave a manifest naming missing files)."""

    def __init__(self, out: Path, job: EncodeJob, manifest: Manifest):
        self.out, self.job, self.manifest = out, job, manifest
        self.lock = threading.RLock()
        self.saved_at = 0.0
        self.dirty = False
        self.obsolete: list[str] = []  # files to delete once a save no longer lists them
        self.stale = 0  # recorded parts found changed and re-encoded
        self._publisher = ThreadPoolExecutor(1, thread_name_prefix="publish")
        self._pending: list[Future] = []
        self._publishing: set[int] = set()  # shards being joined from their chunks
        self._failed: BaseException | None = None

    @classmethod
    def open(cls, out: Path, job: EncodeJob, fresh: Manifest) -> Plan:
        """Start, resume or refuse, depending on what the directory already holds."""
        plan = cls(out, job, _start_or_resume(out, fresh, job.options.overwrite))
        plan.manifest.complete = False
        plan._verify_recorded()
        plan.save()
        plan._remove_leftovers()
        return plan

    def assignment(self) -> Assignment:
        sd = self.manifest.shard_docs
        return Assignment(frozenset(s.start // sd for s in self.manifest.shards), tuple(self.manifest.chunks))

    def record(self, chunk: Chunk) -> None:
        """A chunk a task wrote, durable on disk: listed now, saved within SAVE_EVERY; a shard its chunks now cover
        is published beside (concatenating chunks copies the shard's bytes: not on the caller's thread)."""
        with self.lock:
            self.manifest.chunks.append(chunk)
            self.dirty = True
            if self._failed is not None:
                raise self._failed
            self._pending.append(self._publisher.submit(self._publish_in_background))
            self.flush_if_due()

    def _publish_in_background(self) -> None:
        try:
            self.publish_covered()
        except BaseException as exc:  # raised on the next record, or by finish
            self._failed = exc

    def publish(self, shard: Shard) -> None:
        """A shard published whole by a cluster's encoder (see cluster.py): it replaces its shard's chunks."""
        with self.lock:
            k = shard.start // self.manifest.shard_docs
            self.obsolete += [c.file for c in self.manifest.chunks if c.shard == k]
            self.manifest.chunks = [c for c in self.manifest.chunks if c.shard != k]
            self.manifest.shards.append(shard)
            self.dirty = True
            self.flush_if_due()

    def publish_covered(self, total: int | None = None) -> None:
        """Publish every shard whose chunks cover it: a full shard, or (once the stream's `total` is known) the last,
        shorter one. The files are joined outside the lock: records and saves go on meanwhile."""
        with self.lock:
            sd = self.manifest.shard_docs
            by_shard: dict[int, list[Chunk]] = {}
            for chunk in self.manifest.chunks:
                if chunk.shard not in self._publishing:
                    by_shard.setdefault(chunk.shard, []).append(chunk)
            ready = []
            for shard, chunks in sorted(by_shard.items()):
                chunks.sort(key=lambda c: c.start)
                end = (shard + 1) * sd if total is None else min((shard + 1) * sd, total)
                if [c.start for c in chunks] == [shard * sd, *(c.end for c in chunks[:-1])] and chunks[-1].end == end:
                    ready.append((shard, chunks))
                    self._publishing.add(shard)
        for shard, chunks in ready:
            try:
                published = publish_shard(self.out, shard, chunks, self.manifest.output_format, shard * sd)
            finally:
                with self.lock:
                    self._publishing.discard(shard)
            with self.lock:
                self.manifest.chunks = [c for c in self.manifest.chunks if c.shard != shard]
                self.obsolete += [c.file for c in chunks if c.file != published.file]
                self.manifest.shards.append(published)
                self.dirty = True

    def close(self) -> None:
        """The publications under way finished (a shard being joined is listed once whole), what is recorded saved."""
        self._publisher.shutdown(wait=True)
        if self.dirty:
            self.save()

    def flush_if_due(self) -> None:
        with self.lock:
            if self.dirty and time.monotonic() - self.saved_at >= SAVE_EVERY:
                self.save()

    def save(self) -> None:
        with self.lock:
            self.manifest.shards.sort(key=lambda s: s.start)
            self.manifest.save(self.out)
            self.saved_at, self.dirty = time.monotonic(), False
            for name in self.obsolete:  # listed nowhere now: a kill before this line leaves only leftovers
                (self.out / name).unlink(missing_ok=True)
            self.obsolete = []

    def _verify_recorded(self) -> None:
        """Read the input as far as the recorded parts reach and keep each part whose documents, file and place are
        unchanged: its digest matches, its file is intact, it begins and ends where pieces do, and no kept part
        overlaps it."""
        m = self.manifest
        parts = [*m.shards, *m.chunks]
        if not parts:
            return
        sd, extent = m.shard_docs, max(p.end for p in parts)
        sums: dict[int, int] = {0: 0}  # digest of the documents before each piece boundary
        ends: set[int] = set()  # where a shard ends: at its edge, or at the end of the stream

        def intact(part: Part) -> bool:
            """Its file as written: one deleted or damaged since (a copy that skipped hidden files, a disk error)
            is encoded again, not listed over a gap or concatenated into a shard."""
            path = self.out / part.file
            try:
                return path.is_file() and not path.is_symlink() and sha256_file(path) == part.sha256
            except OSError:
                return False

        # the files are hashed beside the input's reading (hashlib lets go of the GIL)
        with ThreadPoolExecutor(max_workers=2) as hashing:
            files = {id(p): hashing.submit(intact, p) for p in parts}
            position, total = 0, 0
            reader = self.job.reader()
            for piece in pieces(reader, sd):
                if piece.start >= extent:
                    break
                total = (total + piece.digest()) % _MOD
                position = piece.end
                sums[position] = total
                if position % sd == 0:
                    ends.add(position)
            else:
                ends.add(position)  # the stream ended within the recorded extent

        def same(part: Part) -> bool:
            return part.start in sums and part.end in sums and (sums[part.end] - sums[part.start]) % _MOD == \
                int(part.input, 16) and files[id(part)].result()

        keep_shards = [s for s in m.shards if same(s) and s.end in ends and s.start % sd == 0]
        published = {s.start // sd for s in keep_shards}
        keep_chunks, reach = [], {}
        for chunk in sorted(m.chunks, key=lambda c: c.start):
            if chunk.shard not in published and chunk.start >= reach.get(chunk.shard, 0) and \
                    chunk.start // sd == chunk.shard == (chunk.end - 1) // sd and same(chunk):
                keep_chunks.append(chunk)
                reach[chunk.shard] = chunk.end
        self.stale = len(parts) - len(keep_shards) - len(keep_chunks)
        kept = {id(p) for p in (*keep_shards, *keep_chunks)}  # by identity: comparing parts was quadratic in them
        self.obsolete += [p.file for p in parts if id(p) not in kept]
        m.shards, m.chunks = keep_shards, keep_chunks

    def _remove_leftovers(self) -> None:
        """Shard files, chunks, temporaries, cluster attempts the manifest does not list: ours (by
        name), from a killed run."""
        listed = {p.file for p in [*self.manifest.shards, *self.manifest.chunks]}
        shards = self.out / SHARDS
        shards.mkdir(exist_ok=True)
        for entry in shards.iterdir():
            if is_ours(entry.name) and f"{SHARDS}/{entry.name}" not in listed and not entry.is_dir():
                entry.unlink()
            elif is_attempt(entry.name) and entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
        for entry in self.out.glob(f".{MANIFEST}.*.tmp"):
            entry.unlink()

    def finish(self, results: list[WorkerResult], sequencer: Sequencer, resumed_at: int, seconds: float,
               started_at: float, nodes: list[NodeStats] | None = None,
               completing: Callable[[], AbstractContextManager] = nullcontext) -> Manifest:
        """After the last task: the last shard published, the shards checked to tile the stream, the skipped records
        reported, the run's figures recorded, the manifest marked complete."""
        m, out = self.manifest, self.out
        sequencer.finish()
        total = sequencer.n_docs
        wait(self._pending)
        if self._failed is not None:
            raise self._failed
        self.publish_covered(total)
        mark("last shard published")
        m.shards.sort(key=lambda s: s.start)
        expected = 0
        for shard in m.shards:  # the shards must tile [0, total) exactly
            if shard.start != expected:
                raise LsrIndexError(f"{out}: shards do not cover documents {expected}..{shard.start - 1}; "
                                    "rerun to resume, or --overwrite")
            expected += shard.docs
        if expected != total or m.chunks:
            raise LsrIndexError(f"{out}: shards hold {expected} documents but the input has {total}; the input "
                                "changed during the run? Rerun the same command to re-encode what changed")
        skipped = [{"file": s.path, "line": s.where, "id": s.doc_id, "reason": s.reason} for s in sequencer.skipped]
        atomic_write_bytes(out / SKIPPED_REPORT, b"".join(orjson.dumps(s) + b"\n" for s in skipped))
        m.skipped = len(skipped)
        tokens = sum(r.tokens for r in results)
        new_docs = sum(r.docs for r in results)
        m.stats = EncodeStats(
            seconds=round(seconds, 3), docs_this_run=new_docs, resumed_at=resumed_at, stale_parts_reencoded=self.stale,
            workers=len(results), docs_per_second=round(new_docs / max(seconds, 1e-9), 1),
            tokens_per_second=round(tokens / max(seconds, 1e-9), 1), nonzeros_per_doc=round(m.nonzeros / m.docs, 2),
            peak_host_memory_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            units=len(sequencer.units),
            # start-up (process, model load, first read) apart from the encoding rate that follows it
            per_worker=[WorkerStats(device=r.device, docs=r.docs, startup_seconds=round(r.ready_at - started_at, 3),
                                    model_loaded_after_seconds=round(r.loaded_at - started_at, 3),
                                    docs_per_second_after_startup=round(r.docs / max(r.done_at - r.ready_at, 1e-9), 1),
                                    cores=r.cores, serializers=r.serializers, started=r.started, readers=r.readers,
                                    input_wait_seconds=r.input_wait, output_wait_seconds=r.output_wait)
                        for r in results],
            per_node=nodes)
        if self.obsolete:  # the joined chunks deleted before the manifest says complete: a kill after the complete
            self.save()  # save would leave them, and a complete output is never resumed (which deletes the unlisted)
        with completing():
            m.complete = True
            self.save()
        mark("manifest complete")
        return m


def publish_shard(out: Path, shard: int, chunks: list[Chunk], fmt: str, start: int) -> Shard:
    """Shard `shard` under its own name from its chunks (in order, covering it): the one chunk renamed, or the chunks
    concatenated (their files are left for the caller to delete once the manifest no longer lists them)."""
    name = shard_file(shard, fmt)
    if len(chunks) == 1:
        os.replace(out / chunks[0].file, out / name)
        fsync_directory((out / name).parent)
        sha = chunks[0].sha256
    else:
        sha = concatenate([out / c.file for c in chunks], out / name, fmt)
    stats = PieceStats()
    for chunk in chunks:
        stats.add(PieceStats.of(chunk))
    return Shard(file=name, start=start, docs=sum(c.docs for c in chunks), nonzeros=sum(c.nonzeros for c in chunks),
                 sha256=sha, input=digest_hex(stats.digest), truncated=stats.truncated, longest=stats.longest,
                 capped=stats.capped)


def _owned_top_level(path: Path) -> bool:
    """What an lsr-index vectors directory may hold before its manifest exists (a run killed at its start)."""
    if path.name in (".lock", SKIPPED_REPORT) or (path.name.startswith(f".{MANIFEST}.") and path.name.endswith(".tmp")):
        return not path.is_symlink()
    return path.name == SHARDS and path.is_dir() and not path.is_symlink() and \
        all(is_temporary(p.name) for p in path.iterdir())


def _refuse_foreign(out: Path) -> None:
    """--overwrite replaces an lsr-index output; nothing writes among someone else's files. A directory is ours when
    its manifest says so; without one, when all it holds is what a run killed at its start leaves; with one damaged
    past reading (not JSON), when all else it holds is ours by name."""
    if not out.is_dir():
        return
    ours = written_by_encode(out)
    if ours:
        return

    def owned(path: Path) -> bool:
        if ours is None and path.name in (MANIFEST, SHARDS) and not path.is_symlink():
            return path.name == MANIFEST or (path.is_dir() and all(
                is_ours(p.name) or is_temporary(p.name) or is_attempt(p.name)
                for p in path.iterdir()))
        return _owned_top_level(path)

    foreign = sorted(p.name for p in out.iterdir() if not owned(p))
    if foreign:
        raise LsrIndexError(f"{out} exists and is not an lsr-index output (it holds {foreign[0]!r}"
                            f"{f' and {len(foreign) - 1} more' if len(foreign) > 1 else ''}); choose a new or "
                            "empty directory")


def _start_or_resume(out: Path, fresh: Manifest, overwrite: bool) -> Manifest:
    _refuse_foreign(out)
    if not (out / MANIFEST).exists():
        return fresh
    if overwrite:  # even over a damaged manifest: delete our shard files, listed or not, and nothing else
        fresh.save(out)  # first: a kill below must not leave a complete manifest over deleted shards
        for stale in (out / SHARDS).iterdir() if (out / SHARDS).is_dir() else ():
            if is_ours(stale.name) and not stale.is_dir():
                stale.unlink()
        return fresh
    old = Manifest.load(out)
    if not old.shards and not old.chunks:  # nothing encoded yet (e.g. a first run stopped at a bad record)
        return fresh
    if old.complete:
        raise LsrIndexError(f"{out} already holds a complete encoding ({old.docs} documents); "
                            "pass --overwrite to replace it")
    if old.fingerprint() != fresh.fingerprint():
        changed = sorted(k for k, v in old.fingerprint().items() if fresh.fingerprint()[k] != v)
        raise LsrIndexError(f"{out} holds a partial encoding made with other {', '.join(changed)}; pass --overwrite "
                            "to start over")
    old.input = replace(old.input, on_error=fresh.input.on_error)  # this run's: it skips or stops from here on
    return old


def _refuse_foreign_places(job: EncodeJob, out: Path) -> None:
    """Links would carry writes and deletes out of the output (checked before the lock file is even opened), and an
    output directory that holds an input could have it replaced or deleted by --overwrite."""
    for path, what in ((out / MANIFEST, "manifest"), (out / SHARDS, "shards directory"), (out / ".lock", "lock")):
        refuse_symlink(path, what)
    root = out.resolve()
    for path in job.reader().files:
        if path.resolve().is_relative_to(root):
            raise LsrIndexError(f"input {path} lies inside the output directory {out}; choose an output directory "
                                "outside the inputs")


def fresh_manifest(job: EncodeJob) -> Manifest:
    """The manifest a new run of `job` starts from (its settings: what a resumed run must match)."""
    from lsr_index.model.query import query_model_record

    options, model = job.options, job.model
    limit = model.max_length()
    if limit and max(options.doc_max_length, options.query_max_length) > limit:
        raise LsrIndexError(f"model {model.name} takes at most {limit} tokens; lower --doc-max-length "
                            f"({options.doc_max_length}) or --query-max-length ({options.query_max_length})")
    reader = job.reader()
    return Manifest(
        model=ModelRecord(model.recorded_name, model.sha256),
        encoder=EncoderSettings(options.doc_max_length, options.query_max_length, job.dtype, options.backend),
        quantization=options.quantization, output_format=options.output_format,
        input=InputRecord(files=[str(p.resolve()) for p in reader.files], max_chars=job.max_chars,
                          fields=InputFields(reader.fields.id, list(reader.fields.text or []) or None),
                          on_error=job.on_error),
        shard_docs=options.shard_docs,
        query_model=query_model_record(job.query_model or model, model, options.query_max_length))


@contextmanager
def planned(job: EncodeJob, out: Path) -> Iterator[Plan]:
    """`out` locked and its plan opened, for any executor; what was recorded before an error or Ctrl-C is saved."""
    fresh = fresh_manifest(job)
    _refuse_foreign_places(job, out)
    _refuse_foreign(out)  # before the lock file is made in it (again under the lock: the directory may change)
    out.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(out):
        plan = Plan.open(out, job, fresh)
        try:
            yield plan
        finally:
            plan.close()
