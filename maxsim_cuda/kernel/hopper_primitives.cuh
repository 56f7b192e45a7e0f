// Small PTX wrappers for Hopper (sm_90a only): warpgroup MMA (wgmma.mma_async m64nNk16,
// fp16/bf16 in, fp32 accumulators in registers) with its fences and commit/wait groups,
// shared-memory matrix descriptors for the 128-byte swizzle, mbarriers, and TMA tile loads
// (cp.async.bulk.tensor) that complete on an mbarrier.
//
// MAXSIM_HAS_WGMMA is 1 only in the device pass for an sm_90a target. Every other pass
// (host, sm_80/86/89, plain sm_90, PTX JIT from an older target) compiles these wrappers to
// nothing or __trap(), and the host never launches them there:
// wgmma_compiled_for_current_device() asks the loaded module which code the device got.
// Torch-free.
#pragma once

#include <cuda.h>  // CUtensorMap (a plain struct; nothing here calls the driver)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MAXSIM_HAS_WGMMA 1
#else
#define MAXSIM_HAS_WGMMA 0
#endif

namespace maxsim_cuda {
namespace kernel {

// ---- mbarriers (shared-memory addresses) ----

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
#if MAXSIM_HAS_WGMMA
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}
// Makes the initialised barriers visible to the async proxy (TMA completes on them).
__device__ __forceinline__ void fence_mbar_init() {
#if MAXSIM_HAS_WGMMA
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
#if MAXSIM_HAS_WGMMA
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}
// One arrival that also announces `bytes` of TMA traffic the phase must wait for.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#if MAXSIM_HAS_WGMMA
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
// Announces `bytes` of TMA traffic without arriving: the phase still waits for the arrival,
// which can then come later (after the slot's TileInfo is written).
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
#if MAXSIM_HAS_WGMMA
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
// Spins until the phase with this parity has completed. A fresh barrier counts its
// "previous" phase (parity 1) as complete, which is how a producer's first pass through
// the empty barriers of a ring goes straight through.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
#if MAXSIM_HAS_WGMMA
  asm volatile(
      "{\n.reg .pred done;\n"
      "MAXSIM_MBAR_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra MAXSIM_MBAR_WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
#endif
}

// ---- TMA ----

// Box (x = column, y = row) of the 2-D tensor `map` describes into shared memory at dst,
// completing `bar`'s transaction bytes. Out-of-range rows and columns arrive as zeros.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int x, int y) {
#if MAXSIM_HAS_WGMMA
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(x), "r"(y)
      : "memory");
#endif
}

// Box of `map`'s rank-1 tensor starting at element x (zeros past its end).
__device__ __forceinline__ void tma_load_1d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int x) {
#if MAXSIM_HAS_WGMMA
  asm volatile(
      "cp.async.bulk.tensor.1d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(x)
      : "memory");
#endif
}

// Orders this thread's generic shared-memory accesses before later async-proxy ones: its
// st.shared writes before wgmma reads them, its ld.shared reads before a TMA overwrites them.
__device__ __forceinline__ void fence_proxy_async() {
#if MAXSIM_HAS_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Releases a TMA-filled buffer (a ring slot, a query buffer) that this thread read with
// ld.shared: the producer's next TMA into it is an async-proxy write, which only the proxy
// fence orders after the reads. Without it the byte kernel scored 16 of 960 calls from bytes
// already overwritten (H100, 2026-11-26; maxsim_cuda/NOTES.md).
__device__ __forceinline__ void release_after_reads(uint32_t bar) {
  fence_proxy_async();
  mbar_arrive(bar);
}

// Brings a tensor map (a __grid_constant__ parameter) into the TMA unit's descriptor cache
// ahead of its first load, which otherwise waits for that fetch.
__device__ __forceinline__ void prefetch_tensormap(const CUtensorMap* map) {
#if MAXSIM_HAS_WGMMA
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
#endif
}

// Named barrier for a subset of the CTA's warps (id 0 is __syncthreads).
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---- wgmma ----

// Orders this warpgroup's earlier register and shared-memory accesses before the wgmma ops
// that follow (needed before the first wgmma of a batch).
__device__ __forceinline__ void wgmma_fence() {
#if MAXSIM_HAS_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if MAXSIM_HAS_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most N committed wgmma groups of this warpgroup are still running.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if MAXSIM_HAS_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

// Keeps the compiler from moving accesses of an accumulator register across a wgmma fence
// or wait (the hardware writes it asynchronously, which the compiler cannot see).
__device__ __forceinline__ void fence_register(float& r) { asm volatile("" : "+f"(r)::"memory"); }
template <int NT>
__device__ __forceinline__ void fence_registers(float (&acc)[NT][4]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) fence_register(acc[nt][e]);
}

// Descriptor of a K-major operand in the 128-byte swizzle layout (what TMA writes with
// CU_TENSOR_MAP_SWIZZLE_128B): rows of 64 16-bit elements (128 B), row r at byte r * 128
// from a 1024-byte aligned base, its 16-byte chunk c stored at chunk c ^ (r % 8). `addr` may
// sit 32, 64 or 96 bytes past a row start (the k16 steps inside the 64 columns); the
// swizzle is applied to the absolute address, so the base offset field stays 0.
//   bits 0-13: address / 16; 16-29: leading byte offset / 16 (unused for swizzled K-major,
//   1 by convention); 32-45: stride byte offset / 16 (1024: between 8-row groups);
//   62-63: layout (1 = 128-byte swizzle).
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr) {
  return (uint64_t((addr & 0x3FFFF) >> 4)) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}

// D[64 x N] (+)= A[64 x 16] * B[N x 16]^T, both operands K-major in shared memory, issued by
// one warpgroup. d[nt][2*h + e] holds row (warp % 4) * 16 + lane / 4 + 8 * h, column
// nt * 8 + 2 * (lane % 4) + e: per 8-column block, the mma.sync m16n8 accumulator layout.
// accumulate == 0 overwrites D (first k-step). d may be longer than N / 8 blocks (a narrow
// MMA into the front of a wide accumulator).
template <class T, int N>
struct WgmmaM64;

#if MAXSIM_HAS_WGMMA
#define MAXSIM_WGMMA_N64(PTX_TYPE)                                                              \
  asm volatile(                                                                                  \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                          \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." PTX_TYPE "." PTX_TYPE " "                    \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "  \
      "%32, %33, p, 1, 1, 0, 0;\n}\n"                                                      \
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),  \
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),  \
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),  \
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),  \
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),  \
        "+f"(d[7][2]), "+f"(d[7][3]) \
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));

#define MAXSIM_WGMMA_N32(PTX_TYPE)                                                              \
  asm volatile(                                                                                  \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                          \
      "wgmma.mma_async.sync.aligned.m64n32k16.f32." PTX_TYPE "." PTX_TYPE " "                    \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "  \
      "%16, %17, p, 1, 1, 0, 0;\n}\n"                                                      \
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),  \
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),  \
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]) \
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));

#define MAXSIM_WGMMA_N128(PTX_TYPE)                                                              \
  asm volatile(                                                                                  \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                          \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." PTX_TYPE "." PTX_TYPE " "                    \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "  \
      "%64, %65, p, 1, 1, 0, 0;\n}\n"                                                      \
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),  \
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),  \
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),  \
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),  \
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),  \
        "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),  \
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),  \
        "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),  \
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]),  \
        "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),  \
        "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]) \
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));

#else
#define MAXSIM_WGMMA_N32(PTX_TYPE) __trap();
#define MAXSIM_WGMMA_N64(PTX_TYPE) __trap();
#define MAXSIM_WGMMA_N128(PTX_TYPE) __trap();
#endif

#define MAXSIM_WGMMA_STRUCT(TYPE, PTX_TYPE, N)                                                           \
  template <>                                                                                            \
  struct WgmmaM64<TYPE, N> {                                                                             \
    template <int NT>                                                                                    \
    __device__ __forceinline__ static void run(float (&d)[NT][4], uint64_t desc_a, uint64_t desc_b,      \
                                               int accumulate) {                                         \
      static_assert(NT >= N / 8, "accumulator too small");                                              \
      MAXSIM_WGMMA_N##N(PTX_TYPE)                                                                        \
    }                                                                                                    \
  };
MAXSIM_WGMMA_STRUCT(__half, "f16", 32)
MAXSIM_WGMMA_STRUCT(__half, "f16", 64)
MAXSIM_WGMMA_STRUCT(__half, "f16", 128)
MAXSIM_WGMMA_STRUCT(__nv_bfloat16, "bf16", 32)
MAXSIM_WGMMA_STRUCT(__nv_bfloat16, "bf16", 64)
MAXSIM_WGMMA_STRUCT(__nv_bfloat16, "bf16", 128)
#undef MAXSIM_WGMMA_STRUCT
#undef MAXSIM_WGMMA_N32
#undef MAXSIM_WGMMA_N64
#undef MAXSIM_WGMMA_N128

// D[64 x N] (+)= A[64 x 16] * B[N x 16]^T with A in registers (four 32-bit registers of
// 16-bit pairs in the mma.sync m16n8k16 A layout, per warp of the group: rows (warp % 4) * 16
// + lane / 4 (+ 8), columns 2 * (lane % 4) (+ 8)) and B K-major in shared memory.
template <class T, int N>
struct WgmmaM64RegA;

#if MAXSIM_HAS_WGMMA
#define MAXSIM_WGMMA_RA_N32(PTX_TYPE)                                                                  \
  asm volatile(                                                                                        \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"                                                      \
      "wgmma.mma_async.sync.aligned.m64n32k16.f32." PTX_TYPE "." PTX_TYPE " "                          \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "                       \
      "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"                                                     \
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),        \
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),        \
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])                                      \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
#define MAXSIM_WGMMA_RA_N64(PTX_TYPE)                                                                  \
  asm volatile(                                                                                        \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                      \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." PTX_TYPE "." PTX_TYPE " "                          \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
      "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "                                       \
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"                                                     \
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),        \
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),        \
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),        \
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),        \
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),        \
        "+f"(d[7][2]), "+f"(d[7][3])                                                                    \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
#else
#define MAXSIM_WGMMA_RA_N32(PTX_TYPE) __trap();
#define MAXSIM_WGMMA_RA_N64(PTX_TYPE) __trap();
#endif

#define MAXSIM_WGMMA_RA_STRUCT(TYPE, PTX_TYPE, N)                                                   \
  template <>                                                                                       \
  struct WgmmaM64RegA<TYPE, N> {                                                                    \
    __device__ __forceinline__ static void run(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t desc_b, \
                                               int accumulate) {                                    \
      MAXSIM_WGMMA_RA_N##N(PTX_TYPE)                                                                \
    }                                                                                               \
  };
MAXSIM_WGMMA_RA_STRUCT(__half, "f16", 32)
MAXSIM_WGMMA_RA_STRUCT(__half, "f16", 64)
MAXSIM_WGMMA_RA_STRUCT(__nv_bfloat16, "bf16", 32)
MAXSIM_WGMMA_RA_STRUCT(__nv_bfloat16, "bf16", 64)
#undef MAXSIM_WGMMA_RA_STRUCT
#undef MAXSIM_WGMMA_RA_N32
#undef MAXSIM_WGMMA_RA_N64

// Never launched: its static shared memory is 0 bytes only in code built with wgmma, so
// cudaFuncGetAttributes tells the host which code the module loaded for the device.
template <int>
__global__ void wgmma_code_marker_kernel() {
#if !MAXSIM_HAS_WGMMA
  __shared__ volatile int no_wgmma_here;
  no_wgmma_here = 1;
#endif
}

// Host: true when the current device is compute capability 9.0 and the module holds sm_90a
// code for it (a build without the 9.0a target, or PTX JIT from an older one, does not).
// Cached per device; no synchronisation, so it is safe during graph capture.
inline bool wgmma_compiled_for_current_device() {
  static int cache[64] = {0};  // 0 unknown, 1 yes, 2 no
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  int& c = cache[dev & 63];
  if (c == 0) {
    int major = 0, minor = 0;
    cudaFuncAttributes attr{};
    const bool yes = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                     cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
                     major == 9 && minor == 0 &&
                     cudaFuncGetAttributes(&attr, wgmma_code_marker_kernel<0>) == cudaSuccess &&
                     attr.sharedSizeBytes == 0;
    c = yes ? 1 : 2;
  }
  return c == 1;
}

}  // namespace kernel
}  // namespace maxsim_cuda
