#!/usr/bin/env bash
# Creates benchmarks/peers/.venv-qrlew with Qrlew (pyqrlew, on DuckDB) for benchmarks/peers.py.
# Its own virtual environment: Qrlew's pins conflict with dpsql's and OpenDP's.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python3 -m venv "$here/.venv-qrlew"
"$here/.venv-qrlew/bin/pip" install --quiet --upgrade pip
"$here/.venv-qrlew/bin/pip" install --quiet pyqrlew duckdb pyarrow
"$here/.venv-qrlew/bin/python" -c "import pyqrlew; print('pyqrlew ok')"
