"""Every document id once across a vectors directory's shards, checked in a streaming pass before anything is built:
an id given twice indexes two documents that a run cannot tell apart (`search` would list it twice for a query).

Memory is 8 bytes a document (a 64-bit hash of each id, sorted in place: 800 MB for 100M documents); only ids whose
hash is seen twice are read again and compared exactly, with where each one is.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from lsr_index.vectors.manifest import Manifest
from lsr_index.vectors.shards import parse_record, record_place

_HEAD = b'{"id":"'


def shard_ids(path: Path) -> Iterator[str]:
    """The ids of a shard's records, in order, without reading their vectors where the format allows."""
    if path.name.endswith(".parquet"):
        for batch in pq.ParquetFile(path).iter_batches(batch_size=65536, columns=["id"]):
            yield from batch.column(0).to_pylist()
        return
    with gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            end = line.find(b'"', 7)
            if end > 0 and line.startswith(_HEAD) and b"\\" not in (raw := line[7:end]):  # no escape: the id as is
                yield raw.decode()
            else:
                yield parse_record(line, f"{path}:{number}")[0]


def repeated_id(vectors: Path, manifest: Manifest, checked: Callable[[int], object] = lambda n: None) -> str | None:
    """One line naming an id that two records share and where both are (file and line, or Parquet row), or None.
    `checked(n)` after each shard's n documents (a pass over every shard takes a while)."""
    shards = sorted(manifest.shards, key=lambda s: s.start)
    hashes = np.empty(manifest.docs, np.int64)
    filled = 0
    for shard in shards:
        found = np.fromiter(map(hash, shard_ids(vectors / shard.file)), np.int64)
        found = found[:max(0, len(hashes) - filled)]  # a shard longer than listed: its writer refuses it
        hashes[filled:filled + len(found)] = found
        filled += len(found)
        checked(shard.docs)
    hashes = hashes[:filled]
    hashes.sort()
    colliding = set(hashes[1:][hashes[1:] == hashes[:-1]].tolist())
    if not colliding:
        return None
    places: dict[str, str] = {}
    for shard in shards:
        path = vectors / shard.file
        for number, doc_id in enumerate(shard_ids(path), 1):
            if hash(doc_id) in colliding:
                here = record_place(str(path), number)
                if doc_id in places:
                    return (f"document id {doc_id!r} is given twice, at {places[doc_id]} and at {here}: a run could "
                            "not tell the two documents apart; give each document its own id and encode again")
                places[doc_id] = here
    return None  # hashes alike, ids not
