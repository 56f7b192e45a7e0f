// grad_documents' hits binned by window ahead of the sorted kernel, for documents split into
// many windows (DocDoc: 1,024 rows in 8 windows of 128). Without it every window's CTA reads
// and sorts all of its document's entries to keep the eighth that land in its rows; with it
// two passes over the entries write each hit once, in entry order, into the run of the grid
// slot whose windows hold its row (slot (row / R) mod S: S slots, a slot's windows one a lap):
//   bin_tally_kernel: CTA (document, chunk of kBinChunk entries) counts its hits a slot;
//   bin_hits_kernel:  the same CTA places them: its runs start after the earlier slots'
//                     totals and the earlier chunks' counts (a stable partition).
// A hit is 12 bytes: {weight, query row} and its document row. Contrastive surfaces only
// (each document has the same number of entries, so its records have a fixed stride).
// Torch-free.
#pragma once

#include <cstdint>

#include "backward_documents.cuh"

namespace maxsim_cuda {
namespace kernel {

constexpr int kBinThreads = 256;
constexpr int kBinWarps = kBinThreads / 32;
constexpr int kBinPerLane = 8;
constexpr int kBinChunk = kBinThreads * kBinPerLane;  // entries a CTA of either pass
constexpr int kMaxBinSlots = 256;                     // slots a document (the grid's y)
constexpr int kMaxBinChunks = 256;  // chunks a document: bin_hits_kernel reads all their tallies

// The row each of this lane's entries of chunk `chunk` lands on, or -1; warp w holds entries
// [w * 256, (w + 1) * 256) of the chunk, lane l those of them at l mod 32, as the sorted kernel
// holds a batch's.
template <int SURF, class T, class Acc>
__device__ __forceinline__ void chunk_rows(const DocEntries<SURF, T, Acc>& de, int64_t chunk,
                                           int (&row)[kBinPerLane], Acc (&w)[kBinPerLane],
                                           int64_t (&qrow)[kBinPerLane]) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t k0 = chunk * kBinChunk + int64_t(warp) * (32 * kBinPerLane) + lane;
  EntryCursor cur{0, 0, 1, 0, 0};
  if (SURF != 0) cur.seek(k0, de.L, 32);
#pragma unroll
  for (int u = 0; u < kBinPerLane; ++u) {
    w[u] = Acc(0);
    qrow[u] = 0;
    row[u] = de.window_row(k0 + 32 * u, cur, 0, static_cast<int>(de.rows_total), w[u], qrow[u]);
    if (SURF != 0) cur.next();
  }
}

// One thread a window slot in both passes.
static_assert(kMaxBinSlots == kBinThreads, "a thread a slot");

template <int SURF, class T, class Acc>
__global__ void __launch_bounds__(kBinThreads) bin_tally_kernel(const BwdArgs<T, Acc> a) {
  __shared__ int tally[kMaxBinSlots];
  const int t = threadIdx.x, S = a.bin_slots, R = a.rows_per_cta;
  tally[t] = 0;
  __syncthreads();
  DocEntries<SURF, T, Acc> de{a};
  if (de.init(blockIdx.x)) {
    int row[kBinPerLane];
    Acc w[kBinPerLane];
    int64_t qrow[kBinPerLane];
    chunk_rows(de, blockIdx.y, row, w, qrow);
#pragma unroll
    for (int u = 0; u < kBinPerLane; ++u) {
      if (row[u] >= 0) atomicAdd(&tally[(row[u] / R) % S], 1);  // a count: order-free
    }
  }
  __syncthreads();
  if (t < S) a.bin_tally[(int64_t(blockIdx.x) * a.bin_chunks + blockIdx.y) * S + t] = tally[t];
}

// The placing pass stages its chunk's hits in shared memory, slot by slot in entry order, and
// then writes each slot's part, one contiguous range of that slot's run in the output, with
// consecutive threads on consecutive records. Placed directly, each warp's 32 hits went to as
// many places as the slots they touched, in partial sectors (the same pass by row, a slot a
// row, ran at 430 us on BigColBERT: `maxsim_cuda/NOTES.md`, "grad_documents by row, measured").
// The output is the same, record for record.
// (Three CTAs an SM named: with the thread count alone ptxas capped the registers at 64 and
// spilled 8 bytes at sm_80.)
template <int SURF, class T, class Acc>
__global__ void __launch_bounds__(kBinThreads, 3) bin_hits_kernel(const BwdArgs<T, Acc> a) {
  __shared__ int start[kMaxBinSlots + 1];          // where each slot's run starts in the output
  __shared__ int first[kMaxBinSlots];              // ... and this chunk's part of it
  __shared__ int local[kMaxBinSlots + 1];          // where each slot's hits start in the staging
  __shared__ int cursor[kBinWarps][kMaxBinSlots];  // where each warp stages its next hit a slot
  __shared__ uint2 staged[kBinChunk];              // the chunk's hits, slot by slot, in entry order
  __shared__ int32_t staged_row[kBinChunk];
  const int t = threadIdx.x, lane = t % 32, warp = t / 32, S = a.bin_slots, R = a.rows_per_cta;
  const int64_t doc = blockIdx.x, chunk = blockIdx.y;
  // Slot t: its document-wide total and the hits of the chunks before this one.
  int before = 0;
  if (t < S) {
    const int32_t* tally = a.bin_tally + doc * a.bin_chunks * S + t;
    int all = 0;
    for (int64_t c = 0; c < a.bin_chunks; ++c) {
      const int v = tally[c * S];
      all += v;
      before += c < chunk ? v : 0;
    }
    start[t] = all;
  }
  for (int c = t; c < kBinWarps * kMaxBinSlots; c += kBinThreads) (&cursor[0][0])[c] = 0;
  __syncthreads();
  if (warp == 0) warp_exclusive_prefix<kMaxBinSlots / 32>(start, S, lane);
  __syncthreads();
  if (t < S) {
    first[t] = start[t] + before;
    if (chunk == 0) {
      a.bin_start[doc * S + t] = start[t];
      a.bin_count[doc * S + t] = start[t + 1] - start[t];
    }
  }
  DocEntries<SURF, T, Acc> de{a};
  if (!de.init(doc)) return;  // (the whole CTA: its tallies are zeros)
  int row[kBinPerLane];
  Acc w[kBinPerLane];
  int64_t qrow[kBinPerLane];
  chunk_rows(de, chunk, row, w, qrow);
#pragma unroll
  for (int u = 0; u < kBinPerLane; ++u) {
    if (row[u] >= 0) atomicAdd(&cursor[warp][(row[u] / R) % S], 1);
  }
  __syncthreads();
  // Slot t's hits in this chunk, and each warp's first staging place in slot t's part (the
  // warps' entry ranges are in entry order, so warp-major within a slot is too).
  if (t < S) {
    int run = 0;
#pragma unroll
    for (int ww = 0; ww < kBinWarps; ++ww) {
      const int c = cursor[ww][t];
      cursor[ww][t] = run;
      run += c;
    }
    local[t] = run;
  }
  __syncthreads();
  if (warp == 0) warp_exclusive_prefix<kMaxBinSlots / 32>(local, S, lane);
  __syncthreads();
  // Staging, 32 entries at a time in entry order: lanes with the same slot take consecutive
  // places in lane order, then the lowest of them moves the slot's cursor.
  const unsigned below = (1u << lane) - 1u;
#pragma unroll
  for (int u = 0; u < kBinPerLane; ++u) {
    if (__ballot_sync(0xffffffffu, row[u] >= 0) == 0u) continue;  // (warp-uniform)
    const int s = row[u] >= 0 ? (row[u] / R) % S : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, s);
    if (s >= 0) {
      const int pos = local[s] + cursor[warp][s] + __popc(peers & below);
      staged[pos] = make_uint2(__float_as_uint(static_cast<float>(w[u])), static_cast<uint32_t>(qrow[u]));
      staged_row[pos] = row[u];
    }
    __syncwarp();
    if (s >= 0 && (peers & below) == 0u) cursor[warp][s] += __popc(peers);
    __syncwarp();
  }
  __syncthreads();
  // Record i belongs to the last slot whose staging start is <= i (a slot without hits shares
  // its start with the next slot, which then holds i): a binary search over the starts.
  uint2* out = a.bins + doc * a.bin_stride;
  int32_t* out_row = a.bin_rows + doc * a.bin_stride;
  const int n = local[S];
  for (int i = t; i < n; i += kBinThreads) {
    int lo = 0, hi = S - 1;  // local[lo] <= i < local[hi + 1] throughout
    while (lo < hi) {
      const int m = (lo + hi + 1) / 2;
      if (local[m] <= i) {
        lo = m;
      } else {
        hi = m - 1;
      }
    }
    const int pos = first[lo] + (i - local[lo]);
    out[pos] = staged[i];
    out_row[pos] = staged_row[i];
  }
}

}  // namespace kernel
}  // namespace maxsim_cuda
