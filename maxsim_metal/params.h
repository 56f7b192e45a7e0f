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
  kForwardFloats = kRowMax + kMaxsimQueryRows,
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
  int index_is64[6];
  int index_present[6];            // 0: optional tensor absent (contrastive query_lengths)
  int with_argmax;
  int grid_rows;                   // backward: threadgroups per owner (row passes)
};
