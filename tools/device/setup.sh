# Sourced by the device scripts (run in the repository root): $OUT, the carried wheels
# (.whl: kernels, tomlkit, the peers) installed into /tmp/site on PYTHONPATH, unbuffered
# Python, and `build_cuda [LOG]`, which builds the CUDA variant for $MAXSIM_CUDA_ARCHS
# (empty or unset: every arch build.toml lists), prints the time it took, and on failure
# the log's tail.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || { echo "installing the carried .whl wheels failed" >&2; exit 1; }
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1

build_cuda() {
  local log="$OUT/${1:-build.log}" start
  start=$(date +%s)
  python3 tools/build.py --backend cuda > "$log" 2>&1 || { tail -n 40 "$log"; return 1; }
  echo "build (${MAXSIM_CUDA_ARCHS:-every build.toml arch}): $(( $(date +%s) - start )) s"
}
