// Backward instantiations for ColBERTv2 residual documents: grad_queries only.
#include "kernel/backward.cuh"

namespace maxsim_cuda {
namespace kernel {
template cudaError_t launch_backward_residual<__half>(const BackwardParams&);
template cudaError_t launch_backward_residual<__nv_bfloat16>(const BackwardParams&);
template cudaError_t launch_backward_residual<float>(const BackwardParams&);
}  // namespace kernel
}  // namespace maxsim_cuda
