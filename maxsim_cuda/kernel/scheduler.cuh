// How work maps to CTAs. Every surface is a linear sequence of steps (query block x
// document); the grid is persistent (at most one wave of resident CTAs) and CTA k takes
// the contiguous step range [k*S/G, (k+1)*S/G). Consecutive steps that share a query
// block keep it on chip, and the document tile stream runs across step boundaries so the
// cp.async pipeline never drains between documents. Torch-free.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>

namespace maxsim_cuda {
namespace kernel {

// a / b for a >= 0, b > 0: an inline 32-bit divide when both fit. The 64-bit divide is a
// call (tens of instructions, and spills around it in the resource report); the forward
// pays it per step and the backward per entry batch.
__host__ __device__ __forceinline__ int64_t div_nonneg(int64_t a, int64_t b) {
  if (((a | b) >> 31) == 0) return int64_t(uint32_t(a) / uint32_t(b));
  return a / b;
}

struct StepRange {
  int64_t begin, end;
};

__device__ __forceinline__ StepRange cta_steps(int64_t total, int64_t ctas, int64_t cta) {
  StepRange r;
  // total * cta fits easily: total < 2^40 in practice, cta < 2^20
  r.begin = total / ctas * cta + (total % ctas) * cta / ctas;
  r.end = total / ctas * (cta + 1) + (total % ctas) * (cta + 1) / ctas;
  return r;
}

// Contrastive step order: documents in groups of `group` docs; inside a group, query-block
// major. A CTA therefore keeps one query block for up to `group` documents, and the
// blocks that read a document group run at about the same time (L2 reuse).
struct GroupedOrder {
  int64_t nq_blocks;
  int64_t num_docs;
  int64_t group;

  __host__ __device__ void map(int64_t s, int64_t& qb, int64_t& n) const {
    const int64_t per_group = nq_blocks * group;
    const int64_t g = div_nonneg(s, per_group);
    const int64_t r = s - g * per_group;
    const int64_t first = g * group;
    const int64_t left = num_docs - first;
    const int64_t size = left < group ? left : group;
    qb = div_nonneg(r, size);
    n = first + (r - qb * size);
  }
};

// Host side: CTAs for a persistent launch.
inline int64_t plan_ctas(int64_t steps, int num_sms, int ctas_per_sm) {
  int64_t resident = static_cast<int64_t>(num_sms > 0 ? num_sms : 1) * (ctas_per_sm > 0 ? ctas_per_sm : 1);
  return steps < resident ? steps : resident;
}

// Host side: CTAs an SM for a kernel compiled to share an SM (`resident` of them fit) whose
// co-resident CTAs each run a step about 5/3 as long as one CTA alone does (the FFMA mainloop
// at two an SM, H200, 2026-11-28, tools/device/ab_trees.py --group ffma_two_ctas). Sharing
// loses where the steps fill two waves of single CTAs and part of a third (320 and 384 steps
// on 132 SMs: three steps alone beat two shared by 1.11x) and gains elsewhere (256 steps
// 0.85x, 448 0.82x, 608 0.97x, 1,000-3,200 0.70-0.84x), and within one wave either is one step.
inline int shared_sm_ctas(int64_t steps, int num_sms, int resident) {
  if (resident < 2) return resident;
  const int64_t n = num_sms > 0 ? num_sms : 1;
  const int64_t alone = (steps + n - 1) / n, shared = (steps + 2 * n - 1) / (2 * n);
  return 3 * alone < 5 * shared ? 1 : resident;
}

// Largest dynamic shared memory a block may opt into on the current device (cached).
inline size_t max_smem_optin() {
  static int cache[64] = {0};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 48 * 1024;
  int& c = cache[dev & 63];
  if (c == 0) {
    int v = 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess || v <= 0) {
      v = 48 * 1024;
    }
    c = v;
  }
  return static_cast<size_t>(c);
}

// Host side: resident CTAs per SM of one kernel on the current device (what the device
// reports, at least 1 and at most `cap`: a grid planned for two per SM that gets one would run
// in two waves), cached per device and per kernel. Dynamic shared memory past 48 KB is allowed
// first. No sync: capture-safe once cached, and the first call is a host-only query.
template <auto kKernel>
cudaError_t resident_ctas(int threads, size_t smem, int cap, int& ctas) {
  static int cache[64] = {0};
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  int& occ = cache[dev & 63];
  if (occ == 0) {
    if (smem > 48 * 1024) {
      err = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
      if (err != cudaSuccess) return err;
    }
    int o = 0;
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o, kKernel, threads, smem);
    if (err != cudaSuccess) return err;
    occ = o < 1 ? 1 : (o > cap ? cap : o);
  }
  ctas = occ;
  return cudaSuccess;
}

// Host side: whether kKernel's code on the current device was built for sm_90 or later (so
// it holds wait_prior_grids' instruction): an sm_80 build JIT-compiled for a Hopper card does
// not, and must not start before the previous kernel has finished. Cached per device.
// MAXSIM_CUDA_PDL=0 turns programmatic launches off (read per call: comparisons).
template <auto kKernel>
bool programmatic_launch_safe() {
  const char* e = std::getenv("MAXSIM_CUDA_PDL");
  if (e != nullptr && e[0] == '0') return false;
  static signed char cache[64] = {0};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  signed char& ok = cache[dev & 63];
  if (ok == 0) {
    cudaFuncAttributes attr{};
    ok = cudaFuncGetAttributes(&attr, kKernel) == cudaSuccess && attr.ptxVersion >= 90 && attr.binaryVersion >= 90
             ? 1
             : -1;
  }
  return ok > 0;
}

// Host side: the forward kernels' launch, programmatic (PDL) where programmatic_launch_safe.
// The kernels call wait_prior_grids before touching global memory and allow_dependent_grids
// once they have, so the next call's CTAs start as this call's leave the SMs: about 0.4-0.8
// us a call in a CUDA graph of back-to-back calls (H200, 2026-11-26; maxsim_cuda/NOTES.md).
template <auto kKernel, class... Args>
cudaError_t launch_programmatic(unsigned ctas, int threads, size_t smem, cudaStream_t stream, const Args&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(ctas);
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = programmatic_launch_safe<kKernel>() ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kKernel, args...);
}

}  // namespace kernel
}  // namespace maxsim_cuda
