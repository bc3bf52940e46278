"""Progress on stderr for the long steps: bars with done/total, rate and ETA, and one-line notes for waits that
have no count. Both show only where a bar would (progress on, stderr a terminal), so logs and pipes stay clean."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any


def shown(enabled: bool) -> bool:
    return enabled and sys.stderr.isatty()


def note(message: str, enabled: bool) -> None:
    """A step that may take seconds and has nothing to count (loading a model, opening an index)."""
    if shown(enabled):
        print(message, file=sys.stderr, flush=True)


def bar(enabled: bool, **options: Any):
    """A tqdm bar in the project's style; `options` as tqdm's (total, desc, unit, initial...)."""
    return _bar_class()(dynamic_ncols=True, disable=not shown(enabled), **options)


@functools.cache
def _bar_class() -> type:
    from tqdm import tqdm

    class Bar(tqdm):
        """Without tqdm's monitor thread (it only hurries the redraw of a bar that stalls), started by every bar, shown
        or not: a process with a thread of its own cannot fork its GPU workers (encode.local._forks_workers)."""

        monitor_interval = 0

    return Bar


class EncodeBar:
    """Documents encoded against the input's size: exact for Parquet and Arrow, estimated (≈) for JSONL from the
    bytes on disk. An estimate that falls short grows with the count rather than showing over 100 %."""

    def __init__(self, estimate: Callable[[], tuple[int, bool]], resumed_at: int, enabled: bool):
        """`estimate`: the input's documents and whether the count is exact (asked only when the bar shows)."""
        total, exact = estimate() if shown(enabled) else (None, False)
        desc = "encode" if exact or total is None else f"encode (≈{total:,} docs)"
        self.bar = bar(enabled, desc=desc, total=total or None, initial=resumed_at, unit=" doc", smoothing=0.1)

    def update(self, docs: int, postfix: str) -> None:
        if self.bar.total is not None and self.bar.n + docs > self.bar.total:
            self.bar.total = self.bar.n + docs
        self.bar.update(docs)
        self.bar.set_postfix_str(postfix, refresh=False)

    def write(self, message: str) -> None:
        """A line above the bar, shown whether or not the bar is."""
        self.bar.write(message, file=sys.stderr)

    def close(self) -> None:
        self.bar.close()
