"""The processes lsr-index starts: Python children (local encoding workers, serializers, the input process, Lucene
writers), each a PythonChild, which never re-runs the parent's main module; and external programs (Java), started
through a launcher. None outlives its parent."""

from __future__ import annotations

import contextlib
import gc
import importlib
import io
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
import time
import traceback
from typing import BinaryIO, NoReturn

from lsr_index.errors import LsrIndexError


def end_with_stdin() -> None:
    """A PythonChild's watch on its parent (run it in a daemon thread): its stdin reaches its end when the parent
    closes it, or is gone; an orphaned child would work on, or write beside a rerun."""
    while os.read(0, 1 << 16):
        pass
    os._exit(1)


# A child's start: the parent's import path (as multiprocessing's spawn passes it), then its entry. Not
# multiprocessing itself: its spawn re-runs the parent's main module in every child first. A script that imports
# torch and transformers at its top delays the input process's first piece by seconds, and eight serializers
# importing it take the host's cores from the encoder meanwhile (docs/performance/encode.md, "Changes kept"); a
# script without a main guard would run itself again in each.
# -P: no current directory on the path, where a user's struct.py would shadow the standard library's.
_BOOT = """
import os, pickle, signal, sys
signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the parent ends it so, even where SIGTERM came in ignored
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
code = 1
try:
    entry(out)
    code = 0
except SystemExit as exc:
    if exc.code is None or isinstance(exc.code, int):
        code = exc.code or 0
    else:
        print(exc.code, file=sys.stderr)
except BaseException:
    import traceback
    traceback.print_exc()
finally:
    for stream in (out, sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    # ended here, as a forked child ends: a daemon thread blocked reading stdin (the watch on the parent) holds its
    # lock, and the interpreter's own shutdown would abort on it ("could not acquire lock ... at shutdown")
    os._exit(code)
"""


class PythonChild:
    """A Python process running `entry(out)` ("module:function"), with this process's import path.

    It reads what it is given from its stdin, and sends pickled messages back through a pipe of its own (nothing it
    prints can enter it); ("error", one line) if it cannot start. It runs in its own process group (Ctrl-C is the
    parent's to handle, and the parent ends it), and its entry must end it when its stdin ends: when the parent
    closes it, or is gone.

    `fork=True` starts it as a fork of this process instead of a new interpreter: it has this process's modules imported
    already (torch and transformers: most of a fresh GPU worker's start, docs/performance/encode.md, "Several GPUs of
    one host"). Only where that is safe (encode.local._forks_workers): no other thread in this process, and no CUDA in
    it."""

    def __init__(self, entry: str, what: str, fork: bool = False, capture: bool = False):
        """`capture`: what the child prints (a JVM's warnings, its last words before a crash) is kept, its last
        64 KiB as `said()`, instead of reaching this process's terminal; a new interpreter only."""
        if fork and capture:
            raise ValueError("a forked child shares this process's output: capture needs a new interpreter")
        self.what = what
        self._said = bytearray()
        read_end, write_end = os.pipe()
        try:
            if fork:
                self.process: subprocess.Popen | _Forked = _Forked(entry, what, write_end)
            else:
                output = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT} if capture else {}
                self.process = subprocess.Popen([sys.executable, "-P", "-c", _BOOT, str(write_end), entry, what],
                                                stdin=subprocess.PIPE, pass_fds=(write_end,), process_group=0,
                                                **output)
                if capture:
                    threading.Thread(target=self._drain, name="child-output", daemon=True).start()
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
            with contextlib.suppress(OSError):  # fdopen may have taken it, and closed it, before the interruption
                os.close(read_end)
            self.process.kill()
            self.process.wait()
            raise
        if fork:
            return
        try:
            pickle.dump(sys.path, self.stdin)  # a few hundred bytes: the pipe takes them at once
            self.stdin.flush()
        except OSError:
            pass  # it died already: its first message or its exit code says how

    def _drain(self) -> None:
        while chunk := os.read(self.process.stdout.fileno(), 65536):
            self._said = (self._said + chunk)[-65536:]

    def said(self) -> str:
        """The end of what a capturing child printed (its last lines), as text."""
        return self._said.decode(errors="replace")

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
        for pipe in (self.stdin, self.messages, getattr(self.process, "stdout", None)):
            with contextlib.suppress(OSError, AttributeError):
                pipe.close()


def send_message(out: BinaryIO, *message: object) -> None:
    """A child's message to its parent (PythonChild.messages)."""
    pickle.dump(message, out, protocol=pickle.HIGHEST_PROTOCOL)
    out.flush()


def relay(child: PythonChild, inbox: queue.SimpleQueue, last: tuple[str, ...] = ("done", "error")) -> None:
    """One child's messages into `inbox` (run it in a thread), up to the first of a kind in `last`; ("gone", child)
    if the child ends without one (its stream ends, or is cut off by its death)."""
    while True:
        try:
            message = pickle.load(child.messages)
        except Exception:
            inbox.put(("gone", child))
            return
        inbox.put(message)
        if message[0] in last:
            return


# An external program (Java) must die with this process too. A SIGKILLed parent runs no cleanup, and an orphaned
# program would go on writing into the parent's work directory; so it starts through this launcher, which asks Linux to
# SIGKILL it when its parent dies (PR_SET_PDEATHSIG survives exec), checks that the parent has not died already, and
# execs the program. No preexec_fn: that is unsafe once threads (a JVM's, tqdm's) exist in this process.
_DIE_WITH_PARENT = """\
import ctypes, os, signal, sys
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
except (OSError, AttributeError):  # not Linux
    pass
if os.getppid() != int(sys.argv[1]):
    sys.exit(1)
os.execv(sys.argv[2], sys.argv[2:])
"""


def dying_with_this_process(command: list[str]) -> list[str]:
    """`command` (an external program, its path first) as a command line whose process dies with this one."""
    return [sys.executable, "-I", "-S", "-c", _DIE_WITH_PARENT, str(os.getpid()), *command]


class _Forked:
    """A forked PythonChild's process, with what PythonChild uses of a Popen (stdin, poll, wait, terminate, kill,
    pid, returncode)."""

    def __init__(self, entry: str, what: str, out: int):
        for stream in (sys.stdout, sys.stderr):  # else the child holds a copy of what they buffer, and may write it
            if stream:
                stream.flush()
        self.pid, self.returncode, self._owner = 0, None, os.getpid()
        # Signals are held back until the child has its own handlers: a Ctrl-C delivered in between would raise the
        # caller's KeyboardInterrupt in the child at the fork, and the child would go on as the caller (its cleanup,
        # the rest of its script); a SIGTERM would run the caller's handler instead of ending it. A signal's Python
        # handler runs after pthread_sigmask has changed the mask, so each change is undone before it is re-raised.
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, ())  # only reads it
        try:
            signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        except BaseException:  # a signal delivered just before: its handler raised once the mask was applied
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
            raise
        # from here to the restore no Python handler can run: this part ends as written, or fails on an OSError
        pipe: list[int] = []
        try:
            pipe = list(os.pipe())
            self.pid = os.fork()
            if self.pid == 0:  # the child: never returns into the parent's stack
                _forked_main(entry, what, pipe[0], out, previous)
            os.close(pipe.pop(0))
            with contextlib.suppress(OSError):  # as the child does itself: whichever runs first
                os.setpgid(self.pid, self.pid)
            self.stdin: BinaryIO = os.fdopen(pipe[-1], "wb")
            pipe.pop()
        except BaseException:  # the fork failed (EAGAIN, ENOMEM), or what follows it: nothing is left started
            self._end()
            for fd in pipe:
                os.close(fd)
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
            raise
        # a signal held back meanwhile is handled here; should its handler raise, this child is never handed over,
        # and __del__ ends it
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)

    def __del__(self) -> None:
        if self.pid and self.returncode is None and os.getpid() == self._owner:  # not in a fork of the owner
            self._end()

    def _end(self) -> None:
        """Kill and reap it, if it was started and is not reaped yet."""
        if self.pid and self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            try:
                self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
            except ChildProcessError:  # reaped elsewhere (a caller's SIGCHLD set to SIG_IGN)
                self.returncode = -signal.SIGKILL

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere (a caller's SIGCHLD set to SIG_IGN): gone, status unknown
                self.returncode = 0
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"forked {self.pid}", timeout)
            time.sleep(0.01)
        return self.returncode

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, number: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, number)


def _forked_main(entry: str, what: str, stdin: int, out: int, mask: set[signal.Signals]) -> NoReturn:
    """A forked child's life: as a started one's (_BOOT), with its pipes in place of what it inherited, the default
    signal handlers in place of the caller's, and the caller's garbage left alone (an open file in an unreachable
    cycle, collected here, would close a descriptor number this child has reused)."""
    gc.freeze()
    code = 1
    try:
        for number in signal.valid_signals():  # the caller's Python handlers are not this child's
            if number not in (signal.SIGKILL, signal.SIGSTOP) and callable(signal.getsignal(number)):
                signal.signal(number, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the parent ends it so, even where its own was ignored
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent's to handle; the entry sets its own
        os.setpgid(0, 0)
        # a terminal's stop signal held back since the fork would now stop this child in a group the shell does not
        # continue: ignored while the mask is restored, which discards it, then as before
        stops = (signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)
        kept = [signal.signal(number, signal.SIG_IGN) for number in stops]
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for number, handler in zip(stops, kept):
            signal.signal(number, handler)
        os.dup2(stdin, 0)
        # the parent's other descriptors (the other children's pipes, its lock file) are not this child's: one kept
        # open here would hide from a sibling that its parent is gone (end_with_stdin)
        os.closerange(3, out)
        os.closerange(out + 1, os.sysconf("SC_OPEN_MAX"))
        sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
        sys.argv = ["-c", str(out), entry, what]  # as _BOOT's: an entry names itself by sys.argv[3]
        messages = os.fdopen(out, "wb")
        try:
            module, function = entry.split(":")
            run = getattr(importlib.import_module(module), function)
        except BaseException as exc:  # as _BOOT: one line for the parent, nothing else
            send_message(messages, "error", f"{what} could not start: {type(exc).__name__}: {exc}")
            os._exit(1)
        run(messages)
        code = 0
    except SystemExit as exc:  # as the interpreter ends on one
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            with contextlib.suppress(BaseException):
                print(exc.code, file=sys.stderr, flush=True)
    except BaseException:  # nothing to raise into: its parent hears of it through its pipe's end
        with contextlib.suppress(BaseException):
            traceback.print_exc()
    finally:
        os._exit(code)
