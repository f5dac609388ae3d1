#!/usr/bin/env bash
# Download the wheels the GPU machine lacks (msgspec, plotly) into the git-ignored .whl/ folder.
#
# The GPU machine has no network (/work/shared/gpu/README.md): benchmarks/gpu_check.sh installs
# these wheels there from .whl/, which travels with the working tree. Run this once on a machine
# with a registry, before carrying the tree to the GPU machine:
#
#   bash benchmarks/fetch_gpu_wheels.sh          # idempotent: pip skips wheels already there
#   PIP_PYTHON=python3.12 bash benchmarks/fetch_gpu_wheels.sh
#
# The wheels are for CPython 3.12 on manylinux x86_64 (the GPU machine's python3), whatever
# the python running pip is. Prints the wheel files on stdout.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PIP_PYTHON:-python3}"
cd "$REPO"
"$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl msgspec==0.23.0 plotly==7.1.0
ls -1 "$REPO"/.whl/*.whl
