// Forward instantiation: fp16/bf16 inputs with dim > 256 (SIMT mainloop, float32 accumulation).
#include "kernel/forward_configs.cuh"

namespace maxsim_cuda {
namespace kernel {
template cudaError_t launch_forward_simt<__half, float>(const ForwardParams&);
template cudaError_t launch_forward_simt<__nv_bfloat16, float>(const ForwardParams&);
}  // namespace kernel
}  // namespace maxsim_cuda
