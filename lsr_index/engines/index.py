"""An index directory as every engine publishes it: its record (lsr-index.json: the engine, how it was built, and the
vectors manifest it was built from) and one generation of it opened and share-locked for a whole search.
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path

from lsr_index.errors import LsrIndexError
from lsr_index.runtime.durable import os_cause
from lsr_index.vectors.manifest import Manifest

INDEX_MANIFEST = "lsr-index.json"
INDEX_KIND = "lsr-index/index"
ENGINES = ("lucene", "seismic")  # Lucene first: the default, and the exact reference


@dataclass(frozen=True)
class IndexRecord:
    """What a build published (the index's lsr-index.json): the engine and how it built, and the vectors manifest
    it was built from, whose model and quantization `search` encodes queries with. `search` reads the engine here:
    a record without one is a Lucene index's (the only engine of earlier releases)."""

    documents: int
    build_seconds: float
    builder: str
    threads: int | None  # as asked (None: the default)
    writers: int
    heap: str | None  # the JVM heap of each Lucene writer; None for an engine without a JVM
    vectors: str  # the vectors directory it was built from
    vectors_manifest: Manifest
    engine: str = "lucene"
    settings: dict = field(default_factory=dict)  # the engine's own build settings and counts (Seismic's knobs)
    kind: str = INDEX_KIND

    def to_json(self) -> bytes:
        body = {f.name: getattr(self, f.name) for f in fields(self)}
        body["vectors_manifest"] = json.loads(self.vectors_manifest.to_json())
        return json.dumps(body, indent=2).encode() + b"\n"

    @classmethod
    def from_dict(cls, info: object, origin: str) -> IndexRecord:
        if not isinstance(info, dict) or info.get("kind") != INDEX_KIND or "vectors_manifest" not in info:
            raise LsrIndexError(f"{origin}: not an lsr-index index record; rebuild the index with `lsr-index build "
                                "--overwrite`")
        known = {f.name for f in fields(cls)}
        body = {k: v for k, v in info.items() if k in known}
        body["vectors_manifest"] = Manifest.from_dict(info["vectors_manifest"], origin)
        try:
            record = cls(**body)
        except TypeError as exc:
            raise LsrIndexError(f"{origin}: malformed index record ({exc}); rebuild the index with `lsr-index build "
                                "--overwrite`") from None
        if record.engine not in ENGINES:
            raise LsrIndexError(f"{origin}: an index of engine {record.engine!r}, which this lsr-index does not know "
                                f"(it knows {', '.join(ENGINES)})")
        if not isinstance(record.settings, dict):
            raise LsrIndexError(f"{origin}: malformed index record ('settings' is not an object); rebuild the index "
                                "with `lsr-index build --overwrite`")
        return record


class IndexGeneration:
    """One generation of an index directory, opened once and share-locked (flock) until closed.

    `build --overwrite` publishes a new generation with RENAME_EXCHANGE and deletes the old one only after
    taking LOCK_EX on it. Everything read through this handle (the record, and Lucene's files through
    `/proc/self/fd/N`) therefore belongs to the generation opened, whatever is published meanwhile: queries are
    never encoded with one generation's model and scored against another's postings.
    """

    def __init__(self, index: Path):
        self.index = index
        for _ in range(10):
            try:
                fd = os.open(index, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except FileNotFoundError:
                raise LsrIndexError(f"{index}: no index here; build one with `lsr-index build`") from None
            except NotADirectoryError:
                raise LsrIndexError(f"{index}: not an index directory (it is a file); build one with "
                                    "`lsr-index build`") from None
            except OSError as exc:
                raise LsrIndexError(f"{index}: cannot open the index: {os_cause(exc)}") from None
            fcntl.flock(fd, fcntl.LOCK_SH)  # a builder deleting this generation waits for us (LOCK_EX)
            if self._published(fd):  # not a replaced generation that a builder deleted before we locked it
                break
            os.close(fd)
        else:
            raise LsrIndexError(f"{index}: replaced again and again while it was being opened; rerun")
        self.fd = fd
        proc = f"/proc/self/fd/{fd}"
        try:
            self.lucene_path = proc if os.path.samestat(os.stat(proc), os.fstat(fd)) else str(index)
        except OSError:  # no /proc: Lucene opens the path, and `holds` tells whether it got this generation
            self.lucene_path = str(index)
        # where an engine reads the generation's files: through the open directory where /proc allows
        self.files = Path(self.lucene_path)

    def _published(self, fd: int) -> bool:
        try:
            return os.path.samestat(os.stat(self.index), os.fstat(fd))
        except OSError:
            return False

    def holds(self, path: str) -> bool:
        """Whether `path` (where Lucene resolved the index to) is this generation's directory."""
        try:
            return os.path.samestat(os.stat(path), os.fstat(self.fd))
        except OSError:
            return False

    def record(self) -> IndexRecord:
        """The index's own record, with the vectors manifest it was built from (model, quantization)."""
        path = self.index / INDEX_MANIFEST
        try:
            fd = os.open(INDEX_MANIFEST, os.O_RDONLY | os.O_CLOEXEC, dir_fd=self.fd)
            with os.fdopen(fd, "rb") as f:
                info = json.loads(f.read())
        except FileNotFoundError:
            raise LsrIndexError(f"{self.index}: not an lsr-index index (no {INDEX_MANIFEST}); build one with "
                                "`lsr-index build`") from None
        except OSError as exc:
            raise LsrIndexError(f"{path}: cannot read it: {os_cause(exc)}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise LsrIndexError(f"{path}: not valid JSON ({exc}); rebuild the index with `lsr-index build "
                                "--overwrite`") from None
        return IndexRecord.from_dict(info, str(path))

    def size(self) -> int:
        """Bytes in the generation's files."""
        return sum(os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_size for name in os.listdir(self.fd))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> IndexGeneration:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def index_record(index: Path) -> IndexRecord:
    """The record of the generation of `index` published now."""
    with IndexGeneration(index) as generation:
        return generation.record()
