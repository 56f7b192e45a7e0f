// Where the block scheduler puts a programmatically launched grid's CTAs, and what that costs
// a call: the question under "Long documents at five to six candidates: PDL costs 20-50%"
// (maxsim_cuda/NOTES.md). There maxsim's rerank at B 32, C 5, Ld 1,024 (160 CTAs of one
// 1,024-row step, two CTAs an SM) took 16.6 us a call with PDL and 11.0 without, while C 4
// and C 8 gained from it. The hypothesis: the next grid launches once every CTA of the
// running one has signalled; at that moment the SMs holding two of its CTAs are still full, so
// the next grid's CTAs all land on the other SMs, doubled up where two would have been spread.
// This harness has no maxsim in it: a memory-bound kernel of the same shape (each CTA streams
// its own 256 KB, dynamic shared memory caps two CTAs an SM), launched K times back to back in
// a CUDA graph with and without programmatic stream serialisation, the dependent signal at
// the CTA's start, three quarters through its loads, or its exit. Every CTA stamps its SM, when
// it became resident, when griddepcontrol.wait let it go and when it ended (%globaltimer), so
// each line says how a launch's CTAs were spread (the most CTAs any SM held, the SMs that held
// none) and how long they sat resident early, beside its time a call. Torch-free; on the GPU
// machine:
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -o /tmp/pdl_placement tools/device/pdl_placement.cu
//   /tmp/pdl_placement > $OUT/pdl_placement.jsonl      # 88 lines of JSON, under a minute
//
// Grid sizes from one CTA an SM to two; sets 1 (the same 256 KB slices every launch, which
// partly stay in L2 between launches at 160 CTAs: 42 MB) or 4 (rotated, from DRAM).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "cuda_check.h"

constexpr int kThreads = 256;
constexpr int kSliceBytes = 256 * 1024;  // one 1,024-row float16 document at dim 128
constexpr int kLaunches = 24;             // a graph's launches; the first 4 are not read
constexpr int kSets = 4;

struct Stamp {
  unsigned sm;
  unsigned long long resident, t0, t1;  // on the SM; past griddepcontrol.wait; done
};

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ unsigned sm_id() {
  unsigned s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}

// SIGNAL: 0 at the start, 1 after three quarters of the loads are issued, 2 never (the
// implicit signal at exit).
template <int SIGNAL>
__global__ void __launch_bounds__(kThreads) stream_kernel(const uint4* __restrict__ slices, int slice0,
                                                           Stamp* __restrict__ stamps, uint4* __restrict__ sink) {
  extern __shared__ unsigned char occupancy_only[];  // sized by the host: two CTAs an SM
  const unsigned long long resident = global_ns();
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const unsigned long long t0 = global_ns();
  if constexpr (SIGNAL == 0) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  constexpr int kIters = kSliceBytes / (kThreads * 16);  // 64
  const uint4* src = slices + (int64_t(slice0) + blockIdx.x) * (kSliceBytes / 16) + threadIdx.x;
  uint4 acc = make_uint4(0, 0, 0, 0);
#pragma unroll 8
  for (int i = 0; i < kIters; ++i) {
    if constexpr (SIGNAL == 1) {
      if (i == kIters * 3 / 4) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    }
    const uint4 v = __ldg(src + i * kThreads);
    acc.x ^= v.x;
    acc.y ^= v.y;
    acc.z ^= v.z;
    acc.w ^= v.w;
  }
  if (acc.x == 0x9e3779b9u && acc.y == 0x7f4a7c15u) sink[threadIdx.x] = acc;  // never, in practice
  __syncthreads();
  if (threadIdx.x == 0) stamps[blockIdx.x] = Stamp{sm_id(), resident, t0, global_ns()};
}

using Kernel = void (*)(const uint4*, int, Stamp*, uint4*);

static void launch(Kernel k, int grid, size_t smem, bool pdl, cudaStream_t s, const uint4* slices, int slice0,
                   Stamp* stamps, uint4* sink) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, k, slices, slice0, stamps, sink));
}

int main() {
  int dev = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  int smem_sm = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
  // Two CTAs an SM: each takes just over a third of the SM's shared memory.
  const size_t smem = size_t(smem_sm) / 3 + 1024;
  const Kernel kernels[3] = {stream_kernel<0>, stream_kernel<1>, stream_kernel<2>};
  const char* signal_names[3] = {"start", "three_quarters", "exit"};
  for (Kernel k : kernels) {
    CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    int per_sm = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, kThreads, smem));
    if (per_sm != 2) {
      std::fprintf(stderr, "expected two CTAs an SM, got %d\n", per_sm);
      return 1;
    }
  }
  const int max_grid = 2 * sms;
  uint4* slices = nullptr;
  uint4* sink = nullptr;
  Stamp* stamps = nullptr;
  CUDA_CHECK(cudaMalloc(&slices, size_t(kSets) * max_grid * kSliceBytes));
  CUDA_CHECK(cudaMemset(slices, 1, size_t(kSets) * max_grid * kSliceBytes));
  CUDA_CHECK(cudaMalloc(&sink, kThreads * sizeof(uint4)));
  CUDA_CHECK(cudaMalloc(&stamps, size_t(kLaunches) * max_grid * sizeof(Stamp)));
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<Stamp> host(size_t(kLaunches) * max_grid);
  const int grids[] = {sms - 4, sms, sms + 3, sms + sms / 8, 160, sms + sms / 3, 192, sms + sms * 2 / 3, 224,
                       2 * sms - 8, 2 * sms};
  for (int grid : grids) {
    if (grid > max_grid) continue;
    for (int sets : {1, kSets}) {
      for (int sig = 0; sig < 3; ++sig) {
        for (int pdl = 0; pdl < 2; ++pdl) {
          if (!pdl && sig != 2) continue;  // without PDL the signal changes nothing
          cudaGraph_t g;
          cudaGraphExec_t ge;
          CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
          for (int l = 0; l < kLaunches; ++l) {
            launch(kernels[sig], grid, smem, pdl != 0, s, slices, (l % sets) * max_grid,
                   stamps + size_t(l) * max_grid, sink);
          }
          CUDA_CHECK(cudaStreamEndCapture(s, &g));
          CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
          for (int w = 0; w < 3; ++w) CUDA_CHECK(cudaGraphLaunch(ge, s));
          std::vector<float> times;
          for (int r = 0; r < 7; ++r) {
            CUDA_CHECK(cudaEventRecord(e0, s));
            CUDA_CHECK(cudaGraphLaunch(ge, s));
            CUDA_CHECK(cudaEventRecord(e1, s));
            CUDA_CHECK(cudaEventSynchronize(e1));
            float ms = 0.f;
            CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
            times.push_back(ms * 1000.f / kLaunches);
          }
          std::sort(times.begin(), times.end());
          CUDA_CHECK(cudaMemcpy(host.data(), stamps, host.size() * sizeof(Stamp), cudaMemcpyDeviceToHost));
          // Per launch after the first four: the most CTAs one SM ran, the SMs that ran none,
          // the span from its first CTA's start (past the wait) to its last CTA's end, how
          // long its CTAs sat resident before the wait let them go, and the time from the
          // previous launch's last end to this one's (the period a call costs).
          double most = 0, idle = 0, span = 0, gap = 0, waited = 0;
          int counted = 0;
          unsigned long long prev_end = 0;
          for (int l = 4; l < kLaunches; ++l) {
            std::vector<int> per(sms + 1, 0);
            unsigned long long first = ~0ull, last = 0;
            for (int b = 0; b < grid; ++b) {
              const Stamp& st = host[size_t(l) * max_grid + b];
              per[std::min<unsigned>(st.sm, unsigned(sms))]++;
              first = std::min(first, st.t0);
              last = std::max(last, st.t1);
              waited += double(st.t0 - st.resident) / 1000.0 / grid;
            }
            most += *std::max_element(per.begin(), per.begin() + sms);
            idle += std::count(per.begin(), per.begin() + sms, 0);
            span += double(last - first) / 1000.0;
            if (prev_end) gap += (double(last) - double(prev_end)) / 1000.0;
            prev_end = last;
            ++counted;
          }
          std::printf("{\"grid\": %d, \"sms\": %d, \"sets\": %d, \"pdl\": %d, \"signal\": \"%s\", "
                      "\"us_per_call\": %.2f, \"most_ctas_an_sm\": %.2f, \"idle_sms\": %.1f, "
                      "\"span_us\": %.2f, \"resident_before_start_us\": %.2f, \"end_to_end_us\": %.2f}\n",
                      grid, sms, sets, pdl, pdl ? signal_names[sig] : "none", times[times.size() / 2],
                      most / counted, idle / counted, span / counted, waited / counted, gap / (counted - 1));
          std::fflush(stdout);
          CUDA_CHECK(cudaGraphExecDestroy(ge));
          CUDA_CHECK(cudaGraphDestroy(g));
        }
      }
    }
  }
  return 0;
}
