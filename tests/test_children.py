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
