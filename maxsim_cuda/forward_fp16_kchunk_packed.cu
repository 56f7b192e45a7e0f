// Forward instantiation: fp16 inputs, packed surface, K-streaming tensor-core mainloop (dim > 256).
#include "kernel/forward_configs.cuh"

namespace maxsim_cuda {
namespace kernel {
template cudaError_t launch_forward_mma_k<__half, 2>(const ForwardParams&);
}  // namespace kernel
}  // namespace maxsim_cuda
