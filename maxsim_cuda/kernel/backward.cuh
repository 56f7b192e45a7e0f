// Argmax-driven backward, destination-owned and deterministic (no floating-point atomics):
// every gradient row has one owner that adds its contributions in a fixed order. The owners
// are grad_queries (backward_queries.cuh) and grad_documents (backward_documents.cuh); this
// file sizes and launches them. Entries with argmax < 0 or >= dlen, rows i >= qlen, and
// pairs whose ids/offsets are out of range are skipped. Torch-free.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../launch.h"
#include "backward_args.cuh"
#include "backward_documents.cuh"
#include "backward_queries.cuh"

namespace maxsim_cuda {
namespace kernel {

template <class T, class Acc, int SURF>
cudaError_t run_grad_documents(const BackwardParams& p, BwdArgs<T, Acc>& a);

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

  if (p.grad_queries != nullptr) {
    const int64_t rows = SURF == 2 ? a.nq * a.W : a.nq * a.Lq;
    if (rows > 0) {
      const int64_t blocks = (rows + kQWarps - 1) / kQWarps;
      grad_queries_kernel<SURF, T, Acc, F><<<static_cast<unsigned>(blocks), kQWarps * 32, 0, p.stream>>>(a, rows);
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

template <class T, class Acc, int SURF>
cudaError_t run_grad_documents(const BackwardParams& p, BwdArgs<T, Acc>& a) {
  if (p.grad_documents != nullptr && a.nd > 0) {
    // per document (padded layouts: exactly; segments: on average)
    const int64_t rows = SURF == 0 || SURF == 3 ? a.Ld : a.d_rows / a.nd + 1;
    // The largest R (least rescanning) that still gives about four CTAs per SM; small
    // batches fall back to 16-row owners. (BigBatch, 64 documents of 128 rows: R = 64 gave
    // 192 CTAs on 132 SMs, each applying a third of its document's hits.)
    const int64_t want = 4 * int64_t(p.num_sms > 0 ? p.num_sms : 1);
    a.rows_per_cta = a.nd * ((rows + kDRows - 1) / kDRows) >= want ? kDRows
                     : a.nd * ((rows + 31) / 32) >= want        ? 32
                                                                : 16;
    int64_t ychunks = (rows + a.rows_per_cta - 1) / a.rows_per_cta;
    if (SURF != 0 && ychunks > 256) ychunks = 256;
    if (ychunks < 1) ychunks = 1;
    if (ychunks > 65535) ychunks = 65535;
    constexpr size_t smem = sizeof(GradDSmem<Acc>);
    auto kern = grad_documents_kernel<SURF, T, Acc>;
    static bool configured[64] = {false};
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    if (smem > 48 * 1024 && !configured[dev & 63]) {
      err = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
      if (err != cudaSuccess) return err;
      configured[dev & 63] = true;
    }
    if (a.nd > 0x7fffffff) return cudaErrorInvalidValue;
    dim3 grid(static_cast<unsigned>(a.nd), static_cast<unsigned>(ychunks));
    kern<<<grid, kDThreads, smem, p.stream>>>(a);
    return cudaGetLastError();
  }
  return cudaSuccess;
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

// Residual documents: grad_queries with each winning row decoded on the fly (16-bit queries).
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
