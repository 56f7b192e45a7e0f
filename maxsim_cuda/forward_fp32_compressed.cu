// Forward instantiations: float32 queries, int8 and float8 e4m3fn documents with row scales
// (SIMT FFMA mainloop, float32 accumulation; every surface).
#include "kernel/forward_configs.cuh"

namespace maxsim_cuda {
namespace kernel {
template cudaError_t launch_forward_compressed<float, DocFormat::kInt8>(const ForwardParams&);
template cudaError_t launch_forward_compressed<float, DocFormat::kE4M3>(const ForwardParams&);
}  // namespace kernel
}  // namespace maxsim_cuda
