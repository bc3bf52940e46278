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

from lsr_index.errors import LsrIndexError
from lsr_index.runtime.children import PythonChild, end_with_stdin, send_message


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
        assert first.exit_code(120) == 1 and alive(second.process.pid)
    finally:
        first.close()
        second.close()


def test_terminate_kill_and_wait_behave_as_a_started_childs():
    child = PythonChild("test_children:echo_main", "a child", fork=True)
    with pytest.raises(subprocess.TimeoutExpired):
        child.process.wait(timeout=0.2)
    assert child.process.poll() is None
    child.process.terminate()  # what close() does first to a child that has not finished
    assert child.exit_code(120) == -signal.SIGTERM
    child.close()
    child.close()  # again: nothing left to do


@pytest.mark.parametrize("fork", [True, False], ids=["forked", "new-interpreter"])
def test_a_child_ends_on_terminate_even_where_sigterm_came_in_ignored(fork):
    """A parent started with SIGTERM ignored (a CI runner, a wrapper script) passes that on to every child; its
    children must still end on the parent's terminate, not wait out close()'s grace period and a SIGKILL."""
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        child = PythonChild("test_children:echo_main", "a child", fork=fork)
    finally:
        signal.signal(signal.SIGTERM, previous)
    try:
        pickle.dump(None, child.stdin)
        child.stdin.flush()
        assert pickle.load(child.messages)[0] == "echo"  # past its start: its entry is running
        child.process.terminate()
        assert child.exit_code(120) == -signal.SIGTERM
    finally:
        child.close()


KILLED_PARENT = textwrap.dedent("""
    import pickle, sys, time
    sys.path.insert(0, sys.argv[1])
    from lsr_index.runtime.children import PythonChild
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
    assert all(wait_dead(pid, 120) for pid in pids), [pid for pid in pids if alive(pid)]


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
    assert child.exit_code(120) == 3
    child.close()


def test_the_callers_signal_handlers_are_not_the_forked_childs():
    """A caller's SIGTERM handler (search installs one) must not run inside a forked child: it would handle the
    child's SIGTERM, and `close` would see exit code 1."""
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
    from lsr_index.runtime.children import PythonChild
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
    """Delivered before the child ignores it, a Ctrl-C would raise the parent's KeyboardInterrupt in the child at the
    fork, and the child would go on as the caller: its cleanup, the rest of its script."""
    run = subprocess.run([sys.executable, "-c", CTRL_C_AT_FORK, os.path.dirname(__file__)], capture_output=True,
                         text=True, timeout=300)
    lines = run.stdout.splitlines()
    assert run.returncode == 0 and lines[0] == "answer echo" and len(lines) == 2 and \
        lines[1] == f"caller done in {lines[1].split()[-1]}", (run.stdout, run.stderr)
    assert "KeyboardInterrupt" not in run.stderr, run.stderr


def exit_quietly_main(out) -> None:
    sys.exit()


def test_an_entry_ending_with_a_bare_sys_exit_exits_0():
    child = PythonChild("test_children:exit_quietly_main", "a child", fork=True)
    assert child.exit_code(120) == 0
    child.close()


AT_A_STEP = textwrap.dedent("""
    import gc, os, pickle, signal, sys
    sys.path.insert(0, sys.argv[1])
    from lsr_index.runtime.children import PythonChild
    step, parent = sys.argv[2], os.getpid()
    def in_the_parent(name, signum):  # a signal reaching the parent at one step of the fork
        real = getattr(os, name)
        def patched(*args):
            if os.getpid() == parent:
                os.kill(parent, signum)
            return real(*args)
        setattr(os, name, patched)
    if step == "ctrl-c-before-the-fork":
        in_the_parent("pipe", signal.SIGINT)  # held back: its handler raises at the restore after the fork
    elif step == "ctrl-c-after-the-fork":
        in_the_parent("setpgid", signal.SIGINT)
    elif step == "no-descriptor-after-the-fork":
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the child is reaped by the kernel: waitpid finds none
        real_fdopen = os.fdopen
        def fdopen(fd, mode="r", *args, **kwargs):
            if mode == "wb" and os.getpid() == parent:
                raise OSError(24, "Too many open files")
            return real_fdopen(fd, mode, *args, **kwargs)
        os.fdopen = fdopen
    fds = set(os.listdir("/proc/self/fd"))
    try:
        child = PythonChild("test_children:echo_main", "the child", fork=True)
        print("started", flush=True)
        child.close()
    except BaseException as exc:
        print(f"raised {type(exc).__name__} {str(exc).split(':')[-1].strip()}".strip(), flush=True)
    gc.collect()
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    print("blocked", len(blocked), "new descriptors", len(set(os.listdir("/proc/self/fd")) - fds), flush=True)
    print("children", [p for p in os.listdir("/proc") if p.isdigit() and
                       open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1] == str(parent)], flush=True)
""")


@pytest.mark.parametrize(("step", "raised"), [
    ("ctrl-c-before-the-fork", "raised KeyboardInterrupt"),
    ("ctrl-c-after-the-fork", "raised KeyboardInterrupt"),
    ("no-descriptor-after-the-fork", "raised LsrIndexError [Errno 24] Too many open files"),
])
def test_an_interrupted_or_failed_start_leaves_no_child_no_descriptor_and_no_signal_blocked(step, raised):
    """A handler's exception at the mask's restore must leave no child untracked and unreaped, and no parent with
    every signal blocked; a failure after the fork with SIGCHLD ignored must not end in 'No child processes' with a
    pipe kept open."""
    run = subprocess.run([sys.executable, "-c", AT_A_STEP, os.path.dirname(__file__), step], capture_output=True,
                         text=True, timeout=300)
    assert run.stdout.splitlines() == [raised, "blocked 0 new descriptors 0", "children []"], (run.stdout,
                                                                                               run.stderr)


CTRL_Z_AT_FORK = textwrap.dedent("""
    import os, signal, sys, time
    sys.path.insert(0, sys.argv[1])
    from lsr_index.runtime.children import PythonChild
    fork = os.fork
    def fork_then_ctrl_z():  # Ctrl-Z reaching the new child before it left the terminal's group
        pid = fork()
        if pid == 0:
            os.kill(os.getpid(), signal.SIGTSTP)
        return pid
    os.fork = fork_then_ctrl_z
    child = PythonChild("test_children:echo_main", "the child", fork=True)
    deadline = time.time() + 120
    state = "R"
    while state not in ("S", "T", "t") and time.time() < deadline:  # waiting on its stdin, or stopped for good
        time.sleep(0.05)  # "R" or, on a busy machine, "D" (reading a file): still starting
        state = open(f"/proc/{child.process.pid}/stat").read().rsplit(")", 1)[1].split()[0]
    print(state, flush=True)
    child.close()
    print(child.process.returncode, flush=True)
""")


def test_ctrl_z_reaching_a_child_as_it_forks_does_not_stop_it_for_good():
    """Held back until the child has left the terminal's group, a Ctrl-Z would stop the child where the shell's `fg`
    never continues it, and the parent would wait on it for good."""
    run = subprocess.run([sys.executable, "-c", CTRL_Z_AT_FORK, os.path.dirname(__file__)], capture_output=True,
                         text=True, timeout=300)
    assert run.stdout.split() == ["S", str(-signal.SIGTERM)], (run.stdout, run.stderr)
