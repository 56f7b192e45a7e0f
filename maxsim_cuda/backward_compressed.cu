// Backward instantiations for compressed documents (int8, float8 e4m3fn): grad_queries only.
#include "kernel/backward.cuh"

namespace maxsim_cuda {
namespace kernel {
template cudaError_t launch_backward_compressed<__half, DocFormat::kInt8>(const BackwardParams&);
template cudaError_t launch_backward_compressed<__half, DocFormat::kE4M3>(const BackwardParams&);
template cudaError_t launch_backward_compressed<__nv_bfloat16, DocFormat::kInt8>(const BackwardParams&);
template cudaError_t launch_backward_compressed<__nv_bfloat16, DocFormat::kE4M3>(const BackwardParams&);
template cudaError_t launch_backward_compressed<float, DocFormat::kInt8>(const BackwardParams&);
template cudaError_t launch_backward_compressed<float, DocFormat::kE4M3>(const BackwardParams&);
}  // namespace kernel
}  // namespace maxsim_cuda
