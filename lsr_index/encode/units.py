"""How a run's tasks share its input: each claims input units in turn (a faster device claims more), parses them,
and has them numbered by the run's one sequencer, which lives with the plan. A task in another process reaches it
through messages (`RemoteUnits`), relayed by every process between.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from lsr_index.inputs.sequence import BatchSummary, Numbered, Sequencer
from lsr_index.inputs.units import Unit

Deliver = Callable[[Numbered], object]


class Units:
    """The run's units, handed out in stream order, and the sequencer that numbers what their readers parse."""

    def __init__(self, units: list[Unit], sequencer: Sequencer):
        self.units, self.sequencer = units, sequencer
        self._lock = threading.Lock()
        self._next = 0
        self._deliver: dict[int, Deliver] = {}

    def claim(self) -> Unit | None:
        """The next unit nobody has taken, or None when all are taken."""
        with self._lock:
            if self._next >= len(self.units):
                return None
            self._next += 1
            return self.units[self._next - 1]

    def submit(self, summary: BatchSummary, deliver: Deliver) -> None:
        """A parsed batch; `deliver` gets its numbering (from whichever thread numbers it) once every batch before it
        in the stream is numbered. A bad record raises here, in stream order (on_error="fail")."""
        with self._lock:
            self._deliver[summary.unit] = deliver
            ready = self.sequencer.add(summary)
            for numbered in ready:
                self._deliver[numbered.unit](numbered)


class RemoteUnits:
    """`Units` in another process: a claim is a request answered by a ("unit", unit) message, a summary is sent on,
    and numberings come back as ("numbered", numbering) messages, which this process's reader hands to `receive`."""

    def __init__(self, send: Callable[..., object]):
        self._send = send
        self._claiming = threading.Lock()
        self._claimed = threading.Event()
        self._unit: Unit | None = None
        self._deliver: dict[int, Deliver] = {}

    def claim(self) -> Unit | None:
        with self._claiming:
            self._claimed.clear()
            self._send("claim")
            self._claimed.wait()
            return self._unit

    def submit(self, summary: BatchSummary, deliver: Deliver) -> None:
        self._deliver[summary.unit] = deliver
        self._send("summary", summary)

    def receive(self, kind: str, body: object) -> None:
        """A message from the process that holds the units."""
        if kind == "unit":
            self._unit = body
            self._claimed.set()
        elif kind == "numbered":
            self._deliver[body.unit](body)


class Numberings:
    """Numberings as they are delivered, waited for by the reader that submitted their batches."""

    def __init__(self):
        self._ready: dict[tuple[int, int], Numbered] = {}
        self._arrived = threading.Condition()

    def put(self, numbered: Numbered) -> None:
        with self._arrived:
            self._ready[numbered.unit, numbered.batch] = numbered
            self._arrived.notify_all()

    def get(self, unit: int, batch: int) -> Numbered:
        with self._arrived:
            while (unit, batch) not in self._ready:
                self._arrived.wait()
            return self._ready.pop((unit, batch))
