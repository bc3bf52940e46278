"""Triton's cache key kept from one process to the next (sparton/triton_key.py): read back only for the installation
it was computed for, never half-written, and installed where the real Triton looks it up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sparton.triton_key import kept_key

pytest.importorskip("triton")

VERSION = "3.9.0"


def _installation(root: Path) -> Path:
    """A package laid out as Triton's: sources the key hashes, a binary, files it does not hash, and a backend linked
    in from elsewhere (as a development install links its backends)."""
    package = root / "triton"
    for name, text in {"__init__.py": "", "compiler/compiler.py": "x = 1\n", "language/core.py": "y = 2\n",
                       "_C/libtriton.so": "binary", "backends/nvidia/include/cuda.h": "header",
                       "compiler/__pycache__/compiler.cpython-311.pyc": "bytecode",
                       "../source/amd/compiler.py": "z = 3\n"}.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    (package / "backends" / "amd").symlink_to(root / "source" / "amd", target_is_directory=True)
    return package


def _umask() -> int:
    """This process's umask, read without setting it (os.umask sets it, for every thread)."""
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("Umask:")).split()[1], 8)


class Computer:
    """Triton's key function as the keeper sees it: counts its calls, each giving a new key."""

    def __init__(self):
        self.calls, self.version = 0, VERSION

    def __call__(self) -> str:
        self.calls += 1
        return f"{self.version}-key-{self.calls}"


def test_a_kept_key_is_read_back_instead_of_computed(tmp_path):
    package, directory, compute = _installation(tmp_path), tmp_path / "cache" / "sparton", Computer()
    first = kept_key(package, VERSION, directory, compute)
    assert (first, compute.calls) == (f"{VERSION}-key-1", 1)
    assert kept_key(package, VERSION, directory, compute) == first and compute.calls == 1
    kept = list(directory.iterdir())
    assert len(kept) == 1 and kept[0].read_text() == first and not kept[0].name.startswith(".")
    assert kept[0].stat().st_mode & 0o777 == 0o666 & ~_umask()  # readable as the cache's other files are


@pytest.mark.parametrize("change", ["source edited", "source added", "binary replaced", "same size, new mtime",
                                    "linked backend edited", "another version"])
def test_a_changed_installation_computes_its_own_key(tmp_path, change):
    package, directory, compute = _installation(tmp_path), tmp_path / "keys", Computer()
    version = VERSION
    kept_key(package, version, directory, compute)
    if change == "source edited":
        (package / "compiler" / "compiler.py").write_text("x = 10\n")
    elif change == "source added":
        (package / "language" / "extra.py").write_text("")
    elif change == "binary replaced":
        (package / "_C" / "libtriton.so").write_text("another binary")
    elif change == "same size, new mtime":  # ten seconds on: any file system's timestamps tell them apart
        stat = (package / "language" / "core.py").stat()
        os.utime(package / "language" / "core.py", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**10))
    elif change == "linked backend edited":
        (package / "backends" / "amd" / "compiler.py").write_text("z = 30\n")
    else:
        version = compute.version = "3.10.0"
    assert kept_key(package, version, directory, compute) == f"{version}-key-2" and compute.calls == 2
    assert kept_key(package, version, directory, compute) == f"{version}-key-2" and compute.calls == 2


def test_files_the_key_does_not_hash_leave_it_kept(tmp_path):
    package, directory, compute = _installation(tmp_path), tmp_path / "keys", Computer()
    kept_key(package, VERSION, directory, compute)
    (package / "backends" / "nvidia" / "include" / "cuda.h").write_text("another header")
    (package / "compiler" / "__pycache__" / "compiler.cpython-311.pyc").write_text("new bytecode")
    assert kept_key(package, VERSION, directory, compute) == f"{VERSION}-key-1" and compute.calls == 1


@pytest.mark.parametrize("content", [b"", b"3.9", b"not a key at all", b"\xff\xfe"])
def test_a_file_that_is_not_a_key_is_computed_over(tmp_path, content):
    package, directory, compute = _installation(tmp_path), tmp_path / "keys", Computer()
    kept_key(package, VERSION, directory, compute)
    [path] = directory.iterdir()
    path.write_bytes(content)
    assert kept_key(package, VERSION, directory, compute) == f"{VERSION}-key-2"
    assert path.read_text() == f"{VERSION}-key-2"


def test_a_directory_that_cannot_be_made_still_gives_the_key(tmp_path):
    package, compute = _installation(tmp_path), Computer()
    blocked = tmp_path / "a file"
    blocked.write_text("")
    assert kept_key(package, VERSION, blocked / "sparton", compute) == f"{VERSION}-key-1"
    assert kept_key(package, VERSION, blocked / "sparton", compute) == f"{VERSION}-key-2"


def test_an_installation_that_cannot_be_read_whole_is_not_kept(tmp_path):
    """A file gone between the walk and its stat (a reinstall under way): the key is Triton's own, kept nowhere."""
    package, directory, compute = _installation(tmp_path), tmp_path / "keys", Computer()
    (package / "language" / "gone.py").symlink_to(tmp_path / "nowhere.py")
    assert kept_key(package, VERSION, directory, compute) == f"{VERSION}-key-1"
    assert kept_key(package, VERSION, directory, compute) == f"{VERSION}-key-2" and not directory.exists()


def test_a_key_that_cannot_be_replaced_leaves_no_temporary_file(tmp_path):
    package, directory, compute = _installation(tmp_path), tmp_path / "keys", Computer()
    kept_key(package, VERSION, directory, compute)
    [path] = directory.iterdir()
    path.unlink()
    path.mkdir()  # neither read as a key nor replaced by one
    assert kept_key(package, VERSION, directory, compute) == f"{VERSION}-key-2"
    assert [p.name for p in directory.iterdir()] == [path.name] and path.is_dir()


_PROCESS = textwrap.dedent("""
    import json, sys
    import triton.runtime.cache as cache
    from sparton import triton_key
    computed = cache.triton_key
    hashing, calls = computed.__wrapped__, []
    computed.__wrapped__ = lambda: calls.append(1) or hashing()  # what install() calls to hash the installation
    key = triton_key.install()
    again = triton_key.install()  # a second call: the same key, put where the first one was
    left = sorted(name for name, module in sys.modules.items()
                  if getattr(module, "__dict__", {}).get("triton_key") is computed)
    patched = sorted(name for name, module in sys.modules.items()
                     if getattr(module, "__dict__", {}).get("triton_key") is cache.triton_key)
    looked_up = cache.get_cache_key.__globals__["triton_key"]() if hasattr(cache, "get_cache_key") else key
    print(json.dumps({"key": key, "again": again, "hashed": len(calls), "cached": computed.cache_info().currsize,
                      "looked_up": looked_up, "patched": patched, "left": left, "fresh": hashing()}))
""")


def _process(cache: Path) -> dict:
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache)}
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, "-c", _PROCESS], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_real_key_is_kept_and_installed_where_triton_looks_it_up(tmp_path):
    first = _process(tmp_path)  # hashed once, by Triton's own function, not taken from its cache of a value
    assert (first["hashed"], first["cached"]) == (1, 0)
    assert first["key"] == first["again"] == first["fresh"] == first["looked_up"]
    assert len([p for p in (tmp_path / "sparton").iterdir() if not p.name.startswith(".")]) == 1
    second = _process(tmp_path)  # a new process: the key read back, Triton's hashing never run
    assert (second["hashed"], second["cached"]) == (0, 0)
    assert second["key"] == second["again"] == second["fresh"] == second["looked_up"] == first["key"]
    assert "triton.runtime.cache" in second["patched"] and second["left"] == []
