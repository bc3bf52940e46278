"""Vectors shards → a Seismic index, built in a child process and published as every engine's index is.

The child reads the manifest's shards in order into Seismic's in-memory dataset, builds the index, saves it, loads
it back to check it, and writes the record last. A child because Seismic's build is one long call into Rust that
holds the GIL (Ctrl-C would wait for it), prints to stdout, and can be killed by the kernel when memory runs out:
the parent stays responsive, its output clean, its error one line; and the child's peak memory is the build's.

Document k of the shards (in manifest order) is handed to Seismic under the id "k": Seismic skips documents with
no term, so its own numbering is k minus the empty documents before k, and the id it returns is the position that
maps back to the shard's id exactly. Impacts are handed over as float32 and kept by Seismic as half floats, both
exact for the integers 1..2048 (larger ones are refused, never rounded).
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import BinaryIO

import numpy as np

from lsr_index.engines.index import IndexRecord
from lsr_index.engines.seismic.layout import (
    EMPTY,
    FILES,
    IDS,
    INDEX_FILE,
    INDEX_PREFIX,
    KIND,
    OFFSETS,
    RECORD,
    TERMS,
    U16_TERMS,
    VERSION,
    check_files,
    describe,
    read_ids,
    read_record,
    read_terms,
    seismic_version,
)
from lsr_index.engines.seismic.options import SeismicBuild
from lsr_index.engines.seismic.reader import Terms, read_blocks
from lsr_index.errors import LsrIndexError
from lsr_index.runtime.children import PythonChild, end_with_stdin, send_message
from lsr_index.runtime.durable import atomic_write_bytes, fsync_directory, os_cause
from lsr_index.runtime.progress import bar
from lsr_index.vectors.manifest import Manifest

_PHASES = {"build": "build the Seismic index", "save": "save the Seismic index",
           "check": "check the Seismic index"}


def build_index(vectors: Path, index: Path, *, options: SeismicBuild | None = None, overwrite: bool = False,
                progress: bool = True) -> IndexRecord:
    """The Seismic index of `vectors`' shards at `index`, published only when complete and verified, as a Lucene
    index is (engines.publish: a work directory beside it, locks, `--overwrite` rules, stopped builds cleaned up);
    its record, whose `settings` hold the build options and what was built. Ids given twice are refused first."""
    from lsr_index.engines.publish import build_published, check_ids

    seismic_version()  # an install hint before any shard is read
    options = _options(options)

    def make(manifest: Manifest, work: Path) -> tuple[Path, IndexRecord]:
        check_ids(vectors, manifest, progress)
        built = work / "index"
        built.mkdir()
        info = build_files(vectors, manifest, built, options=options, progress=progress)
        settings = {key: info[key] for key in ("seismic", "options", "held", "empty", "terms", "nonzeros",
                                                "max_impact", "components", "index_bytes", "peak_memory_bytes")}
        return built, IndexRecord(documents=info["documents"], build_seconds=info["seconds"], builder="seismic",
                                  threads=options.threads, writers=1, heap=None, vectors=str(vectors.resolve()),
                                  vectors_manifest=manifest, engine="seismic", settings=settings)

    return build_published(vectors, index, make, overwrite=overwrite, progress=progress)


def _options(options: SeismicBuild | None) -> SeismicBuild:
    options = SeismicBuild() if options is None else options
    if not isinstance(options, SeismicBuild):
        raise LsrIndexError(f"seismic build options must be SeismicBuild, got {type(options).__name__}")
    return options


def build_files(vectors: Path, manifest: Manifest, work: Path, *, options: SeismicBuild | None = None,
                progress: bool = True) -> dict:
    """Build the Seismic index of the shards `manifest` lists (in its order) inside the empty directory `work`;
    what was built (documents, options, sizes, times, peak memory of the build). The caller has verified the
    shards' checksums and publishes `work` once `verify(work)` agrees with the manifest."""
    version = seismic_version()
    options = _options(options)
    try:
        if any(work.iterdir()):
            raise LsrIndexError(f"{work}: the Seismic index is built only in an empty directory")
    except OSError as exc:
        raise LsrIndexError(f"{work}: cannot use it to build the Seismic index: {os_cause(exc)}") from None
    spec = {"work": str(work.resolve()), "shards": [str((vectors / s.file).resolve()) for s in manifest.shards],
            "documents": manifest.docs, "options": options.to_dict(), "seismic": version, "most_terms": U16_TERMS}
    t0 = time.perf_counter()
    child = PythonChild("lsr_index.engines.seismic.build:build_main", "the Seismic index builder")
    info = None
    try:
        with contextlib.suppress(OSError):  # it died already: its message or exit code says why
            pickle.dump(spec, child.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            child.stdin.flush()
        with bar(progress, total=manifest.docs, desc="read shards", unit=" doc") as shown:
            while info is None:
                try:
                    kind, body = pickle.load(child.messages)
                except (EOFError, OSError, pickle.UnpicklingError):
                    raise LsrIndexError(_died(child)) from None
                if kind == "read":
                    shown.update(body)
                elif kind == "restart":  # read again, into Seismic's 32-bit dataset
                    shown.reset(total=manifest.docs)
                elif kind == "phase":
                    shown.set_description(_PHASES[body])
                elif kind == "done":
                    info = body
                else:
                    raise LsrIndexError(f"{body}; nothing was published")
    finally:
        child.close(finished=info is not None)
    documents = verify(work)
    if documents != manifest.docs:
        raise LsrIndexError(f"the Seismic index holds {documents} documents but the manifest lists {manifest.docs}; "
                            "not publishing it")
    info["seconds"] = round(time.perf_counter() - t0, 2)
    return info


def _died(child: PythonChild) -> str:
    code = child.exit_code(10)
    if code is not None and code < 0:
        import signal

        how = f"was killed by signal {signal.Signals(-code).name}"
        if -code == signal.SIGKILL:
            how += " (out of memory? Seismic holds every vector in memory while it builds)"
    else:
        how = f"ended unexpectedly (exit status {code})"
    return f"the Seismic index builder {how}; nothing was published"


def verify(directory: Path) -> int:
    """The number of documents of the Seismic index in `directory`, once its record, every file's size and
    checksum, its ids and its vocabulary agree (the builder loaded the index back from its file before it wrote
    the record); one line naming the directory otherwise."""
    record = read_record(directory)
    check_files(directory, record)
    read_ids(directory, record)
    read_terms(directory, record)
    return record["documents"]


# --- the builder process ------------------------------------------------------------------------------

class _Wide(Exception):
    """More terms than 16-bit component numbers hold: read again into Seismic's 32-bit dataset."""


def build_main(out: BinaryIO) -> None:
    """The builder process (see build_index): ("read", documents) as it reads, ("phase", name), then ("done", info)
    or ("error", one line)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent's to handle: it ends this process
    spec = pickle.load(sys.stdin.buffer)
    threading.Thread(target=end_with_stdin, name="end-with-parent", daemon=True).start()
    options = SeismicBuild.from_dict(spec["options"])
    if options.threads:  # read by Rayon when its pool starts, at Seismic's first parallel step
        os.environ["RAYON_NUM_THREADS"] = str(options.threads)
    # Seismic prints its progress on stdout and stderr: kept out of the parent's terminal and output
    chatter = tempfile.TemporaryFile()  # noqa: SIM115 (open until this process ends)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(chatter.fileno(), 1)
    os.dup2(chatter.fileno(), 2)
    try:
        info = _build(spec, options, lambda *message: send_message(out, *message))
    except LsrIndexError as exc:
        send_message(out, "error", str(exc))
    except BaseException as exc:  # Seismic's panics are BaseExceptions: one line for the parent, whatever it was
        send_message(out, "error", f"building the Seismic index failed: {type(exc).__name__}: "
                                   f"{' '.join(str(exc).split())}"[:400])
    else:
        send_message(out, "done", info)
    out.flush()
    os._exit(0)


def _build(spec: dict, options: SeismicBuild, send) -> dict:
    import seismic

    work = Path(spec["work"])
    shards = [Path(p) for p in spec["shards"]]
    terms = Terms()
    t0 = time.perf_counter()
    for wide in (False, True):
        dataset = (seismic.SeismicDatasetLV if wide else seismic.SeismicDataset)()
        try:
            counts = _read(shards, terms, dataset, work, send, None if wide else spec["most_terms"])
            break
        except _Wide:
            del dataset
            send("restart", None)
    documents, held, nonzeros, max_impact = counts
    if documents != spec["documents"]:
        raise LsrIndexError(f"the shards hold {documents} documents but the manifest lists {spec['documents']}")
    read_seconds = time.perf_counter() - t0
    files = {}
    t1 = time.perf_counter()
    if held:
        index_class = seismic.SeismicIndexLV if wide else seismic.SeismicIndex
        send("phase", "build")
        index = index_class.build_from_dataset(
            dataset, n_postings=options.n_postings, centroid_fraction=options.centroid_fraction,
            min_cluster_size=options.min_cluster_size, summary_energy=options.summary_energy,
            max_fraction=options.max_fraction, doc_cut=options.doc_cut)
        del dataset
        build_seconds = time.perf_counter() - t1
        send("phase", "save")
        index.save(str(work / INDEX_PREFIX))
        del index
        _fsync(work / INDEX_FILE)
        send("phase", "check")
        loaded = index_class.load(str(work / INDEX_FILE))  # what a search will load
        if (loaded.len, loaded.dim, loaded.nnz) != (held, len(terms), nonzeros):
            raise LsrIndexError(f"the Seismic index read back holds {loaded.len} documents, {loaded.dim} terms and "
                                f"{loaded.nnz} postings, not the {held}, {len(terms)} and {nonzeros} given to it")
        del loaded
    else:
        del dataset
        build_seconds = 0.0
    atomic_write_bytes(work / TERMS, json.dumps(terms.names).encode())
    for name in FILES if held else FILES[1:]:
        files[name] = describe(work / name)
    record = {"kind": KIND, "version": VERSION, "seismic": spec["seismic"], "components": "u32" if wide else "u16",
              "documents": documents, "held": held, "terms": len(terms), "nonzeros": nonzeros,
              "max_impact": max_impact, "build": options.to_dict(), "files": files}
    atomic_write_bytes(work / RECORD, json.dumps(record, indent=1).encode() + b"\n")
    fsync_directory(work)
    return {"engine": "seismic", "documents": documents, "held": held, "empty": documents - held,
            "terms": len(terms), "nonzeros": nonzeros, "max_impact": max_impact, "components": record["components"],
            "options": options.to_dict(), "seismic": spec["seismic"],
            "index_bytes": sum(f["bytes"] for f in files.values()) + (work / RECORD).stat().st_size,
            "read_seconds": round(read_seconds, 2), "build_seconds": round(build_seconds, 2),
            "peak_memory_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def _read(shards: list[Path], terms: Terms, dataset, work: Path, send, most_terms: int | None
          ) -> tuple[int, int, int, int]:
    """Every shard's documents into `dataset`; their ids, offsets and empty positions into the work directory.
    (documents, held, nonzeros, max impact)."""
    documents = held = nonzeros = max_impact = 0
    with open(work / IDS, "wb") as ids, open(work / OFFSETS, "wb") as offsets, open(work / EMPTY, "wb") as empty:
        offsets.write(np.zeros(1, "<i8").tobytes())
        at = 0
        for path in shards:
            for block in read_blocks(path, terms):
                if most_terms is not None and len(terms) > most_terms:
                    raise _Wide
                n = len(block.ids)
                lengths = np.diff(block.indptr)
                empties = np.flatnonzero(lengths == 0)
                added = dataset.add_documents_by_id([str(documents + i) for i in range(n)], block.components,
                                                    block.impacts, block.indptr)
                if added != n - len(empties):  # the numbering that maps Seismic's documents back would be off
                    raise LsrIndexError(f"{path}: Seismic took {added} of {n - len(empties)} non-empty documents")
                encoded = [doc_id.encode("utf-8", "surrogatepass") for doc_id in block.ids]
                ids.write(b"".join(encoded))
                ends = at + np.cumsum(np.fromiter(map(len, encoded), np.int64, n))
                offsets.write(ends.astype("<i8").tobytes())
                at = int(ends[-1]) if n else at
                empty.write((empties + documents).astype("<i8").tobytes())
                documents += n
                held += added
                nonzeros += len(block.components)
                if len(block.impacts):
                    max_impact = max(max_impact, int(block.impacts.max()))
                send("read", n)
        for f in (ids, offsets, empty):
            f.flush()
            os.fsync(f.fileno())
    return documents, held, nonzeros, max_impact


def _fsync(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())
