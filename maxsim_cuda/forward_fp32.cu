// Forward instantiation: float32 inputs (SIMT FFMA mainloop, float32 accumulation).
#include "kernel/forward_configs.cuh"

namespace maxsim_cuda {
namespace kernel {
template cudaError_t launch_forward_simt<float, float>(const ForwardParams&);
}  // namespace kernel
}  // namespace maxsim_cuda
