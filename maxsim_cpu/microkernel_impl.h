// The float32 hot loop, included once per instruction set by microkernel.cpp inside
// its own namespace and target pragma (no include guard on purpose). GCC lowers
// vector compares in a function for that function's own target, so the whole tile,
// not just its caller, has to be compiled under the target; hence an include, not an
// always_inline template called from target-attributed wrappers.
//
// A register tile of [R document rows x NV*W query columns] is filled by broadcasting
// one document element against W-wide query vectors per FMA, then folded into the
// running max "vertically" (lane = query token): no horizontal reductions and no
// similarity matrix beyond the tile. Expects the tile shape kW, kR, kNV in the
// enclosing namespace.

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
                              int32_t* arg, const float* scale) {
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
    // Prefetch the next row group, as in microkernel_avx512.h (4*R bytes per k-step).
    const uintptr_t next = reinterpret_cast<uintptr_t>(doc + (r0 + R) * ldd);
    const float* q = qT;
    for (int64_t k = 0; k < dim; ++k, q += ldq) {
      __builtin_prefetch(reinterpret_cast<const void*>(next + 4 * R * k));
      F qv[NV];
      for (int v = 0; v < NV; ++v) qv[v] = load<F>(q + v * W);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const float x = rows[r][k];
        for (int v = 0; v < NV; ++v) acc[r][v] += qv[v] * x;
      }
    }
    if (scale) {
      for (int r = 0; r < R; ++r) {
        const float x = scale[std::min<int64_t>(r0 + r, nrows - 1)];
        for (int v = 0; v < NV; ++v) acc[r][v] *= x;
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

void sweep_entry(const SweepArgs& a) {
  int64_t c = 0;
  static_assert(kColumnQuantum % (kNV * kW) == 0, "a tile must divide the column padding");
  for (; c < a.ncols; c += kNV * kW)
    sweep_tile<kW, kR, kNV>(a.qT + c, a.ldq, a.dim, a.doc, a.ldd, a.nrows, a.j0, a.best + c,
                            a.arg + c, a.scale);
}

template <class S, float (*Conv)(uint16_t)>
MAXSIM_INLINE void widen_body(const S* src, float* dst, int64_t n) {
  const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = Conv(s[i]);
}

void widen_half_entry(const Half* s, float* d, int64_t n) {
  widen_body<Half, half_bits_to_float>(s, d, n);
}
void widen_bf16_entry(const BFloat16* s, float* d, int64_t n) {
  widen_body<BFloat16, bf16_bits_to_float>(s, d, n);
}
