"""Running a command as a user sees it: stderr on a pseudo-terminal (so progress bars draw), stdout apart."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import termios
import threading


def on_terminal(cmd: list[str], columns: int = 160) -> subprocess.CompletedProcess:
    """Run `cmd` with its stderr on a terminal of `columns`; returns what it wrote to each."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    seen = bytearray()

    def drain() -> None:
        while True:
            try:
                chunk = os.read(master, 1 << 16)
            except OSError:  # EIO: every holder of the terminal's other end has closed it
                return
            if not chunk:
                return
            seen.extend(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=slave) as proc:
            os.close(slave)
            out, _ = proc.communicate()
    finally:
        reader.join()
        os.close(master)
    return subprocess.CompletedProcess(cmd, proc.returncode, out.decode(), seen.decode(errors="replace"))
