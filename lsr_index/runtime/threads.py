"""Threads that overlap the stages' work: an iterator run ahead in a thread of its own, stoppable from the consumer.
"""

from __future__ import annotations

import collections
import os
import queue
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def put_unless_stopped(items: queue.Queue, item: object, stop: threading.Event) -> bool:
    """Queue `item` unless the consumer closed the stream first (False: stop)."""
    while not stop.is_set():
        try:
            items.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


class Stock:
    """A queue bounded by the size of what it holds (tokens, say), not by its count of items, which may each be a few
    documents or thousands. An item is let in whenever the stock is below its bound, so one larger than the bound
    still passes and the stock exceeds its bound by less than one item."""

    def __init__(self, bound: int, stop: threading.Event):
        self._bound, self._stop = bound, stop
        self._items: collections.deque[tuple[object, int]] = collections.deque()
        self._held = 0
        self._changed = threading.Condition()

    def put(self, item: object, size: int) -> bool:
        """Add `item` of `size` once the stock is below its bound, unless `stop` is set first (False: stop)."""
        with self._changed:
            while self._held >= self._bound:
                if self._stop.is_set():
                    return False
                self._changed.wait(0.1)
            if self._stop.is_set():
                return False
            self._items.append((item, size))
            self._held += size
            self._changed.notify_all()
        return True

    def get(self) -> object:
        """The oldest item, once there is one."""
        with self._changed:
            while not self._items:
                self._changed.wait()
            item, size = self._items.popleft()
            self._held -= size
            self._changed.notify_all()
            return item

    @property
    def held(self) -> int:
        return self._held


class Prefetch(Iterator[T]):
    """Run an iterator in a background thread, started at once, so that it overlaps the consumer (and whatever the
    consumer does before its first item). `close` ends the thread when the consumer stops early."""

    def __init__(self, items: Iterable[T], depth: int = 2, name: str | None = None):
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = object()
        threading.Thread(target=self._work, args=(items,), name=name, daemon=True).start()

    def _work(self, items: Iterable[T]) -> None:
        try:
            for item in items:
                if not self._put(item):
                    return
        except BaseException as exc:  # re-raised in the consumer
            if not self._put(exc):
                return
        finally:
            if callable(close := getattr(items, "close", None)):  # a generator's own clean-up runs in this thread
                close()
        self._put(self._done)

    def _put(self, item: object) -> bool:
        return put_unless_stopped(self._queue, item, self._stop)

    def __next__(self) -> T:
        item = self._queue.get()
        if item is self._done:
            self._queue.put(item)  # a later call ends the same way
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        """Stop the thread (within 0.1 s, or after the item it is reading); the stream is not read after this."""
        self._stop.set()


def host_cores() -> int:
    """The cores this process may really use: its CPU affinity (taskset, a scheduler's cpuset), capped by a cgroup CPU
    quota (a container's --cpus), which os.cpu_count() ignores. Compute threads beyond it wait on each other."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    quota = _cgroup_quota()
    return max(1, min(cores, int(quota))) if quota else cores


def _cgroup_quota() -> float | None:
    """CPUs the cgroup may use per period (cgroup v2 cpu.max, v1 cfs_quota/cfs_period), or None without a quota."""
    try:
        limit, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        return None if limit == "max" else int(limit) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None
