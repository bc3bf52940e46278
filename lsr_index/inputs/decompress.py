"""Strict streaming decompression of .gz, .bz2, .xz and .zst files.

The readers at hand each lose data without a trace somewhere: ``bz2`` and ``lzma`` stop at bytes after a
complete stream that do not start another one, and ``zstandard``'s reader ends quietly at a frame cut short.
This one requires every stream to be complete and whatever follows a stream to be another stream, so a
truncated or corrupt file always raises one of ``CORRUPT``. Memory is bounded: gzip, bz2 and xz output is
limited per call, and zstd is fed 256 bytes at a time (at most ~8 MiB out: its highest ratio is ~32,000).
"""

from __future__ import annotations

import bz2
import io
import lzma
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, Protocol

try:
    import zstandard
except ImportError:  # optional: .zst files are refused by name when it is missing
    zstandard = None

_CHUNK = 1 << 16
_ZSTD_PIECE = 256


class _Stream(Protocol):
    """One compressed stream, as bz2.BZ2Decompressor and lzma.LZMADecompressor decode one."""

    eof: bool
    needs_input: bool
    unused_data: bytes

    def decompress(self, data: bytes, max_length: int) -> bytes: ...


class _Gzip:
    """zlib's gzip decoder behind the bz2/lzma interface (it keeps unread input in unconsumed_tail)."""

    def __init__(self) -> None:
        self._d = zlib.decompressobj(wbits=zlib.MAX_WBITS | 16)

    @property
    def eof(self) -> bool:
        return self._d.eof

    @property
    def needs_input(self) -> bool:
        return not self._d.unconsumed_tail

    @property
    def unused_data(self) -> bytes:
        return self._d.unused_data

    def decompress(self, data: bytes, max_length: int) -> bytes:
        return self._d.decompress(self._d.unconsumed_tail + data, max_length)


class _Zstd:
    """zstandard's decoder behind the bz2/lzma interface; it takes no output limit, so input goes in small pieces."""

    def __init__(self) -> None:
        self._d = zstandard.ZstdDecompressor().decompressobj()
        self._pending = memoryview(b"")

    @property
    def eof(self) -> bool:
        return self._d.eof

    @property
    def needs_input(self) -> bool:
        return not self._pending

    @property
    def unused_data(self) -> bytes:
        return self._d.unused_data + bytes(self._pending)

    def decompress(self, data: bytes, max_length: int) -> bytes:
        if data:  # only ever given when needs_input, so nothing is pending
            self._pending = memoryview(data)
        piece, self._pending = self._pending[:_ZSTD_PIECE], self._pending[_ZSTD_PIECE:]
        return self._d.decompress(piece) if piece else b""


CODECS: dict[str, Callable[[], _Stream]] = {
    ".gz": _Gzip,
    ".bz2": bz2.BZ2Decompressor,
    ".xz": lzma.LZMADecompressor,
    ".zst": _Zstd,
}
# What reading a damaged file raises (bz2 reports bad data as OSError).
CORRUPT: tuple[type[Exception], ...] = (EOFError, OSError, zlib.error, lzma.LZMAError) + (
    (zstandard.ZstdError,) if zstandard else ()
)


def missing_module(suffix: str) -> str | None:
    """The pip package a codec needs but lacks, if any."""
    return "zstandard" if suffix == ".zst" and zstandard is None else None


def open_decompressed(source: Path | BinaryIO, suffix: str) -> io.BufferedReader:
    """A buffered binary reader of the decompressed content of ``source``, a path or an open binary file (its
    position then tells how much compressed data was read); ``suffix`` is a key of CODECS."""
    raw = source if hasattr(source, "read") else open(source, "rb")  # noqa: SIM115 (the reader closes it)
    return io.BufferedReader(_Reader(raw, CODECS[suffix]), _CHUNK)


class _Reader(io.RawIOBase):
    def __init__(self, raw: BinaryIO, new: Callable[[], _Stream]):
        self._raw, self._new = raw, new
        self._stream = new()
        self._exhausted = False
        self._overflow = b""  # output beyond the caller's buffer (only zstd returns more than asked)

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self._raw.close()
        super().close()

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        out, self._overflow = self._overflow, b""
        while not out:
            if self._stream.eof:
                data = self._stream.unused_data or self._read()
                if not data:
                    return 0
                self._stream = self._new()
            else:
                data = self._read() if self._stream.needs_input else b""
            out = self._stream.decompress(data, len(buffer))
            if not out and self._exhausted and not self._stream.eof:
                raise EOFError("compressed data ends before the end of its stream")
        n = min(len(out), len(buffer))
        buffer[:n], self._overflow = out[:n], out[n:]
        return n

    def _read(self) -> bytes:
        data = self._raw.read(_CHUNK)
        self._exhausted = not data
        return data
