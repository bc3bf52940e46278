"""Compressed JSONL (.gz, .bz2, .xz, .zst): read whole, or refused by name; never read in part without a word."""

from __future__ import annotations

import bz2
import gzip
import lzma
import tracemalloc

import orjson
import pytest

from lsr_index.errors import InputError
from lsr_index.inputs.corpus import CorpusReader

CODECS = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress}


def zstd_compress(data: bytes) -> bytes:
    return pytest.importorskip("zstandard").ZstdCompressor().compress(data)


def compressor(suffix: str):
    return zstd_compress if suffix == ".zst" else CODECS[suffix]


SUFFIXES = [*CODECS, ".zst"]


def lines(start: int, stop: int) -> bytes:
    return b"".join(orjson.dumps({"id": f"d{i}", "text": f"text {i} " * 10}) + b"\n" for i in range(start, stop))


def ids_read(reader: CorpusReader) -> list[str]:
    return [i for batch in reader for i in batch.column("id").to_pylist()]


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_concatenated_streams_are_all_read(tmp_path, suffix):
    compress = compressor(suffix)
    path = tmp_path / f"c.jsonl{suffix}"
    path.write_bytes(compress(lines(0, 50)) + compress(lines(50, 120)))
    assert ids_read(CorpusReader(path)) == [f"d{i}" for i in range(120)]


@pytest.mark.parametrize("suffix", SUFFIXES)
@pytest.mark.parametrize("on_error", ["fail", "skip"])
def test_truncated_data_is_refused_naming_the_last_line_read(tmp_path, suffix, on_error):
    path = tmp_path / f"c.jsonl{suffix}"
    path.write_bytes(compressor(suffix)(lines(0, 500))[:-40])
    with pytest.raises(InputError, match=r"compressed data is truncated or corrupt after line \d+") as caught:
        ids_read(CorpusReader(path, on_error=on_error))
    assert caught.value.path == str(path) and "re-download" in caught.value.hint


@pytest.mark.parametrize("suffix", SUFFIXES)
@pytest.mark.parametrize("tail", [b"garbage after the stream", b"\x00" * 16])
def test_bytes_after_the_last_stream_are_refused(tmp_path, suffix, tail):
    """Bytes after the last stream are damage, not padding: a reader that stopped at them silently would lose the
    documents of a damaged second stream."""
    path = tmp_path / f"c.jsonl{suffix}"
    path.write_bytes(compressor(suffix)(lines(0, 20)) + tail)
    with pytest.raises(InputError, match="compressed data is truncated or corrupt after line 20"):
        ids_read(CorpusReader(path))


@pytest.mark.parametrize("suffix", SUFFIXES)
@pytest.mark.parametrize("content", [b"", b'{"id": "1", "text": "t"}\n'], ids=["empty", "plain"])
def test_an_empty_file_or_plain_data_under_a_compressed_name_is_refused(tmp_path, suffix, content):
    if suffix == ".zst":
        pytest.importorskip("zstandard")
    path = tmp_path / f"c.jsonl{suffix}"
    path.write_bytes(content)
    with pytest.raises(InputError, match="compressed data is truncated or corrupt after line 0"):
        ids_read(CorpusReader(path))


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_a_compression_bomb_is_read_in_bounded_memory(tmp_path, suffix):
    """32 MiB of blank lines, packed up to 10⁵-fold, are decompressed a buffer at a time, not whole."""
    size = 32 << 20
    path = tmp_path / f"c.jsonl{suffix}"
    path.write_bytes(compressor(suffix)(lines(0, 1) + (b" " * ((1 << 16) - 1) + b"\n") * 512 + lines(1, 2)))
    assert ids_read(CorpusReader(path)) == ["d0", "d1"]  # once untraced, for the lazy imports
    tracemalloc.start()
    try:
        assert ids_read(CorpusReader(path)) == ["d0", "d1"]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < size // 2  # the xz decoder alone keeps an 8 MiB dictionary
