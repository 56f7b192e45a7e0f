// Shared between the Metal kernels, the launch plan (C++) and the emulator: the kernel
// parameter block and the tile sizes. Plain integers only, so the layout is the same in
// MSL and C++ (64-bit fields first, then 32-bit ones).
#pragma once

#if defined(__METAL_VERSION__)
typedef long maxsim_i64;
#else
#include <cstdint>
typedef int64_t maxsim_i64;
#endif

// Tile sizes. Enums rather than constants: both languages accept them in array bounds.
enum MaxsimTiles {
  kMaxsimThreads = 128,         // threads per threadgroup (4 simdgroups of 32)
  kMaxsimSimdgroups = 4,
  kMaxsimQueryRows = 32,        // query rows per chunk: 8 per simdgroup
  kMaxsimDocRows = 32,          // document rows per tile
  kMaxsimDimChunk = 32,         // embedding columns staged per step (a multiple of 8)
  kMaxsimGradRows = 16,         // output rows owned by one backward threadgroup pass
  kMaxsimGradColumns = 128,     // output columns per backward pass: one per thread
};

// Threadgroup memory of the forward, in floats.
enum MaxsimForwardLayout {
  kQueryTile = 0,                                              // [32 rows][32 columns]
  kDocTile = kQueryTile + kMaxsimQueryRows * kMaxsimDimChunk,  // [32 rows][32 columns]
  kSims = kDocTile + kMaxsimDocRows * kMaxsimDimChunk,         // [4 simdgroups][8][32]
  kRowMax = kSims + kMaxsimQueryRows * kMaxsimDocRows,         // [32]
  kRowFactor = kRowMax + kMaxsimQueryRows,                     // [32] residual: 1 / ||t_j||
  kForwardFloats = kRowFactor + kMaxsimDocRows,
};

// Threadgroup memory of the backward: the accumulator, then one slot per thread
// describing the entry it evaluated (source row as two 32-bit halves, weight, local row).
enum MaxsimBackwardLayout {
  kGradAcc = 0,                                                // [16 rows][128 columns] float
  kHitSourceLow = kGradAcc + kMaxsimGradRows * kMaxsimGradColumns,  // [128] int
  kHitSourceHigh = kHitSourceLow + kMaxsimThreads,             // [128] int
  kHitWeight = kHitSourceHigh + kMaxsimThreads,                // [128] float
  kHitRow = kHitWeight + kMaxsimThreads,                       // [128] int, -1: no hit
  kBackwardWords = kHitRow + kMaxsimThreads,
};

// Element types a kernel reads by a runtime flag rather than a template parameter (the
// residual codec's centroids and bucket weights, any of the three with any query type).
enum MaxsimFloatType { kMaxsimFloat32 = 0, kMaxsimFloat16 = 1, kMaxsimBFloat16 = 2 };

// Surfaces (docs/design.md): which index buffers a kernel reads and how.
// contrastive_padded is contrastive with documents [Nb, Ld, D] and their lengths instead of
// packed documents and offsets.
enum MaxsimSurface {
  kMaxsimPadded = 0, kMaxsimContrastive = 1, kMaxsimPacked = 2, kMaxsimContrastivePadded = 3,
};

// Everything a kernel needs besides the buffers. Index buffers are read through their
// width flag (index_is64[k] for the k-th index buffer), so int32 and int64 mix freely.
struct MaxsimParams {
  // sizes of the surface (unused ones 0)
  maxsim_i64 B, C, Lq, Ld;         // padded (Lq, Ld also contrastive_padded)
  maxsim_i64 Nq, Nb;               // contrastive: Nq queries of Lq rows, Nb documents
  maxsim_i64 Tq, Td;               // rows of queries / documents tensors (all surfaces)
  maxsim_i64 num_pairs;            // scores.numel()
  maxsim_i64 argmax_width;         // argmax row length (Lq, or max_q_len for packed)
  maxsim_i64 dim;
  maxsim_i64 index_size[6];        // element counts of the index buffers
  maxsim_i64 num_owners;           // backward: owners of the gradient being computed
  // residual (ColBERTv2) documents: the codec; unused by the other formats
  maxsim_i64 codes_size;           // element count of document_codes (one per document row)
  maxsim_i64 n_centroids;
  int index_is64[6];
  int index_present[6];            // 0: optional tensor absent (contrastive query_lengths)
  int with_argmax;
  int grid_rows;                   // backward: threadgroups per owner (row passes)
  int codes_is64;                  // residual: document_codes int64 (else int32)
  int nbits;                       // residual: bits per dimension, 1, 2 or 4
  int normalize;                   // residual: 1: each token scaled by 1 / ||t||
  int centroid_dtype;              // residual: MaxsimFloatType of the centroids
  int weight_dtype;                // residual: MaxsimFloatType of the bucket weights
};
