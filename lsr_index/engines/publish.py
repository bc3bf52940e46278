"""How every engine's build is published: in a work directory beside the index, under locks, verified, then moved
into place in one step (an old generation swapped out atomically where Linux allows, and retired once no search
holds it). An engine supplies only `make`: the index built inside the work directory, and its record.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import os
import re
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from lsr_index.engines.index import INDEX_MANIFEST, IndexRecord
from lsr_index.engines.seismic.layout import FILES as SEISMIC_FILES
from lsr_index.engines.seismic.layout import RECORD as SEISMIC_RECORD
from lsr_index.errors import LsrIndexError
from lsr_index.runtime.durable import atomic_write_bytes, exclusive_lock, fsync_directory, os_cause, write_error
from lsr_index.runtime.progress import bar
from lsr_index.vectors.manifest import Manifest
from lsr_index.vectors.shards import ShardError, verify_shards
from lsr_index.vectors.unique import repeated_id

# What a build leaves in an index: Lucene's files (IndexFileNames: segments_N, the segments' `_N…` files, write.lock),
# Seismic's (engines/seismic/layout.py) and the record. Anything else was put there by someone, and --overwrite would
# delete it with the old generation.
_INDEX_FILE = re.compile(r"(pending_)?segments_[0-9a-z]+|_[0-9a-z]+(_.*)?\..*|write\.lock|"
                         + "|".join(map(re.escape, (INDEX_MANIFEST, SEISMIC_RECORD, *SEISMIC_FILES))))

Make = Callable[[Manifest, Path], tuple[Path, IndexRecord]]


def build_published(vectors: Path, index: Path, make: Make, *, overwrite: bool = False,
                    progress: bool = True) -> IndexRecord:
    """Build the index of `vectors`' shards with `make(manifest, work)` (which returns the directory it built inside
    `work`, and its record) and publish it at `index` only when complete and verified.

    The work happens in `.INDEX.building-PID` next to the index, under a lock (a second build of the same
    index is refused); a shared lock on `vectors` keeps `encode` from rewriting the shards meanwhile. A
    build stopped by SIGINT or SIGTERM removes its work directory before it ends; one killed outright (SIGKILL, a
    crash) leaves no index (nor anything named like one), and the next build of the same index removes its work
    directory, saying so. The shards' checksums are verified before `make` runs.
    """
    if index.name in ("", ".."):  # `--index .`: its lock and work directory go beside it, not inside it (EBUSY)
        index = Path(os.path.abspath(index))
    with terminate_unwinds(), exclusive_lock(vectors, shared=True):
        manifest = Manifest.load(vectors)
        if not manifest.complete:
            raise LsrIndexError(f"{vectors}: the encoding is incomplete; rerun `lsr-index encode` to finish it")
        with bar(progress, total=len(manifest.shards), desc="check shards", unit=" shard") as checking:
            verify_shards(vectors, manifest, checking.update)
        check_target(vectors, index, overwrite)
        try:
            index.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise write_error(index.parent, exc, "create the directory") from exc
        with exclusive_lock(index.parent, name=f".{index.name}.lock", label=index):
            check_target(vectors, index, overwrite)  # the index may have been built since the check above
            remove_stale(index)
            remove_retired(index)
            work = index.parent / f".{index.name}.building-{os.getpid()}"
            try:
                work.mkdir()
                built, record = make(manifest, work)
                atomic_write_bytes(built / INDEX_MANIFEST, record.to_json())
                publish(built, index, work)
                return record
            except OSError as exc:
                raise LsrIndexError(f"building {index}: {os_cause(exc)} (at {exc.filename or work}); nothing "
                                    "was published") from exc
            finally:
                shutil.rmtree(work, ignore_errors=True)


def check_ids(vectors: Path, manifest: Manifest, progress: bool) -> None:
    """Refuse ids given twice, before anything is indexed (see vectors.unique)."""
    try:
        with bar(progress, total=manifest.docs, unit=" doc", desc="check ids") as checking:
            twice = repeated_id(vectors, manifest, checking.update)
    except ShardError as exc:
        raise LsrIndexError(f"{exc}; nothing was published") from None
    if twice:
        raise LsrIndexError(f"{twice}; nothing was published")


def exchange(a: Path, b: Path) -> bool:
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


def _retire(old: Path, index: Path) -> None:
    """Delete a replaced index generation, unless a search still holds it (a shared flock on the directory):
    then it waits, hidden next to the index as `.INDEX.retired-PID`, for a later build to remove it."""
    fd = os.open(old, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        target = index.parent / f".{index.name}.retired-{os.getpid()}"
        n = 0
        while target.exists() or target.is_symlink():
            n += 1
            target = index.parent / f".{index.name}.retired-{os.getpid()}.{n}"
        old.rename(target)
        fsync_directory(index.parent)
    else:
        shutil.rmtree(old, ignore_errors=True)
    finally:
        os.close(fd)


def remove_retired(index: Path) -> None:
    """Remove the replaced generations that no search holds any more."""
    for old in index.parent.glob(f".{glob.escape(index.name)}.retired-*"):
        if old.is_symlink() or not old.is_dir():
            continue
        try:
            fd = os.open(old, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(old, ignore_errors=True)
        except BlockingIOError:
            pass  # still searched
        finally:
            os.close(fd)


def publish(built: Path, index: Path, work: Path) -> None:
    """Move the finished index into place; an old one is swapped out atomically where Linux allows, then
    retired (deleted, or kept until its searches end)."""
    if index.exists() or index.is_symlink():
        old = built
        if not exchange(built, index):  # the old index now sits at `built`, inside `work`
            old = work / "replaced"
            index.rename(old)
            built.rename(index)
        fsync_directory(index.parent)
        _retire(old, index)
    else:
        built.rename(index)
        fsync_directory(index.parent)


def check_target(vectors: Path, index: Path, overwrite: bool) -> None:
    """`--overwrite` replaces only an lsr-index index (it has lsr-index.json), of any engine, or an empty directory,
    and never the input: a directory that is or contains the vectors, or anything reached through a symbolic link."""
    if index.is_symlink():
        raise LsrIndexError(f"{index} is a symbolic link; lsr-index build writes only a directory it creates: "
                            "point --index at a new path or at the real directory")
    if not index.exists():
        return
    if not overwrite:
        raise LsrIndexError(f"{index} exists; pass --overwrite to replace it")
    if not index.is_dir():
        raise LsrIndexError(f"{index} is not a directory; --overwrite replaces only an index: remove it yourself "
                            "or choose another --index")
    real, source = index.resolve(), vectors.resolve()
    if real == source or real in source.parents:
        raise LsrIndexError(f"{index} holds the input vectors ({vectors}); --overwrite never replaces them: "
                            "choose another --index")
    record = index / INDEX_MANIFEST
    if not (record.is_file() and not record.is_symlink()) and any(index.iterdir()):
        raise LsrIndexError(f"{index} is not an lsr-index index (no {INDEX_MANIFEST}) and not empty; --overwrite "
                            "replaces only an index made by `lsr-index build`: choose another --index")
    foreign = sorted(p.name for p in index.iterdir() if not (_INDEX_FILE.fullmatch(p.name) and p.is_file()))
    if foreign:
        raise LsrIndexError(f"{index} holds {foreign[0]!r}, which lsr-index build did not write; --overwrite would "
                            "delete it with the old index: move it out, or choose another --index")


class _Terminated(KeyboardInterrupt):
    """SIGTERM, unwinding the build like Ctrl-C: every `finally` removes what it made."""


@contextlib.contextmanager
def terminate_unwinds() -> Iterator[None]:
    """Where SIGTERM would end the process where it stands (its default: the caller set no handler), it unwinds the
    build instead, then ends the process by SIGTERM all the same, once the work directory is gone. A handler the
    caller set (the CLI's) is left alone."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def terminate(signum, frame) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the cleanup must not be cut short by another
        raise _Terminated

    signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    except _Terminated:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        raise
    finally:
        if signal.getsignal(signal.SIGTERM) in (terminate, signal.SIG_IGN):
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def remove_stale(index: Path) -> None:
    """Remove the work directories of builds of this index that were killed outright (this build holds the index's
    lock, so no other build of it runs), each with one line."""
    pattern = re.compile(re.escape(f".{index.name}.building-") + r"\d+")
    for stale in index.parent.glob(f".{glob.escape(index.name)}.building-*"):
        if pattern.fullmatch(stale.name) and stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
            print(f"note: removed {stale}, the work directory of an earlier build of {index} that was killed",
                  file=sys.stderr)
