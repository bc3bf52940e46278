"""The corpus as one numbered stream, whoever parses its units: documents are numbered in stream order, ids are checked
unique across the whole corpus, and bad records are reported (or skipped) in the order they stand in.

Units are parsed anywhere (this process, worker processes, their input processes) and summed up batch by batch
(`BatchSummary`: the ids and where each stands, the records refused); the sequencer takes the summaries in any order
and numbers each batch once every batch before it in the stream is numbered (`Numbered`: its first document's number
and which of its documents are kept). With `on_error="fail"` the first bad record of the stream, in stream order,
raises; with "skip" it is listed in `skipped`, as is a later record whose id an earlier one has.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lsr_index.errors import InputError
from lsr_index.inputs.units import Unit

SKIP_HINT = "fix or remove the record, or rerun with --on-error skip to skip and list bad records"
_DUPLICATE_HINT = "ids must be unique across all shards (skipping keeps the first)"


@dataclass(frozen=True)
class Rejected:
    """A record that is not a document, where it stands in its unit (a JSONL unit's line, a table's row)."""

    where: int | None
    doc_id: str | None
    reason: str
    hint: str | None = None


@dataclass(frozen=True)
class Skipped:
    """A record left out under on_error="skip"; ``where`` is the 1-based line (JSONL) or row of its file."""

    path: str
    where: int | None
    doc_id: str | None
    reason: str


@dataclass
class BatchSummary:
    """What the sequencer needs of a parsed batch: its documents' ids (and their 64-bit hashes), where each stands,
    and the records refused since the unit's previous batch. `last`: the unit's last batch, with `lines`, the lines
    the unit holds (JSONL); `failure`: the unit could not be read on past this point (a damaged file)."""

    unit: int
    batch: int
    ids: list[str]
    hashes: np.ndarray  # uint64, one per id
    wheres: list[int]
    rejects: list[Rejected] = field(default_factory=list)
    last: bool = False
    lines: int = 0
    failure: InputError | None = None


@dataclass(frozen=True)
class Numbered:
    """A batch's place in the stream: its first kept document's number, and which of its documents are kept
    (None: all)."""

    unit: int
    batch: int
    first: int
    keep: np.ndarray | None  # bool, one per document of the batch

    def kept(self, values: list) -> list:
        return values if self.keep is None else [v for v, k in zip(values, self.keep) if k]

    @property
    def count(self) -> int:
        return -1 if self.keep is None else int(self.keep.sum())


class Sequencer:
    """Numbers the batches of `units` (in stream order) as their summaries come in."""

    def __init__(self, units: list[Unit], on_error: str, label: str):
        self.units, self.on_error, self.label = units, on_error, label
        self.n_docs = 0
        self.skipped: list[Skipped] = []
        # 64-bit keyed hashes of the ids seen so far (~80 bytes per document in a set): exact ids would cost more
        # for long ids; a false "duplicate" has odds ~n²/2⁶⁵ (1e-6 at ten million documents)
        self._seen: set[int] = set()
        self._pending: dict[tuple[int, int], BatchSummary] = {}
        self._next = (0, 0)  # the (unit, batch) to number next
        self._lines: dict[Path, int] = {}  # lines of a JSONL file in its units numbered so far

    @property
    def done(self) -> bool:
        return self._next[0] >= len(self.units)

    def add(self, summary: BatchSummary) -> list[Numbered]:
        """Take a summary; return every batch numbered now, in stream order."""
        self._pending[summary.unit, summary.batch] = summary
        numbered = []
        while self._next in self._pending:
            numbered.append(self._number(self._pending.pop(self._next)))
        return numbered

    def finish(self) -> None:
        """After the last batch: a corpus with no document fails, skipping or not."""
        if self.n_docs:
            return
        if self.skipped:
            raise InputError(self.label, None, f"no documents: all {len(self.skipped)} records were skipped",
                             f"the first: {self.skipped[0].reason}")
        raise InputError(self.label, None, "no documents", "the corpus files are empty")

    def _number(self, summary: BatchSummary) -> Numbered:
        unit = self.units[summary.unit]
        offset = self._lines.get(unit.path, 0) if unit.fmt == "JSONL" else 0
        keys = summary.hashes.tolist()
        keep = None
        if summary.rejects or len(set(keys)) < len(keys) or not self._seen.isdisjoint(keys):
            keep = self._screen(unit, offset, summary, keys)
        else:
            self._seen.update(keys)
        if summary.failure is not None:  # the documents before the damage are numbered; the run stops here
            raise summary.failure
        first = self.n_docs
        self.n_docs += len(keys) if keep is None else int(keep.sum())
        if summary.last:
            self._lines[unit.path] = offset + summary.lines
            self._next = (summary.unit + 1, 0)
        else:
            self._next = (summary.unit, summary.batch + 1)
        return Numbered(summary.unit, summary.batch, first, keep)

    def _screen(self, unit: Unit, offset: int, summary: BatchSummary, keys: list[int]) -> np.ndarray:
        """The batch's documents and refused records in the order they stand: a refused record, or a document whose
        id an earlier one has, stops the run (fail) or is listed (skip)."""
        keep = np.ones(len(keys), bool)
        events = [(where, 1, k) for k, where in enumerate(summary.wheres)]
        events += [(r.where if r.where is not None else -1, 0, r) for r in summary.rejects]
        for where, is_doc, item in sorted(events, key=lambda e: (e[0], e[1])):
            if is_doc:
                if keys[item] in self._seen:
                    keep[item] = False
                    self._refuse(unit, offset, Rejected(where, summary.ids[item], f"duplicate id "
                                 f"{summary.ids[item]!r}: an earlier record has it", _DUPLICATE_HINT))
                else:
                    self._seen.add(keys[item])
            else:
                self._refuse(unit, offset, item)
        return keep

    def _refuse(self, unit: Unit, offset: int, bad: Rejected) -> None:
        where = bad.where + offset if bad.where is not None else None
        if self.on_error == "fail":
            raise InputError(unit.path, where, bad.reason, f"{bad.hint}; {SKIP_HINT}" if bad.hint else SKIP_HINT)
        self.skipped.append(Skipped(str(unit.path), where, bad.doc_id, bad.reason))
