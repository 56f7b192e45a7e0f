// Argmax-driven backward, destination-owned and deterministic (no floating-point atomics):
// every gradient row has one owner that adds its contributions in a fixed order. The owners
// are grad_queries (backward_queries.cuh) and grad_documents (backward_documents.cuh and its
// two kernels); this file sizes and launches them. Entries with argmax < 0 or >= dlen, rows
// i >= qlen, and pairs whose ids/offsets are out of range are skipped. Torch-free.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "../launch.h"
#include "backward_args.cuh"
#include "backward_documents_scan.cuh"
#include "backward_documents_sorted.cuh"
#include "backward_queries.cuh"
#include "scheduler.cuh"
#include "scratch.cuh"

namespace maxsim_cuda {
namespace kernel {

template <class T, class Acc, int SURF>
cudaError_t run_grad_documents(const BackwardParams& p, BwdArgs<T, Acc>& a);
template <class T, class Acc, int SURF>
cudaError_t launch_grad_documents(const BackwardParams& p, const BwdArgs<T, Acc>& a, dim3 grid, bool sorted,
                                  bool wide);

// F: the documents' format. Compressed documents get no gradient (the caller never asks),
// so only grad_queries is instantiated for them.
template <class T, class Acc, int SURF, DocFormat F = DocFormat::kNative>
cudaError_t run_backward(const BackwardParams& p) {
  constexpr bool kCompressed = is_compressed<F>() || F == DocFormat::kResidual;
  BwdArgs<T, Acc> a;
  a.g = static_cast<const Acc*>(p.grad_scores);
  a.q = static_cast<const T*>(p.queries);
  a.d = kCompressed ? nullptr : static_cast<const T*>(p.documents);
  a.d_bytes = kCompressed ? static_cast<const uint8_t*>(p.documents) : nullptr;
  a.d_scales = p.doc_scales;
  a.argmax = p.argmax;
  a.grad_q = static_cast<T*>(p.grad_queries);
  a.grad_d = static_cast<T*>(p.grad_documents);
  a.dim = p.dim;
  a.W = p.argmax_width;
  a.pairs = p.pairs;
  a.q_rows = p.q_rows;
  a.d_rows = p.d_rows;
  a.nq = p.num_queries;
  a.nd = SURF == 0 ? p.num_queries * p.cands : p.num_docs;
  a.C = p.cands;
  a.Lq = p.lq;
  a.Ld = p.ld;
  a.qlens = IndexView(p.query_lengths);
  a.dlens = IndexView(p.doc_lengths);
  a.qoffs = IndexView(p.query_offsets);
  a.doffs = IndexView(p.doc_offsets);
  a.pqids = IndexView(p.pair_query_ids);
  a.pdids = IndexView(p.pair_doc_ids);
  a.pbq = IndexView(p.pairs_by_query);
  a.qpo = IndexView(p.query_pair_offsets);
  a.pbd = IndexView(p.pairs_by_document);
  a.dpo = IndexView(p.document_pair_offsets);
  a.res = p.residual;
  a.bins = nullptr;
  a.bin_rows = nullptr;
  a.bin_start = a.bin_count = a.bin_tally = nullptr;
  a.bin_stride = 0;
  a.bin_slots = a.bin_chunks = 0;

  if (p.grad_queries != nullptr) {
    const int64_t rows = SURF == 2 ? a.nq * a.W : a.nq * a.Lq;
    if (rows > 0) {
      const int64_t blocks = (rows + kQWarps - 1) / kQWarps;
      const unsigned grid = static_cast<unsigned>(blocks);
      bool rows_of_t = false;
      if constexpr (F == DocFormat::kResidual && sizeof(T) == 2) {
        rows_of_t = residual_rows_of(a.res, p.dtype);
        if (rows_of_t) grad_queries_kernel<SURF, T, Acc, F, true><<<grid, kQWarps * 32, 0, p.stream>>>(a, rows);
      }
      if (!rows_of_t) grad_queries_kernel<SURF, T, Acc, F><<<grid, kQWarps * 32, 0, p.stream>>>(a, rows);
      cudaError_t err = cudaGetLastError();
      if (err != cudaSuccess) return err;
    }
  }
  if constexpr (kCompressed) {
    return p.grad_documents != nullptr ? cudaErrorInvalidValue : cudaSuccess;
  } else {
    return run_grad_documents<T, Acc, SURF>(p, a);
  }
}

// Which grad_documents kernel: MAXSIM_CUDA_GRAD_D=scan|sorted (read per call, so that one
// process can time and test both), else sorted when a document has at least 8 entries per
// row on average. H200, 2026-11-26: sorted 0.71-0.80x of scan's time on DocDoc (64 entries a
// row), BigBatch (16), Contrastive (13), BigColBERT (91); 1.2-2x on LongDocs (2), ColPali
// (1), padded and packed reranks (under 1), where scan's cheaper CTAs win.
inline bool grad_documents_sorted(int64_t entries_per_doc, int64_t rows_per_doc) {
  if (const char* e = std::getenv("MAXSIM_CUDA_GRAD_D")) {
    if (std::strcmp(e, "scan") == 0) return false;
    if (std::strcmp(e, "sorted") == 0) return true;
  }
  return entries_per_doc >= 8 * rows_per_doc;
}

// MAXSIM_CUDA_GRAD_D_ROWS=R (read per call; tests and comparisons): the sorted kernel's
// window, a multiple of its 8 warps from 16 up to 192 (64 for double; the 192-row kernel
// where R > 128 and it fits the device), in place of the cost model's. 0: the model.
inline int grad_documents_forced_rows(int max_rows) {
  const char* e = std::getenv("MAXSIM_CUDA_GRAD_D_ROWS");
  if (e == nullptr) return 0;
  const int r = std::atoi(e);
  return r >= 16 && r <= max_rows && r % kSortWarps == 0 ? r : 0;
}

// Whether the sorted kernel's hits are binned by window first (backward_documents_binned.cuh):
// where it can (float accumulators, contrastive surfaces, at most 256 windows a lap, rows in
// 31 bits, at most 256 chunks of entries a document (each placing CTA sums its slot's counts
// over all of them), the records under 1.5 GB) and pays: documents of at least 4 windows and
// 16,384 entries (DocDoc: 8 windows of 65,536), where each window's CTA read and sorted all
// of its document's entries; two passes over them cost about what two windows did.
// MAXSIM_CUDA_GRAD_D_BINNED=1 bins wherever it can, 0 never (read per call: tests and
// comparisons).
template <int SURF, class Acc>
inline bool grad_documents_binned(int64_t entries, int64_t nd, int64_t windows, int64_t doc_rows) {
  const bool can = is_contrastive(SURF) && sizeof(Acc) == 4 && entries > 0 && entries <= INT32_MAX &&
                   windows <= kMaxBinSlots && doc_rows <= INT32_MAX &&
                   (entries + kBinChunk - 1) / kBinChunk <= kMaxBinChunks && nd * entries <= (int64_t(1) << 27);
  if (!can) return false;
  if (const char* e = std::getenv("MAXSIM_CUDA_GRAD_D_BINNED")) {
    if (e[0] == '0' || e[0] == '1') return e[0] == '1';
  }
  return windows >= 4 && entries >= 16384;
}

// The sorted kernel's window R by a cost model, over the R a kernel variant (WIDE or not)
// offers: every CTA reads and sorts all of its document's entries and applies its rows' hits
// (a full document's hits ~4 times its entries' cost), in waves of the CTAs the SMs hold.
// H200: DocDoc 0.85 ms with R = 120 (9 windows of 1,024 rows, 576 CTAs: three waves) against
// 0.60 with R = 128 (512 CTAs: two), BigBatch 0.025 with R = 24 (two waves) against 0.0185
// with 32 (one). Keeps the cheaper of (best, the variant's best); ties keep best. The model
// counts waves, not the warps an SM keeps gathering, so a variant that holds fewer CTAs an SM
// than `per_sm` says (the narrow kernel's count, passed to the wide one) is not considered
// unless R is forced; `per_sm` returns this variant's count.
template <int SURF, class T, class Acc, bool WIDE>
cudaError_t plan_sorted_windows(int64_t rows, int64_t nd, int64_t sms, int forced, int64_t& best, int& best_r,
                                int64_t& windows, bool& wide, int& per_sm) {
  using Smem = SortedSmem<SURF, T, Acc, WIDE>;
  if (WIDE && sizeof(Smem) > max_smem_optin()) return cudaSuccess;  // sm_86 / sm_89: narrow only
  constexpr auto kern = grad_documents_sorted_kernel<SURF, T, Acc, WIDE>;
  const int fewest = per_sm;
  // CTAs an SM the device holds, as the occupancy API reports them (by shared memory: 86.5 KB
  // a narrow CTA, 113.4 KB a wide one; two of either on sm_90's 228 KB)
  cudaError_t err = resident_ctas<kern>(kSortThreads, sizeof(Smem), 8, per_sm);
  if (err != cudaSuccess) return err;
  if (forced == 0 && per_sm < fewest) return cudaSuccess;
  const int64_t slots = int64_t(per_sm) * sms;
  for (int r = Smem::kRows; r >= 16; r -= kSortWarps) {
    if (forced > 0 && r != forced) continue;
    const int64_t n = (rows + r - 1) / r;
    const int64_t waves = (nd * n + slots - 1) / slots;
    const int64_t cost = waves * (rows + 4 * int64_t(r));
    if (best < 0 || cost < best) {
      best = cost;
      best_r = r;
      windows = n;
      wide = WIDE;
    }
  }
  return cudaSuccess;
}

template <class T, class Acc, int SURF>
cudaError_t run_grad_documents(const BackwardParams& p, BwdArgs<T, Acc>& a) {
  if (p.grad_documents == nullptr || a.nd <= 0) return cudaSuccess;
  if (a.nd > 0x7fffffff) return cudaErrorInvalidValue;
  // rows and entries per document (padded layouts: exactly; segments: on average, rounded up)
  const int64_t avg_rows = (a.d_rows + a.nd - 1) / a.nd;
  const int64_t rows = SURF == 0 || SURF == 3 ? a.Ld : (avg_rows > 0 ? avg_rows : 1);
  const int64_t entries = SURF == 0 ? a.Lq : (SURF == 2 ? a.pairs * a.W / a.nd : a.nq * a.Lq);
  const int64_t sms = p.num_sms > 0 ? p.num_sms : 1;
  // (the sorted kernel keeps a hit's query row in 32 bits, so larger queries take scan, knob or not)
  const bool sorted = grad_documents_sorted(entries, rows) && a.q_rows <= int64_t(UINT32_MAX) &&
                      a.dim * int64_t(sizeof(T)) <= int64_t(UINT32_MAX);
  int64_t windows = 1;
  bool wide = false;
  if (sorted) {
    constexpr bool kWideKernel = sizeof(Acc) == 4;
    const int forced = grad_documents_forced_rows(kWideKernel ? sorted_rows<Acc, true>() : sorted_rows<Acc>());
    int64_t best = -1;
    int per_sm = 0;
    cudaError_t err = cudaSuccess;
    if (forced == 0 || forced <= sorted_rows<Acc>()) {
      err = plan_sorted_windows<SURF, T, Acc, false>(rows, a.nd, sms, forced, best, a.rows_per_cta, windows, wide,
                                                     per_sm);
    }
    if constexpr (kWideKernel) {
      if (err == cudaSuccess && (forced == 0 || forced > sorted_rows<Acc>())) {
        err = plan_sorted_windows<SURF, T, Acc, true>(rows, a.nd, sms, forced, best, a.rows_per_cta, windows, wide,
                                                      per_sm);
      }
    }
    if (err != cudaSuccess) return err;
    if (best < 0) {  // a forced wide R where the wide kernel does not fit: the narrow model
      per_sm = 0;
      err = plan_sorted_windows<SURF, T, Acc, false>(rows, a.nd, sms, 0, best, a.rows_per_cta, windows, wide, per_sm);
      if (err != cudaSuccess) return err;
    }
  } else {
    // The largest R (least rescanning) that still gives about four CTAs per SM; small
    // batches fall back to 16-row owners. (BigBatch, 64 documents of 128 rows: R = 64 gave
    // 192 CTAs on 132 SMs, each applying a third of its document's hits.)
    const int64_t want = 4 * sms;
    a.rows_per_cta = a.nd * ((rows + kScanRows - 1) / kScanRows) >= want ? kScanRows
                     : a.nd * ((rows + 31) / 32) >= want          ? 32
                                                                  : 16;
    windows = (rows + a.rows_per_cta - 1) / a.rows_per_cta;
  }
  // (longer segments than the average: the CTAs of a document stride over its windows)
  if (SURF != 0 && windows > 256) windows = 256;
  if (windows < 1) windows = 1;
  if (windows > 65535) windows = 65535;
  const dim3 grid(static_cast<unsigned>(a.nd), static_cast<unsigned>(windows));
  // Binned hits: stream-ordered scratch (capturable in a CUDA graph) for the records, then
  // the tallies, the runs' starts and their lengths.
  void* bins = nullptr;
  if (sorted && !wide && grad_documents_binned<SURF, Acc>(entries, a.nd, windows, SURF == 3 ? a.Ld : a.d_rows)) {
    a.bin_slots = static_cast<int>(windows);
    a.bin_chunks = static_cast<int>((entries + kBinChunk - 1) / kBinChunk);
    a.bin_stride = entries;
    const size_t hits = size_t(a.nd) * size_t(entries);
    const size_t tallies = size_t(a.nd) * size_t(a.bin_chunks) * size_t(windows);
    const size_t runs = size_t(a.nd) * size_t(windows);
    const size_t bytes = hits * sizeof(uint2) + (hits + tallies + 2 * runs) * sizeof(int32_t);
    cudaError_t err = scratch_alloc(&bins, bytes, p.stream);
    if (err != cudaSuccess) return err;
    a.bins = static_cast<uint2*>(bins);
    a.bin_rows = reinterpret_cast<int32_t*>(a.bins + hits);
    a.bin_tally = a.bin_rows + hits;
    a.bin_start = a.bin_tally + tallies;
    a.bin_count = a.bin_start + runs;
    if constexpr (is_contrastive(SURF) && sizeof(Acc) == 4) {
      const dim3 chunks(static_cast<unsigned>(a.nd), static_cast<unsigned>(a.bin_chunks));
      bin_tally_kernel<SURF, T, Acc><<<chunks, kBinThreads, 0, p.stream>>>(a);
      bin_hits_kernel<SURF, T, Acc><<<chunks, kBinThreads, 0, p.stream>>>(a);
    }
  }
  const cudaError_t err = launch_grad_documents<T, Acc, SURF>(p, a, grid, sorted, wide);
  if (bins != nullptr) {
    const cudaError_t ferr = cudaFreeAsync(bins, p.stream);
    if (err == cudaSuccess) return ferr;
  }
  return err;
}

// The chosen grad_documents kernel on `grid` (document, window).
template <class T, class Acc, int SURF>
cudaError_t launch_grad_documents(const BackwardParams& p, const BwdArgs<T, Acc>& a, dim3 grid, bool sorted,
                                  bool wide) {
  // (resident_ctas opts a kernel into its shared memory past 48 KB: the cost model above did
  // for the sorted kernel)
  if (sorted && wide) {
    if constexpr (sizeof(Acc) == 4) {
      grad_documents_sorted_kernel<SURF, T, Acc, true>
          <<<grid, kSortThreads, sizeof(SortedSmem<SURF, T, Acc, true>), p.stream>>>(a);
    }
  } else if (sorted && a.bins != nullptr) {
    if constexpr (is_contrastive(SURF) && sizeof(Acc) == 4) {
      constexpr auto kern = grad_documents_sorted_kernel<SURF, T, Acc, false, true>;
      constexpr size_t smem = sizeof(SortedSmem<SURF, T, Acc>);
      int per_sm = 0;
      cudaError_t err = resident_ctas<kern>(kSortThreads, smem, 8, per_sm);
      if (err != cudaSuccess) return err;
      kern<<<grid, kSortThreads, smem, p.stream>>>(a);
    }
  } else if (sorted) {
    grad_documents_sorted_kernel<SURF, T, Acc><<<grid, kSortThreads, sizeof(SortedSmem<SURF, T, Acc>), p.stream>>>(a);
  } else {
    constexpr auto kern = grad_documents_scan_kernel<SURF, T, Acc>;
    constexpr size_t smem = sizeof(ScanSmem<Acc>);
    int per_sm = 0;
    cudaError_t err = resident_ctas<kern>(kScanThreads, smem, 8, per_sm);
    if (err != cudaSuccess) return err;
    kern<<<grid, kScanThreads, smem, p.stream>>>(a);
  }
  return cudaGetLastError();
}

template <class T, DocFormat F>
cudaError_t launch_backward_compressed(const BackwardParams& p) {
  switch (p.surface) {
    case Surface::kPadded: return run_backward<T, float, 0, F>(p);
    case Surface::kContrastive: return run_backward<T, float, 1, F>(p);
    case Surface::kContrastivePadded: return run_backward<T, float, 3, F>(p);
    default: return run_backward<T, float, 2, F>(p);
  }
}

// Residual documents: grad_queries with each winning row decoded on the fly (any query dtype).
template <class T>
cudaError_t launch_backward_residual(const BackwardParams& p) {
  return launch_backward_compressed<T, DocFormat::kResidual>(p);
}

template <class T, class Acc>
cudaError_t launch_backward_typed(const BackwardParams& p) {
  switch (p.surface) {
    case Surface::kPadded: return run_backward<T, Acc, 0>(p);
    case Surface::kContrastive: return run_backward<T, Acc, 1>(p);
    case Surface::kContrastivePadded: return run_backward<T, Acc, 3>(p);
    default: return run_backward<T, Acc, 2>(p);
  }
}

}  // namespace kernel
}  // namespace maxsim_cuda
