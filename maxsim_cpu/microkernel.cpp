// The float32 hot loop: a register tile of [R document rows x NV*W query columns],
// filled by broadcasting one document element against W-wide query vectors per FMA,
// then folded into the running max "vertically" (lane = query token), so no
// horizontal reductions and no similarity matrix beyond the tile.
//
// Written with GCC/Clang vector extensions and compiled per instruction set through
// target_clones; no -march flag is needed and the binary runs on any x86-64 / arm64.
#include "maxsim_cpu/microkernel.h"

#include <algorithm>

#if defined(__x86_64__) && !defined(__APPLE__) && defined(__GNUC__)
#define MAXSIM_CLONES __attribute__((target_clones("avx512f", "avx2,fma", "default")))
#define MAXSIM_HAS_CLONES 1
#else
#define MAXSIM_CLONES
#define MAXSIM_HAS_CLONES 0
#endif
#define MAXSIM_INLINE inline __attribute__((always_inline))

namespace maxsim_cpu {
namespace {

template <int W> struct Vec {
  typedef float F __attribute__((vector_size(W * 4)));
  typedef int32_t I __attribute__((vector_size(W * 4)));
};

template <class V> MAXSIM_INLINE V load(const void* p) {
  V v;
  __builtin_memcpy(&v, p, sizeof(V));
  return v;
}
template <class V> MAXSIM_INLINE void store(void* p, V v) { __builtin_memcpy(p, &v, sizeof(V)); }

// Columns [0, NV*W) of qT against all document rows. Rows past the end are served by
// re-reading the last row: a duplicate can never beat the original under strict >
// (and a NaN duplicate finds the lane already NaN), so tails need no masking.
template <int W, int R, int NV>
MAXSIM_INLINE void sweep_tile(const float* qT, int64_t ldq, int64_t dim, const float* doc,
                              int64_t ldd, int64_t nrows, int32_t j0, float* best,
                              int32_t* arg) {
  using F = typename Vec<W>::F;
  using I = typename Vec<W>::I;
  F bv[NV];
  I av[NV];
  for (int v = 0; v < NV; ++v) {
    bv[v] = load<F>(best + v * W);
    av[v] = load<I>(arg + v * W);
  }
  for (int64_t r0 = 0; r0 < nrows; r0 += R) {
    const float* rows[R];
    for (int r = 0; r < R; ++r) rows[r] = doc + std::min<int64_t>(r0 + r, nrows - 1) * ldd;
    F acc[R][NV];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < NV; ++v) acc[r][v] = F{};
    const float* q = qT;
    for (int64_t k = 0; k < dim; ++k, q += ldq) {
      F qv[NV];
      for (int v = 0; v < NV; ++v) qv[v] = load<F>(q + v * W);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const float x = rows[r][k];
        for (int v = 0; v < NV; ++v) acc[r][v] += qv[v] * x;
      }
    }
    for (int r = 0; r < R; ++r) {
      const I j = I{} + int32_t(j0 + r0 + r);
      for (int v = 0; v < NV; ++v) {
        const F s = acc[r][v];
        // (s > best) || (isnan(s) && !isnan(best)): NaN wins, first NaN is kept.
        const I take = (s > bv[v]) | ((s != s) & (bv[v] == bv[v]));
        bv[v] = (F)(((I)s & take) | ((I)bv[v] & ~take));
        av[v] = (j & take) | (av[v] & ~take);
      }
    }
  }
  for (int v = 0; v < NV; ++v) {
    store(best + v * W, bv[v]);
    store(arg + v * W, av[v]);
  }
}

bool use_wide_tiles() {
#if MAXSIM_HAS_CLONES
  static const bool wide = __builtin_cpu_supports("avx512f");
  return wide;
#else
  return false;
#endif
}

MAXSIM_CLONES void sweep_impl(const SweepArgs& a, bool wide) {
  int64_t c = 0;
  if (wide) {  // 16 zmm accumulators: 8 rows x 32 columns
    for (; c + 32 <= a.ncols; c += 32)
      sweep_tile<16, 8, 2>(a.qT + c, a.ldq, a.dim, a.doc, a.ldd, a.nrows, a.j0, a.best + c,
                           a.arg + c);
    for (; c < a.ncols; c += 16)
      sweep_tile<16, 8, 1>(a.qT + c, a.ldq, a.dim, a.doc, a.ldd, a.nrows, a.j0, a.best + c,
                           a.arg + c);
  } else {  // 12 ymm (or 24 xmm/NEON) accumulators: 6 rows x 16 columns
    for (; c < a.ncols; c += 16)
      sweep_tile<8, 6, 2>(a.qT + c, a.ldq, a.dim, a.doc, a.ldd, a.nrows, a.j0, a.best + c,
                          a.arg + c);
  }
}

template <class S, float (*Conv)(uint16_t)>
MAXSIM_INLINE void widen_impl(const S* src, float* dst, int64_t n) {
  const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = Conv(s[i]);
}

MAXSIM_CLONES void widen_half(const Half* src, float* dst, int64_t n) {
  widen_impl<Half, half_bits_to_float>(src, dst, n);
}
MAXSIM_CLONES void widen_bf16(const BFloat16* src, float* dst, int64_t n) {
  widen_impl<BFloat16, bf16_bits_to_float>(src, dst, n);
}

}  // namespace

void sweep(const SweepArgs& a) {
  if (a.nrows <= 0 || a.ncols <= 0) return;
  sweep_impl(a, use_wide_tiles());
}

void widen(const Half* src, float* dst, int64_t n) { widen_half(src, dst, n); }
void widen(const BFloat16* src, float* dst, int64_t n) { widen_bf16(src, dst, n); }

}  // namespace maxsim_cpu
