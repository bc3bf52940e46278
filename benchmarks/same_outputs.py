"""Do two versions of lsr-index write the same outputs? Encode → build → search on the shipped sample and on a
larger corpus, in every shard format, with the CLI of each version; then compare the shards byte for byte, the
manifests (all but their timings and the paths of the run), and the run files byte for byte.

    python benchmarks/same_outputs.py --base REV [--head REV] [--corpus FILE --queries FILE --qrels FILE]

REV is any git revision; the working tree is used for --head when it is not given. Each version runs from an
archive of its revision (`git archive`), in this checkout's virtual environment, so only the code differs. The
larger corpus defaults to the shipped sample repeated ten times under new ids (4,000 documents). Exit status 0
when every output matches, 1 otherwise (each difference is listed).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "sample"
FORMATS = ("jsonl.gz", "jsonl", "parquet")


def export(rev: str | None, into: Path) -> Path:
    """The code of `rev` (None: the working tree, tracked and untracked files alike) in `into`."""
    into.mkdir(parents=True)
    if rev is None:
        files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                               check=True, capture_output=True).stdout.split(b"\0")
        for name in filter(None, files):
            source = ROOT / name.decode()
            if source.is_file():
                (into / name.decode()).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, into / name.decode())
    else:
        archive = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def package_paths(tree: Path) -> list[str]:
    """Where the tree's packages are imported from: the root, and the kernel package's folder if it is mapped."""
    paths = [str(tree)]
    if (tree / "kernels" / "__init__.py").is_file():  # sparton mapped from kernels/ (pyproject package-dir)
        alias = tree / ".import"
        if not (alias / "sparton").is_symlink():
            alias.mkdir(exist_ok=True)
            (alias / "sparton").symlink_to(tree / "kernels", target_is_directory=True)
        paths.insert(0, str(alias))
    return paths


def run(tree: Path, work: Path, args: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(package_paths(tree)), "LSR_INDEX_WORKDIR": str(work)}
    code = "import sys; from lsr_index.cli import main; sys.argv[0] = 'lsr-index'; main()"
    done = subprocess.run([sys.executable, "-c", code, "-q", *args], cwd=tree, env=env, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise SystemExit(f"{tree.name}: lsr-index {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")


def outputs(tree: Path, work: Path, cases: list[dict]) -> dict[str, str]:
    """Every case's outputs as {name: digest or canonical text}."""
    found: dict[str, str] = {}
    for case in cases:
        out = work / case["name"]
        run(tree, out, ["encode", *case["inputs"], "--format", case["format"], "--device", "cpu", "--overwrite"])
        run(tree, out, ["build", "--overwrite"])
        run(tree, out, ["search", "--queries", case["queries"], "--qrels", case["qrels"], "--run", str(out / "run")])
        manifest = json.loads((out / "vectors" / "manifest.json").read_text())
        manifest.pop("stats")
        found[f"{case['name']}/manifest.json"] = json.dumps(manifest, sort_keys=True)
        for shard in sorted((out / "vectors" / "shards").iterdir()):
            found[f"{case['name']}/shards/{shard.name}"] = hashlib.sha256(shard.read_bytes()).hexdigest()
        found[f"{case['name']}/run"] = hashlib.sha256((out / "run").read_bytes()).hexdigest()
    return found


def larger_corpus(path: Path, copies: int = 10) -> Path:
    """The sample repeated under new ids: a corpus of several shards' worth of pieces."""
    lines = (SAMPLE / "corpus.jsonl").read_text().splitlines()
    with path.open("w") as f:
        for copy in range(copies):
            for line in lines:
                record = json.loads(line)
                record["id"] = f"{record['id']}-{copy}"
                f.write(json.dumps(record) + "\n")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="git revision of the reference version")
    parser.add_argument("--head", help="git revision of the version checked [default: the working tree]")
    parser.add_argument("--corpus", type=Path, help="a larger corpus [default: the sample ×10]")
    parser.add_argument("--queries", type=Path, help="its queries [default: the sample's]")
    parser.add_argument("--qrels", type=Path, help="its judgments [default: the sample's]")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="same-outputs-") as tmp:
        tmp = Path(tmp)
        corpus = (args.corpus or larger_corpus(tmp / "larger.jsonl")).resolve()
        queries = str((args.queries or SAMPLE / "queries.tsv").resolve())
        qrels = str((args.qrels or SAMPLE / "qrels.tsv").resolve())
        sample = [str(SAMPLE / "corpus.jsonl"), str(SAMPLE / "queries.tsv"), str(SAMPLE / "qrels.tsv")]
        cases = [{"name": f"sample-{fmt}", "inputs": [sample[0]], "format": fmt, "queries": sample[1],
                  "qrels": sample[2]} for fmt in FORMATS]
        cases.append({"name": "larger", "inputs": [str(corpus)], "format": "jsonl.gz", "queries": queries,
                      "qrels": qrels})
        found = {}
        for label, rev in (("base", args.base), ("head", args.head)):
            tree = export(rev, tmp / label)
            print(f"{label}: {rev or 'working tree'}", flush=True)
            found[label] = outputs(tree, tmp / f"{label}-out", cases)
        differ = sorted(k for k in found["base"].keys() | found["head"].keys()
                        if found["base"].get(k) != found["head"].get(k))
        for name in differ:
            print(f"differs: {name}")
        print(f"{len(found['base'])} outputs compared: {'all identical' if not differ else f'{len(differ)} differ'}")
        return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
