// Forward instantiation: bf16 inputs, packed surface, tensor-core mainloop.
#include "kernel/forward_configs.cuh"

namespace maxsim_cuda {
namespace kernel {
template cudaError_t launch_forward_mma<__nv_bfloat16, 2>(const ForwardParams&);
}  // namespace kernel
}  // namespace maxsim_cuda
