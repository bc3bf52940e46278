"""The files of a model directory: which ones make its identity, how its weights are read, how a
sentence-transformers directory is laid out.

Everything here reads files only: no model class is built, no pickle is fully unpickled, no remote code runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import sys
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lsr_index.errors import LsrIndexError
from lsr_index.runtime.durable import sha256_file

if TYPE_CHECKING:
    import torch

# Files whose bytes change the vectors a model gives: weights, model config, tokenizer and its configs, vocabularies,
# sentence-transformers module configs (pooling, routes, truncation) and static query weight tables.
_IDENTITY_NAMES = frozenset({
    "config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.txt", "vocab.json", "merges.txt", "modules.json", "config_sentence_transformers.json",
    "sentence_bert_config.json", "router_config.json", "idf.json", "query_token_weights.txt",
})
_IDENTITY_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".model", ".index.json")

# sentence-transformers' activation_function → sparton's activation: "relu" is SPLADE's log1p(relu(x)), and
# "log1p_relu" applies log1p once more (sentence_transformers.sparse_encoder.models.SpladePooling).
_ST_ACTIVATIONS = {"relu": "log1p_relu", "log1p_relu": "log1p_log1p_relu"}


def cache_root() -> Path:
    """Where lsr-index keeps what it fetched once: the embedded models."""
    return Path(os.environ.get("LSR_INDEX_CACHE", Path.home() / ".cache" / "lsr-index"))




def identity_files(path: Path) -> list[str]:
    """Relative names of the identity files in the directory and its direct, non-hidden subdirectories (where
    sentence-transformers keeps its modules), sorted. Symbolic links are followed (the hub cache is made of them)."""
    found = []
    for entry in sorted(os.scandir(path), key=lambda e: e.name):
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            found += [f"{entry.name}/{e.name}" for e in sorted(os.scandir(entry.path), key=lambda e: e.name)
                      if e.is_file() and _is_identity(e.name)]
        elif entry.is_file() and _is_identity(entry.name):
            found.append(entry.name)
    return found


def _is_identity(name: str) -> bool:
    # tokenizer.<version>.json: the tokenizer transformers reads instead where tokenizer_config.json names it
    # (fast_tokenizer_files)
    return name in _IDENTITY_NAMES or name.endswith(_IDENTITY_SUFFIXES) or \
        (name.startswith("tokenizer.") and name.endswith(".json"))


def identity(path: Path) -> tuple[str, dict[str, str]]:
    """A model's identity, sha256 over the sorted (relative name, sha256) pairs of its identity files, and each
    file's sha256. Two directories share it only if every file that can change a vector is byte-identical; a README,
    a model card or a training log does not enter it. A run computes it once (model.ref.ModelRef)."""
    files = identity_files(path)
    if not files:
        raise LsrIndexError(f"model {path}: no model files (config.json, weights, tokenizer) in it")
    digests = {name: sha256_file(path / name) for name in files}
    combined = hashlib.sha256()
    for name in files:
        combined.update(f"{name}\0{digests[name]}\n".encode())
    return combined.hexdigest(), digests


def weight_files(path: Path) -> list[Path]:
    """The weights of the model in `path`: its safetensors, else its pickled PyTorch state dicts. Where transformers
    would read one file (model.safetensors, pytorch_model.bin) or a sharded set (the files its index names), so does
    this: a stray file beside them (a shard set's old single file, a training state) is not the model's."""
    for single, index, pattern in (("model.safetensors", "model.safetensors.index.json", "*.safetensors"),
                                   ("pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model*.bin")):
        if (path / single).is_file():
            return [path / single]
        if (path / index).is_file():
            return _shards(path, path / index)
        if found := sorted(path.glob(pattern)):
            return found
    pickles = sorted([*path.glob("*.pt"), *path.glob("*.pth")])
    if not pickles:
        raise LsrIndexError(f"model {path}: no weights (*.safetensors, pytorch_model*.bin, *.pt)")
    return pickles


def _shards(path: Path, index: Path) -> list[Path]:
    """The files a sharded checkpoint's index names, each one checked to be there, in the model directory."""
    weight_map = _json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map or not all(isinstance(f, str) for f in weight_map.values()):
        raise LsrIndexError(f"{index}: no weight_map of tensor name → shard file")
    shards = []
    for name in sorted(set(weight_map.values())):
        shard = path / name
        if Path(name).name != name or not shard.is_file():
            raise LsrIndexError(f"{index}: names the shard {name!r}, which is not a file of {path}")
        shards.append(shard)
    return shards


_noted: set[Path] = set()


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of the model's weight files, on the CPU. Pickles go through torch.load(weights_only=True), whose
    unpickler builds only tensors and plain containers: a pickle that names anything else (the way a hostile
    file runs code) is refused before any of it runs."""
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for file in weight_files(path):
        if file.suffix == ".safetensors":
            try:
                part = load_file(file)
            except (SafetensorError, OSError) as exc:
                raise LsrIndexError(f"{file}: not a readable safetensors file ({exc})") from exc
        else:
            if file not in _noted:
                _noted.add(file)
                print(f"note: {file}: pickled PyTorch weights, read with torch.load(weights_only=True), which runs "
                      "no code", file=sys.stderr)
            part = _load_pickle(file, torch)
        if twice := sorted(state.keys() & part.keys()):  # which one is the model's cannot be told
            more = f" (and {len(twice) - 1} more)" if len(twice) > 1 else ""
            raise LsrIndexError(f"model {path}: {file.name} and another weight file both hold {twice[0]}{more}: "
                                "keep one model's weights")
        state.update(part)
    return state


# What `torch.save` writes first in its legacy (non-zip) format: its magic number, pickled with protocol 2
_LEGACY_TORCH = pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2)


def _load_pickle(file: Path, torch) -> dict:
    """A state dict from a file `torch.save` wrote (its zip format, or its legacy one), by the restricted
    unpickler; anything else (a plain `pickle.dump`, another program's file) is refused in one line before torch
    reads it, which would print its own warnings and then a message that reads as damage."""
    zipped = zipfile.is_zipfile(file)
    if not zipped:
        try:
            with open(file, "rb") as f:
                head = f.read(len(_LEGACY_TORCH))
        except OSError as exc:
            raise LsrIndexError(f"{file}: cannot read it: {exc.strerror or exc}") from None
        if head != _LEGACY_TORCH:
            what = "a plain Python pickle" if head[:1] == b"\x80" else "not a pickle"
            raise LsrIndexError(f"{file}: refused: not PyTorch weights ({what}, not a file torch.save wrote); save the "
                                "state dict with torch.save, or better as safetensors")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's notes on pickle protocols: the outcome is said below
            part = torch.load(file, map_location="cpu", weights_only=True, mmap=zipped)
    except pickle.UnpicklingError as exc:
        named = re.search(r"GLOBAL (\S+)", str(exc))
        if named is None:  # not a pickle at all, or a damaged one
            detail = str(exc).partition("WeightsUnpickler error:")[2].strip() or str(exc)
            raise LsrIndexError(f"{file}: not a readable PyTorch weights file ({detail.splitlines()[0]})") from None
        what = f" (it names {named.group(1)})"
        raise LsrIndexError(f"{file}: refused: it is not a plain tensor state dict{what}, and loading it would need a "
                            "full unpickle, which can run code; convert it to safetensors where you trust it") from None
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise LsrIndexError(f"{file}: not a readable PyTorch weights file ({reason})") from None
    if not isinstance(part, dict) or not all(isinstance(v, torch.Tensor) for v in part.values()):
        raise LsrIndexError(f"{file}: not a state dict of tensors (name → tensor)")
    return part


@dataclass(frozen=True)
class SentenceTransformersLayout:
    """Where a sentence-transformers sparse encoder keeps its parts, read from modules.json (and router_config.json).

    mlm: the masked-LM directory of the document route; pooling, activation: its SpladePooling options in
    sparton's terms; query: the directory of an inference-free query route (SparseStaticEmbedding), else None."""

    mlm: Path
    pooling: str
    activation: str
    query: Path | None


def settings(file: Path) -> dict:
    """A model's JSON settings file (config.json, sentence_bert_config.json, ...) as an object; {} where the model has
    none; one line naming the file where it is not a readable JSON object."""
    return _json(file) if file.is_file() else {}


def _json(file: Path, want: type = dict) -> dict | list:
    try:
        value = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise LsrIndexError(f"{file}: not readable JSON ({exc})") from exc
    if not isinstance(value, want):
        raise LsrIndexError(f"{file}: expected a JSON {'object' if want is dict else 'list'}")
    return value


def sentence_transformers_layout(path: Path) -> SentenceTransformersLayout | None:
    """The layout of a sentence-transformers SparseEncoder directory; None for a plain transformers directory."""
    if not (path / "modules.json").is_file():
        return None
    modules = _json(path / "modules.json", list)
    if not all(isinstance(m, dict) for m in modules):
        raise LsrIndexError(f"{path / 'modules.json'}: expected a list of modules")
    routes = {"document": [(str(m.get("type", "")), str(m.get("path", ""))) for m in modules]}
    if len(modules) == 1 and routes["document"][0][0].endswith(".Router"):
        config = _json(path / routes["document"][0][1] / "router_config.json")
        try:
            types, structure = config["types"], config["structure"]
            routes = {route: [(types[name], name) for name in names] for route, names in structure.items()}
        except (KeyError, TypeError, AttributeError) as exc:
            raise LsrIndexError(f"{path}: router_config.json lacks its types or structure ({exc})") from exc
    document = routes.get("document")
    if document is None:
        raise LsrIndexError(f"{path}: the sentence-transformers router has no 'document' route")
    mlm, pooling, activation = None, "max", "log1p_relu"
    for kind, folder in document:
        name = kind.rsplit(".", 1)[-1]
        where = _module_dir(path, folder)
        if name in ("MLMTransformer", "Transformer"):
            # the transformer is saved in the root, whatever name its route gives it
            where = where if (where / "config.json").is_file() else path
        if name == "MLMTransformer" or (name == "Transformer" and _fill_mask(where)):
            mlm = where
            settings = where / "sentence_bert_config.json"
            if settings.is_file() and _json(settings).get("do_lower_case"):
                raise LsrIndexError(f"{settings}: do_lower_case is true (sentence-transformers lowercases texts "
                                    "before its tokenizer); lsr-index does not: put the lowercasing in the tokenizer")
        elif name == "SpladePooling":
            config = _json(where / "config.json") if where != path and (where / "config.json").is_file() else {}
            pooling = config.get("pooling_strategy", "max")
            activation = _ST_ACTIVATIONS.get(config.get("activation_function", "relu"))
            if pooling not in ("max", "sum") or activation is None:
                raise LsrIndexError(f"{where / 'config.json'}: SpladePooling with pooling_strategy "
                                    f"{config.get('pooling_strategy')!r}, activation_function "
                                    f"{config.get('activation_function')!r} is not supported (max or sum; relu or "
                                    "log1p_relu)")
        else:
            raise LsrIndexError(f"{path}: sentence-transformers module {kind} ({folder or '.'}) is not supported: "
                                "lsr-index reads MLMTransformer (or a fill-mask Transformer) + SpladePooling")
    if mlm is None:
        raise LsrIndexError(f"{path}: no MLMTransformer in the sentence-transformers document modules")
    _refuse_prompts(path / "config_sentence_transformers.json")
    query = None
    if "query" in routes:
        kinds = [kind.rsplit(".", 1)[-1] for kind, _ in routes["query"]]
        if kinds == ["SparseStaticEmbedding"]:
            query = _module_dir(path, routes["query"][0][1])
        elif [(k, f) for k, f in routes["query"]] != document:
            raise LsrIndexError(f"{path}: query route {kinds} is not supported (SparseStaticEmbedding, or the "
                                "document route)")
    return SentenceTransformersLayout(mlm=mlm, pooling=pooling, activation=activation, query=query)


def _refuse_prompts(config_file: Path) -> None:
    """sentence-transformers puts a prompt before every text it encodes (encode_query: the "query" prompt,
    encode_document: "document", "passage" or "corpus", else the default prompt); lsr-index does not, so a model
    saved with one would give other vectors: refused, naming it."""
    if not config_file.is_file():
        return
    config = _json(config_file)
    prompts = config.get("prompts") or {}
    if not isinstance(prompts, dict):
        return
    default = prompts.get(config.get("default_prompt_name") or "")
    for what, names in (("queries", ("query",)), ("documents", ("document", "passage", "corpus"))):
        prompt = next((prompts[name] for name in names if name in prompts), default)
        if prompt:
            raise LsrIndexError(f"{config_file}: sentence-transformers puts the prompt {prompt!r} before {what}; "
                                "lsr-index does not, so its vectors would differ: set the prompts to \"\" there and "
                                f"put the prompt in the {what} themselves")


def _module_dir(root: Path, folder: str) -> Path:
    """A module's folder, confined to the model directory."""
    if folder in ("", "."):
        return root
    where = (root / folder).resolve()
    if not where.is_relative_to(root.resolve()):
        raise LsrIndexError(f"{root}: module path {folder!r} leaves the model directory")
    return root / folder


def _fill_mask(where: Path) -> bool:
    settings = where / "sentence_bert_config.json"
    return settings.is_file() and _json(settings).get("transformer_task") == "fill-mask"
