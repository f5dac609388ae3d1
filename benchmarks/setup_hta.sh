#!/usr/bin/env bash
# Create (or reuse) the isolated Holistic Trace Analysis virtualenvs used by the benchmarks.
#
# HTA is a *reference* tool only: each version lives in its own git-ignored virtualenv and is never a
# dependency of torchdoctor. Two releases are supported (both import as `hta`):
#
#   0.5.0  PyPI `holistictraceanalysis`   -> benchmarks/.hta-venv
#   0.6.1  PyPI `traceinsight` (renamed)  -> benchmarks/out/hta-venv-0.6.1
#
#   bash benchmarks/setup_hta.sh                 # 0.5.0 (the default); idempotent
#   bash benchmarks/setup_hta.sh 0.6.1           # the newest release
#   bash benchmarks/setup_hta.sh both            # both, one after the other
#   HTA_PYTHON=python3.11 bash benchmarks/setup_hta.sh 0.6.1
#   bash benchmarks/setup_hta.sh --force both    # rebuild from scratch
#
# HTA_VENV overrides the venv path (single version only). Prints the path of each venv's python on
# stdout, one line per version (the last line is the last version built).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${HTA_PYTHON:-python3}"
FORCE=0
VERSIONS=()
for arg in "$@"; do
  case "$arg" in
    --force) FORCE=1 ;;
    both) VERSIONS+=(0.5.0 0.6.1) ;;
    0.5.0 | 0.6.1) VERSIONS+=("$arg") ;;
    *) echo "usage: setup_hta.sh [--force] [0.5.0|0.6.1|both]" >&2; exit 2 ;;
  esac
done
[[ ${#VERSIONS[@]} -gt 0 ]] || VERSIONS=(0.5.0)
if [[ -n "${HTA_VENV:-}" && ${#VERSIONS[@]} -gt 1 ]]; then
  echo "error: HTA_VENV names one venv; give one version with it" >&2
  exit 2
fi

dist_of() {  # PyPI distribution that ships the given HTA version
  case "$1" in
    0.5.0) echo holistictraceanalysis ;;
    0.6.1) echo traceinsight ;;
  esac
}

venv_of() {  # default venv of the given HTA version (both paths are git-ignored)
  case "$1" in
    0.5.0) echo "$HERE/.hta-venv" ;;
    0.6.1) echo "$HERE/out/hta-venv-0.6.1" ;;
  esac
}

check() {  # venv, dist, version: the right release is installed and `hta` imports
  "$1/bin/python" - "$2" "$3" <<'PY' >/dev/null 2>&1
import sys
from importlib.metadata import version
assert version(sys.argv[1]) == sys.argv[2], version(sys.argv[1])
from hta.trace_analysis import TraceAnalysis  # noqa: F401
PY
}

setup_one() {
  local ver="$1" dist venv
  dist="$(dist_of "$ver")"
  venv="${HTA_VENV:-$(venv_of "$ver")}"
  if [[ $FORCE == 1 ]]; then
    rm -rf "$venv"
  fi
  if [[ -x "$venv/bin/python" ]] && check "$venv" "$dist" "$ver"; then
    echo "HTA $ver already installed in $venv" >&2
    echo "$venv/bin/python"
    return 0
  fi
  echo "creating HTA virtualenv in $venv ($dist==$ver)" >&2
  mkdir -p "$(dirname "$venv")"
  "$PY" -m venv "$venv"
  # pip's notes about unreachable extra index folders are noise here; its exit status still counts.
  quiet_pip() {
    { "$venv/bin/python" -m pip "$@" 2>&1; } | { grep -v "is ignored: it is neither a file nor a directory" || true; } >&2
  }
  quiet_pip install --quiet --upgrade pip
  # HTA's own requirements (jupyterlab, pandas, numpy, networkx, plotly, pydot) come with it.
  quiet_pip install --quiet "$dist==$ver"
  if ! check "$venv" "$dist" "$ver"; then
    echo "error: HTA $ver import check failed in $venv" >&2
    return 1
  fi
  "$venv/bin/python" -m pip freeze > "$venv/freeze.txt"
  echo "HTA $ver ready in $venv" >&2
  echo "$venv/bin/python"
}

for ver in "${VERSIONS[@]}"; do
  setup_one "$ver"
done
