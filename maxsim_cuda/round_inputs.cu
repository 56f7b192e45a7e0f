// float32 embeddings rounded for the 16-bit kernels, as torch.set_float32_matmul_precision
// allows (launch.h, RoundInputs). Torch-free.
//
// "high" keeps TF32's bargain: an 11-bit significand per input, float32 range. float16 has the
// significand but not the range, so each tensor is multiplied by a power of two first, which
// changes no significand bit. The power comes from the tensor's largest finite magnitude, and
// knowing it would cost a read of the whole tensor before the rounding pass. Embeddings are
// nearly always below 2 in magnitude and above 2^-9 at their largest, so the first pass rounds
// with the shift that suits them (2^14) while it finds the maximum, and a second launch
// re-rounds the tensor only when the maximum says that shift was wrong; the common case costs
// one pass and an empty launch. Every scaled magnitude stays below 2^15 (no float16 overflow),
// and values 2^-19 of the largest or smaller, which float16 keeps as subnormals, add at most
// 2^-25 per product: under TF32's 2^-11 relative rounding of the large ones.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "launch.h"

namespace maxsim_cuda {
namespace kernel {

constexpr int kRoundThreads = 256;
constexpr int kFirstShift = 14;

// The power of two tensor t was scaled by: 2^14 when its largest finite magnitude lies in
// [2^-9, 2), otherwise whatever brings that maximum into [2^14, 2^15). A tensor of zeros (or of
// nothing finite) keeps 2^14.
__device__ __forceinline__ int scale_shift(uint32_t amax_bits) {
  const float amax = __uint_as_float(amax_bits);
  if (amax == 0.f) return kFirstShift;
  const int e = ilogbf(amax);
  return (e >= -9 && e <= 0) ? kFirstShift : 14 - e;
}

// x * 2^shift for the shifts scale_shift gives ([-113, 163]), as two normal powers of two:
// |x| <= |x * 2^a| <= |x * 2^shift| or the reverse, so neither product rounds unless the
// result itself does (scalbnf gets the same answer through a slow path and a stack frame).
__device__ __forceinline__ float times_pow2(float x, int shift) {
  const int a = shift / 2, b = shift - a;
  return x * __int_as_float((127 + a) << 23) * __int_as_float((127 + b) << 23);
}

template <bool kBf16>
__device__ __forceinline__ uint16_t round_one(float x, int shift) {
  if constexpr (kBf16) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  } else {
    return __half_as_ushort(__float2half_rn(times_pow2(x, shift)));
  }
}

__device__ __forceinline__ float finite_abs(float x) { return isfinite(x) ? fabsf(x) : 0.f; }

// Rounds src[0, n) into dst with `shift`, four values a step where both pointers allow it;
// returns the largest finite |x| this thread saw.
template <bool kBf16>
__device__ float round_range(const float* __restrict__ src, uint16_t* __restrict__ dst, int64_t n, int shift) {
  float m = 0.f;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool vec = (reinterpret_cast<uintptr_t>(src) & 15) == 0 && (reinterpret_cast<uintptr_t>(dst) & 7) == 0;
  const int64_t n4 = vec ? n / 4 : 0;
  for (int64_t i = first; i < n4; i += stride) {
    const float4 x = reinterpret_cast<const float4*>(src)[i];
    m = fmaxf(fmaxf(m, fmaxf(finite_abs(x.x), finite_abs(x.y))), fmaxf(finite_abs(x.z), finite_abs(x.w)));
    uint2 out;
    out.x = uint32_t(round_one<kBf16>(x.x, shift)) | (uint32_t(round_one<kBf16>(x.y, shift)) << 16);
    out.y = uint32_t(round_one<kBf16>(x.z, shift)) | (uint32_t(round_one<kBf16>(x.w, shift)) << 16);
    reinterpret_cast<uint2*>(dst)[i] = out;
  }
  for (int64_t i = n4 * 4 + first; i < n; i += stride) {
    const float x = src[i];
    m = fmaxf(m, finite_abs(x));
    dst[i] = round_one<kBf16>(x, shift);
  }
  return m;
}

// Pass 1: blockIdx.y picks the tensor (by a select: indexing the parameter arrays with it
// would copy them to a stack frame); rounds it with the first shift and folds its largest
// finite magnitude into amax[t] (non-negative floats order as their bits: atomicMax on the
// bits is the float max, and order-free, so deterministic).
template <bool kBf16>
__global__ void __launch_bounds__(kRoundThreads) round_first(const RoundInputs r) {
  const int t = blockIdx.y;
  float m = round_range<kBf16>(t ? r.src[1] : r.src[0], static_cast<uint16_t*>(t ? r.dst[1] : r.dst[0]),
                               t ? r.n[1] : r.n[0], kFirstShift);
  if constexpr (!kBf16) {
    __shared__ float warp_max[kRoundThreads / 32];
    for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < kRoundThreads / 32; ++w) m = fmaxf(m, warp_max[w]);
      if (m > 0.f) atomicMax(r.amax + t, __float_as_uint(m));
    }
  }
}

// Pass 2 ("high" only): re-rounds tensor t when its maximum asks for another shift. Every
// block reads the same maximum, so the exit is uniform.
__global__ void __launch_bounds__(kRoundThreads) round_again(const RoundInputs r) {
  const int t = blockIdx.y;
  const int shift = scale_shift(r.amax[t]);
  if (shift == kFirstShift) return;
  round_range<false>(t ? r.src[1] : r.src[0], static_cast<uint16_t*>(t ? r.dst[1] : r.dst[0]),
                     t ? r.n[1] : r.n[0], shift);
}

// Scores of the scaled tensors carry 2^(shift_q + shift_d): take it out exactly.
__global__ void __launch_bounds__(kRoundThreads) unscale_scores(float* scores, int64_t n, const uint32_t* amax,
                                                                int tensors) {
  int shift = 0;
  for (int t = 0; t < tensors; ++t) shift += scale_shift(amax[t]);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    scores[i] = scalbnf(scores[i], -shift);
}

unsigned blocks_for(int64_t work, int num_sms) {
  const int64_t want = (work + kRoundThreads - 1) / kRoundThreads;
  const int64_t cap = int64_t(num_sms) * 8;
  return unsigned(want < 1 ? 1 : (want > cap ? cap : want));
}

}  // namespace kernel

cudaError_t launch_round_inputs(const RoundInputs& r) {
  using namespace kernel;
  int64_t most = 0;
  for (int t = 0; t < r.tensors; ++t) most = (r.n[t] + 3) / 4 > most ? (r.n[t] + 3) / 4 : most;
  const dim3 grid(blocks_for(most, r.num_sms), r.tensors);
  if (r.to_bf16) {
    round_first<true><<<grid, kRoundThreads, 0, r.stream>>>(r);
    return cudaGetLastError();
  }
  cudaError_t err = cudaMemsetAsync(r.amax, 0, sizeof(uint32_t) * r.tensors, r.stream);
  if (err != cudaSuccess) return err;
  round_first<false><<<grid, kRoundThreads, 0, r.stream>>>(r);
  round_again<<<grid, kRoundThreads, 0, r.stream>>>(r);
  return cudaGetLastError();
}

cudaError_t launch_unscale_scores(const RoundInputs& r, float* scores, int64_t n) {
  if (r.to_bf16 || n == 0) return cudaSuccess;
  using namespace kernel;
  unscale_scores<<<blocks_for(n, r.num_sms), kRoundThreads, 0, r.stream>>>(scores, n, r.amax, r.tensors);
  return cudaGetLastError();
}

}  // namespace maxsim_cuda
