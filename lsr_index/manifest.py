"""The manifest: what an output directory holds, how it was made, and proof that each shard is whole.

Every stage reads its input's manifest instead of trusting file names: `build` indexes only the shards
listed (with matching checksums), `search` encodes queries with the model and quantization recorded,
and a rerun of `encode` encodes only the shards not recorded yet.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath

from .errors import LsrIndexError

MANIFEST = "manifest.json"
FORMAT_VERSION = 1


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


_FILE_MODE = 0o666 & ~_umask()  # what open() would give: mkstemp's 0600 would hide outputs from other users


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
            os.fchmod(f.fileno(), _FILE_MODE)
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


@dataclass
class Shard:
    file: str  # relative to the manifest's directory
    start: int  # index of its first document in the input stream
    docs: int
    nonzeros: int
    sha256: str


@dataclass
class Manifest:
    model: dict  # name, sha256
    encoder: dict  # max lengths, backend, dtype
    quantization: dict
    input: dict  # files (path, bytes, mtime_ns), fields, on_error
    output_format: str
    shard_docs: int = 0  # documents per shard: shard k holds [k·shard_docs, (k+1)·shard_docs)
    shards: list[Shard] = field(default_factory=list)
    complete: bool = False
    skipped: int = 0
    stats: dict = field(default_factory=dict)
    kind: str = "lsr-index/vectors"
    version: int = FORMAT_VERSION

    @property
    def docs(self) -> int:
        return sum(s.docs for s in self.shards)

    @property
    def nonzeros(self) -> int:
        return sum(s.nonzeros for s in self.shards)

    def fingerprint(self) -> dict:
        """What must match for a rerun to continue this output rather than start over."""
        return {"model": self.model, "encoder": {k: v for k, v in self.encoder.items() if k != "backend"},
                "quantization": self.quantization, "input": self.input, "output_format": self.output_format,
                "shard_docs": self.shard_docs}

    def to_json(self) -> bytes:
        body = asdict(self)
        body["docs"], body["nonzeros"] = self.docs, self.nonzeros
        return json.dumps(body, indent=2, ensure_ascii=False).encode() + b"\n"

    def save(self, directory: Path) -> None:
        atomic_write_bytes(directory / MANIFEST, self.to_json())

    @classmethod
    def load(cls, directory: Path) -> Manifest:
        path = directory / MANIFEST
        try:
            body = json.loads(path.read_bytes())
        except FileNotFoundError:
            raise LsrIndexError(f"{directory}: no {MANIFEST} (is this an lsr-index output directory?)") from None
        except OSError as exc:
            raise LsrIndexError(f"{path}: cannot read the manifest: {os_cause(exc)}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise LsrIndexError(f"{path}: unreadable manifest (not valid JSON: {exc}); it was edited or damaged: "
                                "restore it, or rerun `lsr-index encode --overwrite`") from None
        return cls.from_dict(body, str(path))

    @classmethod
    def from_dict(cls, body: dict, origin: str) -> Manifest:
        """Check everything later stages rely on: an edited or hostile manifest fails here, clearly."""
        if not isinstance(body, dict) or body.get("kind") != "lsr-index/vectors" \
                or body.get("version") != FORMAT_VERSION:
            raise LsrIndexError(f"{origin}: not an lsr-index vectors manifest of version {FORMAT_VERSION}")
        body = {k: v for k, v in body.items() if k not in ("docs", "nonzeros")}
        problem = _check_fields(body)
        if problem:
            raise LsrIndexError(f"{origin}: malformed manifest: {problem}")
        try:
            shards = [Shard(**s) for s in body.pop("shards")]
            manifest = cls(shards=shards, **body)
        except TypeError as exc:
            raise LsrIndexError(f"{origin}: malformed manifest: {exc}") from None
        seen = set()
        for shard in shards:  # a manifest must never point outside its own directory
            path = PurePosixPath(shard.file)
            if path.is_absolute() or ".." in path.parts or "\\" in shard.file or not path.parts:
                raise LsrIndexError(f"{origin}: shard path {shard.file!r} is not a relative path inside the "
                                    "output directory; refused")
            if path in seen:
                raise LsrIndexError(f"{origin}: malformed manifest: shard {shard.file!r} is listed twice")
            seen.add(path)
        return manifest


_SHARD_FIELDS = {"file": str, "start": int, "docs": int, "nonzeros": int, "sha256": str}
_DICT_FIELDS = ("model", "encoder", "quantization", "input", "stats")
_NEEDED = (("model", "name", (str,)), ("model", "sha256", (str,)), ("encoder", "query_max_length", (int,)),
           ("quantization", "scale", (int, float)))


def _check_fields(body: dict) -> str | None:
    """What is wrong with the types of a manifest's fields, if anything (not: whether the files exist)."""
    shards = body.get("shards")
    if not isinstance(shards, list):
        return "'shards' must be a list"
    for number, shard in enumerate(shards):
        if not isinstance(shard, dict):
            return f"shard {number} is not an object"
        for key, kind in _SHARD_FIELDS.items():
            value = shard.get(key)
            if not isinstance(value, kind) or isinstance(value, bool) or (kind is int and value < 0):
                return f"shard {number}: {key!r} must be a{' non-negative' if kind is int else ''} " \
                       f"{kind.__name__}, got {value!r}"[:300]
        if not shard["file"] or "\0" in shard["file"]:
            return f"shard {number}: empty or invalid file name"
        if len(shard["sha256"]) != 64 or any(c not in "0123456789abcdef" for c in shard["sha256"]):
            return f"shard {number}: 'sha256' is not a sha256 hex digest"
    for key in _DICT_FIELDS:
        if key in body and not isinstance(body[key], dict):
            return f"{key!r} must be an object"
    if not isinstance(body.get("output_format"), str):
        return "'output_format' must be a string"
    for section, key, kinds in _NEEDED:  # what `search` reads back to encode queries like the documents
        value = body.get(section, {}).get(key) if isinstance(body.get(section), dict) else None
        if not isinstance(value, kinds) or isinstance(value, bool):
            return f"'{section}.{key}' is missing or not a {' or '.join(k.__name__ for k in kinds)}"
    for key, kind in (("complete", bool), ("skipped", int)):
        if key in body and not isinstance(body[key], kind):
            return f"{key!r} must be a {kind.__name__}"
    return None
