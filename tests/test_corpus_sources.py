"""Which files a corpus source names: every file in a directory or matched by a pattern is read or refused
by name, with the one documented exception of names starting with "." or "_"."""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from lsr_index.errors import InputError
from lsr_index.inputs.corpus import CorpusReader

COMPRESS = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress}


def write(path: Path, ids: list[str]) -> Path:
    data = b"".join(orjson.dumps({"id": i, "text": f"text of {i}"}) + b"\n" for i in ids)
    suffix = path.suffix.lower()
    path.write_bytes(COMPRESS[suffix](data) if suffix in COMPRESS else data)
    return path


def ids_read(reader: CorpusReader) -> list[str]:
    return [i for batch in reader for i in batch.column("id").to_pylist()]


def test_a_directory_of_every_corpus_suffix_is_read_whole(tmp_path):
    """35 documents in 7 files of every JSONL suffix and compression, in either case: every file is read, and none is
    passed over while the run exits 0."""
    names = ["a.jsonl", "b.jsonl.xz", "c.jsonl.bz2", "d.ndjson", "e.JSONL", "f.jsonl.gz", "g.NDJSON.GZ"]
    expected = []
    for name in names:
        ids = [f"{name}-{i}" for i in range(5)]
        write(tmp_path / name, ids)
        expected += ids
    reader = CorpusReader(tmp_path)
    assert [p.name for p in reader.files] == names and reader.passed_over == []
    assert ids_read(reader) == expected
    assert ids_read(CorpusReader(str(tmp_path / "*"))) == expected


@pytest.mark.parametrize("source", ["dir", "glob", "file"])
def test_a_broken_symbolic_link_is_refused_by_name(tmp_path, source):
    write(tmp_path / "a.jsonl", ["a"])
    (tmp_path / "gone.jsonl").symlink_to(tmp_path / "deleted.jsonl")
    named = {"dir": tmp_path, "glob": str(tmp_path / "*.jsonl"), "file": tmp_path / "gone.jsonl"}[source]
    with pytest.raises(InputError, match=r"gone\.jsonl: broken symbolic link \(its target .*deleted\.jsonl"):
        CorpusReader(named)


@pytest.mark.parametrize("name", ["notes.txt", "c.jsonl.lz4", "c.csv", "c.parquet.gz"])
@pytest.mark.parametrize("source", ["dir", "glob"])
def test_an_unsupported_file_in_a_directory_or_pattern_is_refused_by_name(tmp_path, name, source):
    write(tmp_path / "a.jsonl", ["a"])
    (tmp_path / name).write_bytes(b"x")
    with pytest.raises(InputError) as caught:
        CorpusReader(tmp_path if source == "dir" else str(tmp_path / "*"))
    assert caught.value.path == str(tmp_path / name) and "unsupported" in caught.value.reason
    assert "dir/*.jsonl" in caught.value.hint  # says how to choose the files


def test_a_subdirectory_is_refused_not_passed_over(tmp_path):
    write(tmp_path / "a.jsonl", ["a"])
    write((tmp_path / "part2").mkdir() or tmp_path / "part2" / "b.jsonl", ["b"])
    with pytest.raises(InputError, match=r"part2: subdirectories of a corpus directory are not searched"):
        CorpusReader(tmp_path)
    # the way the message advises
    assert ids_read(CorpusReader(str(tmp_path / "**" / "*.jsonl"))) == ["a", "b"]


def test_a_pattern_matching_a_directory_is_refused(tmp_path):
    write((tmp_path / "x.jsonl").mkdir() or tmp_path / "x.jsonl" / "a.jsonl", ["a"])
    with pytest.raises(InputError, match=r"x\.jsonl: the pattern matches a directory"):
        CorpusReader(str(tmp_path / "*.jsonl"))
    with pytest.raises(InputError, match="the pattern matches a directory"):
        CorpusReader(str(tmp_path / "**"))


def test_a_fifo_is_refused(tmp_path):
    write(tmp_path / "a.jsonl", ["a"])
    os.mkfifo(tmp_path / "b.jsonl")
    with pytest.raises(InputError, match=r"b\.jsonl: not a regular file"):
        CorpusReader(tmp_path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any directory")
def test_an_unreadable_directory_is_refused(tmp_path):
    locked = tmp_path / "locked"
    write(locked.mkdir() or locked / "a.jsonl", ["a"])
    locked.chmod(0)
    try:
        with pytest.raises(InputError, match="cannot list this directory: Permission denied"):
            CorpusReader(str(tmp_path / "**" / "*.jsonl"))
    finally:
        locked.chmod(0o755)


def test_hidden_and_underscore_entries_are_passed_over_and_listed(tmp_path):
    write(tmp_path / "part-0.jsonl", ["a"])
    for name in [".gitattributes", "_SUCCESS", ".part-0.jsonl.crc"]:
        (tmp_path / name).write_bytes(b"")
    (tmp_path / ".cache").mkdir()
    reader = CorpusReader(tmp_path)
    assert [p.name for p in reader.files] == ["part-0.jsonl"]
    assert sorted(p.name for p in reader.passed_over) == [".cache", ".gitattributes", ".part-0.jsonl.crc", "_SUCCESS"]


@pytest.mark.parametrize("name", [b"new\nline.jsonl", b"latin1-\xe9.jsonl", b"bell\x07.jsonl"])
def test_a_file_name_that_cannot_be_recorded_is_refused(tmp_path, name):
    path = Path(os.fsdecode(os.fsencode(tmp_path) + b"/" + name))
    write(path, ["a"])
    for source in (path, tmp_path, str(tmp_path / "*.jsonl")):
        with pytest.raises(InputError, match="this file name cannot be recorded") as caught:
            CorpusReader(source)
        assert "\n" not in str(caught.value) and str(caught.value).encode()  # one line, printable


def test_zstd_is_read_when_zstandard_is_installed(tmp_path):
    zstandard = pytest.importorskip("zstandard")
    data = b"".join(orjson.dumps({"id": f"d{i}", "text": "t"}) + b"\n" for i in range(100))
    compress = zstandard.ZstdCompressor().compress
    (tmp_path / "c.jsonl.zst").write_bytes(compress(data[:1000]) + compress(data[1000:]))  # two frames
    assert ids_read(CorpusReader(tmp_path)) == [f"d{i}" for i in range(100)]


def test_zstd_without_zstandard_is_refused_naming_the_file_and_the_package(tmp_path, monkeypatch):
    from lsr_index.inputs import decompress

    monkeypatch.setattr(decompress, "zstandard", None)
    write(tmp_path / "a.jsonl", ["a"])
    (tmp_path / "b.jsonl.zst").write_bytes(b"\x28\xb5\x2f\xfd")
    with pytest.raises(InputError, match=r"b\.jsonl\.zst: reading \.zst files needs the zstandard module"):
        CorpusReader(tmp_path)


def make_loops(root: Path) -> Path:
    write((root / "d" / "sub").mkdir(parents=True) or root / "d" / "a.jsonl", ["a"])
    write(root / "d" / "sub" / "b.jsonl", ["b"])
    (root / "d" / "loop").symlink_to(root / "d")
    (root / "d" / "sub" / "up").symlink_to(root / "d")
    return root / "d"


def test_a_double_star_pattern_over_symlink_loops_ends_and_reads_each_file_once(tmp_path):
    """A real process with a deadline: with two loops, a glob that follows every link would run for good."""
    d = make_loops(tmp_path)
    code = ("import sys; from lsr_index.inputs.corpus import CorpusReader as R; "
            "print([str(p) for p in R(sys.argv[1]).files])")
    done = subprocess.run(
        [sys.executable, "-c", code, str(d / "**" / "*.jsonl")], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str([str(d / "a.jsonl"), str(d / "sub" / "b.jsonl")])


def test_a_double_star_follows_a_link_to_a_directory_outside(tmp_path):
    write((tmp_path / "elsewhere").mkdir() or tmp_path / "elsewhere" / "x.jsonl", ["x"])
    write((tmp_path / "d").mkdir() or tmp_path / "d" / "a.jsonl", ["a"])
    (tmp_path / "d" / "more").symlink_to(tmp_path / "elsewhere")
    assert ids_read(CorpusReader(str(tmp_path / "d" / "**" / "*.jsonl"))) == ["a", "x"]


def test_a_relative_double_star_pattern(tmp_path, monkeypatch):
    write((tmp_path / "d" / "sub").mkdir(parents=True) or tmp_path / "d" / "a.jsonl", ["a"])
    write(tmp_path / "d" / "sub" / "b.jsonl", ["b"])
    monkeypatch.chdir(tmp_path / "d")
    assert [str(p) for p in CorpusReader("**/*.jsonl").files] == ["a.jsonl", os.path.join("sub", "b.jsonl")]
