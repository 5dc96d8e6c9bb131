// cuBLAS through dlopen. cuBLAS is column-major: a row-major product C = A B is computed as
// the column-major C^T = B^T A^T, which reads the same memory without any transpose; an operand
// stored transposed is read in place with op T.
#include "runtime/cublas.h"

#include <dlfcn.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "ir/errors.h"
#include "runtime/cuda_driver.h"

namespace lazyfuse::cuda {
namespace {

using cublasHandle_t = struct cublasContext*;
using cublasStatus_t = int;
constexpr int kOpN = 0, kOpT = 1;
// cudaDataType and cublasComputeType_t values (library_types.h, cublas_api.h).
constexpr int kCudaR32F = 0, kCudaR64F = 1, kCudaR16F = 2, kCudaR16BF = 14;
constexpr int kComputeF32 = 68, kComputeF64 = 70;
constexpr int kGemmDefault = -1;

struct Cublas {
  bool ok = false;
  cublasStatus_t (*create)(cublasHandle_t*);
  cublasStatus_t (*gemm_ex)(cublasHandle_t, int, int, int, int, int, const void*, const void*, int,
                            int, long long, const void*, int, int, long long, const void*, void*,
                            int, int, long long, int, int, int);
};

const Cublas& cublas() {
  static const Cublas c = [] {
    Cublas c;
    void* lib = nullptr;
    for (const char* name : {"libcublas.so.13", "libcublas.so.12", "libcublas.so",
                             "/usr/local/cuda/lib64/libcublas.so.13"}) {
      if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
    }
    if (lib == nullptr) return c;
    c.create = reinterpret_cast<decltype(c.create)>(dlsym(lib, "cublasCreate_v2"));
    c.gemm_ex = reinterpret_cast<decltype(c.gemm_ex)>(dlsym(lib, "cublasGemmStridedBatchedEx"));
    c.ok = c.create && c.gemm_ex;
    return c;
  }();
  return c;
}

cublasHandle_t handle(int device) {
  static std::mutex mutex;
  static std::map<int, cublasHandle_t> handles;
  std::lock_guard lock(mutex);
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  cublasHandle_t h = nullptr;
  if (cublasStatus_t s = cublas().create(&h); s != 0)
    throw CudaError(absl::StrCat("cublasCreate failed on cuda:", device, " (status ", s, ")"));
  return handles[device] = h;
}

}  // namespace

void gemm_strided_batched(int device, DType dtype, const GemmOperand& a, const GemmOperand& b,
                          void* c, int64_t n, int64_t k, int64_t m, int64_t batches) {
  if (!cublas().ok)
    throw UnsupportedError("matmul on a GPU needs cuBLAS (libcublas.so.13), which was not found");
  int type = kCudaR32F;
  switch (dtype) {
    case DType::Float32:
      break;
    case DType::Float64:
      type = kCudaR64F;
      break;
    case DType::Float16:
      type = kCudaR16F;
      break;
    case DType::BFloat16:
      type = kCudaR16BF;
      break;
    default:
      throw UnsupportedError(absl::StrCat("cuBLAS gemm of ", dtype_torch_name(dtype)));
  }
  activate(device);
  cublasHandle_t h = handle(device);
  // Column-major C^T (m x n) = B^T (m x k) A^T (k x n): a row-major operand is its column-major
  // transpose as it lies, and one stored transposed is read with op T.
  const double one_d = 1, zero_d = 0;
  const float one_f = 1, zero_f = 0;
  const bool wide = dtype == DType::Float64;
  const cublasStatus_t status = cublas().gemm_ex(
      h, b.transposed ? kOpT : kOpN, a.transposed ? kOpT : kOpN, static_cast<int>(m),
      static_cast<int>(n), static_cast<int>(k), wide ? static_cast<const void*>(&one_d) : &one_f,
      b.data, type, static_cast<int>(b.ld), b.batch_stride, a.data, type, static_cast<int>(a.ld),
      a.batch_stride, wide ? static_cast<const void*>(&zero_d) : &zero_f, c, type,
      static_cast<int>(std::max<int64_t>(m, 1)), n * m, static_cast<int>(batches),
      wide ? kComputeF64 : kComputeF32, kGemmDefault);
  if (status != 0)
    throw CudaError(absl::StrCat("cuBLAS gemm failed on cuda:", device, " (status ", status,
                                 ", n=", n, " k=", k, " m=", m, " batches=", batches, ")"));
}

}  // namespace lazyfuse::cuda
