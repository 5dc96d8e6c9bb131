// cuBLAS, loaded with dlopen like the driver: gemm for matmul on GPUs.
#pragma once

#include <cstdint>

namespace lazyfuse::cuda {

// Row-major C[b] = A[b] (n x k) * B[b] (k x m) for each of `batches` contiguous matrices, in
// float32 (`is_double` false) or float64, on GPU `device`. Throws CudaError or
// UnsupportedError (no cuBLAS).
void gemm_batched(int device, bool is_double, const void* a, const void* b, void* c, int64_t n,
                  int64_t k, int64_t m, int64_t batches);

}  // namespace lazyfuse::cuda
