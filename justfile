# Developer recipes; each wraps tools/dev.py so the same steps run without `just`.

python := env_var_or_default("PYTHON", "python3")

# Build the variant for this machine (cpu, plus cuda where torch has CUDA and a GPU is present)
build backend="auto":
    {{python}} tools/dev.py build --backend {{backend}}

# Build and run the whole test suite
test *args:
    {{python}} tools/dev.py test {{args}}

# Run examples/NN_*.py against the local build, loaded through kernels.get_kernel
example n:
    {{python}} tools/dev.py example {{n}}

# `kernels benchmark` over benchmarks/benchmark.py (verifies every workload)
bench *args:
    {{python}} tools/dev.py bench {{args}}

# Side-by-side timings: maxsim vs naive PyTorch vs installed peers
compare *args:
    {{python}} benchmarks/compare.py {{args}}

# Compile every CUDA unit for sm_80 and sm_90a (needs nvcc, not a GPU)
cuda-compile:
    {{python}} tools/dev.py cuda-compile

clean:
    rm -rf build
