"""Arrow IPC files and streams are read whole or refused: a stream cut at a batch boundary has no
end-of-stream marker, and bytes after a stream's end (two files or streams joined) are not ignored."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from lsr_index.errors import InputError
from lsr_index.inputs.corpus import CorpusReader

TABLE = pa.table({"id": [f"d{i}" for i in range(10)], "text": [f"text {i}" for i in range(10)]})


def ipc_bytes(table: pa.Table, stream: bool) -> bytes:
    sink = pa.BufferOutputStream()
    with (pa.ipc.new_stream if stream else pa.ipc.new_file)(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=4)
    return sink.getvalue().to_pybytes()


def batch_ends(data: bytes) -> list[int]:
    """Byte offsets where each record batch of a stream ends."""
    source = pa.BufferReader(data)
    reader = pa.ipc.open_stream(source)
    ends = []
    for _ in reader:
        ends.append(source.tell())
    return ends


def ids_read(path: Path, **options) -> list[str]:
    return [i for batch in CorpusReader(path, **options) for i in batch.column("id").to_pylist()]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "file"])
def test_whole_files_and_streams_read_back(tmp_path, stream):
    path = tmp_path / "c.arrow"
    path.write_bytes(ipc_bytes(TABLE, stream))
    assert ids_read(path) == TABLE.column("id").to_pylist()


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "file"])
def test_zero_batches_are_an_empty_shard(tmp_path, stream):
    (tmp_path / "a.arrow").write_bytes(ipc_bytes(TABLE.slice(0, 0), stream))
    (tmp_path / "b.arrow").write_bytes(ipc_bytes(TABLE, stream))
    assert len(ids_read(tmp_path)) == 10


@pytest.mark.parametrize("on_error", ["fail", "skip"])
@pytest.mark.parametrize("batches", [1, 2, 3])
def test_a_stream_cut_at_a_batch_boundary_is_refused(tmp_path, batches, on_error):
    data = ipc_bytes(TABLE, stream=True)
    path = tmp_path / "c.ipc"
    path.write_bytes(data[: batch_ends(data)[batches - 1]])
    with pytest.raises(InputError, match=rf"no end-of-stream marker after row {min(4 * batches, 10)} \(truncated"):
        ids_read(path, on_error=on_error)


def test_a_stream_of_only_its_schema_is_refused(tmp_path):
    data = ipc_bytes(TABLE.slice(0, 0), stream=True)
    path = tmp_path / "c.ipc"
    path.write_bytes(data[:-8])  # the end-of-stream marker removed
    with pytest.raises(InputError, match="no end-of-stream marker after row 0"):
        ids_read(path)


@pytest.mark.parametrize("first_stream", [True, False], ids=["stream", "file"])
@pytest.mark.parametrize("second_stream", [True, False], ids=["stream", "file"])
def test_two_joined_files_or_streams_are_refused(tmp_path, first_stream, second_stream):
    path = tmp_path / "c.arrow"
    path.write_bytes(ipc_bytes(TABLE, first_stream) + ipc_bytes(TABLE.slice(0, 3), second_stream))
    with pytest.raises(InputError, match="cannot read this Arrow IPC file") as caught:
        ids_read(path)
    assert caught.value.path == str(path)


def test_the_same_file_twice_is_refused(tmp_path):
    """Its footer's offsets point into the first copy, so a footer-led reader reads one copy and stops."""
    path = tmp_path / "c.arrow"
    path.write_bytes(ipc_bytes(TABLE, stream=False) * 2)
    with pytest.raises(InputError, match="bytes after the end of its stream at byte"):
        ids_read(path)


def test_a_file_cut_after_its_last_batch_is_refused(tmp_path):
    data = ipc_bytes(TABLE, stream=False)
    path = tmp_path / "c.arrow"
    path.write_bytes(data[: 8 + batch_ends(data[8:])[-1]])
    with pytest.raises(InputError, match="cannot read this Arrow IPC file: file format without a footer"):
        ids_read(path)


def test_a_file_with_a_corrupt_footer_length_is_refused(tmp_path):
    data = bytearray(ipc_bytes(TABLE, stream=False))
    data[-10:-6] = (len(data) * 2).to_bytes(4, "little")
    path = tmp_path / "c.arrow"
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match="its footer length is corrupt"):
        ids_read(path)


@pytest.mark.parametrize("kind", ["parquet", "arrow"])
def test_a_column_named_twice_is_refused_by_name(tmp_path, kind):
    """Arrow cannot select a duplicated column by name (a KeyError traceback): the file is refused in one line that
    names the column."""
    import pyarrow.parquet as pq

    table = pa.Table.from_arrays([TABLE["id"], TABLE["text"], TABLE["text"]], names=["id", "text", "text"])
    path = tmp_path / f"dup.{kind}"
    if kind == "parquet":
        pq.write_table(table, path)
    else:
        path.write_bytes(ipc_bytes(table, stream=False))
    with pytest.raises(InputError, match=r"dup\.\w+: column 'text' appears 2 times \(rename the duplicates\)"):
        list(CorpusReader(str(path)))
