// Forward instantiation: fp16 queries, int8 documents with row scales (every surface).
#include "kernel/forward_configs.cuh"

namespace maxsim_cuda {
namespace kernel {
template cudaError_t launch_forward_compressed<__half, DocFormat::kInt8>(const ForwardParams&);
}  // namespace kernel
}  // namespace maxsim_cuda
