// Forward instantiation: bf16 inputs, contrastive surface over padded documents, K-streaming tensor-core mainloop (dim > 256).
#include "kernel/forward_configs.cuh"

namespace maxsim_cuda {
namespace kernel {
template cudaError_t launch_forward_mma_k<__nv_bfloat16, 3>(const ForwardParams&);
}  // namespace kernel
}  // namespace maxsim_cuda
