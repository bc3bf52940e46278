"""Threads that overlap the stages' work: an iterator run ahead in a thread of its own, stoppable from the consumer.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
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
