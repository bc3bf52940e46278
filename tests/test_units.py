"""The input divided into units: cut from the files alone, read in any order by any number of readers, and numbered
by one sequencer into exactly the stream one reader sees: the same documents, numbers, batches, skipped records and
first error. Several workers then write the bytes one worker writes, in every input format, also after a kill."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from itertools import pairwise
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lsr_index.errors import InputError
from lsr_index.inputs import units as units_module
from lsr_index.inputs.corpus import CorpusReader
from lsr_index.inputs.units import plan_units
from lsr_index.vectors.manifest import Manifest


@pytest.fixture
def small_units(monkeypatch):
    """Units of a few kilobytes: a test corpus of hundreds of documents is cut into many."""
    monkeypatch.setattr(units_module, "FIRST_BYTES", 3000)
    monkeypatch.setattr(units_module, "PER_FILE", 8)


def records(n: int, bad: dict[int, str] | None = None, prefix: str = "d") -> list[str]:
    lines = [json.dumps({"id": f"{prefix}{i}", "text": f"passage {i} about topic {i % 17} " * (1 + i % 5)})
             for i in range(n)]
    for k, line in (bad or {}).items():
        lines[k] = line
    return lines


def test_a_jsonl_file_is_cut_at_line_ends_into_units_that_grow_then_shrink(tmp_path, small_units):
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(records(600)) + "\n")
    units = plan_units([path])
    data = path.read_bytes()
    assert units[0].start == 0 and units[-1].stop == len(data) and len(units) > 8
    assert all(a.stop == b.start for a, b in pairwise(units))
    assert all(data[u.start - 1:u.start] == b"\n" for u in units[1:])  # each starts a line
    sizes = [u.stop - u.start for u in units]
    assert sizes[0] < max(sizes) and sizes[-1] < max(sizes)
    assert plan_units([path]) == units  # the files alone decide


def test_parquet_units_are_runs_of_row_groups_and_other_files_are_whole(tmp_path, small_units):
    table = pa.table({"id": [f"p{i}" for i in range(2000)], "text": [f"text {i} " * 20 for i in range(2000)]})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=100)
    (tmp_path / "c.jsonl.gz").write_bytes(b"")
    units = plan_units([tmp_path / "t.parquet", tmp_path / "c.jsonl.gz"])
    parquet = [u for u in units if u.fmt == "Parquet"]
    assert len(parquet) > 2 and parquet[0].start == 0 and parquet[-1].stop == 20
    assert all(a.stop == b.start and b.first_row == a.first_row + 100 * (a.stop - a.start)
               for a, b in pairwise(parquet))
    assert units[-1].fmt == "JSONL" and units[-1].stop is None and units[-1].index == len(units) - 1


def _corpus(tmp_path: Path, fmt: str, lines: list[str]) -> list[Path]:
    """The records as two files of format `fmt` (the second one JSONL, so that units of two files follow)."""
    half = len(lines) // 2
    first, second = tmp_path / "a", tmp_path / "b.jsonl"
    second.write_text("\n".join(lines[half:]) + "\n")
    if fmt == "jsonl":
        first = first.with_suffix(".jsonl")
        first.write_text("\n".join(lines[:half]) + "\n")
    else:
        rows = [json.loads(line) for line in lines[:half]]
        table = pa.table({"id": [r.get("id") for r in rows], "text": [r.get("text") for r in rows]})
        first = first.with_suffix(".parquet")
        pq.write_table(table, first, row_group_size=25)
    return [first, second]


def _in_any_order(reader: CorpusReader, seed: int) -> tuple[list[tuple[int, list[str]]], object]:
    """Every unit parsed in a shuffled order, its summaries handed to the sequencer as they come: the numbered
    batches (first number, kept ids) in stream order, and the sequencer."""
    units = reader.units()
    sequencer = reader.sequencer(units)
    parsed = {}
    order = list(range(len(units)))
    random.Random(seed).shuffle(order)
    numbered = {}
    for k in order:
        for batch in reader.parse(units[k]):
            parsed[k, batch.summary.batch] = batch
            for n in sequencer.add(batch.summary):
                numbered[n.unit, n.batch] = n
    batches = [(numbered[key].first, numbered[key].kept(parsed[key].ids)) for key in sorted(numbered)]
    return [(first, ids) for first, ids in batches if ids], sequencer


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_units_read_in_any_order_give_the_one_reader_stream(tmp_path, small_units, fmt, seed):
    bad = {7: '{"id": "x", "text": 5}', 230: "{not json", 400: json.dumps({"id": "d3", "text": "a duplicate"})}
    if fmt == "parquet":
        bad = {400: json.dumps({"id": "d3", "text": "a duplicate"}), 460: json.dumps({"id": "d461", "text": ""})}
    paths = _corpus(tmp_path, fmt, records(500, bad))
    reader = CorpusReader(paths, on_error="skip", batch_size=16)
    one = []
    position = 0
    for batch in reader:
        one.append((position, batch.column("id").to_pylist()))
        position += batch.num_rows
    assert len(reader.units()) > 4
    got, sequencer = _in_any_order(reader, seed)
    assert got == one, f"seed {seed}"
    assert sequencer.skipped == reader.skipped and sequencer.n_docs == reader.n_docs == position
    assert any("duplicate id 'd3'" in s.reason for s in sequencer.skipped)


def test_the_first_bad_record_of_the_stream_fails_whichever_unit_is_read_first(tmp_path, small_units, seed):
    paths = _corpus(tmp_path, "jsonl", records(500, {120: "{not json", 420: '{"id": 1}'}))
    reader = CorpusReader(paths, batch_size=16)
    with pytest.raises(InputError) as one:
        list(reader)
    with pytest.raises(InputError) as shuffled:
        _in_any_order(reader, seed)
    assert str(shuffled.value) == str(one.value) and one.value.where == 121, f"seed {seed}"


TWO_WORKERS = textwrap.dedent("""
    import sys
    from pathlib import Path
    from lsr_index.encode import local
    from lsr_index.encode.job import EncodeJob, EncodeOptions
    from lsr_index.encode.run import encode_corpus
    from lsr_index.inputs import units
    units.FIRST_BYTES, units.PER_FILE = 20_000, 8
    if sys.argv[5] == "fork":
        local._forks_workers = lambda devices: True  # as on GPUs
    devices = ("cpu",) * int(sys.argv[4])
    options = EncodeOptions(shard_docs=150, output_format=sys.argv[3], progress=False, doc_max_length=24,
                            checkpoint_seconds=float(sys.argv[6]))
    encode_corpus(EncodeJob(inputs=tuple(sys.argv[7:]), options=options), Path(sys.argv[1]), devices)
""")


def encode(out: Path, inputs: list[Path], fmt: str, workers: int, fork: bool = False,
           checkpoint: float = 30.0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", TWO_WORKERS, str(out), "unused", fmt, str(workers),
                             "fork" if fork else "start", str(checkpoint), *map(str, inputs)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _inputs(tmp_path: Path, kind: str) -> list[Path]:
    lines = records(900)
    rows = [json.loads(line) for line in lines]
    if kind == "jsonl":
        path = tmp_path / "c.jsonl"
        path.write_text("\n".join(lines) + "\n")
        return [path]
    if kind == "parquet":
        path = tmp_path / "c.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=60)
        return [path]
    files = []  # several files, one of each of the whole-file formats
    for k, chunk in enumerate((rows[:300], rows[300:600], rows[600:])):
        if k == 0:
            import gzip

            path = tmp_path / "a.jsonl.gz"
            path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in chunk).encode()))
        elif k == 1:
            path = tmp_path / "b.arrow"
            with pa.ipc.new_file(path, pa.Table.from_pylist(chunk).schema) as w:
                w.write_table(pa.Table.from_pylist(chunk))
        else:
            path = tmp_path / "c.jsonl"
            path.write_text("".join(json.dumps(r) + "\n" for r in chunk))
        files.append(path)
    return files


def _shards(out: Path) -> list[tuple[str, str]]:
    return [(s.file, s.sha256) for s in Manifest.load(out).shards]


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "fmt", "fork"), [("jsonl", "jsonl.gz", True), ("parquet", "parquet", False),
                                                   ("files", "jsonl", True)])
def test_two_workers_write_the_bytes_one_worker_writes(tmp_path, kind, fmt, fork):
    inputs = _inputs(tmp_path, kind)
    one, two = encode(tmp_path / "one", inputs, fmt, 1), encode(tmp_path / "two", inputs, fmt, 2, fork)
    for run in (one, two):
        _, err = run.communicate(timeout=900)
        assert run.returncode == 0, err
    assert _shards(tmp_path / "two") == _shards(tmp_path / "one") and len(_shards(tmp_path / "one")) == 6
    workers = Manifest.load(tmp_path / "two").stats.per_worker
    assert len(workers) == 2 and sum(w.docs for w in workers) == 900


def _recorded(out: Path) -> int:
    try:
        body = json.loads((out / "manifest.json").read_text())
    except (OSError, ValueError):
        return 0
    return sum(p["docs"] for p in body.get("shards", []) + body.get("chunks", []))


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_two_workers_killed_at_any_point_resume_to_one_workers_bytes(tmp_path, sig, seed):
    inputs = _inputs(tmp_path, "jsonl")
    reference = encode(tmp_path / "one", inputs, "jsonl.gz", 1)
    assert reference.wait(timeout=900) == 0, reference.communicate()
    out = tmp_path / "two"
    rng = random.Random(seed)
    for _ in range(2):  # killed twice, after a random share of the work, then finished
        run = encode(out, inputs, "jsonl.gz", 2, fork=True, checkpoint=0.0)
        target = _recorded(out) + rng.randint(1, 300)
        deadline = time.time() + 600
        while time.time() < deadline and run.poll() is None and _recorded(out) < target:
            time.sleep(0.02)
        if run.poll() is None:
            os.kill(run.pid, sig)
        run.wait(timeout=120)
    if not ((out / "manifest.json").is_file() and Manifest.load(out).complete):  # a signal may come after the end
        final = encode(out, inputs, "jsonl.gz", 2, fork=True)
        _, err = final.communicate(timeout=900)
        assert final.returncode == 0, err
    assert _shards(out) == _shards(tmp_path / "one"), f"seed {seed}"
    assert not Manifest.load(out).chunks and not [p for p in (out / "shards").iterdir() if p.name.startswith(".")]
