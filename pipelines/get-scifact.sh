#!/usr/bin/env bash
# The BEIR SciFact test collection (5,183 documents, 300 queries, 339 judgments) from BEIR's public copy, in the
# layout pipelines/scifact.sh reads: DIR/corpus.jsonl, DIR/queries.tsv (test queries), DIR/qrels.tsv (TREC format).
# Licences: the corpus ODC-By 1.0, the claims and judgments CC BY 4.0 (allenai/scifact). Needs network access.
# Usage: pipelines/get-scifact.sh [DIR]   (default: data/scifact)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-data/scifact}
URL=https://public.ukp.informatik.tu-darmstadt.de/thakur/BEIR/datasets/scifact.zip
mkdir -p "$DIR"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
curl -fsSL "$URL" -o "$TMP/scifact.zip"
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
"$PYTHON" - "$TMP/scifact.zip" "$DIR" <<'PY'
import json, sys, zipfile
from pathlib import Path

archive, out = zipfile.ZipFile(sys.argv[1]), Path(sys.argv[2])
judged = {}
for line in archive.read("scifact/qrels/test.tsv").decode().splitlines()[1:]:
    qid, doc, grade = line.split("\t")
    judged.setdefault(qid, []).append((doc, int(grade)))
queries = {}
for line in archive.read("scifact/queries.jsonl").decode().splitlines():
    record = json.loads(line)
    if record["_id"] in judged:
        queries[record["_id"]] = " ".join(record["text"].split())
corpus = [json.loads(line) for line in archive.read("scifact/corpus.jsonl").decode().splitlines()]
(out / "corpus.jsonl").write_text("".join(
    json.dumps({"id": d["_id"], "title": d["title"], "text": d["text"]}, ensure_ascii=False) + "\n" for d in corpus))
(out / "queries.tsv").write_text("".join(f"{qid}\t{text}\n" for qid, text in sorted(queries.items(), key=lambda q: int(q[0]))))
(out / "qrels.tsv").write_text("".join(f"{qid} 0 {doc} {grade}\n" for qid in sorted(judged, key=int) for doc, grade in judged[qid]))
print(f"{out}: {len(corpus):,} documents, {len(queries)} queries, {sum(map(len, judged.values()))} judgments")
PY
