// Forward instantiation: bf16 queries, float8 e4m3fn documents with row scales (every surface).
#include "kernel/forward_configs.cuh"

namespace maxsim_cuda {
namespace kernel {
template cudaError_t launch_forward_compressed<__nv_bfloat16, DocFormat::kE4M3>(const ForwardParams&);
}  // namespace kernel
}  // namespace maxsim_cuda
