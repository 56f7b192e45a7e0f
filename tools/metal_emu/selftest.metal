// Kernels with deliberate bugs: the emulator must report each (tests/test_metal_emulated.py).
#include <metal_stdlib>

using namespace metal;

// A barrier only half of the threadgroup reaches.
template <int kUnused>
kernel void divergent_barrier(device float* out [[buffer(0)]],
                              uint tid [[thread_index_in_threadgroup]]) {
  if (tid < 64) threadgroup_barrier(mem_flags::mem_threadgroup);
  out[tid] = 1.0f;
}

// A simd shuffle only half of a simdgroup reaches.
template <int kUnused>
kernel void divergent_shuffle(device float* out [[buffer(0)]],
                              uint lane [[thread_index_in_simdgroup]],
                              uint tid [[thread_index_in_threadgroup]]) {
  float x = float(lane);
  if (lane < 16) x = simd_shuffle_xor(x, 1);
  out[tid] = x;
}

// Reads a neighbour's threadgroup slot with no barrier after the writes.
template <int kUnused>
kernel void missing_barrier(device float* out [[buffer(0)]],
                            threadgroup float* tg [[threadgroup(0)]],
                            uint tid [[thread_index_in_threadgroup]],
                            uint n [[threads_per_threadgroup]]) {
  tg[tid] = float(tid);
  out[tid] = tg[(tid + 1) % n];
}

// Reads another lane's simdgroup_store output without a simdgroup_barrier (relies on
// lanes running in lockstep).
template <int kUnused>
kernel void lockstep_reliance(device float* out [[buffer(0)]],
                              threadgroup float* tg [[threadgroup(0)]],
                              uint lane [[thread_index_in_simdgroup]],
                              uint sg [[simdgroup_index_in_threadgroup]],
                              uint tid [[thread_index_in_threadgroup]]) {
  simdgroup_float8x8 m = make_filled_simdgroup_matrix<float, 8, 8>(float(sg + 1));
  simdgroup_store(m, tg + sg * 64, 8);
  out[tid] = tg[sg * 64 + (lane * 2 + 17) % 64];
}

#define SELFTEST(name) template [[host_name(#name)]] [[kernel]] decltype(name<0>) name<0>;
SELFTEST(divergent_barrier)
SELFTEST(divergent_shuffle)
SELFTEST(missing_barrier)
SELFTEST(lockstep_reliance)
