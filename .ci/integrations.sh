#!/usr/bin/env bash
# maxsim inside PyLate and colpali-engine, on the CPU:
#   1. a venv with the pinned libraries (.ci/integrations-*.txt; torch stays the installed one),
#      and one for fast-plaid with the torch its extension needs (.ci/integrations-fast-plaid.txt),
#   2. maxsim's adapter tests against the installed libraries, PyLate's losses driven by a
#      stub encoder with and without the patch (tests/test_compat.py, tests/integrations/), and
#      examples/07 (the one-line switch),
#   3. the libraries' own CPU test files and scoring doctests, from their release sdists, with
#      maxsim patched in (tests/integrations/maxsim_patch_plugin.py).
# MAXSIM_REQUIRE_INTEGRATIONS=1 turns every "library missing" skip into a failure.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${MAXSIM_INTEGRATIONS_VENV:-$ROOT/build/integrations-venv}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

python3 -m venv --system-site-packages "$VENV"
PY="$VENV/bin/python"
# pip may not replace the torch this suite is built against
python3 -c 'import torch; print("torch==" + torch.__version__.split("+")[0])' > "$WORK/constraints.txt"
"$PY" -m pip install -q -c "$WORK/constraints.txt" --no-deps -r "$ROOT/.ci/integrations-nodeps.txt"
"$PY" -m pip install -q -c "$WORK/constraints.txt" -r "$ROOT/.ci/integrations-requirements.txt"
"$PY" -m pip download -q --no-deps --no-binary :all: -d "$WORK/sdist" \
    -r "$ROOT/.ci/integrations-nodeps.txt"

# Only the tests and the pytest settings: a source tree next to them would shadow the
# installed (patched) package.
extract() {  # archive folder
    local top
    top=$(basename "$1" .tar.gz)  # sdists unpack into NAME-VERSION/
    mkdir -p "$WORK/$2"
    tar -xzf "$1" -C "$WORK/$2" --strip-components=1 "$top/tests" "$top/pyproject.toml"
}
extract "$WORK"/sdist/pylate-*.tar.gz pylate
extract "$WORK"/sdist/colpali_engine-*.tar.gz colpali_engine

# fast-plaid in a venv of its own, with the torch its extension was built for; the residual
# codec tests run it in a subprocess (MAXSIM_FAST_PLAID_PYTHON)
# (about 4.8 GB from PyPI: torch 2.11.0 is the CUDA build). One retry; if PyPI still cannot
# deliver it, the run goes on and the fast-plaid test skips, saying so here and in pytest's
# summary, rather than failing every other check of the run on a download.
FAST_PLAID_VENV=${MAXSIM_FAST_PLAID_VENV:-$ROOT/build/fast-plaid-venv}
python3 -m venv "$FAST_PLAID_VENV"
fast_plaid_install() { "$FAST_PLAID_VENV/bin/python" -m pip install -q -r "$ROOT/.ci/integrations-fast-plaid.txt"; }
if fast_plaid_install || fast_plaid_install; then
  export MAXSIM_FAST_PLAID_PYTHON="$FAST_PLAID_VENV/bin/python"
else
  echo "WARNING: the fast-plaid venv could not be installed; test_fast_plaid_index_decodes will skip" >&2
fi

python3 "$ROOT/tools/build.py" --backend cpu
export LOCAL_KERNELS="maxsim/maxsim=$ROOT" HF_HUB_OFFLINE=1 MAXSIM_REQUIRE_INTEGRATIONS=1
export MAXSIM_TEST_NO_BUILD=1 MAXSIM_REPO="$ROOT"

cd "$ROOT"
"$PY" -m pytest -q tests/integrations
"$PY" -m pytest -q tests/test_compat.py -k "match_library and not semantics"
# the one-line switch as the example shows it (it asserts both libraries' results)
"$PY" examples/07_pylate_colpali_switch.py

export PYTHONPATH="$ROOT/tests/integrations${PYTHONPATH:+:$PYTHONPATH}"
SITE=$("$PY" -c 'import os, pylate; print(os.path.dirname(pylate.__file__))')
cd "$WORK/pylate"
# addopts there ask for pytest-cov; the doctest flags come from its pyproject
MAXSIM_PATCH=pylate "$PY" -m pytest -q -p maxsim_patch_plugin -o addopts="" \
    --doctest-modules tests/test_colbert_scores.py "$SITE/scores"
cd "$WORK/colpali_engine"
MAXSIM_PATCH=colpali_engine "$PY" -m pytest -q -p maxsim_patch_plugin \
    tests/utils/test_maxsim.py tests/loss/test_li_losses.py tests/utils/test_processing_utils.py
