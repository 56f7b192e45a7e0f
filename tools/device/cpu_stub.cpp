// Fallback used only by tools/device/check_cuda.sh when the CPU backend does not build
// yet: defines the maxsim_cpu entry points as errors so the CUDA ops can still be tested.
#include <torch/library.h>

#include "torch_binding.h"

#define MAXSIM_STUB TORCH_CHECK(false, "maxsim: CPU backend stubbed out in this test build")

namespace maxsim_cpu {
std::tuple<at::Tensor, at::Tensor> padded_forward(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                  const at::Tensor&, bool) { MAXSIM_STUB; }
std::tuple<at::Tensor, at::Tensor> contrastive_forward(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                       const std::optional<at::Tensor>&, bool) { MAXSIM_STUB; }
std::tuple<at::Tensor, at::Tensor> packed_forward(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                  const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
                                                  bool) { MAXSIM_STUB; }
std::tuple<at::Tensor, at::Tensor> padded_backward(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                   const at::Tensor&, const at::Tensor&, const at::Tensor&, bool,
                                                   bool) { MAXSIM_STUB; }
std::tuple<at::Tensor, at::Tensor> contrastive_backward(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                        const at::Tensor&, const std::optional<at::Tensor>&,
                                                        const at::Tensor&, bool, bool) { MAXSIM_STUB; }
std::tuple<at::Tensor, at::Tensor> packed_backward(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                   const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                   const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                   const at::Tensor&, const at::Tensor&, const at::Tensor&, bool,
                                                   bool) { MAXSIM_STUB; }
}  // namespace maxsim_cpu
