// Stream-ordered scratch for the forward launchers (long queries' chunk sums, split
// documents' row partials). Host only, torch-free.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <mutex>

namespace maxsim_cuda {
namespace kernel {

// Stream-ordered scratch (capturable in a CUDA graph) from a pool of our own that keeps up
// to 64 MB between calls: the device's default pool hands its memory back at every
// synchronisation, and mapping it again cost ~100 us per eager call.
inline cudaError_t scratch_alloc(void** ptr, size_t bytes, cudaStream_t stream) {
  static cudaMemPool_t pools[64] = {};
  static std::mutex mutex;
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  cudaMemPool_t pool;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (pools[dev & 63] == nullptr) {
      cudaMemPoolProps props{};
      props.allocType = cudaMemAllocationTypePinned;
      props.location.type = cudaMemLocationTypeDevice;
      props.location.id = dev;
      err = cudaMemPoolCreate(&pools[dev & 63], &props);
      if (err != cudaSuccess) {
        pools[dev & 63] = nullptr;
        return err;
      }
      uint64_t keep = uint64_t(64) << 20;
      err = cudaMemPoolSetAttribute(pools[dev & 63], cudaMemPoolAttrReleaseThreshold, &keep);
      if (err != cudaSuccess) return err;
    }
    pool = pools[dev & 63];
  }
  return cudaMallocFromPoolAsync(ptr, bytes, pool, stream);
}

}  // namespace kernel
}  // namespace maxsim_cuda
