// AVX-512 tile in intrinsics (GCC's register allocation of the vector-extension tile
// spilled a query vector here). Included by microkernel.cpp twice, inside target
// pragmas: with kBf16 = false (float32 FMA; needs AVX512F/DQ/BW/VL) and with
// kBf16 = true (vdpbf16ps; additionally AVX512_BF16). No include guard on purpose.
//
// vdpbf16ps adds two exact float32 products per lane per instruction (twice the FMA
// rate) and reads bfloat16 documents in place: a document's elements (2k, 2k+1) form
// one dword broadcast against the query packed as [dim/2][ldq] dwords. It treats
// denormals (|x| < 1.2e-38, as inputs or partial sums) as zero; nothing else differs
// from float32 FMAs but the summation order within a pair of k.
//
// Same contract as the vector-extension tile in microkernel_impl.h: an [R x 16*NV]
// accumulator tile, then a vertical running max (strict >, NaN wins, first index
// kept), rows past the end re-reading the last row.

template <int R, int NV>
MAXSIM_INLINE void tile512(const void* qT_, int64_t ldq, int64_t ksteps, const void* doc_,
                           int64_t ldd, int64_t nrows, int32_t j0, float* best, int32_t* arg,
                           const float* scale) {
  // One k-step is one float32 element, or one bfloat16 pair (4 bytes either way).
  const char* qT = static_cast<const char*>(qT_);
  const char* doc = static_cast<const char*>(doc_);
  const int64_t row_bytes = ldd * (kBf16 ? 2 : 4);
  __m512 bv[NV];
  __m512i av[NV];
  for (int v = 0; v < NV; ++v) {
    bv[v] = _mm512_loadu_ps(best + 16 * v);
    av[v] = _mm512_loadu_si512(arg + 16 * v);
  }
  for (int64_t r0 = 0; r0 < nrows; r0 += R) {
    const char* rows[R];
    for (int r = 0; r < R; ++r) rows[r] = doc + std::min<int64_t>(r0 + r, nrows - 1) * row_bytes;
    __m512 acc[R][NV];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
    // The R rows are R strided streams that the hardware prefetcher follows poorly
    // once rows reach ~512 bytes (1.5-2x slower); pull the next group into L1 while
    // this one computes: 4*R bytes per k-step cover R rows of dim elements. (Past the
    // last row this touches addresses beyond the data; a prefetch never faults.)
    const uintptr_t next = reinterpret_cast<uintptr_t>(doc) + (r0 + R) * row_bytes;
    const char* q = qT;
    for (int64_t k = 0; k < ksteps; ++k, q += ldq * 4) {
      _mm_prefetch(reinterpret_cast<const char*>(next + 4 * R * k), _MM_HINT_T0);
      __m512 qv[NV];
      for (int v = 0; v < NV; ++v) qv[v] = _mm512_loadu_ps(reinterpret_cast<const float*>(q) + 16 * v);
      for (int r = 0; r < R; ++r) {
        float x;
        __builtin_memcpy(&x, rows[r] + 4 * k, 4);
        const __m512 xv = _mm512_set1_ps(x);
        for (int v = 0; v < NV; ++v) {
          if constexpr (kBf16)
            acc[r][v] = _mm512_dpbf16_ps(acc[r][v], (__m512bh)_mm512_castps_si512(qv[v]),
                                         (__m512bh)_mm512_castps_si512(xv));
          else
            acc[r][v] = _mm512_fmadd_ps(qv[v], xv, acc[r][v]);
        }
      }
    }
    if (scale) {
      for (int r = 0; r < R; ++r) {
        const __m512 x = _mm512_set1_ps(scale[std::min<int64_t>(r0 + r, nrows - 1)]);
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_mul_ps(acc[r][v], x);
      }
    }
    for (int r = 0; r < R; ++r) {
      const __m512i j = _mm512_set1_epi32(j0 + int32_t(r0 + r));
      for (int v = 0; v < NV; ++v) {
        const __m512 s = acc[r][v];
        const __mmask16 take = _mm512_cmp_ps_mask(s, bv[v], _CMP_GT_OQ) |
                               (_mm512_cmp_ps_mask(s, s, _CMP_UNORD_Q) &
                                _mm512_cmp_ps_mask(bv[v], bv[v], _CMP_ORD_Q));
        bv[v] = _mm512_mask_mov_ps(bv[v], take, s);
        av[v] = _mm512_mask_mov_epi32(av[v], take, j);
      }
    }
  }
  for (int v = 0; v < NV; ++v) {
    _mm512_storeu_ps(best + 16 * v, bv[v]);
    _mm512_storeu_si512(arg + 16 * v, av[v]);
  }
}

// Columns in chunks of 32 (16 zmm accumulators: 8 rows x 32 columns), then one of 16.
inline void sweep512(const void* qT, int64_t ldq, int64_t ncols, int64_t ksteps, const void* doc,
                     int64_t ldd, int64_t nrows, int32_t j0, float* best, int32_t* arg,
                     const float* scale = nullptr) {
  const char* q = static_cast<const char*>(qT);
  int64_t c = 0;
  for (; c + 32 <= ncols; c += 32)
    tile512<8, 2>(q + 4 * c, ldq, ksteps, doc, ldd, nrows, j0, best + c, arg + c, scale);
  for (; c < ncols; c += 16)
    tile512<8, 1>(q + 4 * c, ldq, ksteps, doc, ldd, nrows, j0, best + c, arg + c, scale);
}
