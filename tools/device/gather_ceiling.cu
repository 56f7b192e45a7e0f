// How fast the GPU gathers 256-byte rows that sit in L2, by access pattern, load width, rows in
// flight and warps an SM: the question under the backward's floor (maxsim_cuda/NOTES.md,
// "grad_documents by row, measured"). grad_queries and grad_documents each gather 8.4 M rows of
// 256 bytes on BigColBERT, yet run at 6.9 and 5.2 TB/s on an H200; grad_queries loads 16 bytes
// a lane with 32 rows a warp in flight, grad_documents 8 bytes a lane with 12-16. This separates
// the L2's limit from the kernels' choices. Torch-free; on the GPU machine:
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -o /tmp/gather_ceiling tools/device/gather_ceiling.cu
//   /tmp/gather_ceiling > $OUT/gather_ceiling.jsonl      # up to 192 lines of JSON, under a minute
//
// Each warp gathers its share of 8,388,608 rows and folds them into registers written once at
// the end; at least `rows_in_flight` rows are requested before their adds (ptxas may start the
// next group's loads under them). `lane_bytes` 8: a row a load instruction, 8 bytes a lane (what
// grad_documents does); 16: two rows an instruction, lanes 0-15 and 16-31 (what grad_queries
// does). Patterns of the row indices over a table of 4 MB (BigColBERT's queries) or 23.6 MB
// (its documents):
//   random      uniform over the table (every warp its own stream)
//   window32    all warps walk the table together: a warp's j-th gather falls in a 32-row
//               window (one query's 8 KB) that moves every 32 gathers, the same window for
//               every warp at the same j: grad_documents' entry order, query by query
//   window1024  the same with 1,024-row windows (256 KB: the sorted kernel's batch of 32 queries)
//   sequential  row = j modulo the table, per warp offset by its number (a streaming reference)
// Occupancy: 256-thread CTAs, 1 / 2 / 4 / 8 an SM, held there by their dynamic shared memory; a
// depth whose registers do not allow the count is left out of that count's lines.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda_check.h"


constexpr int kRowWords = 32;  // a 256-byte row as 32 x uint2 (8 bytes a lane)
constexpr int64_t kGathers = int64_t(1) << 23;

// IN_FLIGHT rows a warp at a time. WIDE: 16 bytes a lane, so a load instruction takes two
// rows and the group IN_FLIGHT / 2 instructions; else 8 bytes a lane, one row an instruction.
template <int IN_FLIGHT, bool WIDE>
__global__ void __launch_bounds__(256) gather_kernel(const uint2* __restrict__ table, const int* __restrict__ idx,
                                                     int per_warp, float* __restrict__ out) {
  extern __shared__ unsigned char occupancy_only[];  // sized by the host to cap CTAs an SM
  constexpr int kLoads = WIDE ? IN_FLIGHT / 2 : IN_FLIGHT;
  const int lane = threadIdx.x % 32;
  const int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int* my = idx + warp * per_warp;
  float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
  for (int j = 0; j < per_warp; j += 32) {
    const int mine = __ldg(my + j + lane);  // 32 indices a coalesced load
#pragma unroll
    for (int g = 0; g < 32; g += IN_FLIGHT) {
      uint4 v[kLoads];
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {
        if constexpr (WIDE) {
          const int row = __shfl_sync(0xffffffffu, mine, g + 2 * u + lane / 16);
          v[u] = __ldg(reinterpret_cast<const uint4*>(table + int64_t(row) * kRowWords) + lane % 16);
        } else {
          const int row = __shfl_sync(0xffffffffu, mine, g + u);
          const uint2 w = __ldg(table + int64_t(row) * kRowWords + lane);
          v[u] = make_uint4(w.x, w.y, 0u, 0u);
        }
      }
      // A branch on every loaded word before any add: ptxas otherwise software-pipelines each
      // depth into the same ~7 loads in flight (volatile asm does not stop its scheduler).
      uint32_t all = 0;
#pragma unroll
      for (int u = 0; u < kLoads; ++u) all ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
      if (all == 0x9E3779B9u) out[warp * 32 + lane] = -1.f;  // rarely if ever taken; overwritten below
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {  // two bfloat16 a word, widened as the kernels do
        a0 += __uint_as_float(v[u].x << 16) + __uint_as_float(v[u].z << 16);
        a1 += __uint_as_float(v[u].x & 0xffff0000u) + __uint_as_float(v[u].z & 0xffff0000u);
        a2 += __uint_as_float(v[u].y << 16) + __uint_as_float(v[u].w << 16);
        a3 += __uint_as_float(v[u].y & 0xffff0000u) + __uint_as_float(v[u].w & 0xffff0000u);
      }
    }
  }
  out[warp * 32 + lane] = a0 + a1 + a2 + a3;
  if (per_warp < 0) occupancy_only[threadIdx.x] = 0;  // never: keeps the allocation
}

static uint32_t mix(uint64_t x) {  // splitmix64's finaliser: a cheap, well-spread hash
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return uint32_t(x ^ (x >> 31));
}

// Row indices laid out [warp][j] for `warps` warps of `per_warp` gathers each.
static std::vector<int> make_indices(const char* pattern, int rows, int64_t warps, int per_warp) {
  std::vector<int> idx(size_t(warps) * per_warp);
  const std::string p(pattern);
  const bool random = p == "random";
  const int window = p == "window32" ? 32 : (p == "window1024" ? 1024 : 0);
  for (int64_t w = 0; w < warps; ++w) {
    for (int j = 0; j < per_warp; ++j) {
      const uint64_t k = uint64_t(w) * per_warp + j;
      int row;
      if (random) {
        row = int(mix(k) % uint32_t(rows));
      } else if (window) {
        const int64_t base = (int64_t(j / 32) * window) % rows;  // the window every warp is in at step j
        row = int((base + mix(k) % uint32_t(window)) % rows);
      } else {  // sequential
        row = int((int64_t(w) * 97 + j) % rows);
      }
      idx[size_t(k)] = row;
    }
  }
  return idx;
}

static int prop_sms() {
  static int sms = [] {
    int n = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, 0));
    return n;
  }();
  return sms;
}

// CTAs an SM the kernel can hold at this shared memory (its registers allow fewer at depth 32:
// 80-88 a thread).
template <int IN_FLIGHT, bool WIDE>
static int resident_ctas(size_t smem) {
  CUDA_CHECK(cudaFuncSetAttribute(gather_kernel<IN_FLIGHT, WIDE>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  int n = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, gather_kernel<IN_FLIGHT, WIDE>, 256, smem));
  return n;
}

template <int IN_FLIGHT, bool WIDE>
static float time_us(const uint2* table, const int* idx, int per_warp, float* out, int grid, size_t smem) {
  if (resident_ctas<IN_FLIGHT, WIDE>(smem) * int64_t(prop_sms()) < grid) return -1.f;  // not one wave
  gather_kernel<IN_FLIGHT, WIDE><<<grid, 256, smem>>>(table, idx, per_warp, out);  // warm-up, and the L2 filled
  CUDA_CHECK(cudaGetLastError());
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int r = 0; r < 7; ++r) {
    CUDA_CHECK(cudaEventRecord(a));
    gather_kernel<IN_FLIGHT, WIDE><<<grid, 256, smem>>>(table, idx, per_warp, out);
    CUDA_CHECK(cudaEventRecord(b));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0.f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1e3f);
  }
  std::sort(t.begin(), t.end());
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  return t[t.size() / 2];
}

int main() {
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  const size_t smem_sm = prop.sharedMemPerMultiprocessor;
  std::fprintf(stderr, "%s: %d SMs, %zu KB shared memory an SM, L2 %d MB\n", prop.name, sms, smem_sm >> 10,
               prop.l2CacheSize >> 20);
  const int table_rows[] = {16384, 92160};  // 4 MB (512 x 32 query rows), 23.6 MB (512 x 180 document rows)
  const char* patterns[] = {"random", "window32", "window1024", "sequential"};
  const int ctas_per_sm[] = {1, 2, 4, 8};
  uint2* table;
  CUDA_CHECK(cudaMalloc(&table, size_t(92160) * 256));
  {
    std::vector<uint32_t> fill(size_t(92160) * 64);
    for (size_t i = 0; i < fill.size(); ++i) fill[i] = 0x3c003c00u ^ (mix(i) & 0x00ff00ffu);  // finite bfloat16 pairs
    CUDA_CHECK(cudaMemcpy(table, fill.data(), fill.size() * 4, cudaMemcpyHostToDevice));
  }
  for (int ctas : ctas_per_sm) {
    const int grid = sms * ctas;
    const int64_t warps = int64_t(grid) * 8;
    int per_warp = int(kGathers / warps);
    per_warp -= per_warp % 32;
    const size_t smem = smem_sm / ctas - 2048;  // a little under an SM's share: `ctas` fit, no more
    float* out;
    int* idx;
    CUDA_CHECK(cudaMalloc(&out, size_t(warps) * 32 * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&idx, size_t(warps) * per_warp * sizeof(int)));
    for (int rows : table_rows) {
      for (const char* pattern : patterns) {
        const std::vector<int> h = make_indices(pattern, rows, warps, per_warp);
        CUDA_CHECK(cudaMemcpy(idx, h.data(), h.size() * sizeof(int), cudaMemcpyHostToDevice));
        const double bytes = double(warps) * per_warp * 256.0;
        struct Config {
          int depth;
          bool wide;
          float us;
        };
        const Config configs[] = {{8, false, time_us<8, false>(table, idx, per_warp, out, grid, smem)},
                                  {16, false, time_us<16, false>(table, idx, per_warp, out, grid, smem)},
                                  {32, false, time_us<32, false>(table, idx, per_warp, out, grid, smem)},
                                  {8, true, time_us<8, true>(table, idx, per_warp, out, grid, smem)},
                                  {16, true, time_us<16, true>(table, idx, per_warp, out, grid, smem)},
                                  {32, true, time_us<32, true>(table, idx, per_warp, out, grid, smem)}};
        for (const Config& c : configs) {
          if (c.us < 0.f) continue;  // the registers do not hold `ctas` CTAs an SM at this depth
          std::printf("{\"pattern\": \"%s\", \"table_MB\": %.1f, \"warps_per_sm\": %d, \"rows_in_flight\": %d, "
                      "\"lane_bytes\": %d, \"gathers\": %lld, \"us\": %.2f, \"TBps\": %.3f}\n",
                      pattern, rows * 256.0 / 1e6, ctas * 8, c.depth, c.wide ? 16 : 8,
                      (long long)(warps * per_warp), c.us, bytes / (c.us * 1e-6) / 1e12);
        }
        std::fflush(stdout);
      }
    }
    CUDA_CHECK(cudaFree(out));
    CUDA_CHECK(cudaFree(idx));
  }
  CUDA_CHECK(cudaFree(table));
  return 0;
}
