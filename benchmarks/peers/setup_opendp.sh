#!/usr/bin/env bash
# Creates benchmarks/peers/.venv-opendp with OpenDP (Polars API) for benchmarks/peers.py.
# Its own virtual environment: OpenDP's and Qrlew's pins conflict with dpsql's and each other's.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python3 -m venv "$here/.venv-opendp"
"$here/.venv-opendp/bin/pip" install --quiet --upgrade pip
"$here/.venv-opendp/bin/pip" install --quiet "opendp[polars]" pyarrow
"$here/.venv-opendp/bin/python" -c "import importlib.metadata as m, opendp.prelude, polars; print('opendp', m.version('opendp'), 'polars', polars.__version__)"
