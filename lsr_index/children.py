"""The one rule for the processes lsr-index spawns (encoding workers, serializers): none outlives its parent."""

from __future__ import annotations

import multiprocessing as mp
import os
import threading


def end_with_parent() -> None:
    """Exit at once when the parent process ends (killed, or its own os._exit): an orphaned worker would write beside
    a rerun, and an orphaned serializer would wait forever on a call queue nobody writes, holding shared memory."""
    parent = mp.parent_process()
    if parent is not None:
        threading.Thread(target=lambda: (parent.join(), os._exit(1)), daemon=True).start()
