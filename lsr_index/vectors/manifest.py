"""The manifest: what an output directory holds, how it was made, and proof that each shard is whole.

Every stage reads its input's manifest instead of trusting file names: `build` indexes only the shards
listed (with matching checksums), `search` encodes queries with the model and quantization recorded,
and a rerun of `encode` encodes only the shards not recorded yet, continuing a shard from its last
checkpointed chunk. Everything read back is validated here: an edited or hostile manifest fails clearly.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, field, fields, is_dataclass
from pathlib import Path, PurePosixPath

from lsr_index.errors import LsrIndexError
from lsr_index.runtime.durable import atomic_write_bytes, os_cause
from lsr_index.settings import check
from lsr_index.vectors.quantize import Quantization

MANIFEST = "manifest.json"
KIND = "lsr-index/vectors"
FORMAT_VERSION = 2  # 2: per-shard input digests and truncation counts, checkpointed chunks
QUERY_MODEL_KEYS = ("name", "sha256", "kind", "vocab_sha256")
QUERY_KINDS = ("splade", "token_weights")  # through a masked LM; from a token-weight table (inference-free)


@dataclass
class Part:
    """Documents [start, start + docs) written to `file`, and what they were made from."""

    file: str  # relative to the manifest's directory
    start: int  # index of its first document in the input stream
    docs: int
    nonzeros: int
    sha256: str  # of the file
    input: str  # digest of its documents' (position, id, text): a resume re-encodes a part whose input changed
    truncated: int = 0  # documents cut at doc_max_length tokens
    longest: int = 0  # tokens in its longest document before the cut
    capped: int = 0  # documents cut at the reader's character bound before tokenizing

    @property
    def end(self) -> int:
        return self.start + self.docs


@dataclass
class Shard(Part):
    """A published shard file: `build` indexes it."""


@dataclass
class Chunk(Part):
    """A checkpoint of shard `shard` still being encoded: a hidden file, concatenated into the shard when it ends."""

    shard: int = 0


@dataclass(frozen=True)
class ModelRecord:
    """The model that encoded the documents: its name (an embedded model's, or its directory) and identity."""

    name: str
    sha256: str


@dataclass(frozen=True)
class QueryModelRecord:
    """What encodes queries: a SPLADE model ("splade") or a token-weight table ("token_weights"), its identity, and
    the identity of its vocabulary (which must be the documents')."""

    name: str
    sha256: str
    kind: str
    vocab_sha256: str


@dataclass(frozen=True)
class EncoderSettings:
    doc_max_length: int
    query_max_length: int
    dtype: str
    backend: str


@dataclass(frozen=True)
class InputFields:
    id: str | None = None
    text: list[str] | None = None


@dataclass(frozen=True)
class InputRecord:
    """What was read: the files in order, the character bound per document, the fields, the bad-record rule."""

    files: list[str] = field(default_factory=list)
    max_chars: int | None = None
    fields: InputFields = field(default_factory=InputFields)
    on_error: str = "fail"


@dataclass(frozen=True)
class Truncation:
    """Documents cut to doc_max_length tokens: count, share, the longest before the cut, and those cut at the
    reader's character bound first."""

    documents: int
    share: float
    longest_tokens: int
    cut_at_characters: int


@dataclass
class WorkerStats:
    """One worker of a run: its device, documents, start-up and rate after it, and how it was given the host."""

    device: str
    docs: int
    startup_seconds: float
    model_loaded_after_seconds: float
    docs_per_second_after_startup: float
    cores: int
    serializers: int
    started: str
    readers: int = 0  # processes reading and tokenizing its input (0: threads of the worker's own process)
    # of the seconds after start-up: the model waiting for input (reading, tokenizing) and for the writer
    input_wait_seconds: float = 0.0
    output_wait_seconds: float = 0.0


@dataclass
class NodeStats:
    node: str
    encoders: int
    docs: int
    docs_per_second: float


@dataclass
class EncodeStats:
    """The last run's timings and rates (not part of what a resume must match)."""

    seconds: float = 0.0
    docs_this_run: int = 0
    resumed_at: int = 0
    stale_parts_reencoded: int = 0
    workers: int = 0
    docs_per_second: float = 0.0
    tokens_per_second: float = 0.0
    nonzeros_per_doc: float = 0.0
    peak_host_memory_mb: float = 0.0
    units: int = 0  # the input's units (lsr_index.inputs.units), which the workers share
    per_worker: list[WorkerStats] = field(default_factory=list)
    per_node: list[NodeStats] | None = None  # a cluster's run


@dataclass
class Manifest:
    model: ModelRecord
    encoder: EncoderSettings
    quantization: Quantization
    input: InputRecord
    output_format: str
    shard_docs: int = 1  # documents per shard: shard k holds [k·shard_docs, (k+1)·shard_docs)
    shards: list[Shard] = field(default_factory=list)
    chunks: list[Chunk] = field(default_factory=list)
    complete: bool = False
    skipped: int = 0
    stats: EncodeStats | None = None
    # what encodes queries; absent (None) in manifests written without one: the document model's directory,
    # encoding queries by its own route
    query_model: QueryModelRecord | None = None
    kind: str = KIND
    version: int = FORMAT_VERSION

    @property
    def docs(self) -> int:
        return sum(s.docs for s in self.shards)

    @property
    def nonzeros(self) -> int:
        return sum(s.nonzeros for s in self.shards)

    @property
    def query(self) -> QueryModelRecord | ModelRecord:
        """The query model's record: name and sha256 always, kind and vocab_sha256 when recorded."""
        return self.query_model or self.model

    @property
    def truncation(self) -> Truncation:
        truncated = sum(s.truncated for s in self.shards)
        return Truncation(documents=truncated, share=round(truncated / max(self.docs, 1), 6),
                          longest_tokens=max((s.longest for s in self.shards), default=0),
                          cut_at_characters=sum(s.capped for s in self.shards))

    def fingerprint(self) -> dict:
        """What must match for a rerun to continue this output rather than start over (the documents
        themselves are checked shard by shard, through each part's input digest)."""
        # not on_error: parts recorded before the first bad record are the same either way, and a run stopped at
        # one says "rerun with --on-error skip"; the documents themselves are checked part by part
        body = _plain(self)
        return {"model": body["model"], "encoder": {k: v for k, v in body["encoder"].items() if k != "backend"},
                "quantization": body["quantization"],
                "input": {k: v for k, v in body["input"].items() if k not in ("files", "on_error")},
                "output_format": self.output_format, "shard_docs": self.shard_docs,
                "query_model": body["query_model"]}

    def to_json(self) -> bytes:
        body = _plain(self)
        body["docs"], body["nonzeros"], body["truncation"] = self.docs, self.nonzeros, asdict(self.truncation)
        return json.dumps(body, indent=1, ensure_ascii=False).encode() + b"\n"

    def save(self, directory: Path) -> None:
        atomic_write_bytes(directory / MANIFEST, self.to_json())

    @classmethod
    def load(cls, directory: Path) -> Manifest:
        path = directory / MANIFEST
        try:
            body = json.loads(path.read_bytes())
        except FileNotFoundError:
            raise LsrIndexError(f"{directory}: no {MANIFEST}: nothing is encoded there; run `lsr-index encode` "
                                "first, or point --vectors at an encode output") from None
        except OSError as exc:
            raise LsrIndexError(f"{path}: cannot read the manifest: {os_cause(exc)}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise LsrIndexError(f"{path}: unreadable manifest (not valid JSON: {exc}); it was edited or damaged: "
                                "restore it, or rerun `lsr-index encode --overwrite`") from None
        return cls.from_dict(body, str(path))

    @classmethod
    def from_dict(cls, body: dict, origin: str) -> Manifest:
        """Check everything later stages rely on: an edited or hostile manifest fails here, clearly."""
        if not isinstance(body, dict) or body.get("kind") != KIND:
            raise LsrIndexError(f"{origin}: not an lsr-index vectors manifest")
        if body.get("version") != FORMAT_VERSION:
            raise LsrIndexError(f"{origin}: a vectors manifest of format version {body.get('version')!r}, this "
                                f"lsr-index reads version {FORMAT_VERSION}: re-encode with `lsr-index encode "
                                "--overwrite` (or use the lsr-index release that wrote it)")
        recorded = body.get("docs")  # written as the shards' sum: an edit of either shows as a difference
        body = {k: v for k, v in body.items() if k not in ("docs", "nonzeros", "truncation")}
        try:
            shards = [_part(Shard, s, f"shard {n}") for n, s in enumerate(_list(body.pop("shards", None), "shards"))]
            chunks = [_part(Chunk, c, f"chunk {n}") for n, c in enumerate(_list(body.pop("chunks", []), "chunks"))]
            _check_sections(body)
            manifest = cls(shards=shards, chunks=chunks, **_sections(body))
        except _Malformed as exc:
            raise LsrIndexError(f"{origin}: malformed manifest: {exc}"[:400]) from None
        except TypeError as exc:
            raise LsrIndexError(f"{origin}: malformed manifest: {exc}"[:400]) from None
        seen = set()
        for part in [*shards, *chunks]:  # a manifest must never point outside its own directory
            path = PurePosixPath(part.file)
            if path.is_absolute() or ".." in path.parts or "\\" in part.file or not path.parts:
                raise LsrIndexError(f"{origin}: shard path {part.file!r} is not a relative path inside the "
                                    "output directory; refused")
            if path in seen:
                raise LsrIndexError(f"{origin}: malformed manifest: shard {part.file!r} is listed twice")
            seen.add(path)
        ordered = sorted(shards, key=lambda s: s.start)
        tiled = [s.start for s in ordered] == [0, *(s.end for s in ordered[:-1])]  # else verify_shards names the gap
        if recorded is not None and recorded != manifest.docs and tiled:
            raise LsrIndexError(f"{origin}: its shards hold {manifest.docs:,} documents but it records "
                                f"{recorded!r}: it was edited or damaged; restore it, or rerun `lsr-index encode "
                                "--overwrite`")
        return manifest


def written_by_encode(directory: Path) -> bool | None:
    """Whether `directory` holds an lsr-index vectors manifest (of any version): True; False where it holds none or
    one of another kind; None where the file cannot be read as JSON (damaged past knowing whose it was)."""
    try:
        return json.loads((directory / MANIFEST).read_bytes()).get("kind") == KIND
    except FileNotFoundError:
        return False
    except (OSError, ValueError, AttributeError):
        return None


class _Malformed(Exception):
    """A field of the wrong type or range: caught in from_dict and named with the manifest's path."""


def _list(value: object, key: str) -> list:
    if not isinstance(value, list):
        raise _Malformed(f"{key!r} must be a list")
    return value


def _part(kind: type[Part], body: object, label: str) -> Part:
    if not isinstance(body, dict):
        raise _Malformed(f"{label} is not an object")
    known = {f.name: f for f in fields(kind)}
    unknown = sorted(set(body) - set(known))
    if unknown:
        raise _Malformed(f"{label}: unknown key {unknown[0]!r}")
    for key, spec in known.items():
        if key not in body and spec.default is not MISSING:
            continue
        value, want = body.get(key), str if key in ("file", "sha256", "input") else int
        if not isinstance(value, want) or isinstance(value, bool) or (want is int and value < 0):
            raise _Malformed(f"{label}: {key!r} must be a{' non-negative' if want is int else ''} "
                             f"{want.__name__}, got {value!r}")
    if not body["file"] or "\0" in body["file"]:
        raise _Malformed(f"{label}: empty or invalid file name")
    for key, size, what in (("sha256", 64, "a sha256"), ("input", 32, "a 128-bit")):
        if len(body[key]) != size or any(c not in "0123456789abcdef" for c in body[key]):
            raise _Malformed(f"{label}: {key!r} is not {what} hex digest")
    return kind(**body)


def _check_sections(body: dict) -> None:
    """The sections' types and every setting's range (settings.RANGES): what `search` and a resume rely on."""
    for key in ("model", "encoder", "quantization", "input", "stats"):
        if key in body and not isinstance(body[key], dict):
            raise _Malformed(f"{key!r} must be an object")
    for key in ("name", "sha256"):  # what `search` reads back to load the model that encoded the documents
        if not isinstance(body.get("model", {}).get(key), str):
            raise _Malformed(f"'model.{key}' is missing or not a str")
    query = body.get("query_model")
    if query is not None:  # what `search` loads to encode queries
        if not isinstance(query, dict) or sorted(query) != sorted(QUERY_MODEL_KEYS):
            raise _Malformed(f"'query_model' must be an object with exactly {', '.join(QUERY_MODEL_KEYS)}")
        if not all(isinstance(query[key], str) for key in QUERY_MODEL_KEYS):
            raise _Malformed(f"'query_model' values must be strings, got {query!r}")
        if query["kind"] not in QUERY_KINDS:
            raise _Malformed(f"'query_model.kind' must be one of {', '.join(QUERY_KINDS)}, got {query['kind']!r}")
    encoder = body.get("encoder", {})
    try:
        for key in ("doc_max_length", "query_max_length", "dtype", "backend"):
            check(key, encoder.get(key), "encoder")
        check("output_format", body.get("output_format"))
        check("shard_docs", body.get("shard_docs"))
        Quantization.from_dict(body.get("quantization", {}), "quantization")
    except LsrIndexError as exc:
        raise _Malformed(str(exc)) from None
    for key, kind in (("complete", bool), ("skipped", int)):
        if key in body and (not isinstance(body[key], kind) or (kind is int and isinstance(body[key], bool))):
            raise _Malformed(f"{key!r} must be a {kind.__name__}")


def _plain(value: object) -> object:
    """A manifest (or a section) as JSON-ready values, in field order; a cluster's per-node stats only when there."""
    if isinstance(value, Quantization):
        return value.to_dict()
    if is_dataclass(value):
        body = {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
        if isinstance(value, EncodeStats) and value.per_node is None:
            del body["per_node"]
        if isinstance(value, Manifest) and value.stats is None:  # no run has finished yet
            body["stats"] = {}
        return body
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _sections(body: dict) -> dict:
    """The checked manifest's sections as their types."""
    body = dict(body)
    body["model"] = ModelRecord(**{k: body["model"][k] for k in ("name", "sha256")})
    body["encoder"] = EncoderSettings(**{k: body["encoder"][k] for k in
                                         ("doc_max_length", "query_max_length", "dtype", "backend")})
    body["quantization"] = Quantization.from_dict(body["quantization"], "quantization")
    raw = body.get("input", {})
    body["input"] = InputRecord(files=list(raw.get("files", [])), max_chars=raw.get("max_chars"),
                                fields=InputFields(**raw.get("fields") or {}), on_error=raw.get("on_error", "fail"))
    if body.get("query_model") is not None:
        body["query_model"] = QueryModelRecord(**body["query_model"])
    body["stats"] = _stats(body.get("stats"))
    return body


def _stats(raw: object) -> EncodeStats | None:
    """A run's figures as recorded (by this or another version): read for the summary, never relied on, so what
    does not fit is left out rather than refused."""
    if not isinstance(raw, dict) or not raw:
        return None

    def known(kind: type, values: object) -> dict:
        names = {f.name for f in fields(kind)}
        return {k: v for k, v in values.items() if k in names} if isinstance(values, dict) else {}

    def each(kind: type, values: object) -> list:
        rows = []
        for value in values if isinstance(values, list) else []:
            try:
                rows.append(kind(**known(kind, value)))
            except TypeError:  # a field missing: a row another version wrote
                continue
        return rows

    body = known(EncodeStats, raw)
    body["per_worker"] = each(WorkerStats, raw.get("per_worker"))
    body["per_node"] = each(NodeStats, raw["per_node"]) if raw.get("per_node") is not None else None
    return EncodeStats(**body)
