// Exhaustive check, on an sm_89+ GPU, of the pre-sm_89 e4m3 widening (bit moves + one
// hmul2 by 2^8, doc_format.cuh) against the hardware cvt.rn.f16x2.e4m3x2, for every byte
// in every position of the word: the same fp16 bits, NaN for NaN (either sign).
// `python3 tools/device/cli.py suite` compiles and runs it (from the repository root) whenever
// tests/test_cuda_compressed.py is among the files it runs.
#include <cstdio>

#include "maxsim_cuda/kernel/doc_format.cuh"

using namespace maxsim_cuda::kernel;

__global__ void compare(unsigned* bad) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;  // 0 .. 65535: bytes (b0, b1)
  const uint32_t w = i | ((i ^ 0xa5a5u) << 16);
  uint32_t lo, hi;
  e4m3x4_to_scaled_half2x2(w, lo, hi);
  lo = hmul2_bits(lo, 0x5c005c00u);
  hi = hmul2_bits(hi, 0x5c005c00u);
  // bit path order: lo = (byte 0, byte 2), hi = (byte 1, byte 3)
  const unsigned short got[4] = {static_cast<unsigned short>(lo & 0xffff), static_cast<unsigned short>(hi & 0xffff),
                                 static_cast<unsigned short>(lo >> 16), static_cast<unsigned short>(hi >> 16)};
  for (int b = 0; b < 4; ++b) {
    const unsigned short byte = (w >> (8 * b)) & 0xff;
    uint32_t ref;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(ref) : "h"(byte));
    const unsigned short want = ref & 0xffff;
    const bool nan_w = (want & 0x7c00) == 0x7c00 && (want & 0x3ff), nan_g = (got[b] & 0x7c00) == 0x7c00 && (got[b] & 0x3ff);
    if (nan_w ? !nan_g : want != got[b]) atomicAdd(bad, 1u);
  }
}

int main() {
  unsigned* bad = nullptr;
  unsigned count = 0;
  cudaMalloc(&bad, sizeof(unsigned));
  cudaMemset(bad, 0, sizeof(unsigned));
  compare<<<256, 256>>>(bad);
  cudaMemcpy(&count, bad, sizeof(unsigned), cudaMemcpyDeviceToHost);
  const cudaError_t err = cudaDeviceSynchronize();
  std::printf("e4m3 bit-path widening: %s, %u mismatches of %u\n", cudaGetErrorString(err), count, 65536u * 4);
  return err == cudaSuccess && count == 0 ? 0 : 1;
}
