"""Named presets (configs/*.toml, packaged as lsr_index.configs): defaults for `encode` in one name."""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path

from lsr_index.errors import LsrIndexError
from lsr_index.settings import RANGES, check_all

PRESET_KEYS = ("model", "doc_max_length", "query_max_length", "max_tokens", "shard_docs", "checkpoint_seconds",
               "output_format", "scale", "top_k", "min_weight", "dtype")


def available() -> dict[str, dict]:
    folder = resources.files("lsr_index.configs")
    return {p.name.removesuffix(".toml"): _parse(p.read_text(), p.name)
            for p in sorted(folder.iterdir(), key=lambda p: p.name) if p.name.endswith(".toml")}


def _parse(text: str, origin: str) -> dict:
    try:
        values = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise LsrIndexError(f"preset {origin}: {exc}") from None
    unknown = sorted(set(values) - set(PRESET_KEYS) - {"description"})
    if unknown:
        raise LsrIndexError(f"preset {origin}: unknown keys {', '.join(unknown)} (known: {', '.join(PRESET_KEYS)})")
    if not isinstance(values.get("model", ""), str):
        raise LsrIndexError(f"preset {origin}: model must be a string, got {values['model']!r}")
    check_all({k: v for k, v in values.items() if k in RANGES}, f"preset {origin}")
    return values


def load_preset(name_or_path: str) -> dict:
    path = Path(name_or_path)
    if path.suffix == ".toml" and path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:  # TOML is UTF-8 by definition
            raise LsrIndexError(f"preset {path}: cannot read it: {exc}") from None
        return _parse(text, str(path))
    presets = available()
    if name_or_path not in presets:
        raise LsrIndexError(f"unknown preset {name_or_path!r}: choose one of {', '.join(presets)} or a .toml file")
    return presets[name_or_path]
