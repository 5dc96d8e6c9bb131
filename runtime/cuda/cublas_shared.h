// What the two halves of the BLAS library binding share: cuBLAS (cublas.cc) and cuBLASLt
// (cublaslt.cc), both loaded with dlopen. Internal to runtime/cuda.
#pragma once

#include <cstdint>
#include <string>

#include "lazyfuse/ir/dtype.h"
#include "lazyfuse/runtime/cuda/cublas.h"

namespace lazyfuse::cuda::blas {

using cublasStatus_t = int;
constexpr int kOpN = 0, kOpT = 1;
// cudaDataType and cublasComputeType_t values (library_types.h, cublas_api.h).
constexpr int kCudaR32F = 0, kCudaR64F = 1, kCudaR16F = 2, kCudaR16BF = 14;
constexpr int kComputeF32 = 68, kComputeF64 = 70;

// `stem` ("libcublas") from the loader's path, CUDA 13's or 12's soname first, then the
// toolkit's own copy; null when none loads.
void* open_library(const std::string& stem);
// The cudaDataType of `dtype`; UnsupportedError for a dtype the libraries' gemm does not take.
int cuda_data_type(DType dtype);
// The product by cublasGemmStridedBatchedEx (gemm_strided_batched's arguments).
void cublas_gemm(int device, DType dtype, const GemmOperand& a, const GemmOperand& b, void* c,
                 int64_t n, int64_t k, int64_t m, int64_t batches);
// The bare product through cuBLASLt where preferred_blas_library() picks it and cuBLASLt takes
// the operands (its plan chosen on first use); false where cublas_gemm is to compute it.
bool lt_gemm(int device, DType dtype, const GemmOperand& a, const GemmOperand& b, void* c,
             int64_t n, int64_t k, int64_t m, int64_t batches);

}  // namespace lazyfuse::cuda::blas
