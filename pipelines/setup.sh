#!/usr/bin/env bash
# Create .venv and install lsr-index with everything the pipeline and the tests need.
# torch is installed first, on its own, so that nothing pulls a multi-GB CUDA build on a CPU machine;
# set TORCH_SPEC to choose another build (e.g. TORCH_SPEC=torch on a GPU machine).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
.venv/bin/python -c "import torch" 2>/dev/null \
  || .venv/bin/python -m pip install --quiet --disable-pip-version-check "${TORCH_SPEC:-torch==2.13.0}"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[lucene,dev]"
.venv/bin/lsr-index --help >/dev/null
echo "set-up done: $(.venv/bin/python -c 'import torch, transformers, pyarrow; print("torch", torch.__version__, "| transformers", transformers.__version__, "| pyarrow", pyarrow.__version__)')"
