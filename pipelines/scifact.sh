#!/usr/bin/env bash
# The full BEIR SciFact test collection (5,183 documents, 300 queries): the reproduction in the README.
# Usage: pipelines/scifact.sh [SCIFACT_DIR] [WORKDIR]   (defaults: data/scifact, lsr-out/scifact)
# Get the collection first with pipelines/get-scifact.sh (from BEIR's public copy).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${1:-data/scifact}
WORK=${2:-lsr-out/scifact}
if [ ! -f "$DATA/corpus.jsonl" ]; then
  echo "no SciFact collection in $DATA: fetch it with bash pipelines/get-scifact.sh $DATA" >&2
  exit 2
fi
LSR=".venv/bin/lsr-index --workdir $WORK"
$LSR encode "$DATA/corpus.jsonl" --preset splade-tiny --overwrite
$LSR build --overwrite
$LSR search --queries "$DATA/queries.tsv" --qrels "$DATA/qrels.tsv"
