// launch_forward / launch_backward: pick the instantiation for dtype, dim and surface.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernel/hopper_launch.cuh"  // hopper_streamed_wanted (host side)
#include "kernel/forward_launch.cuh"
#include "launch.h"

namespace maxsim_cuda {

namespace {
template <class T>
cudaError_t forward_mma(const ForwardParams& p) {
  switch (p.surface) {
    case Surface::kPadded: return kernel::launch_forward_mma<T, 0>(p);
    case Surface::kContrastive: return kernel::launch_forward_mma<T, 1>(p);
    case Surface::kContrastivePadded: return kernel::launch_forward_mma<T, 3>(p);
    default: return kernel::launch_forward_mma<T, 2>(p);
  }
}

// dim > 256, and contrastive dim > 128 on sm_90a: the K-streaming launchers (any dim).
template <class T>
cudaError_t forward_mma_k(const ForwardParams& p) {
  switch (p.surface) {
    case Surface::kPadded: return kernel::launch_forward_mma_k<T, 0>(p);
    case Surface::kContrastive: return kernel::launch_forward_mma_k<T, 1>(p);
    case Surface::kContrastivePadded: return kernel::launch_forward_mma_k<T, 3>(p);
    default: return kernel::launch_forward_mma_k<T, 2>(p);
  }
}

template <class T>
cudaError_t forward_half(const ForwardParams& p) {
  if (p.dim <= 256 && !kernel::hopper_streamed_wanted(p)) return forward_mma<T>(p);
  return forward_mma_k<T>(p);
}

// Compressed documents: one launcher per (query dtype, format), every surface and dim.
template <DocFormat F>
cudaError_t forward_compressed(const ForwardParams& p) {
  switch (p.dtype) {
    case DType::kF16: return kernel::launch_forward_compressed<__half, F>(p);
    case DType::kBF16: return kernel::launch_forward_compressed<__nv_bfloat16, F>(p);
    case DType::kF32: return kernel::launch_forward_compressed<float, F>(p);
    default: return cudaErrorInvalidValue;
  }
}
template <DocFormat F>
cudaError_t backward_compressed(const BackwardParams& p) {
  switch (p.dtype) {
    case DType::kF16: return kernel::launch_backward_compressed<__half, F>(p);
    case DType::kBF16: return kernel::launch_backward_compressed<__nv_bfloat16, F>(p);
    case DType::kF32: return kernel::launch_backward_compressed<float, F>(p);
    default: return cudaErrorInvalidValue;
  }
}
}  // namespace

cudaError_t launch_forward(const ForwardParams& p) {
  if (p.pairs <= 0) return cudaSuccess;
  if (p.doc_format == DocFormat::kResidual) {
    // the tensor-core decode (mainloop_mma.cuh) copies centroid rows as they are and takes
    // dim <= 256; everything else decodes on the FFMA path
    const bool tensor_cores = residual_rows_of(p.residual, p.dtype) && p.dim <= 256;
    switch (p.dtype) {
      case DType::kF16:
        return tensor_cores ? kernel::launch_forward_residual<__half>(p) : kernel::launch_forward_residual_simt<__half>(p);
      case DType::kBF16:
        return tensor_cores ? kernel::launch_forward_residual<__nv_bfloat16>(p)
                            : kernel::launch_forward_residual_simt<__nv_bfloat16>(p);
      case DType::kF32: return kernel::launch_forward_residual_simt<float>(p);
      default: return cudaErrorInvalidValue;  // checks.h refuses float64 queries first
    }
  }
  if (p.doc_format == DocFormat::kInt8) return forward_compressed<DocFormat::kInt8>(p);
  if (p.doc_format == DocFormat::kE4M3) return forward_compressed<DocFormat::kE4M3>(p);
  switch (p.dtype) {
    case DType::kF16: return forward_half<__half>(p);
    case DType::kBF16: return forward_half<__nv_bfloat16>(p);
    case DType::kF32: return kernel::launch_forward_simt<float, float>(p);
    case DType::kF64: return kernel::launch_forward_simt<double, double>(p);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_backward(const BackwardParams& p) {
  if (p.pairs <= 0) return cudaSuccess;
  if (p.doc_format == DocFormat::kResidual) {
    if (p.dtype == DType::kF16) return kernel::launch_backward_residual<__half>(p);
    if (p.dtype == DType::kBF16) return kernel::launch_backward_residual<__nv_bfloat16>(p);
    if (p.dtype == DType::kF32) return kernel::launch_backward_residual<float>(p);
    return cudaErrorInvalidValue;  // checks.h refuses float64 queries first
  }
  if (p.doc_format == DocFormat::kInt8) return backward_compressed<DocFormat::kInt8>(p);
  if (p.doc_format == DocFormat::kE4M3) return backward_compressed<DocFormat::kE4M3>(p);
  switch (p.dtype) {
    case DType::kF16: return kernel::launch_backward_typed<__half, float>(p);
    case DType::kBF16: return kernel::launch_backward_typed<__nv_bfloat16, float>(p);
    case DType::kF32: return kernel::launch_backward_typed<float, float>(p);
    case DType::kF64: return kernel::launch_backward_typed<double, double>(p);
  }
  return cudaErrorInvalidValue;
}

}  // namespace maxsim_cuda
