"""The manifest: what an output directory holds, how it was made, and proof that each shard is whole.

Every stage reads its input's manifest instead of trusting file names: `build` indexes only the shards
listed (with matching checksums), `search` encodes queries with the model and quantization recorded,
and a rerun of `encode` resumes after the last shard recorded.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .errors import LsrIndexError

MANIFEST = "manifest.json"
FORMAT_VERSION = 1


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary name in the same directory, fsync, then rename: readers see all or nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def exclusive_lock(directory: Path, name: str = ".lock") -> Iterator[None]:
    """Refuse a second writer on the same output (flock: the kernel releases it even on SIGKILL)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / name, "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LsrIndexError(f"{directory} is being written by another lsr-index process") from None
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
    model: dict  # name, sha256, vocab_size
    encoder: dict  # max lengths, backend, dtype
    quantization: dict
    input: dict  # files (name, bytes), fields, on_error
    output_format: str
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
                "quantization": self.quantization, "input": self.input, "output_format": self.output_format}

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
            body = json.loads(path.read_text())
        except FileNotFoundError:
            raise LsrIndexError(f"{directory}: no {MANIFEST} (is this an lsr-index output directory?)") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise LsrIndexError(f"{path}: unreadable manifest: {exc}") from None
        return cls.from_dict(body, str(path))

    @classmethod
    def from_dict(cls, body: dict, origin: str) -> Manifest:
        if not isinstance(body, dict) or body.get("kind") != "lsr-index/vectors" \
                or body.get("version") != FORMAT_VERSION:
            raise LsrIndexError(f"{origin}: not an lsr-index vectors manifest of version {FORMAT_VERSION}")
        body = {k: v for k, v in body.items() if k not in ("docs", "nonzeros")}
        try:
            shards = [Shard(**s) for s in body.pop("shards")]
            manifest = cls(shards=shards, **body)
        except TypeError as exc:
            raise LsrIndexError(f"{origin}: malformed manifest: {exc}") from None
        for shard in shards:  # a manifest must never point outside its own directory
            if Path(shard.file).is_absolute() or ".." in Path(shard.file).parts:
                raise LsrIndexError(f"{origin}: shard path {shard.file!r} leaves the output directory")
        return manifest
