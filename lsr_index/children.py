"""The processes lsr-index starts (local encoding workers, serializers, the input process): each is a PythonChild,
which never re-runs the parent's main module, and none outlives its parent."""

from __future__ import annotations

import contextlib
import os
import pickle
import subprocess
import sys
from typing import BinaryIO

from .errors import LsrIndexError


def end_with_stdin() -> None:
    """A PythonChild's watch on its parent (run it in a daemon thread): its stdin reaches its end when the parent
    closes it, or is gone; an orphaned child would work on, or write beside a rerun."""
    while os.read(0, 1 << 16):
        pass
    os._exit(1)


# A child's start: the parent's import path (as multiprocessing's spawn passes it), then its entry. Not
# multiprocessing itself: its spawn re-runs the parent's main module in every child first. A script that imports
# torch and transformers at its top delayed the input process's first piece by ~3 s, and eight serializers
# importing it took the host's cores from the encoder for seconds (BERT-base end to end 16.8k → 21.0k docs/s on an
# H100 without it: benchmarks/NOTES_encode.md); a script without a main guard would run itself again in each.
# -P: no current directory on the path, where a user's struct.py would shadow the standard library's.
_BOOT = """
import os, pickle, sys
out = os.fdopen(int(sys.argv[1]), "wb")
try:
    sys.path[:] = pickle.load(sys.stdin.buffer)
    module, function = sys.argv[2].split(":")
    entry = getattr(__import__(module, fromlist=[function]), function)
except EOFError:
    os._exit(1)  # the parent is gone before it sent anything
except BaseException as exc:
    pickle.dump(("error", f"{sys.argv[3]} could not start: {type(exc).__name__}: {exc}"), out)
    out.flush()
    os._exit(1)
entry(out)
"""


class PythonChild:
    """A Python process running `entry(out)` ("module:function"), with this process's import path.

    It reads what it is given from its stdin, and sends pickled messages back through a pipe of its own (nothing it
    prints can enter it); ("error", one line) if it cannot start. It runs in its own process group (Ctrl-C is the
    parent's to handle, and the parent ends it), and its entry must end it when its stdin ends: when the parent
    closes it, or is gone."""

    def __init__(self, entry: str, what: str):
        self.what = what
        read_end, write_end = os.pipe()
        try:
            self.process = subprocess.Popen([sys.executable, "-P", "-c", _BOOT, str(write_end), entry, what],
                                            stdin=subprocess.PIPE, pass_fds=(write_end,), process_group=0)
        except BaseException as exc:
            os.close(read_end)
            if isinstance(exc, (OSError, TypeError, ValueError)):  # TypeError: no sys.executable (embedded Python)
                raise LsrIndexError(f"cannot start {what} ({sys.executable}): {exc}") from exc
            raise
        finally:
            os.close(write_end)
        try:
            self.stdin: BinaryIO = self.process.stdin
            self.messages: BinaryIO = os.fdopen(read_end, "rb")
        except BaseException:
            os.close(read_end)
            self.process.kill()
            self.process.wait()
            raise
        try:
            pickle.dump(sys.path, self.stdin)  # a few hundred bytes: the pipe takes them at once
            self.stdin.flush()
        except OSError:
            pass  # it died already: its first message or its exit code says how

    def exit_code(self, timeout: float) -> int | None:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def close(self, finished: bool = False) -> None:
        """End the process (at once unless it `finished` its work and exits by itself) and reap it, then close the
        pipes: a thread blocked writing to a stopped process holds its stdin's lock until the process is gone."""
        if self.process.poll() is None and not finished:
            self.process.terminate()
        if self.exit_code(10) is None:
            self.process.kill()
            self.process.wait()
        for pipe in (self.stdin, self.messages):
            with contextlib.suppress(OSError):
                pipe.close()


def send_message(out: BinaryIO, *message: object) -> None:
    """A child's message to its parent (PythonChild.messages)."""
    pickle.dump(message, out, protocol=pickle.HIGHEST_PROTOCOL)
    out.flush()
