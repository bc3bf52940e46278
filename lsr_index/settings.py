"""Every encode setting's type and range, in one table: the CLI, presets, manifests and index records all check here.

A value from a preset, an edited manifest or an index record is as untrusted as a command-line flag, so each
stage validates through `check` instead of trusting its source (a `shard_docs = 0` preset would otherwise end in a
ZeroDivisionError, a negative scale in negative impacts that `build` later rejects).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from lsr_index.errors import LsrIndexError

FORMATS = ("jsonl", "jsonl.gz", "parquet")
DTYPES = ("float32", "bfloat16", "float16")
BACKENDS = ("auto", "triton", "torch")


@dataclass(frozen=True)
class Range:
    """An int or float setting's bounds (inclusive; None: unbounded), or a str setting's choices."""

    kind: type
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    optional: bool = False  # None is allowed (e.g. top_k: keep every term)
    above: bool = False  # strictly above `low` (scale > 0)

    def describe(self) -> str:
        if self.choices:
            return "one of " + ", ".join(self.choices)
        kind = "an integer" if self.kind is int else "a finite number"
        bounds = f" > {self.low:g}" if self.above else (f" ≥ {self.low:g}" if self.low is not None else "")
        if self.high is not None:
            bounds = f" in {self.low:g}..{self.high:g}"
        return kind + bounds + (" (or unset)" if self.optional else "")


RANGES: dict[str, Range] = {
    "doc_max_length": Range(int, 2, 8192),
    "query_max_length": Range(int, 2, 8192),
    "max_tokens": Range(int, 64),
    "shard_docs": Range(int, 1),
    "checkpoint_seconds": Range(float, 0),
    "piece_docs": Range(int, 1, optional=True),
    "threads": Range(int, 1, optional=True),
    "scale": Range(float, 0, above=True),
    "top_k": Range(int, 1, optional=True),
    "min_weight": Range(float, 0),
    "output_format": Range(str, choices=FORMATS),
    "dtype": Range(str, choices=DTYPES),
    "backend": Range(str, choices=BACKENDS),
}


def valid(name: str, value: Any) -> bool:
    spec = RANGES[name]
    if value is None:
        return spec.optional
    if spec.choices:
        return isinstance(value, str) and value in spec.choices
    if isinstance(value, bool) or not isinstance(value, (int, float) if spec.kind is float else int):
        return False
    if spec.kind is float and not math.isfinite(value):
        return False
    if spec.low is not None and (value <= spec.low if spec.above else value < spec.low):
        return False
    return spec.high is None or value <= spec.high


def check(name: str, value: Any, origin: str = "") -> Any:
    """`value` if it is a valid `name`, else one clear LsrIndexError naming the setting, its source and range."""
    if not valid(name, value):
        where = f"{origin}: " if origin else ""
        raise LsrIndexError(f"{where}{name} must be {RANGES[name].describe()}, got {value!r}"[:300])
    return value


def check_all(values: dict[str, Any], origin: str = "") -> None:
    for name, value in values.items():
        check(name, value, origin)


# The one source of every encode setting's default: the CLI's help, presets' fallbacks and EncodeOptions read it.
DEFAULTS: dict[str, Any] = {
    "model": "splade-tiny",
    "doc_max_length": 256,
    "query_max_length": 64,
    "max_tokens": None,  # by device: MAX_TOKENS
    "shard_docs": 100_000,
    "checkpoint_seconds": 30.0,
    "output_format": "jsonl.gz",
    "scale": 100.0,
    "top_k": None,
    "min_weight": 0.0,
    "dtype": None,  # by device: DTYPE
    "backend": "auto",
}
MAX_TOKENS = {"cpu": 16384, "cuda": 131072}  # padded tokens per forward pass: activation memory, not corpus size
DTYPE = {"cpu": "float32", "cuda": "bfloat16"}
# Documents encoded and written together (a piece) on CPU. A chunk is checkpointed only at a piece's end, so a piece
# must take well under --checkpoint-seconds even on a slow, shared CPU; sorting this many by length still keeps
# padding low (docs/performance/encode.md, "CPU"). A GPU's pieces fill its forward passes (EncodeJob.window).
CPU_PIECE_DOCS = 64

# Characters kept per document (or query): its max length in tokens × this, before tokenizing. A WordPiece token
# spans at most 100 characters (longer words become one [UNK]: BERT's max_input_chars_per_word), and real text
# averages 4-6 per token in BERT, BPE and SentencePiece vocabularies alike; the Rust tokenizer tokenizes a text whole
# before it truncates, so without a bound a document of tens of megabytes takes gigabytes to yield its few hundred
# tokens. Only text past 100 characters per kept token (runs of whitespace or of over-long words) can change what is
# encoded; such cuts are counted in the manifest.
CHARS_PER_TOKEN = 100
