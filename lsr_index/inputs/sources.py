"""Corpus sources (files, directories, glob patterns) → the files to read, and which format each one is.

Every file a source names is read or refused with its name, never passed over: a directory's unsupported
files, subdirectories, broken symbolic links and special files are errors, as are a pattern's. The
exceptions are documented rules: a directory's entries whose names start with "." or "_" (``.git``,
``_SUCCESS``, as pyarrow's dataset discovery does) are left out and listed in ``passed_over`` for the
caller to report, and so is the run's own output directory (``exclude``), which a pattern never matches either:
`lsr-index encode .` makes ./lsr-out inside the corpus directory, and a rerun must not read it back as input.
docs/bad-input.md states the rules.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import stat
import unicodedata
from collections.abc import Iterator
from pathlib import Path

from lsr_index.errors import InputError
from lsr_index.inputs.decompress import CODECS, missing_module
from lsr_index.runtime.durable import real_path

_JSONL = (".jsonl", ".ndjson", ".json")
_TABLES = {".arrow": "Arrow IPC", ".feather": "Arrow IPC", ".ipc": "Arrow IPC", ".parquet": "Parquet"}
SUPPORTED = f"{', '.join(_JSONL)} (optionally + {'/'.join(CODECS)}, e.g. .jsonl.gz), {', '.join(_TABLES)}"
_PASSED_OVER = (".", "_")
_PATTERN_HINT = "a pattern must match corpus files only: e.g. dir/*.jsonl, or dir/**/*.jsonl to recurse"


def compression(path: Path) -> str | None:
    """The compression suffix (a key of decompress.CODECS) of a JSONL file's name, if any."""
    name = path.name.lower()
    return next((s for s in CODECS if name.endswith(s)), None)


def file_format(path: Path) -> str | None:
    """"JSONL", "Arrow IPC" or "Parquet" from the name (any case); None when unsupported."""
    name = path.name.lower()
    suffix = compression(path)
    if suffix:
        name = name[: -len(suffix)]
    if name.endswith(_JSONL):
        return "JSONL"
    return None if suffix else next((fmt for ext, fmt in _TABLES.items() if name.endswith(ext)), None)


def resolve(sources: list[str | os.PathLike[str]], exclude: Path | None = None) -> tuple[list[Path], list[Path]]:
    """(files to read in order, directory entries passed over by rule); each file may be named once. `exclude`: an
    output directory, resolved; a directory entry holding it and what a pattern matches inside it are left out."""
    files: list[Path] = []
    passed_over: list[Path] = []
    seen: dict[tuple[int, int], Path] = {}
    for source in sources:
        try:
            expanded = _expand(source, passed_over, exclude)
            for path in expanded:
                # The file itself, not its name: a symbolic or hard link, or a bind mount, names it again.
                st = path.stat()
                first = seen.setdefault((st.st_dev, st.st_ino), path)
                if first is not path:
                    also = "" if os.path.normpath(first) == os.path.normpath(path) else f" (also as {first})"
                    raise InputError(path, None, f"this file is listed twice{also}", "each shard must be read once")
                files.append(path)
        except OSError as e:  # a race with the file system, past the checks that name the entry
            raise InputError(source, None, f"cannot list: {describe(e)}") from e
    return files, passed_over


def _expand(source: str | os.PathLike[str], passed_over: list[Path], exclude: Path | None) -> list[Path]:
    path = Path(source)
    if os.path.lexists(path):
        if path.is_dir():
            return _directory(path, passed_over, exclude)
        return [_checked(path, "unsupported file type")]
    pattern = os.fspath(source)
    if glob.has_magic(pattern):
        matches = sorted(m for m in _glob(pattern) if not (exclude and real_path(m).is_relative_to(exclude)))
        if not matches:
            raise InputError(pattern, None, "pattern matches nothing", f"supported: {SUPPORTED}")
        return [_checked(Path(m), "the pattern matches this unsupported file", _PATTERN_HINT) for m in matches]
    raise InputError(path, None, "no such file or directory")


def _directory(path: Path, passed_over: list[Path], exclude: Path | None) -> list[Path]:
    """A directory's files, sorted by name; it may hold nothing else but entries passed over by rule."""
    try:
        entries = sorted(path.iterdir(), key=lambda p: p.name)
    except OSError as e:
        raise InputError(path, None, f"cannot list this directory: {describe(e)}") from e
    files = []
    for entry in entries:
        if entry.name.startswith(_PASSED_OVER) or (exclude and exclude.is_relative_to(real_path(entry))):
            passed_over.append(entry)
        elif entry.is_dir():
            raise InputError(
                entry, None, "subdirectories of a corpus directory are not searched",
                "name the files with a pattern: e.g. dir/**/*.jsonl, or move them out",
            )
        else:
            files.append(_checked(entry, "unsupported file in a corpus directory", _PATTERN_HINT))
    if not files:
        raise InputError(path, None, "directory holds no corpus files", f"supported: {SUPPORTED}")
    return files


def _checked(path: Path, unsupported: str, hint: str = "") -> Path:
    """``path`` if it is a regular file of a supported format that can be read; else the reason, by name."""
    shown = _odd_name(path)
    if shown:
        raise InputError(shown, None, "this file name cannot be recorded", "rename the file")
    try:
        mode = path.stat().st_mode
    except FileNotFoundError as e:
        target = os.readlink(path) if path.is_symlink() else None
        reason = f"broken symbolic link (its target {target} does not exist)" if target else "file vanished"
        raise InputError(path, None, reason) from e
    except OSError as e:
        raise InputError(path, None, f"cannot read: {describe(e)}") from e
    if stat.S_ISDIR(mode):
        raise InputError(path, None, "the pattern matches a directory", _PATTERN_HINT)
    if not stat.S_ISREG(mode):
        raise InputError(path, None, "not a regular file (a pipe, socket or device cannot be a corpus shard)")
    if file_format(path) is None:
        raise InputError(path, None, unsupported, "; ".join(filter(None, [f"supported: {SUPPORTED}", hint])))
    suffix = compression(path)
    module = missing_module(suffix) if suffix else None
    if module:
        raise InputError(path, None, f"reading {suffix} files needs the {module} module", f"pip install {module}")
    return path


def _odd_name(path: Path) -> str | None:
    """The path written with escapes when it is not UTF-8 or holds a control character or a line or paragraph
    separator (U+2028/U+2029 end a line as \n does): such a name cannot go into the manifest, the skipped-records
    report or a one-line message. Other spaces (e.g. U+00A0) are fine."""
    name = os.fspath(path)
    try:
        name.encode()
    except UnicodeEncodeError:
        return ascii(name)
    return ascii(name) if any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in name) else None


def _glob(pattern: str) -> Iterator[str]:
    """``glob.glob(pattern, recursive=True)``, except that one ``**`` enters each real directory at most once,
    so that symbolic-link loops cannot make it run forever, and that a directory it cannot list is an error."""
    parts = pattern.split(os.sep)
    root = os.sep if parts[0] == "" else ""
    yield from _match(root, [p for p in parts if p])


def _match(base: str, parts: list[str]) -> Iterator[str]:
    if not parts:
        yield base
        return
    part, rest = parts[0], parts[1:]
    if part == "**":
        for directory in _below(base, set()):
            yield from _match(directory, rest)
    elif glob.has_magic(part):
        for name in _listdir(base):
            if fnmatch.fnmatchcase(name, part) and (part.startswith(".") or not name.startswith(".")):
                yield from _match(os.path.join(base, name), rest)
    elif os.path.lexists(path := os.path.join(base, part)) and (not rest or os.path.isdir(path)):
        yield from _match(path, rest)


def _below(directory: str, visited: set[tuple[int, int]]) -> Iterator[str]:
    """``directory`` and every non-hidden directory below it, symbolic links followed, each real one once."""
    st = os.stat(directory or os.curdir)
    if (st.st_dev, st.st_ino) in visited:
        return
    visited.add((st.st_dev, st.st_ino))
    yield directory
    for name in _listdir(directory):
        path = os.path.join(directory, name)
        if not name.startswith(".") and os.path.isdir(path):
            yield from _below(path, visited)


def _listdir(directory: str) -> list[str]:
    try:
        return sorted(os.listdir(directory or os.curdir))
    except (NotADirectoryError, FileNotFoundError):  # a file or a broken link where a pattern needs a directory
        return []
    except OSError as e:
        raise InputError(directory, None, f"cannot list this directory: {describe(e)}") from e


def describe(error: BaseException) -> str:
    """An exception as the short reason a message quotes."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error) or type(error).__name__
