"""The document count that encode's progress bar shows as its total: exact from Parquet/Arrow metadata and from a
JSONL file read whole, estimated within a few percent from a sample of larger or many JSONL files."""

from __future__ import annotations

import bz2
import gzip
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lsr_index.inputs.corpus import CorpusReader


def write_jsonl(path: Path, docs: int, rng: np.random.Generator, first: int = 0) -> None:
    """Documents of varied length (30 to 900 characters), so that the lines per byte vary along the file."""
    words = ["alpha", "beta", "gamma", "delta", "résumé", "protein"]
    lines = (json.dumps({"id": f"d{first + i}", "text": " ".join(rng.choice(words, rng.integers(5, 150)))}) + "\n"
             for i in range(docs))
    data = "".join(lines).encode()
    opener = {".gz": gzip.compress, ".bz2": bz2.compress}.get(path.suffix, lambda b: b)
    path.write_bytes(opener(data))


@pytest.mark.parametrize("suffix", ["", ".gz", ".bz2"])
def test_a_small_jsonl_file_is_counted_exactly(tmp_path, suffix):
    path = tmp_path / f"c.jsonl{suffix}"
    write_jsonl(path, 1234, np.random.default_rng(1))
    assert CorpusReader(path).estimate_docs() == (1234, True)


def test_blank_lines_of_a_file_read_whole_are_not_documents(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('\n{"id": "a", "text": "x"}\n  \n\n{"id": "b", "text": "y"}')  # no final newline either
    assert CorpusReader(path).estimate_docs() == (2, True)


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_a_large_jsonl_file_is_estimated_from_its_first_bytes(tmp_path, suffix):
    path = tmp_path / f"c.jsonl{suffix}"
    write_jsonl(path, 40_000, np.random.default_rng(2))  # ~20 MB of content: five times the sample
    count, exact = CorpusReader(path).estimate_docs()
    assert not exact and abs(count - 40_000) < 0.05 * 40_000


def test_many_files_beyond_the_sampled_ones_use_the_measured_density(tmp_path):
    rng = np.random.default_rng(3)
    for k in range(12):
        write_jsonl(tmp_path / f"part-{k:02}.jsonl.gz", 500, rng, first=500 * k)
    count, exact = CorpusReader(tmp_path).estimate_docs()
    assert not exact and abs(count - 6000) < 0.05 * 6000


def test_parquet_and_arrow_rows_are_exact(tmp_path):
    table = pa.table({"id": [f"d{i}" for i in range(777)], "text": ["some text"] * 777})
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=100)
    with pa.OSFile(str(tmp_path / "b.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=50):
            writer.write_batch(batch)
    with pa.OSFile(str(tmp_path / "c.ipc"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    reader = CorpusReader([tmp_path / "a.parquet", tmp_path / "b.arrow", tmp_path / "c.ipc"])
    assert reader.estimate_docs() == (3 * 777, True)


def test_an_unreadable_file_counts_nothing_and_is_left_to_the_reader(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"id": "a", "text": "x"}\n')
    (tmp_path / "b.jsonl.gz").write_bytes(b"\x1f\x8b\x08\x00not gzip at all")
    (tmp_path / "c.parquet").write_bytes(b"PAR1 damaged")
    assert CorpusReader(tmp_path).estimate_docs() == (1, False)
