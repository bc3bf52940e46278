"""Serializer processes: a GPU outpaces the JSON/gzip serialization of its vectors (per-document Python work that
would hold the GIL the encoder's launching thread needs), so blocks of documents are serialized beside it.

Each process gets the vocabulary once, then (ids, vectors, fmt) requests on its stdin, and answers each, in order,
through its message pipe; the pool ends it, and it ends by itself when its stdin does (the parent's death).
"""

from __future__ import annotations

import collections
import os
import pickle
import queue
import signal
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import BinaryIO

import numpy as np
import orjson

from lsr_index.errors import LsrIndexError
from lsr_index.runtime.children import PythonChild, send_message
from lsr_index.vectors.quantize import SparseVectors
from lsr_index.vectors.shards import serialize


class SerializerPool:
    """`workers` serializer processes, started at once (their interpreters start while the first pieces are read and
    encoded). `submit` never blocks: each process has a sender thread, and the least loaded one gets the request."""

    def __init__(self, workers: int, vocab: Sequence[str]):
        blob = orjson.dumps(list(vocab))  # a term may hold any character, "\n" too; bytes pickle as one copy
        self._lock = threading.Lock()
        self._children: list[PythonChild] = []
        self._waiting: list[collections.deque[Future]] = []  # per process, its requests not answered yet
        self._requests: list[queue.SimpleQueue] = []
        self._ended: dict[int, str] = {}  # process k ended early: why
        try:
            for k in range(workers):
                child = PythonChild("lsr_index.vectors.serializers:serializer_main", "a serializer process")
                self._children.append(child)
                self._waiting.append(collections.deque())
                self._requests.append(queue.SimpleQueue())
                self._requests[k].put(blob)
                threading.Thread(target=self._send, args=(k,), name=f"serializer-send-{k}", daemon=True).start()
                threading.Thread(target=self._receive, args=(k,), name=f"serializer-receive-{k}",
                                 daemon=True).start()
        except BaseException:
            self.close()
            raise

    def submit(self, ids: Sequence[str], vectors: SparseVectors, fmt: str) -> Future:
        """The bytes of shards.serialize(ids, vectors, vocab, fmt), made in a serializer process."""
        future: Future = Future()
        with self._lock:
            live = [k for k in range(len(self._children)) if k not in self._ended]
            if not live:
                future.set_exception(LsrIndexError(next(iter(self._ended.values()))))
                return future
            k = min(live, key=lambda i: len(self._waiting[i]))
            self._waiting[k].append(future)
        self._requests[k].put((future, (ids, vectors, fmt)))
        return future

    def _send(self, k: int) -> None:
        child = self._children[k]
        try:
            while (item := self._requests[k].get()) is not None:
                if isinstance(item, bytes):  # the vocabulary
                    data = pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)
                else:
                    future, request = item
                    try:
                        data = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
                    except Exception as exc:  # never sent, so never answered: it fails here, the order holds
                        with self._lock:
                            if future in self._waiting[k]:
                                self._waiting[k].remove(future)
                        _fail(future, f"cannot hand a serializer process its work: {type(exc).__name__}: {exc}")
                        continue
                child.stdin.write(data)
                child.stdin.flush()
        except (OSError, ValueError):
            pass  # it ended, or the pool closed: _receive fails what it was asked
        except BaseException:
            child.process.kill()  # whatever it was, _receive then fails what this process was asked
            raise

    def _receive(self, k: int) -> None:
        child, why = self._children[k], None
        try:
            while True:
                kind, body = pickle.load(child.messages)
                with self._lock:
                    future = self._waiting[k].popleft() if self._waiting[k] else None
                if future is None:  # a message before any request: it could not start
                    why = body
                    break
                if kind == "ok":
                    future.set_result(body)
                else:
                    future.set_exception(LsrIndexError(body))
        except (EOFError, OSError, ValueError, pickle.UnpicklingError):
            pass
        finally:  # whatever ended the stream: nothing asked of this process waits forever
            why = why or (f"a serializer process ended unexpectedly (exit code {child.exit_code(1)}); rerun the "
                          "same command to resume")
            with self._lock:
                self._ended[k] = why
                left, self._waiting[k] = list(self._waiting[k]), collections.deque()
            for future in left:
                _fail(future, why)

    def close(self) -> None:
        """End the processes at once; work not done yet fails (after a success there is none: the sink collects every
        result before it closes)."""
        for requests in self._requests:
            requests.put(None)
        for child in self._children:
            child.close()


def _fail(future: Future, why: str) -> None:
    if not future.done():
        future.set_exception(LsrIndexError(why))


def serializer_main(out: BinaryIO) -> None:
    """A serializer process (see SerializerPool): ("ok", bytes) or ("error", one line) per request."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # not its to handle, even if it reaches this process group
    stdin = sys.stdin.buffer
    try:
        vocab = np.array(orjson.loads(pickle.load(stdin)), dtype=object)
        while True:
            ids, vectors, fmt = pickle.load(stdin)
            try:
                send_message(out, "ok", serialize(ids, vectors, vocab, fmt))
            except Exception as exc:  # one line for the parent, whatever it was
                send_message(out, "error", f"serializing vectors failed: {type(exc).__name__}: {exc}")
    except (EOFError, OSError, pickle.UnpicklingError):
        pass  # the parent closed stdin, or is gone (a request cut short)
    os._exit(0)
