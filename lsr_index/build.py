"""The build stage: vectors shards → a Lucene impact index, verified and published atomically.

Indexing runs in a `java` subprocess: its heap is set per run and it can be killed without harm.
"""

from __future__ import annotations

import errno
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from .errors import LsrIndexError
from .lucene import INDEX_MANIFEST, anserini_jar, count_docs, java_home
from .manifest import MANIFEST, Manifest, atomic_write_bytes, exclusive_lock, fsync_directory, os_cause, write_error
from .writers import json_vector_line, read_shard, verify_shards


def _stage_input(vectors: Path, manifest: Manifest, staging: Path) -> None:
    """Give Anserini exactly the listed shards (never a stray or partial file), in JsonVector form."""
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
    from tqdm import tqdm

    with tqdm(desc=f"index {total:,} docs", unit="s", disable=None if progress else True, dynamic_ncols=True,
              bar_format="{desc}: {elapsed} elapsed") as bar:
        while proc.poll() is None:
            time.sleep(0.5)
            bar.update(0)
            bar.refresh()


# The indexer must die with us. A SIGKILLed parent runs no cleanup, and an orphaned java would go on writing
# into the work directory; so java is started through this launcher, which asks Linux to SIGKILL it when its
# parent dies (PR_SET_PDEATHSIG survives exec), checks that the parent has not died already, and execs java.
# No preexec_fn: that is unsafe once threads (the JVM of jnius, tqdm) exist in this process.
_DIE_WITH_PARENT = """\
import ctypes, os, signal, sys
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
except (OSError, AttributeError):  # not Linux
    pass
if os.getppid() != int(sys.argv[1]):
    sys.exit(1)
os.execv(sys.argv[2], sys.argv[2:])
"""


def _child_command(cmd: list[str]) -> list[str]:
    return [sys.executable, "-I", "-S", "-c", _DIE_WITH_PARENT, str(os.getpid()), *cmd]


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one atomic step (Linux renameat2 RENAME_EXCHANGE); False where that is unsupported."""
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _publish(built: Path, index: Path, work: Path) -> None:
    """Move the finished index into place; an old one is swapped out atomically where Linux allows."""
    if index.exists() or index.is_symlink():
        if not _exchange(built, index):  # the old index now sits at `built`, inside `work`
            index.rename(work / "replaced")
            built.rename(index)
    else:
        built.rename(index)
    fsync_directory(index.parent)


def build_index(vectors: Path, index: Path, threads: int = 2, heap: str = "4g", overwrite: bool = False,
                progress: bool = True) -> dict:
    """Index the shards listed in `vectors`' manifest into `index`, published only when complete and verified.

    The work happens in `.INDEX.building-PID` next to the index, under a lock (a second build of the same
    index is refused); a shared lock on `vectors` keeps `encode` from rewriting the shards meanwhile. A
    build killed at any point leaves no index (nor anything named like one); the next build removes its
    work directory.
    """
    with exclusive_lock(vectors, shared=True):
        manifest = Manifest.load(vectors)
        if not manifest.complete:
            raise LsrIndexError(f"{vectors}: the encoding is incomplete; rerun `lsr-index encode` to finish it")
        verify_shards(vectors, manifest)
        if index.exists() and not overwrite:
            raise LsrIndexError(f"{index} exists; pass --overwrite to replace it")
        try:
            index.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise write_error(index.parent, exc, "create the directory") from exc
        with exclusive_lock(index.parent, name=f".{index.name}.lock", label=index):
            if index.exists() and not overwrite:  # built by another process since the check above
                raise LsrIndexError(f"{index} exists; pass --overwrite to replace it")
            for stale in index.parent.glob(f".{glob.escape(index.name)}.building-*"):  # left by a killed build
                shutil.rmtree(stale, ignore_errors=True)
            work = index.parent / f".{index.name}.building-{os.getpid()}"
            try:
                work.mkdir()
                return _build(vectors, manifest, index, work, threads, heap, progress)
            except OSError as exc:
                raise LsrIndexError(f"building {index}: {os_cause(exc)} (at {exc.filename or work}); nothing "
                                    "was published") from exc
            finally:
                shutil.rmtree(work, ignore_errors=True)


def _build(vectors: Path, manifest: Manifest, index: Path, work: Path, threads: int, heap: str,
           progress: bool) -> dict:
    _stage_input(vectors, manifest, work / "input")
    built = work / "index"
    log = work / "build.log"
    cmd = [str(java_home() / "bin" / "java"), f"-Xmx{heap}", "-cp", str(anserini_jar()),
           "io.anserini.index.IndexCollection", "-collection", "JsonVectorCollection",
           "-input", str(work / "input"), "-index", str(built),
           "-generator", "DefaultLuceneDocumentGenerator", "-impact", "-pretokenized",
           "-threads", str(threads)]
    t0 = time.perf_counter()
    with open(log, "wb") as sink:
        proc = subprocess.Popen(_child_command(cmd), stdout=sink, stderr=subprocess.STDOUT)
        watcher = threading.Thread(target=_watch, args=(proc, manifest.docs, progress), daemon=True)
        try:
            watcher.start()
            proc.wait()
        finally:  # Ctrl-C or any error here: the indexer must not outlive this build
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            watcher.join()
    seconds = time.perf_counter() - t0
    tail = log.read_text(errors="replace").strip().splitlines()[-8:]
    if proc.returncode != 0 or not built.is_dir():
        how = f"killed by signal {signal.Signals(-proc.returncode).name}" if proc.returncode < 0 \
            else f"exit status {proc.returncode}"
        raise LsrIndexError(f"Lucene indexing failed ({how}); nothing was published. Indexer log:\n  "
                            + "\n  ".join(tail))
    docs = count_docs(built)
    if docs != manifest.docs:
        raise LsrIndexError(f"the index holds {docs} documents but the manifest lists {manifest.docs}; "
                            "not publishing it. Indexer log:\n  " + "\n  ".join(tail))
    info = {"kind": "lsr-index/index", "documents": docs, "build_seconds": round(seconds, 2),
            "threads": threads, "heap": heap, "vectors": str(vectors.resolve()),
            "vectors_manifest": json.loads((vectors / MANIFEST).read_text())}
    atomic_write_bytes(built / INDEX_MANIFEST, json.dumps(info, indent=2).encode() + b"\n")
    _publish(built, index, work)
    return info
