// Forward instantiation: fp16 queries, ColBERTv2 residual documents (every surface, dim <= 256).
#include "kernel/forward_configs.cuh"

namespace maxsim_cuda {
namespace kernel {
template cudaError_t launch_forward_residual<__half>(const ForwardParams&);
}  // namespace kernel
}  // namespace maxsim_cuda
