#!/usr/bin/env bash
# Create (or reuse) the isolated Holistic Trace Analysis virtualenv used by the benchmarks.
#
# HTA (holistictraceanalysis on PyPI) is a *reference* tool only: it lives in its own virtualenv at
# benchmarks/.hta-venv (git-ignored) and is never a dependency of torchdoctor.
#
#   bash benchmarks/setup_hta.sh          # idempotent: does nothing if the venv already works
#   HTA_PYTHON=python3.11 bash benchmarks/setup_hta.sh
#   bash benchmarks/setup_hta.sh --force  # rebuild from scratch
#
# Prints the path of the venv's python on the last line of stdout.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${HTA_VENV:-$HERE/.hta-venv}"
PY="${HTA_PYTHON:-python3}"
HTA_VERSION="0.5.0"

if [[ "${1:-}" == "--force" ]]; then
  rm -rf "$VENV"
fi

check() {
  "$VENV/bin/python" - "$HTA_VERSION" <<'PY' >/dev/null 2>&1
import sys
from importlib.metadata import version
assert version("holistictraceanalysis") == sys.argv[1], version("holistictraceanalysis")
from hta.trace_analysis import TraceAnalysis  # noqa: F401
PY
}

if [[ -x "$VENV/bin/python" ]] && check; then
  echo "HTA $HTA_VERSION already installed in $VENV" >&2
  echo "$VENV/bin/python"
  exit 0
fi

echo "creating HTA virtualenv in $VENV (holistictraceanalysis==$HTA_VERSION)" >&2
"$PY" -m venv "$VENV"
# pip's notes about unreachable extra index folders are noise here; its exit status still counts.
quiet_pip() {
  { "$VENV/bin/python" -m pip "$@" 2>&1; } | { grep -v "is ignored: it is neither a file nor a directory" || true; } >&2
}
quiet_pip install --quiet --upgrade pip
# HTA's own requirements (jupyterlab, pandas, numpy, networkx, plotly, pydot, pytest) come with it.
quiet_pip install --quiet "holistictraceanalysis==$HTA_VERSION"

if ! check; then
  echo "error: HTA import check failed in $VENV" >&2
  exit 1
fi
"$VENV/bin/python" -m pip freeze > "$VENV/freeze.txt"
echo "HTA $HTA_VERSION ready in $VENV" >&2
echo "$VENV/bin/python"
