"""`lsr-index` run inside the test process, through click's CliRunner: the same command code, parsing and error
handling, without the seconds of torch and transformers imports that each new process pays.

Tests whose subject is the process itself (kills, signals, orphans, a terminal, which modules a run imports) start
real processes instead; so does the README's pipeline test.
"""

from __future__ import annotations

import signal
import subprocess

from click.testing import CliRunner

from lsr_index.cli import main


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """Like subprocess.run([lsr-index, *args], capture_output=True, text=True). An exception the CLI does not turn
    into its one-line error propagates (a real process would print a traceback), so no test can mistake it for a
    clean refusal."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}  # commands set their own
    try:
        result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    return subprocess.CompletedProcess(["lsr-index", *args], result.exit_code, result.stdout, result.stderr)


def kept_line(out) -> str:
    """What a stopped encode says after "interrupted: " or "terminated: ", given what its manifest in `out` keeps."""
    from lsr_index.vectors.manifest import MANIFEST, Manifest

    manifest = Manifest.load(out) if (out / MANIFEST).is_file() else None
    kept = manifest.docs + sum(c.docs for c in manifest.chunks) if manifest else 0
    if not kept:
        return "nothing was kept yet; rerun the same command to start again"
    return f"kept {kept:,} document{'s' if kept != 1 else ''}; rerun the same command to continue where it stopped"
