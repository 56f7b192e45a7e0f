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
using namespace maxsim_cuda;
using namespace maxsim_cuda::kernel;
#define CK(...) do { cudaError_t e_ = (__VA_ARGS__); if (e_ != cudaSuccess) { std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); std::exit(1);} } while (0)

template <class ML>
void probe(int64_t B, int64_t C, int64_t Lq, int64_t Ld, FILE* out) {
  const int64_t D = 128, qn = B * Lq * D, rows = B * C * Ld, dn = rows * D;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  std::vector<__half> hq(qn), hd(dn);
  for (auto& x : hq) x = __float2half(nd(rng));
  for (auto& x : hd) x = __float2half(nd(rng));
  __half *q, *d; float* s; int *ql, *dl;
  CK(cudaMalloc(&q, qn * 2)); CK(cudaMalloc(&d, dn * 2)); CK(cudaMalloc(&s, B * C * 4));
  CK(cudaMalloc(&ql, B * 4)); CK(cudaMalloc(&dl, B * C * 4));
  std::vector<int> hql(B, int(Lq)), hdl(B * C);
  for (auto& x : hdl) x = int(Ld);
  CK(cudaMemcpy(q, hq.data(), qn * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d, hd.data(), dn * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(ql, hql.data(), B * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dl, hdl.data(), B * C * 4, cudaMemcpyHostToDevice));
  cudaDeviceProp prop; CK(cudaGetDeviceProperties(&prop, 0));
  ForwardParams p;
  p.surface = Surface::kPadded; p.dtype = DType::kF16; p.doc_format = DocFormat::kNative;
  p.queries = q; p.documents = d; p.doc_scales = nullptr; p.dim = D;
  p.q_rows = B * Lq; p.d_rows = rows; p.num_queries = B; p.cands = C; p.lq = Lq; p.ld = Ld; p.pairs = B * C;
  p.query_lengths = IndexRef{ql, B, 0}; p.doc_lengths = IndexRef{dl, B * C, 0};
  p.num_sms = prop.multiProcessorCount; p.scores = s;
  cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  constexpr int kCalls = 20;
  p.stream = st;
  CK(run_surface<ML, 0>(p)); CK(cudaStreamSynchronize(st));
  cudaGraph_t g; cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kCalls; ++i) CK(run_surface<ML, 0>(p));
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, st));
  cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int r = 0; r < 50; ++r) {
    CK(cudaEventRecord(a, st));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(b, st)); CK(cudaEventSynchronize(b));
    float ms; CK(cudaEventElapsedTime(&ms, a, b)); t.push_back(ms * 1000.f / kCalls);
  }
  std::sort(t.begin(), t.end());
  std::vector<float> hs(B * C);
  CK(cudaMemcpy(hs.data(), s, B * C * 4, cudaMemcpyDeviceToHost));
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
