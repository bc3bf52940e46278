#!/usr/bin/env bash
# The main job on the shipped sample: encode → build → search → eval, offline, on CPU, in about a minute.
# Usage: pipelines/sample.sh [WORKDIR]   (default: lsr-out, lsr-index's own default, so that the README's usage
# commands run on its output afterwards)
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${1:-lsr-out}
LSR=".venv/bin/lsr-index --workdir $WORK"
$LSR encode data/sample/corpus.jsonl --preset splade-tiny --overwrite
$LSR build --overwrite
$LSR search --queries data/sample/queries.tsv --qrels data/sample/qrels.tsv
