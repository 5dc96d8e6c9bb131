// cuBLAS through dlopen. cuBLAS is column-major: a row-major product C = A B is computed as
// the column-major C^T = B^T A^T, which reads the same memory without any transpose.
#include "runtime/cublas.h"

#include <dlfcn.h>

#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "ir/errors.h"
#include "runtime/cuda_driver.h"

namespace lazyfuse::cuda {
namespace {

using cublasHandle_t = struct cublasContext*;
using cublasStatus_t = int;
constexpr int kOpN = 0;

struct Cublas {
  bool ok = false;
  cublasStatus_t (*create)(cublasHandle_t*);
  cublasStatus_t (*sgemm)(cublasHandle_t, int, int, int, int, int, const float*, const float*, int,
                          long long, const float*, int, long long, const float*, float*, int,
                          long long, int);
  cublasStatus_t (*dgemm)(cublasHandle_t, int, int, int, int, int, const double*, const double*,
                          int, long long, const double*, int, long long, const double*, double*,
                          int, long long, int);
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
    c.sgemm = reinterpret_cast<decltype(c.sgemm)>(dlsym(lib, "cublasSgemmStridedBatched"));
    c.dgemm = reinterpret_cast<decltype(c.dgemm)>(dlsym(lib, "cublasDgemmStridedBatched"));
    c.ok = c.create && c.sgemm && c.dgemm;
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

void gemm_batched(int device, bool is_double, const void* a, const void* b, void* c, int64_t n,
                  int64_t k, int64_t m, int64_t batches) {
  if (!cublas().ok)
    throw UnsupportedError("matmul on a GPU needs cuBLAS (libcublas.so.13), which was not found");
  activate(device);
  cublasHandle_t h = handle(device);
  const int ni = static_cast<int>(n), ki = static_cast<int>(k), mi = static_cast<int>(m);
  const int lda = std::max(mi, 1), ldb = std::max(ki, 1), ldc = std::max(mi, 1);
  cublasStatus_t status;
  if (is_double) {
    const double one = 1, zero = 0;
    status = cublas().dgemm(h, kOpN, kOpN, mi, ni, ki, &one, static_cast<const double*>(b), lda,
                            k * m, static_cast<const double*>(a), ldb, n * k, &zero,
                            static_cast<double*>(c), ldc, n * m, static_cast<int>(batches));
  } else {
    const float one = 1, zero = 0;
    status = cublas().sgemm(h, kOpN, kOpN, mi, ni, ki, &one, static_cast<const float*>(b), lda,
                            k * m, static_cast<const float*>(a), ldb, n * k, &zero,
                            static_cast<float*>(c), ldc, n * m, static_cast<int>(batches));
  }
  if (status != 0)
    throw CudaError(absl::StrCat("cuBLAS gemm failed on cuda:", device, " (status ", status, ")"));
}

}  // namespace lazyfuse::cuda
