// ThreadSanitizer check of the Metal kernels: every entry point (forward with argmax, both
// gradients, four surfaces; float32 documents, and int8 / float8 e4m3fn documents with their
// per-row scales and 1-bit ColBERTv2 residuals for the forward and grad_queries) on small
// ragged inputs, each GPU thread
// a real thread, so
// TSan sees every threadgroup-memory access and the barriers' happens-before edges. Each
// launch runs twice, with two poison patterns, and must give identical bits. Exit status:
// 0 clean, 1 mismatch or emulator error (TSan's own reports exit with TSAN_OPTIONS's
// exitcode).
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "emu_abi.h"
#include "maxsim_metal/params.h"

namespace {

int failures = 0;
std::mt19937 rng(1234);

std::vector<float> random_rows(int64_t n) {
  std::normal_distribution<float> dist;
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

EmuIndex index_of(const std::vector<int64_t>& v) { return {v.data(), int64_t(v.size()), 1, 1}; }

// Documents as a kernel reads them: float32 rows (format 0), or compressed rows of one byte
// per element with one float32 scale per row.
struct Documents {
  int format;
  const void* data;
  int64_t numel;
  const float* scales;
  int64_t scales_numel;
  const EmuResidual* residual;
};

constexpr int kInt8 = 1, kFloat8E4M3 = 2, kResidual = 3;  // maxsim_metal::DocFormat

// Byte copies of float32 rows in a compressed format: int8 values v / s rounded, and e4m3fn
// bytes of the same (a fixed pattern is enough: the check is about races, not values).
struct Compressed {
  std::vector<unsigned char> bytes;
  std::vector<float> scales;
};
Compressed compress(const std::vector<float>& rows, int64_t dim, int format) {
  Compressed c;
  const int64_t n = dim > 0 ? int64_t(rows.size()) / dim : 0;
  c.scales.resize(size_t(n));
  c.bytes.resize(rows.size());
  for (int64_t r = 0; r < n; ++r) {
    c.scales[size_t(r)] = 0.01f * float(r % 7 + 1);
    for (int64_t k = 0; k < dim; ++k) {
      const float v = rows[size_t(r * dim + k)] * 40.0f;
      const int iv = v > 127.0f ? 127 : v < -127.0f ? -127 : int(v);
      // e4m3fn: sign, exponent 1..14, any mantissa (never the NaN pattern)
      const unsigned char fp8 = (unsigned char)(((iv < 0) << 7) | ((1 + (iv & 0x7f) % 14) << 3) | (iv & 7));
      c.bytes[size_t(r * dim + k)] = format == kInt8 ? (unsigned char)(signed char)iv : fp8;
    }
  }
  return c;
}


template <class Run> void twice(const char* what, Run&& run) {
  char err[2048] = {0};
  std::vector<unsigned char> a, b;
  EmuOptions oa{0, 0, 0x7fc0dead, 1}, ob{0, 0, 0x12345678, 1};
  if (run(oa, &a, err) || run(ob, &b, err)) {
    std::printf("FAIL %s: %s\n", what, err);
    ++failures;
  } else if (a != b) {
    std::printf("FAIL %s: results depend on the poison pattern\n", what);
    ++failures;
  } else {
    std::printf("ok   %s\n", what);
  }
}

void check_documents(int surface, const int64_t* sizes, int64_t dim, const std::vector<float>& q,
                     const Documents& d, const EmuIndex* idx, int64_t pairs, int64_t width,
                     const std::vector<int64_t>* qlists, const std::vector<int64_t>* dlists) {
  std::vector<float> scores(static_cast<size_t>(pairs));
  std::vector<int32_t> argmax(static_cast<size_t>(pairs * width));
  char err[2048] = {0};
  const EmuOptions o{0, 0, 0, 1};
  if (emu_forward(surface, 0, d.format, sizes, dim, q.data(), int64_t(q.size()), d.data, d.numel,
                  d.scales, d.scales_numel, d.residual, idx, 1, scores.data(), pairs, argmax.data(), pairs * width,
                  &o, err, sizeof err)) {
    std::printf("FAIL forward surface %d: %s\n", surface, err);
    ++failures;
    return;
  }
  twice("forward", [&](const EmuOptions& opt, std::vector<unsigned char>* out, char* e) {
    std::vector<float> s(static_cast<size_t>(pairs));
    std::vector<int32_t> a(static_cast<size_t>(pairs * width));
    const int rc = emu_forward(surface, 0, d.format, sizes, dim, q.data(), int64_t(q.size()), d.data,
                               d.numel, d.scales, d.scales_numel, d.residual, idx, 1, s.data(), pairs, a.data(),
                               pairs * width, &opt, e, 2048);
    out->resize(s.size() * 4 + a.size() * 4);
    std::memcpy(out->data(), s.data(), s.size() * 4);
    std::memcpy(out->data() + s.size() * 4, a.data(), a.size() * 4);
    return rc;
  });
  const std::vector<float> g = random_rows(pairs);
  // compressed documents have grad_queries only
  for (int to_query = 1; to_query >= (d.format ? 1 : 0); --to_query) {
    const std::vector<int64_t>* lists = to_query ? qlists : dlists;
    const EmuIndex none{nullptr, 0, 0, 0};
    const EmuIndex pairs_by = lists ? index_of(lists[0]) : none;
    const EmuIndex pair_offsets = lists ? index_of(lists[1]) : none;
    const size_t n = to_query ? q.size() : size_t(d.numel);
    twice(to_query ? "grad_queries" : "grad_documents",
          [&](const EmuOptions& opt, std::vector<unsigned char>* out, char* e) {
            std::vector<float> grad(n);
            const int rc = emu_backward(surface, 0, d.format, to_query, sizes, dim, q.data(),
                                        int64_t(q.size()), d.data, d.numel, d.scales, d.scales_numel,
                                        d.residual, g.data(), pairs, argmax.data(), width, idx, pairs_by,
                                        pair_offsets, grad.data(), int64_t(n), &opt, e, 2048);
            out->resize(n * 4);
            std::memcpy(out->data(), grad.data(), n * 4);
            return rc;
          });
  }
}

// The surface with float32 documents, then with the same documents as int8 and as e4m3fn.
void check_surface(int surface, const int64_t* sizes, int64_t dim, const std::vector<float>& q,
                   const std::vector<float>& d, const EmuIndex* idx, int64_t pairs, int64_t width,
                   const std::vector<int64_t>* qlists, const std::vector<int64_t>* dlists) {
  check_documents(surface, sizes, dim, q, {0, d.data(), int64_t(d.size()), nullptr, 0, nullptr}, idx,
                  pairs, width, qlists, dlists);
  for (int format : {kInt8, kFloat8E4M3}) {
    std::printf("%s documents\n", format == kInt8 ? "int8" : "e4m3fn");
    const Compressed c = compress(d, dim, format);
    check_documents(surface, sizes, dim, q,
                    {format, c.bytes.data(), int64_t(c.bytes.size()), c.scales.data(),
                     int64_t(c.scales.size()), nullptr},
                    idx, pairs, width, qlists, dlists);
  }
  // 1-bit residuals (dim / 8 bytes per row), normalised, codes spread over 5 centroids
  std::puts("residual documents");
  const int64_t rows = dim > 0 ? int64_t(d.size()) / dim : 0, n_centroids = 5;
  std::vector<unsigned char> bytes(size_t(rows * dim / 8));
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = (unsigned char)(rng() & 0xff);
  std::vector<int64_t> codes(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) codes[size_t(r)] = (r * 3) % n_centroids;
  const std::vector<float> centroids = random_rows(n_centroids * dim), weights = {-0.05f, 0.05f};
  const EmuResidual res{index_of(codes), centroids.data(), n_centroids, 0, weights.data(), 0, 1, 1};
  check_documents(surface, sizes, dim, q, {kResidual, bytes.data(), int64_t(bytes.size()), nullptr, 0, &res},
                  idx, pairs, width, qlists, dlists);
}

}  // namespace

int main() {
  const int64_t dim = 40;  // two 32-column steps, the second zero-filled
  {  // padded: B=2, C=2, Lq=35 (two query chunks), Ld=37 (two document tiles)
    std::puts("padded");
    const int64_t B = 2, C = 2, Lq = 35, Ld = 37, sizes[4] = {B, C, Lq, Ld};
    const auto q = random_rows(B * Lq * dim), d = random_rows(B * C * Ld * dim);
    const std::vector<int64_t> ql = {35, 9}, dl = {37, 0, 8, 33};
    const EmuIndex idx[4] = {index_of(ql), index_of(dl), {nullptr, 0, 0, 0}, {nullptr, 0, 0, 0}};
    check_surface(kMaxsimPadded, sizes, dim, q, d, idx, B * C, Lq, nullptr, nullptr);
  }
  {  // contrastive: 2 queries of 33 rows, documents of 40, 0 and 9 rows
    std::puts("contrastive");
    const int64_t Nq = 2, Lq = 33, T = 49, sizes[4] = {Nq, Lq, T, 0};
    const auto q = random_rows(Nq * Lq * dim), d = random_rows(T * dim);
    const std::vector<int64_t> off = {0, 40, 40, 49};
    const EmuIndex idx[4] = {index_of(off), {nullptr, 0, 0, 0}, {nullptr, 0, 0, 0}, {nullptr, 0, 0, 0}};
    check_surface(kMaxsimContrastive, sizes, dim, q, d, idx, Nq * 3, Lq, nullptr, nullptr);
  }
  {  // contrastive_padded: 2 queries of 33 rows, 3 documents of 40 rows, lengths clamped to 40, 0, 9
    std::puts("contrastive_padded");
    const int64_t Nq = 2, Lq = 33, Nb = 3, Ld = 40, sizes[4] = {Nq, Lq, Nb, Ld};
    const auto q = random_rows(Nq * Lq * dim), d = random_rows(Nb * Ld * dim);
    const std::vector<int64_t> dl = {47, -2, 9}, ql = {33, 20};
    const EmuIndex idx[4] = {index_of(dl), index_of(ql), {nullptr, 0, 0, 0}, {nullptr, 0, 0, 0}};
    check_surface(kMaxsimContrastivePadded, sizes, dim, q, d, idx, Nq * Nb, Lq, nullptr, nullptr);
  }
  {  // packed: queries of 34 and 7 rows, documents of 33 and 5 rows, 4 pairs (one repeated)
    std::puts("packed");
    const int64_t Tq = 41, Td = 38, width = 34, sizes[4] = {Tq, Td, width, 0};
    const auto q = random_rows(Tq * dim), d = random_rows(Td * dim);
    const std::vector<int64_t> qo = {0, 34, 41}, dof = {0, 33, 38}, pq = {0, 1, 0, 0}, pd = {0, 1, 1, 0};
    const std::vector<int64_t> qlists[2] = {{0, 2, 3, 1}, {0, 3, 4}};
    const std::vector<int64_t> dlists[2] = {{0, 3, 1, 2}, {0, 2, 4}};
    const EmuIndex idx[4] = {index_of(qo), index_of(dof), index_of(pq), index_of(pd)};
    check_surface(kMaxsimPacked, sizes, dim, q, d, idx, 4, width, qlists, dlists);
  }
  std::printf("%s (%d failures)\n", failures ? "FAILED" : "PASSED", failures);
  return failures ? 1 : 0;
}
