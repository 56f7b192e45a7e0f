// Declarations of the forward launchers; each is explicitly instantiated in its own .cu
// file (per dtype / surface) so builds parallelise. Torch-free.
#pragma once

#include <cuda_runtime.h>

#include "../launch.h"

namespace maxsim_cuda {
namespace kernel {
template <class T, int SURF>
cudaError_t launch_forward_mma(const ForwardParams& p);
template <class T, int SURF>
cudaError_t launch_forward_mma_k(const ForwardParams& p);
template <class T, class Acc>
cudaError_t launch_forward_simt(const ForwardParams& p);
template <class T, DocFormat F>
cudaError_t launch_forward_compressed(const ForwardParams& p);
template <class T>
cudaError_t launch_forward_residual(const ForwardParams& p);
template <class T>
cudaError_t launch_forward_residual_simt(const ForwardParams& p);
template <class T, class Acc>
cudaError_t launch_backward_typed(const BackwardParams& p);
template <class T, DocFormat F>
cudaError_t launch_backward_compressed(const BackwardParams& p);
template <class T>
cudaError_t launch_backward_residual(const BackwardParams& p);
}  // namespace kernel
}  // namespace maxsim_cuda
