// The emulator's runner: executes every thread of a threadgroup as a cooperating fiber
// (ucontext; or as a real thread for ThreadSanitizer), switching at every barrier and
// simd call. Checks what hardware would not forgive: a barrier reached by only part of
// the threadgroup, a simd call reached by only part of a simdgroup or from different
// call sites (divergent code), an unbound buffer. Errors abort the dispatch and come
// back as a message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace emu {

constexpr unsigned kSimdWidth = 32;

enum Order { kForward = 0, kReverse = 1, kRandom = 2 };

struct ThreadIds {
  unsigned tid, lane, simdgroup;
  unsigned group[3];
  unsigned threads;
};

// the calling GPU thread
ThreadIds& current();

// Scheduling points (called by the metal_stdlib shim).
void threadgroup_rendezvous(const void* site);
// Every lane hands in `deposit` and gets all lanes' deposits once all have arrived.
const uint64_t* simd_rendezvous(const void* site, uint64_t deposit, const void* unused);
// simdgroup_multiply_accumulate: mine = (a, a, b, b, c, c) owned elements; returns the
// 64 row-major elements of a*b+c.
const float* simd_mma_rendezvous(const void* site, const float mine[6]);
// A simd op that needs no other lane (simdgroup_load/store): checked for divergence only.
void simd_step(const void* site);

// Called by the generated trampolines.
void* buffer(void* const* buffers, int index);
void* threadgroup_memory(int index);

using Trampoline = void (*)(void* const* buffers);
bool register_kernel(const char* host_name, Trampoline fn);

struct Dispatch {
  unsigned groups[3];
  unsigned threads;         // per threadgroup
  size_t threadgroup_bytes; // [[threadgroup(0)]], allocated at exactly this size
  int order;                // Order
  uint64_t seed;            // for kRandom
  uint32_t poison;          // 32-bit pattern written over threadgroup memory
  bool real_threads;        // one std::thread per GPU thread (for ThreadSanitizer)
  int num_buffers;
};

// Runs kernel `host_name`; returns "" or the first error.
std::string dispatch(const char* host_name, void* const* buffers, const Dispatch& d);

}  // namespace emu
