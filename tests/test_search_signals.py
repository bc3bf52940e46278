"""Ctrl-C and SIGTERM end a `search` promptly while Java is searching, with the usual message and no run file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from search_fixtures import SAMPLE, build, query_terms, random_docs, write_vectors

pytestmark = [pytest.mark.lucene, pytest.mark.slow]


@pytest.fixture(scope="module")
def busy(splade_tiny, tmp_path_factory) -> tuple[Path, Path]:
    """An index whose postings are long (20,000 documents over 200 query terms) and 600 queries: Java
    searches for a minute."""
    work = tmp_path_factory.mktemp("busy")
    docs = random_docs(query_terms(splade_tiny, 200), docs=20_000, per_doc=40, max_impact=20, seed=3)
    index = build(write_vectors(work / "vectors", splade_tiny, docs), work / "index")
    lines = (SAMPLE / "queries.tsv").read_text().splitlines()
    queries = work / "many.tsv"
    queries.write_text("".join(f"{k}\t{lines[k % len(lines)].split(chr(9))[1]}\n" for k in range(600)))
    return index, queries


def _java_searching(pid: int) -> bool:
    """Anserini's batch search runs in a Java work-stealing pool ('ForkJoinPool-N-worker-M')."""
    for comm in Path(f"/proc/{pid}/task").glob("*/comm"):
        try:
            if comm.read_text().startswith("ForkJoinPool"):
                return True
        except OSError:
            pass
    return False


@pytest.mark.parametrize(("signum", "status", "message"), [(signal.SIGINT, 130, "interrupted: no run was written"),
                                                           (signal.SIGTERM, 143, "terminated: no run was written")])
def test_a_signal_while_java_searches_ends_search_at_once(busy, tmp_path, signum, status, message):
    index, queries = busy
    run = tmp_path / "runs" / "many.trec"
    proc = subprocess.Popen([sys.executable, "-m", "lsr_index", "--quiet", "search", "--index", str(index),
                             "--queries", str(queries), "--run", str(run), "--threads", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 240
        while not _java_searching(proc.pid):
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(0.01)
        os.kill(proc.pid, signum)
        sent = time.monotonic()
        _, err = proc.communicate(timeout=10)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == status and took < 2.5, (proc.returncode, took, err)
    assert message in err and "Traceback" not in err, err
    assert not run.exists() and not (run.parent.exists() and list(run.parent.iterdir()))
