// launch_forward / launch_backward: pick the instantiation for dtype, dim and surface.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernel/forward_launch.cuh"
#include "launch.h"

namespace maxsim_cuda {

namespace {
template <class T>
cudaError_t forward_mma(const ForwardParams& p) {
  switch (p.surface) {
    case Surface::kPadded: return kernel::launch_forward_mma<T, 0>(p);
    case Surface::kContrastive: return kernel::launch_forward_mma<T, 1>(p);
    default: return kernel::launch_forward_mma<T, 2>(p);
  }
}
}  // namespace

cudaError_t launch_forward(const ForwardParams& p) {
  if (p.pairs <= 0) return cudaSuccess;
  switch (p.dtype) {
    case DType::kF16: return p.dim <= 256 ? forward_mma<__half>(p) : kernel::launch_forward_simt<__half, float>(p);
    case DType::kBF16:
      return p.dim <= 256 ? forward_mma<__nv_bfloat16>(p) : kernel::launch_forward_simt<__nv_bfloat16, float>(p);
    case DType::kF32: return kernel::launch_forward_simt<float, float>(p);
    case DType::kF64: return kernel::launch_forward_simt<double, double>(p);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_backward(const BackwardParams& p) {
  if (p.pairs <= 0) return cudaSuccess;
  switch (p.dtype) {
    case DType::kF16: return kernel::launch_backward_typed<__half, float>(p);
    case DType::kBF16: return kernel::launch_backward_typed<__nv_bfloat16, float>(p);
    case DType::kF32: return kernel::launch_backward_typed<float, float>(p);
    case DType::kF64: return kernel::launch_backward_typed<double, double>(p);
  }
  return cudaErrorInvalidValue;
}

}  // namespace maxsim_cuda
