// Forward instantiation: float64 inputs (SIMT FFMA mainloop, float64 accumulation).
#include "kernel/forward_configs.cuh"

namespace maxsim_cuda {
namespace kernel {
template cudaError_t launch_forward_simt<double, double>(const ForwardParams&);
}  // namespace kernel
}  // namespace maxsim_cuda
