#!/usr/bin/env bash
# Wheels for tools/device/compat_gpu.py on a GPU machine without network (Python 3.12,
# x86-64 Linux, torch already installed there): run here, with network, from the repository
# root. They land in .whl/compat-1, .whl/compat-2, ... (each under 60 MiB, so each fits one
# carry); on the GPU machine, after carrying every folder (one call each, the venv persists
# between calls):
#   python3 -m venv --system-site-packages build/compat-venv
#   build/compat-venv/bin/pip install --no-index --no-deps .whl/compat-*/*.whl
# (--no-deps: the list below is the whole closure beyond torch, numpy and their own
# dependencies; `pip check` there names anything the machine still lacks.)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DEST="$ROOT/.whl"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# PyLate / colpali-engine (.ci/integrations-*.txt) and what importing their scoring, losses
# and processors pulls in, plus late-interaction-kernels for the comparison.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --abi cp312 --abi abi3 --abi none \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d "$TMP" \
    pylate==1.6.0 colpali-engine==0.3.18 late-interaction-kernels==0.4.5 \
    transformers==5.3.0 sentence-transformers==5.3.0 datasets==5.2.0 peft==0.18.1 \
    accelerate==1.15.0 huggingface-hub==1.33.0 tokenizers==0.22.2 safetensors==0.8.0 \
    scikit-learn==1.9.1 threadpoolctl==3.8.0 joblib==1.6.0 pandas==3.1.1 pyarrow==26.0.1 \
    dill==0.4.1 multiprocess==0.70.19 xxhash==4.1.0 psutil==7.2.2 ujson==5.12.0 \
    httpx==0.28.1 httpcore==1.0.9 h11 anyio sniffio certifi idna typer==0.29.2 \
    shellingham==1.5.4 annotated-doc==0.0.7 narwhals==2.29.0 cloudpickle==3.1.2 click rich \
    markdown-it-py mdurl pygments regex tqdm requests urllib3 charset-normalizer pyyaml \
    filelock fsspec hf-xet packaging python-dateutil six tzdata scipy pillow

# Pack into folders of at most 60 MiB, largest wheels first.
mkdir -p "$DEST"
n=0 used=$((60 * 1024 * 1024))
for wheel in $(ls -S "$TMP"/*.whl); do
    size=$(stat -c %s "$wheel")
    if [ $((used + size)) -gt $((60 * 1024 * 1024)) ]; then
        n=$((n + 1)) used=0
        rm -rf "$DEST/compat-$n"
        mkdir -p "$DEST/compat-$n"
    fi
    mv "$wheel" "$DEST/compat-$n/"
    used=$((used + size))
done
du -sh "$DEST"/compat-*
