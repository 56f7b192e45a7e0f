// CUDA_CHECK(call): the experiment harnesses' error check (tools/device/*.cu): a failing CUDA
// call prints where and why, and the program exits.
#pragma once

#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#define CUDA_CHECK(...)                                                                              \
  do {                                                                                               \
    cudaError_t e_ = (__VA_ARGS__);                                                                  \
    if (e_ != cudaSuccess) {                                                                         \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #__VA_ARGS__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                                  \
    }                                                                                                \
  } while (0)
