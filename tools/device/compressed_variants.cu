// Standalone timing of block-shape and loop-order variants of the compressed (int8) padded
// rerank on mma.sync, without torch: one binary, every variant on the same inputs, CUDA-event
// medians, results compared with the library's configuration. An experiment harness for
// maxsim_cuda/NOTES.md ("Compressed documents"); not part of the package.
//
// Build here (nvcc, no GPU needed) and run the binary on the device:
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode arch=compute_90a,code=sm_90a \
//        -o build/compressed_variants tools/device/compressed_variants.cu
//   build/compressed_variants            # HeavyRerank: B 32, C 100, Lq 32, Ld 256, dim 128
//   build/compressed_variants 1 1000 32 300   # B C Lq Ld
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "../../maxsim_cuda/kernel/forward_kernel.cuh"
#include "cuda_check.h"

using namespace maxsim_cuda;
using namespace maxsim_cuda::kernel;

// k-step-major order: all of a k-quarter's document words are read first, then each k-step
// runs over every n8 tile, so consecutive MMAs write different accumulators (the library's
// order runs one n8 tile's four k-steps back to back).
template <class Base>
struct KMajor : Base {
  using Base::KS;
  using Base::MT;
  using Base::NT;
  using Base::NTW;
  using Base::KD;
  using Base::BN;
  using typename Base::Swz;
  using typename Base::Elem;
  using typename Base::DocT;
  __device__ __forceinline__ void compute(int stage, const DocT*, int64_t, int cols_valid, int col_base,
                                          bool with_index) {
    float acc[MT][NT][4];
    zero_acc(acc);
    const int g = this->lane / 4, t4 = this->lane % 4;
    const uint32_t base = this->stage_addr(stage);
#pragma unroll
    for (int kq = 0; kq < KS / 4; ++kq) {
      uint32_t w[NT][4];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int r = this->wn * NTW + nt * 8 + g;
        const uint4 raw = ld_shared_v4(base + uint32_t(r * KD + Swz::chunk(r, 4 * kq + t4) * 16));
        w[nt][0] = raw.x;
        w[nt][1] = raw.y;
        w[nt][2] = raw.z;
        w[nt][3] = raw.w;
      }
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          uint32_t b0, b1;
          widen_word<Elem, DocFormat::kInt8>(w[nt][j], b0, b1);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) Mma16816<Elem>::run(acc[mt][nt], this->qa[mt][4 * kq + j], b0, b1);
        }
    }
    scale_columns<DocFormat::kInt8>(acc, base + uint32_t(BN * KD), this->wn * NTW + 2 * t4);
    this->row_max.fold(acc, this->lane, this->wn, cols_valid, col_base, with_index);
  }
};

// No document bytes copied (only the scales): the tile loop's cost without DRAM traffic,
// on whatever the stages held. For the cp.async kernel only.
template <class Base>
struct NoDocCopies : Base {
  using typename Base::DocT;
  __device__ __forceinline__ void load_tile(int stage, const DocT*, int64_t row0, int rows) const {
    load_scales<Base::BN, Base::kThreads>(this->stage_addr(stage) + uint32_t(Base::BN * Base::KD), this->doc_scales, row0,
                                         rows);
  }
};

struct Inputs {
  int64_t B = 32, C = 100, Lq = 32, Ld = 256, D = 128;
  __half* q = nullptr;
  __half* docs16 = nullptr;
  uint8_t* docs8 = nullptr;
  float* scales = nullptr;
  float* scores = nullptr;
  int* qlens = nullptr;  // every length full (a null length tensor would mark each step bad)
  int* dlens = nullptr;
  int num_sms = 0;
};

ForwardParams params(const Inputs& in, bool compressed) {
  ForwardParams p;
  p.surface = Surface::kPadded;
  p.dtype = DType::kF16;
  p.doc_format = compressed ? DocFormat::kInt8 : DocFormat::kNative;
  p.queries = in.q;
  p.documents = compressed ? static_cast<const void*>(in.docs8) : static_cast<const void*>(in.docs16);
  p.doc_scales = compressed ? in.scales : nullptr;
  p.dim = in.D;
  p.q_rows = in.B * in.Lq;
  p.d_rows = in.B * in.C * in.Ld;
  p.num_queries = in.B;
  p.cands = in.C;
  p.lq = in.Lq;
  p.ld = in.Ld;
  p.pairs = in.B * in.C;
  p.query_lengths = IndexRef{in.qlens, in.B, 0};
  p.doc_lengths = IndexRef{in.dlens, in.B * in.C, 0};
  p.num_sms = in.num_sms;
  p.scores = in.scores;
  return p;
}

template <class F>
float median_ms(F&& f, int reps = 30) {
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) CUDA_CHECK(f());
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    CUDA_CHECK(cudaEventRecord(a));
    CUDA_CHECK(f());
    CUDA_CHECK(cudaEventRecord(b));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::vector<float> ref_scores;

std::vector<float> library_scores;

template <class ML>
void run(const char* name, const Inputs& in, bool compressed, double bytes) {
  const ForwardParams p = params(in, compressed);
  CUDA_CHECK(cudaMemset(in.scores, 0xff, sizeof(float) * p.pairs));
  const float ms = median_ms([&] {
    return run_surface<ML, 0>(p);
  });
  std::vector<float> s(p.pairs);
  CUDA_CHECK(cudaMemcpy(s.data(), in.scores, sizeof(float) * p.pairs, cudaMemcpyDeviceToHost));
  double err = 0;
  if (ref_scores.empty()) ref_scores = s;  // the first variant (fp16 documents = the dequantised int8)
  for (size_t i = 0; i < s.size(); ++i) {
    const double d = double(std::fabs(s[i] - ref_scores[i])) / (1e-6 + std::fabs(ref_scores[i]));
    err = (d == d && err == err) ? std::max(err, d) : NAN;
  }
  const char* same = "";
  if (compressed) {
    if (library_scores.empty()) library_scores = s;
    same = std::equal(s.begin(), s.end(), library_scores.begin(),
                      [](float x, float y) { return std::memcmp(&x, &y, 4) == 0; })
               ? "  bitwise = library"
               : "  DIFFERS from library";
  }
  std::printf("%-44s %8.4f ms  %7.0f GB/s  rel.diff %.1e%s\n", name, ms, bytes / ms * 1e-6, err, same);
}

__global__ void copy_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}

int main(int argc, char** argv) {
  Inputs in;
  if (argc == 5) {  // B C Lq Ld
    in.B = std::atoll(argv[1]);
    in.C = std::atoll(argv[2]);
    in.Lq = std::atoll(argv[3]);
    in.Ld = std::atoll(argv[4]);
  }
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  in.num_sms = prop.multiProcessorCount;
  const int64_t qn = in.B * in.Lq * in.D, rows = in.B * in.C * in.Ld, dn = rows * in.D;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  std::vector<__half> hq(qn);
  for (auto& x : hq) x = __float2half(nd(rng));
  std::vector<int8_t> h8(dn);
  std::uniform_int_distribution<int> ud(-127, 127);
  for (auto& x : h8) x = int8_t(ud(rng));
  std::vector<float> hs(rows);
  for (auto& x : hs) x = 0.01f * (1.f + 0.1f * std::fabs(nd(rng)));
  std::vector<__half> h16(dn);
  for (int64_t i = 0; i < dn; ++i) h16[i] = __float2half(float(h8[i]) * hs[i / in.D]);
  CUDA_CHECK(cudaMalloc(&in.q, qn * 2));
  CUDA_CHECK(cudaMalloc(&in.docs16, dn * 2));
  CUDA_CHECK(cudaMalloc(&in.docs8, dn));
  CUDA_CHECK(cudaMalloc(&in.scales, rows * 4));
  CUDA_CHECK(cudaMalloc(&in.scores, in.B * in.C * 4));
  std::vector<int> ql(in.B, int(in.Lq)), dl(in.B * in.C, int(in.Ld));
  CUDA_CHECK(cudaMalloc(&in.qlens, in.B * 4));
  CUDA_CHECK(cudaMalloc(&in.dlens, in.B * in.C * 4));
  CUDA_CHECK(cudaMemcpy(in.qlens, ql.data(), in.B * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(in.dlens, dl.data(), in.B * in.C * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(in.q, hq.data(), qn * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(in.docs16, h16.data(), dn * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(in.docs8, h8.data(), dn, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(in.scales, hs.data(), rows * 4, cudaMemcpyHostToDevice));
  std::printf("%s, %d SMs; B %lld C %lld Lq %lld Ld %lld dim %lld\n", prop.name, in.num_sms, (long long)in.B,
              (long long)in.C, (long long)in.Lq, (long long)in.Ld, (long long)in.D);

  uint8_t* dst = nullptr;
  CUDA_CHECK(cudaMalloc(&dst, dn));
  const float copy_ms = median_ms([&] {
    copy_kernel<<<in.num_sms * 8, 512>>>(reinterpret_cast<const uint4*>(in.docs8), reinterpret_cast<uint4*>(dst), dn / 16);
    return cudaGetLastError();
  });
  std::printf("%-44s %8.4f ms  %7.0f GB/s (read + write)\n", "copy of the int8 values", copy_ms, 2.0 * dn / copy_ms * 1e-6);

  const double b16 = 2.0 * dn, b8 = double(dn) + 4.0 * rows;
  using H = __half;
  constexpr DocFormat I8 = DocFormat::kInt8;
  run<MmaMainloop<H, 128, 32, 64, 2, 2, 4, 3>>("fp16 mma.sync 2x2 BN64 S4 3cta", in, false, b16);
  run<MmaMainloop<H, 128, 32, 128, 1, 4, 4, 3, I8>>("int8 library: 1x4 BN128 S4 3cta", in, true, b8);
  run<NoDocCopies<MmaMainloop<H, 128, 32, 128, 1, 4, 4, 3, I8>>>("int8 library, no document copies", in, true, b8);
  return 0;
}
