// grad_documents for many entries a row (in-batch training; backward_documents.cuh says
// which kernel takes a call). Rows [j0, j0 + R) of one document are owned by one CTA. It
// reads the document's entries in batches, in entry order, and sorts each batch's hits by
// the row they land on (a stable counting sort in shared memory: counts per (warp, row),
// then each warp places its hits in entry order). In each batch warp w takes a contiguous
// block of rows holding about an eighth of the hits, one contiguous run of the sorted list
// (batch_rows), and streams that run with several
// gathers in flight whatever rows they belong to, adding g_p * q_i into one register quad
// per lane for the current row, loaded from and stored back to a float32 (float64 for
// double) shared-memory accumulator when the row changes. A hit costs one broadcast read
// of the list (its weight and query row together), one gather and the adds; a group of hits
// that stays in one row skips the row-change checks, so a dense row costs per hit about the
// gather's address, the conversions and the fused multiply-adds. Torch-free.
#pragma once

#include <climits>
#include <cstdint>

#include "backward_documents.cuh"
#include "backward_documents_binned.cuh"

namespace maxsim_cuda {
namespace kernel {

constexpr int kSortThreads = 256;
constexpr int kSortWarps = kSortThreads / 32;

// Document rows owned by one CTA pass at most (the host picks R <= sorted_rows<Acc, WIDE>()
// per launch). Each CTA reads and sorts all of its document's entries, so R trades that work
// (small R, many CTAs) against the rows one CTA applies (large R). 64 for float64, whose
// accumulator then takes the 64 KB that float32's 128 rows take (sm_86 / sm_89 give a CTA
// 99 KB). WIDE (float accumulators only): 192 rows, so that a document of up to 192 rows
// (ColBERT's 180-token passages) is one window and each entry is read and sorted once
// instead of once per window; 113 KB a CTA, two an SM on sm_90 (one on sm_80; none on
// sm_86 / sm_89, where the host keeps the narrow kernel).
template <class Acc, bool WIDE = false>
constexpr int sorted_rows() {
  return WIDE ? 192 : (sizeof(Acc) == 8 ? 64 : 128);
}

// Entries a lane evaluates per batch (they stay in registers between counting and
// placing), and gathers a warp issues before their adds: fewer for 8-byte accumulators,
// the packed surface's longer entry reads and wide elements, so that the same 128 registers
// hold them (8 packed entries spilled 4-12 bytes); and for WIDE, whose batch of 1,024 hits
// (8 KB) is what leaves room for two 192-row accumulators an SM.
template <int SURF, class Acc, bool WIDE = false>
constexpr int sorted_per_lane() {
  return WIDE || sizeof(Acc) == 8 || SURF == 2 ? 4 : 8;
}
// Two CTAs an SM where they fit (86.5 KB of shared memory each, WIDE 113.4 KB), one for
// float64.
template <class Acc>
constexpr int sorted_min_ctas() {
  return sizeof(Acc) == 8 ? 1 : 2;
}
// Gathers a warp keeps in flight: 256 bytes a warp each for 16-bit rows (half that for the
// packed surface, whose sort holds more registers: 16 spilled 8-36 bytes there; 12 for WIDE,
// where 16 spilled 4 bytes in the bfloat16 contrastive kernels at sm_90a).
template <int SURF, class T, bool WIDE = false>
constexpr int sorted_in_flight() {
  return sizeof(T) <= 2 ? (SURF == 2 ? 8 : (WIDE ? 12 : 16)) : (sizeof(T) == 4 ? 8 : 4);
}

// A sorted hit: its weight g_p and the query row it gathers, read with one shared load. The
// row is 32-bit (the host takes this kernel only for queries of fewer than 2^32 rows), and the
// gather's 64-bit address is one wide multiply-add from it.
template <class Acc>
struct SortedHit {
  Acc w;
  uint32_t qrow;
};

template <int SURF, class T, class Acc, bool WIDE = false>
struct SortedSmem {
  static_assert(!WIDE || sizeof(Acc) == 4, "192-row windows: float accumulators");
  static constexpr int kBatch = kSortThreads * sorted_per_lane<SURF, Acc, WIDE>();
  static constexpr int kRows = sorted_rows<Acc, WIDE>();
  Acc acc[kRows][kDChunk];  // the window's gradient rows, one 128-column chunk
  SortedHit<Acc> hit[kBatch];     // the batch's hits, sorted by window row
  int cursor[kSortWarps][kRows];  // hits per (warp, row), then where the warp places the next
  int row_start[kRows + 1];       // the sorted list's row boundaries
};

// A grid slot's hits as bin_hits_kernel wrote them (backward_documents_binned.cuh), read as
// entries in entry order: those of the window [j0, j0 + R) (all of them, unless the segment
// is longer than a lap of the grid's windows).
template <class Acc>
struct BinnedHits {
  static constexpr bool kWalks = false;  // no entry cursor
  const uint2* rec;
  const int32_t* row;
  int64_t nentries;
  __device__ __forceinline__ int window_row(int64_t k, const EntryCursor&, int64_t j0, int R, Acc& w,
                                            int64_t& qrow) const {
    const bool in = k < nentries;
    const uint2 r = in ? __ldg(rec + k) : make_uint2(0u, 0u);
    const int64_t j = in ? int64_t(__ldg(row + k)) - j0 : -1;
    w = static_cast<Acc>(__uint_as_float(r.x));
    qrow = r.y;
    return j >= 0 && j < R ? static_cast<int>(j) : -1;
  }
};

// Sorts one batch of entries [base, base + kBatch) of `de` (a document's entries, or a
// window's binned hits) by window row into sm.hit_*, stably; sm.row_start then bounds each
// row's hits. Warp w evaluates the contiguous range [base + w * span, base + (w + 1) * span),
// lane l its entries base + w * span + 32 u + l.
template <int SURF, class T, class Acc, bool WIDE, class Entries>
__device__ __forceinline__ void sort_batch_hits(SortedSmem<SURF, T, Acc, WIDE>& sm, const Entries& de,
                                                int64_t base, int64_t j0, int R, int t) {
  constexpr int kPer = sorted_per_lane<SURF, Acc, WIDE>();
  const int lane = t % 32, warp = t / 32;
  constexpr int kRows = SortedSmem<SURF, T, Acc, WIDE>::kRows, kRowsPerLane = kRows / 32;
  for (int c = t; c < kSortWarps * kRows; c += kSortThreads) (&sm.cursor[0][0])[c] = 0;

  // Every entry's reads before any count, so that they are in flight together (with a count
  // after each, ptxas issued one entry's reads at a time).
  const int64_t k0 = base + int64_t(warp) * (32 * kPer) + lane;
  EntryCursor cur{0, 0, 1, 0, 0};
  if constexpr (Entries::kWalks) cur.seek(k0, de.L, 32);
  int jl[kPer];
  Acc w[kPer];
  int64_t qrow[kPer];
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    w[u] = Acc(0);
    qrow[u] = 0;
    jl[u] = de.window_row(k0 + 32 * u, cur, j0, R, w[u], qrow[u]);
    if constexpr (Entries::kWalks) cur.next();
  }
  __syncthreads();  // the cursors are zero
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    if (jl[u] >= 0) atomicAdd(&sm.cursor[warp][jl[u]], 1);  // a count: order-free
  }
  __syncthreads();

  // Row totals, their exclusive prefix (the row boundaries), and each warp's first slot in
  // every row (the warps' ranges are in entry order, so warp-major within a row is too).
  if (t < kRows) {
    int run = 0;
#pragma unroll
    for (int ww = 0; ww < kSortWarps; ++ww) {
      const int c = sm.cursor[ww][t];
      sm.cursor[ww][t] = run;
      run += c;
    }
    sm.row_start[t] = run;  // the row's total, until the prefix below
  }
  __syncthreads();
  if (warp == 0) warp_exclusive_prefix<kRowsPerLane>(sm.row_start, kRows, lane);
  __syncthreads();
  if (t < kRows) {
    const int s = sm.row_start[t];
#pragma unroll
    for (int ww = 0; ww < kSortWarps; ++ww) sm.cursor[ww][t] += s;
  }
  __syncthreads();

  // Placement, 32 entries at a time in entry order: lanes with the same row take
  // consecutive slots in lane order, then the lowest of them moves the row's cursor.
  const unsigned below = (1u << lane) - 1u;
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    if (__ballot_sync(0xffffffffu, jl[u] >= 0) == 0u) continue;  // (warp-uniform)
    const unsigned peers = __match_any_sync(0xffffffffu, jl[u]);
    int pos = 0;
    if (jl[u] >= 0) {
      pos = sm.cursor[warp][jl[u]] + __popc(peers & below);
      sm.hit[pos] = SortedHit<Acc>{w[u], static_cast<uint32_t>(qrow[u])};
    }
    __syncwarp();
    if (jl[u] >= 0 && (peers & below) == 0u) sm.cursor[warp][jl[u]] += __popc(peers);
    __syncwarp();
  }
  __syncthreads();
}

// The gather's address: base + row * row_bytes, the product 32 x 32 -> 64 bits.
__device__ __forceinline__ const unsigned char* row_address(const unsigned char* base, uint32_t row,
                                                            uint32_t row_bytes) {
  return base + static_cast<uint64_t>(row) * row_bytes;
}

// Rows a warp clears and writes out in a window of R: a contiguous block of equal width.
__device__ __forceinline__ int rows_per_warp(int R) { return (R + kSortWarps - 1) / kSortWarps; }

// The rows whose hits warp `warp` adds in the sorted batch: those whose first hit lies in the
// warp's eighth of the list, [r0, r1), so that each warp adds about an eighth of the batch's
// hits however they fall on rows. Rows of equal width instead leave the warp with the most
// hits ~14% above the mean at uniformly spread argmaxes (a throwaway simulation of batches of
// 1,024 over 180 rows; ~4% this way), far more when a few rows draw most argmaxes, and the
// batch waits for that warp at the next sort's barrier. Whole rows still: each row's adds stay
// with one warp, in list order. A row's first hit is row_start[r], so the warps' rows are the
// prefix counts below, over rows < R (row_start is non-decreasing).
template <int SURF, class T, class Acc, bool WIDE>
__device__ __forceinline__ void batch_rows(const SortedSmem<SURF, T, Acc, WIDE>& sm, int R, int warp, int lane,
                                           int& r0, int& r1) {
  constexpr int kRows = SortedSmem<SURF, T, Acc, WIDE>::kRows;
  const int n = sm.row_start[kRows];
  int below0 = 0, below1 = 0;
#pragma unroll
  for (int k = 0; k < kRows / 32; ++k) {
    const int r = 32 * k + lane;
    const int first = r < R ? sm.row_start[r] * kSortWarps : INT_MAX;
    below0 += __popc(__ballot_sync(0xffffffffu, first < warp * n));
    below1 += __popc(__ballot_sync(0xffffffffu, first < (warp + 1) * n));
  }
  r0 = uniform(below0);
  r1 = uniform(below1);
}

// Warp `warp` adds the sorted hits of its rows (batch_rows) to the window's accumulator, in
// list order; `fresh`: the accumulator holds nothing yet (the window's only batch), so a row
// starts from zero instead of its stored value. All lanes take part (also those past dim,
// whose columns are never written out), so every branch is warp-uniform. Full groups of
// kInFlight hits issue their gathers without range checks; a group inside the current row
// (most of them: in-batch training gives a row tens of hits a batch) adds without the row
// walk. The adds are the same, in the same order, either way.
template <bool VEC, int SURF, class T, class Acc, bool WIDE>
__device__ __forceinline__ void apply_sorted_hits(SortedSmem<SURF, T, Acc, WIDE>& sm, int R, int warp, int lane, const T* q,
                                                  int64_t col, int64_t dim, bool fresh) {
  constexpr int kInFlight = sorted_in_flight<SURF, T, WIDE>();
  int r0, r1;
  batch_rows(sm, R, warp, lane, r0, r1);
  if (r0 >= r1) return;
  // The row boundaries are broadcast reads, alike in every lane: uniform() says so to
  // ptxas, so the per-hit row check below is a uniform branch, without the divergence
  // bookkeeping (BSSY / BSYNC) a hit that a loop on a per-lane value costs.
  const int h0 = uniform(sm.row_start[r0]), h1 = uniform(sm.row_start[r1]);
  if (h0 == h1) return;
  const unsigned char* qcol = reinterpret_cast<const unsigned char*>(q + (col < dim ? col : 0));
  const uint32_t row_bytes = static_cast<uint32_t>(dim * int64_t(sizeof(T)));
  const int64_t left = col < dim ? dim - col : 0;
  auto gather = [&](uint32_t qrow) {
    return load_quad<VEC>(reinterpret_cast<const T*>(row_address(qcol, qrow, row_bytes)), left);
  };
  auto slot = [&](int r) -> Quad<Acc>& { return *reinterpret_cast<Quad<Acc>*>(&sm.acc[r][lane * kDCols]); };
  int row = r0;
  int row_end = uniform(sm.row_start[r0 + 1]);
  Quad<Acc> cur = fresh ? Quad<Acc>{} : slot(row);
  auto add = [&](Acc w, const Quad<T>& v) {
    Acc x[kDCols];
    quad_to_acc(v, x);
#pragma unroll
    for (int c = 0; c < kDCols; ++c) cur.v[c] += w * x[c];
  };
  auto add_walking = [&](int h, Acc w, const Quad<T>& v) {
    while (h >= row_end) {  // the next row of this warp with hits
      slot(row) = cur;
      ++row;
      row_end = uniform(sm.row_start[row + 1]);
      cur = fresh ? Quad<Acc>{} : slot(row);
    }
    add(w, v);
  };
  int h = h0;
  for (; h + kInFlight <= h1; h += kInFlight) {
    Quad<T> raw[kInFlight];
    Acc wu[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {  // the group's gathers first
      const SortedHit<Acc> hit = sm.hit[h + u];
      wu[u] = hit.w;
      raw[u] = gather(hit.qrow);
    }
    if (h + kInFlight <= row_end) {
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) add(wu[u], raw[u]);
    } else {
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) add_walking(h + u, wu[u], raw[u]);
    }
  }
  if (h < h1) {  // the last, partial group: slots past h1 gather hit h's row and add nothing
    Quad<T> raw[kInFlight];
    Acc wu[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const SortedHit<Acc> hit = sm.hit[h + u < h1 ? h + u : h];
      wu[u] = hit.w;
      raw[u] = gather(hit.qrow);
    }
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      if (h + u < h1) add_walking(h + u, wu[u], raw[u]);
    }
  }
  slot(row) = cur;
}

// One window's chunk of columns: its entries (`src`: the document's, or the window's binned
// hits) sorted and applied batch by batch, then its rows written.
template <int SURF, class T, class Acc, bool WIDE, class Entries>
__device__ __forceinline__ void sorted_window(SortedSmem<SURF, T, Acc, WIDE>& sm, const BwdArgs<T, Acc>& a,
                                              const DocEntries<SURF, T, Acc>& de, const Entries& src, int64_t j0,
                                              int64_t col, bool vec) {
  constexpr int kBatch = SortedSmem<SURF, T, Acc, WIDE>::kBatch;
  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  const int R = a.rows_per_cta;
  const int r0 = warp * rows_per_warp(R), r1 = r0 + rows_per_warp(R) < R ? r0 + rows_per_warp(R) : R;
  // One batch (padded documents, small contrastive batches): rows start from zero in
  // registers and rows without hits are written as zeros, so the accumulator is neither
  // cleared nor read for them.
  const bool one_batch = src.nentries <= kBatch;
  if (!one_batch) {
    for (int j = r0; j < r1; ++j) *reinterpret_cast<Quad<Acc>*>(&sm.acc[j][lane * kDCols]) = Quad<Acc>{};
  }
  for (int64_t base = 0; base < src.nentries; base += kBatch) {
    sort_batch_hits(sm, src, base, j0, R, t);
    if (vec) {
      apply_sorted_hits<true>(sm, R, warp, lane, a.q, col, a.dim, one_batch);
    } else {
      apply_sorted_hits<false>(sm, R, warp, lane, a.q, col, a.dim, one_batch);
    }
    // (the next batch's writes wait at its first barrier for this batch's reads)
  }
  // Each warp writes its block of rows, which other warps may have added to in the last batch
  // (batch_rows), hence the barrier; the row boundaries are the last batch's.
  __syncthreads();
  if (col < a.dim) {
    const int64_t nrows = de.rows_total - j0 < R ? de.rows_total - j0 : R;
    for (int j = r0; j < r1 && j < nrows; ++j) {
      const bool zero = src.nentries == 0 || (one_batch && sm.row_start[j] == sm.row_start[j + 1]);
      T* out = a.grad_d + (de.row0 + j0 + j) * a.dim + col;
#pragma unroll
      for (int c = 0; c < kDCols; ++c) {
        if (col + c < a.dim) out[c] = from_acc<T, Acc>(zero ? Acc(0) : sm.acc[j][lane * kDCols + c]);
      }
    }
  }
  __syncthreads();  // the next chunk's or window's sort overwrites the row boundaries read above
}

// BINNED: a CTA's hits come binned by its grid slot (backward_documents_binned.cuh;
// contrastive surfaces, float accumulators) instead of read from all of its document's entries.
template <int SURF, class T, class Acc, bool WIDE = false, bool BINNED = false>
__global__ void __launch_bounds__(kSortThreads, sorted_min_ctas<Acc>())
    grad_documents_sorted_kernel(const BwdArgs<T, Acc> a) {
  static_assert(!BINNED || (is_contrastive(SURF) && sizeof(Acc) == 4), "binned: contrastive, float");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto& sm = *reinterpret_cast<SortedSmem<SURF, T, Acc, WIDE>*>(smem_raw);
  for_each_window<SURF>(a, [&](const DocEntries<SURF, T, Acc>& de, int64_t j0, int64_t col, bool vec) {
    if constexpr (BINNED) {
      const int64_t slot = de.doc * a.bin_slots + blockIdx.y, first = de.doc * a.bin_stride + a.bin_start[slot];
      const BinnedHits<Acc> hits{a.bins + first, a.bin_rows + first, a.bin_count[slot]};
      sorted_window(sm, a, de, hits, j0, col, vec);
    } else {
      sorted_window(sm, a, de, de, j0, col, vec);
    }
  });
}

}  // namespace kernel
}  // namespace maxsim_cuda
