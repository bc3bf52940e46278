"""The build stage: vectors shards → a Lucene impact index, verified and published atomically.

Two builders, both in child processes (their heap is set per run and they can be killed without harm):
`direct` (default) writes impact postings itself, one writer process per core over a share of the documents,
merged at the end (`writer.py`); `anserini` runs Anserini's IndexCollection on JsonVectorCollection,
which indexes each term as `impact` repeated tokens.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import re
import signal
import subprocess
import threading
import time
import unicodedata
from collections.abc import Callable
from pathlib import Path

from lsr_index.engines.index import IndexRecord
from lsr_index.engines.lucene.checks import check_index, count_docs, count_postings
from lsr_index.engines.lucene.jvm import anserini_jar, java_home
from lsr_index.engines.lucene.writer import MERGE, heap_mb
from lsr_index.engines.publish import build_published, check_ids
from lsr_index.errors import LsrIndexError
from lsr_index.runtime.children import PythonChild, dying_with_this_process, relay
from lsr_index.runtime.durable import write_error
from lsr_index.runtime.progress import bar, note
from lsr_index.runtime.threads import host_cores
from lsr_index.vectors.manifest import Manifest
from lsr_index.vectors.shards import (
    ShardError,
    json_vector_line,
    read_shard,
    record_place,
    shown,
    split_ranges,
    term_problem,
)

BUILDERS = ("direct", "anserini")
# Each writer has fixed costs (a JVM start, a final flush, its sub-index copied in) that a small share does not
# repay: a few million postings build slower on two writers than on one, tens of millions markedly faster
# (benchmarks/bench_build.py; docs/benchmarks.md, "The Lucene build"). By default a writer is added per this many
# postings, a point between those two. Each writer is a JVM busy on one core, so none beyond the cores available
# (uncapped, --threads 200 would start 200 JVMs of ~100 MB each).
_MIN_POSTINGS_PER_WRITER = 7_500_000


def _stage_input(vectors: Path, manifest: Manifest, staging: Path) -> None:
    """Give Anserini exactly the listed shards (never a stray or partial file), in JsonVector form (links to
    the jsonl shards; Parquet ones converted)."""
    staging.mkdir()
    for shard in manifest.shards:
        source = vectors / shard.file
        if source.name.endswith(".parquet"):
            import gzip

            target = staging / (source.stem + ".jsonl.gz")
            try:
                with gzip.open(target, "wb", compresslevel=1) as f:
                    for doc_id, vector in read_shard(source):
                        f.write(json_vector_line(doc_id, vector))
            except OSError as exc:
                raise write_error(target, exc, "stage a shard for indexing") from exc
        else:
            os.symlink(source.resolve(), staging / source.name)


def _watch(proc: subprocess.Popen, total: int, progress: bool) -> None:
    """A progress bar over the indexer's elapsed time (Anserini reports counts only at the end)."""
    with bar(progress, desc=f"index {total:,} docs", bar_format="{desc}: {elapsed} elapsed") as elapsed:
        while proc.poll() is None:
            time.sleep(0.5)
            elapsed.refresh()


def build_index(vectors: Path, index: Path, threads: int | None = None, heap: str = "4g",
                overwrite: bool = False, progress: bool = True, builder: str = "direct") -> IndexRecord:
    """Index the shards listed in `vectors`' manifest into `index`, published only when complete and verified
    (engines.publish: a work directory beside the index, locks, stopped builds cleaned up). Ids given twice are
    refused before anything is written. `threads` defaults to the cores this process may use; `heap` is per writer
    process.
    """
    if builder not in BUILDERS:
        raise LsrIndexError(f"unknown builder {builder!r}: choose one of {', '.join(BUILDERS)}")
    heap_mb(heap)

    def make(manifest: Manifest, work: Path) -> tuple[Path, IndexRecord]:
        return _build(vectors, manifest, index, work, builder, threads, heap, progress)

    return build_published(vectors, index, make, overwrite=overwrite, progress=progress)


def _build(vectors: Path, manifest: Manifest, index: Path, work: Path, builder: str, threads: int | None,
           heap: str, progress: bool) -> tuple[Path, IndexRecord]:
    built = work / "index"
    t0 = time.perf_counter()
    if builder == "direct":
        writers, postings = _build_direct(vectors, manifest, index, work, built, threads, heap, progress)
    else:
        writers, postings = _build_anserini(vectors, manifest, index, work, built, threads or host_cores(),
                                            heap, progress), None
    seconds = time.perf_counter() - t0
    check_index(built, deep=True)  # before anything reads it: a damaged index is never published
    if postings is not None:
        _check_postings(vectors, manifest, built, postings)
    docs = count_docs(built)
    if docs != manifest.docs:
        raise LsrIndexError(f"the index holds {docs} documents but the manifest lists {manifest.docs}; "
                            "not publishing it" + (_skipped_by_anserini(vectors, manifest) if builder == "anserini"
                                                   else ""))
    return built, IndexRecord(documents=docs, build_seconds=round(seconds, 2), builder=builder, threads=threads,
                              writers=writers, heap=heap, vectors=str(vectors.resolve()), vectors_manifest=manifest)


def _check_postings(vectors: Path, manifest: Manifest, built: Path, expected: int) -> None:
    """A record that names a term twice makes fewer postings than its term count (Lucene adds the two impacts up):
    the writers' readers do not look for one (a set of every line's terms would cost a third of their pass), so the
    index's postings are compared with the term counts summed, and only if they differ are the records read again
    to name it."""
    if count_postings(built) == expected:
        return
    for shard in sorted(manifest.shards, key=lambda s: s.start):
        try:
            for _ in read_shard(vectors / shard.file):
                pass
        except ShardError as exc:
            raise LsrIndexError(f"{exc}; nothing was published") from None
    raise LsrIndexError(f"the index holds {count_postings(built):,} postings but its documents have {expected:,} terms "
                        "with an impact, and no record names a term twice; not publishing it")


def _skipped_by_anserini(vectors: Path, manifest: Manifest) -> str:
    """Why documents are missing: Anserini skips a document whose vector is empty (no positive impact)."""
    for shard in manifest.shards:
        for doc_id, vector in read_shard(vectors / shard.file):
            if not any(w > 0 for w in vector.values()):
                return (f": document {doc_id!r} in {vectors / shard.file} has an empty vector, which the anserini "
                        "builder skips; build with --builder direct, which indexes it (it is never retrieved)")
    return ""


# --- the direct builder -------------------------------------------------------------------------------

class _Writers:
    """The writer processes (PythonChild, each ending with this process), their progress and their failures. What a
    writer's JVM prints is captured: it stays off the terminal, and names a writer's death."""

    def __init__(self) -> None:
        self.children: list[PythonChild] = []
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()

    def start(self, count: int, heap: str) -> None:
        """Start `count` writers, each starting its JVM at once; `send` hands them their work."""
        for k in range(count):
            child = PythonChild("lsr_index.engines.lucene.writer:writer_main", f"index writer {k}", capture=True)
            self.children.append(child)
            self._send(child, {"writer": k, "heap": heap})
        for child in self.children:
            threading.Thread(target=relay, args=(child, self.inbox, ("done", "refused", "failed")),
                             daemon=True).start()

    def send(self, jobs: list[dict]) -> None:
        for child, job in zip(self.children, jobs):
            self._send(child, job)

    @staticmethod
    def _send(child: PythonChild, message: object) -> None:
        with contextlib.suppress(OSError):  # dead already: its relay says so
            pickle.dump(message, child.stdin)
            child.stdin.flush()

    def wait(self, index: Path, update: Callable[[int], object], merging: Callable[[], object]) -> int:
        """Until every writer is done; `update(n)` with each count of documents reported, `merging()` once the
        merging writer has been told to merge. The first failure raises (`stop` ends the rest). Returns the
        postings the writers' documents should make."""
        finished: set[int] = set()
        postings = 0
        while len(finished) < len(self.children):
            kind, *body = self.inbox.get()
            if kind == "indexed":
                update(body[1])
            elif kind == "done":
                finished.add(body[0])
                postings += body[1]
                if finished == set(range(1, len(self.children))):  # all but the merger: it may merge now
                    with contextlib.suppress(OSError):  # it died just now: its relay says how
                        pickle.dump(MERGE, self.children[0].stdin)
                        self.children[0].stdin.flush()
                    merging()
            elif kind == "refused":  # a record or document that cannot be indexed: the writer named it
                raise LsrIndexError(f"{body[1]}; nothing was published")
            else:
                raise LsrIndexError(f"building {index}: an index writer {self._how(kind, body)}"
                                    + (" (free some space and rerun)" if _disk_full(self._how(kind, body)) else "")
                                    + "; nothing was published")
        return postings

    @staticmethod
    def _how(kind: str, body: list) -> str:
        if kind == "failed":
            return f"failed: {body[1]}"
        child: PythonChild = body[0]  # gone without a word
        code = child.exit_code(10)
        if code is not None and code < 0:
            return f"was killed by signal {signal.Signals(-code).name}"
        said = child.said().strip().splitlines()
        return f"failed: {said[-1] if said else f'exit status {code}'}"

    def stop(self, finished: bool) -> None:
        for child in self.children:
            child.close(finished=finished)


def _disk_full(text: str) -> bool:
    return any(s in text for s in ("No space left", "Disk quota", "File too large"))


def _build_direct(vectors: Path, manifest: Manifest, index: Path, work: Path, built: Path, threads: int | None,
                  heap: str, progress: bool) -> tuple[int, int]:
    """The writers used, and the postings their documents should make (see `_check_postings`)."""
    cores = host_cores()
    if threads and threads > cores:
        note(f"--threads {threads}: {cores} core(s) available, so {cores} writer process(es)", progress)
    count = min(threads, cores) if threads else max(1, min(cores, manifest.nonzeros // _MIN_POSTINGS_PER_WRITER))
    plans = split_ranges(vectors, manifest.shards, count) or [[]]
    # writer 0 writes the index itself, then adds the others' sub-indexes to it
    subs = [built, *(work / f"part-{k}" for k in range(1, len(plans)))]
    jobs = [{"index": str(sub), "heap": heap, "parts": [vars(p) for p in plan]} for sub, plan in zip(subs, plans)]
    jobs[0]["merge"] = [str(s) for s in subs[1:]]
    writers, finished = _Writers(), False
    try:
        writers.start(len(jobs), heap)  # their JVMs start while the ids are checked
        check_ids(vectors, manifest, progress)
        with bar(progress, total=manifest.docs, unit=" doc",
                 desc=f"index ({len(plans)} writer{'s' if len(plans) > 1 else ''})") as indexing:
            writers.send(jobs)
            postings = writers.wait(index, indexing.update, merging=lambda: indexing.set_description("merge"))
        finished = True
    finally:  # Ctrl-C or a failure: no writer outlives this build
        writers.stop(finished)
    return len(plans), postings


# --- Anserini's builder -------------------------------------------------------------------------------

# What Anserini's WhitespaceAnalyzer splits a fake-word text at: Java's Character.isWhitespace (the Unicode space,
# line and paragraph separators but the three no-break spaces, and nine ASCII controls); and the longest token it
# keeps whole, in UTF-16 units (a longer one is cut into pieces).
_JAVA_WHITESPACE = re.compile("[" + re.escape("".join(
    c for c in map(chr, range(0x10000)) if unicodedata.category(c) in ("Zs", "Zl", "Zp") and c not in "\xa0\u2007\u202f"
) + "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f") + "]")
_ANSERINI_TOKEN = 255
INT32_MAX = 2**31 - 1


def anserini_problem(vector: dict) -> str | None:
    """What in `vector` Anserini's fake-word indexing would not index as written (a term it splits, cuts or drops;
    an impact it reads otherwise), or None."""
    total = 0
    for term, weight in vector.items():
        if problem := term_problem(term):
            return problem
        if found := _JAVA_WHITESPACE.search(term):
            return f"the term {shown(term)}, whose U+{ord(found.group()):04X} splits Anserini's fake words"
        if len(term) > _ANSERINI_TOKEN // 2 and len(term[:-1].encode("utf-16-le")) // 2 >= _ANSERINI_TOKEN:
            return (f"the term {shown(term)} of {len(term.encode('utf-16-le')) // 2:,} UTF-16 units, which "
                    f"Anserini's analyzer cuts into pieces of {_ANSERINI_TOKEN}")
        if not isinstance(weight, int) or isinstance(weight, bool) or weight > INT32_MAX:
            return f"the impact {weight!r} of the term {shown(term)}, not an integer of at most {INT32_MAX:,}"
        total += max(weight, 0)
    if total > INT32_MAX:
        return f"impacts summing to {total:,}, past Lucene's {INT32_MAX:,} tokens a document"
    return None


def _check_for_anserini(vectors: Path, manifest: Manifest, progress: bool) -> None:
    """Refuse, before Anserini writes anything, a record it would index otherwise than written (every record is
    read: a term given twice, which Anserini's JSON reader resolves silently, is refused there too)."""
    with bar(progress, total=manifest.docs, unit=" doc", desc="check vectors") as checking:
        for shard in sorted(manifest.shards, key=lambda s: s.start):
            path = vectors / shard.file
            try:
                for number, (doc_id, vector) in enumerate(read_shard(path), 1):
                    if problem := anserini_problem(vector):
                        raise LsrIndexError(
                            f"{record_place(str(path), number)}: record {doc_id!r} holds {problem}: the anserini "
                            "builder cannot index it as written; build with --builder direct (the default), which "
                            "indexes every term exactly; nothing was published")
            except ShardError as exc:
                raise LsrIndexError(f"{exc}; nothing was published") from None
            checking.update(shard.docs)


def _build_anserini(vectors: Path, manifest: Manifest, index: Path, work: Path, built: Path, threads: int,
                    heap: str, progress: bool) -> int:
    _check_for_anserini(vectors, manifest, progress)
    check_ids(vectors, manifest, progress)
    _stage_input(vectors, manifest, work / "input")
    log = work / "build.log"
    cmd = [str(java_home() / "bin" / "java"), f"-Xmx{heap}", "-cp", str(anserini_jar()),
           "io.anserini.index.IndexCollection", "-collection", "JsonVectorCollection",
           "-input", str(work / "input"), "-index", str(built),
           "-generator", "DefaultLuceneDocumentGenerator", "-impact", "-pretokenized",
           "-threads", str(threads)]
    with open(log, "wb") as sink:
        proc = subprocess.Popen(dying_with_this_process(cmd), stdout=sink, stderr=subprocess.STDOUT)
        watcher = threading.Thread(target=_watch, args=(proc, manifest.docs, progress), daemon=True)
        try:
            watcher.start()
            proc.wait()
        finally:  # Ctrl-C or any error here: the indexer must not outlive this build
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            watcher.join()
    tail = log.read_text(errors="replace").strip().splitlines()[-8:]
    if proc.returncode != 0 or not built.is_dir():
        how = f"killed by signal {signal.Signals(-proc.returncode).name}" if proc.returncode < 0 \
            else f"exit status {proc.returncode}"
        raise LsrIndexError(f"Lucene indexing failed ({how}); nothing was published. Indexer log:\n  "
                            + "\n  ".join(tail))
    if any(s in line for line in tail for s in ("No space left", "Disk quota")):
        raise LsrIndexError(f"building {index}: Lucene could not write the index: "
                            f"{next(line for line in tail if 'No space left' in line or 'Disk quota' in line)}"
                            " (free some space and rerun); nothing was published")
    return 1
