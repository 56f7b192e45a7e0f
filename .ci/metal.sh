#!/usr/bin/env bash
# The emulated Metal suite (tests/test_metal_emulated.py, with
# tests/test_metal_emulated_compressed.py for int8 / float8 e4m3fn documents and
# tests/test_metal_emulated_residual.py for ColBERTv2 residuals) as CI runs it,
# on a CPU machine:
#   1. the kernels under AddressSanitizer + UBSan (every buffer exactly its tensor's size),
#      each launch in three thread orders with two poison patterns;
#   2. the flavour-independent checks on the plain build: the ThreadSanitizer program
#      (real threads; float, int8, e4m3fn and residual documents) and the kernel mutations
#      the suite must catch: the forward's staging and simdgroup barriers removed, a tile
#      bound off by one, the backward's batch barrier removed; for compressed documents the
#      scale applied after the max, the e4m3fn exponent bias off by one, int8 widened as
#      unsigned, and grad_queries without the scale; for residuals the bucket bits or bytes
#      read in the wrong order, the row norm of one step only, the token left unrounded and
#      grad_queries without the norm.
# Needs g++ with libasan/libtsan (Debian: g++). About 20 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
TESTS=(tests/test_metal_emulated.py tests/test_metal_emulated_compressed.py tests/test_metal_emulated_residual.py)

"$PY" tools/metal_emu/build.py plain asan tsan

# libstdc++ is preloaded too: ASan's __cxa_throw interceptor must find it at start-up
# (the emulator unwinds aborted GPU threads with an exception).
LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)" \
ASAN_OPTIONS="detect_leaks=0" UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
MAXSIM_METAL_EMU=asan \
  "$PY" -m pytest "${TESTS[@]}" -q -p no:cacheprovider --capture=sys \
    -k "not thread_sanitizer and not mutations"

MAXSIM_METAL_EMU=plain \
  "$PY" -m pytest "${TESTS[@]}" -q -p no:cacheprovider -k "thread_sanitizer or mutations"
