// Forward instantiation: fp16 inputs, contrastive surface over padded documents, tensor-core mainloop.
#include "kernel/forward_configs.cuh"

namespace maxsim_cuda {
namespace kernel {
template cudaError_t launch_forward_mma<__half, 3>(const ForwardParams&);
}  // namespace kernel
}  // namespace maxsim_cuda
