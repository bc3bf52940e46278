"""Triton's cache key, kept on disk from one process to the next.

Triton keys each compiled kernel by a hash of its own installation (`triton.runtime.cache.triton_key`: the sources
of its compiler, backends and language and the whole libtriton binary, about 500 MB). A process computes it once,
before its first launch, even when the kernel then comes from Triton's disk cache: a core busy for a fraction of a
second to a second, on the path to a new encoding worker's first batch while its readers tokenize on every core.

Here the key is kept in a file under Triton's cache directory, named by a fingerprint of the installation: Triton's
version and the size and modification time of every file the key hashes (how Python validates its bytecode). A
process whose installation matches a kept key installs it where Triton looks it up, as Triton itself hands a key
computed once to its compile workers (`triton/_compile_warmup_pool.py`); any other computes it and keeps it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import sys
from collections.abc import Callable
from pathlib import Path

SUBDIRECTORY = "sparton"  # under Triton's cache directory: the only files of this package's there


def fingerprint(package: Path, version: str) -> str:
    """Triton's version and the size and mtime of each Python source and libtriton binary under `package` (a
    superset of what its key hashes, symbolic links followed as Triton's own walk does: a development install links
    its backends): any reinstall or edit changes it."""
    entries = [version]
    for root, dirs, files in os.walk(package, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py") or name.startswith("libtriton."):
                path = os.path.join(root, name)
                stat = os.stat(path)
                entries.append(f"{os.path.relpath(path, package)}\0{stat.st_size}\0{stat.st_mtime_ns}")
    return hashlib.sha256("\n".join(entries).encode()).hexdigest()


def kept_key(package: Path, version: str, directory: Path, compute: Callable[[], str]) -> str:
    """The key kept in `directory` for this installation, else `compute()`, kept there for the next process (an
    atomic rename: processes starting together each write the same whole file). `compute` must hash the installation
    as it is now, not return a key cached before it changed: the file's name vouches for what it holds. An
    installation that cannot be read whole (a file removed mid-reinstall) is not kept; a directory that cannot be
    written costs only the keeping."""
    try:
        path = directory / f"triton-key-{fingerprint(package, version)[:32]}"
    except OSError:
        return compute()
    try:
        key = path.read_text(encoding="utf-8")
        if key.startswith(version):  # a key begins with Triton's version: anything else is not one
            return key
    except (OSError, UnicodeDecodeError):
        pass
    key = compute()
    temporary = directory / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        # created as Triton's own cache files are (the umask's permissions), not private: a cache directory shared
        # by several users keeps one key for all
        with os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "w", encoding="utf-8") as f:
            f.write(key)
            f.flush()
            os.fsync(f.fileno())  # renamed only once whole on disk
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):  # never made, or its directory is not one
            temporary.unlink()
    return key


def cache_directory() -> Path:
    """Triton's cache directory (TRITON_CACHE_DIR, else ~/.triton/cache), as this Triton resolves it."""
    try:
        from triton import knobs

        return Path(knobs.cache.dir)
    except (ImportError, AttributeError):
        return Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")


def install() -> str | None:
    """Triton's key for this process, kept or computed, set where Triton's modules (and any other module that took
    the name, such as torch's compiler) look it up. None for a Triton that keys its cache some other way: its first
    launch computes what it needs. Called again, it checks the installation again."""
    import triton
    from triton.runtime import cache

    current = getattr(cache, "triton_key", None)
    if current is None:
        return None
    original = getattr(current, "triton_function", current)  # what an earlier install() replaced
    # Triton's hashing itself: its lru_cache may hold a key computed before the installation changed
    compute = getattr(original, "__wrapped__", original)
    key = kept_key(Path(triton.__file__).parent, triton.__version__, cache_directory() / SUBDIRECTORY, compute)

    def kept() -> str:
        return key

    kept.triton_function = original
    for module in list(sys.modules.values()):
        # the module's own namespace, not getattr: a lazy module's __getattr__ would import what it names
        if getattr(module, "__dict__", {}).get("triton_key") in (original, current):
            module.triton_key = kept
    return key
