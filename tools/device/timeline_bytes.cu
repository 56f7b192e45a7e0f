// Where a one-step CTA of the sm_90a byte kernel spends its time: LongDocStress with int8
// documents (B 8 x C 16, Lq 64, Ld 1,024, dim 128; 128 CTAs of one step on the split shape) is
// slower than the same call on float16 documents (9.9 against 8.4 us, H200, 2026-12-02) although
// it moves half the bytes, and a warm ncu of it put ~40% of the consumers' stall samples on the
// first slot's full barrier (maxsim_cuda/NOTES.md, "LongDocStress's first tile, warm"). The
// samples cannot say what the wait is made of: the first tile's TMA, the step's lengths (the
// producer writes the slot's TileInfo only once they are read), the previous grid (PDL), or the
// tile queued behind the other CTAs' tiles. This harness builds forward_fp16_int8.cu with the
// kernel's timeline stamps (kernel/timeline.cuh, -DMAXSIM_TIMELINE), launches the call as the
// library does (kernel::launch_forward_compressed, the default rules), and prints, per CTA and
// over CTAs, when each event happened after the CTA's start. Torch-free; on the GPU machine:
//
//   python3 tools/device/cli.py harness timeline_bytes.cu --define MAXSIM_TIMELINE \
//       --variant pdl --variant nopdl=MAXSIM_CUDA_PDL=0 --variant nosplit=MAXSIM_CUDA_HOPPER_BYTES_SPLIT=0
//
// (nvcc with the package's flags and -DMAXSIM_TIMELINE, then one run a variant: JSON lines,
// seconds, in $OUT/timeline_bytes.<variant>.jsonl). The compile takes minutes (the whole
// forward_fp16_int8.cu unit); `--binary` runs a build carried from elsewhere instead.
//
// Modes: `alone` (one launch after a synchronise: nothing before it, documents in L2 from the
// warm-up), `stream` (the last of 20 launches back to back on one stream, as graph replay runs
// them, PDL included where the launch rules use it), `dram` (the same, rotating over four
// copies of the documents, 66 MB, so most tiles come from DRAM). Environment knobs the
// launch rules read (MAXSIM_CUDA_HOPPER_BYTES_SPLIT, MAXSIM_CUDA_PDL) apply as in the library.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "cuda_check.h"
#include "forward_fp16_int8.cu"

namespace mk = maxsim_cuda::kernel;

constexpr int kB = 8, kC = 16, kLq = 64, kLd = 1024, kDim = 128, kSets = 4;
constexpr int kLaunches = 20;

struct Inputs {
  __half* queries;
  int8_t* documents[kSets];
  float* scales[kSets];
  int32_t *query_lengths, *doc_lengths;
  float* scores;
};

static Inputs make_inputs() {
  Inputs in{};
  std::mt19937 rng(2026);
  std::vector<__half> q(size_t(kB) * kLq * kDim);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (auto& x : q) x = __float2half(normal(rng));
  CUDA_CHECK(cudaMalloc(&in.queries, q.size() * sizeof(__half)));
  CUDA_CHECK(cudaMemcpy(in.queries, q.data(), q.size() * sizeof(__half), cudaMemcpyHostToDevice));
  const size_t rows = size_t(kB) * kC * kLd;
  std::vector<int8_t> d(rows * kDim);
  std::vector<float> s(rows);
  std::uniform_int_distribution<int> byte(-127, 127);
  std::uniform_real_distribution<float> scale(0.005f, 0.02f);
  for (int k = 0; k < kSets; ++k) {
    for (auto& x : d) x = static_cast<int8_t>(byte(rng));
    for (auto& x : s) x = scale(rng);
    CUDA_CHECK(cudaMalloc(&in.documents[k], d.size()));
    CUDA_CHECK(cudaMalloc(&in.scales[k], s.size() * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(in.documents[k], d.data(), d.size(), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(in.scales[k], s.data(), s.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
  std::vector<int32_t> ql(kB, kLq), dl(size_t(kB) * kC, kLd);
  CUDA_CHECK(cudaMalloc(&in.query_lengths, ql.size() * sizeof(int32_t)));
  CUDA_CHECK(cudaMalloc(&in.doc_lengths, dl.size() * sizeof(int32_t)));
  CUDA_CHECK(cudaMemcpy(in.query_lengths, ql.data(), ql.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(in.doc_lengths, dl.data(), dl.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMalloc(&in.scores, size_t(kB) * kC * sizeof(float)));
  return in;
}

static maxsim_cuda::ForwardParams params(const Inputs& in, int set, int sms, cudaStream_t stream) {
  maxsim_cuda::ForwardParams p;
  p.surface = maxsim_cuda::Surface::kPadded;
  p.dtype = maxsim_cuda::DType::kF16;
  p.doc_format = maxsim_cuda::DocFormat::kInt8;
  p.queries = in.queries;
  p.documents = in.documents[set];
  p.doc_scales = in.scales[set];
  p.dim = kDim;
  p.q_rows = int64_t(kB) * kLq;
  p.d_rows = int64_t(kB) * kC * kLd;
  p.num_queries = kB;
  p.cands = kC;
  p.lq = kLq;
  p.ld = kLd;
  p.pairs = int64_t(kB) * kC;
  p.query_lengths = {in.query_lengths, kB, 0};
  p.doc_lengths = {in.doc_lengths, int64_t(kB) * kC, 0};
  p.num_sms = sms;
  p.stream = stream;
  p.scores = in.scores;
  return p;
}

using Row = std::array<unsigned long long, mk::kTlEvents>;  // one CTA's g_timeline row

static double quantile(std::vector<double> v, double f) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(f * (v.size() - 1) + 0.5))];
}

// One JSON line: every event's delay after its CTA's start (seconds, cycles converted at each
// CTA's own cycles-to-ns ratio), as p10 / median / p90 / max over the CTAs that stamped it.
static void report(const char* mode, const std::vector<Row>& t, int ctas, double call_s) {
  static const char* names[] = {"start", "first_issue", "first_info", "first_tile", "query",
                                "chain_end0", "chain_end1", "end"};
  // a CTA of the grid without a step returns before its first stamp (its row stays zero)
  auto stamped = [&](int c) { return t[c][mk::kTlStartNs] > 0 && t[c][mk::kTlEndNs] > t[c][mk::kTlStartNs]; };
  unsigned long long t0 = ~0ull, t1 = 0;
  std::vector<double> starts;
  for (int c = 0; c < ctas; ++c)
    if (stamped(c)) t0 = std::min(t0, t[c][mk::kTlStartNs]);
  for (int c = 0; c < ctas; ++c) {
    if (!stamped(c)) continue;
    t1 = std::max(t1, t[c][mk::kTlEndNs]);
    starts.push_back(1e-9 * double(t[c][mk::kTlStartNs] - t0));
  }
  if (starts.empty()) {
    std::printf("{\"mode\": \"%s\", \"ctas\": 0}\n", mode);
    return;
  }
  std::printf("{\"mode\": \"%s\", \"ctas\": %zu, \"call_s\": %.4g, \"span_s\": %.4g, \"start_after_first\": [%.4g, %.4g, %.4g]",
              mode, starts.size(), call_s, 1e-9 * double(t1 - t0), quantile(starts, 0.1), quantile(starts, 0.5), quantile(starts, 0.9));
  for (int e = mk::kTlFirstIssue; e <= mk::kTlEnd; ++e) {
    std::vector<double> v;
    for (int c = 0; c < ctas; ++c) {
      const double cycles = double(t[c][mk::kTlEnd] - t[c][mk::kTlStart]);
      const double ns = double(t[c][mk::kTlEndNs] - t[c][mk::kTlStartNs]);
      if (!stamped(c) || t[c][e] < t[c][mk::kTlStart] || cycles <= 0) continue;  // not stamped in this launch
      v.push_back(1e-9 * double(t[c][e] - t[c][mk::kTlStart]) * ns / cycles);
    }
    if (v.empty()) continue;
    std::printf(", \"%s\": [%.4g, %.4g, %.4g, %.4g]", names[e], quantile(v, 0.1), quantile(v, 0.5), quantile(v, 0.9),
                *std::max_element(v.begin(), v.end()));
  }
  std::printf("}\n");
  std::fflush(stdout);
}

int main() {
  int dev = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const Inputs in = make_inputs();
  const int ctas = std::min(mk::kTimelineCtas, std::max(sms, kB * kC));  // the grid, at most
  std::vector<Row> t(mk::kTimelineCtas);
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  for (const char* mode : {"alone", "stream", "dram"}) {
    const bool dram = mode[0] == 'd', alone = mode[0] == 'a';
    for (int round = 0; round < 3; ++round) {
      for (int i = 0; i < kLaunches; ++i) CUDA_CHECK(mk::launch_forward_compressed<__half, maxsim_cuda::DocFormat::kInt8>(params(in, dram ? i % kSets : 0, sms, stream)));
      CUDA_CHECK(cudaStreamSynchronize(stream));
      CUDA_CHECK(cudaMemset(in.scores, 0xff, size_t(kB) * kC * sizeof(float)));
      const int n = alone ? 1 : kLaunches;
      CUDA_CHECK(cudaEventRecord(e0, stream));
      for (int i = 0; i < n; ++i) CUDA_CHECK(mk::launch_forward_compressed<__half, maxsim_cuda::DocFormat::kInt8>(params(in, dram ? i % kSets : 0, sms, stream)));
      CUDA_CHECK(cudaEventRecord(e1, stream));
      CUDA_CHECK(cudaStreamSynchronize(stream));
      float ms = 0.f;
      CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      CUDA_CHECK(cudaMemcpyFromSymbol(t.data(), mk::g_timeline, sizeof(Row) * mk::kTimelineCtas));
      std::vector<float> scores(size_t(kB) * kC);
      CUDA_CHECK(cudaMemcpy(scores.data(), in.scores, scores.size() * sizeof(float), cudaMemcpyDeviceToHost));
      for (float s : scores)
        if (!(s == s)) {
          std::fprintf(stderr, "a score was not written (NaN poison left)\n");
          return 1;
        }
      report(mode, t, ctas, 1e-3 * ms / n);
    }
  }
  return 0;
}
