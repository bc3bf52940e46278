"""The files of a Seismic index directory, its record, and the checks that come before Seismic reads any of them.

    seismic.json            the record: counts, build options, Seismic's version, each file's size and CRC-32
    seismic.index.seismic   Seismic's own index (forward index + clustered, summarized inverted lists)
    terms.json              the vocabulary: component number c is terms[c]
    docids.bin, docids.off  document k's id is docids.bin[off[k]:off[k+1]] (UTF-8); k is its position in the shards
    empty.pos               positions of the documents with no term (Seismic skips them; they are never retrieved)

Every name is relative: the directory can be renamed or moved. Seismic's loader trusts its file (an all-zero file
loads as an index of 2⁶⁴−1 documents and panics at the first query), so every file is checked against the record's
size and CRC-32 first: a damaged index is refused in one line and never reaches Seismic.
"""

from __future__ import annotations

import json
import os
import stat
import zlib
from importlib import metadata
from pathlib import Path

import numpy as np

from lsr_index.errors import LsrIndexError, install_hint
from lsr_index.runtime.durable import os_cause

RECORD = "seismic.json"
KIND = "lsr-index/seismic"
VERSION = 1
INDEX_PREFIX = "seismic"  # Seismic's save() appends ".index.seismic"
INDEX_FILE = INDEX_PREFIX + ".index.seismic"
TERMS = "terms.json"
IDS = "docids.bin"
OFFSETS = "docids.off"
EMPTY = "empty.pos"
FILES = (INDEX_FILE, TERMS, IDS, OFFSETS, EMPTY)
DISTRIBUTION = "pyseismic-lsr"
# Seismic holds document values as IEEE half floats: every integer up to 2048 exactly, above it only every 2nd, 4th…
MAX_IMPACT = 2048
U16_TERMS = 65_536  # SeismicIndex numbers terms in 16 bits; a larger vocabulary needs SeismicIndexLV (32 bits)
_REBUILD = "rebuild it with `lsr-index build --engine seismic --overwrite`"


def seismic_version() -> str:
    """The installed Seismic, or one line saying how to install it."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise LsrIndexError(f"the Seismic engine needs Seismic (pyseismic-lsr): {install_hint('seismic')}") from None


def crc32_file(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            crc = zlib.crc32(chunk, crc)
    return crc


def describe(path: Path) -> dict:
    """What the record keeps of a file: its size and CRC-32."""
    return {"bytes": path.stat().st_size, "crc32": crc32_file(path)}


def read_record(directory: Path) -> dict:
    """The record of a Seismic index directory, its shape checked; one line naming the directory otherwise."""
    path = directory / RECORD
    try:
        body = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise LsrIndexError(f"{directory}: not a Seismic index (no {RECORD}); build one with `lsr-index build "
                            "--engine seismic`") from None
    except OSError as exc:
        raise LsrIndexError(f"{path}: cannot read it: {os_cause(exc)}") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise LsrIndexError(f"{path}: not valid JSON: the Seismic index is damaged; {_REBUILD}") from None
    if not isinstance(body, dict) or body.get("kind") != KIND:
        raise LsrIndexError(f"{path}: not a Seismic index record; {_REBUILD}")
    if body.get("version") != VERSION:
        raise LsrIndexError(f"{path}: a Seismic index of format version {body.get('version')!r}, this lsr-index reads "
                            f"version {VERSION}; {_REBUILD}")
    counts = ("documents", "held", "terms", "nonzeros")
    files = body.get("files")
    if (not all(isinstance(body.get(k), int) and not isinstance(body.get(k), bool) and body[k] >= 0 for k in counts)
            or body["held"] > body["documents"] or body.get("components") not in ("u16", "u32")
            or not isinstance(body.get("seismic"), str) or not isinstance(files, dict)
            or sorted(files) != sorted(FILES if body["held"] else FILES[1:])
            or not all(isinstance(f, dict) and isinstance(f.get("bytes"), int) and isinstance(f.get("crc32"), int)
                       for f in files.values())):
        raise LsrIndexError(f"{path}: malformed Seismic index record; {_REBUILD}")
    return body


def check_files(directory: Path, record: dict) -> None:
    """Every file the record lists is a regular file of its recorded size and CRC-32 (read in full: Seismic would
    read it all anyway, and a damaged one must never reach it)."""
    for name, expected in record["files"].items():
        path = directory / name
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            raise LsrIndexError(f"{directory}: the Seismic index is damaged: {name} is missing; {_REBUILD}") from None
        except OSError as exc:
            raise LsrIndexError(f"{path}: cannot read it: {os_cause(exc)}") from None
        if not stat.S_ISREG(info.st_mode):
            raise LsrIndexError(f"{directory}: the Seismic index is damaged: {name} is not a regular file; {_REBUILD}")
        if info.st_size != expected["bytes"]:
            raise LsrIndexError(f"{directory}: the Seismic index is damaged: {name} is {info.st_size:,} bytes, its "
                                f"record says {expected['bytes']:,}; {_REBUILD}")
        try:
            crc = crc32_file(path)
        except OSError as exc:
            raise LsrIndexError(f"{path}: cannot read it: {os_cause(exc)}") from None
        if crc != expected["crc32"]:
            raise LsrIndexError(f"{directory}: the Seismic index is damaged: {name} fails its checksum; {_REBUILD}")


def check_version(directory: Path, record: dict) -> None:
    """Seismic's file format is its serializer's: only the release that wrote an index is trusted to read it."""
    installed = seismic_version()
    if installed != record["seismic"]:
        raise LsrIndexError(f"{directory}: built with Seismic (pyseismic-lsr) {record['seismic']}, this one is "
                            f"{installed}; {_REBUILD}, or install pyseismic-lsr=={record['seismic']}")


def read_ids(directory: Path, record: dict) -> tuple[bytes, np.ndarray, np.ndarray]:
    """The documents' ids (UTF-8 blob and offsets) and the positions of the empty ones, checked for shape."""
    blob = (directory / IDS).read_bytes()
    offsets = np.fromfile(directory / OFFSETS, dtype="<i8")
    empty = np.fromfile(directory / EMPTY, dtype="<i8")
    documents = record["documents"]
    if (len(offsets) != documents + 1 or (documents and (offsets[0] != 0 or offsets[-1] != len(blob)))
            or np.any(np.diff(offsets) < 0) or len(empty) != documents - record["held"]
            or np.any(np.diff(empty) <= 0) or (len(empty) and (empty[0] < 0 or empty[-1] >= documents))):
        raise LsrIndexError(f"{directory}: the Seismic index is damaged: its document ids do not match its record; "
                            f"{_REBUILD}")
    return blob, offsets, empty


def read_terms(directory: Path, record: dict) -> list[str]:
    try:
        terms = json.loads((directory / TERMS).read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError):
        terms = None
    if not isinstance(terms, list) or len(terms) != record["terms"] or not all(isinstance(t, str) for t in terms):
        raise LsrIndexError(f"{directory}: the Seismic index is damaged: {TERMS} does not match its record; "
                            f"{_REBUILD}")
    return terms
