"""A command's steps: with LSR_INDEX_TIMELINE set, each step's time since the process started goes to stderr as one
line (`timeline 1.234 s: model resolved`), so the time before the first batch and after the last can be measured
where it is spent (imports, the plan, the workers' start, the model's load; the last vectors written, the last shard
published)."""

from __future__ import annotations

import os
import sys
import time

_ENABLED = bool(os.environ.get("LSR_INDEX_TIMELINE"))


def since_start() -> float:
    """Seconds since this process started (its start time in /proc), or since this module was imported elsewhere."""
    try:
        with open("/proc/self/stat") as f:
            started = int(f.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        with open("/proc/uptime") as f:
            return float(f.read().split()[0]) - started
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - _IMPORTED


_IMPORTED = time.perf_counter()


def mark(step: str) -> None:
    if _ENABLED:
        print(f"timeline {since_start():.3f} s: {step}", file=sys.stderr, flush=True)
