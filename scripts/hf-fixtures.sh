#!/usr/bin/env bash
# Makes the Hugging Face reference fixtures under crates/models/tests/fixtures/hf/ (committed;
# `cargo test` reads them without Python): a virtual environment with the
# pinned transformers and torch (CPU is enough; PyPI's torch wheel brings CUDA
# libraries, ~5.6 GB), then scripts/hf-fixtures/make.py.
#
#   bash scripts/hf-fixtures.sh            # venv in ${HF_FIXTURES_VENV:-.venv-hf}
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${HF_FIXTURES_VENV:-.venv-hf}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet "transformers==5.25.0" "torch==2.15.0" "safetensors>=0.4"
fi
"$venv/bin/python" scripts/hf-fixtures/make.py crates/models/tests/fixtures/hf
