"""A Lucene index checked before it is published or searched: its document count, and every file against the
checksum Lucene keeps in its footer.
"""

from __future__ import annotations

from pathlib import Path

from lsr_index.engines.lucene.jvm import java_failure, jvm

FULL_CHECK_BYTES = 1 << 30  # see verify_checksums


def count_docs(index: Path) -> int:
    autoclass = jvm()
    from jnius import JavaException

    try:
        reader = autoclass("org.apache.lucene.index.DirectoryReader").open(
            autoclass("org.apache.lucene.store.FSDirectory").open(autoclass("java.io.File")(str(index)).toPath()))
        try:
            return reader.numDocs()
        finally:
            reader.close()
    except JavaException as exc:
        raise java_failure(exc, index, "cannot open the Lucene index") from None


def count_postings(index: Path, field: str = "contents") -> int:
    """The (term, document) pairs of `field`: each document's distinct terms, summed (Lucene's sumDocFreq)."""
    autoclass = jvm()
    from jnius import JavaException

    try:
        reader = autoclass("org.apache.lucene.index.DirectoryReader").open(
            autoclass("org.apache.lucene.store.FSDirectory").open(autoclass("java.io.File")(str(index)).toPath()))
        try:
            total = 0
            for leaf in reader.leaves().toArray():
                terms = leaf.reader().terms(field)
                total += terms.getSumDocFreq() if terms is not None else 0
            return total
        finally:
            reader.close()
    except JavaException as exc:
        raise java_failure(exc, index, "cannot open the Lucene index") from None


def check_index(index: Path, deep: bool) -> None:
    """Raise LsrIndexError naming what is damaged in the Lucene index at `index`.

    deep: every byte of every file against Lucene's checksums, whatever the size: for `build`, before it publishes.
    Otherwise the check that `search` runs on the generation it opens (see `verify_checksums`). Lucene's CheckIndex,
    which also decodes every posting, takes seconds even on a small index where the checksums take milliseconds, and
    grows with the postings: the checksums are kept, since a sound index damaged on disk is what they catch and Lucene
    itself wrote its structure.
    """
    autoclass = jvm()
    from jnius import JavaException

    directory = None
    try:
        directory = autoclass("org.apache.lucene.store.FSDirectory").open(
            autoclass("java.io.File")(str(index)).toPath())
        reader = autoclass("org.apache.lucene.index.DirectoryReader").open(directory)
        try:
            size = sum(p.stat().st_size for p in index.iterdir() if p.is_file())
            verify_checksums(reader, deep or size <= FULL_CHECK_BYTES)
        finally:
            reader.close()
    except JavaException as exc:
        raise java_failure(exc, index, "cannot check the Lucene index") from None
    finally:
        if directory is not None:
            directory.close()


def verify_checksums(reader, every_byte: bool) -> None:
    """Lucene keeps a CRC32 in every file's footer: up to FULL_CHECK_BYTES (1 GiB) every byte of every file is
    checked against it (milliseconds for a SciFact-size index, a cost that grows with the bytes, hence the bound);
    beyond, every file's footer,
    which catches a truncated or missing file and a file from elsewhere at a cost independent of the index's
    size, but not a flipped byte inside a file."""
    if every_byte:
        for leaf in reader.leaves().toArray():
            leaf.reader().checkIntegrity()
        return
    autoclass = jvm()
    codec = autoclass("org.apache.lucene.codecs.CodecUtil")
    once = autoclass("org.apache.lucene.store.IOContext").READONCE
    directory = reader.directory()
    for name in reader.getIndexCommit().getFileNames().toArray():
        stream = directory.openInput(name, once)
        try:
            codec.retrieveChecksum(stream)
        finally:
            stream.close()
