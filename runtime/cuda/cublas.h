// cuBLAS, loaded with dlopen like the driver: gemm for matmul on GPUs.
#pragma once

#include <cstdint>

#include "lazyfuse/ir/dtype.h"

namespace lazyfuse::cuda {

// One operand of a batched gemm as it lies in memory, read in place: each matrix row-major with
// leading dimension `ld` (`transposed` false), or stored as its transpose, row-major with
// leading dimension `ld` (`transposed` true: a transposed view, as an nn::Linear weight is
// read); consecutive matrices `batch_stride` elements apart (0: one matrix for every batch).
struct GemmOperand {
  const void* data = nullptr;
  bool transposed = false;
  int64_t ld = 1;
  int64_t batch_stride = 0;
};

// The library that computes products on GPUs, as PyTorch's
// torch.backends.cuda.preferred_blas_library. cuBLAS (cublasGemmEx, the default) gives PyTorch
// eager's float32 bits. cuBLASLt runs the heuristics' first algorithm for the operands'
// alignment, or their first that does not split K where that is no slower by more than a
// kernel's launch (measured once per problem), kept per problem, and its epilogue plans start
// from that algorithm: fewer kernels, and other float32 bits. Batched products and
// float64 always go to cuBLAS. LAZYFUSE_BLAS=cublaslt chooses cuBLASLt for the process.
enum class BlasBackend { Cublas, Cublaslt };
BlasBackend preferred_blas_library();
void set_preferred_blas_library(BlasBackend backend);
// Whether a product of few rows with its weight read transposed (an nn::Linear at a small
// batch) runs lazyfuse's own kernel rather than the library's, by either library: on unless
// LAZYFUSE_SKINNY_MATMUL=0 (Note [Products of few rows] in codegen/cuda/cuda_matmul.cc).
bool skinny_matmul_enabled();
void set_skinny_matmul_enabled(bool enabled);
// Products that kernel computed in this process (tests check it ran).
int64_t skinny_matmul_count();
void count_skinny_matmul();

// Row-major C[b] = A[b] (n x k) * B[b] (k x m) for `batches` matrices, C dense, on GPU
// `device`. `dtype` is the dtype of A, B and C: float32 and float64 compute in their own type,
// float16 and bfloat16 accumulate in float32 (cuBLASLt or cublasGemmStridedBatchedEx, by
// preferred_blas_library). Throws CudaError or UnsupportedError (no cuBLAS).
void gemm_strided_batched(int device, DType dtype, const GemmOperand& a, const GemmOperand& b,
                          void* c, int64_t n, int64_t k, int64_t m, int64_t batches);

// Row-major D (n x m) = A (n x k) * B (k x m) + bias, with bias[j] added to every row's
// column j and then max(0, .) when `relu`, as one cuBLASLt call with a bias epilogue; one matrix,
// float32, float16 or bfloat16 (the half types accumulating in float32; the bias in `dtype`, at
// least 16-byte aligned), D dense. In float32 the result has the bits of gemm_strided_batched
// followed by the add (and relu): the algorithm is the first of cuBLASLt's candidates that gives
// them, found once per problem by running both. A relu epilogue is used only where it keeps a
// NaN, as the elementwise relu does. Returns false, having done nothing, where cuBLASLt
// or an algorithm for the problem is missing; throws CudaError when a call fails.
bool gemm_bias_epilogue(int device, DType dtype, const GemmOperand& a, const GemmOperand& b,
                        const void* bias, bool relu, void* d, int64_t n, int64_t k, int64_t m);

}  // namespace lazyfuse::cuda
