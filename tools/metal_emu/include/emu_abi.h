// The emulator's C ABI (emu_ops.cpp), as the Python tests (ctypes) and the ThreadSanitizer
// program (tsan_main.cpp) call it.
#pragma once

#include <cstdint>

extern "C" {

// An int32 / int64 index tensor; present == 0: an optional tensor not given.
struct EmuIndex {
  const void* data;
  int64_t numel;
  int is64;
  int present;
};

struct EmuOptions {
  int order;          // emu::Order
  uint64_t seed;      // for the random order
  uint32_t poison;    // pattern over threadgroup memory and outputs
  int real_threads;   // 1: std::thread per GPU thread (ThreadSanitizer)
};

// surface: MaxsimSurface; dtype: maxsim_metal::Dtype of the queries; doc_format:
// maxsim_metal::DocFormat, with document_scales (scales_numel float32, one per document row)
// for compressed documents and null otherwise; sizes: see params_for() in emu_ops.cpp.
int emu_forward(int surface, int dtype, int doc_format, const int64_t* sizes, int64_t dim,
                const void* queries, int64_t queries_numel, const void* documents,
                int64_t documents_numel, const float* document_scales, int64_t scales_numel,
                const EmuIndex* idx, int with_argmax, float* scores, int64_t scores_numel,
                int32_t* argmax, int64_t argmax_numel, const EmuOptions* opt, char* err, int errlen);

int emu_backward(int surface, int dtype, int doc_format, int to_query, const int64_t* sizes,
                 int64_t dim, const void* queries, int64_t queries_numel, const void* documents,
                 int64_t documents_numel, const float* document_scales, int64_t scales_numel,
                 const float* grad_scores, int64_t num_pairs, const int32_t* argmax,
                 int64_t argmax_width, const EmuIndex* idx, EmuIndex owner_pairs,
                 EmuIndex owner_pair_offsets, void* grad, int64_t grad_numel, const EmuOptions* opt,
                 char* err, int errlen);

}  // extern "C"
