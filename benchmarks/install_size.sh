#!/usr/bin/env bash
# What InstanSeg on ONNX Runtime costs on top of `pip install ".[all]"`: download and disk.
#
#   benchmarks/install_size.sh SCRATCH_FOLDER BASE_REF [PYTHON]
#
# In SCRATCH_FOLDER (made, then reused): a fresh virtual environment; `[all]` of BASE_REF
# (the code to compare against, e.g. main before [all] had [instanseg-onnx]) installed
# without pip's cache; then `[all]` of the working tree's HEAD on top (what it adds); then
# `slidescope models install instanseg` into SCRATCH_FOLDER/models. Prints the venv's size
# after each step, the files pip downloaded for the second step (pip's log), and the size
# of the models. Needs the network (the package index).
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 SCRATCH_FOLDER BASE_REF [PYTHON]" >&2; exit 2; }
B=$(mkdir -p "$1" && cd "$1" && pwd)
BASE=$2
PY=${3:-python3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
rm -rf "$B/venv" "$B/models" "$B/src-base" "$B/src-head"
mkdir -p "$B/src-base" "$B/src-head"
git -C "$ROOT" archive "$BASE" | tar -x -C "$B/src-base"
git -C "$ROOT" archive HEAD | tar -x -C "$B/src-head"
"$PY" -m venv "$B/venv"
"$B/venv/bin/python" -m pip install -q --no-cache-dir --upgrade pip
size() { du -sb "$1" | cut -f1; }
echo "== empty venv: $(size "$B/venv") bytes"
"$B/venv/bin/python" -m pip install --no-cache-dir "$B/src-base[all]" >"$B/pip-base.log" 2>&1
echo "== [all] of $BASE: venv $(size "$B/venv") bytes"
"$B/venv/bin/python" -m pip install --no-cache-dir "$B/src-head[all]" >"$B/pip-head.log" 2>&1
echo "== [all] of HEAD on top: venv $(size "$B/venv") bytes; downloaded:"
grep -E "Downloading|Processing .*\.whl" "$B/pip-head.log" || true
grep -E "Successfully installed" "$B/pip-head.log" || true
SLIDESCOPE_MODELS="$B/models" "$B/venv/bin/slidescope" models install instanseg
echo "== models: $(size "$B/models") bytes"
SLIDESCOPE_MODELS="$B/models" "$B/venv/bin/slidescope" models list
