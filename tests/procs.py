"""Processes seen through /proc, for the tests that check what outlives what."""

from __future__ import annotations

import time
from pathlib import Path


def stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name (state, parent pid, ...); [] once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def alive(pid: int) -> bool:
    fields = stat(pid)
    return bool(fields) and fields[0] not in ("Z", "X")  # a zombie has died; only its exit status is left


def wait_dead(pid: int, seconds: float = 10) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


def children(pid: int, named: bytes = b"") -> list[int]:
    """Pids of the processes whose parent is `pid` (and whose command line holds `named`)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = stat(int(entry.name))
        try:
            if fields and int(fields[1]) == pid and named in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found
