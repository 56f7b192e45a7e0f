// Forward instantiations: ColBERTv2 residual documents on the FFMA path, for every query dtype
// (float32 queries always; 16-bit queries where the tensor-core decode does not apply).
#include "kernel/forward_configs.cuh"

namespace maxsim_cuda {
namespace kernel {
template cudaError_t launch_forward_residual_simt<float>(const ForwardParams&);
template cudaError_t launch_forward_residual_simt<__half>(const ForwardParams&);
template cudaError_t launch_forward_residual_simt<__nv_bfloat16>(const ForwardParams&);
}  // namespace kernel
}  // namespace maxsim_cuda
