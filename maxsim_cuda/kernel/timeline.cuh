// Per-CTA event times of the sm_90a byte kernel, for tools/device/timeline_bytes.cu: where a
// one-step CTA's time goes before its first tile (issue 19's LongDocStress row, whose consumers
// spend ~40% of their samples waiting for that tile). Compiled in only with -DMAXSIM_TIMELINE,
// which no build of the package sets; without it every stamp is an empty function, and the
// kernels compile to the same SASS as with no stamps at all (compared with cuobjdump).
#pragma once

#include <cstdint>

namespace maxsim_cuda {
namespace kernel {

// clock64 values (the CTA's SM's cycles) except the two *Ns events (%globaltimer, ns, comparable
// across SMs) and kTlSm. A CTA of several steps keeps its last step's consumer events.
enum TimelineEvent : int {
  kTlStart,       // kernel entry, before the barriers' initialisation
  kTlFirstIssue,  // producer: the first tile's TMA issued ahead of the step's lengths
  kTlFirstInfo,   // producer: the lengths read, the first slot's TileInfo written
  kTlFirstTile,   // consumer warpgroup 0: a step's first slot seen full
  kTlQuery,       // consumer warpgroup 0: the step's query seen full
  kTlChainEnd0,   // consumer warpgroup 0 (1): the step's last tile folded
  kTlChainEnd1,
  kTlEnd,         // consumer warpgroup 0: the step's epilogue written
  kTlStartNs,
  kTlEndNs,
  kTlSm,
  kTlEvents
};

#ifdef MAXSIM_TIMELINE
constexpr int kTimelineCtas = 1024;
static __device__ unsigned long long g_timeline[kTimelineCtas][kTlEvents];

__device__ __forceinline__ void timeline_stamp(int event) {
  if (blockIdx.x < kTimelineCtas) g_timeline[blockIdx.x][event] = clock64();
}
__device__ __forceinline__ void timeline_stamp_ns(int event) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  if (blockIdx.x < kTimelineCtas) g_timeline[blockIdx.x][event] = t;
}
__device__ __forceinline__ void timeline_start() {
  unsigned sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  if (blockIdx.x < kTimelineCtas) g_timeline[blockIdx.x][kTlSm] = sm;
  timeline_stamp_ns(kTlStartNs);
  timeline_stamp(kTlStart);
}
#else
__device__ __forceinline__ void timeline_stamp(int) {}
__device__ __forceinline__ void timeline_stamp_ns(int) {}
__device__ __forceinline__ void timeline_start() {}
#endif

}  // namespace kernel
}  // namespace maxsim_cuda
