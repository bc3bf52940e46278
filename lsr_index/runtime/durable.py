"""Durable, owned files: atomic replacement, fsync, a writer's lock, and OSErrors as one clear line.

Nothing here follows a symbolic link out of the directory it was given: a link planted where an output goes is
refused, never written through (a command writes and deletes only what it owns).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lsr_index.errors import LsrIndexError


def _umask() -> int:
    try:  # Linux reports it without changing it
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


FILE_MODE = 0o666 & ~_umask()  # what open() would give: mkstemp's 0600 would hide outputs from other users


def os_cause(exc: OSError) -> str:
    """'No space left on device [ENOSPC]': the reason, and its errno name to search for."""
    code = errno.errorcode.get(exc.errno, "") if exc.errno else ""
    if code:  # the system's own words: Arrow wraps them in "Error writing bytes to file. Detail: …"
        return f"{os.strerror(exc.errno)} [{code}]"
    return str(exc.strerror or exc)


def write_error(path: Path, exc: OSError, what: str = "write") -> LsrIndexError:
    """An OSError from writing, as one line naming the file and the cause (disk full, quota, permissions)."""
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
    return LsrIndexError(f"{path}: cannot {what}: {os_cause(exc)}" + (" (free some space and rerun)" if full else ""))


def real_path(path: str | os.PathLike[str]) -> Path:
    """Where a path leads, links followed, never raising: Path.resolve raises on a link loop (Python 3.11), which
    the readers and writers then name with their own message."""
    return Path(os.path.realpath(path))


def refuse_symlink(path: Path, what: str) -> None:
    """An output path must be our own file or directory: a link would carry writes and deletes elsewhere."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise LsrIndexError(f"{path}: cannot inspect the {what}: {os_cause(exc)}") from None
    if stat.S_ISLNK(mode):
        raise LsrIndexError(f"{path}: the {what} is a symbolic link; lsr-index writes and deletes only inside "
                            "its own output, so it refuses to follow it: remove the link or choose another output")


def create_new(path: Path) -> int:
    """A new file for writing, never through a link or over an existing file (O_EXCL | O_NOFOLLOW)."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                   FILE_MODE)


def fsync_directory(directory: Path) -> None:
    """Make a rename in `directory` durable (a power cut must not undo a published file)."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # e.g. a platform that cannot open directories: the rename itself is still atomic
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):  # some filesystems cannot sync a directory
            raise
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary name in the same directory, fsync, then rename: readers see all or nothing.

    On failure (disk full, quota, permissions) the old file, if any, is untouched, the temporary file is
    removed, and the error is an LsrIndexError naming the file and the cause.
    """
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), FILE_MODE)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        fsync_directory(path.parent)
    except OSError as exc:
        raise write_error(path, exc) from exc
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


@contextmanager
def exclusive_lock(directory: Path, name: str = ".lock", shared: bool = False, label: Path | None = None
                   ) -> Iterator[None]:
    """Refuse a second writer on the same output (flock: the kernel releases it even on SIGKILL).

    `shared=True` is a reader's lock: any number of readers, but no writer meanwhile (and no reader while
    a writer holds it). A reader that cannot create the lock file (a read-only directory) goes on without.
    `label` is what the message names as busy (default: the directory).
    """
    lock = directory / name
    try:
        if not shared:
            directory.mkdir(parents=True, exist_ok=True)
        handle = open(lock, "a")  # noqa: SIM115 (held for the whole block below)
    except OSError as exc:
        if not shared:
            raise write_error(lock, exc, "create the lock file") from exc
        handle = None
    if handle is None:
        yield
        return
    with handle:
        try:
            fcntl.flock(handle, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            busy = "being written" if shared else "in use"
            raise LsrIndexError(f"{label or directory} is {busy} by another lsr-index process (it holds {lock}); "
                                "wait for it to finish or stop it, then rerun") from None
        yield

def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()
