#!/usr/bin/env bash
# Create .venv and install lsr-index: what the main job needs (Lucene, Java, the model loader), plus, with
# --dev, what the tests need (pytest, hypothesis, ruff, Triton for the kernel's CPU tests, matplotlib, Ray, Seismic).
# torch is installed first, on its own, so that nothing pulls a multi-GB CUDA build on a CPU machine;
# set TORCH_SPEC to choose another build (e.g. TORCH_SPEC=torch on a GPU machine).
# A rerun reinstalls only when pyproject.toml or the extras changed.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  "") EXTRAS=lucene ;;
  --dev) EXTRAS=lucene,dev,ray,seismic ;;
  *) echo "usage: pipelines/setup.sh [--dev]" >&2; exit 2 ;;
esac
PYTHON=${PYTHON:-python3}
PIP=(.venv/bin/python -m pip --disable-pip-version-check)
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -c "import torch" 2>/dev/null || {
  "${PIP[@]}" install --quiet --upgrade pip
  "${PIP[@]}" install --quiet "${TORCH_SPEC:-torch==2.13.0}"
}
HASH=$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -e ".venv/.installed-$EXTRAS-$HASH" ] && [ ! -e ".venv/.installed-lucene,dev,ray,seismic-$HASH" ]; then
  # PYTHONWARNINGS: setuptools' ten-line banner about editable installs says nothing actionable here
  PYTHONWARNINGS=ignore "${PIP[@]}" install --quiet -e ".[$EXTRAS]"
  rm -f .venv/.installed-*
  touch ".venv/.installed-$EXTRAS-$HASH"
fi
.venv/bin/lsr-index --help >/dev/null
echo "set-up done ($EXTRAS): $(.venv/bin/python -c 'import torch, transformers, pyarrow; print("torch", torch.__version__, "| transformers", transformers.__version__, "| pyarrow", pyarrow.__version__)')"
echo "to put lsr-index on PATH in this shell: . .venv/bin/activate"
