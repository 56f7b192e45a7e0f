// Backward instantiations for every dtype.
#include "kernel/backward.cuh"

namespace maxsim_cuda {
namespace kernel {
template cudaError_t launch_backward_typed<__half, float>(const BackwardParams&);
template cudaError_t launch_backward_typed<__nv_bfloat16, float>(const BackwardParams&);
template cudaError_t launch_backward_typed<float, float>(const BackwardParams&);
template cudaError_t launch_backward_typed<double, double>(const BackwardParams&);
}  // namespace kernel
}  // namespace maxsim_cuda
