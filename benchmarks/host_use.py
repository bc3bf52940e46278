"""Where a run's host time goes: the CPU each of its processes used, by role, and how busy each GPU was.

A multi-GPU encode is a tree of processes: the planner (the run's own process), one worker per GPU (which launches
the model's kernels), and beside each worker an input process (parsing, tokenizing) and serializer processes. When a
worker runs slower beside others than alone, this says which of them ran out of host: a role whose busiest thread
holds a whole core is bound by its GIL; roles whose cores together reach the host's are bound by the host.

    with HostUse(pid) as use:   # pid: the run's process (this one by default)
        ...
    use.summary()  # {"roles": {role: {...}}, "gpus": [mean utilization %], "seconds": wall}

Linux only (/proc); GPU utilization from nvidia-smi where there is one.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from collections import defaultdict
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")
_ROLES = {"feed:input_main": "input", "serializers:serializer_main": "serializers", "local:worker_main": "workers"}


def _ticks(stat: Path) -> int:
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


class HostUse:
    """Samples the process tree under `pid` every `every` seconds while the block runs."""

    def __init__(self, pid: int | None = None, every: float = 0.5):
        self.pid, self.every = pid or os.getpid(), every
        self.process_ticks: dict[int, int] = {}
        self.thread_ticks: dict[int, dict[int, int]] = defaultdict(dict)
        self.role: dict[int, str] = {}
        self.gpu_samples: dict[int, list[int]] = defaultdict(list)
        self._stop = threading.Event()

    def _role(self, pid: int, parent_role: str | None) -> str:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            return "other"
        for entry, role in _ROLES.items():
            if entry in command:
                return role
        return "workers" if parent_role == "planner" else "other"  # a worker forked from the planner

    def _sample(self) -> None:
        todo = [(self.pid, None)]
        while todo:
            pid, parent_role = todo.pop()
            role = self.role.setdefault(pid, "planner" if parent_role is None else self._role(pid, parent_role))
            try:
                self.process_ticks[pid] = _ticks(Path(f"/proc/{pid}/stat"))
                for task in Path(f"/proc/{pid}/task").iterdir():
                    with contextlib.suppress(OSError):
                        self.thread_ticks[pid][int(task.name)] = _ticks(task / "stat")
                todo += [(child, role) for child in _children(pid)]
            except OSError:
                continue  # it ended: its last sample stands

    def _gpus(self) -> None:
        try:
            smi = subprocess.Popen(["nvidia-smi", "--query-gpu=index,utilization.gpu", "--format=csv,noheader,nounits",
                                    f"-lms={int(self.every * 1000)}"], stdout=subprocess.PIPE, text=True,
                                   stderr=subprocess.DEVNULL)
        except OSError:
            return
        threading.Thread(target=self._read_gpus, args=(smi,), daemon=True).start()
        self._stop.wait()
        smi.terminate()
        smi.wait()

    def _read_gpus(self, smi: subprocess.Popen) -> None:
        for line in smi.stdout:
            try:
                index, busy = (int(v) for v in line.split(","))
            except ValueError:
                continue
            self.gpu_samples[index].append(busy)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._sample()

    def __enter__(self) -> HostUse:
        self._t0 = time.perf_counter()
        self._start = {}
        self._sample()
        self._start = dict(self.process_ticks)
        self._start_threads = {pid: dict(t) for pid, t in self.thread_ticks.items()}
        self._threads = [threading.Thread(target=self._run, daemon=True),
                         threading.Thread(target=self._gpus, daemon=True)]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._sample()
        self.seconds = time.perf_counter() - self._t0
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)

    def summary(self) -> dict:
        """Per role: its processes, the cores they kept busy on average, and the busiest single thread's share of a
        core (1.0: a thread that never waited); per GPU: its mean utilization in %."""
        roles: dict[str, dict] = {}
        for pid, ticks in self.process_ticks.items():
            role = roles.setdefault(self.role[pid], {"processes": 0, "cores_busy": 0.0, "busiest_thread": 0.0})
            role["processes"] += 1
            role["cores_busy"] += (ticks - self._start.get(pid, 0)) / _TICK / self.seconds
            started = self._start_threads.get(pid, {})
            busiest = max((t - started.get(tid, 0) for tid, t in self.thread_ticks[pid].items()), default=0)
            role["busiest_thread"] = max(role["busiest_thread"], busiest / _TICK / self.seconds)
        for role in roles.values():
            role["cores_busy"], role["busiest_thread"] = round(role["cores_busy"], 2), round(role["busiest_thread"], 2)
        return {"seconds": round(self.seconds, 2), "roles": roles,
                "gpus": [round(sum(s) / len(s), 1) for _, s in sorted(self.gpu_samples.items()) if s]}
