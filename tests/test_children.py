"""Children started as forks (PythonChild(fork=True), how GPU workers start): each runs its entry with its own
pipes only, so that it, and every sibling, still ends when the parent closes its stdin or dies. Real processes."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from procs import alive, wait_dead

from lsr_index.children import PythonChild, end_with_stdin, send_message
from lsr_index.errors import LsrIndexError


def echo_main(out) -> None:
    """A child's entry: what its stdin holds, its name and its open descriptors back; then it lives on its stdin."""
    message = pickle.load(sys.stdin.buffer)
    threading.Thread(target=end_with_stdin, daemon=True).start()  # after the read: it would take what stdin holds
    send_message(out, "echo", message, sys.argv[3], sorted(int(fd) for fd in os.listdir("/proc/self/fd")))
    time.sleep(600)


def test_a_forked_child_reads_its_stdin_and_answers_through_its_pipe_only():
    child = PythonChild("test_children:echo_main", "the echo child", fork=True)
    try:
        pickle.dump({"job": 1}, child.stdin)
        child.stdin.flush()
        kind, message, name, fds = pickle.load(child.messages)
        assert (kind, message, name) == ("echo", {"job": 1}, "the echo child")
        # stdin, stdout, stderr, its message pipe, and the listing's own descriptor: nothing of the parent's
        assert len(fds) == 5 and fds[:3] == [0, 1, 2], fds
        assert os.getpgid(child.process.pid) == child.process.pid  # its own group: Ctrl-C is the parent's
    finally:
        child.close()
    assert child.process.returncode is not None and not alive(child.process.pid)


def test_each_forked_child_ends_with_its_own_stdin_whatever_its_siblings_inherited():
    """The second fork inherits the first's stdin pipe from the parent: unless it closes it, the first never sees
    its stdin end."""
    first = PythonChild("test_children:echo_main", "first", fork=True)
    second = PythonChild("test_children:echo_main", "second", fork=True)
    try:
        for child in (first, second):
            pickle.dump(None, child.stdin)
            child.stdin.flush()
            assert pickle.load(child.messages)[0] == "echo"
        first.stdin.close()
        assert first.exit_code(10) == 1 and alive(second.process.pid)
    finally:
        first.close()
        second.close()


def test_terminate_kill_and_wait_behave_as_a_started_childs():
    child = PythonChild("test_children:echo_main", "a child", fork=True)
    with pytest.raises(subprocess.TimeoutExpired):
        child.process.wait(timeout=0.2)
    assert child.process.poll() is None
    child.close()  # terminate: it was not finished
    assert child.process.returncode == -signal.SIGTERM
    child.close()  # again: nothing left to do


KILLED_PARENT = textwrap.dedent("""
    import pickle, sys, time
    sys.path.insert(0, sys.argv[1])
    from lsr_index.children import PythonChild
    children = [PythonChild("test_children:echo_main", f"child {i}", fork=True) for i in range(2)]
    for child in children:
        pickle.dump(None, child.stdin)
        child.stdin.flush()
        assert pickle.load(child.messages)[0] == "echo"
    print(*[c.process.pid for c in children], flush=True)
    time.sleep(600)
""")


def test_forked_children_end_with_a_killed_parent(tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", KILLED_PARENT, os.path.dirname(__file__)],
                              stdout=subprocess.PIPE, text=True)
    pids = [int(pid) for pid in parent.stdout.readline().split()]
    assert len(pids) == 2 and all(alive(pid) for pid in pids)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    assert all(wait_dead(pid, 10) for pid in pids), [pid for pid in pids if alive(pid)]


def exit_three_main(out) -> None:
    sys.exit(3)


def test_an_entry_that_cannot_be_imported_says_so_in_one_line():
    child = PythonChild("no_such_module_here:main", "the missing child", fork=True)
    try:
        kind, message = pickle.load(child.messages)
        assert kind == "error" and message.startswith("the missing child could not start: ModuleNotFoundError")
    finally:
        child.close()


def test_a_forked_childs_exit_code_is_its_entrys():
    child = PythonChild("test_children:exit_three_main", "a child", fork=True)
    assert child.exit_code(10) == 3
    child.close()


def test_the_callers_signal_handlers_are_not_the_forked_childs():
    """A caller's SIGTERM handler (search installs one) ran inside the child, and `close` then saw exit code 1."""
    previous = signal.signal(signal.SIGTERM, lambda *_: print("the caller's handler ran", flush=True))
    try:
        child = PythonChild("test_children:echo_main", "a child", fork=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
    child.close()
    assert child.process.returncode == -signal.SIGTERM


def test_a_failed_fork_is_one_line_and_leaves_no_descriptor(monkeypatch):
    def refuse():
        raise BlockingIOError(11, "Resource temporarily unavailable")

    before = len(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(os, "fork", refuse)
    with pytest.raises(LsrIndexError, match=r"cannot start the child .*Resource temporarily unavailable"):
        PythonChild("test_children:echo_main", "the child", fork=True)
    assert len(os.listdir("/proc/self/fd")) == before


CTRL_C_AT_FORK = textwrap.dedent("""
    import os, pickle, signal, sys
    sys.path.insert(0, sys.argv[1])
    from lsr_index.children import PythonChild
    fork = os.fork
    def fork_then_ctrl_c():  # Ctrl-C reaching the new child at once, before it could ignore it
        pid = fork()
        if pid == 0:
            os.kill(os.getpid(), signal.SIGINT)
        return pid
    os.fork = fork_then_ctrl_c
    try:
        child = PythonChild("test_children:echo_main", "the child", fork=True)
        pickle.dump(None, child.stdin)
        child.stdin.flush()
        print("answer", pickle.load(child.messages)[0], flush=True)
        child.close()
    finally:
        print("caller done in", os.getpid(), flush=True)
""")


def test_ctrl_c_reaching_a_child_as_it_forks_never_runs_the_callers_code():
    """Delivered before the child ignored it, the parent's KeyboardInterrupt was raised in the child at the fork,
    and the child went on as the caller: its cleanup, the rest of its script."""
    run = subprocess.run([sys.executable, "-c", CTRL_C_AT_FORK, os.path.dirname(__file__)], capture_output=True,
                         text=True, timeout=60)
    lines = run.stdout.splitlines()
    assert run.returncode == 0 and lines[0] == "answer echo" and len(lines) == 2 and \
        lines[1] == f"caller done in {lines[1].split()[-1]}", (run.stdout, run.stderr)
    assert "KeyboardInterrupt" not in run.stderr, run.stderr
