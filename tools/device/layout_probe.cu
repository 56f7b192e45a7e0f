// A/B harness for the mma.sync padded kernel's code layout (not part of the package; torch-free):
// GPU time per call of MmaMainloop<half, 128, 32, 64, 2, 2, 4, 3> (SmallRerank's shape and three
// others) as a CUDA graph of 20 back-to-back launches, CUDA-event medians of 50 replays; the
// scores go to a file so that binaries built from two header trees can be compared bit for bit.
// Build one binary per tree here (nvcc, no GPU), carry them, run them alternately:
//   cd <tree> && nvcc -std=c++17 -O3 --expt-relaxed-constexpr -DENABLE_FP8 -I . \
//       -gencode arch=compute_90a,code=sm_90a -o /path/probe_<name> tools/device/layout_probe.cu
//   probe_<name> /tmp/scores_<name>.bin     # then cmp the score files
// Used for maxsim_cuda/NOTES.md, "A one-step mma.sync CTA waits on instruction fetch".
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
#include "maxsim_cuda/kernel/forward_kernel.cuh"  // the tree given by -I
#include "cuda_check.h"
using namespace maxsim_cuda;
using namespace maxsim_cuda::kernel;

template <class ML>
void probe(int64_t B, int64_t C, int64_t Lq, int64_t Ld, FILE* out) {
  const int64_t D = 128, qn = B * Lq * D, rows = B * C * Ld, dn = rows * D;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  std::vector<__half> hq(qn), hd(dn);
  for (auto& x : hq) x = __float2half(nd(rng));
  for (auto& x : hd) x = __float2half(nd(rng));
  __half *q, *d; float* s; int *ql, *dl;
  CUDA_CHECK(cudaMalloc(&q, qn * 2)); CUDA_CHECK(cudaMalloc(&d, dn * 2)); CUDA_CHECK(cudaMalloc(&s, B * C * 4));
  CUDA_CHECK(cudaMalloc(&ql, B * 4)); CUDA_CHECK(cudaMalloc(&dl, B * C * 4));
  std::vector<int> hql(B, int(Lq)), hdl(B * C);
  for (auto& x : hdl) x = int(Ld);
  CUDA_CHECK(cudaMemcpy(q, hq.data(), qn * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d, hd.data(), dn * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(ql, hql.data(), B * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dl, hdl.data(), B * C * 4, cudaMemcpyHostToDevice));
  cudaDeviceProp prop; CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  ForwardParams p;
  p.surface = Surface::kPadded; p.dtype = DType::kF16; p.doc_format = DocFormat::kNative;
  p.queries = q; p.documents = d; p.doc_scales = nullptr; p.dim = D;
  p.q_rows = B * Lq; p.d_rows = rows; p.num_queries = B; p.cands = C; p.lq = Lq; p.ld = Ld; p.pairs = B * C;
  p.query_lengths = IndexRef{ql, B, 0}; p.doc_lengths = IndexRef{dl, B * C, 0};
  p.num_sms = prop.multiProcessorCount; p.scores = s;
  cudaStream_t st; CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  constexpr int kCalls = 20;
  p.stream = st;
  CUDA_CHECK(run_surface<ML, 0>(p)); CUDA_CHECK(cudaStreamSynchronize(st));
  cudaGraph_t g; cudaGraphExec_t ge;
  CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kCalls; ++i) CUDA_CHECK(run_surface<ML, 0>(p));
  CUDA_CHECK(cudaStreamEndCapture(st, &g));
  CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  for (int i = 0; i < 3; ++i) CUDA_CHECK(cudaGraphLaunch(ge, st));
  cudaEvent_t a, b; CUDA_CHECK(cudaEventCreate(&a)); CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int r = 0; r < 50; ++r) {
    CUDA_CHECK(cudaEventRecord(a, st));
    CUDA_CHECK(cudaGraphLaunch(ge, st));
    CUDA_CHECK(cudaEventRecord(b, st)); CUDA_CHECK(cudaEventSynchronize(b));
    float ms; CUDA_CHECK(cudaEventElapsedTime(&ms, a, b)); t.push_back(ms * 1000.f / kCalls);
  }
  std::sort(t.begin(), t.end());
  std::vector<float> hs(B * C);
  CUDA_CHECK(cudaMemcpy(hs.data(), s, B * C * 4, cudaMemcpyDeviceToHost));
  double sum = 0; for (float v : hs) sum += v;
  std::printf("B %lld C %lld Lq %lld Ld %lld: %.3f us per call (min %.3f), checksum %.6e\n", (long long)B, (long long)C,
              (long long)Lq, (long long)Ld, t[t.size() / 2], t[0], sum);
  std::fwrite(hs.data(), 4, hs.size(), out);
  cudaGraphExecDestroy(ge); cudaGraphDestroy(g); cudaEventDestroy(a); cudaEventDestroy(b); cudaStreamDestroy(st);
  cudaFree(q); cudaFree(d); cudaFree(s); cudaFree(ql); cudaFree(dl);
}

int main(int argc, char** argv) {
  FILE* out = std::fopen(argc > 1 ? argv[1] : "/tmp/scores.bin", "wb");
  using ML = MmaMainloop<__half, 128, 32, 64, 2, 2, 4, 3>;
  probe<ML>(32, 10, 32, 180, out);   // SmallRerank full
  probe<ML>(32, 20, 32, 180, out);
  probe<ML>(32, 10, 32, 64, out);
  probe<ML>(32, 50, 32, 180, out);   // Rerank full
  std::fclose(out);
  return 0;
}
