"""The input process (feed.InputProcess): beside a GPU a task reads and tokenizes in a process of its own.
Here it is forced on the CPU, and held to the threads' results: the same bytes, counts, errors and resumes, and no
process left behind whatever ends the run."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from procs import alive, children

from lsr_index.encode import feed, sink, task
from lsr_index.encode.job import Assignment, EncodeJob, EncodeOptions
from lsr_index.encode.run import encode_corpus
from lsr_index.encode.units import Units
from lsr_index.errors import InputError, LsrIndexError
from lsr_index.vectors.manifest import Manifest

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample" / "corpus.jsonl"


def encode(source: Path, out: Path, process: bool, monkeypatch, on_error: str = "fail", **options) -> Manifest:
    monkeypatch.setattr(task, "reads_in_a_process", lambda device: process)
    options = {"doc_max_length": 32, "shard_docs": 150, "progress": False, "output_format": "jsonl", **options}
    return encode_corpus(EncodeJob(inputs=(str(source),), on_error=on_error, options=EncodeOptions(**options)), out)


def corpus_with_bad_records(tmp_path: Path) -> Path:
    lines = SAMPLE.read_text().splitlines()[:300]
    lines[40] = '{"id": "x1", "text": 5}'
    lines[211] = "{not json"
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_input_process_writes_what_the_threads_write(tmp_path, monkeypatch):
    source = corpus_with_bad_records(tmp_path)
    threads = encode(source, tmp_path / "threads", False, monkeypatch, on_error="skip", doc_max_length=16)
    process = encode(source, tmp_path / "process", True, monkeypatch, on_error="skip", doc_max_length=16)
    assert [s.sha256 for s in process.shards] == [s.sha256 for s in threads.shards] and len(process.shards) == 2
    assert process.truncation == threads.truncation and process.truncation.documents > 0
    assert process.docs == threads.docs == 298 and process.skipped == threads.skipped == 2
    report = (tmp_path / "process" / "skipped.jsonl").read_text()
    assert report == (tmp_path / "threads" / "skipped.jsonl").read_text() and f"{source}" in report


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_several_input_processes_write_what_the_threads_write(tmp_path, monkeypatch, fmt):
    """Three input processes claim the units of a corpus cut into many (byte ranges of a JSONL file, runs of a
    Parquet file's row groups) and their pieces reach the model in whichever order they are ready: the shards and
    their records are the threads' bytes, and the stats count the readers."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lsr_index.inputs import units as units_module

    records = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    records = [{**r, "id": f"{copy}-{r['id']}"} for copy in range(3) for r in records]
    source = tmp_path / f"c.{fmt}"
    if fmt == "jsonl":
        source.write_text("".join(json.dumps(r) + "\n" for r in records))
    else:
        pq.write_table(pa.Table.from_pylist(records), source, row_group_size=40)
    monkeypatch.setattr(units_module, "FIRST_BYTES", 6000)
    monkeypatch.setattr(task, "readers_for", lambda cores: 3)
    threads = encode(source, tmp_path / "threads", False, monkeypatch, checkpoint_seconds=0)
    process = encode(source, tmp_path / "process", True, monkeypatch, checkpoint_seconds=0)
    assert process.stats.units > 20 and len(process.shards) == 8
    assert [s.sha256 for s in process.shards] == [s.sha256 for s in threads.shards]
    assert [s.input for s in process.shards] == [s.input for s in threads.shards]
    assert process.truncation == threads.truncation and process.docs == threads.docs == 1200
    assert [w.readers for w in process.stats.per_worker] == [3] and [w.readers for w in threads.stats.per_worker] == [0]
    assert not children(_self_pid(), b"input_main")


def test_a_bad_record_read_in_the_input_process_is_one_line_naming_file_and_line(tmp_path, monkeypatch):
    source = corpus_with_bad_records(tmp_path)
    messages = []
    for process in (False, True):
        with pytest.raises(LsrIndexError) as caught:
            encode(source, tmp_path / f"out{process}", process, monkeypatch)
        messages.append(str(caught.value))
    assert messages[0] == messages[1] and f"{source}:41:" in messages[1], messages
    assert isinstance(caught.value, InputError) and (caught.value.where, caught.value.path) == (41, str(source))
    assert "Traceback" not in messages[1] and "\n" not in messages[1]
    assert not children(_self_pid(), b"input_main")


@pytest.mark.parametrize(("stop_at", "resume_at", "readers"), [(512, 512, 1), (768, 768, 1), (768, 768, 3)])
def test_a_resumed_run_reads_its_checkpoints_in_the_input_process(tmp_path, monkeypatch, stop_at, resume_at, readers):
    """A run stopped after some chunks (one a piece here: checkpoint_seconds 0) is finished by a later run reading in
    one input process or three: the same bytes as one uninterrupted run. The reader's batches hold 256 documents (the
    window), cut at the shard edge 600: a run stopped at 768 has published shard 0 from its three chunks."""
    monkeypatch.setattr(task, "readers_for", lambda cores: readers)
    source = tmp_path / "c.jsonl"
    source.write_text("".join(json.dumps({"id": f"d{i}", "text": f"passage {i} about {i % 23}"}) + "\n"
                              for i in range(900)))
    whole = encode(source, tmp_path / "whole", False, monkeypatch, shard_docs=600, max_tokens=4096)
    out = tmp_path / "resumed"
    real_write = sink.ChunkSink._write

    def stop_at_a_piece(self, chunk, piece, *rest):
        if piece.start >= stop_at:
            raise KeyboardInterrupt
        return real_write(self, chunk, piece, *rest)

    monkeypatch.setattr(sink.ChunkSink, "_write", stop_at_a_piece)
    with pytest.raises(KeyboardInterrupt):
        encode(source, out, False, monkeypatch, shard_docs=600, max_tokens=4096, checkpoint_seconds=0)
    monkeypatch.setattr(sink.ChunkSink, "_write", real_write)
    stopped = Manifest.load(out)
    assert stopped.docs + sum(c.docs for c in stopped.chunks) == resume_at
    resumed = encode(source, out, True, monkeypatch, shard_docs=600, max_tokens=4096, checkpoint_seconds=0)
    assert resumed.stats.resumed_at == resume_at and resumed.stats.docs_this_run == 900 - resume_at
    assert [s.sha256 for s in resumed.shards] == [s.sha256 for s in whole.shards] and not resumed.chunks


PARENT = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from lsr_index.encode.feed import InputProcess
    from lsr_index.encode.job import Assignment
    from lsr_index.encode.job import EncodeJob, EncodeOptions
    from lsr_index.model.ref import ModelRef
    from lsr_index.encode.units import Units

    job = EncodeJob(inputs=(sys.argv[1],), options=EncodeOptions(shard_docs=64, progress=False))
    reader = job.reader()
    units = Units(reader.units(), reader.sequencer(reader.units()))
    stream = InputProcess(job, Assignment(), units,
                          ModelRef.resolve("splade-tiny").tokenizer().backend_tokenizer.to_str())
    next(stream)  # started and sending; it now waits for this process to read on
    print(stream._children[0].process.pid, flush=True)
    time.sleep(600)
""")


@pytest.mark.slow
def test_the_input_process_ends_with_a_killed_parent(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parent = subprocess.Popen([sys.executable, str(script), str(SAMPLE)], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert alive(child)
    finally:
        parent.kill()
        parent.wait()
    deadline = time.time() + 30
    while time.time() < deadline and alive(child):
        time.sleep(0.1)
    assert not alive(child), "the input process outlived its parent"


def input_process(source: Path, shard_docs: int = 32) -> feed.InputProcess:
    from lsr_index.encode.job import EncodeJob as Job
    from lsr_index.model.ref import ModelRef

    job = Job(inputs=(str(source),), options=EncodeOptions(shard_docs=shard_docs, progress=False))
    reader = job.reader()
    return feed.InputProcess(job, Assignment(), Units(reader.units(), reader.sequencer(reader.units())),
                             ModelRef.resolve("splade-tiny").tokenizer().backend_tokenizer.to_str())


def test_closing_the_stream_early_ends_the_input_process():
    stream = input_process(SAMPLE)
    piece, ids, tokens, stats = next(stream)
    assert (piece.shard, piece.start, piece.rows.num_rows) == (0, 0, 32) and len(ids) == 32
    assert tokens.offsets[-1] == len(tokens.ids) and stats.digest
    stream.close()
    assert stream._children[0].process.poll() is not None and not children(_self_pid(), b"input_main")


def test_a_killed_input_process_is_one_line_and_nothing_waits_forever(tmp_path):
    source = tmp_path / "many.jsonl"
    source.write_text("".join(json.dumps({"id": f"d{i}", "text": f"text {i}"}) + "\n" for i in range(20000)))
    stream = input_process(source)
    next(stream)
    stream._children[0].process.kill()
    with pytest.raises(LsrIndexError, match=r"ended unexpectedly \(exit code -9\); rerun the same command"):
        for _ in stream:  # what it sent before it died, then the error
            pass
    stream.close()


def test_nothing_the_input_process_prints_or_finds_in_the_directory_disturbs_it(tmp_path, monkeypatch, capfd):
    """A sitecustomize that prints at start-up, and a struct.py in the working directory (which `python -c` would
    put first on the path): the pieces still arrive whole."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("print('hello from sitecustomize')\n")
    (tmp_path / "struct.py").write_text("raise ImportError('a user module named like the standard library')\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.chdir(tmp_path)
    stream = input_process(SAMPLE, shard_docs=150)
    assert [(p.start, p.rows.num_rows) for p, *_ in stream] == [(0, 150), (150, 150), (300, 100)]
    stream.close()
    assert "hello from sitecustomize" in capfd.readouterr().out


def test_a_tokenizer_with_python_parts_keeps_to_threads():
    from tokenizers import pre_tokenizers

    from lsr_index.model.ref import ModelRef
    from lsr_index.model.tokens import TextTokenizer

    class Words:
        def pre_tokenize(self, pretok):
            pretok.split(lambda i, s: s.split())

    backend = ModelRef.resolve("splade-tiny").tokenizer().backend_tokenizer
    custom = type(backend).from_str(backend.to_str())
    custom.pre_tokenizer = pre_tokenizers.PreTokenizer.custom(Words())
    assert feed.serialized_tokenizer(TextTokenizer(custom)) is None
    assert feed.serialized_tokenizer(TextTokenizer(backend)) == backend.to_str()


def test_an_input_process_started_ahead_and_never_used_is_ended(monkeypatch):
    """The encoder starts its input process before it loads anything; an encoder that fails, closes before a run,
    or runs on pieces it is given (a cluster's driver reads) leaves none behind."""
    from lsr_index.encode.job import EncodeJob as Job

    monkeypatch.setattr(task, "reads_in_a_process", lambda device: True)
    job = Job(inputs=(str(SAMPLE),), options=EncodeOptions(progress=False))
    encoder = task.ShardEncoder(job, "cpu", 1)
    assert children(_self_pid(), b"input_main")
    encoder.close()
    assert not children(_self_pid(), b"input_main")
    with pytest.raises(LsrIndexError, match="no-such-model"):
        task.ShardEncoder(Job(inputs=(str(SAMPLE),), model="./no-such-model"), "cpu", 1)
    assert not children(_self_pid(), b"input_main")
    encoder = task.ShardEncoder(job, "cpu", 1, reads_input=False)
    assert encoder.input_children == []
    encoder.close()
    encoder = task.ShardEncoder(job, "cpu", 24)  # three readers for 24 cores, none left after a close
    assert len(children(_self_pid(), b"input_main")) == 3
    encoder.close()
    assert not children(_self_pid(), b"input_main")


@pytest.mark.parametrize("executable", [None, "/nonexistent/python"])
def test_a_child_that_cannot_start_is_one_line_and_leaks_no_descriptor(monkeypatch, executable):
    import contextlib
    import os

    from lsr_index.runtime.children import PythonChild

    def open_descriptors() -> set[tuple[str, str]]:
        """(fd, target) pairs: compared as sets, since other tests' threads may close theirs meanwhile."""
        found = set()
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):  # the listing's own descriptor, or one closed since
                found.add((fd, os.readlink(f"/proc/self/fd/{fd}")))
        return found

    monkeypatch.setattr(sys, "executable", executable)
    before = open_descriptors()
    with pytest.raises(LsrIndexError, match="cannot start the input-reading process"):
        PythonChild("lsr_index.encode.feed:input_main", "the input-reading process")
    assert open_descriptors() - before == set()


def _self_pid() -> int:
    import os

    return os.getpid()


def test_the_input_process_reads_ahead_up_to_a_bound_in_tokens(tmp_path, monkeypatch):
    """Unconsumed, the input process keeps tokenizing until it holds the bound's tokens (many pieces, not a fixed
    count of them), stops there, and the stream then still yields every document once, in order."""
    monkeypatch.setattr(feed, "_INPUT_AHEAD_TOKENS", 3000)
    source = tmp_path / "many.jsonl"
    source.write_text("".join(json.dumps({"id": f"d{i}", "text": f"text {i}"}) + "\n" for i in range(5000)))
    stream = input_process(source, shard_docs=32)
    deadline = time.time() + 300
    while time.time() < deadline and stream._items.held < 3000:
        time.sleep(0.1)
    time.sleep(1.0)  # at the bound it sends nothing more
    held = stream._items.held
    largest_piece = 32 * 6  # [CLS] text <number: 1-3 pieces> [SEP]
    assert 3000 <= held < 3000 + largest_piece, held
    starts = [piece.start for piece, *_ in stream]
    stream.close()
    assert starts == list(range(0, 5000, 32))


def test_a_stock_is_bounded_by_the_size_it_holds_and_lets_a_larger_item_in():
    from lsr_index.runtime.threads import Stock

    stop = threading.Event()
    stock = Stock(10, stop)
    assert stock.put("a", 4) and stock.put("b", 5) and stock.put("c", 30)  # below the bound each time: let in
    assert stock.held == 39
    late = []
    putter = threading.Thread(target=lambda: late.append(stock.put("d", 1)))
    putter.start()
    putter.join(0.3)
    assert putter.is_alive()  # at or above the bound: waits
    assert [stock.get(), stock.get()] == ["a", "b"] and putter.is_alive()  # 30 held still
    assert stock.get() == "c"
    putter.join(60)
    assert late == [True] and stock.get() == "d" and stock.held == 0
    stock.put("e", 20)
    blocked = []
    putter = threading.Thread(target=lambda: blocked.append(stock.put("f", 1)))
    putter.start()
    stop.set()
    putter.join(60)
    assert blocked == [False] and stock.get() == "e"  # a stopped stream takes nothing more


def test_input_processes_that_cannot_all_start_leave_none_running(monkeypatch):
    started, real = [], feed.input_child

    def third_fails():
        if len(started) == 2:
            raise LsrIndexError("cannot start the input-reading process: out of process slots")
        started.append(real())
        return started[-1]

    monkeypatch.setattr(feed, "input_child", third_fails)
    with pytest.raises(LsrIndexError, match="out of process slots"):
        feed.input_children(4)
    assert len(started) == 2 and all(child.process.poll() is not None for child in started)
    assert not children(_self_pid(), b"input_main")
