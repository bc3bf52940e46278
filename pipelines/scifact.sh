#!/usr/bin/env bash
# The full BEIR SciFact test collection (5,183 documents, 300 queries): the reproduction in the README.
# Usage: pipelines/scifact.sh [SCIFACT_DIR] [WORKDIR]   (defaults: ../shared/data/scifact, lsr-out/scifact)
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${1:-../shared/data/scifact}
WORK=${2:-lsr-out/scifact}
LSR=".venv/bin/lsr-index --workdir $WORK"
$LSR encode "$DATA/corpus.jsonl" --preset splade-tiny --overwrite
$LSR build --overwrite
$LSR search --queries "$DATA/queries.tsv" --qrels "$DATA/qrels.tsv"
