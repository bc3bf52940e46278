"""The input divided into units that can be read apart: byte ranges of a plain JSONL file cut at line ends, runs of a
Parquet file's row groups, and whole files where nothing else can be cut (compressed JSONL, Arrow IPC).

Units depend only on the input files (their names, formats and sizes), never on how many workers read them: the
documents, their numbering and the batches a model sees are the same whoever reads which unit. A corpus's first
units are small and grow, so that every worker of a run has a first batch to encode within a fraction of a second.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from lsr_index.inputs.sources import compression, file_format

FIRST_BYTES = 1 << 20  # a file's first and last units, in bytes of input
GROWTH = 1.5  # each next unit of a file is this much larger, up to the largest, and as much smaller towards its end
LARGEST_BYTES = 32 << 20
PER_FILE = 64  # a file is cut into at least this many units where it is large enough for them
_SCAN = 1 << 16  # bytes read at a time while looking for the end of a line


@dataclass(frozen=True)
class Unit:
    """One part of the input, read on its own. `start`/`stop`: a JSONL unit's byte range (`stop` None: to the file's
    end) or a Parquet unit's row groups; `first_row`: the file's rows before the unit (Parquet). A file's units grow at
    its start, so that each worker's first batch comes soon, and shrink at its end, so that the workers finish
    together."""

    index: int
    path: Path
    fmt: str  # "JSONL", "Parquet" or "Arrow IPC"
    start: int = 0
    stop: int | None = None
    first_row: int = 0

    @property
    def starts_file(self) -> bool:
        return self.start == 0


def plan_units(files: Iterable[Path]) -> list[Unit]:
    """The units of `files`, in stream order."""
    units: list[Unit] = []
    for path in files:
        fmt = file_format(path)
        if fmt == "JSONL" and not compression(path):
            bounds = _line_bounds(path)
            units += [Unit(len(units) + k, path, fmt, lo, hi) for k, (lo, hi) in enumerate(pairwise(bounds))]
        elif fmt == "Parquet":
            units += _row_group_units(path, len(units))
        else:
            units.append(Unit(len(units), path, fmt))
    return units


def _sizes(total: int) -> list[int]:
    """Unit sizes in bytes for a file of `total` bytes: growing from FIRST_BYTES up to the file's largest, then as many
    of those as fit, then shrinking back to FIRST_BYTES; together at least `total`."""
    largest = max(FIRST_BYTES, min(LARGEST_BYTES, total // PER_FILE))
    ramp, size = [], FIRST_BYTES
    while size < largest:
        ramp.append(size)
        size = int(size * GROWTH)
    if 2 * sum(ramp) >= total:  # a small file: the ramp alone covers it
        return ramp + ramp[::-1] + [largest]
    middle = -(-(total - 2 * sum(ramp)) // largest)
    return ramp + [largest] * middle + ramp[::-1]


def _line_bounds(path: Path) -> list[int]:
    """Byte offsets cutting a plain JSONL file into units: 0, each cut just after a line end, the file's size. A unit
    with no line end after its target size runs to the next one (a long line is never split)."""
    total = os.path.getsize(path)
    bounds = [0]
    with open(path, "rb") as f:
        for size in _sizes(total):
            target = bounds[-1] + size
            if target >= total:
                break
            f.seek(target - 1)  # the byte before the cut: a line that ends exactly there needs no scan
            while block := f.read(_SCAN):
                end = block.find(b"\n")
                if end >= 0:
                    target = f.tell() - len(block) + end + 1
                    break
            else:
                break  # no line end after it: the rest is one unit
            if target >= total:
                break
            bounds.append(target)
    bounds.append(total)
    return bounds


def _row_group_units(path: Path, first_index: int) -> list[Unit]:
    """Runs of a Parquet file's row groups, each about a unit's size of compressed data."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with pq.ParquetFile(path) as parquet:
            meta = parquet.metadata
            groups = [(meta.row_group(g).total_byte_size, meta.row_group(g).num_rows)
                      for g in range(meta.num_row_groups)]
    except (OSError, pa.ArrowException):  # unreadable: its one unit's reading reports why, in stream order
        return [Unit(first_index, path, "Parquet")]
    if not groups:
        return [Unit(first_index, path, "Parquet")]
    units, start, rows, size = [], 0, 0, 0
    sizes = iter(_sizes(sum(g[0] for g in groups)) + [LARGEST_BYTES] * len(groups))
    target = next(sizes)
    first_row = 0
    for g, (group_bytes, group_rows) in enumerate(groups):
        size += group_bytes
        rows += group_rows
        if size >= target or g == len(groups) - 1:
            units.append(Unit(first_index + len(units), path, "Parquet", start, g + 1, first_row))
            start, first_row, size = g + 1, first_row + rows, 0
            rows = 0
            target = next(sizes)
    return units
