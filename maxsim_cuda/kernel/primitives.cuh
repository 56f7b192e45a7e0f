// Small PTX wrappers (sm_80+): cp.async, ldmatrix, mma.sync m16n8k16, plus scalar helpers.
// Torch-free.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace maxsim_cuda {
namespace kernel {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Programmatic dependent launch (launch_programmatic, scheduler.cuh). A grid launched with
// programmatic stream serialization may start while the stream's previous kernel still runs:
// every thread calls wait_prior_grids before its first global-memory access, which returns
// once the previous grids have finished and their writes are visible (at once after a plain
// launch). allow_dependent_grids lets the next such launch start its CTAs as this grid's leave
// the SMs, so its prologue overlaps this grid's tail. Both are sm_90 instructions; code built
// for an older target has neither, and the host then launches it plainly
// (programmatic_launch_safe).
__device__ __forceinline__ void wait_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_dependent_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// 16-byte global -> shared copy that bypasses L1 (documents are streamed once).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
// The same with zero fill: src_bytes (0 or 16) bytes are read, the rest of the 16 written as
// zeros; src_bytes = 0 reads nothing, so src may then point anywhere.
__device__ __forceinline__ void cp_async_16_zfill(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
// 4- or 8-byte global -> shared copy (through L1; .cg only takes 16 bytes); src_bytes = 0
// writes zeros and reads nothing.
template <int N>
__device__ __forceinline__ void cp_async_ca_zfill(uint32_t dst, const void* src, uint32_t src_bytes) {
  static_assert(N == 4 || N == 8, "cp.async.ca size");
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(N), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void st_shared_zero16(uint32_t dst) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(dst), "r"(0));
}
__device__ __forceinline__ void st_shared_v4(uint32_t dst, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1,
                                            uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// D = A * B + D, A 16x16 row-major (4 regs), B 16x8 "col" (2 regs), fp32 accumulators.
template <class T>
struct Mma16816;

#define MAXSIM_MMA16816(TYPE, PTX_TYPE)                                                                  \
  template <>                                                                                             \
  struct Mma16816<TYPE> {                                                                                 \
    __device__ __forceinline__ static void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,        \
                                               uint32_t b1) {                                             \
      asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." PTX_TYPE "." PTX_TYPE                         \
                   ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"              \
                   : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                       \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));                       \
    }                                                                                                     \
  };
MAXSIM_MMA16816(__half, "f16")
MAXSIM_MMA16816(__nv_bfloat16, "bf16")
#undef MAXSIM_MMA16816

// max that propagates NaN (PTX max.NaN, sm_80+), unlike fmaxf.
__device__ __forceinline__ float max_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;\n" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
// (PTX has no max.NaN.f64: a NaN operand makes the sum NaN.)
__device__ __forceinline__ double max_nan(double a, double b) { return (a != a || b != b) ? a + b : fmax(a, b); }

// Raw 16-bit loads (no conversion) for packing mma fragments.
template <class T>
__device__ __forceinline__ uint16_t ld_bits16(const T* p) {
  return __ldg(reinterpret_cast<const unsigned short*>(p));
}

// Element <-> accumulator conversions (the half types have no implicit ones in device code).
template <class Acc, class T>
__device__ __forceinline__ Acc to_acc(T v) {
  if constexpr (std::is_same_v<T, __half>) {
    return static_cast<Acc>(__half2float(v));
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return static_cast<Acc>(__bfloat162float(v));
  } else {
    return static_cast<Acc>(v);
  }
}

template <class T, class Acc>
__device__ __forceinline__ T from_acc(Acc v) {
  if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

template <class Acc>
__device__ __forceinline__ Acc neg_inf();
template <>
__device__ __forceinline__ float neg_inf<float>() {
  return -__int_as_float(0x7f800000);
}
template <>
__device__ __forceinline__ double neg_inf<double>() {
  return -__longlong_as_double(0x7ff0000000000000LL);
}
template <class Acc>
__device__ __forceinline__ Acc quiet_nan();
template <>
__device__ __forceinline__ float quiet_nan<float>() {
  return __int_as_float(0x7fc00000);
}
template <>
__device__ __forceinline__ double quiet_nan<double>() {
  return __longlong_as_double(0x7ff8000000000000LL);
}

// Inclusive prefix sum of v over the warp's lanes, lane 0 first (every lane takes part).
__device__ __forceinline__ int warp_inclusive_sum(int v, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const int y = __shfl_up_sync(0xffffffffu, v, o);
    v += lane >= o ? y : 0;
  }
  return v;
}

// Exclusive prefix of v[0, n) in place and the total in v[n] (n <= 32 * kPerLane), by one
// warp, lane l taking entries [kPerLane l, kPerLane (l + 1)); shared memory, so the caller's
// barrier publishes it.
template <int kPerLane>
__device__ __forceinline__ void warp_exclusive_prefix(int* v, int n, int lane) {
  int x[kPerLane], sum = 0;
#pragma unroll
  for (int r = 0; r < kPerLane; ++r) {
    const int s = kPerLane * lane + r;
    x[r] = s < n ? v[s] : 0;
    sum += x[r];
  }
  const int incl = warp_inclusive_sum(sum, lane);
  int run = incl - sum;
#pragma unroll
  for (int r = 0; r < kPerLane; ++r) {
    const int s = kPerLane * lane + r;
    if (s < n) v[s] = run;
    run += x[r];
  }
  if (lane == 31) v[n] = incl;
}

// The value lane 0 holds, for every lane: ptxas then treats it as warp-uniform, so a branch
// on it needs no divergence bookkeeping (BSSY / BSYNC) and, around wgmma, no serialisation
// (see hopper_consume). For values every lane already holds alike, e.g. a broadcast read.
template <class V>
__device__ __forceinline__ V uniform(V v) {
  return __shfl_sync(0xffffffffu, v, 0);
}

}  // namespace kernel
}  // namespace maxsim_cuda
